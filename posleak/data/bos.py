"""Whether a tokenizer prepends its BOS by itself: the one probe behind `ModelFacts.auto_bos` and `--bos auto`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Any short text serves: only whether the tokenizer puts its BOS in front is looked at; this one starts with
# no special token in any vocabulary we know.
_PROBE_TEXT = "Position probe."


def tokenizer_prepends_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether encoding with special tokens puts the tokenizer's BOS in front of the text.

    Encode a probe with and without special tokens: BOS is automatic when only the former starts with it.
    """
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    with_special = tokenizer(_PROBE_TEXT, add_special_tokens=True)["input_ids"]
    without = tokenizer(_PROBE_TEXT, add_special_tokens=False)["input_ids"]
    return with_special[:1] == [bos] and without[:1] != [bos]
