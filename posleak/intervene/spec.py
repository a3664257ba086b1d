"""The interventions of one run (docs/method.md §9): declared, recorded, and applied in one place.

Each field is the command-line string of one option; `describe()` is what the manifest records and
`problems(model, bos_at_0)` what is wrong with them, checked before any forward pass. Where each acts:
RoPE scaling at load time (`config_overrides`), window and sink-value ablation inside the attention
function (`attention_edits`), BOS replacement and position-0 patching as forward hooks (`applied`).
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
        with found.collecting():
            if self.ablate_sink_values not in (None, "auto"):
                heads = parse_heads(self.ablate_sink_values)
                if model is not None:
                    _check_heads(self.ablate_sink_values, heads, model)
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
        if self.replace_bos != "random":
            fields.pop("seed")
        return fields

    @property
    def needs_sink_heads(self) -> bool:
        return self.ablate_sink_values == "auto"

    def config_overrides(self, config: PretrainedConfig) -> dict[str, Any]:
        if self.rope_scaling is None:
            return {}
        return {"rope_parameters": scaled_rope_parameters(config, self.rope_scaling)}

    def attention_edits(self, sink_heads: dict[int, tuple[int, ...]] | None = None) -> AttentionEdits:
        window = parse_window(self.window) if self.window is not None else None
        ablate: dict[int, tuple[int, ...]] = {}
        if self.ablate_sink_values == "auto":
            if sink_heads is None:
                raise ValueError("ablate_sink_values=auto needs the sink heads of a baseline pass")
            ablate = {layer: heads for layer, heads in sink_heads.items() if heads}
        elif self.ablate_sink_values is not None:
            ablate = parse_heads(self.ablate_sink_values)
        return AttentionEdits(window=window, ablate_key0=ablate, ablate_mode=self.ablate_mode)

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


def _check_heads(spec: str, heads: dict[int, tuple[int, ...]], model: LoadedModel) -> None:
    facts = model.facts
    missing = [
        f"{layer}.{head}"
        for layer, group in heads.items()
        for head in group
        if not (0 <= layer < facts.layers and 0 <= head < facts.heads)
    ]
    if missing:
        raise PosleakError(
            f"--ablate-sink-values {spec!r} names heads that {model.name} does not have ({', '.join(missing)}); "
            f"it has layers 0..{facts.layers - 1} with heads 0..{facts.heads - 1} (write layer.head)"
        )


def parse_heads(spec: str) -> dict[int, tuple[int, ...]]:
    """`L.H,L.H,...` → {layer: heads}."""
    heads: dict[int, list[int]] = {}
    try:
        for part in spec.split(","):
            layer, head = part.split(".")
            heads.setdefault(int(layer), []).append(int(head))
    except ValueError:
        raise PosleakError(f"bad --ablate-sink-values {spec!r}; use auto or L.H,L.H (layer.head)") from None
    return {layer: tuple(sorted(hs)) for layer, hs in heads.items()}
