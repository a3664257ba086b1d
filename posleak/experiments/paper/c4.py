"""C4: both components appear in every architecture, in a different balance (NTK suppresses the residual-stream
component, sliding windows let it accumulate with depth, standard RoPE sits between).

Four lines: NTK scaling at inference on the standard model and slopes between the pretrained models, judged on
each sample; and the controlled lab line, an 8-layer lab decoder trained with full causal RoPE and a sliding window
(its slopes) and the RoPE-trained one under NTK scaling at inference (its slope and level), judged once over its
seeds (`Claim.once`): the lab trains on its own data, so a sample of the corpus adds nothing to it. A decoder trained
with a large RoPE base from the start is reported beside them, named so: it is not NTK scaling. A lab line decides
only where the mechanism under test exists in its models (`Testability`). "Accumulates with depth" is a statement
about the queries beyond the window (docs/method.md §3): the window comparisons judge the slope of resid_beyond, the
windowed model and the model without a window at the same T, both measured on W ≤ i < T.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.experiments.batch import AnalysisJob
from posleak.experiments.compare import summarise
from posleak.experiments.evidence import Estimate, depth_slope, layer_mean, percent_change, seed_mean
from posleak.experiments.paper.c1 import MIN_MAGNITUDE
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
# The lab's models: trained with full causal RoPE, a sliding window of T/4 and a large RoPE base (θ·K^(D/(D−2)) from
# the start of training: not NTK scaling), and the RoPE-trained model under NTK scaling ×K at inference ("ntk").
TRAINED = ("rope", "window", "large-base")
LAB_VARIANTS = (*TRAINED, "ntk")
SLOPE_UNIT = "nats per depth"
TO_TEST = f"sink head and resid_all > {MIN_MAGNITUDE} to test"
LAB = "lab"  # the name of the claim's part judged once (Claim.once), not per sample
# Each lab line of evidence, the trained models it reads (the "ntk" model is the rope one's weights), and whether it
# decides: the large-base model is not NTK scaling, so its line is reported beside the others, as the pretrained
# large-base model is.
LAB_LINES: dict[str, tuple[tuple[str, ...], bool]] = {
    "window": (("window", "rope"), True),
    "NTK at inference": (("rope",), True),
    "large base": (("large-base", "rope"), False),
}

C4_CRITERION = (
    "Four lines of evidence, each judged on its interval; consistent only when all that can test support the claim. "
    f"(1) NTK scaling at inference, at the largest factor, lowers the residual-stream magnitude (all queries, mean "
    f"over layers) by more than {MIN_NTK_LOWERING:g}%. (2) Between pretrained models, the slope of the "
    "residual-stream magnitude against relative depth orders sliding window > standard RoPE > NTK-scaled RoPE (both "
    "differences above 0): the window comparison on the queries beyond the window (W ≤ i < T, resid_beyond), the "
    "standard model at the sliding-window model's T; standard against NTK on all queries. Lines (1) and (2) are "
    "judged on each sample. The lab is judged once, on its own replication (≥ 5 seeds), not per sample: one "
    "decoder trained on the same data and budget with full causal RoPE and with a sliding window, and the RoPE-"
    "trained one under NTK scaling at inference (the same largest factor). (3) Its slopes order the same way, the "
    "window comparison again beyond the window (seed means with intervals over seeds, both differences above 0, "
    "and every seed pair ordered). (4) NTK scaling at inference lowers the lab model's residual-stream magnitude by "
    f"more than {MIN_NTK_LOWERING:g}%. A lab line tests the claim only where the mechanism under test exists in its "
    f"trained models: every seed's model has a sink head (α₀ > {SINK_THRESHOLD}) and the seed mean of their "
    f"noise-corrected resid_all (mean over layers) has its interval above C1's presence threshold, "
    f"{MIN_MAGNITUDE} nats; a line that does not is reported as untestable and leaves the verdict. The decoder "
    "trained with a large RoPE base is reported beside them, deciding nothing (it is not NTK scaling). The "
    "samples' verdict (replicated over A and B) and the lab's, where it can test, join: consistent only where "
    "every one is, not consistent where any is not consistent, inconclusive otherwise."
)


WINDOW_ROW = "(2) slope beyond the window"  # the start of the name of the pretrained models' window comparison
# Which magnitude each comparison of slopes is judged on: past the window, or over all queries
COMPARED = {("window", "rope"): "resid_beyond", ("rope", "ntk"): "resid_all"}
# The lab line each comparison of slopes belongs to
COMPARED_LINE = {("window", "rope"): "window", ("rope", "ntk"): "NTK at inference"}
LABEL = {"rope": "rope", "window": "window", "large-base": "large base", "ntk": "NTK at inference"}


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
class Testability:
    """Whether the mechanism under test exists in one lab variant's trained models: each seed's largest α₀ (sink
    score) and the seed mean of the layer-mean noise-corrected resid_all."""

    variant: str
    sinks: tuple[float, ...]  # per seed, the largest α₀ of the model's heads
    resid: Estimate

    @property
    def problems(self) -> list[str]:
        """Why the variant cannot test the claim; none where it can."""
        problems = []
        if min(self.sinks) <= SINK_THRESHOLD:
            weakest = min(self.sinks)
            problems.append(f"largest α₀ {weakest:.2f} in its weakest seed, no sink head (α₀ > {SINK_THRESHOLD})")
        lo, hi = self.resid.interval
        if lo <= MIN_MAGNITUDE:
            problems.append(f"resid_all {lo:.3f} to {hi:.3f} nats, not above {MIN_MAGNITUDE} nats")
        return problems

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.resid.interval
        return {
            "variant": self.variant,
            "largest_alpha0_by_seed": list(self.sinks),
            "resid_all": self.resid.value,
            "resid_all_lo": lo,
            "resid_all_hi": hi,
            "testable": not self.problems,
        }


@dataclass(frozen=True)
class LabRuns:
    """The controlled C4 experiment: per variant (LAB_VARIANTS), one analysis per seed, every variant measured
    beyond the window variant's window too."""

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

    def testability(self, variant: str) -> Testability:
        runs = self.runs[variant]
        sinks = tuple(float(run.per_head["sink_score"].max()) for run in runs)
        return Testability(variant, sinks, seed_mean([layer_mean(run, "resid_all") for run in runs]))

    def untestable(self) -> dict[str, list[str]]:
        """Per deciding lab line that cannot test the claim, why (each of its trained models' problems)."""
        found = {}
        for line, (variants, deciding) in LAB_LINES.items():
            why = [f"{LABEL[v]}: {p}" for v in variants for p in self.testability(v).problems]
            if deciding and why:
                found[line] = why
        return found


