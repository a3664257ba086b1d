"""C3: position 0 is a closed system; later queries read its trajectory through sink-reading heads.

Judged on every model of C3's roles in each BOS setting its tokenizer allows (the units of units.py), each with
its sink heads and their matched controls chosen on a selection sample that judges nothing, as two questions
(docs/method.md §13): (a) do the sink heads carry position to later queries (their clock removed), which with the
closed system decides the claim; (b) does it matter which trajectory they read (their position-0 key and value
patched from another token's), which is judged in its own right.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.capture.query_stats import SINK_THRESHOLD
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
from posleak.experiments.paper.claims.c3.units import (
    C3_ROLES,
    MIN_CLOCK_LOWERING,
    MIN_PATCH_LOWERING,
    PATCH_SOURCE,
    QUESTIONS,
    UnitEvidence,
    measure_units,
    select_units,
    unit_analyses,
    unit_needs,
)
from posleak.experiments.paper.plan import SHOWN, Plan, RoleName
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.experiments.paper.requests import SampleNeed
from posleak.experiments.paper.verdict import HOLM, Judgement, Revision, fact_row, judge
from posleak.pipeline import AnalysisResult
from posleak.report import figures
from posleak.report.html import TableBlock, Verdict

CLOSED_HOLDS, CLOSED_FAILS = 1e-6, 1e-3  # largest relative spread of h_0: the closed system holds, fails
CLAIM_QUESTION = "a"  # the question that decides the claim with the closed system; (b) is judged in its own right


def _exponent(value: float) -> str:
    """1e-06 written as 1e-6, the criterion's prose."""
    return f"{value:.0e}".replace("e-0", "e-")


C3_CRITERION = (
    f"Position 0 is a closed system in every run (h_0 identical across inputs sharing its token: relative spread "
    f"≤ {_exponent(CLOSED_HOLDS)}; above {_exponent(CLOSED_FAILS)} it fails). Per unit (each model of the standard, "
    "large-base and sliding roles, with its BOS setting and, where the tokenizer allows, the other one), with its "
    f"sink heads (α₀ > {SINK_THRESHOLD} at the plan's sink_seq_len, T = 256, as for every claim) and, per control "
    "draw, for each sink head a non-sink head of the same "
    "layer (of the nearest where a layer has too few) matched on its clock (the key-0 column of w, "
    "resid_all_key0, nearest the sink head's), chosen on a selection sample disjoint from the judging ones, two "
    "questions, each judged alone: (a) the clock removal of "
    "the sink heads (each head's weight on key 0 held at its mean over queries, the rest renormalised) and (b) the "
    f"position-0 key and value of the sink heads taken from the trajectory of {PATCH_SOURCE!r} each lower the mean "
    "residual-stream magnitude (all queries) of the layers after the first sink head, (a) by more than "
    f"{MIN_CLOCK_LOWERING:g}% (a fifth of its square: the sink heads must carry a share of the component, the "
    f"low edge of C5's band, not merely move it) and (b) by more than {MIN_PATCH_LOWERING:g}% (95% interval below "
    "that), and by more than the same edit of each "
    "control (paired difference, interval below 0); not consistent where the interval lies above "
    "that threshold or a control lowers it more. A question over the units: consistent when every unit "
    "is; not consistent when more than half of the units are not; inconclusive otherwise; a unit without sink "
    "heads, or with fewer non-sink heads outside the last layer than sink heads (no matched control, as in C6), "
    "cannot test either question and is left out, reported as untestable (with no unit left, inconclusive). "
    "The claim: not "
    "consistent if the closed system fails or question (a) is not consistent; consistent when the closed system "
    "holds and (a) is consistent; inconclusive otherwise. Question (b), whether the content of the trajectory "
    "matters, has its own verdict beside the claim's and does not enter it. The value ablation (zero, mean) with a "
    "control and the patch of the whole position-0 trajectory are reported, not judged (the full plan runs them)."
)

UnitRows = Mapping[str, Mapping[str, list[dict[str, Any]]]]  # per unit label, its rows by question key


UNTESTABLE = "untestable"  # a unit's verdict on a question it cannot test (no sink heads): it decides nothing


def over_units(verdicts: Iterable[Verdict | str]) -> Verdict:
    """A question's verdict from its units' (UNTESTABLE ones left out): consistent when every unit that can test
    it is, not consistent when more than half of them are not, inconclusive otherwise, and when none can."""
    tested = [v for v in verdicts if v != UNTESTABLE]
    if 2 * sum(v == "not consistent" for v in tested) > len(tested):
        return "not consistent"
    return "consistent" if tested and all(v == "consistent" for v in tested) else "inconclusive"


