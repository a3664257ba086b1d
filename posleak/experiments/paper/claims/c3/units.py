"""C3's units (docs/method.md §13): each model of C3's roles in each BOS setting its tokenizer allows, the heads
each unit's runs edit, the runs themselves, and their evidence on C3's two questions (`QUESTIONS`).

Every unit chooses its sink heads and their matched controls (`matched_controls`) on a baseline of its own on
the selection sample (posleak.experiments.paper.reproduction.SELECTION), disjoint from the samples A and B that
judge them. On A and B, a unit in its role's own BOS setting reads the shared baseline and runs every C3
intervention; a unit in the other setting runs a baseline of its own and the deciding runs only (the clock
removal and the path-specific patch, each of the sink heads and of each control).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.data.kinds import BosPolicy
from posleak.experiments.batch import AnalysisJob
from posleak.experiments.evidence import Estimate, percent_change
from posleak.experiments.paper.claims.c3.heads import (
    control_pool,
    head_list,
    heads_by_layer,
    matched_controls,
    sink_heads,
)
from posleak.experiments.paper.claims.c3.options import C3Options
from posleak.experiments.paper.models import read_facts
from posleak.experiments.paper.plan import SAMPLES, Plan, RoleName
from posleak.experiments.paper.reproduction import SELECTION, Reproduction, SampleRuns, selection_seqs
from posleak.experiments.paper.requests import SampleNeed
from posleak.experiments.paper.thresholds import BOS_BAND
from posleak.experiments.paper.verdict import evidence_row, fact_row
from posleak.interventions import AblateSinkValues, HoldSinkClock, Interventions, PatchKv0, PatchPos0
from posleak.pipeline import AnalysisResult, AnalyzeConfig

C3_ROLES: tuple[RoleName, ...] = ("standard", "large-base", "sliding")
PATCH_SOURCE = "the"  # the token whose position-0 trajectory is read instead (one token in every tokenizer here)
# %: the least lowering of the later layers' residual-stream magnitude that counts, per question. (a) asks whether
# the sink heads carry the component, so their clock removal must take away a share of it on its own scale, not any
# change beyond noise: a fifth of the squared component (the low edge of the share the paper gives position 0's
# token at early queries, C5's band) is 1 − √0.8 = 10.6% of the magnitude. (b) asks whether the trajectory read
# matters at all: any lowering beyond 1%.
MIN_CLOCK_LOWERING = round(100 * (1 - math.sqrt(1 - BOS_BAND[0] / 100)), 1)
MIN_PATCH_LOWERING = 1.0


@dataclass(frozen=True)
class Question:
    """One of C3's two questions: the edit its runs make (RUN-sinks on the sink heads, RUN-control{k} on each
    control) and how its evidence rows name it, `LABEL: (KEY) WHAT ...`."""

    key: str
    run: str
    what: str
    edit: Callable[[str], Interventions]  # the edit of the heads `L.H,...`
    lowering: float  # %: the least lowering of the edit of the sink heads that counts

    @property
    def deciding(self) -> str:
        """Its main row after the unit's label: the change under the edit of the sink heads."""
        return f"({self.key}) {self.what} of sink heads: change"


QUESTIONS = (
    Question(
        "a",
        "clock",
        "clock removal",  # do sink heads carry position to later queries
        lambda heads: Interventions(HoldSinkClock(heads)),
        MIN_CLOCK_LOWERING,
    ),
    Question(
        "b",
        "kv0",
        "K/V patch",  # does it matter which trajectory they read
        lambda heads: Interventions(PatchKv0(PATCH_SOURCE, heads)),
        MIN_PATCH_LOWERING,
    ),
)


@dataclass(frozen=True)
class Unit:
    """One model of C3's roles in one BOS setting: `bos` is its baseline's --bos (auto: the shared baseline)."""

    role: RoleName
    bos: BosPolicy
    bos_at_0: bool
    label: str  # how evidence rows, tables and claims.json name it
    folder: str  # its run folders' names start with this (then -RUN-SAMPLE)
    reported: bool = False  # also the runs reported, not judged (Design.interventions): own BOS setting, if planned

    @property
    def full(self) -> bool:
        """The role's own BOS setting (its baseline is the shared one), or the other."""
        return self.bos == "auto"


