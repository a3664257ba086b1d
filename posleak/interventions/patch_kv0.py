"""`--patch-kv0 SOURCE [--kv0-heads auto|L.H,...]` (docs/method.md §9): the path-specific patch, key 0's key and
value in the chosen heads taken from the SOURCE token's own forward (posleak.interventions.key0), inside the
attention function; `auto` chooses the sink heads of a baseline pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posleak.interventions.base import Intervention, Option, Values
from posleak.interventions.heads import SinkHeads, head_problems, heads_of
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.capture.session import AttentionEdits
    from posleak.models.load import LoadedModel

OPTION, HEADS_OPTION = "--patch-kv0", "--kv0-heads"


class PatchKv0(Intervention):
    name = "patch_kv0"
    chosen_heads_key = "sink_heads_kv0_patched"
    options = (
        Option("patch_kv0", metavar="SOURCE", help="key 0's key and value in --kv0-heads from this token"),
        Option("kv0_heads", default="auto", metavar="auto|L.H,...", help="the heads --patch-kv0 patches"),
    )

    def problems(self, values: Values, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        from posleak.interventions.patching import source_token

        if values["patch_kv0"] is None:  # --kv0-heads alone is not checked: it patches nothing
            return []
        found = Problems()
        found.extend(head_problems(HEADS_OPTION, values["kv0_heads"], model))
        if model is not None:
            with found.collecting():
                source_token(model.tokenizer, values["patch_kv0"], model.facts.vocab_size, OPTION)
        return found.found

    def needs_sink_heads(self, values: Values) -> bool:
        return values["kv0_heads"] == "auto"

    def edit_attention(
        self,
        values: Values,
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
        heads = heads_of(values["kv0_heads"], HEADS_OPTION, sink_heads)
        token = source_token(tokenizer, values["patch_kv0"], option=OPTION)
        edits.add_output_edit(key0_patch(model, token, heads))