def unit_verdict(rows: list[dict[str, Any]]) -> Verdict | str:
    """One unit's verdict on one question from its rows alone (Holm's rule within them); UNTESTABLE where no row
    decides."""
    return judge(rows).verdict if any(r["deciding"] for r in rows) else UNTESTABLE


def question_verdicts(units: UnitRows) -> dict[str, dict[str, Verdict | str]]:
    """Per unit label, each question's verdict from its rows alone (`unit_verdict`)."""
    return {label: {q: unit_verdict(rows) for q, rows in by_question.items()} for label, by_question in units.items()}


def claim_c3(closed: Mapping[str, float], units: UnitRows) -> Judgement:
    """`closed`: the largest relative spread of h_0 per run (0 when identical); `units`: each unit's evidence
    rows by question (UnitEvidence.rows). The claim's verdict from the closed system and question (a) over the
    units (docs/method.md §13); question (b)'s rows read as reported in the claim's evidence: they decide (b)
    (`question_verdicts`, `over_units`), not the claim."""
    spread = max(closed.values())
    closed_row = fact_row(
        "closed system: largest relative spread of h_0",
        spread,
        spread <= CLOSED_HOLDS,
        spread > CLOSED_FAILS,
        f"≤ {CLOSED_HOLDS:g}",
    )
    judged = {label: {q: judge(rows) for q, rows in by_question.items()} for label, by_question in units.items()}
    deciding = over_units(verdicts[CLAIM_QUESTION] for verdicts in question_verdicts(units).values())
    verdict: Verdict
    if closed_row["says"] == "contradicts" or deciding == "not consistent":
        verdict = "not consistent"
    elif closed_row["says"] == "supports" and deciding == "consistent":
        verdict = "consistent"
    else:
        verdict = "inconclusive"
    parts = [judge([closed_row])]
    for by_question in judged.values():
        parts += [
            Judgement(j.verdict, j.evidence.assign(deciding=j.evidence["deciding"] & (q == CLAIM_QUESTION)), j.judged)
            for q, j in by_question.items()
        ]
    evidence = pd.concat([part.evidence for part in parts], ignore_index=True)
    return Judgement(verdict, evidence, [judged_row for part in parts for judged_row in part.judged])


