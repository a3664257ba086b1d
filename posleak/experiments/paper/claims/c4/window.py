"""C4's window line, judged once: does a sliding window let the residual-stream component accumulate with depth?

A window of W hides key 0 (the sink) from every query i ≥ W, so what such a query knows of absolute position arrives
through hidden states, whose reach grows by W per layer (docs/method.md §3): "accumulates with depth" is a statement
about these queries, and it can show only where T spans several windows. So the sliding model and the standard one
are measured at the plan's `window_seq_len` (T ≥ 4W: 2048 for gemma3-270m), both on the queries W ≤ i < T, and the
slopes of their resid_beyond against relative depth compared, the sliding model's fitted on its windowed layers
alone (each at its depth l/(L − 1) in the stack): a global layer sees key 0 from every query, and one straight line
through a stack that alternates them (gemma3-270m: five local layers, one global) mixes two slopes.

Why once, on its own corpus. The stdlib docstrings hold 4 and 6 documents per sample that reach 2048 tokens, the
World English Bible 20 and 21, so the line reads the plan's `window_corpus`, on its own samples A and B (that
corpus's parts, as for any analysis), into SHARED/window, whatever corpus the other lines read: one experiment is
one piece of evidence, not a row of every corpus. Its verdict replicates over A and B. A plan that does not measure
it (--quick, for time) cannot test the line, and C4 cannot come out consistent without it (`C4.required_once`);
a plan whose T is below 4W reports the comparison, deciding nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from posleak.experiments.evidence import Estimate, depth_slope
from posleak.experiments.paper.claims.c4.lab import SLOPE_UNIT
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.plan import SAMPLES, Plan, RoleName
from posleak.experiments.paper.reproduction import Reproduction
from posleak.experiments.paper.requests import LongerT, SampleNeed
from posleak.experiments.paper.verdict import Judgement, evidence_row, fact_row, judge, replicated
from posleak.pipeline import AnalysisResult

WINDOW = "window"  # the part's name among the claim's parts judged once (claims.json's `once`)
WINDOW_ROW = "(2) slope beyond the window"  # the start of the name of its deciding row
SPANS = 4  # the line decides only where T ≥ SPANS · W (docs/method.md §3)
WINDOW_ROLES: tuple[RoleName, ...] = ("sliding", "standard")  # the models it measures at its T


@dataclass(frozen=True)
class WindowComparison:
    """The sliding-window model and the standard one at the same T, each measured on the queries beyond the
    window, W ≤ i < T: the slopes of their resid_beyond against relative depth, the sliding model's fitted on its
    windowed layers alone (`windowed` of its `layers`)."""

    sliding: Estimate
    standard: Estimate
    seq_len: int
    window: int
    windowed: int
    layers: int
    corpus: str

    @classmethod
    def of(cls, sliding: AnalysisResult, standard: AnalysisResult) -> WindowComparison:
        per_layer = sliding.per_layer
        windowed = sorted(per_layer.loc[per_layer["window"] > 0, "layer"])
        return cls(
            depth_slope(sliding, "resid_beyond", windowed),
            depth_slope(standard, "resid_beyond"),
            int(sliding.manifest["data"]["seq_len"]),
            int(sliding.manifest["measurement"]["beyond"]),
            len(windowed),
            len(per_layer),
            str(sliding.manifest["data"]["source_name"]),
        )

    @property
    def wide(self) -> bool:
        """Whether T spans SPANS windows, so that the line can decide."""
        return self.seq_len >= SPANS * self.window

    @property
    def where(self) -> str:
        return f"i ≥ {self.window}, T = {self.seq_len}, {self.corpus}"


def window_needs(plan: Plan) -> list[SampleNeed]:
    """The line's draws where the plan measures it: both models at its T, on its corpus."""
    options = plan.option(C4Options)
    if options.window_seq_len is None:
        return []
    seq_len, num_seqs, fix = options.window_seq_len, options.window_num_seqs, "window_num_seqs or window_seq_len"
    return [
        SampleNeed(
            f"C4's window line ({role} model)", role, seq_len, num_seqs, "auto", SAMPLES, fix, options.window_corpus
        )
        for role in WINDOW_ROLES
    ]


