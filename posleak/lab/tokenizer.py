"""The lab's tokenizer: a small byte-level BPE trained in code on the training corpus.

Byte-level, so any text encodes without unknown tokens; BPE, so that a 512-token vocabulary still
packs two characters of English into a token (a 128-token window holds two or three sentences of
context). Training is deterministic for a corpus and vocabulary size (Hugging Face `tokenizers`
breaks merge ties by a fixed order). The tokenizer is saved beside each checkpoint as a
`PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained(folder)` reloads it.

It never adds special tokens by itself: whether position 0 is `<bos>` is the lab's BOS policy,
applied by `posleak.data.make_sequences` (bos="on" / "off").
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from posleak.data.corpus import Corpus
from posleak.errors import PosleakError

BOS, EOS = "<bos>", "<eos>"
MIN_VOCAB = 256 + 2  # every byte plus the two special tokens


def train_tokenizer(corpus: Corpus, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` tokens (ids 0 and 1 are <bos> and <eos>) trained on `corpus`."""
    if vocab_size < MIN_VOCAB:
        raise PosleakError(f"vocabulary size {vocab_size} is below {MIN_VOCAB} (256 bytes + <bos>, <eos>); raise it")
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained(corpus, vocab_size)), bos_token=BOS, eos_token=EOS
    )


@lru_cache(maxsize=4)
def _trained(corpus: Corpus, vocab_size: int) -> str:
    """The serialised tokenizer; cached because every lab variant of a run trains on the same corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.documents, trainer)
    return tokenizer.to_str()
