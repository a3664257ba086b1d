"""C4's controlled line, judged once over its seeds (`Claim.once`): an 8-layer lab decoder trained with full causal
RoPE and with a sliding window, the RoPE-trained one under NTK scaling at inference, and one trained with a large
RoPE base (reported: it is not NTK scaling); which of its lines can test the claim (`Testability`: the mechanism
under test must exist in the trained models), and their evidence rows (docs/method.md §13).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.experiments.evidence import Estimate, depth_slope, layer_mean, percent_change, seed_mean
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.plan import Plan
from posleak.experiments.paper.reproduction import Reproduction
from posleak.experiments.paper.thresholds import MIN_MAGNITUDE
from posleak.experiments.paper.verdict import Judgement, evidence_row, fact_row, judge
from posleak.lab.plan import run_trials
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial, trial_folder
from posleak.models.lab.config import LabSpec
from posleak.pipeline import AnalysisResult
from posleak.store import RunFolder

MIN_NTK_LOWERING = 2.0  # %: the least lowering by inference-time NTK scaling that counts as suppression
SLOPE_UNIT = "nats per depth"
# The lab's models: trained with full causal RoPE, a sliding window of T/4 and a large RoPE base (θ·K^(D/(D−2)) from
# the start of training: not NTK scaling), and the RoPE-trained model under NTK scaling ×K at inference ("ntk").
TRAINED = ("rope", "window", "large-base")
LAB_VARIANTS = (*TRAINED, "ntk")
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


# Which magnitude each comparison of slopes is judged on: past the window, or over all queries
COMPARED = {("window", "rope"): "resid_beyond", ("rope", "ntk"): "resid_all"}
# The lab line each comparison of slopes belongs to
COMPARED_LINE = {("window", "rope"): "window", ("rope", "ntk"): "NTK at inference"}
LABEL = {"rope": "rope", "window": "window", "large-base": "large base", "ntk": "NTK at inference"}


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

    def variants(self) -> list[str]:
        """The variants analysed, in LAB_VARIANTS order: a plan may leave out the large-base one
        (`Plan.lab_large_base`)."""
        return [variant for variant in LAB_VARIANTS if variant in self.runs]

    def trained(self) -> list[str]:
        """The variants trained (TRAINED order): `variants` but the RoPE one under NTK scaling at inference."""
        return [variant for variant in self.variants() if variant in TRAINED]

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
            if not set(variants) <= set(self.runs):
                continue  # a line the plan did not train
            why = [f"{LABEL[v]}: {p}" for v in variants for p in self.testability(v).problems]
            if deciding and why:
                found[line] = why
        return found


def claim_c4_lab(lab: LabRuns) -> Judgement:
    """Lines (3) and (4), judged once on the lab's seeds: first each trained variant's testability, then each
    line's rows, deciding only where the line can test the claim (`LabRuns.untestable`); the large-base line and
    the seed means of every variant's slopes are reported."""
    untestable = lab.untestable()
    rows = [*_testability_rows(lab)]
    for line, why in untestable.items():
        rows.append(
            fact_row(f"lab {line} line: untestable ({'; '.join(why)})", 0, False, False, TO_TEST, deciding=False)
        )
    for (high, low), measure in COMPARED.items():
        where = " beyond the window" if measure == "resid_beyond" else ""
        change = lab.slope(high, measure).minus(lab.slope(low, measure))
        deciding = COMPARED_LINE[(high, low)] not in untestable
        name = f"(3) lab slope{where}: {LABEL[high]} − {LABEL[low]}"
        difference = evidence_row(name, change, 0.0, "above", SLOPE_UNIT, deciding=deciding)
        if difference["says"] == "supports" and not lab.seeds_ordered(high, low, measure):
            difference["says"] = "unclear"  # the seed means agree, single seeds do not
        rows.append(difference)
    ntk = lab.level_change("ntk", "rope")
    deciding = "NTK at inference" not in untestable
    name = "(4) lab: NTK at inference against none, resid_all"
    rows.append(evidence_row(name, ntk, -MIN_NTK_LOWERING, "below", "%", deciding))
    if "large-base" in lab.runs:
        large = lab.slope("rope").minus(lab.slope("large-base"))
        rows.append(
            evidence_row("lab slope: rope − large base (trained)", large, 0.0, "above", SLOPE_UNIT, deciding=False)
        )
        level = lab.level_change("large-base", "rope")
        name = "lab: large base (trained) against rope, resid_all"
        rows.append(evidence_row(name, level, -MIN_NTK_LOWERING, "below", "%", deciding=False))
    for variant in lab.variants():
        name = f"lab slope: {LABEL[variant]} (seed mean)"
        rows.append(evidence_row(name, lab.slope(variant), 0.0, "above", SLOPE_UNIT, deciding=False))
        beyond = lab.slope(variant, "resid_beyond")
        name = f"lab slope beyond the window: {LABEL[variant]} (seed mean)"
        rows.append(evidence_row(name, beyond, 0.0, "above", SLOPE_UNIT, deciding=False))
    return judge(rows)


