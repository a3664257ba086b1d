"""The tasks' vocabulary: the lab's special tokens first (`<bos>` 0, `<eos>` 1, as `posleak.lab.tokenizer`),
then markers, the digits 0–9 and symbols s0 … s495: 512 tokens, the lab's default vocabulary size.

`task_tokenizer()` is a word-level `PreTrainedTokenizerFast` over these names, saved beside a task model like
the corpus tokenizer, so `AutoTokenizer.from_pretrained(folder)` reloads it and the analysis can name the
token at position 0.
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from posleak.lab.tokenizer import BOS as BOS_TEXT
from posleak.lab.tokenizer import EOS as EOS_TEXT

MARKERS = ("<q>", "<a>", "<m>", "<r>")
BOS, EOS = 0, 1
QUERY, ANSWER, MARK, REVERSE = 2, 3, 4, 5
DIGIT0 = 2 + len(MARKERS)
SYMBOL0 = DIGIT0 + 10
VOCAB_SIZE = 512
NUM_SYMBOLS = VOCAB_SIZE - SYMBOL0
DIGITS = 3  # numbers are written with three digits, most significant first: positions up to 999


def names() -> list[str]:
    return [BOS_TEXT, EOS_TEXT, *MARKERS, *(str(d) for d in range(10)), *(f"s{k}" for k in range(NUM_SYMBOLS))]


def digits(value: int) -> list[int]:
    """`value` as DIGITS digit tokens, most significant first."""
    if not 0 <= value < 10**DIGITS:
        raise ValueError(f"{value} does not fit {DIGITS} digits")
    return [DIGIT0 + int(c) for c in f"{value:0{DIGITS}d}"]


def task_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {name: k for k, name in enumerate(names())}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS_TEXT))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=BOS_TEXT, eos_token=EOS_TEXT)
