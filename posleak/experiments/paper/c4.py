"""C4: both components appear in every architecture, in a different balance (NTK suppresses the residual-stream
component, sliding windows let it accumulate with depth, standard RoPE sits between).

Four lines: NTK scaling at inference on the standard model, slopes between the pretrained models, and the
controlled lab line, an 8-layer lab decoder trained three ways (its slopes, and its NTK base's level). "Accumulates
with depth" is a statement about the queries beyond the window (docs/method.md §3): the window comparisons judge
the slope of resid_beyond, the windowed model and the model without a window at the same T, both measured on
W ≤ i < T.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from posleak.experiments.batch import AnalysisJob
from posleak.experiments.compare import summarise
from posleak.experiments.evidence import Estimate, depth_slope, percent_change, seed_mean
from posleak.experiments.paper.claim import (
    ACROSS_CORPORA,
    BY_DOCUMENT,
    HOLM_RULE,
    REPLICATED,
    ROWS_ESTIMAND,
    ClaimModule,
    quote,
    rounded,
)
from posleak.experiments.paper.plan import SHOWN
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Judgement, Revision, fact, judge, row
from posleak.lab.plan import run_trials
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial, trial_folder
from posleak.models.lab.config import LabSpec
from posleak.pipeline import AnalysisResult
from posleak.report import figures
from posleak.report.html import TableBlock
from posleak.store import RunFolder

MIN_NTK_LOWERING = 2.0  # %: the least lowering by inference-time NTK scaling that counts as suppression
LAB_VARIANTS = ("rope", "window", "ntk")

C4_CRITERION = (
    "Four lines of evidence, each judged on its interval; consistent only when all support the claim. (1) NTK "
    f"scaling at inference, at the largest factor, lowers the residual-stream magnitude (all queries, mean over "
    f"layers) by more than {MIN_NTK_LOWERING:g}%. (2) Between pretrained models, the slope of the residual-stream "
    "magnitude against relative depth orders sliding window > standard RoPE > NTK-scaled RoPE (both differences "
    "above 0): the window comparison on the queries beyond the window (W ≤ i < T, resid_beyond), the standard "
    "model at the sliding-window model's T; standard against NTK on all queries. (3) The controlled lab version: "
    "one decoder trained three ways on the same data and budget (full causal RoPE, sliding window, RoPE with an "
    "NTK-scaled base), ≥ 5 seeds, orders its slopes the same way, the window comparison again beyond the window "
    "(seed means with intervals over seeds, both differences above 0, and every seed pair ordered). (4) In the lab, "
    "the NTK-scaled base lowers "
    f"the residual-stream magnitude against the standard base by more than {MIN_NTK_LOWERING:g}%. Not consistent if "
    "any line contradicts the claim."
)


WINDOW_ROW = "(2) slope beyond the window"  # the start of the name of the pretrained models' window comparison
# Which magnitude each comparison of slopes is judged on: past the window, or over all queries
COMPARED = {("window", "rope"): "resid_beyond", ("rope", "ntk"): "resid_all"}


@dataclass(frozen=True)
class WindowComparison:
    """The sliding-window model and the standard one at the same T, each measured on the queries beyond the
    window, W ≤ i < T: the slopes of their resid_beyond against relative depth."""

    sliding: Estimate
    standard: Estimate
    seq_len: int
    window: int

    @classmethod
    def of(cls, sliding: AnalysisResult, standard: AnalysisResult) -> WindowComparison:
        return cls(
            depth_slope(sliding, "resid_beyond"),
            depth_slope(standard, "resid_beyond"),
            int(sliding.manifest["data"]["seq_len"]),
            int(sliding.manifest["measurement"]["beyond"]),
        )

    @property
    def where(self) -> str:
        return f"i ≥ {self.window}, T = {self.seq_len}"


@dataclass(frozen=True)
class LabRuns:
    """The controlled C4 experiment: per variant ("rope", "window", "ntk"), one analysis per seed, every variant
    measured beyond the window variant's window too."""

    runs: dict[str, list[AnalysisResult]]

    def slope(self, variant: str, measure: str = "resid_all") -> Estimate:
        return seed_mean([depth_slope(result, measure) for result in self.runs[variant]])

    def seeds_ordered(self, high: str, low: str, measure: str = "resid_all") -> bool:
        highs = [depth_slope(r, measure).value for r in self.runs[high]]
        lows = [depth_slope(r, measure).value for r in self.runs[low]]
        return min(highs) > max(lows)

    def level_change(self, variant: str, baseline: str) -> Estimate:
        """% change of the layer-mean resid_all, seed by seed (same seed, same evaluation rows: paired), averaged."""
        pairs = zip(self.runs[baseline], self.runs[variant], strict=True)
        return seed_mean([percent_change(base, new, "resid_all") for base, new in pairs])


