"""`--patch-kv0 SOURCE [--kv0-heads auto|L.H,...]` (docs/method.md §9): the path-specific patch, key 0's key and
value in the chosen heads taken from the SOURCE token's own forward (posleak.interventions.key0), inside the
attention function; `auto` chooses the sink heads of a baseline pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from posleak.interventions.base import Intervention, setting
from posleak.interventions.heads import SinkHeads, head_problems, heads_of
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

OPTION, HEADS_OPTION = "--patch-kv0", "--kv0-heads"


@dataclass(frozen=True)
class PatchKv0(Intervention):
    name = "patch_kv0"
    chosen_heads_key = "sink_heads_kv0_patched"

    source: str | None = setting(
        "patch_kv0", metavar="SOURCE", help="key 0's key and value in --kv0-heads from this token"
    )
    heads: str = setting("kv0_heads", "auto", metavar="auto|L.H,...", help="the heads --patch-kv0 patches")

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        from posleak.interventions.patching import source_token

        if self.source is None:  # --kv0-heads alone is not checked: it patches nothing
            return []
        found = Problems()
        found.extend(head_problems(HEADS_OPTION, self.heads, model))
        if model is not None:
            with found.collecting():
                source_token(model.tokenizer, self.source, model.facts.vocab_size, OPTION)
        return found.found

    def needs_sink_heads(self) -> bool:
        return self.heads == "auto"

    def edit_attention(
        self,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        """A key-0 patch needs the `model` (one forward of its source token) and, for a SOURCE given as text, its
        `tokenizer`."""
        from posleak.interventions.key0 import key0_patch
        from posleak.interventions.patching import source_token

        if model is None:
            raise ValueError("patch_kv0 needs the model, to compute the source token's key and value")
        assert self.source is not None  # installed only where given
        heads = heads_of(self.heads, HEADS_OPTION, sink_heads)
        token = source_token(tokenizer, self.source, option=OPTION)
        edits.add_output_edit(key0_patch(model, token, heads))
