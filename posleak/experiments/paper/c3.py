"""C3: position 0 is a closed system; later queries read its trajectory through sink-reading heads.

The value at key 0 of every sink head of the standard model is ablated jointly, of as many random non-sink
heads in each control, and position 0's trajectory is patched from another token: one analysis each, run
after the shared baselines (their heads come from the baseline's per-head table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.errors import BadInput
from posleak.experiments.batch import AnalysisJob
from posleak.experiments.evidence import Estimate, percent_change
from posleak.experiments.paper.claim import ClaimModule, quote, rounded
from posleak.experiments.paper.plan import SAMPLES, SHOWN, Role
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Judgement, fact, judge, row
from posleak.intervene import Interventions
from posleak.pipeline import AnalysisResult
from posleak.report import figures
from posleak.report.html import TableBlock

PATCH_SOURCE = "the"  # position 0's trajectory is replaced by this token's (one token in every tokenizer here)
MIN_SINK_LOWERING = 1.0  # %: the least lowering of the later layers' residual-stream magnitude that counts
CLOSED_HOLDS, CLOSED_FAILS = 1e-6, 1e-3  # largest relative spread of h_0: the closed system holds, fails


def _exponent(value: float) -> str:
    """1e-06 written as 1e-6, the criterion's prose."""
    return f"{value:.0e}".replace("e-0", "e-")


C3_CRITERION = (
    f"Position 0 is a closed system in every run (h_0 identical across inputs sharing its token: relative spread "
    f"≤ {_exponent(CLOSED_HOLDS)}; above {_exponent(CLOSED_FAILS)} it fails), and ablating the "
    f"value at key 0 of all sink heads (α₀ > {SINK_THRESHOLD}) jointly lowers the mean residual-stream magnitude "
    f"(all queries) of the layers after the first ablated one by more than {MIN_SINK_LOWERING:g}% (95% interval "
    f"below −{MIN_SINK_LOWERING:g}%), and by more than each control that ablates as many randomly drawn non-sink "
    "heads (paired difference, interval below 0). Not consistent if the closed system fails, the interval of the "
    f"sink ablation lies above −{MIN_SINK_LOWERING:g}%, or a control lowers it more (difference interval above 0). "
    "Patching the position-0 trajectory from another token is reported beside it, not judged."
)


def claim_c3(
    closed: Mapping[str, float],
    joint: Estimate,
    controls: Sequence[Estimate],
    patch: Estimate | None = None,
) -> Judgement:
    """`closed`: the largest relative spread of h_0 per run (0 when identical); `joint`, `controls`, `patch`: %
    change of the later layers' resid_all under the joint sink ablation, each control draw, the patch."""
    spread = max(closed.values())
    rows = [
        fact(
            "closed system: largest relative spread of h_0",
            spread,
            spread <= CLOSED_HOLDS,
            spread > CLOSED_FAILS,
            f"≤ {CLOSED_HOLDS:g}",
        )
    ]
    rows.append(row("joint sink-head ablation: change", joint, -MIN_SINK_LOWERING, "below", "%"))
    for k, control in enumerate(controls):
        rows.append(row(f"control draw {k}: change", control, -MIN_SINK_LOWERING, "below", "%", deciding=False))
        rows.append(row(f"sink ablation − control draw {k}", joint.minus(control), 0.0, "below", "% points"))
    if patch is not None:
        rows.append(row("position-0 patch: change", patch, -MIN_SINK_LOWERING, "below", "%", deciding=False))
        for k, control in enumerate(controls):
            rows.append(row(f"patch − control draw {k}", patch.minus(control), 0.0, "below", "% points", False))
    return judge(rows)


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


def sink_jobs(repro: Reproduction, role: Role, baseline: AnalysisResult, sample: str) -> dict[str, AnalysisJob]:
    """Ablate the value at key 0 of every sink head jointly, of as many random non-sink heads (several draws),
    and patch position 0's trajectory: one analysis each of the model of `role`, by run name (ablate-sinks,
    ablate-control0, ...), into OUT/runs/FOLDER-NAME-SAMPLE."""
    sinks, controls, _ = sink_design(role.model, baseline, repro.plan.control_draws)
    runs = {"ablate-sinks": Interventions(ablate_sink_values=head_list(sinks))}
    runs |= {f"ablate-control{k}": Interventions(ablate_sink_values=head_list(c)) for k, c in enumerate(controls)}
    runs["patch-pos0"] = Interventions(patch_pos0=PATCH_SOURCE)
    config = repro.config("standard")
    return {
        name: repro.job(
            f"{role.folder}-{name}", role.model, dataclasses.replace(config, interventions=interventions), sample
        )
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


class C3(ClaimModule):
    name = "C3"
    statement = "Position 0 is a closed system; later queries read its trajectory through sink-reading heads."
    roles = ("standard",)
    criterion = C3_CRITERION

    @property
    def method(self) -> str:  # the plan's standard model, so not a class constant
        return (
            "h_0^(l) compared across inputs sharing the token at position 0, in every run; the value at key 0 of "
            f"every sink head of {self.repro.plan.roles['standard'].name} zeroed for queries i ≥ 1 in one run, of as "
            "many random non-sink heads in each control run, and position 0's trajectory replaced by that of "
            "another token in a third (docs/method.md §9, §13)."
        )

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """The ablations and the patch of both samples, in one wave."""
        role, draws = self.repro.plan.roles["standard"], self.repro.plan.control_draws
        jobs = {s: sink_jobs(self.repro, role, runs[s].standard, s) for s in SAMPLES}
        results = iter(self.repro.run([job for named in jobs.values() for job in named.values()]))
        self.evidence = {
            s: sink_evidence(role.model, runs[s].standard, {name: next(results) for name in named}, draws)
            for s, named in jobs.items()
        }

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        closed = {
            str(r.run.path if r.run else i): float(r.manifest["closed_system"]["max_rel_spread"])
            for i, r in enumerate(runs.all())
        }
        sinks = self.evidence[sample]
        return claim_c3(closed, sinks.joint, sinks.control_changes, sinks.patch)

    def numbers(self, sample: str) -> dict[str, Any]:
        return {"sink_heads": len(self.evidence[sample].sinks), "later_layers": self.evidence[sample].later}

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        table = self.evidence[sample].table()
        self.repro.out.write_table(f"sink_ablation_{sample}", table)
        source = f"sink_ablation_{sample}.parquet"
        return [TableBlock(f"Sink-head ablation and controls (sample {sample})", rounded(table), source=source)]

    def interventions(self, runs: SampleRuns, sample: str) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
        return {name: (runs.standard, run) for name, run in self.evidence[sample].runs.items()}

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        return (
            "The paper finds later queries reading position 0 through sink heads; here ablating all "
            f"{len(self.evidence[SHOWN].sinks)} sink heads changes the later layers' residual-stream magnitude by "
            f"{quote(judgement, 'joint sink-head ablation: change')}, as many random non-sink heads by "
            f"{quote(judgement, 'control draw 0: change')}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        shown = self.evidence[SHOWN].runs
        lines = {"baseline": runs.standard.per_layer} | {
            name: shown[name].per_layer for name in ("ablate-sinks", "ablate-control0", "patch-pos0")
        }
        title = (
            f"{runs.roles['standard'].name}: resid_all with sink heads, control heads ablated, position 0 patched "
            f"(sample {SHOWN})"
        )
        path = self.repro.out.figure_path("c3_sink_ablation")
        return [figures.lines_by_run(lines, "resid_all", path, title=title, ylabel="resid_all (nats)")]
