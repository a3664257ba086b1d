"""What `posleak paper` writes at the top of its folder: claims.json, the manifest and report.html."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pandas as pd

from posleak.experiments.paper.plan import SHOWN
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Claim, Judgement
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.store import write_json


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


def section(claim: Claim, provisional: str) -> Section:
    """A claim's section of report.html: what was measured, the criterion, the paper's effect, the verdict."""
    verdicts = "; ".join(f"sample {s}: {j.verdict}" for s, j in claim.samples.items())
    return Section(
        f"{claim.claim}: {claim.statement}",
        f"**Measured.** {claim.method}\n\n**Criterion (declared before the data).** {claim.criterion}\n\n"
        f"**Against the paper.** {claim.paper}\n\n**Verdict.** {verdicts}"
        f" → **{claim.verdict}** (consistent or not consistent only where both samples agree).{provisional}",
        figures=[FigureBlock(p) for p in claim.figures],
        tables=[
            *(TableBlock(f"Evidence, sample {s}", evidence_table(j), max_rows=None) for s, j in claim.samples.items()),
            *claim.tables,
        ],
        verdict=claim.verdict,
    )


def models_section(repro: Reproduction, runs: SampleRuns) -> Section:
    """Which model played each role, at what size, with the weights' hash its baseline analysis recorded."""
    models = runs.models()
    table = pd.DataFrame(
        [
            {
                "role": role,
                "model": used["spec"],
                "T": repro.plan.size(role)[0],
                "N per sample": repro.plan.size(role)[1],
                "weights SHA-256": used["sha256"],
            }
            for role, used in models.items()
        ]
    )
    text = "The model of each role the claims read (`posleak paper --models`, `--plan`; docs/method.md §13)."
    return Section("Models", text, tables=[TableBlock("Models by role", table, max_rows=None)])


def write_outputs(repro: Reproduction, claims: Sequence[Claim], runs: Mapping[str, SampleRuns]) -> None:
    """claims.json, then report.html and the manifest (every shared run folder, the plan, the verdicts)."""
    out = repro.out
    write_json(out.path / "claims.json", [c.to_json() for c in claims], default=float)  # a missing interval: null
    folders = {key: str(r.run.path) for sample in runs.values() for key, r in sample.named() if r.run}
    manifest = {
        "status": "complete",
        "model": {"id": "paper reproduction"},
        "plan": dataclasses.asdict(repro.plan),
        "runs": folders,
        "models": runs[SHOWN].models(),
        "verdicts": {c.claim: c.verdict for c in claims},
        "samples": {c.claim: {s: j.verdict for s, j in c.samples.items()} for c in claims},
    }
    provisional = (
        f" The `{repro.plan.name}` plan uses small samples: its verdicts are provisional."
        if repro.plan.provisional
        else ""
    )
    sections = [models_section(repro, runs[SHOWN]), *(section(c, provisional) for c in claims)]
    render_report(out, f"posleak: reproduction of arXiv 2606.06160 ({repro.plan.name})", sections, manifest=manifest)
    out.write_manifest(manifest)
