"""`posleak paper`: the reproduction of claims C1–C6 of arXiv 2606.06160 on the built-in models.

Every analysis is an ordinary `analyze` run folder under `OUT/runs/` and every lab model a lab trial under
`OUT/lab/`, so an interrupted reproduction resumes where it stopped. Each claim is judged by a criterion
written in claims.py before any data were seen, on two disjoint samples of sequences (A and B): the
sequences of each model are drawn once and split in halves, and every analysis, intervention and control
runs on each half. A claim is consistent, or not consistent, only where both samples say so.

Models: smollm2-135m (standard RoPE, θ = 1e5), gemma3-270m (5 sliding layers of W = 512 to one global;
sequences longer than the window), qwen2.5-coder-0.5b (RoPE trained with θ = 1e6), smollm2-135m with
NTK-aware scaling at inference, and, for C4's controlled line, a lab decoder of 8 layers trained three ways.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from posleak.capture import CaptureSession, ResidualCapture
from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.commands.intervene import without_bos
from posleak.data.batches import TokenBatch, iter_batches
from posleak.device import Placement
from posleak.errors import BadInput
from posleak.experiments import claims as criteria
from posleak.experiments.batch import AnalysisJob, ModelCache, draw_sequences, run_analyses
from posleak.experiments.claims import Claim, Judgement, LabRuns
from posleak.experiments.compare import summarise
from posleak.experiments.evidence import Estimate, depth_slope, percent_change
from posleak.intervene import Interventions
from posleak.lab.sweep import run_trials
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial, trial_folder
from posleak.measure.behaviour import behaviour_table
from posleak.measure.position0 import fingerprint_constancy
from posleak.models.lab.config import LabSpec
from posleak.models.load import LoadedModel
from posleak.pipeline.analysis import AnalysisResult, AnalyzeConfig
from posleak.report import figures
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.runner import BACKENDS
from posleak.store import RunFolder, atomic_write
from posleak.validate import out_folder_problems

SAMPLES = ("A", "B")
PATCH_SOURCE = "the"  # C3: position 0's trajectory is replaced by this token's (one token in every tokenizer here)
LAB_VARIANTS = ("rope", "window", "ntk")
BOS_KINDS = ("mean", "random", "zero")  # C5: what replaces the BOS's embedding


@dataclass(frozen=True)
class Plan:
    """Sizes of one reproduction, per sample (two disjoint samples); `--quick` fits in 15 minutes on 2 cores."""

    name: str
    seq_len: int
    num_seqs: int
    gemma_seq_len: int  # longer than Gemma's 512-token window, so that the sliding layers act
    gemma_num_seqs: int
    qwen_num_seqs: int
    ntk_factors: tuple[float, ...]
    control_draws: int  # C3: draws of as many random non-sink heads as there are sink heads
    fingerprint_seqs: int
    bootstrap: int
    lab_steps: int  # C4's controlled line: training steps of each lab model
    lab_seq_len: int
    lab_seeds: tuple[int, ...]
    lab_analyze_seqs: int
    batch_size: int = 4
    cross_documents: bool = False
    provisional: bool = False  # small samples: the report says its verdicts are provisional
    placement: Placement = field(default_factory=Placement)  # device and dtype of every analysis (posleak.device)


QUICK = Plan(
    name="quick",
    seq_len=256,
    num_seqs=8,
    gemma_seq_len=640,
    gemma_num_seqs=4,
    qwen_num_seqs=4,
    ntk_factors=(4.0, 16.0),
    control_draws=2,
    fingerprint_seqs=8,
    bootstrap=200,
    lab_steps=300,
    lab_seq_len=64,
    lab_seeds=(0, 1),
    lab_analyze_seqs=16,
    provisional=True,
)
FULL = Plan(
    name="full",
    seq_len=512,
    num_seqs=12,
    gemma_seq_len=768,
    gemma_num_seqs=6,
    qwen_num_seqs=6,
    ntk_factors=(2.0, 4.0, 16.0),
    control_draws=3,
    fingerprint_seqs=24,
    bootstrap=500,
    lab_steps=600,
    lab_seq_len=128,
    lab_seeds=(0, 1, 2),
    lab_analyze_seqs=32,
)


class Reproduction:
    """The analyses the claims need (each an `AnalysisJob` into OUT/runs), run or resumed on `backend`, with
    the loaded models cached between them."""

    def __init__(
        self, out: Path, plan: Plan, progress: bool, backend: str = "local", address: str | None = None
    ) -> None:
        self.out = RunFolder(out)
        self.plan = plan
        self.progress = progress
        self.backend = backend
        self.address = address
        self.models = ModelCache()

    def model(self, name: str) -> LoadedModel:
        return self.models.get(name, Interventions(), self.plan.placement)

    def config(self, model: str, **changes: Any) -> AnalyzeConfig:
        """The analysis of one sample of `model` (num_seqs per sample)."""
        plan = self.plan
        seq_len, num_seqs = plan.seq_len, plan.num_seqs
        if model == "gemma3-270m":
            seq_len, num_seqs = plan.gemma_seq_len, plan.gemma_num_seqs
        if model == "qwen2.5-coder-0.5b":
            num_seqs = plan.qwen_num_seqs
        base = AnalyzeConfig(
            seq_len=seq_len,
            num_seqs=num_seqs,
            batch_size=plan.batch_size,
            bootstrap=plan.bootstrap,
            cross_documents=plan.cross_documents,
            **plan.placement.to_dict(),
        )
        return dataclasses.replace(base, **changes)

    def job(self, name: str, model: str, config: AnalyzeConfig, sample: str) -> AnalysisJob:
        """Analysis `name` of `model` on sample A or B (the first or second half of 2·num_seqs sequences drawn
        once: disjoint by construction), into OUT/runs/NAME-SAMPLE."""
        folder = self.out.path / "runs" / f"{name}-{sample}"
        return AnalysisJob(f"{name}-{sample}", model, config, folder, half=SAMPLES.index(sample))

    def sample(self, model: str, config: AnalyzeConfig, sample: str) -> TokenBatch:
        return draw_sequences(self.models, model, config, SAMPLES.index(sample))

    def run(self, jobs: dict[str, AnalysisJob]) -> dict[str, AnalysisResult]:
        """The result of every job, by its key: finished ones read back, the others run on the backend."""
        results = run_analyses(
            list(jobs.values()), backend=self.backend, address=self.address, models=self.models, progress=self.progress
        )
        return dict(zip(jobs, results, strict=True))


# --------------------------------------------------------------------------------------- measures


@torch.no_grad()
def position0_states(loaded: LoadedModel, batch: TokenBatch, batch_size: int) -> torch.Tensor:
    """h_0^(l) of every row, (L + 1, N, d): position 0 is closed, so two tokens per row suffice."""
    with ResidualCapture(loaded.model, positions=[0]) as capture:
        session = CaptureSession()
        for seq_index, ids in iter_batches(batch, batch_size):
            session.forward(loaded.model, ids[:, :2], seq_index)
    return capture.states()[:, :, 0]


def fingerprint_table(repro: Reproduction, model: str, sample: str) -> pd.DataFrame:
    """`layer, fingerprint_cos_bos, fingerprint_cos_nobos` for one model and sample."""
    loaded = repro.model(model)
    config = repro.config(model, seq_len=32, num_seqs=repro.plan.fingerprint_seqs, bos="on")
    with_bos = repro.sample(model, config, sample)
    states_bos = position0_states(loaded, with_bos, repro.plan.batch_size)
    states_nobos = position0_states(loaded, without_bos(with_bos), repro.plan.batch_size)
    return pd.DataFrame(
        {
            "layer": range(states_bos.shape[0]),
            "fingerprint_cos_bos": fingerprint_constancy(states_bos).numpy(),
            "fingerprint_cos_nobos": fingerprint_constancy(states_nobos).numpy(),
        }
    )


def sink_heads(per_head: pd.DataFrame) -> pd.DataFrame:
    """Every sink head (α₀ > ε) outside the model's last layer (a head there has no later layers to change),
    strongest first."""
    heads = per_head[(per_head["sink_score"] > SINK_THRESHOLD) & (per_head["layer"] < per_head["layer"].max())]
    return heads.sort_values("sink_score", ascending=False).reset_index(drop=True)


def control_heads(per_head: pd.DataFrame, count: int, draw: int) -> pd.DataFrame:
    """`count` heads drawn at random (seed `draw`) from the non-sink heads outside the last layer."""
    pool = per_head[(per_head["sink_score"] <= SINK_THRESHOLD) & (per_head["layer"] < per_head["layer"].max())]
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(draw))[:count]
    return pool.iloc[order.tolist()].sort_values(["layer", "head"]).reset_index(drop=True)


def head_list(heads: pd.DataFrame) -> str:
    """The `--ablate-sink-values` form of a table of heads: L.H,L.H,..."""
    return ",".join(f"{layer}.{head}" for layer, head in zip(heads["layer"], heads["head"], strict=True))


@dataclass
class SinkEvidence:
    """C3 on one sample: the heads ablated, and the % change of the later layers' resid_all under each run."""

    sinks: pd.DataFrame
    controls: list[pd.DataFrame]
    joint: Estimate
    control_changes: list[Estimate]
    patch: Estimate
    later: list[int]
    runs: dict[str, AnalysisResult]  # each ablation or patch run, by its name (ablate-sinks, ...)

    def table(self) -> pd.DataFrame:
        rows = [("joint sink-head ablation", head_list(self.sinks), self.joint)]
        rows += [
            (f"control draw {k}", head_list(c), e)
            for k, (c, e) in enumerate(zip(self.controls, self.control_changes, strict=True))
        ]
        rows.append((f"position-0 patch from {PATCH_SOURCE!r}", "-", self.patch))
        return pd.DataFrame(
            [
                {"run": n, "heads": h, "change_pct": e.value, "lo": e.interval[0], "hi": e.interval[1]}
                for n, h, e in rows
            ]
        )