def claim_c4(
    ntk_change: Estimate,
    slopes: Mapping[str, Estimate],
    window: WindowComparison | None,
    reported: Mapping[str, Estimate] | None = None,
) -> Judgement:
    """Lines (1) and (2) on one sample. `ntk_change`: % change of resid_all under the largest NTK factor; `slopes`:
    resid_all slope against relative depth of "standard" and "ntk" (paired); `window`: the sliding-window model
    against the standard one beyond the window at equal T (None: the sliding model has no queries beyond its
    window, so the row cannot be tested); `reported`: further slopes shown beside the evidence (a model trained with
    a large base), not judged."""
    rows = [row("(1) NTK at inference: change of resid_all", ntk_change, -MIN_NTK_LOWERING, "below", "%")]
    if window is None:
        rows.append(fact(f"{WINDOW_ROW}: queries of the sliding model past its window", 0, False, False, "> 0 to test"))
    else:
        difference = window.sliding.minus(window.standard)
        rows.append(row(f"{WINDOW_ROW} ({window.where}): sliding − standard", difference, 0.0, "above", SLOPE_UNIT))
        for name, estimate in (("sliding", window.sliding), ("standard", window.standard)):
            rows.append(row(f"slope beyond the window: {name}", estimate, 0.0, "above", SLOPE_UNIT, deciding=False))
    rows.append(row("(2) slope: standard − NTK", slopes["standard"].minus(slopes["ntk"]), 0.0, "above", SLOPE_UNIT))
    for name, estimate in {**slopes, **(reported or {})}.items():
        rows.append(row(f"slope: {name}", estimate, 0.0, "above", SLOPE_UNIT, deciding=False))
    return judge(rows)


def claim_c4_lab(lab: LabRuns) -> Judgement:
    """Lines (3) and (4), judged once on the lab's seeds: first each trained variant's testability, then each
    line's rows, deciding only where the line can test the claim (`LabRuns.untestable`); the large-base line and
    the seed means of every variant's slopes are reported."""
    untestable = lab.untestable()
    rows = [*_testability_rows(lab)]
    for line, why in untestable.items():
        rows.append(_reported(fact(f"lab {line} line: untestable ({'; '.join(why)})", 0, False, False, TO_TEST)))
    for (high, low), measure in COMPARED.items():
        where = " beyond the window" if measure == "resid_beyond" else ""
        change = lab.slope(high, measure).minus(lab.slope(low, measure))
        deciding = COMPARED_LINE[(high, low)] not in untestable
        name = f"(3) lab slope{where}: {LABEL[high]} − {LABEL[low]}"
        difference = row(name, change, 0.0, "above", SLOPE_UNIT, deciding=deciding)
        if difference["says"] == "supports" and not lab.seeds_ordered(high, low, measure):
            difference["says"] = "unclear"  # the seed means agree, single seeds do not
        rows.append(difference)
    ntk = lab.level_change("ntk", "rope")
    deciding = "NTK at inference" not in untestable
    name = "(4) lab: NTK at inference against none, resid_all"
    rows.append(row(name, ntk, -MIN_NTK_LOWERING, "below", "%", deciding))
    large = lab.slope("rope").minus(lab.slope("large-base"))
    rows.append(row("lab slope: rope − large base (trained)", large, 0.0, "above", SLOPE_UNIT, deciding=False))
    level = lab.level_change("large-base", "rope")
    rows.append(row("lab: large base (trained) against rope, resid_all", level, -MIN_NTK_LOWERING, "below", "%", False))
    for variant in LAB_VARIANTS:
        name = f"lab slope: {LABEL[variant]} (seed mean)"
        rows.append(row(name, lab.slope(variant), 0.0, "above", SLOPE_UNIT, deciding=False))
        beyond = lab.slope(variant, "resid_beyond")
        name = f"lab slope beyond the window: {LABEL[variant]} (seed mean)"
        rows.append(row(name, beyond, 0.0, "above", SLOPE_UNIT, deciding=False))
    return judge(rows)