def c3_units(repro: Reproduction) -> list[Unit]:
    """Each C3 role's model in its shared baseline's BOS setting, then in the other where its tokenizer allows
    (off where a BOS stands at position 0; on where the tokenizer has a BOS token it does not prepend) when the
    plan asks for both settings."""
    units, options = [], repro.plan.option(C3Options)
    for role in C3_ROLES:
        spec = repro.plan.roles[role]
        # the shared baseline's --bos auto puts a BOS at 0 where the tokenizer prepends one (data.batches.pos0_token)
        at_0 = repro.model(spec.model).facts.auto_bos
        units.append(Unit(role, "auto", at_0, _label(spec.name, at_0), spec.folder, options.reported))
        if options.both_bos and (at_0 or read_facts(spec.model).has_bos):
            other: BosPolicy = "off" if at_0 else "on"
            units.append(Unit(role, other, not at_0, _label(spec.name, not at_0), f"{spec.folder}-bos{other}"))
    return units


def _label(name: str, bos_at_0: bool) -> str:
    return f"{name} ({'BOS' if bos_at_0 else 'no BOS'} at 0)"


@dataclass
class Design:
    """A unit's heads, chosen on its selection sample: its sink heads, the matched controls of each draw,
    the layers after the first sink head, and how many heads a control could take (`control_pool`)."""

    sinks: pd.DataFrame
    controls: list[pd.DataFrame]
    later: list[int]
    pool: int

    @classmethod
    def of(cls, selection: AnalysisResult, draws: int) -> Design:
        sinks, pool = sink_heads(selection.per_head), len(control_pool(selection.per_head))
        if sinks.empty or pool < len(sinks):  # untestable: no runs, and the unit is left out
            return cls(sinks, [], [], pool)
        later = sorted(layer for layer in selection.per_layer["layer"] if layer > sinks["layer"].min())
        return cls(sinks, [matched_controls(selection.per_head, sinks, d) for d in range(draws)], later, pool)

    def untestable(self) -> str | None:
        """Why the unit cannot test either question (None: it can): no sink head, or fewer heads to match them
        than sink heads (a control of every non-sink head is no matched control, as in C6)."""
        if self.sinks.empty:
            return f"untestable, no sink heads (α₀ > {SINK_THRESHOLD})"
        if self.pool < len(self.sinks):
            return (
                f"untestable, {len(self.sinks)} sink heads (α₀ > {SINK_THRESHOLD}) and only {self.pool} non-sink "
                "heads outside the last layer to match them"
            )
        return None

    def interventions(self, reported: bool) -> dict[str, tuple[Interventions, pd.DataFrame | None]]:
        """Each run by name with the heads it edits (None: every head): per question, RUN-sinks and RUN-control{k}
        (clock-sinks, clock-control0, ..., kv0-sinks, kv0-control0, ...); with `reported` also the runs reported,
        not judged: ablate-sinks, ablate-sinks-mean, ablate-control0, patch-pos0."""
        if self.untestable() is not None:
            return {}
        runs = {}
        for question in QUESTIONS:
            runs[f"{question.run}-sinks"] = (question.edit(head_list(self.sinks)), self.sinks)
            runs |= {
                f"{question.run}-control{k}": (question.edit(head_list(c)), c) for k, c in enumerate(self.controls)
            }
        if reported:
            sinks = head_list(self.sinks)
            runs["ablate-sinks"] = (Interventions(AblateSinkValues(sinks)), self.sinks)
            runs["ablate-sinks-mean"] = (Interventions(AblateSinkValues(sinks, "mean")), self.sinks)
            # one control draw for the reported value ablation: the deciding runs have them all (the run's cost)
            runs["ablate-control0"] = (Interventions(AblateSinkValues(head_list(self.controls[0]))), self.controls[0])
            runs["patch-pos0"] = (Interventions(PatchPos0(PATCH_SOURCE)), None)
        return runs