class C3(ClaimModule):
    name = "C3"
    statement = "Position 0 is a closed system; later queries read its trajectory through sink-reading heads."
    roles = C3_ROLES
    words = (PATCH_SOURCE,)
    criterion = C3_CRITERION
    revisions = (
        REPLICATED,
        Revision(
            "2026-12-01",
            "the value at key 0 of all sink heads (α₀ > 0.3) ablated jointly must lower the later layers' "
            "residual-stream magnitude by more than 1% and by more than each control of as many random non-sink "
            "heads (before: one sink head's ablation lowering it at all sufficed, which the run of 2026-11-30 met "
            "with one head of four while three raised it)",
        ),
        Revision(
            "2026-12-02",
            "judged per unit (each model of the standard, large-base and sliding roles, in each BOS setting the "
            "tokenizer allows), decided by the path-specific patch of the sink heads' position-0 key and value "
            "against the same patch in controls, the value ablation reported: the ablation had run on "
            "smollm2-135m alone and also removes the sink's no-op role; the units combine as consistent when "
            "every unit is, not consistent when more than half are not",
        ),
        ROWS_ESTIMAND,
        HOLM_RULE,
        Revision(
            "2026-12-04",
            "two questions: (a) the clock removal of the sink heads decides the claim, (b) the patch has a "
            "verdict of its own outside it; controls matched by layer; heads chosen on a selection sample that "
            "judges nothing: a sink's clock survives the patch, so its 'no change' did not speak against sinks "
            "carrying position, the controls had come from any layer, and the heads had been chosen on the sample "
            "that judged them",
        ),
        BY_DOCUMENT,
        ACROSS_CORPORA,
        Revision(
            "2026-12-05",
            "controls matched on what the clock removal takes away, each sink head's the non-sink head of its "
            "layer with the nearest clock (resid_all_key0 on the selection sample), not drawn at random in the "
            "layer: a random control's clock removal raised smollm2-135m's later layers' component by 24–27%, so "
            "'sinks lower it more than the control' could pass because the control disrupts; a unit without sink "
            "heads is reported as untestable and left out of the questions (none left: inconclusive), where it "
            "had counted as inconclusive, so that C3 could not come out consistent wherever a model has no sink "
            "head in one BOS setting; sink heads chosen at one T, the plan's sink_seq_len (256), not at each "
            "unit's own (gemma3-270m: 640), since α₀ falls with T",
        ),
        Revision(
            "2026-12-06",
            "a unit with fewer non-sink heads outside the last layer than sink heads is untestable, as C6 has "
            "it, where its control had been every non-sink head: such a control is matched on nothing, and "
            "smollm2-135m's (119 heads for 142 sink heads, mean clock 0.46 against the sinks' 0.75) raised its "
            "later layers' component by 27%, so its 'sinks lower it more than the control' passed because the "
            "control disrupts",
        ),
        Revision(
            "2026-12-06",
            f"question (a) judged on the component's own scale: the clock removal of the sink heads must lower the "
            f"later layers' magnitude by more than {MIN_CLOCK_LOWERING:g}% (a fifth of the squared component, the "
            "low edge of C5's band), where it had to lower it by more than 1%: a removal that leaves 96% of the "
            "component (smollm2-135m's −4% in the full plan of 2026-12-05) does not show that sink heads carry "
            "it; (b), whether the trajectory read matters at all, keeps 1%",
        ),
    )
    family_wise = f"{HOLM}, within each unit and question; the units and questions combine as the criterion says"
    method = (
        "h_0^(l) compared across inputs sharing the token at position 0, in every run. Per unit (a model of the "
        "standard, large-base or sliding role in one BOS setting): its sink heads, and per control draw as many "
        "non-sink heads of the same layers matched on their clock (resid_all_key0), chosen on a baseline of the "
        "unit on a third sample of sequences, "
        "disjoint from A and B. (a) In the sink heads, and in each control, the weight that each query i ≥ 1 gives "
        "key 0 held at its mean over the queries, the other keys' weights renormalised (the clock removed); (b) the "
        f"key and value at key 0 that those heads show their queries i ≥ 1 replaced by those of {PATCH_SOURCE!r}'s "
        "own position-0 trajectory. In each role's own BOS setting also the value at key 0 of the sink heads zeroed "
        "and replaced by the mean value, the zeroing in control 0, and position 0's whole trajectory replaced by "
        "that of another token (docs/method.md §9, §13)."
    )

    @classmethod
    def sample_needs(cls, plan: Plan) -> list[SampleNeed]:
        return unit_needs(plan)

    @classmethod
    def own_analyses(cls, plan: Plan) -> int:
        return unit_analyses(plan)

    def before_shared(self) -> None:
        """Every unit's baseline on the selection sample, and the heads it chose."""
        self.selected = select_units(self.repro)

    def compared_roles(self) -> frozenset[RoleName]:
        """The roles whose shared baseline a unit that can test C3 compares its runs with."""
        return frozenset(s.unit.role for s in self.selected if s.unit.full and s.design.untestable() is None)

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """Every unit's baselines in the other BOS setting, clock removals, patches and ablations on both samples."""
        self.evidence = measure_units(self.repro, runs, self.selected)

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        units = self.evidence[sample].values()
        results = [*runs.all(), *(r for u in units for r in (u.selection, u.baseline, *u.runs.values()))]
        closed = {
            str(r.run.path if r.run else i): float(r.manifest["closed_system"]["max_rel_spread"])
            for i, r in enumerate(results)
        }
        return claim_c3(closed, {label: u.rows() for label, u in self.evidence[sample].items()})

    def numbers(self, sample: str) -> dict[str, Any]:
        """Each question's verdict over the units; per unit: its model, BOS setting, each question's verdict, sink
        heads, later layers, and the run folders (under runs/) of its selection baseline, baseline and runs."""
        units = self.evidence[sample]
        verdicts = question_verdicts({label: u.rows() for label, u in units.items()})
        return {
            "questions": {q.key: over_units(v[q.key] for v in verdicts.values()) for q in QUESTIONS},
            "untestable": {label: why for label, u in units.items() if (why := u.design.untestable())},  # left out
            "units": {
                label: {
                    "role": u.unit.role,
                    "model": self.repro.plan.roles[u.unit.role].model,
                    "bos": u.unit.bos,  # its baseline's --bos: auto (the role's shared baseline), on or off
                    "bos_at_0": u.unit.bos_at_0,
                    "questions": verdicts[label],
                    "sink_heads": len(u.design.sinks),
                    "later_layers": u.design.later,
                    "selection": _folder(u.selection),  # the sample that chose the heads, not this one
                    "baseline": _folder(u.baseline),
                    "runs": {name: _folder(r) for name, r in u.runs.items()},
                }
                for label, u in units.items()
            },
        }

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        units = self.evidence[sample]
        table = pd.concat([u.table() for u in units.values()], ignore_index=True)
        self.repro.out.write_table(f"sink_ablation_{sample}", table)
        side = side_by_side(units, self.numbers(sample)["units"])
        self.repro.out.write_table(f"c3_units_{sample}", side)
        return [
            TableBlock(
                f"C3 by model (sample {sample})",
                side,
                caption=SIDE_BY_SIDE_CAPTION,
                source=f"c3_units_{sample}.parquet",
                wrap=tuple(side.columns),  # nine columns of text: each may break to fit the page
            ),
            TableBlock(
                f"Sink-head ablation and controls (sample {sample})",
                rounded(table),
                source=f"sink_ablation_{sample}.parquet",
                wrap=("heads",),
            ),
        ]

    def interventions(self, runs: SampleRuns, sample: str) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
        return {
            f"{label}: {name}": (u.baseline, run)
            for label, u in self.evidence[sample].items()
            for name, run in u.runs.items()
        }

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        units = self.evidence[SHOWN]
        changes = {
            q.key: "; ".join(
                f"{label}, {len(u.design.sinks)} sink heads: {evidence_text(judgement, f'{label}: {q.deciding}')}"
                for label, u in units.items()
                if u.runs
            )
            for q in QUESTIONS
        }
        return (
            "The paper finds later queries reading position 0 through sink heads; here removing the sink heads' clock "
            f"changes the later layers' residual-stream magnitude by: {changes['a']}; their position-0 key and value "
            f"from {PATCH_SOURCE!r} change it by: {changes['b']}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        """One figure per unit in its role's own BOS setting: resid_all by layer under each run of sample A."""
        paths = []
        for u in self.evidence[SHOWN].values():
            if not (u.unit.full and u.runs):
                continue
            names = ("clock-sinks", "clock-control0", "kv0-sinks", "kv0-control0", "ablate-sinks", "patch-pos0")
            lines = {"baseline": u.baseline.per_layer} | {n: u.runs[n].per_layer for n in names if n in u.runs}
            title = f"{u.unit.label}: resid_all under the C3 runs (sample {SHOWN})"
            path = self.repro.out.figure_path(f"c3_{u.unit.folder}")
            paths.append(figures.lines_by_run(lines, "resid_all", path, title=title, ylabel="resid_all (nats)"))
        return paths


def _folder(result: AnalysisResult) -> str | None:
    """A run's folder under runs/ (None: a result without one)."""
    return result.run.path.name if result.run else None


SIDE_BY_SIDE_CAPTION = (
    "Each unit's verdict on each question and its change of the later layers' mean residual-stream magnitude, % "
    "(95% interval), under: the clock removal of the sink heads (deciding (a)) and of control draw 0, the K/V patch "
    f"of the sink heads from {PATCH_SOURCE!r} (deciding (b)) and of control 0, and the value at key 0 zeroed in the "
    "sink heads; - where a unit does not run it. The table of runs below has every run."
)
# run → column: nine columns in all, as many as the page holds (the other runs are in the table of runs)
SIDE_BY_SIDE = {
    "clock-sinks": "clock removed, sinks (%)",
    "clock-control0": "clock removed, control 0 (%)",
    "kv0-sinks": "K/V patch, sinks (%)",
    "kv0-control0": "K/V patch, control 0 (%)",
    "ablate-sinks": "value zeroed (%)",
}


def side_by_side(units: Mapping[str, UnitEvidence], numbers: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per unit: its verdict on each question, sink heads, and each run's change with its interval, as
    text ("-": not run)."""
    records = []
    for label, u in units.items():
        record: dict[str, Any] = {"unit": label}
        record |= {f"({q}) verdict": verdict for q, verdict in numbers[label]["questions"].items()}
        record["sink heads"] = len(u.design.sinks)
        for name, column in SIDE_BY_SIDE.items():
            if name in u.runs:
                e = u.change(name)
                record[column] = f"{e.value:.3g} ({e.interval[0]:.3g} to {e.interval[1]:.3g})"
            else:
                record[column] = "-"
        records.append(record)
    return pd.DataFrame(records)
