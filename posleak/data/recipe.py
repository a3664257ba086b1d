"""The recipe of a run's sequences (`Recipe`): windows of a corpus (T, N, BOS policy, seed, across documents or
not, a part of its documents) or a token file taken verbatim, and the null to make of them, if any; checked before
any model is asked."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from posleak.data.kinds import BOS_POLICIES, NULLS, BosPolicy, NullKind

SEEDS = 2**32  # seeds are drawn by torch.Generator.manual_seed: 0 ≤ seed < 2^32


@dataclass(frozen=True)
class Recipe:
    """What sequences a run analyses (posleak.pipeline.prepare.sequences_for makes them for a model)."""

    seq_len: int = 256
    num_seqs: int = 16
    bos: BosPolicy = "auto"
    corpus: str = "stdlib"
    tokens: str | None = None  # a .npy file of token ids (N×T), taken verbatim instead of the corpus
    cross_documents: bool = False
    seed: int = 0
    # A null of the sequences instead of the sequences (posleak.data.nulls, docs/method.md §14), drawn with
    # `null_seed`; None: the sequences as they are.
    null: NullKind | None = None
    null_seed: int = 0
    # (index, count): only the documents of that part, the corpus's documents dealt into `count` parts by `seed`
    # (posleak.data.batches.part_documents): `posleak paper`'s samples, which share no document. None: all.
    part: tuple[int, int] | None = None

    def identity(self) -> dict[str, Any]:
        """The recipe as a run's fingerprint covers it: without a null, the null's options are left out, so that
        the run folders written before nulls existed keep their fingerprint."""
        options = dataclasses.asdict(self)
        if self.null is None:
            del options["null"], options["null_seed"]
        if self.part is None:
            del options["part"]
        return options

    def problems(self) -> list[str]:
        """What is wrong with the recipe's options, before any corpus or model is read (the shape of the
        sequences is checked against what measures them: posleak.pipeline.config)."""
        found = seed_problems(self.seed)
        if self.bos not in BOS_POLICIES:
            found.append(f"unknown --bos {self.bos!r}; use one of {', '.join(BOS_POLICIES)}")
        if self.null is not None and self.null not in NULLS:
            found.append(f"unknown --null {self.null!r}; use one of {', '.join(NULLS)}")
        if not 0 <= self.null_seed < SEEDS:
            found.append(f"--null-seed {self.null_seed} is out of range; use a seed from 0 to {SEEDS - 1}")
        elif self.null is None and self.null_seed != 0:
            found.append(f"--null-seed {self.null_seed} without --null; name the null it draws (shift or shuffle)")
        return found + self._part_problems()

    def _part_problems(self) -> list[str]:
        if self.part is None:
            return []
        if not (isinstance(self.part, tuple | list) and len(self.part) == 2 and all(type(v) is int for v in self.part)):
            return [f"part {self.part!r} is not a pair of whole numbers; give (index, count)"]
        index, count = self.part
        if not 0 <= index < count:
            return [f"part {self.part} is not one of {count} parts; give (index, count) with 0 ≤ index < count"]
        if self.tokens is not None:
            return ["a part deals a corpus's documents, and a token file is taken verbatim; drop the part or the file"]
        return []


def seed_problems(seed: int) -> list[str]:
    """What is wrong with a --seed."""
    return [] if 0 <= seed < SEEDS else [f"--seed {seed} is out of range; use a seed from 0 to {SEEDS - 1}"]
