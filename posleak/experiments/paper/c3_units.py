"""C3's units (docs/method.md §13): each model of C3's roles in each BOS setting its tokenizer allows, the heads
each unit's runs patch or ablate, the runs themselves, and their evidence.

A unit in its role's own BOS setting reads the shared baseline (posleak.experiments.paper.reproduction) and runs
every C3 intervention; a unit in the other setting runs a baseline of its own and the deciding test only (the
path-specific patch of the sink heads and of each control).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.data.kinds import BosPolicy
from posleak.experiments.batch import AnalysisJob
from posleak.experiments.evidence import Estimate, percent_change
from posleak.experiments.paper.models import read_facts
from posleak.experiments.paper.plan import RoleName
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import fact, row
from posleak.intervene import Interventions
from posleak.pipeline import AnalysisResult, AnalyzeConfig

C3_ROLES: tuple[RoleName, ...] = ("standard", "large-base", "sliding")
PATCH_SOURCE = "the"  # the token whose position-0 trajectory is read instead (one token in every tokenizer here)
MIN_SINK_LOWERING = 1.0  # %: the least lowering of the later layers' residual-stream magnitude that counts
DECIDING_RUN = "kv0-sinks"  # the path-specific patch of the sink heads: the run that decides a unit
DECIDING_ROW = "K/V patch of sink heads: change"  # its evidence row, after the unit's label


@dataclass(frozen=True)
class Unit:
    """One model of C3's roles in one BOS setting: `bos` is its baseline's --bos (auto: the shared baseline)."""

    role: RoleName
    bos: BosPolicy
    bos_at_0: bool
    label: str  # how evidence rows, tables and claims.json name it
    folder: str  # its run folders' names start with this (then -RUN-SAMPLE)

    @property
    def full(self) -> bool:
        """Every C3 run (the role's own BOS setting), or the deciding test only."""
        return self.bos == "auto"


def c3_units(repro: Reproduction, runs: SampleRuns) -> list[Unit]:
    """Each C3 role's model in its shared baseline's BOS setting, then in the other where its tokenizer allows
    (off where a BOS stands at position 0; on where the tokenizer has a BOS token it does not prepend) when the
    plan asks for both settings."""
    units = []
    for role in C3_ROLES:
        spec = repro.plan.roles[role]
        at_0 = runs.by_role()[role].manifest["data"]["bos_id"] is not None
        units.append(Unit(role, "auto", at_0, _label(spec.name, at_0), spec.folder))
        if repro.plan.c3_both_bos and (at_0 or read_facts(spec.model).has_bos):
            other: BosPolicy = "off" if at_0 else "on"
            units.append(Unit(role, other, not at_0, _label(spec.name, not at_0), f"{spec.folder}-bos{other}"))
    return units


def _label(name: str, bos_at_0: bool) -> str:
    return f"{name} ({'BOS' if bos_at_0 else 'no BOS'} at 0)"


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
    """The `--ablate-sink-values` / `--kv0-heads` form of a table of heads: L.H,L.H,..."""
    return ",".join(f"{layer}.{head}" for layer, head in zip(heads["layer"], heads["head"], strict=True))


def heads_by_layer(heads: pd.DataFrame) -> str:
    """A table of heads for reading: `L3: 0 5 7; L4: 2`, layers in order (spaces let a report's cell wrap)."""
    if heads.empty:
        return "-"
    by_layer = heads.sort_values(["layer", "head"]).groupby("layer")["head"]
    return "; ".join(f"L{layer}: {' '.join(str(h) for h in group)}" for layer, group in by_layer)


@dataclass
class Design:
    """A unit's heads on one sample: its sink heads, the controls, the layers after the first sink head."""

    sinks: pd.DataFrame
    controls: list[pd.DataFrame]
    later: list[int]

    @classmethod
    def of(cls, baseline: AnalysisResult, draws: int) -> Design:
        sinks = sink_heads(baseline.per_head)
        if sinks.empty:  # untestable: no runs, and the unit is inconclusive
            return cls(sinks, [], [])
        later = sorted(layer for layer in baseline.per_layer["layer"] if layer > sinks["layer"].min())
        return cls(sinks, [control_heads(baseline.per_head, len(sinks), d) for d in range(draws)], later)

    def interventions(self, full: bool) -> dict[str, tuple[Interventions, pd.DataFrame | None]]:
        """Each run by name (kv0-sinks, kv0-control0, ...; with `full` also ablate-sinks, ablate-sinks-mean,
        ablate-control0, patch-pos0) with the heads it edits (None: every head)."""
        if self.sinks.empty:
            return {}
        controls = dict(enumerate(self.controls))

        def kv0(heads: pd.DataFrame) -> Interventions:
            return Interventions(patch_kv0=PATCH_SOURCE, kv0_heads=head_list(heads))

        runs = {"kv0-sinks": (kv0(self.sinks), self.sinks)}
        runs |= {f"kv0-control{k}": (kv0(c), c) for k, c in controls.items()}
        if full:
            sinks = head_list(self.sinks)
            runs["ablate-sinks"] = (Interventions(ablate_sink_values=sinks), self.sinks)
            runs["ablate-sinks-mean"] = (Interventions(ablate_sink_values=sinks, ablate_mode="mean"), self.sinks)
            # one control draw for the reported value ablation: the deciding patch has them all (the run's cost)
            runs["ablate-control0"] = (Interventions(ablate_sink_values=head_list(self.controls[0])), self.controls[0])
            runs["patch-pos0"] = (Interventions(patch_pos0=PATCH_SOURCE), None)
        return runs


def unit_config(repro: Reproduction, unit: Unit) -> AnalyzeConfig:
    """The unit's analysis: its role's, under its BOS setting (auto: exactly the shared baseline's)."""
    return repro.config(unit.role) if unit.full else repro.config(unit.role, bos=unit.bos)


def baseline_job(repro: Reproduction, unit: Unit, sample: str) -> AnalysisJob:
    """The baseline of a unit in its role's other BOS setting."""
    return repro.job(unit.folder, repro.plan.roles[unit.role].model, unit_config(repro, unit), sample)


def unit_jobs(repro: Reproduction, unit: Unit, design: Design, sample: str) -> dict[str, AnalysisJob]:
    """Every run of the unit on one sample, by name, into OUT/runs/FOLDER-NAME-SAMPLE."""
    config, model = unit_config(repro, unit), repro.plan.roles[unit.role].model
    return {
        name: repro.job(f"{unit.folder}-{name}", model, dataclasses.replace(config, interventions=edit), sample)
        for name, (edit, _) in design.interventions(unit.full).items()
    }


@dataclass
class UnitEvidence:
    """One unit on one sample: its heads, baseline, runs, and the % change of the later layers' resid_all."""

    unit: Unit
    design: Design
    baseline: AnalysisResult
    runs: dict[str, AnalysisResult]

    def change(self, name: str) -> Estimate:
        return percent_change(self.baseline, self.runs[name], "resid_all", self.design.later)

    def rows(self) -> list[dict[str, Any]]:
        return unit_rows(self.unit.label, {name: self.change(name) for name in self.runs})

    def table(self) -> pd.DataFrame:
        """One row per run: the unit, the run, how many heads it edits and which, by layer, the change."""
        records = []
        for name, (_, heads) in self.design.interventions(self.unit.full).items():
            estimate = self.change(name)
            records.append(
                {
                    "unit": self.unit.label,
                    "run": name,
                    "head_count": len(heads) if heads is not None else -1,
                    "heads": heads_by_layer(heads) if heads is not None else "all (h_0 itself)",
                    "change_pct": estimate.value,
                    "lo": estimate.interval[0],
                    "hi": estimate.interval[1],
                }
            )
        return pd.DataFrame(records, columns=["unit", "run", "head_count", "heads", "change_pct", "lo", "hi"])


def unit_rows(label: str, changes: Mapping[str, Estimate]) -> list[dict[str, Any]]:
    """A unit's evidence rows, each named `LABEL: ...`, from the % change under each of its runs by name (none: the
    unit has no sink head and cannot be tested): the path-specific patch of the sink heads and its difference from
    each control decide; the controls, the value ablation and the position-0 patch are reported."""
    if not changes:
        return [fact(f"{label}: sink heads (α₀ > {SINK_THRESHOLD})", 0, False, False, "> 0 to test")]

    def reported(what: str, name: str) -> dict[str, Any]:
        return row(f"{label}: {what}: change", changes[name], -MIN_SINK_LOWERING, "below", "%", deciding=False)

    patch = changes[DECIDING_RUN]
    draws = [k for k in range(len(changes)) if f"kv0-control{k}" in changes]
    rows = [row(f"{label}: {DECIDING_ROW}", patch, -MIN_SINK_LOWERING, "below", "%")]
    for k in draws:
        difference = patch.minus(changes[f"kv0-control{k}"])
        rows += [
            row(f"{label}: K/V patch − control {k}", difference, 0.0, "below", "% points"),
            reported(f"K/V patch of control {k}", f"kv0-control{k}"),
        ]
    if "ablate-sinks" in changes:
        rows += [
            reported("value ablation (zero)", "ablate-sinks"),
            reported("value ablation (mean)", "ablate-sinks-mean"),
            reported("value ablation of control 0", "ablate-control0"),
            reported("position-0 patch", "patch-pos0"),
        ]
    return rows


def measure_units(repro: Reproduction, runs: Mapping[str, SampleRuns]) -> dict[str, dict[str, UnitEvidence]]:
    """Every unit's runs on each sample, by sample and unit label: the other BOS settings' baselines in one wave,
    then every unit's patches and ablations in a second (their heads come from the baselines)."""
    samples = list(runs)
    units = c3_units(repro, runs[samples[0]])
    extra = [(u, s) for s in samples for u in units if not u.full]
    jobs = [baseline_job(repro, u, s) for u, s in extra]
    baselines = dict(zip(extra, repro.run(jobs) if jobs else [], strict=True))
    draws = repro.plan.control_draws
    planned = []
    for s in samples:
        for u in units:
            base = runs[s].by_role()[u.role] if u.full else baselines[(u, s)]
            design = Design.of(base, draws)
            planned.append((u, s, design, base, unit_jobs(repro, u, design, s)))
    results = iter(repro.run([job for *_, jobs in planned for job in jobs.values()]))
    evidence: dict[str, dict[str, UnitEvidence]] = {s: {} for s in samples}
    for u, s, design, base, jobs in planned:
        evidence[s][u.label] = UnitEvidence(u, design, base, {name: next(results) for name in jobs})
    return evidence
