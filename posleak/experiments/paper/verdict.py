"""How a claim of arXiv 2606.06160 is judged: rows of evidence, each sample's verdict, the two samples' verdict.

Each claim's criterion (claims/c1 … claims/c6) names the effects it expects, their direction and a minimum size, and is
judged on the bootstrap interval of each effect (evidence.py). The criteria were first written before any data were
seen (2026-11-30) and have been revised since, after verdicts had been seen: each claim module dates its
revisions and says why (`ClaimModule.revisions`, `Revision`; docs/method.md §13, Revisions). A row of
evidence *supports* the claim when its whole 95% interval lies beyond the threshold, *contradicts* it when the
whole interval lies on the other side, and is *unclear* otherwise. A sample's verdict is "consistent" when every
deciding row supports the claim, "not consistent" when any contradicts it, and "inconclusive" otherwise, also
when no row decides (a unit that cannot test the claim reports, untestable, and decides nothing).

The family-wise rule (docs/method.md §13, `HOLM`): "any row contradicts" would find a contradiction somewhere in
5–9 rows far more often than 2.5% of the time, so contradictions are counted under Holm's step-down rule over a
claim's deciding rows: ordered by their p-values (`Estimate.p_short`), the j-th (from 0) of m contradicts only
if its p-value and those of all before it lie below 2.5%/(m − j); a row whose interval alone lies short but that
Holm does not reach reads unclear. Support needs every deciding row (an intersection-union test), which holds at
2.5% with no adjustment. A row computed exactly (`fact`) has p-value 0 where it fails, 1 otherwise.

`posleak paper` judges every claim on two disjoint samples of sequences (A and B) and calls a claim consistent, or not
consistent, only where both samples agree (`replicated`); a disagreement is inconclusive (docs/method.md §13). On
several corpora (the full plan's two) the same rule joins the corpora's verdicts (`across_corpora`). Evidence that does
not depend on the sample (C4's lab, which trains on its own data over its own seeds) is judged once (`Claim.once`), not
per sample, and joins the samples' verdict (`with_once`). Each row keeps its estimate and bounds beside the evidence
(`Judged`), so that the samples' rows can be pooled into effect sizes, which decide nothing
(posleak.experiments.paper.effects).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.experiments.evidence import ALPHA, Direction, Estimate, Says
from posleak.report.html import FigureBlock, TableBlock, Verdict

# `p`: the row's p-value of a contradiction (Estimate.p_short), which orders Holm's rule
EVIDENCE_COLUMNS = ("evidence", "value", "lo", "hi", "threshold", "unit", "says", "deciding", "p")
HOLM = (
    f"Holm's step-down rule over the deciding rows' contradictions at {ALPHA:g} one-sided (a row contradicts only "
    f"where its p-value and those of all rows before it in order stay below {ALPHA:g}/(rows left)); support needs "
    "every deciding row, unadjusted (an intersection-union test)"
)
SAYS: dict[Verdict, Says] = {"consistent": "supports", "not consistent": "contradicts", "inconclusive": "unclear"}
JUDGED = "judged"  # the key of a row's `Judged` in the dicts `row` returns; not a column of the evidence
_BOUND = re.compile(r"^\s*[<>≤≥]=?\s*(\S+)\s*$")  # a threshold as `row` and `fact` write it: "> 0.05", "≤ 1e-05"


Bound = tuple[float, Direction]  # a threshold and the side of it that supports the claim


@dataclass(frozen=True)
class Judged:
    """A row's estimate and the bounds it was judged against: one, or a band's two (above its low end, below its
    high end), kept so that another estimate of the same quantity (the samples pooled) is judged alike."""

    estimate: Estimate
    bounds: tuple[Bound, ...]


@dataclass(frozen=True)
class Revision:
    """A change of a claim's criterion (what it measures, a threshold, the unit or the rule; not its wording): the
    ISO date (YYYY-MM-DD) of the commit that made it, and what changed and why."""

    date: str
    why: str


def revised(revisions: Sequence[Revision]) -> str:
    """The dates a criterion was revised, each once, in order, for the words beside it: "D1, D2"."""
    return ", ".join(dict.fromkeys(r.date for r in revisions))


def criterion_text(criterion: str, revisions: Sequence[Revision]) -> str:
    """A criterion as report.html and the docs pages show it (markdown): headed "Criterion", with the dates it was
    revised, and below it each revision's date and why, a list; a criterion without revisions stands alone."""
    if not revisions:
        return f"**Criterion.** {criterion}"
    items = "\n".join(f"- {r.date}: {r.why}" for r in revisions)
    return (
        f"**Criterion (revised {revised(revisions)}).** {criterion}\n\n**Its revisions**, each made after verdicts "
        f"had been seen (docs/method.md §13, Revisions):\n\n{items}"
    )


