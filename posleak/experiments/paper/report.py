"""What `posleak paper` writes at the top of its folder: claims.json, the manifest and report.html."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from posleak.experiments.paper.effects import POOLED, POOLED_NOTE, PROJECTION_NOTE, pooled_table, projection_table
from posleak.experiments.paper.plan import ROLE_NAMES, Plan
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Claim, Judgement, criterion_text, once_verdict
from posleak.report.html import Section, TableBlock, render_report
from posleak.store import RunFolder, write_json


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
    """A claim's section of report.html: what was measured, the criterion with its revisions, the paper's effect,
    the verdict."""
    once = claim.once_verdicts()
    verdicts = "; ".join([*(f"sample {s}: {j.verdict}" for s, j in claim.samples.items()), *once])
    corpora = claim.by_corpus()
    rule = (
        "consistent or not consistent only where both samples agree"
        if len(corpora) == 1
        else "per corpus: " + ", ".join(f"{c} {v}" for c, v in corpora.items()) + "; consistent or not consistent "
        "only where every corpus is"
    )
    if once:
        rule += "; with the parts judged once that can test: consistent where all are, not consistent where any is"
    if claim.required:
        rule += "; a part the claim needs (marked so) that cannot test leaves it inconclusive at best"
    return Section(
        f"{claim.claim}: {claim.statement}",
        f"**Measured.** {claim.method}\n\n{criterion_text(claim.criterion, claim.revisions)}\n\n"
        f"**Against the paper.** {claim.paper}\n\n**Verdict.** {verdicts} → **{claim.verdict}** ({rule}).{provisional}",
        figures=claim.figures,
        tables=[
            *effect_tables(claim),
            *(TableBlock(f"Evidence, sample {s}", evidence_table(j), max_rows=None) for s, j in claim.samples.items()),
            *(
                TableBlock(f"Evidence judged once: {claim.once_name(n)}", evidence_table(j), max_rows=None)
                for n, j in claim.once.items()
            ),
            *claim.tables,
        ],
        verdict=claim.verdict,
    )


def effect_tables(claim: Claim) -> list[TableBlock]:
    """The tables that lead a claim's evidence (posleak.experiments.paper.effects): its deciding rows pooled over
    the samples and, for an inconclusive claim, the power projection; none for a claim that has none."""
    tables = []
    if claim.pooled:
        tables.append(
            TableBlock(f"Effect sizes, {POOLED} (do not decide the verdict)", pooled_table(claim), POOLED_NOTE, None)
        )
    if claim.projection:
        caption = (
            f"Documents per sample at which each row a sample left unclear would decide: {PROJECTION_NOTE}. The "
            f"{POOLED} interval's half-width h on the side facing the threshold, from C documents in all, reaches the "
            "gap g between the value and the threshold in a sample of ⌈C·(h/g)²⌉ (intervals shrink as 1/√C)."
        )
        tables.append(TableBlock(f"Power projection ({PROJECTION_NOTE})", projection_table(claim), caption, None))
    return tables


def models_section(plan: Plan, claims: Sequence[Claim]) -> Section:
    """Which model played each role, at what size, with the weights' hash its baseline analysis recorded, and the
    corpora the sequences came from."""
    table = pd.DataFrame(
        [
            {
                "role": role,
                "model": used["spec"],
                "T": plan.size(role)[0],
                "N per sample": plan.size(role)[1],
                "weights SHA-256": used["sha256"],
            }
            for role, used in _models(claims).items()
        ]
    )
    corpora = pd.DataFrame(
        [
            {"corpus": name, "documents' SHA-256": used["sha256"], "origin": used["origin"]}
            for name, used in _corpora(claims).items()
        ]
    )
    text = (
        "The model of each role the claims read (`posleak paper --models`, `--plan`), and the corpora their "
        "sequences are drawn from (`--corpus`; docs/method.md §13)."
    )
    tables = [TableBlock("Models by role", table, max_rows=None), TableBlock("Corpora", corpora, max_rows=None)]
    return Section("Models and corpora", text, tables=tables)


def _models(claims: Sequence[Claim]) -> dict[str, dict[str, str]]:
    """Per role that a claim reads, in the roles' order, its model's spec and weights' SHA-256."""
    models = {role: used for claim in claims for role, used in claim.models.items()}
    return {role: models[role] for role in ROLE_NAMES if role in models}


def _corpora(claims: Sequence[Claim]) -> dict[str, dict[str, Any]]:
    """Each corpus of the claims with its provenance (every claim reads the same corpora)."""
    return claims[0].corpora if claims else {}


def write_outputs(repro: Reproduction, claims: Sequence[Claim], runs: Mapping[str, SampleRuns]) -> None:
    """claims.json, then report.html and the manifest (every shared run folder, the plan, the verdicts)."""
    folders = {key: str(r.run.path) for sample in runs.values() for key, r in sample.named() if r.run}
    write_top(repro.out, repro.plan, claims, {"runs": folders})


def write_top(out: RunFolder, plan: Plan, claims: Sequence[Claim], where: Mapping[str, Any]) -> None:
    """claims.json, then report.html and the manifest of `plan`'s `claims`, the manifest saying `where` their
    runs are (a plain run: each shared run folder; several corpora: each corpus's folder)."""
    write_json(out.path / "claims.json", [c.to_json() for c in claims], default=float)  # a missing interval: null
    manifest = {
        "status": "complete",
        "model": {"id": "paper reproduction"},
        "plan": plan.to_dict(),
        **where,
        "models": _models(claims),
        "corpora": _corpora(claims),
        "verdicts": {c.claim: c.verdict for c in claims},
        "samples": {c.claim: {s: j.verdict for s, j in c.samples.items()} for c in claims},
        "once": {c.claim: {n: once_verdict(j) for n, j in c.once.items()} for c in claims if c.once},
    }
    provisional = (
        f" The `{plan.name}` plan uses small samples: its verdicts are provisional." if plan.provisional else ""
    )
    sections = [models_section(plan, claims), *(section(c, provisional) for c in claims)]
    render_report(out, f"posleak: reproduction of arXiv 2606.06160 ({plan.name})", sections, manifest=manifest)
    out.write_manifest(manifest)