def unit_needs(plan: Plan) -> list[SampleNeed]:
    """The draws of C3's units: each role's baseline on the selection sample at the plan's sink_seq_len (C6 chooses
    its heads on the same runs), and, where the plan runs C3 in both BOS settings, each without a BOS (a window of T
    content tokens, the longer)."""
    needs = []
    for role in C3_ROLES:
        seq_len, num_seqs = plan.size(role)
        selection, sink_t, fix = selection_seqs(num_seqs), plan.sink_seq_len, f"the {role} role's num_seqs or seq_len"
        what = f"C3's and C6's selection of the {role} model's sink heads"
        needs.append(SampleNeed(what, role, sink_t, selection, "auto", (SELECTION,), fix))
        if plan.option(C3Options).both_bos:
            what = f"C3's {role} model without a BOS"
            needs.append(SampleNeed(what, role, seq_len, num_seqs, "off", SAMPLES, fix))
            needs.append(SampleNeed(what, role, sink_t, selection, "off", (SELECTION,), fix))
    return needs


def unit_analyses(plan: Plan) -> int:
    """C3's analyses on one corpus where every unit can test C3 (sink heads, and as many non-sink heads outside the
    last layer to match them: `Design.untestable`): on each sample each unit's runs (`Design.interventions`), and
    each unit's baseline on the selection sample. A plan that also runs C3 in each model's other BOS setting
    (`c3_both_bos`) adds units as each model's tokenizer allows: it is refused."""
    if plan.option(C3Options).both_bos:
        raise ValueError(f"plan {plan.name!r} runs C3 in the other BOS setting where a tokenizer allows: not counted")
    head = pd.DataFrame({"layer": [0], "head": [0]})
    design = Design(head, [head] * plan.option(C3Options).control_draws, [0], pool=1)
    per_unit = len(design.interventions(plan.option(C3Options).reported))
    return len(SAMPLES) * len(C3_ROLES) * per_unit + len(C3_ROLES)


def unit_config(repro: Reproduction, unit: Unit) -> AnalyzeConfig:
    """The unit's analysis: its role's, under its BOS setting (auto: exactly the shared baseline's)."""
    return repro.config(unit.role) if unit.full else repro.config(unit.role, bos=unit.bos)


def baseline_job(repro: Reproduction, unit: Unit, sample: str) -> AnalysisJob:
    """The baseline of a unit on `sample`: on the selection sample (at the plan's sink_seq_len, where every claim
    chooses its sink heads), or on A or B in its role's other BOS setting."""
    config = unit_config(repro, unit)
    if sample == SELECTION:
        config = config.replace(seq_len=repro.plan.sink_seq_len)
    return repro.job(unit.folder, repro.plan.roles[unit.role].model, config, sample)


def unit_jobs(repro: Reproduction, unit: Unit, design: Design, sample: str) -> dict[str, AnalysisJob]:
    """Every run of the unit on one sample, by name, into OUT/runs/FOLDER-NAME-SAMPLE."""
    config, model = unit_config(repro, unit), repro.plan.roles[unit.role].model
    return {
        name: repro.job(f"{unit.folder}-{name}", model, dataclasses.replace(config, interventions=edit), sample)
        for name, (edit, _) in design.interventions(unit.reported).items()
    }


@dataclass
class UnitEvidence:
    """One unit on one sample: its heads and the selection baseline that chose them, its baseline and runs on the
    sample, and the % change of the later layers' resid_all."""

    unit: Unit
    design: Design
    selection: AnalysisResult
    baseline: AnalysisResult
    runs: dict[str, AnalysisResult]

    def change(self, name: str) -> Estimate:
        return percent_change(self.baseline, self.runs[name], "resid_all", self.design.later)

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        changes = {name: self.change(name) for name in self.runs}
        return unit_rows(self.unit.label, changes, self.design.untestable())

    def table(self) -> pd.DataFrame:
        """One row per run: the unit, the run, how many heads it edits and which, by layer, the change."""
        records = []
        for name, (_, heads) in self.design.interventions(self.unit.reported).items():
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


