"""How a claim of arXiv 2606.06160 is judged: rows of evidence, each sample's verdict, the two samples' verdict.

Each claim's criterion (c1.py … c6.py, written before any data were seen) names the effects it expects, their
direction and a minimum size, and is judged on the bootstrap interval of each effect (evidence.py): a row of
evidence *supports* the claim when its whole interval lies beyond the threshold, *contradicts* it when the
whole interval lies on the other side, and is *unclear* otherwise. A sample's verdict is "consistent" when
every deciding row supports the claim, "not consistent" when any contradicts it, and "inconclusive" otherwise
(C5, which asks whether some replacement of the BOS does what the paper reports, uses "any supports" and "all
contradict").

`posleak paper` judges every claim on two disjoint samples of sequences (A and B) and calls a claim
consistent, or not consistent, only where both samples agree (`replicated`); a disagreement is inconclusive
(docs/method.md §13).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from posleak.experiments.evidence import Direction, Estimate, Says
from posleak.report.html import TableBlock, Verdict

EVIDENCE_COLUMNS = ("evidence", "value", "lo", "hi", "threshold", "unit", "says", "deciding")
Rule = Literal["all", "any"]
SAYS: dict[Verdict, Says] = {"consistent": "supports", "not consistent": "contradicts", "inconclusive": "unclear"}
_BOUND = re.compile(r"^\s*[<>≤≥]=?\s*(\S+)\s*$")  # a threshold as `row` and `fact` write it: "> 0.05", "≤ 1e-05"


@dataclass
class Judgement:
    """One sample's evidence rows and the verdict they give."""

    verdict: Verdict
    evidence: pd.DataFrame
    rule: Rule = "all"  # how the deciding rows give the verdict (`judge`)

    def decided_by(self, limit: int = 2) -> pd.DataFrame:
        """The deciding rows that gave the verdict, at most `limit`, the most telling first.

        They are the deciding rows that say what the verdict says (supports for consistent, contradicts for not
        consistent, unclear for inconclusive). Where the verdict needs every deciding row to say so ("all" rule
        and consistent, "any" rule and not consistent), the one nearest its threshold comes first: the verdict
        hangs on it. Where one row suffices ("all" and not consistent, "any" and consistent), the one farthest
        beyond its threshold comes first. Unclear rows, and rows whose threshold is not one bound, keep the
        claim's order. Distances are relative (`_beyond`), so rows in nats and in % compare."""
        deciding = self.evidence[self.evidence["deciding"]]
        chosen = deciding[deciding["says"] == SAYS[self.verdict]]
        if self.verdict != "inconclusive" and not chosen.empty:
            binding = (self.rule == "all") == (self.verdict == "consistent")
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
    paper: str = ""  # one sentence: the measured effect against the paper's
    numbers: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, str]] = field(default_factory=dict)  # per role it reads: spec and weights' SHA-256
    figures: list[Path] = field(default_factory=list)
    tables: list[TableBlock] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return replicated([judgement.verdict for judgement in self.samples.values()])

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
            "samples": {
                name: {"verdict": j.verdict, "evidence": j.evidence.to_dict(orient="records")}
                for name, j in self.samples.items()
            },
            "numbers": self.numbers,
            "models": self.models,
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


def quoted(e: Mapping[str, Any]) -> str:
    """A row of evidence for a sentence: its value, unit and interval."""
    interval = "" if pd.isna(e["lo"]) else f" ({e['lo']:.3g} to {e['hi']:.3g})"
    return f"{e['value']:.4g}{' ' + e['unit'] if e['unit'] else ''}{interval}"


def replicated(verdicts: Sequence[Verdict]) -> Verdict:
    """A verdict that every sample gives; where samples disagree, inconclusive."""
    return verdicts[0] if len(set(verdicts)) == 1 else "inconclusive"


def row(
    evidence: str, estimate: Estimate, threshold: float, direction: Direction, unit: str, deciding: bool = True
) -> dict[str, Any]:
    lo, hi = estimate.interval
    says = estimate.judge(threshold, direction)
    bound = f"{'>' if direction == 'above' else '<'} {threshold:g}"
    return dict(zip(EVIDENCE_COLUMNS, (evidence, estimate.value, lo, hi, bound, unit, says, deciding), strict=True))


def fact(evidence: str, value: float, holds: bool, fails: bool, threshold: str, unit: str = "") -> dict[str, Any]:
    """A row without an interval, for a property computed exactly (the closed system, cosines): it supports the
    claim where it `holds`, contradicts it where it clearly `fails`, and is unclear in the band between."""
    says: Says = "supports" if holds else "contradicts" if fails else "unclear"
    nan = float("nan")
    return dict(zip(EVIDENCE_COLUMNS, (evidence, value, nan, nan, threshold, unit, says, True), strict=True))


def judge(rows: list[dict[str, Any]], rule: Rule = "all") -> Judgement:
    frame = pd.DataFrame(rows, columns=list(EVIDENCE_COLUMNS))
    says = frame.loc[frame["deciding"], "says"]
    if rule == "all":
        verdict: Verdict = (
            "consistent"
            if (says == "supports").all()
            else "not consistent"
            if (says == "contradicts").any()
            else "inconclusive"
        )
    else:
        verdict = (
            "consistent"
            if (says == "supports").any()
            else "not consistent"
            if (says == "contradicts").all()
            else "inconclusive"
        )
    return Judgement(verdict, frame, rule)
