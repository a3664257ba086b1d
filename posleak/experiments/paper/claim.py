"""The protocol every claim (the packages claims/c1 … claims/c6) follows, and the formatting their texts share.

A claim's package holds everything of one claim: the shared analyses it reads (`requests`), the draws of sequences
it makes and the counts of its own runs, what it needs beyond them (`measure`), its options (a dataclass of its own
in the plan, `Plan.options`), its criterion, its judgement of one sample, its tables and figures, and its text
(statement, method, the sentence that sets the measured effect beside the paper's). `reproduce` iterates the
claims of the registry (posleak.experiments.paper.claims) in claim order.

The criteria were first written on 2026-11-30, before any data; every change since of what a criterion measures, a
threshold, the unit or the rule came after verdicts had been seen, and stands in its module's `revisions` with its
date and why (claims.json, report.html and the docs pages show them; docs/method.md §13, Revisions). The changes
below applied to several claims at once; each module lists those that touched it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from posleak.experiments.paper.plan import Plan, RoleName
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.requests import LongerT, Request, SampleNeed
from posleak.experiments.paper.verdict import HOLM, Judgement, Revision, estimate_text
from posleak.pipeline import AnalysisResult
from posleak.report.html import TableBlock

# The first verdicts (the test suite's `posleak paper --quick`, 2026-11-30) came from one sample, and a review found
# criteria that could hardly fail; every criterion was rewritten on 2026-12-01 (each module says how) and judged so.
REPLICATED = Revision(
    "2026-12-01",
    "judged on two disjoint samples of sequences, A and B, and consistent or not consistent only where both agree "
    "(before: one sample); effects with a direction and a minimum size judged on their 95% intervals",
)
ROWS_ESTIMAND = Revision(
    "2026-12-03",
    "the magnitudes judged are those of the decomposition by rows, mean ℓ = g + c + w (method §3), in place of the "
    "earlier g, m, r: the earlier residual-stream magnitude counted a Jensen gap of the softmax denominator as "
    "absolute position (0.03–0.30 nats of resid_all in a planted layer with none), so a threshold on it could not "
    "fail, and the causal-mask magnitude about doubled under the new one",
)
HOLM_RULE = Revision(
    "2026-12-03",
    "contradictions counted under Holm's step-down rule over the claim's deciding rows (family_wise), in place of "
    "any one row contradicting alone at 2.5%, which gave about 20% false contradictions per sample of 5–9 rows",
)
BY_DOCUMENT = Revision(
    "2026-12-04",
    "samples A and B cut from disjoint documents, and the intervals resampling documents, not sequences: windows of "
    "one document had stood in both samples and been resampled as if independent",
)
ACROSS_CORPORA = Revision(
    "2026-12-04",
    "the full plan judges on two corpora (stdlib, bible-web), consistent or not consistent only where every corpus "
    "is (verdict.across_corpora): every verdict had rested on one corpus",
)


class ClaimModule(ABC):
    """One claim of the reproduction, bound to one `Reproduction`."""

    name: ClassVar[str]
    statement: ClassVar[str]
    criterion: ClassVar[str]
    # the criterion's revisions after verdicts had been seen, oldest first (module docstring); () for none
    revisions: ClassVar[tuple[Revision, ...]] = ()
    method: ClassVar[str]
    roles: ClassVar[tuple[RoleName, ...]]  # the roles whose models the claim reads (claims.json names them)
    family_wise: ClassVar[str] = HOLM  # how its deciding rows give a sample's verdict (verdict.judge)
    # words the claim puts into its models' inputs as one token each: every role's tokenizer must keep each whole,
    # checked before any work (posleak.experiments.paper.models.word_problems)
    words: ClassVar[tuple[str, ...]] = ()

    # per role whose model must have a BOS token, why (checked before any work: posleak.experiments.paper.models)
    bos_needed: ClassVar[Mapping[RoleName, str]] = {}

    def __init__(self, repro: Reproduction) -> None:
        self.repro = repro

    @classmethod
    def requests(cls, plan: Plan, sample: str) -> list[Request]:
        """The shared analyses of `sample` this claim reads beyond every role's baseline: each runs once, whichever
        claims ask for it (reproduction.run_shared), and `SampleRuns` gives it by its key."""
        return []

    @classmethod
    def sample_needs(cls, plan: Plan) -> list[SampleNeed]:
        """The draws of sequences this claim makes beyond the shared analyses' (its own runs and measures), each
        checked against the documents before any work (posleak.experiments.paper.samples)."""
        return []

    @classmethod
    def positions_needed(cls, plan: Plan) -> list[LongerT]:
        """The T beyond the role's own at which this claim runs a role's model (checked against its maximum
        positions before any work: posleak.experiments.paper.models)."""
        return []

    @classmethod
    def own_analyses(cls, plan: Plan) -> int:
        """How many analyses this claim runs on one corpus beyond its `requests` where each of its parts can test
        it (posleak.experiments.paper.counts); a plan whose count depends on the models raises ValueError."""
        return 0

    @classmethod
    def lab_models(cls, plan: Plan) -> int:
        """How many lab models this claim trains under `plan` (posleak.experiments.paper.counts)."""
        return 0

    def before_shared(self) -> None:  # noqa: B027 (most claims need nothing before the shared analyses)
        """Run what this claim needs before the shared analyses (C3 chooses its heads on the selection sample)."""

    def compared_roles(self) -> frozenset[RoleName]:
        """The roles whose shared baseline one of this claim's `interventions` is compared with (known after
        `before_shared`): only those baselines keep their next-token scores (reproduction.run_shared)."""
        return frozenset()

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:  # noqa: B027 (most claims need nothing more)
        """Run what this claim needs beyond the shared analyses `runs` (by sample), keeping it for `judge`."""

    @abstractmethod
    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        """The criterion applied to one sample."""

    def once(self) -> dict[str, Judgement]:
        """Evidence judged once for the whole claim, not per sample (C4's lab), by name (`Claim.once`)."""
        return {}

    # the parts of `once` the claim needs: one that cannot test leaves it inconclusive at best (C4's window line)
    required_once: ClassVar[tuple[str, ...]] = ()

    def numbers(self, sample: str) -> dict[str, Any]:
        """Further numbers of one sample, or of one part judged once (`once`), for claims.json."""
        return {}

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        """Write this claim's tables of one sample into the run folder; the blocks the report shows of them."""
        return []

    def interventions(self, runs: SampleRuns, sample: str) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
        """Each intervention this claim runs, by name, as (baseline, intervened): their effect on the loss."""
        return {}

    @abstractmethod
    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        """One sentence: the effect measured on sample A (`judgement`) beside what the paper reports."""

    @abstractmethod
    def figures(self, runs: SampleRuns) -> list[Path]:
        """This claim's figures of sample A, written into the run folder."""


def evidence_text(judgement: Judgement, evidence: str) -> str:
    """A row of evidence for a sentence: its value, unit and interval."""
    return estimate_text(judgement.evidence.set_index("evidence").loc[evidence])


def rounded(table: pd.DataFrame) -> pd.DataFrame:
    """Numbers to 3 significant digits for reading; the Parquet tables and claims.json keep full precision."""
    return table.apply(lambda col: col.map(lambda v: float(f"{v:.3g}")) if col.dtype.kind == "f" else col)
