"""`--ablate-sink-values auto|L.H,... [--ablate-mode zero|mean]` (docs/method.md §9): the value at key 0, as the
queries i ≥ 1 of the chosen heads read it, replaced inside the attention function (posleak.interventions.key0_values);
`auto` chooses the sink heads of a baseline pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from posleak.data.kinds import ABLATE_MODES, AblateMode
from posleak.interventions.base import Intervention, setting
from posleak.interventions.heads import SinkHeads, head_problems, heads_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

OPTION = "--ablate-sink-values"


@dataclass(frozen=True)
class AblateSinkValues(Intervention):
    name = "ablate_sink_values"
    chosen_heads_key = "sink_heads_ablated"

    heads: str | None = setting("ablate_sink_values", metavar="auto|L.H,...")
    mode: AblateMode = setting("ablate_mode", "zero", choices=ABLATE_MODES, help="what replaces an ablated value")

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        found = []
        if self.mode not in ABLATE_MODES:
            found.append(f"bad --ablate-mode {self.mode!r}; use {' or '.join(ABLATE_MODES)}")
        return found + head_problems(OPTION, self.heads, model)

    def needs_sink_heads(self) -> bool:
        return self.heads == "auto"

    def edit_attention(
        self,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        from posleak.interventions.key0_values import Key0ValueAblation

        assert self.heads is not None  # installed only where given
        ablation = Key0ValueAblation(heads_of(self.heads, OPTION, sink_heads), self.mode)
        edits.add_output_edit(ablation)
