"""The protocol every claim module (c1.py … c6.py) follows, and the formatting their texts share.

A claim module holds everything of one claim: the analyses it needs beyond the shared ones (`measure`), its
criterion, its judgement of one sample, its tables and figures, and its text (statement, method, the sentence
that sets the measured effect beside the paper's). `reproduce` iterates the modules in claim order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from posleak.experiments.paper.plan import RoleName
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import HOLM, Judgement, quoted
from posleak.pipeline import AnalysisResult
from posleak.report.html import TableBlock


class ClaimModule(ABC):
    """One claim of the reproduction, bound to one `Reproduction`."""

    name: ClassVar[str]
    statement: ClassVar[str]
    criterion: ClassVar[str]
    method: ClassVar[str]
    roles: ClassVar[tuple[RoleName, ...]]  # the roles whose models the claim reads (claims.json names them)
    family_wise: ClassVar[str] = HOLM  # how its deciding rows give a sample's verdict (verdict.judge)
    # words the claim puts into its models' inputs as one token each: every role's tokenizer must keep each whole,
    # checked before any work (posleak.experiments.paper.models.word_problems)
    words: ClassVar[tuple[str, ...]] = ()

    def __init__(self, repro: Reproduction) -> None:
        self.repro = repro

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:  # noqa: B027 (most claims need nothing more)
        """Run what this claim needs beyond the shared analyses `runs` (by sample), keeping it for `judge`."""

    @abstractmethod
    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        """The criterion applied to one sample."""

    def once(self) -> dict[str, Judgement]:
        """Evidence judged once for the whole claim, not per sample (C4's lab), by name (`Claim.once`)."""
        return {}

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


def quote(judgement: Judgement, evidence: str) -> str:
    """A row of evidence for a sentence: its value, unit and interval."""
    return quoted(judgement.evidence.set_index("evidence").loc[evidence])


def rounded(table: pd.DataFrame) -> pd.DataFrame:
    """Numbers to 3 significant digits for reading; the Parquet tables and claims.json keep full precision."""
    return table.apply(lambda col: col.map(lambda v: float(f"{v:.3g}")) if col.dtype.kind == "f" else col)
