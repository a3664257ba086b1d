"""C3: position 0 is a closed system; later queries read its trajectory through sink-reading heads.

Judged on every model of C3's roles in each BOS setting its tokenizer allows (the units of c3_units.py), after
the shared baselines (each unit's heads come from its baseline's per-head table): the path-specific patch of
the sink heads' position-0 key and value decides each unit, and the units decide the claim (docs/method.md §13).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.experiments.paper.c3_units import (
    C3_ROLES,
    DECIDING_ROW,
    MIN_SINK_LOWERING,
    PATCH_SOURCE,
    UnitEvidence,
    measure_units,
)
from posleak.experiments.paper.claim import ClaimModule, quote, rounded
from posleak.experiments.paper.plan import SHOWN
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.experiments.paper.verdict import HOLM, Judgement, fact, judge
from posleak.pipeline import AnalysisResult
from posleak.report import figures
from posleak.report.html import TableBlock, Verdict

CLOSED_HOLDS, CLOSED_FAILS = 1e-6, 1e-3  # largest relative spread of h_0: the closed system holds, fails


def _exponent(value: float) -> str:
    """1e-06 written as 1e-6, the criterion's prose."""
    return f"{value:.0e}".replace("e-0", "e-")


C3_CRITERION = (
    f"Position 0 is a closed system in every run (h_0 identical across inputs sharing its token: relative spread "
    f"≤ {_exponent(CLOSED_HOLDS)}; above {_exponent(CLOSED_FAILS)} it fails). Per unit (each model of the standard, "
    "large-base and sliding roles, with its BOS setting and, where the tokenizer allows, the other one): the "
    f"position-0 key and value of all sink heads (α₀ > {SINK_THRESHOLD}) taken from the trajectory of "
    f"{PATCH_SOURCE!r} lowers the mean residual-stream magnitude (all queries) of the layers after the first sink "
    f"head by more than {MIN_SINK_LOWERING:g}% (95% interval below −{MIN_SINK_LOWERING:g}%), and by more than the "
    "same patch in each control of as many randomly drawn non-sink heads (paired difference, interval below 0); "
    f"not consistent where the interval lies above −{MIN_SINK_LOWERING:g}% or a control lowers it more. The claim: "
    "not consistent if the closed system fails; consistent when every unit is; not consistent when more than half "
    "of the units are not; inconclusive otherwise. The value ablation (zero, mean) with its controls and the patch "
    "of the whole position-0 trajectory are reported beside it, not judged."
)


def claim_c3(closed: Mapping[str, float], units: Mapping[str, list[dict[str, Any]]]) -> Judgement:
    """`closed`: the largest relative spread of h_0 per run (0 when identical); `units`: each unit's evidence
    rows by label (UnitEvidence.rows). The claim's verdict from the units' verdicts (docs/method.md §13)."""
    spread = max(closed.values())
    closed_row = fact(
        "closed system: largest relative spread of h_0",
        spread,
        spread <= CLOSED_HOLDS,
        spread > CLOSED_FAILS,
        f"≤ {CLOSED_HOLDS:g}",
    )
    judged = {label: judge(rows) for label, rows in units.items()}
    verdicts = {label: judgement.verdict for label, judgement in judged.items()}
    against = sum(v == "not consistent" for v in verdicts.values())
    verdict: Verdict
    if closed_row["says"] == "contradicts" or 2 * against > len(verdicts):
        verdict = "not consistent"
    elif closed_row["says"] == "supports" and all(v == "consistent" for v in verdicts.values()):
        verdict = "consistent"
    else:
        verdict = "inconclusive"
    evidence = [judge([closed_row]).evidence, *(judgement.evidence for judgement in judged.values())]
    return Judgement(verdict, pd.concat(evidence, ignore_index=True))


def unit_verdicts(units: Mapping[str, list[dict[str, Any]]]) -> dict[str, Verdict]:
    """Each unit's own verdict: every deciding row of it supports, any contradicts (Holm's rule within the unit),
    or neither."""
    return {label: judge(rows).verdict for label, rows in units.items()}


