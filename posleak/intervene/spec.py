"""The interventions of one run (DESIGN.md §3.4): declared, recorded, and applied in one place.

Each field is the command-line string of one option; `describe()` is what the manifest records.
Where each acts: RoPE scaling at load time (`config_overrides`), window and sink-value ablation
inside the attention function (`attention_edits`), BOS replacement and position-0 patching as
forward hooks (`applied`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from posleak.capture.residual import decoder_layers
from posleak.capture.session import AttentionEdits
from posleak.errors import PosleakError
from posleak.intervene.embedding import replaced_position0, replacement_vector
from posleak.intervene.patching import parse_layers, patched_position0, position0_trajectory, source_token
from posleak.intervene.rope import scaled_rope_parameters


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

    def __post_init__(self) -> None:
        if self.window is not None and self.window != "global" and not self.window.isdigit():
            raise PosleakError(f"bad --window {self.window!r}; use a width W ≥ 1 or 'global'")
        if self.window is not None and self.window.isdigit() and int(self.window) < 1:
            raise PosleakError("--window must be ≥ 1")
        if self.ablate_mode not in ("zero", "mean"):
            raise PosleakError(f"bad ablation mode {self.ablate_mode!r}; use zero or mean")

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
        window: int | Literal["global"] | None = None
        if self.window is not None:
            window = "global" if self.window == "global" else int(self.window)
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