def _testability_rows(lab: LabRuns) -> list[dict[str, Any]]:
    """Per trained variant, reported: its weakest seed's largest α₀ against the sink threshold, and the seed mean
    of its resid_all against C1's presence threshold."""
    rows = []
    for variant in lab.trained():
        tested = lab.testability(variant)
        weakest = min(tested.sinks)
        has = weakest > SINK_THRESHOLD
        name = f"lab {LABEL[variant]}: largest α₀, weakest seed"
        rows.append(fact_row(name, weakest, has, not has, f"> {SINK_THRESHOLD}", deciding=False))
        name = f"lab {LABEL[variant]}: resid_all (mean over layers, seed mean)"
        rows.append(evidence_row(name, tested.resid, MIN_MAGNITUDE, "above", "nats", deciding=False))
    return rows


def lab_runs(repro: Reproduction) -> LabRuns:
    """C4's controlled line (`lab_trials`), trained and analysed or read back."""
    trials = lab_trials(repro.plan)
    root = repro.lab
    # as `posleak lab` does: trials side by side, one torch thread each (the same weights as one after another)
    jobs = os.cpu_count() or 1
    run_trials(trials, root, backend=repro.backend, address=repro.address, progress=repro.progress, jobs=jobs)
    runs: dict[str, list[AnalysisResult]] = {trial.name: [] for trial in trials}
    for trial in trials:
        runs[trial.name].append(AnalysisResult.read(RunFolder(trial_folder(root, trial) / "analysis")))
    return LabRuns(runs)


def lab_trials(plan: Plan) -> list[Trial]:
    """C4's controlled line: an 8-layer lab decoder trained with full causal RoPE, a sliding window of T/4 and a
    large base (θ·K^(D/(D−2)) from the start, K the largest NTK factor), same data, steps and seeds; each analysed,
    and the RoPE-trained one analysed again under NTK scaling ×K at inference (the same weights, `Trial.train_key`:
    no training)."""
    factor = max(plan.option(C4Options).ntk_factors)
    rope = LabSpec(size="deep")
    specs = {
        "rope": rope,
        "window": LabSpec(size="deep", attention=f"window:{plan.lab.seq_len // 4}"),
        "large-base": LabSpec(size="deep", rope_scaling=f"ntk:{factor:g}"),
        "ntk": rope,
    }
    if not plan.option(C4Options).lab_large_base:  # reported, not judged (LAB_LINES): --quick leaves it out, for time
        del specs["large-base"]
    # the lab model's NTK scaling at inference: the formula of the rope_scaling intervention (θ·K^(D/(D−2)))
    overrides = {"ntk": (("rope_scale_kind", "ntk"), ("rope_factor", factor))}
    # every variant measured beyond the window variant's window as well (docs/method.md §3)
    evaluation = EvalConfig(
        length_multiples=(1,),
        probe_seqs=8,
        analyze_seqs=plan.lab.analyze_seqs,
        bootstrap=plan.bootstrap,
        beyond=plan.lab.seq_len // 4,
    )
    steps = plan.lab.steps
    return [
        Trial(
            variant,
            spec,
            TrainConfig(
                steps=steps,
                seq_len=plan.lab.seq_len,
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
        for seed in plan.lab.seeds
    ]
