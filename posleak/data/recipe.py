"""The recipe of a run's sequences (`Recipe`): windows of a corpus (T, N, BOS policy, seed, across documents or
not, a part of its documents, at most K windows of each) or a token file taken verbatim, and the null to make of
them, if any; checked before any model is asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posleak.data.kinds import BOS_POLICIES, NULLS, BosPolicy, NullKind, Part
from posleak.store.identity import identity, left_out_at_default

SEEDS = 2**32  # seeds are drawn by torch.Generator.manual_seed: 0 ≤ seed < 2^32


@dataclass(frozen=True)
class Recipe:
    """What sequences a run analyses (posleak.pipeline.prepare.sequences_for makes them for a model). The options
    added after the first run folders were written are left out of the fingerprint at their defaults
    (`left_out_at_default`), so that those folders keep resuming."""

    seq_len: int = 256
    num_seqs: int = 16
    bos: BosPolicy = "auto"
    corpus: str = "stdlib"
    tokens: str | None = None  # a .npy file of token ids (N×T), taken verbatim instead of the corpus
    cross_documents: bool = False
    seed: int = 0
    # A null of the sequences instead of the sequences (posleak.data.nulls, docs/method.md §14), drawn with
    # `null_seed`; None: the sequences as they are.
    null: NullKind | None = left_out_at_default(None)
    null_seed: int = left_out_at_default(0, follows="null")
    # (index, shares): only the documents of that part, the corpus's documents dealt into parts in the proportions
    # `shares` by `seed` (posleak.data.batches.part_documents): `posleak paper`'s samples, which share no document.
    # None: all.
    part: Part | None = left_out_at_default(None)
    # At most this many windows of each document, one of every document before a second of any (None: no limit,
    # the windows drawn among all): with 1, N sequences are windows of N distinct documents.
    windows_per_document: int | None = left_out_at_default(None)

    def identity(self) -> dict[str, Any]:
        """The recipe as a run's fingerprint covers it (posleak.store.identity)."""
        return identity(self)

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
        return found + self._part_problems() + self._per_document_problems()

    def _part_problems(self) -> list[str]:
        if self.part is None:
            return []
        if not (isinstance(self.part, tuple | list) and len(self.part) == 2 and _is_shares(self.part[1])):
            return [f"part {self.part!r} is not (index, shares); give e.g. (0, (2, 2, 1)), shares whole numbers ≥ 1"]
        index, shares = self.part
        if not (type(index) is int and 0 <= index < len(shares)):
            return [f"part {self.part!r} is not one of {len(shares)} parts; give an index from 0 to {len(shares) - 1}"]
        if self.tokens is not None:
            return ["a part deals a corpus's documents, and a token file is taken verbatim; drop the part or the file"]
        return []

    def _per_document_problems(self) -> list[str]:
        limit = self.windows_per_document
        if limit is None:
            return []
        if type(limit) is not int or limit < 1:
            return [f"--windows-per-document {limit!r} is not a whole number ≥ 1; give K ≥ 1, or leave it out"]
        if self.cross_documents:
            return [
                "--windows-per-document counts windows of each document, and --cross-documents joins them; "
                "drop one of the two"
            ]
        if self.tokens is not None:
            return ["--windows-per-document draws windows of a corpus, and a token file is taken verbatim; drop one"]
        return []


def _is_shares(shares: object) -> bool:
    """Whether `shares` is a non-empty list of whole numbers ≥ 1 (a part's proportions)."""
    return isinstance(shares, tuple | list) and bool(shares) and all(type(v) is int and v >= 1 for v in shares)


def seed_problems(seed: int) -> list[str]:
    """What is wrong with a --seed."""
    return [] if 0 <= seed < SEEDS else [f"--seed {seed} is out of range; use a seed from 0 to {SEEDS - 1}"]