def unit_rows(
    label: str, changes: Mapping[str, Estimate], untestable: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """A unit's evidence rows by question key, each named `LABEL: ...`, from the % change under each of its runs
    by name; a unit that cannot test either question (`untestable`: why, `Design.untestable`) gets one row each
    that says so and decides nothing. Per question, the edit of the sink heads and
    its difference from each control decide, the controls' own changes are reported; the value ablation and the
    position-0 patch are reported with (b), whose question of what is read at key 0 they widen."""
    if untestable is not None:  # reported, deciding nothing: the unit is left out of each question (c3.over_units)
        return {
            q.key: [fact_row(f"{label}: ({q.key}) {untestable}", 0, False, False, "a matched control", deciding=False)]
            for q in QUESTIONS
        }
    rows = {q.key: question_rows(label, q, changes) for q in QUESTIONS}
    if "ablate-sinks" in changes:
        rows["b"] += [
            _reported(f"{label}: {what}: change", changes[name], MIN_PATCH_LOWERING)
            for what, name in (
                ("value ablation (zero)", "ablate-sinks"),
                ("value ablation (mean)", "ablate-sinks-mean"),
                ("value ablation of control 0", "ablate-control0"),
                ("position-0 patch", "patch-pos0"),
            )
        ]
    return rows


def question_rows(label: str, question: Question, changes: Mapping[str, Estimate]) -> list[dict[str, Any]]:
    """One question's rows of a unit: its edit of the sink heads below −`question.lowering`%, and below the same edit
    of each control (paired difference below 0); each control's own change, reported."""
    name = f"{label}: ({question.key}) {question.what}"
    sinks = changes[f"{question.run}-sinks"]
    rows = [evidence_row(f"{label}: {question.deciding}", sinks, -question.lowering, "below", "%")]
    for k in range(len(changes)):
        if (control := changes.get(f"{question.run}-control{k}")) is not None:
            rows += [
                evidence_row(f"{name} − control {k}", sinks.minus(control), 0.0, "below", "% points"),
                _reported(f"{name} of control {k}: change", control, question.lowering),
            ]
    return rows


def _reported(evidence: str, change: Estimate, lowering: float) -> dict[str, Any]:
    return evidence_row(evidence, change, -lowering, "below", "%", deciding=False)


@dataclass(frozen=True)
class Selected:
    """A unit with its baseline on the selection sample and the heads that baseline chose."""

    unit: Unit
    selection: AnalysisResult
    design: Design


def select_units(repro: Reproduction) -> list[Selected]:
    """Every unit's baseline on the selection sample and the heads it chose, in one wave before the shared
    analyses: which units can test C3, and so which shared baselines C3 compares its runs with, follows from them."""
    units = c3_units(repro)
    results = repro.run([baseline_job(repro, u, SELECTION) for u in units])
    draws = repro.plan.option(C3Options).control_draws
    return [Selected(u, r, Design.of(r, draws)) for u, r in zip(units, results, strict=True)]


def measure_units(
    repro: Reproduction, runs: Mapping[str, SampleRuns], selected: list[Selected]
) -> dict[str, dict[str, UnitEvidence]]:
    """Every unit's runs on each sample, by sample and unit label: in a first wave each unit's baseline in the other
    BOS settings on each sample; then every unit's runs on each sample, with the heads its selection baseline
    chose (`select_units`)."""
    samples = list(runs)
    other = [(s.unit, sample) for sample in samples for s in selected if not s.unit.full]
    baselines = dict(zip(other, repro.run([baseline_job(repro, u, sample) for u, sample in other]), strict=True))
    planned = []
    for sample in samples:
        for s in selected:
            base = runs[sample].by_role()[s.unit.role] if s.unit.full else baselines[(s.unit, sample)]
            planned.append((s, sample, base, unit_jobs(repro, s.unit, s.design, sample)))
    results = iter(repro.run([job for *_, jobs in planned for job in jobs.values()]))
    evidence: dict[str, dict[str, UnitEvidence]] = {sample: {} for sample in samples}
    for s, sample, base, jobs in planned:
        runs_of = {name: next(results) for name in jobs}
        evidence[sample][s.unit.label] = UnitEvidence(s.unit, s.design, s.selection, base, runs_of)
    return evidence