def window_positions(plan: Plan) -> list[LongerT]:
    """The line's T, which each of its models must hold, where the plan measures it."""
    seq_len = plan.option(C4Options).window_seq_len
    if seq_len is None:
        return []
    fix = "lower window_seq_len in the plan file, or give the role another model"
    return [LongerT(role, "C4's window line's T", seq_len, fix) for role in WINDOW_ROLES]


def not_measured(plan: Plan) -> str:
    """Why a plan without `window_seq_len` cannot test the line."""
    return (
        f"not measured by the plan {plan.name!r}: it needs T ≥ {SPANS}W (docs/method.md §3), 2048 for gemma3-270m, "
        "on a corpus with documents that long (the full plan: bible-web)"
    )


def window_runs(repro: Reproduction) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
    """Per sample, the sliding model and then the standard one measured beyond the sliding model's window (`--beyond
    W`), at the plan's window_seq_len on its window_corpus, into SHARED/window/NAME-SAMPLE; none where the plan does
    not measure the line or the sliding model has no window shorter than that T. Both without next-token scores:
    they are compared by their magnitudes only."""
    plan = repro.plan
    options = plan.option(C4Options)
    if options.window_seq_len is None:
        return {}
    root = repro.shared / WINDOW
    sizes = {"seq_len": options.window_seq_len, "num_seqs": options.window_num_seqs, "corpus": options.window_corpus}
    sliding_role, standard_role = plan.roles["sliding"], plan.roles["standard"]
    config = repro.config("sliding", **sizes, scores=False)
    jobs = [repro.job(sliding_role.folder, sliding_role.model, config, s, root) for s in SAMPLES]
    sliding = dict(zip(SAMPLES, repro.run(jobs), strict=True))
    widths = {result.manifest["measurement"]["beyond"] for result in sliding.values()}
    if None in widths:
        return {}
    (width,) = widths
    config = repro.config("standard", **sizes, beyond=width, scores=False)
    jobs = [repro.job(f"{standard_role.folder}-beyond{width}", standard_role.model, config, s, root) for s in SAMPLES]
    standard = dict(zip(SAMPLES, repro.run(jobs), strict=True))
    return {s: (sliding[s], standard[s]) for s in SAMPLES}


def claim_window(comparisons: Mapping[str, WindowComparison], why_none: str) -> Judgement:
    """The line on each sample (`comparisons`; none: `why_none`, one row that decides nothing): sliding − standard
    slope above 0, deciding where T ≥ SPANS·W; both slopes reported. Its verdict replicates over the samples, each
    judged on its own rows (Holm's rule within them)."""
    if not comparisons:
        row_ = fact_row(f"{WINDOW_ROW}: {why_none}", 0, False, False, "a measured line", deciding=False)
        return judge([row_])
    judged = {sample: judge(window_rows(sample, c)) for sample, c in comparisons.items()}
    frame = pd.concat([j.evidence for j in judged.values()], ignore_index=True)
    verdict = replicated([j.verdict for j in judged.values()])
    return Judgement(verdict, frame, [r for j in judged.values() for r in j.judged])


def window_rows(sample: str, window: WindowComparison) -> list[dict[str, Any]]:
    """One sample's rows, each named `SAMPLE: ...`: the difference of the slopes (deciding where `window.wide`),
    then each slope."""
    below = "" if window.wide else f"; T below {SPANS}W: reported"
    name = f"{sample}: {WINDOW_ROW} ({window.where}{below}): sliding − standard"
    rows = [evidence_row(name, window.sliding.minus(window.standard), 0.0, "above", SLOPE_UNIT, deciding=window.wide)]
    sliding = f"sliding ({window.windowed} windowed layers of {window.layers})"
    for label, estimate in ((sliding, window.sliding), ("standard", window.standard)):
        rows.append(
            evidence_row(f"{sample}: slope beyond the window: {label}", estimate, 0.0, "above", SLOPE_UNIT, False)
        )
    return rows
