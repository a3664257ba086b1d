"""`--ablate-sink-values auto|L.H,... [--ablate-mode zero|mean]` (docs/method.md §9): the value at key 0, as the
queries i ≥ 1 of the chosen heads read it, replaced inside the attention function (posleak.interventions.key0_values);
`auto` chooses the sink heads of a baseline pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posleak.data.kinds import ABLATE_MODES
from posleak.interventions.base import Intervention, Option, Values
from posleak.interventions.heads import SinkHeads, head_problems, heads_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

OPTION = "--ablate-sink-values"


class AblateSinkValues(Intervention):
    name = "ablate_sink_values"
    chosen_heads_key = "sink_heads_ablated"
    options = (
        Option("ablate_sink_values", metavar="auto|L.H,..."),
        Option("ablate_mode", default="zero", choices=ABLATE_MODES, help="what replaces an ablated value"),
    )

    def problems(self, values: Values, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        found = []
        if values["ablate_mode"] not in ABLATE_MODES:
            found.append(f"bad --ablate-mode {values['ablate_mode']!r}; use {' or '.join(ABLATE_MODES)}")
        return found + head_problems(OPTION, values["ablate_sink_values"], model)

    def needs_sink_heads(self, values: Values) -> bool:
        return values["ablate_sink_values"] == "auto"

    def edit_attention(
        self,
        values: Values,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        from posleak.interventions.key0_values import Key0ValueAblation

        ablation = Key0ValueAblation(heads_of(values["ablate_sink_values"], OPTION, sink_heads), values["ablate_mode"])
        edits.add_output_edit(ablation)