def _testability_rows(lab: LabRuns) -> list[dict[str, Any]]:
    """Per trained variant, reported: its weakest seed's largest α₀ against the sink threshold, and the seed mean
    of its resid_all against C1's presence threshold."""
    rows = []
    for variant in TRAINED:
        tested = lab.testability(variant)
        weakest = min(tested.sinks)
        has = weakest > SINK_THRESHOLD
        name = f"lab {LABEL[variant]}: largest α₀, weakest seed"
        rows.append(_reported(fact(name, weakest, has, not has, f"> {SINK_THRESHOLD}")))
        name = f"lab {LABEL[variant]}: resid_all (mean over layers, seed mean)"
        rows.append(row(name, tested.resid, MIN_MAGNITUDE, "above", "nats", deciding=False))
    return rows


def _reported(evidence: dict[str, Any]) -> dict[str, Any]:
    """A row that reports and decides nothing (an exact one: `fact` writes deciding rows)."""
    return {**evidence, "deciding": False}


def lab_runs(repro: Reproduction) -> LabRuns:
    """C4's controlled line: an 8-layer lab decoder trained with full causal RoPE, a sliding window of T/4 and a
    large base (θ·K^(D/(D−2)) from the start, K the largest NTK factor), same data, steps and seeds; each analysed,
    and the RoPE-trained one analysed again under NTK scaling ×K at inference (the same weights: no training)."""
    plan = repro.plan
    factor = max(plan.ntk_factors)
    rope = LabSpec(size="deep")
    specs = {
        "rope": rope,
        "window": LabSpec(size="deep", attention=f"window:{plan.lab_seq_len // 4}"),
        "large-base": LabSpec(size="deep", rope_scaling=f"ntk:{factor:g}"),
        "ntk": rope,
    }
    # the lab model's NTK scaling at inference: the formula of the rope_scaling intervention (θ·K^(D/(D−2)))
    overrides = {"ntk": (("rope_scale_kind", "ntk"), ("rope_factor", factor))}
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
            overrides.get(variant, ()),
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
        Revision(
            "2026-12-05",
            "the lab judged once over its seeds, not as a row of every sample; its NTK line is the RoPE-trained "
            "models under NTK scaling at inference, the decoder trained with a large base reported as 'large "
            "base'; a lab line tests only where every seed's model has a sink head (α₀ > 0.3) and the seed mean "
            "of resid_all lies above C1's 0.05 nats, otherwise it is untestable and leaves the verdict; the "
            "claim's verdict joins the samples' and the lab's where it can test (issue 44)",
        ),
    )
    method = (
        "Slopes of the residual-stream magnitude against relative depth with bootstrap intervals, between the "
        "pretrained models on each sample and, judged once over its seeds, in a lab decoder trained with full "
        "causal RoPE, a sliding window and a large base, the RoPE one also under NTK scaling at inference; windows "
        "compared on the queries beyond the window at equal T (docs/method.md §3, §6, §13)."
    )

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        jobs = window_jobs(self.repro, runs)
        self.at_window = dict(zip(jobs, self.repro.run(list(jobs.values())), strict=True))
        self.lab = lab_runs(self.repro)
        self.lab_judgement = claim_c4_lab(self.lab)

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
        return claim_c4(ntk_change, slopes, window, reported)

    def once(self) -> dict[str, Judgement]:
        return {LAB: self.lab_judgement}

    def numbers(self, sample: str) -> dict[str, Any]:
        """For the lab (judged once): its seeds, each trained variant's testability, the lines that cannot test."""
        if sample != LAB:
            return {}
        return {
            "seeds": len(self.lab.runs["rope"]),
            "testability": [self.lab.testability(variant).to_json() for variant in TRAINED],
            "untestable": self.lab.untestable(),
        }

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