def sink_design(model: str, baseline: AnalysisResult, draws: int) -> tuple[pd.DataFrame, list[pd.DataFrame], list[int]]:
    """C3's heads on one sample: the sink heads, `draws` sets of as many random non-sink heads, and the layers
    after the first sink head (where an ablation can change the residual stream)."""
    sinks = sink_heads(baseline.per_head)
    if sinks.empty:
        raise BadInput(
            [f"{model} has no sink head (α₀ > {SINK_THRESHOLD}) outside its last layer: C3 cannot be tested"]
        )
    later = sorted(layer for layer in baseline.per_layer["layer"] if layer > sinks["layer"].min())
    controls = [control_heads(baseline.per_head, len(sinks), draw) for draw in range(draws)]
    return sinks, controls, later


def sink_jobs(repro: Reproduction, model: str, baseline: AnalysisResult, sample: str) -> dict[str, AnalysisJob]:
    """Ablate the value at key 0 of every sink head jointly, of as many random non-sink heads (several draws),
    and patch position 0's trajectory: one analysis each, by run name (ablate-sinks, ablate-control0, ...)."""
    sinks, controls, _ = sink_design(model, baseline, repro.plan.control_draws)
    runs = {"ablate-sinks": Interventions(ablate_sink_values=head_list(sinks))}
    runs |= {f"ablate-control{k}": Interventions(ablate_sink_values=head_list(c)) for k, c in enumerate(controls)}
    runs["patch-pos0"] = Interventions(patch_pos0=PATCH_SOURCE)
    config = repro.config(model)
    return {
        name: repro.job(f"{model}-{name}", model, dataclasses.replace(config, interventions=interventions), sample)
        for name, interventions in runs.items()
    }