@dataclass
class Judgement:
    """One sample's evidence rows and the verdict they give; `judged`, per row in order, its estimate and bounds
    (None for an exact row, and for every row of a claims.json read back, which keeps no resamples)."""

    verdict: Verdict
    evidence: pd.DataFrame
    judged: list[Judged | None] = field(default_factory=list)

    def decided_by(self, limit: int = 2) -> pd.DataFrame:
        """The deciding rows that gave the verdict, at most `limit`, the most telling first.

        They are the deciding rows that say what the verdict says (supports for consistent, contradicts for not
        consistent, unclear for inconclusive). Where the verdict needs every deciding row to say so (consistent),
        the one nearest its threshold comes first: the verdict hangs on it. Where one row suffices (not
        consistent), the one farthest beyond its threshold comes first. Unclear rows, and rows whose threshold is
        not one bound, keep the claim's order. Distances are relative (`_beyond`), so rows in nats and in %
        compare."""
        deciding = self.evidence[self.evidence["deciding"]]
        chosen = deciding[deciding["says"] == SAYS[self.verdict]]
        if self.verdict != "inconclusive" and not chosen.empty:
            binding = self.verdict == "consistent"
            distance = chosen.apply(_beyond, axis=1)
            chosen = chosen.loc[distance.sort_values(ascending=binding, na_position="last", kind="stable").index]
        return chosen.head(limit)


