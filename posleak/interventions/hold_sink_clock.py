"""`--hold-sink-clock auto|L.H,...` (docs/method.md §9), the clock removal: in the chosen heads, the weight each
query i ≥ 1 gives key 0 replaced by its mean over those queries (per sequence and head), the other keys'
weights renormalised, inside the attention function (posleak.interventions.key0_reads); `auto` chooses the sink heads
of a baseline pass. The heads still read key 0 as much on average, but no longer by how far the query stands
from it: whether sink heads carry position to later queries (claim C3 (a))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from posleak.interventions.base import Intervention, setting
from posleak.interventions.heads import SinkHeads, head_problems, heads_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel


@dataclass(frozen=True)
class HoldSinkClock(Intervention):
    name = "hold_sink_clock"
    chosen_heads_key = "sink_heads_clock_held"

    heads: str | None = setting(
        "hold_sink_clock",
        metavar="auto|L.H,...",
        help="in these heads, key 0's weight for queries i ≥ 1 held at its mean over them",
    )
    # what key 0's weight becomes (posleak.interventions.key0_reads.Key0Reads)
    target: ClassVar[Literal["mean", "zero"]] = "mean"

    @property
    def flag(self) -> str:
        return self.options()[0].flag_name

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        return head_problems(self.flag, self.heads, model)

    def needs_sink_heads(self) -> bool:
        return self.heads == "auto"

    def edit_attention(
        self,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        from posleak.interventions.key0_reads import Key0Reads

        assert self.heads is not None  # installed only where given
        heads = heads_of(self.heads, self.flag, sink_heads)
        edits.add_output_edit(Key0Reads(heads, self.target, self.flag))