def claim_c4(
    ntk_change: Estimate,
    slopes: Mapping[str, Estimate],
    window: WindowComparison | None,
    lab: LabRuns,
    reported: Mapping[str, Estimate] | None = None,
) -> Judgement:
    """`ntk_change`: % change of resid_all under the largest NTK factor; `slopes`: resid_all slope against relative
    depth of "standard" and "ntk" (paired); `window`: the sliding-window model against the standard one beyond the
    window at equal T (None: the sliding model has no queries beyond its window, so the row cannot be tested);
    `reported`: further slopes shown beside the evidence (a model trained with a large base), not judged."""
    rows = [row("(1) NTK at inference: change of resid_all", ntk_change, -MIN_NTK_LOWERING, "below", "%")]
    unit = "nats per depth"
    if window is None:
        rows.append(fact(f"{WINDOW_ROW}: queries of the sliding model past its window", 0, False, False, "> 0 to test"))
    else:
        difference = window.sliding.minus(window.standard)
        rows.append(row(f"{WINDOW_ROW} ({window.where}): sliding − standard", difference, 0.0, "above", unit))
        for name, estimate in (("sliding", window.sliding), ("standard", window.standard)):
            rows.append(row(f"slope beyond the window: {name}", estimate, 0.0, "above", unit, deciding=False))
    rows.append(row("(2) slope: standard − NTK", slopes["standard"].minus(slopes["ntk"]), 0.0, "above", unit))
    for name, estimate in {**slopes, **(reported or {})}.items():
        rows.append(row(f"slope: {name}", estimate, 0.0, "above", unit, deciding=False))
    for (high, low), measure in COMPARED.items():
        where = " beyond the window" if measure == "resid_beyond" else ""
        change = lab.slope(high, measure).minus(lab.slope(low, measure))
        difference = row(f"(3) lab slope{where}: {high} − {low}", change, 0.0, "above", unit)
        if difference["says"] == "supports" and not lab.seeds_ordered(high, low, measure):
            difference["says"] = "unclear"  # the seed means agree, single seeds do not
        rows.append(difference)
    for variant in LAB_VARIANTS:
        rows.append(row(f"lab slope: {variant} (seed mean)", lab.slope(variant), 0.0, "above", unit, deciding=False))
        beyond = lab.slope(variant, "resid_beyond")
        rows.append(
            row(f"lab slope beyond the window: {variant} (seed mean)", beyond, 0.0, "above", unit, deciding=False)
        )
    rows.append(
        row(
            "(4) lab: NTK base against standard, resid_all",
            lab.level_change("ntk", "rope"),
            -MIN_NTK_LOWERING,
            "below",
            "%",
        )
    )
    return judge(rows)


