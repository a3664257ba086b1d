"""The interventions of one run (docs/method.md §9): declared, recorded, and applied in one place.

Each field is the command-line string of one option; `describe()` is what the manifest records and
`problems(model, bos_at_0)` what is wrong with them, checked before any forward pass. Where each acts:
RoPE scaling at load time (`config_overrides`), window and sink-value ablation inside the attention
function (`attention_edits`, with the path-specific key-0 patch of posleak.intervene.key0), BOS replacement
and position-0 patching as forward hooks (`applied`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from posleak.capture.residual import decoder_layers
from posleak.capture.session import AttentionEdits
from posleak.errors import PosleakError
from posleak.intervene.embedding import replaced_position0, replacement_token, replacement_vector
from posleak.intervene.key0 import key0_patch
from posleak.intervene.patching import parse_layers, patched_position0, position0_trajectory, source_token
from posleak.intervene.rope import parse_rope_scaling, scaled_rope_parameters
from posleak.validate import Problems, natural_number

if TYPE_CHECKING:
    from posleak.models.load import LoadedModel


@dataclass(frozen=True)
class Interventions:
    replace_bos: str | None = None  # mean | random | zero | token:TEXT
    patch_pos0: str | None = None  # TEXT (one token) or id:N
    patch_layers: str = "all"  # resid indices: all | L | A..B | comma list
    ablate_sink_values: str | None = None  # auto | L.H,L.H,...
    ablate_mode: Literal["zero", "mean"] = "zero"
    patch_kv0: str | None = None  # TEXT (one token) or id:N: the source of key 0's key and value in kv0_heads
    kv0_heads: str = "auto"  # auto | L.H,L.H,...
    rope_scaling: str | None = None  # ntk:K | linear:K | dynamic:K | yarn:K
    window: str | None = None  # W | global
    seed: int = 0

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """Everything wrong with these options, one message each, without computing anything on the model.

        Their syntax always; with the `model` (None: it did not load) also the layers, heads, tokens and RoPE
        they name; with `bos_at_0` (None: not known) whether a BOS stands at position 0 where one is needed.
        """
        found = Problems()
        with found.collecting():
            if self.window is not None:
                parse_window(self.window)
        if self.ablate_mode not in ("zero", "mean"):
            found.add(f"bad --ablate-mode {self.ablate_mode!r}; use zero or mean")
        for option, spec in (("--ablate-sink-values", self.ablate_sink_values), ("--kv0-heads", self._kv0_heads)):
            with found.collecting():
                if spec not in (None, "auto"):
                    heads = parse_heads(spec, option)
                    if model is not None:
                        _check_heads(option, spec, heads, model)
        with found.collecting():
            if self.rope_scaling is not None:
                parse_rope_scaling(self.rope_scaling)
                if model is not None:
                    self.config_overrides(model.model.config)  # refuses a model without plain RoPE
        with found.collecting():  # at most one problem with --replace-bos: the first one stands in the way
            if self.replace_bos is not None:
                if model is not None or not self.replace_bos.startswith("token:"):
                    replacement_token(model.tokenizer if model is not None else None, self.replace_bos)
                if model is not None and model.tokenizer.bos_token_id is None:
                    raise PosleakError(
                        f"--replace-bos replaces the BOS at position 0, and {model.name}'s tokenizer has no BOS "
                        "token; use a model whose tokenizer has one"
                    )
                if bos_at_0 is False:
                    raise PosleakError(
                        "--replace-bos replaces the BOS at position 0 and these sequences have none; add --bos on, "
                        "or give --tokens whose first column is the tokenizer's BOS id"
                    )
        if self.patch_kv0 is not None and model is not None:
            with found.collecting():
                source_token(model.tokenizer, self.patch_kv0, model.facts.vocab_size, "--patch-kv0")
        if self.patch_pos0 is not None and model is not None:
            with found.collecting():
                source_token(model.tokenizer, self.patch_pos0, model.facts.vocab_size)
            with found.collecting():
                parse_layers(self.patch_layers, model.facts.layers + 1)
        return found.found

    @property
    def is_empty(self) -> bool:
        return not self.describe()

    def describe(self) -> dict[str, Any]:
        """The applied interventions, as recorded in the manifest (defaults of unused options dropped)."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        if self.patch_pos0 is None:
            fields.pop("patch_layers")
        if self.ablate_sink_values is None:
            fields.pop("ablate_mode")
        if self.patch_kv0 is None:
            fields.pop("kv0_heads")
        if self.replace_bos != "random":
            fields.pop("seed")
        return fields

    @property
    def _kv0_heads(self) -> str | None:
        """The heads of the key-0 patch, where there is one."""
        return self.kv0_heads if self.patch_kv0 is not None else None

    @property
    def needs_sink_heads(self) -> bool:
        return "auto" in (self.ablate_sink_values, self._kv0_heads)

    def config_overrides(self, config: PretrainedConfig) -> dict[str, Any]:
        if self.rope_scaling is None:
            return {}
        return {"rope_parameters": scaled_rope_parameters(config, self.rope_scaling)}

    def attention_edits(
        self,
        sink_heads: dict[int, tuple[int, ...]] | None = None,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> AttentionEdits:
        """The edits inside the attention function; a key-0 patch needs the `model` (one forward of its source
        token) and, for a SOURCE given as text, its `tokenizer`."""
        window = parse_window(self.window) if self.window is not None else None
        ablate = _heads_of(self.ablate_sink_values, "--ablate-sink-values", sink_heads)
        edits = AttentionEdits(window=window, ablate_key0=ablate, ablate_mode=self.ablate_mode)
        if self.patch_kv0 is not None:
            if model is None:
                raise ValueError("patch_kv0 needs the model, to compute the source token's key and value")
            heads = _heads_of(self.kv0_heads, "--kv0-heads", sink_heads)
            token = source_token(tokenizer, self.patch_kv0, option="--patch-kv0")
            edits.output_edits = (key0_patch(model, token, heads),)
        return edits

    @contextmanager
    def applied(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> Iterator[None]:
        """Install the forward-hook interventions for the duration of the block."""
        with ExitStack() as stack:
            if self.replace_bos is not None:
                if not bos_at_0:
                    raise PosleakError("--replace-bos needs a BOS at position 0; add --bos on")
                vector = replacement_vector(model, tokenizer, self.replace_bos)
                stack.enter_context(replaced_position0(model, vector, self.seed))
            if self.patch_pos0 is not None:
                token = source_token(tokenizer, self.patch_pos0)
                layers = parse_layers(self.patch_layers, len(decoder_layers(model)) + 1)
                trajectory = position0_trajectory(model, token)
                stack.enter_context(patched_position0(model, trajectory, layers))
            yield


def parse_window(spec: str) -> int | Literal["global"]:
    """`--window` syntax: a width W ≥ 1, or `global`."""
    if spec == "global":
        return "global"
    width = natural_number(spec)
    if width is None or not 1 <= width < 2**31:
        raise PosleakError(f"bad --window {spec!r}; use a width 1 ≤ W < 2^31 or 'global'")
    return width


def _heads_of(
    spec: str | None, option: str, sink_heads: dict[int, tuple[int, ...]] | None
) -> dict[int, tuple[int, ...]]:
    """The heads an `auto | L.H,...` option names: `auto` the baseline's sink heads (layers without one dropped)."""
    if spec is None:
        return {}
    if spec != "auto":
        return parse_heads(spec, option)
    if sink_heads is None:
        raise ValueError(f"{option} auto needs the sink heads of a baseline pass")
    return {layer: heads for layer, heads in sink_heads.items() if heads}


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
