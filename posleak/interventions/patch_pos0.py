"""`--patch-pos0 SOURCE [--patch-layers L..]` (docs/method.md §9): position 0's residual state at the chosen
layers replaced by the SOURCE token's, by forward hooks (posleak.interventions.patching)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posleak.interventions.base import Intervention, setting
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.models.load import LoadedModel


@dataclass(frozen=True)
class PatchPos0(Intervention):
    name = "patch_pos0"

    source: str | None = setting("patch_pos0", metavar="SOURCE", help="TEXT of one token, or id:N")
    layers: str = setting("patch_layers", "all", metavar="L..", help="resid indices: all | L | A..B | L,L")

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        from posleak.interventions.patching import parse_layers, source_token

        found = Problems()
        if self.source is not None and model is not None:
            with found.collecting():
                source_token(model.tokenizer, self.source, model.facts.vocab_size)
            with found.collecting():
                parse_layers(self.layers, model.facts.layers + 1)
        return found.found

    def hooks(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> AbstractContextManager[None]:
        from posleak.capture.residual import decoder_layers
        from posleak.interventions.patching import parse_layers, patched_position0, position0_trajectory, source_token

        assert self.source is not None  # installed only where given
        token = source_token(tokenizer, self.source)
        layers = parse_layers(self.layers, len(decoder_layers(model)) + 1)
        return patched_position0(model, position0_trajectory(model, token), layers)