def lab_runs(repro: Reproduction) -> LabRuns:
    """C4's controlled line: an 8-layer lab decoder trained with full causal RoPE, a sliding window of T/4 and an
    NTK-scaled base (θ·K^(D/(D−2)), K the largest NTK factor), same data, steps and seeds; each analysed."""
    plan = repro.plan
    specs = {
        "rope": LabSpec(size="deep"),
        "window": LabSpec(size="deep", attention=f"window:{plan.lab_seq_len // 4}"),
        "ntk": LabSpec(size="deep", rope_scaling=f"ntk:{max(plan.ntk_factors):g}"),
    }
    # every variant measured beyond the window variant's window as well (docs/method.md §3)
    evaluation = EvalConfig(
        length_multiples=(1,),
        probe_seqs=8,
        analyze_seqs=plan.lab_analyze_seqs,
        bootstrap=plan.bootstrap,
        beyond=plan.lab_seq_len // 4,
    )
    steps = plan.lab_steps
    trials = [
        Trial(
            variant,
            spec,
            TrainConfig(
                steps=steps,
                seq_len=plan.lab_seq_len,
                seed=seed,
                device=plan.placement.device if plan.placement.device_map is None else "auto",
                # TrainConfig's schedule (50, 100, 200), shortened for fewer steps
                warmup_steps=min(50, max(1, steps // 4)),
                eval_every=min(100, max(1, steps // 3)),
                checkpoint_every=min(200, max(1, 2 * steps // 3)),
            ),
            evaluation,
        )
        for variant, spec in specs.items()
        for seed in plan.lab_seeds
    ]
    root = repro.lab
    # as `posleak lab` does: trials side by side, one torch thread each (the same weights as one after another)
    jobs = os.cpu_count() or 1
    run_trials(trials, root, backend=repro.backend, address=repro.address, progress=repro.progress, jobs=jobs)
    runs: dict[str, list[AnalysisResult]] = {variant: [] for variant in specs}
    for trial in trials:
        runs[trial.name].append(AnalysisResult.read(RunFolder(trial_folder(root, trial) / "analysis")))
    return LabRuns(runs)


def window_jobs(repro: Reproduction, runs: Mapping[str, SampleRuns]) -> dict[str, AnalysisJob]:
    """Per sample, the standard model at the sliding role's T and N, measured beyond the sliding model's window
    (`--beyond W`), into OUT/runs/STANDARD-beyondW-SAMPLE; none where the sliding model has no such queries."""
    seq_len, num_seqs = repro.plan.size("sliding")
    standard = repro.plan.roles["standard"]
    jobs = {}
    for sample, sample_runs in runs.items():
        window = sample_runs.sliding.manifest["measurement"]["beyond"]
        if window is not None:
            # compared with the sliding model's magnitudes only, not its next-token scores
            config = repro.config("standard", seq_len=seq_len, num_seqs=num_seqs, beyond=window, scores=False)
            jobs[sample] = repro.job(f"{standard.folder}-beyond{window}", standard.model, config, sample)
    return jobs


def _base(result: AnalysisResult) -> str:
    """The largest RoPE base of the model of `result` as the evidence writes it (1e6)."""
    theta = max(t for t in result.manifest["model"]["facts"]["rope_theta"] if t is not None)
    return f"{theta:.0e}".replace("e+0", "e").replace("e+", "e")


def _variants(runs: SampleRuns) -> dict[str, AnalysisResult]:
    """The pretrained models and the standard one under each NTK factor, by label."""
    return {**runs.baselines(), **runs.ntk_variants()}


class C4(ClaimModule):
    name = "C4"
    statement = (
        "Both components appear in every architecture, in a different balance: NTK suppresses the "
        "residual-stream component, sliding windows let it accumulate with depth, standard RoPE sits between."
    )
    roles = ("standard", "large-base", "sliding")
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
            "standard RoPE; issue 11)",
        ),
        ROWS_ESTIMAND,
        HOLM_RULE,
        Revision(
            "2026-12-04",
            "the lab lines' intervals over seeds (five, before two), the seeds resampled alike for every variant: "
            "the interval had left out the spread between seeds, so one unreplicated row decided the full run's "
            "verdict (issue 34)",
        ),
        Revision(
            "2026-12-04",
            "the window comparison judged on the queries beyond the window (resid_beyond, W ≤ i < T), both models "
            "at the sliding model's T, in the pretrained and the lab lines (before: resid_all, each model at its "
            "own T): a window hides key 0 only from those queries (issue 34)",
        ),
        BY_DOCUMENT,
        ACROSS_CORPORA,
    )
    method = (
        "Slopes of the residual-stream magnitude against relative depth with bootstrap intervals, between the "
        "pretrained models and in a lab decoder trained three ways, windows compared on the queries beyond the "
        "window at equal T (docs/method.md §3, §6, §13)."
    )

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        jobs = window_jobs(self.repro, runs)
        self.at_window = dict(zip(jobs, self.repro.run(list(jobs.values())), strict=True))
        self.lab = lab_runs(self.repro)

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        slopes = {
            "standard": depth_slope(runs.standard, "resid_all"),
            "ntk": depth_slope(runs.largest_ntk, "resid_all"),
        }
        large = runs.large_base
        reported = {
            f"{runs.roles['sliding'].name} (all queries)": depth_slope(runs.sliding, "resid_all"),
            f"trained base {_base(large)} ({runs.roles['large-base'].name})": depth_slope(large, "resid_all"),
        }
        ntk_change = percent_change(runs.standard, runs.largest_ntk, "resid_all")
        standard = self.at_window.get(sample)
        window = None if standard is None else WindowComparison.of(runs.sliding, standard)
        return claim_c4(ntk_change, slopes, window, self.lab, reported)

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        """The architecture comparison (posleak.experiments.compare), of the shown sample only."""
        if sample != SHOWN:
            return []
        summary = pd.DataFrame([summarise(label, r.per_layer) for label, r in _variants(runs).items()])
        self.repro.out.write_table("comparison", summary)
        return [TableBlock(f"Architecture comparison (sample {SHOWN})", rounded(summary), source="comparison.parquet")]

    def interventions(self, runs: SampleRuns, sample: str) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
        return {f"ntk:{k:g}": (runs.standard, run) for k, run in runs.ntk.items()}

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        return (
            "The paper reports NTK suppressing the residual-stream component and sliding windows accumulating it; "
            f"here NTK scaling changes it by {quote(judgement, '(1) NTK at inference: change of resid_all')}, and "
            f"beyond the window, the slope of the sliding-window model minus the standard one is "
            f"{quote(judgement, next(n for n in judgement.evidence['evidence'] if n.startswith(WINDOW_ROW)))}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        out = self.repro.out
        variants = {label: result.per_layer for label, result in _variants(runs).items()}
        lab = {
            f"lab {variant} seed {k}": r.per_layer for variant, rs in self.lab.runs.items() for k, r in enumerate(rs)
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
                title="Lab decoder trained three ways: resid_all by depth",
                ylabel="resid_all (nats)",
                relative_depth=True,
            ),
        ]
        standard = self.at_window.get(SHOWN)
        if standard is not None:
            window = WindowComparison.of(runs.sliding, standard)
            roles = runs.roles
            drawn.append(
                figures.lines_by_run(
                    {roles["sliding"].label: runs.sliding.per_layer, roles["standard"].name: standard.per_layer},
                    "resid_beyond",
                    out.figure_path("c4_resid_beyond"),
                    title=f"Beyond the window ({window.where}), sample {SHOWN}",
                    ylabel="resid_beyond (nats)",
                    relative_depth=True,
                )
            )
        return drawn
