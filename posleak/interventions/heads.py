"""The heads an `auto | L.H,...` option names (`--ablate-sink-values`, `--kv0-heads`, `--hold-sink-clock`,
`--remove-sink-reads`): parsed, checked against the model, and resolved, `auto` to the sink heads of a baseline
pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posleak.errors import PosleakError
from posleak.validate import Problems

if TYPE_CHECKING:
    from posleak.models.load import LoadedModel

# layer → the heads an `auto` chose from a baseline pass (posleak.pipeline.run.sink_heads_of)
SinkHeads = dict[int, tuple[int, ...]]


def parse_heads(spec: str, option: str = "--ablate-sink-values") -> dict[int, tuple[int, ...]]:
    """`L.H,L.H,...` → {layer: heads} (`option`: the one that gave it, for the error)."""
    heads: dict[int, list[int]] = {}
    try:
        for part in spec.split(","):
            layer, head = part.split(".")
            heads.setdefault(int(layer), []).append(int(head))
    except ValueError:
        raise PosleakError(f"bad {option} {spec!r}; use auto or L.H,L.H (layer.head)") from None
    return {layer: tuple(sorted(hs)) for layer, hs in heads.items()}


def head_problems(option: str, spec: str | None, model: LoadedModel | None) -> list[str]:
    """What is wrong with the heads `spec` of `option` names (None: not given): their syntax, and with the
    `model`, heads it does not have."""
    found = Problems()
    with found.collecting():
        if spec not in (None, "auto"):
            heads = parse_heads(spec, option)
            if model is not None:
                _check_heads(option, spec, heads, model)
    return found.found


def _check_heads(option: str, spec: str, heads: dict[int, tuple[int, ...]], model: LoadedModel) -> None:
    facts = model.facts
    missing = [
        f"{layer}.{head}"
        for layer, group in heads.items()
        for head in group
        if not (0 <= layer < facts.layers and 0 <= head < facts.heads)
    ]
    if missing:
        raise PosleakError(
            f"{option} {spec!r} names heads that {model.name} does not have ({', '.join(missing)}); "
            f"it has layers 0..{facts.layers - 1} with heads 0..{facts.heads - 1} (write layer.head)"
        )


def heads_of(spec: str, option: str, sink_heads: SinkHeads | None) -> dict[int, tuple[int, ...]]:
    """The heads an `auto | L.H,...` option names: `auto` the baseline's sink heads (layers without one dropped)."""
    if spec != "auto":
        return parse_heads(spec, option)
    if sink_heads is None:
        raise ValueError(f"{option} auto needs the sink heads of a baseline pass")
    return {layer: heads for layer, heads in sink_heads.items() if heads}


def chosen_heads(sink_heads: SinkHeads) -> dict[str, list[int]]:
    """The heads an `auto` chose, as the manifest records them: {"layer": [heads]}, layers without one dropped."""
    return {str(layer): list(heads) for layer, heads in sink_heads.items() if heads}