@dataclass
class Claim:
    """One claim's verdict as `posleak paper` reports it: its text, each sample's judgement, figures and tables."""

    claim: str
    statement: str
    criterion: str
    samples: dict[str, Judgement]
    method: str
    family_wise: str = HOLM  # how the deciding rows of a sample give its verdict
    paper: str = ""  # one sentence: the measured effect against the paper's
    numbers: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, str]] = field(default_factory=dict)  # per role it reads: spec and weights' SHA-256
    # per corpus: its provenance (SampleRuns.corpus), `samples`, the names of its samples, and `documents`, per
    # sample (and C3's selection sample) the titles of the documents its runs' windows were cut from, every model's
    # (Reproduction.documents); none in older files
    corpora: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: list[Path | FigureBlock] = field(default_factory=list)  # FigureBlock: with a caption (its corpus)
    tables: list[TableBlock] = field(default_factory=list)
    # effect sizes, deciding nothing (posleak.experiments.paper.effects): per corpus, each deciding row pooled over
    # the corpus's samples; for an inconclusive claim, the power projection of each row some sample left unclear
    pooled: list[dict[str, Any]] = field(default_factory=list)
    projection: list[dict[str, Any]] = field(default_factory=list)
    # evidence judged once for the whole claim, not per sample, by name (C4's "lab": its own replication, over
    # seeds); none in older files, where such evidence stood in every sample
    once: dict[str, Judgement] = field(default_factory=dict)
    # the parts of `once` the claim needs (`with_once`): C4's window line
    required: tuple[str, ...] = ()
    # the criterion's revisions after verdicts had been seen (ClaimModule.revisions); none in older files
    revisions: list[Revision] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return with_once(self.samples_verdict, self.once, self.required)

    def once_name(self, name: str) -> str:
        """A part judged once as the reports name it: "window (needed)" where the claim needs it."""
        return f"{name} (needed)" if name in self.required else name

    def once_verdicts(self) -> list[str]:
        """Each part judged once with its verdict, as the reports list them: "lab, judged once: not testable"."""
        return [f"{self.once_name(name)}, judged once: {once_verdict(j)}" for name, j in self.once.items()]

    def untested(self) -> list[str]:
        """Each part the claim needs that cannot test, as "NAME (needed): its first row" (which says why): each
        keeps the claim from consistent."""
        return [
            f"{self.once_name(name)}: {j.evidence['evidence'].iloc[0]}"
            for name, j in self.once.items()
            if name in self.required and not can_test(j)
        ]

    @property
    def samples_verdict(self) -> Verdict:
        """The verdict of the samples alone: replicated over each corpus's samples, then across the corpora."""
        return across_corpora(list(self.by_corpus().values()))

    def groups(self) -> dict[str, list[str]]:
        """The names of the samples judged on each corpus; a claim that names no corpus (an older claims.json)
        has one group, named "", of all its samples."""
        return {name: corpus["samples"] for name, corpus in self.corpora.items()} or {"": list(self.samples)}

    def by_corpus(self) -> dict[str, Verdict]:
        """The verdict on each corpus, from its samples (`replicated`)."""
        return {name: replicated([self.samples[s].verdict for s in samples]) for name, samples in self.groups().items()}

    def deciding(self, limit: int = 2) -> list[str]:
        """The names of the rows that decided the verdict, at most `limit`: each sample's `decided_by`, in turn."""
        chosen = [list(j.decided_by(limit)["evidence"]) for j in self.samples.values()]
        longest = max((len(names) for names in chosen), default=0)
        turns = zip(*(names + [""] * (longest - len(names)) for names in chosen), strict=True)
        return list(dict.fromkeys(name for turn in turns for name in turn if name))[:limit]

    def to_json(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "verdict": self.verdict,
            "criterion": self.criterion,
            "revisions": [{"date": r.date, "why": r.why} for r in self.revisions],
            "family_wise": self.family_wise,
            "pooled": self.pooled,
            "projection": self.projection,
            "samples": {
                name: {"verdict": j.verdict, "evidence": j.evidence.to_dict(orient="records")}
                for name, j in self.samples.items()
            },
            "once": {
                name: {
                    "verdict": once_verdict(j),
                    "required": name in self.required,
                    "evidence": j.evidence.to_dict(orient="records"),
                }
                for name, j in self.once.items()
            },
            "numbers": self.numbers,
            "models": self.models,
            "corpora": self.corpora,
        }


def _beyond(e: Mapping[str, Any]) -> float:
    """How far a row's interval (its value, for a fact) lies from its threshold, over the size of the numbers
    involved (the threshold, the value, the interval's width): unitless; NaN when the threshold is not one bound."""
    bound = _BOUND.match(str(e["threshold"]))
    try:
        threshold = float(bound.group(1)) if bound else math.nan
    except ValueError:
        threshold = math.nan
    lo, hi = (e["value"], e["value"]) if pd.isna(e["lo"]) else (e["lo"], e["hi"])
    scale = max(abs(threshold), abs(e["value"]), hi - lo)
    return min(abs(lo - threshold), abs(hi - threshold)) / scale if scale > 0 else 0.0


def estimate_text(e: Mapping[str, Any]) -> str:
    """A row of evidence for a sentence: its value, unit and interval."""
    interval = "" if pd.isna(e["lo"]) else f" ({e['lo']:.3g} to {e['hi']:.3g})"
    return f"{e['value']:.4g}{' ' + e['unit'] if e['unit'] else ''}{interval}"


def replicated(verdicts: Sequence[Verdict]) -> Verdict:
    """A verdict that every sample gives; where samples disagree, inconclusive."""
    return verdicts[0] if len(set(verdicts)) == 1 else "inconclusive"


def across_corpora(verdicts: Sequence[Verdict]) -> Verdict:
    """A claim's verdict from its verdict on each corpus (docs/method.md §13): consistent only where it is
    consistent on every corpus, not consistent only where it is not consistent on every corpus, inconclusive
    otherwise: the rule of the samples (`replicated`), applied to the corpora. Why: a claim about decoder-only
    transformers holds, or fails, only where it does so whatever the text; a corpus that disagrees says that the
    effect depends on the text, which the claim does not say."""
    return replicated(verdicts)


