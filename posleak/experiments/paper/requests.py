"""What a claim asks the reproduction for: the analyses it reads (`Request`) and the draws of sequences it makes
(`SampleNeed`), so that the plumbing runs, merges and checks them without knowing any claim.

A request names its analysis by `key` (its manifest key, with the sample); two claims that ask for the same key
ask for the same analysis, which runs once and serves both (posleak.experiments.paper.reproduction.merged).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from posleak.data.kinds import BosPolicy, NullKind
from posleak.experiments.paper.plan import RoleName
from posleak.interventions import Interventions


@dataclass(frozen=True)
class Request:
    """One analysis of one sample: the model of `role` under `interventions`, into OUT/runs/FOLDER-SAMPLE; `key`
    names it in the manifest's runs (with the sample); `null`: on that null of the role's sequences. An intervened
    run keeps its next-token scores (it is compared with its baseline); a plain baseline keeps them where a claim
    compares one of its own runs with it (`ClaimModule.compared_roles`); a null never does."""

    key: str
    role: RoleName
    folder: str
    interventions: Interventions = dataclasses.field(default_factory=Interventions)
    null: NullKind | None = None


@dataclass(frozen=True)
class SampleNeed:
    """`num_seqs` sequences of `seq_len` tokens under `bos` for the model of `role`, on each of `samples`: `what`
    draws them, and `fix` is what a plan file lowers when a sample's part holds too few documents."""

    what: str
    role: RoleName
    seq_len: int
    num_seqs: int
    bos: BosPolicy
    samples: tuple[str, ...]
    fix: str
    corpus: str | None = None  # the corpus it draws from; None: each corpus of the plan

    @property
    def draw(self) -> tuple[object, ...]:
        """What it draws, whoever asks: two needs of one draw are checked once, under the first's words."""
        return self.role, self.seq_len, self.num_seqs, self.bos, self.samples, self.corpus


@dataclass(frozen=True)
class LongerT:
    """A T at which a claim runs the model of `role` beyond the role's own: `which` names it, `fix` says what lowers
    it."""

    role: RoleName
    which: str
    seq_len: int
    fix: str
