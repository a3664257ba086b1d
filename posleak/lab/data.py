"""The data of lab training and evaluation: a corpus split by document with its tokenizer (`LabData`), the
windows cut from a split, the rows of a synthetic task, and the seeded order in which training visits rows.

The corpus is split by document (a document goes to validation when the first byte of its SHA-256 falls
below val_fraction·256, so the split does not move when other documents change); training windows are cut
from the training documents joined by <eos> (`make_sequences` with cross_documents), and position 0 of
every row is <bos> when the spec says bos=True.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast

from posleak.data.batches import TokenBatch, make_sequences
from posleak.data.corpus import Corpus, load_corpus, make_corpus
from posleak.errors import PosleakError
from posleak.lab.tasks import TaskBatch, generate
from posleak.lab.tokenizer import train_tokenizer
from posleak.lab.train_config import TrainConfig


@dataclass
class LabData:
    """The tokenizer and the two document splits of one corpus."""

    tokenizer: PreTrainedTokenizerFast
    train: Corpus
    val: Corpus


def prepare_data(config: TrainConfig, tokenizer: PreTrainedTokenizerFast | None = None) -> LabData:
    """Load the corpus, split it by document and train the tokenizer on the training documents (unless
    `tokenizer`, the one saved with a checkpoint, is given)."""
    corpus = load_corpus(config.corpus)
    threshold = config.val_fraction * 256
    is_val = [hashlib.sha256(doc.encode()).digest()[0] < threshold for doc in corpus.documents]
    if all(is_val) or not any(is_val):
        raise PosleakError(
            f"corpus '{corpus.name}' has {len(corpus)} documents, too few to split into training and validation; "
            "use a larger corpus"
        )
    train, val = (
        make_corpus(
            f"{corpus.name}[{split}]",
            [doc for doc, val in zip(corpus.documents, is_val, strict=True) if val == want],
            origin=corpus.origin,
            titles=[title for title, val in zip(corpus.titles, is_val, strict=True) if val == want],
        )
        for split, want in (("train", False), ("val", True))
    )
    return LabData(tokenizer=tokenizer or train_tokenizer(train, config.vocab_size), train=train, val=val)


# random streams of task rows: training, validation, evaluation at each length, the probe's, the analysis's
TASK_TRAIN, TASK_VAL, TASK_EVAL, TASK_PROBE, TASK_ANALYSIS = 0, 1, 2, 3, 4


def task_rows(task: str, num_rows: int, length: int, bos: bool, seed: Sequence[int]) -> TaskBatch:
    """Rows of `task` with `length` tokens; without a BOS, rows one token longer with their `<bos>` cut off."""
    if bos:
        return generate(task, num_rows, length, seed)
    rows = generate(task, num_rows, length + 1, seed)
    return TaskBatch(task, rows.ids[:, 1:].contiguous(), rows.answers[:, 1:].contiguous())


def lab_sequences(data: LabData, split: str, seq_len: int, num_seqs: int | None, bos: bool, seed: int) -> TokenBatch:
    """Windows of one split (joined by <eos>), <bos> at position 0 when `bos`; all of them when num_seqs is None,
    else at most num_seqs (fewer when the split holds fewer)."""
    corpus = data.train if split == "train" else data.val
    lengths = [len(ids) for ids in data.tokenizer(list(corpus.documents), add_special_tokens=False)["input_ids"]]
    available = (sum(lengths) + len(lengths) - 1) // (seq_len - bos)
    count = available if num_seqs is None else min(num_seqs, available)
    if count < 1:
        raise PosleakError(
            f"the {split} split of corpus '{corpus.name}' holds no window of {seq_len} tokens; "
            "lower seq_len or use a larger corpus"
        )
    return make_sequences(
        corpus, data.tokenizer, seq_len, count, bos="on" if bos else "off", seed=seed, cross_documents=True
    )


class BatchOrder:
    """The rows of step s: epoch e visits every training row once, in a permutation seeded by (seed, e)."""

    def __init__(self, num_rows: int, batch_size: int, seed: int) -> None:
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def rows(self, step: int) -> torch.Tensor:
        flat = torch.arange(step * self.batch_size, (step + 1) * self.batch_size)
        epochs, offsets = flat // self.num_rows, flat % self.num_rows
        return torch.stack([self._permutation(int(e))[o] for e, o in zip(epochs, offsets, strict=True)])

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.num_rows, generator=generator)
        return self._perm
