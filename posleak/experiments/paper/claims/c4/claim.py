"""C4: both components appear in every architecture, in a different balance (NTK suppresses the residual-stream
component, sliding windows let it accumulate with depth, standard RoPE sits between).

Four lines: NTK scaling at inference on the standard model and the slopes of the standard model and the NTK-scaled
one, judged on each sample; the window line, the sliding-window model against the standard one beyond the window at
T ≥ 4W, judged once on its own corpus (posleak.experiments.paper.claims.c4.window), which the claim needs
(`required_once`); and the controlled lab line, an 8-layer lab decoder trained with full causal RoPE and a sliding
window (its slopes) and the RoPE-trained one under NTK scaling at inference (its slope and level), judged once over
its seeds (`Claim.once`): the lab trains on its own data, so a sample of the corpus adds nothing to it. A decoder
trained with a large RoPE base from the start is reported beside them, named so: it is not NTK scaling. A lab line
decides only where the mechanism under test exists in its models (`Testability`). "Accumulates with depth" is a
statement about the queries beyond the window (docs/method.md §3): the window comparisons judge the slope of
resid_beyond, the windowed model and the model without a window at the same T, both measured on W ≤ i < T.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.experiments.compare import summarise
from posleak.experiments.evidence import Estimate, depth_slope, percent_change
from posleak.experiments.paper.claim import (
    ACROSS_CORPORA,
    BY_DOCUMENT,
    HOLM_RULE,
    REPLICATED,
    ROWS_ESTIMAND,
    ClaimModule,
    evidence_text,
    rounded,
)
from posleak.experiments.paper.claims.c1.claim import baselines
from posleak.experiments.paper.claims.c4.lab import (
    LAB,
    LABEL,
    MIN_NTK_LOWERING,
    SLOPE_UNIT,
    claim_c4_lab,
    lab_runs,
    lab_trials,
)
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.claims.c4.window import (
    SPANS,
    WINDOW,
    WINDOW_ROLES,
    WINDOW_ROW,
    WindowComparison,
    claim_window,
    not_measured,
    window_needs,
    window_positions,
    window_runs,
)
from posleak.experiments.paper.plan import SAMPLES, SHOWN, Plan, RoleName
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.experiments.paper.requests import LongerT, Request, SampleNeed
from posleak.experiments.paper.thresholds import MIN_MAGNITUDE
from posleak.experiments.paper.verdict import Judgement, Revision, evidence_row, judge
from posleak.interventions import Interventions, RopeScaling
from posleak.pipeline import AnalysisResult
from posleak.report import figures
from posleak.report.html import TableBlock

C4_CRITERION = (
    "Four lines of evidence, each judged on its interval; consistent only when all that can test support the claim. "
    f"(1) NTK scaling at inference, at the largest factor, lowers the residual-stream magnitude (all queries, mean "
    f"over layers) by more than {MIN_NTK_LOWERING:g}%. (2) Between pretrained models, the slope of the "
    "residual-stream magnitude against relative depth orders sliding window > standard RoPE > NTK-scaled RoPE (both "
    "differences above 0): the window comparison on the queries beyond the window (W ≤ i < T, resid_beyond), both "
    f"models at a T of at least {SPANS} windows (T ≥ {SPANS}W; below it reported, deciding nothing) on a corpus "
    "whose documents reach it, the sliding model's slope fitted on its windowed layers alone (each at its depth in "
    "the stack), judged once on its own samples A and B (replicated), which the claim needs: without it (a plan "
    "that does not measure it) C4 is at best inconclusive; standard against NTK on all queries, judged on each "
    "sample with line (1). The lab is judged once, on its own replication (≥ 5 seeds), not per sample: one "
    "decoder trained on the same data and budget with full causal RoPE and with a sliding window, and the RoPE-"
    "trained one under NTK scaling at inference (the same largest factor). (3) Its slopes order the same way, the "
    "window comparison again beyond the window (seed means with intervals over seeds, both differences above 0, "
    "and every seed pair ordered). (4) NTK scaling at inference lowers the lab model's residual-stream magnitude by "
    f"more than {MIN_NTK_LOWERING:g}%. A lab line tests the claim only where the mechanism under test exists in its "
    f"trained models: every seed's model has a sink head (α₀ > {SINK_THRESHOLD}) and the seed mean of their "
    f"noise-corrected resid_all (mean over layers) has its interval above C1's presence threshold, "
    f"{MIN_MAGNITUDE} nats; a line that does not is reported as untestable and leaves the verdict. The decoder "
    "trained with a large RoPE base is reported beside them, deciding nothing (it is not NTK scaling). The "
    "samples' verdict (replicated over A and B), the window line's and the lab's, where it can test, join: "
    "consistent only where every one is (the window line tested), not consistent where any is not consistent, "
    "inconclusive otherwise."
)


def claim_c4(
    ntk_change: Estimate, slopes: Mapping[str, Estimate], reported: Mapping[str, Estimate] | None = None
) -> Judgement:
    """Line (1) and line (2)'s standard − NTK on one sample (the window line is judged once:
    posleak.experiments.paper.claims.c4.window). `ntk_change`: % change of resid_all under the largest NTK factor;
    `slopes`: resid_all slope against relative depth of "standard" and "ntk" (paired); `reported`: further slopes
    shown beside the evidence (the sliding model on all queries, a model trained with a large base), not judged."""
    rows = [evidence_row("(1) NTK at inference: change of resid_all", ntk_change, -MIN_NTK_LOWERING, "below", "%")]
    rows.append(
        evidence_row("(2) slope: standard − NTK", slopes["standard"].minus(slopes["ntk"]), 0.0, "above", SLOPE_UNIT)
    )
    for name, estimate in {**slopes, **(reported or {})}.items():
        rows.append(evidence_row(f"slope: {name}", estimate, 0.0, "above", SLOPE_UNIT, deciding=False))
    return judge(rows)


def _base(result: AnalysisResult) -> str:
    """The largest RoPE base of the model of `result` as the evidence writes it (1e6)."""
    theta = max(t for t in result.manifest["model"]["facts"]["rope_theta"] if t is not None)
    return f"{theta:.0e}".replace("e+0", "e").replace("e+", "e")


def ntk_key(factor: float) -> str:
    """The key of the standard model's run under NTK factor `factor` (the manifest's runs, with the sample)."""
    return f"ntk{factor:g}"


def ntk_runs(runs: SampleRuns, factors: tuple[float, ...]) -> dict[float, AnalysisResult]:
    """The standard model under each NTK factor, by factor."""
    return {k: runs[ntk_key(k)] for k in factors}


class C4(ClaimModule):
    name = "C4"
    statement = (
        "Both components appear in every architecture, in a different balance: NTK suppresses the "
        "residual-stream component, sliding windows let it accumulate with depth, standard RoPE sits between."
    )
    roles = ("standard", "large-base", "sliding")
    required_once = (WINDOW,)  # the line of the sliding window the claim names (window.py)
    criterion = C4_CRITERION
    revisions = (
        REPLICATED,
        Revision(
            "2026-12-01",
            "four lines, each judged on its interval and all needed: NTK scaling at inference lowers the "
            "residual-stream magnitude by more than 2%; between pretrained models the depth slopes order sliding "
            "window > standard > NTK; a lab decoder trained three ways orders them alike; the lab's NTK base "
            "lowers it by more than 2% (before: NTK lowering it at all, and the sliding model's magnitude growing "
            "with depth, which every model's rise from layer 0 met and which never compared the window with "
            "standard RoPE)",
        ),
        ROWS_ESTIMAND,
        HOLM_RULE,
        Revision(
            "2026-12-04",
            "the lab lines' intervals over seeds (five, before two), the seeds resampled alike for every variant: "
            "the interval had left out the spread between seeds, so one unreplicated row decided the full run's "
            "verdict",
        ),
        Revision(
            "2026-12-04",
            "the window comparison judged on the queries beyond the window (resid_beyond, W ≤ i < T), both models "
            "at the sliding model's T, in the pretrained and the lab lines (before: resid_all, each model at its "
            "own T): a window hides key 0 only from those queries",
        ),
        BY_DOCUMENT,
        ACROSS_CORPORA,
        Revision(
            "2026-12-05",
            "the lab judged once over its seeds, not as a row of every sample; its NTK line is the RoPE-trained "
            "models under NTK scaling at inference, the decoder trained with a large base reported as 'large "
            "base'; a lab line tests only where every seed's model has a sink head (α₀ > 0.3) and the seed mean "
            "of resid_all lies above C1's 0.05 nats, otherwise it is untestable and leaves the verdict; the "
            "claim's verdict joins the samples' and the lab's where it can test",
        ),
        Revision(
            "2026-12-06",
            "the sliding model's slope beyond the window fitted on its windowed layers alone, each at its depth in "
            "the stack (before: every layer, one straight line through gemma3-270m's five local layers to one "
            "global, which mixes the two kinds)",
        ),
        Revision(
            "2026-12-06",
            "the window line measured at T ≥ 4W (2048 for gemma3-270m) on a corpus whose documents reach it (the "
            "full plan: bible-web, 20 documents per sample), judged once, and needed for a consistent verdict; "
            "below 4W reported, deciding nothing (before: judged on each sample at the sliding role's T, 640 or "
            "768, where a query beyond the window is at most 256 positions past it and the reach of hidden states "
            "spans the stack within two layers; --quick does not measure it, for time)",
        ),
    )
    method = (
        "Slopes of the residual-stream magnitude against relative depth with bootstrap intervals, between the "
        "pretrained models on each sample and, judged once over its seeds, in a lab decoder trained with full "
        "causal RoPE, a sliding window and a large base, the RoPE one also under NTK scaling at inference; windows "
        "compared on the queries beyond the window at equal T (docs/method.md §3, §6, §13)."
    )

    @classmethod
    def requests(cls, plan: Plan, sample: str) -> list[Request]:
        """The standard model under each NTK factor."""
        folder = plan.roles["standard"].folder
        return [
            Request(ntk_key(k), "standard", f"{folder}-ntk{k:g}", Interventions(RopeScaling(f"ntk:{k:g}")))
            for k in plan.option(C4Options).ntk_factors
        ]

    @classmethod
    def sample_needs(cls, plan: Plan) -> list[SampleNeed]:
        return window_needs(plan)

    @classmethod
    def positions_needed(cls, plan: Plan) -> list[LongerT]:
        return window_positions(plan)

    @classmethod
    def own_analyses(cls, plan: Plan) -> int:
        """The window line's two models on each sample, where the plan measures it (`window_runs`)."""
        return 0 if plan.option(C4Options).window_seq_len is None else len(SAMPLES) * len(WINDOW_ROLES)

    @classmethod
    def lab_models(cls, plan: Plan) -> int:
        """The lab models of the controlled line (`lab_trials`; the NTK trials reuse the RoPE ones' weights)."""
        return len({trial.train_key for trial in lab_trials(plan)})

    def compared_roles(self) -> frozenset[RoleName]:
        return frozenset({"standard"})  # the NTK-scaled runs against the standard model

    def _ntk(self, runs: SampleRuns) -> dict[float, AnalysisResult]:
        return ntk_runs(runs, self.repro.plan.option(C4Options).ntk_factors)

    def _variants(self, runs: SampleRuns) -> dict[str, AnalysisResult]:
        """The pretrained models and the standard one under each NTK factor (labelled `MODEL ntk:K`), by label."""
        standard = runs.roles["standard"].label
        return {**baselines(runs), **{f"{standard} ntk:{k:g}": run for k, run in self._ntk(runs).items()}}

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        self.at_window = window_runs(self.repro)
        self.window = {s: WindowComparison.of(*pair) for s, pair in self.at_window.items()}
        self.window_judgement = claim_window(self.window, not_measured(self.repro.plan))
        self.lab = lab_runs(self.repro)
        self.lab_judgement = claim_c4_lab(self.lab)

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        ntk = self._ntk(runs)
        standard, largest_ntk = runs.baseline("standard"), ntk[max(ntk)]
        slopes = {"standard": depth_slope(standard, "resid_all"), "ntk": depth_slope(largest_ntk, "resid_all")}
        large = runs.baseline("large-base")
        reported = {
            f"{runs.roles['sliding'].name} (all queries)": depth_slope(runs.baseline("sliding"), "resid_all"),
            f"trained base {_base(large)} ({runs.roles['large-base'].name})": depth_slope(large, "resid_all"),
        }
        ntk_change = percent_change(standard, largest_ntk, "resid_all")
        return claim_c4(ntk_change, slopes, reported)

    def once(self) -> dict[str, Judgement]:
        return {WINDOW: self.window_judgement, LAB: self.lab_judgement}

    def numbers(self, sample: str) -> dict[str, Any]:
        """For the window line (judged once): its corpus, T, W and runs per sample; for the lab: its seeds, each
        trained variant's testability, the lines that cannot test."""
        if sample == WINDOW:
            return {
                s: {
                    "corpus": w.corpus,
                    "seq_len": w.seq_len,
                    "window": w.window,
                    "runs": [f"{WINDOW}/{r.run.path.name}" for r in self.at_window[s] if r.run],
                }
                for s, w in self.window.items()
            }
        if sample != LAB:
            return {}
        return {
            "seeds": len(self.lab.runs["rope"]),
            "testability": [self.lab.testability(variant).to_json() for variant in self.lab.trained()],
            "untestable": self.lab.untestable(),
        }

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        """The architecture comparison (posleak.experiments.compare), of the shown sample only."""
        if sample != SHOWN:
            return []
        variants = self._variants(runs)
        summary = pd.DataFrame([summarise(label, r.per_layer) for label, r in variants.items()])
        self.repro.out.write_table("comparison", summary)
        return [TableBlock(f"Architecture comparison (sample {SHOWN})", rounded(summary), source="comparison.parquet")]

    def interventions(self, runs: SampleRuns, sample: str) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
        return {f"ntk:{k:g}": (runs.baseline("standard"), run) for k, run in self._ntk(runs).items()}

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        ntk = evidence_text(judgement, "(1) NTK at inference: change of resid_all")
        return (
            "The paper reports NTK suppressing the residual-stream component and sliding windows accumulating it; "
            f"here NTK scaling changes it by {ntk}, and "
            f"beyond the window, the slope of the sliding-window model minus the standard one is "
            f"{self._window_quote()}."
        )

    def _window_quote(self) -> str:
        """The window line's difference of slopes on each sample (`SAMPLE: value (interval)`), or why it was not
        measured."""
        judgement = self.window_judgement
        names = judgement.evidence["evidence"]
        if not self.window:
            return names.iloc[0].removeprefix(f"{WINDOW_ROW}: ")
        return "; ".join(
            f"{name.split(': ')[0]}: {evidence_text(judgement, name)}" for name in names if WINDOW_ROW in name
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        out = self.repro.out
        variants = {label: result.per_layer for label, result in self._variants(runs).items()}
        lab = {
            f"lab {LABEL[variant]} seed {k}": r.per_layer
            for variant, rs in self.lab.runs.items()
            for k, r in enumerate(rs)
        }
        drawn = [
            figures.lines_by_run(
                variants,
                "resid_all",
                out.figure_path("c4_resid_all"),
                title=f"Residual-stream magnitude by relative depth (sample {SHOWN})",
                ylabel="resid_all (nats)",
                relative_depth=True,
            ),
            figures.lines_by_run(
                lab,
                "resid_all",
                out.figure_path("c4_lab"),
                title="Lab decoder: rope, window, large base, rope under NTK at inference: resid_all by depth",
                ylabel="resid_all (nats)",
                relative_depth=True,
            ),
        ]
        if SHOWN in self.at_window:
            sliding, standard = self.at_window[SHOWN]
            window = self.window[SHOWN]
            roles = runs.roles
            drawn.append(
                figures.lines_by_run(
                    {roles["sliding"].name: sliding.per_layer, roles["standard"].name: standard.per_layer},
                    "resid_beyond",
                    out.figure_path("c4_resid_beyond"),
                    title=f"Beyond the window ({window.where}), sample {SHOWN}",
                    ylabel="resid_beyond (nats)",
                    relative_depth=True,
                )
            )
        return drawn
