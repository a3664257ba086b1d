"""`--replace-bos KIND` (docs/method.md §9): the BOS's input vector at position 0 replaced by a forward hook
(posleak.interventions.embedding); `random` draws with the run's --seed."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from posleak.errors import PosleakError
from posleak.interventions.base import Intervention, Option, SinkHeads, Values
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.models.load import LoadedModel

REPLACEMENTS = ("mean", "random", "zero", "token:TEXT")


class ReplaceBos(Intervention):
    name = "replace_bos"
    options = (Option("replace_bos", metavar="|".join(REPLACEMENTS)), Option("seed", default=0, flag=False))

    def problems(self, values: Values, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """At most one problem: the first one stands in the way of the others."""
        from posleak.interventions.embedding import replacement_token

        kind = values["replace_bos"]
        found = Problems()
        with found.collecting():
            if kind is not None:
                if model is not None or not kind.startswith("token:"):
                    replacement_token(model.tokenizer if model is not None else None, kind)
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
        return found.found

    def describe(self, values: Values, sink_heads: SinkHeads | None) -> dict[str, Any]:
        described = super().describe(values, sink_heads)
        if values["replace_bos"] != "random":  # the seed draws only the random direction
            del described["seed"]
        return described

    def hooks(
        self, values: Values, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> AbstractContextManager[None]:
        from posleak.interventions.embedding import replaced_position0, replacement_vector

        if not bos_at_0:
            raise PosleakError("--replace-bos needs a BOS at position 0; add --bos on")
        vector = replacement_vector(model, tokenizer, values["replace_bos"])
        return replaced_position0(model, vector, values["seed"])