def can_test(judgement: Judgement) -> bool:
    """Whether a part judged once can test the claim: it has a deciding row (an untestable line's rows report)."""
    return bool(judgement.evidence["deciding"].any())


def once_verdict(judgement: Judgement) -> str:
    """A part judged once as the reports name it: its verdict, or "not testable" where it has no deciding row."""
    return judgement.verdict if can_test(judgement) else "not testable"


def with_once(samples: Verdict, once: Mapping[str, Judgement], required: Sequence[str] = ()) -> Verdict:
    """A claim's verdict from its samples' (`samples`, replicated and across corpora) and the parts judged once:
    consistent only where the samples and every part that can test (`can_test`) are consistent, not consistent
    where any of them is, inconclusive otherwise. A part that cannot test leaves the verdict, unless the claim
    needs it (`required`: C4's window line, one of the things the claim says): then the claim is inconclusive at
    best. Why not `replicated`: the parts are different lines of evidence of one criterion, not replications of
    one, and within a sample a line that contradicts the claim already makes it not consistent."""
    untested: list[Verdict] = ["inconclusive" for name, j in once.items() if name in required and not can_test(j)]
    verdicts = [samples, *(j.verdict for j in once.values() if can_test(j)), *untested]
    if all(v == "consistent" for v in verdicts):
        return "consistent"
    return "not consistent" if "not consistent" in verdicts else "inconclusive"


def evidence_row(
    evidence: str, estimate: Estimate, threshold: float, direction: Direction, unit: str, deciding: bool = True
) -> dict[str, Any]:
    lo, hi = estimate.interval
    says = estimate.judge(threshold, direction)
    bound = f"{'>' if direction == 'above' else '<'} {threshold:g}"
    p = estimate.p_short(threshold, direction)
    values = (evidence, estimate.value, lo, hi, bound, unit, says, deciding, p)
    return {**dict(zip(EVIDENCE_COLUMNS, values, strict=True)), JUDGED: Judged(estimate, ((threshold, direction),))}


def fact_row(
    evidence: str, value: float, holds: bool, fails: bool, threshold: str, unit: str = "", deciding: bool = True
) -> dict[str, Any]:
    """A row without an interval, for a property computed exactly (the closed system): it supports the
    claim where it `holds`, contradicts it where it clearly `fails`, and is unclear in the band between; a row
    that is not `deciding` reports (an untestable unit's)."""
    says: Says = "supports" if holds else "contradicts" if fails else "unclear"
    nan = float("nan")
    return dict(
        zip(EVIDENCE_COLUMNS, (evidence, value, nan, nan, threshold, unit, says, deciding, exact_p(says)), strict=True)
    )


def exact_p(says: Says) -> float:
    """The p-value of a contradiction for a row judged without resamples: 0 where it contradicts, else 1."""
    return 0.0 if says == "contradicts" else 1.0


def judge(rows: list[dict[str, Any]]) -> Judgement:
    """A sample's verdict from its rows, their contradictions under Holm's rule (module docstring)."""
    frame = pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))
    frame["says"] = holm(frame)
    says = frame.loc[frame["deciding"], "says"]
    # no deciding row (every unit untestable): nothing supports the claim, so it is not vacuously consistent
    verdict: Verdict = (
        "inconclusive"
        if says.empty
        else "consistent"
        if (says == "supports").all()
        else "not consistent"
        if (says == "contradicts").any()
        else "inconclusive"
    )
    return Judgement(verdict, frame, [r.get(JUDGED) for r in rows])


def holm(frame: pd.DataFrame) -> pd.Series:
    """Each row's `says` with the deciding rows' contradictions under Holm's step-down rule: in order of p, the
    j-th (from 0) of m keeps its contradiction while every p so far lies below ALPHA/(m − j); the others that
    contradicted alone read unclear. Rows that only report are left as they are."""
    says = frame["says"].copy()
    order = frame.loc[frame["deciding"], "p"].sort_values(kind="stable").index
    rejecting = True
    for j, index in enumerate(order):
        rejecting = rejecting and says[index] == "contradicts" and frame.at[index, "p"] < ALPHA / (len(order) - j)
        if says[index] == "contradicts" and not rejecting:
            says[index] = "unclear"
    return says