def sink_evidence(model: str, baseline: AnalysisResult, runs: dict[str, AnalysisResult], draws: int) -> SinkEvidence:
    """Each run of `sink_jobs` against the baseline: % change of resid_all on the layers after the first sink."""
    sinks, controls, later = sink_design(model, baseline, draws)

    def change(name: str) -> Estimate:
        return percent_change(baseline, runs[name], "resid_all", later)

    return SinkEvidence(
        sinks=sinks,
        controls=controls,
        joint=change("ablate-sinks"),
        control_changes=[change(f"ablate-control{k}") for k in range(draws)],
        patch=change("patch-pos0"),
        later=later,
        runs=runs,
    )


def lab_runs(repro: Reproduction) -> LabRuns:
    """C4's controlled line: an 8-layer lab decoder trained with full causal RoPE, a sliding window of T/4 and an
    NTK-scaled base (θ·K^(D/(D−2)), K the largest NTK factor), same data, steps and seeds; each analysed."""
    plan = repro.plan
    specs = {
        "rope": LabSpec(size="deep"),
        "window": LabSpec(size="deep", attention=f"window:{plan.lab_seq_len // 4}"),
        "ntk": LabSpec(size="deep", rope_scaling=f"ntk:{max(plan.ntk_factors):g}"),
    }
    evaluation = EvalConfig(
        length_multiples=(1,), probe_seqs=8, analyze_seqs=plan.lab_analyze_seqs, bootstrap=plan.bootstrap
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
    root = repro.out.path / "lab"
    run_trials(trials, root, backend=repro.backend, address=repro.address, progress=repro.progress)
    runs: dict[str, list[AnalysisResult]] = {variant: [] for variant in specs}
    for trial in trials:
        runs[trial.name].append(AnalysisResult.read(RunFolder(trial_folder(root, trial) / "analysis")))
    return LabRuns(runs)


def behaviour_tables(results: dict[str, Any], sample: str, plan: Plan) -> pd.DataFrame:
    """Every intervention the reproduction runs against its baseline on one sample: the model's next-token loss
    and top-1 accuracy by position bucket, with paired intervals (posleak.measure.behaviour), so that each
    effect on the leakage comes with its effect on what the model predicts."""
    s = sample
    sinks: SinkEvidence = results[f"sinks-{s}"]
    pairs = {
        **{("C3", name): (results[f"smollm2-{s}"], run) for name, run in sinks.runs.items()},
        **{("C4", f"ntk:{k:g}"): (results[f"smollm2-{s}"], results[f"ntk{k:g}-{s}"]) for k in plan.ntk_factors},
        **{("C5", f"replace-bos {k}"): (results[f"gemma-bos-{s}"], results[f"bos-{k}-{s}"]) for k in BOS_KINDS},
    }
    frames = [
        behaviour_table(base, new, resamples=plan.bootstrap).assign(claim=claim, intervention=name)
        for (claim, name), (base, new) in pairs.items()
    ]
    table = pd.concat(frames, ignore_index=True)
    return table[["claim", "intervention", *table.columns[:-2]]]


def behaviour_block(table: pd.DataFrame, claim: str, sample: str) -> TableBlock:
    """A claim's interventions' change of loss and accuracy, per bucket, for reading (3 significant digits)."""
    rows = []
    for (name, bucket), cell in table[table["claim"] == claim].groupby(["intervention", "bucket"], sort=False):
        loss, acc = cell.set_index("measure").loc["loss"], cell.set_index("measure").loc["accuracy"]
        rows.append(
            {
                "intervention": name,
                "queries": f"{bucket} ({int(loss.query_lo)}–{int(loss.query_hi) - 1})",
                "loss": f"{loss.baseline:.3g} → {loss.intervened:.3g}",
                "Δ loss (nats)": f"{loss.change:+.3g} ({loss.change_lo:+.3g} to {loss.change_hi:+.3g})",
                "Δ top-1 (points)": f"{100 * acc.change:+.3g} "
                f"({100 * acc.change_lo:+.3g} to {100 * acc.change_hi:+.3g})",
            }
        )
    return TableBlock(
        f"Effect on the model's next-token loss and top-1 accuracy (sample {sample})",
        pd.DataFrame(rows),
        caption="Intervened − baseline on the same sequences, 95% paired bootstrap intervals over sequences.",
        max_rows=None,
        source=f"behaviour_{sample}.parquet",
    )


# ------------------------------------------------------------------------------------------- main


def reproduce(
    out: Path | str,
    plan: Plan = QUICK,
    progress: bool = True,
    backend: str = "local",
    address: str | None = None,
) -> list[Claim]:
    """Run every analysis, judge every claim, write `claims.json`, tables and `report.html` into `out`.

    `backend`: "local" runs the analyses and lab trials here one after another; "ray" runs each as a Ray task
    (posleak.experiments.batch), on a local cluster or the one at `address`, in two waves: every analysis that
    needs nothing else, then C3's ablations (their heads come from the baselines of the first wave)."""
    problems = out_folder_problems(out) + plan.placement.problems()
    if backend not in BACKENDS:
        problems.append(f"unknown backend '{backend}'; use local or ray")
    if problems:
        raise BadInput(problems)
    repro = Reproduction(Path(out), plan, progress, backend, address)
    jobs: dict[str, AnalysisJob] = {}

    def gemma_short(**changes: Any) -> AnalyzeConfig:  # C5 looks at early queries: no need for T > window
        return repro.config("gemma3-270m", seq_len=plan.seq_len, num_seqs=plan.num_seqs, **changes)

    for s in SAMPLES:
        jobs[f"smollm2-{s}"] = repro.job("smollm2-135m", "smollm2-135m", repro.config("smollm2-135m"), s)
        for k in plan.ntk_factors:
            ntk = repro.config("smollm2-135m", interventions=Interventions(rope_scaling=f"ntk:{k:g}"))
            jobs[f"ntk{k:g}-{s}"] = repro.job(f"smollm2-135m-ntk{k:g}", "smollm2-135m", ntk, s)
        qwen = "qwen2.5-coder-0.5b"
        jobs[f"qwen-{s}"] = repro.job(qwen, qwen, repro.config(qwen), s)
        jobs[f"gemma-{s}"] = repro.job("gemma3-270m", "gemma3-270m", repro.config("gemma3-270m"), s)
        jobs[f"gemma-bos-{s}"] = repro.job("gemma3-270m-bos", "gemma3-270m", gemma_short(), s)
        for kind in BOS_KINDS:
            replace = gemma_short(interventions=Interventions(replace_bos=kind))
            jobs[f"bos-{kind}-{s}"] = repro.job(f"gemma3-270m-bos-{kind}", "gemma3-270m", replace, s)
    results: dict[str, Any] = repro.run(jobs)

    sinks = {s: sink_jobs(repro, "smollm2-135m", results[f"smollm2-{s}"], s) for s in SAMPLES}
    ablations = repro.run({f"{s}/{name}": job for s, named in sinks.items() for name, job in named.items()})
    for s, named in sinks.items():
        runs = {name: ablations[f"{s}/{name}"] for name in named}
        results[f"sinks-{s}"] = sink_evidence("smollm2-135m", results[f"smollm2-{s}"], runs, plan.control_draws)
        for model in ("gemma3-270m", "smollm2-135m"):
            results[f"fingerprint-{model}-{s}"] = fingerprint_table(repro, model, s)
    results["lab"] = lab_runs(repro)
    claims = _judge(repro, results)
    _write(repro, claims, results)
    return claims


def _models(results: dict[str, Any], s: str) -> dict[str, AnalysisResult]:
    return {
        "smollm2-135m": results[f"smollm2-{s}"],
        "qwen2.5-coder-0.5b": results[f"qwen-{s}"],
        "gemma3-270m (T > window)": results[f"gemma-{s}"],
    }


def _judge(repro: Reproduction, results: dict[str, Any]) -> list[Claim]:
    plan = repro.plan
    largest = max(plan.ntk_factors)
    lab: LabRuns = results["lab"]
    by_sample: dict[str, dict[str, Judgement]] = {c: {} for c in ("C1", "C2", "C3", "C4", "C5", "C6")}
    numbers: dict[str, dict[str, Any]] = {c: {} for c in by_sample}
    behaviour: dict[str, pd.DataFrame] = {}
    for s in SAMPLES:
        models = _models(results, s)
        by_sample["C1"][s] = criteria.claim_c1(models)
        by_sample["C2"][s] = criteria.claim_c2(models)
        runs = [r for name, r in results.items() if name.endswith(f"-{s}") and isinstance(r, AnalysisResult)]
        sinks: SinkEvidence = results[f"sinks-{s}"]
        closed = {
            str(r.run.path if r.run else i): float(r.manifest["closed_system"]["max_rel_spread"])
            for i, r in enumerate(runs)
        }
        by_sample["C3"][s] = criteria.claim_c3(closed, sinks.joint, sinks.control_changes, sinks.patch)
        slopes = {
            "sliding": depth_slope(results[f"gemma-{s}"], "resid_all"),
            "standard": depth_slope(results[f"smollm2-{s}"], "resid_all"),
            "ntk": depth_slope(results[f"ntk{largest:g}-{s}"], "resid_all"),
        }
        reported = {"trained base 1e6 (qwen2.5-coder-0.5b)": depth_slope(results[f"qwen-{s}"], "resid_all")}
        ntk_change = percent_change(results[f"smollm2-{s}"], results[f"ntk{largest:g}-{s}"], "resid_all")
        by_sample["C4"][s] = criteria.claim_c4(ntk_change, slopes, lab, reported)
        bos = {
            kind: percent_change(results[f"gemma-bos-{s}"], results[f"bos-{kind}-{s}"], "resid_early")
            for kind in BOS_KINDS
        }
        by_sample["C5"][s] = criteria.claim_c5(bos)
        fingerprints = {m: results[f"fingerprint-{m}-{s}"] for m in ("gemma3-270m", "smollm2-135m")}
        by_sample["C6"][s] = criteria.claim_c6(fingerprints)
        numbers["C3"][s] = {"sink_heads": len(sinks.sinks), "later_layers": sinks.later}
        repro.out.write_table(f"sink_ablation_{s}", sinks.table())
        behaviour[s] = behaviour_tables(results, s, plan)
        repro.out.write_table(f"behaviour_{s}", behaviour[s])
        position0 = pd.concat([t.assign(model=m) for m, t in fingerprints.items()], ignore_index=True)
        repro.out.write_table(
            f"position0_{s}", position0[["model", "layer", "fingerprint_cos_bos", "fingerprint_cos_nobos"]]
        )
    variants = {
        **_models(results, "A"),
        **{f"smollm2-135m ntk:{k:g}": results[f"ntk{k:g}-A"] for k in plan.ntk_factors},
    }
    summary = pd.DataFrame([summarise(label, r.per_layer) for label, r in variants.items()])
    repro.out.write_table("comparison", summary)
    claims = [
        Claim(name, criteria.STATEMENTS[name], criteria.CRITERIA[name], by_sample[name], criteria.METHODS[name])
        for name in criteria.CRITERIA
    ]
    for claim in claims:
        claim.numbers = numbers[claim.claim]
        claim.paper = _against_paper(claim, results)
    claims[3].tables.append(
        TableBlock("Architecture comparison (sample A)", _rounded(summary), source="comparison.parquet")
    )
    claims[2].tables.append(
        TableBlock(
            "Sink-head ablation and controls (sample A)",
            _rounded(results["sinks-A"].table()),
            source="sink_ablation_A.parquet",
        )
    )
    for claim in claims:
        if claim.claim in set(behaviour["A"]["claim"]):
            claim.tables.append(behaviour_block(behaviour["A"], claim.claim, "A"))
    _add_figures(repro, claims, results)
    return claims


def _against_paper(claim: Claim, results: dict[str, Any]) -> str:
    """One sentence: the effect measured on sample A beside what the paper reports."""
    evidence = claim.samples["A"].evidence.set_index("evidence")

    def value(name: str) -> str:
        e = evidence.loc[name]
        interval = "" if pd.isna(e["lo"]) else f" ({e['lo']:.3g} to {e['hi']:.3g})"
        return f"{e['value']:.4g}{' ' + e['unit'] if e['unit'] else ''}{interval}"

    sinks: SinkEvidence = results["sinks-A"]
    sentences = {
        "C1": "The paper finds absolute position in the attention of RoPE models; here the residual-stream "
        "magnitude is {smollm2-135m: resid_all} in smollm2-135m and the causal-mask one {smollm2-135m: mask_all}.",
        "C2": "The paper traces one source to the causal mask's denominator; here its early-query magnitude is "
        "{smollm2-135m: mask_early} in smollm2-135m.",
        "C3": f"The paper finds later queries reading position 0 through sink heads; here ablating all "
        f"{len(sinks.sinks)} sink heads changes the later layers' residual-stream magnitude by "
        "{joint sink-head ablation: change}, as many random non-sink heads by {control draw 0: change}.",
        "C4": "The paper reports NTK suppressing the residual-stream component and sliding windows accumulating it; "
        "here NTK scaling changes it by {(1) NTK at inference: change of resid_all}, and the slope of the "
        "sliding-window model minus the standard one is {(2) slope: sliding − standard}.",
        "C5": f"The paper removes about {criteria.PAPER_BOS_REMOVED:g}%; here the vocabulary mean removes "
        "{mean: removed}, a random vector {random: removed}, zeros {zero: removed}.",
        "C6": "The paper reports a fingerprint constant with a BOS and varying without; here the least cosine in "
        "gemma3-270m is {gemma3-270m: least cosine with BOS} with a BOS and {gemma3-270m: least cosine without BOS} "
        "without.",
    }
    return re.sub(r"\{([^{}]+)\}", lambda match: value(match.group(1)), sentences[claim.claim])


def _rounded(table: pd.DataFrame) -> pd.DataFrame:
    """Numbers to 3 significant digits for reading; the Parquet tables and claims.json keep full precision."""
    return table.apply(lambda col: col.map(lambda v: float(f"{v:.3g}")) if col.dtype.kind == "f" else col)


def evidence_table(judgement: Judgement) -> pd.DataFrame:
    """A sample's evidence for the report: value and interval to 3 significant digits."""
    frame = judgement.evidence
    interval = ["" if pd.isna(lo) else f"{lo:.3g} to {hi:.3g}" for lo, hi in zip(frame["lo"], frame["hi"], strict=True)]
    return pd.DataFrame(
        {
            "evidence": frame["evidence"],
            "value": [f"{v:.3g}" for v in frame["value"]],
            "95% interval": interval,
            "threshold": frame["threshold"],
            "unit": frame["unit"],
            "says": frame["says"],
            "deciding": ["yes" if d else "reported" for d in frame["deciding"]],
        }
    )


def _add_figures(repro: Reproduction, claims: list[Claim], results: dict[str, Any]) -> None:
    out = repro.out
    by_claim = {c.claim: c for c in claims}
    models = {k: v.per_layer for k, v in _models(results, "A").items()}
    for measure in ("resid_all", "mask_all"):
        by_claim["C1"].figures.append(
            figures.lines_by_run(
                models,
                measure,
                out.figure_path(f"c1_{measure}"),
                title=f"{measure} by relative depth (sample A)",
                ylabel=f"{measure} (nats)",
                relative_depth=True,
            )
        )
    smollm2 = results["smollm2-A"]
    by_claim["C2"].figures.append(
        figures.profiles_figure(smollm2.profiles, smollm2.per_layer, out.figure_path("c2_profiles"))
    )
    sinks: SinkEvidence = results["sinks-A"]
    sink_runs = {"baseline": smollm2.per_layer} | {
        name: sinks.runs[name].per_layer for name in ("ablate-sinks", "ablate-control0", "patch-pos0")
    }
    by_claim["C3"].figures.append(
        figures.lines_by_run(
            sink_runs,
            "resid_all",
            out.figure_path("c3_sink_ablation"),
            title="smollm2-135m: resid_all with sink heads, control heads ablated, position 0 patched (sample A)",
            ylabel="resid_all (nats)",
        )
    )
    variants = {
        **models,
        **{f"smollm2-135m ntk:{k:g}": results[f"ntk{k:g}-A"].per_layer for k in repro.plan.ntk_factors},
    }
    by_claim["C4"].figures.append(
        figures.lines_by_run(
            variants,
            "resid_all",
            out.figure_path("c4_resid_all"),
            title="Residual-stream magnitude by relative depth (sample A)",
            ylabel="resid_all (nats)",
            relative_depth=True,
        )
    )
    lab: LabRuns = results["lab"]
    lab_lines = {f"lab {variant} seed {k}": r.per_layer for variant, rs in lab.runs.items() for k, r in enumerate(rs)}
    by_claim["C4"].figures.append(
        figures.lines_by_run(
            lab_lines,
            "resid_all",
            out.figure_path("c4_lab"),
            title="Lab decoder trained three ways: resid_all by depth",
            ylabel="resid_all (nats)",
            relative_depth=True,
        )
    )
    removed = {}
    for kind in BOS_KINDS:
        base, new = results["gemma-bos-A"], results[f"bos-{kind}-A"]
        layers = base.per_layer["layer"].tolist()
        rows = [percent_change(base, new, "resid_early", [layer]) for layer in layers]
        removed[kind] = pd.DataFrame(
            {
                "layer": layers,
                "removed": [-e.value for e in rows],
                "removed_lo": [-e.interval[1] for e in rows],
                "removed_hi": [-e.interval[0] for e in rows],
            }
        )
    by_claim["C5"].figures.append(
        figures.lines_by_run(
            removed,
            "removed",
            out.figure_path("c5_removed"),
            title="Early residual-stream component removed by BOS replacement (gemma3-270m, sample A)",
            ylabel="removed (%)",
        )
    )
    cos = {
        f"{model} {kind}": results[f"fingerprint-{model}-A"].rename(columns={f"fingerprint_cos_{kind}": "cos"})
        for model in ("gemma3-270m", "smollm2-135m")
        for kind in ("bos", "nobos")
    }
    by_claim["C6"].figures.append(
        figures.lines_by_run(
            cos,
            "cos",
            out.figure_path("c6_fingerprint"),
            title="Fingerprint constancy of h_0 across inputs (sample A)",
            ylabel="mean pairwise cosine",
        )
    )


def _write(repro: Reproduction, claims: list[Claim], results: dict[str, Any]) -> None:
    out = repro.out
    atomic_write(
        out.path / "claims.json",
        lambda f: f.write(json.dumps([c.to_json() for c in claims], indent=2, default=float).encode()),
    )
    runs = {name: str(r.run.path) for name, r in results.items() if isinstance(r, AnalysisResult) and r.run}
    manifest = {
        "status": "complete",
        "model": {"id": "paper reproduction"},
        "plan": dataclasses.asdict(repro.plan),
        "runs": runs,
        "verdicts": {c.claim: c.verdict for c in claims},
        "samples": {c.claim: {s: j.verdict for s, j in c.samples.items()} for c in claims},
    }
    provisional = (
        f" The `{repro.plan.name}` plan uses small samples: its verdicts are provisional."
        if repro.plan.provisional
        else ""
    )
    sections = [
        Section(
            f"{c.claim}: {c.statement}",
            f"**Measured.** {c.method}\n\n**Criterion (declared before the data).** {c.criterion}\n\n"
            f"**Against the paper.** {c.paper}\n\n**Verdict.** "
            + "; ".join(f"sample {s}: {j.verdict}" for s, j in c.samples.items())
            + f" → **{c.verdict}** (consistent or not consistent only where both samples agree).{provisional}",
            figures=[FigureBlock(p) for p in c.figures],
            tables=[
                *(TableBlock(f"Evidence, sample {s}", evidence_table(j), max_rows=None) for s, j in c.samples.items()),
                *c.tables,
            ],
            verdict=c.verdict,
        )
        for c in claims
    ]
    render_report(out, f"posleak: reproduction of arXiv 2606.06160 ({repro.plan.name})", sections, manifest=manifest)
    out.write_manifest(manifest)
