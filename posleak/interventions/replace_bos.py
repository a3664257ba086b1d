"""`--replace-bos KIND` (docs/method.md §9): the BOS's input vector at position 0 replaced by a forward hook
(posleak.interventions.embedding); `random` draws with the run's --seed."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posleak.errors import PosleakError
from posleak.interventions.base import Intervention, setting
from posleak.interventions.heads import SinkHeads
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from posleak.models.load import LoadedModel

REPLACEMENTS = ("mean", "random", "zero", "token:TEXT")


@dataclass(frozen=True)
class ReplaceBos(Intervention):
    name = "replace_bos"

    kind: str | None = setting("replace_bos", metavar="|".join(REPLACEMENTS))
    seed: int = setting("seed", 0, flag=False)  # the run's --seed: what draws the `random` direction

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        """At most one problem: the first one stands in the way of the others."""
        kind = self.kind
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

    def describe(self, sink_heads: SinkHeads | None) -> dict[str, Any]:
        described = super().describe(sink_heads)
        if self.kind != "random":  # the seed draws only the random direction
            del described["seed"]
        return described

    def hooks(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, bos_at_0: bool
    ) -> AbstractContextManager[None]:
        from posleak.interventions.embedding import replaced_position0, replacement_vector

        if not bos_at_0:
            raise PosleakError("--replace-bos needs a BOS at position 0; add --bos on")
        assert self.kind is not None  # installed only where given
        vector = replacement_vector(model, self.kind, replacement_token(tokenizer, self.kind))
        return replaced_position0(model, vector, self.seed)


def replacement_token(tokenizer: PreTrainedTokenizerBase | None, kind: str) -> int | None:
    """The token id a `token:TEXT` replacement names (None for the other kinds); refuses an unknown kind."""
    if kind in ("mean", "zero", "random"):
        return None
    if kind.startswith("token:") and tokenizer is not None:
        text = kind.removeprefix("token:")
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise PosleakError(f"--replace-bos {kind!r}: {text!r} encodes to {len(ids)} tokens; name a single token")
        return ids[0]
    raise PosleakError(f"bad --replace-bos {kind!r}; use one of {', '.join(REPLACEMENTS)}")