class C3(ClaimModule):
    name = "C3"
    statement = "Position 0 is a closed system; later queries read its trajectory through sink-reading heads."
    roles = C3_ROLES
    criterion = C3_CRITERION
    family_wise = f"{HOLM}, within each unit; the units combine as the criterion says"
    method = (
        "h_0^(l) compared across inputs sharing the token at position 0, in every run. Per unit (a model of the "
        "standard, large-base or sliding role in one BOS setting): the key and value at key 0 that the sink heads "
        f"show their queries i ≥ 1 replaced by those of {PATCH_SOURCE!r}'s own position-0 trajectory, and the same in "
        "as many random non-sink heads in each control; in each role's own BOS setting also the value at key 0 of "
        "the sink heads zeroed and replaced by the mean value, the same zeroing in the controls, and position 0's "
        "whole trajectory replaced by that of another token (docs/method.md §9, §13)."
    )

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """Every unit's baselines, patches and ablations, on both samples."""
        self.evidence = measure_units(self.repro, runs)

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        results = [*runs.all(), *(r for u in self.evidence[sample].values() for r in (u.baseline, *u.runs.values()))]
        closed = {
            str(r.run.path if r.run else i): float(r.manifest["closed_system"]["max_rel_spread"])
            for i, r in enumerate(results)
        }
        return claim_c3(closed, {label: u.rows() for label, u in self.evidence[sample].items()})

    def numbers(self, sample: str) -> dict[str, Any]:
        """Per unit: its model, BOS setting, verdict, sink heads and later layers."""
        units = self.evidence[sample]
        verdicts = unit_verdicts({label: u.rows() for label, u in units.items()})
        return {
            "units": {
                label: {
                    "role": u.unit.role,
                    "model": self.repro.plan.roles[u.unit.role].model,
                    "bos": u.unit.bos,  # its baseline's --bos: auto (the role's shared baseline), on or off
                    "bos_at_0": u.unit.bos_at_0,
                    "verdict": verdicts[label],
                    "sink_heads": len(u.design.sinks),
                    "later_layers": u.design.later,
                    "baseline": u.baseline.run.path.name if u.baseline.run else None,  # its folder under runs/
                    "runs": {name: r.run.path.name if r.run else None for name, r in u.runs.items()},
                }
                for label, u in units.items()
            }
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
        changes = "; ".join(
            f"{label}, {len(u.design.sinks)} sink heads: {quote(judgement, f'{label}: {DECIDING_ROW}')}"
            for label, u in units.items()
            if u.runs
        )
        return (
            "The paper finds later queries reading position 0 through sink heads; here the sink heads' position-0 key "
            f"and value from {PATCH_SOURCE!r} change the later layers' residual-stream magnitude by: {changes}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        """One figure per unit in its role's own BOS setting: resid_all by layer under each run of sample A."""
        paths = []
        for u in self.evidence[SHOWN].values():
            if not (u.unit.full and u.runs):
                continue
            names = ("kv0-sinks", "kv0-control0", "ablate-sinks", "ablate-sinks-mean", "patch-pos0")
            lines = {"baseline": u.baseline.per_layer} | {n: u.runs[n].per_layer for n in names if n in u.runs}
            title = f"{u.unit.label}: resid_all under the C3 runs (sample {SHOWN})"
            path = self.repro.out.figure_path(f"c3_{u.unit.folder}")
            paths.append(figures.lines_by_run(lines, "resid_all", path, title=title, ylabel="resid_all (nats)"))
        return paths


SIDE_BY_SIDE_CAPTION = (
    "Each unit's change of the later layers' mean residual-stream magnitude, % (95% interval), under: the K/V patch "
    f"of the sink heads from {PATCH_SOURCE!r} (deciding) and of control draw 0, the value at key 0 zeroed and replaced "
    "by the mean value in the sink heads, zeroed in control 0, and h_0 itself patched; - where a unit does not run it."
)


def side_by_side(units: Mapping[str, UnitEvidence], numbers: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per unit: its verdict, sink heads, and each run's change with its interval, as text ("-": not run)."""
    columns = {
        "kv0-sinks": "K/V patch, sinks (%)",
        "kv0-control0": "K/V patch, control 0 (%)",
        "ablate-sinks": "value zeroed (%)",
        "ablate-sinks-mean": "value mean (%)",
        "ablate-control0": "value zeroed, control 0 (%)",
        "patch-pos0": "h_0 patched (%)",
    }
    records = []
    for label, u in units.items():
        record: dict[str, Any] = {
            "unit": label,
            "verdict": numbers[label]["verdict"],
            "sink heads": len(u.design.sinks),
        }
        for name, column in columns.items():
            if name in u.runs:
                e = u.change(name)
                record[column] = f"{e.value:.3g} ({e.interval[0]:.3g} to {e.interval[1]:.3g})"
            else:
                record[column] = "-"
        records.append(record)
    return pd.DataFrame(records)
