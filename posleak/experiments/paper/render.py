"""The repository's pages of a reproduction, generated from its files: the README's verdict table and
docs/results.md (`posleak paper --render-docs RUN`).

A reproduction's claims.json and figures are copied into `docs/results/`; the verdict table between the README's
two markers and the whole of docs/results.md are written from that copy alone, so that a test can render them
again from the claims.json the README names and find them equal. Nothing in either is typed by hand.

The README's table is the plan `make run` runs (`--quick`); a run of any other plan (its manifest names it) is
rendered beside it, into docs/results/PLAN/ and docs/results-PLAN.md, and leaves the README's table alone.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from posleak.errors import BadInput
from posleak.experiments.batch import safe_name
from posleak.experiments.paper.claim import ClaimModule
from posleak.experiments.paper.claims.plans import QUICK
from posleak.experiments.paper.claims.registry import CLAIMS
from posleak.experiments.paper.corpora import CORPORA
from posleak.experiments.paper.effects import POOLED, POOLED_NOTE, PROJECTION_NOTE, pooled_table, projection_table
from posleak.experiments.paper.verdict import (
    SAYS,
    Claim,
    Judgement,
    Revision,
    criterion_text,
    estimate_text,
    once_verdict,
    revised,
)
from posleak.store import atomic_write

RESULTS = Path("docs") / "results"
README_PLAN = QUICK.name  # the plan of `make run`, whose verdicts the README shows
BEGIN = "<!-- verdicts: generated from {source} by `posleak paper --render-docs`; do not edit -->"
END = "<!-- end of verdicts -->"


def _write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda file: file.write(text.encode()))


def read_claims(path: Path) -> list[Claim]:
    """The claims of a claims.json, each with its module's statement (the file does not keep it)."""
    modules: dict[str, type[ClaimModule]] = {module.name: module for module in CLAIMS}
    claims = []
    for entry in json.loads(path.read_text()):
        module = modules[entry["claim"]]
        samples = {name: _judgement(sample) for name, sample in entry["samples"].items()}
        # older claims.json files name no family-wise rule, nor corpora, nor the criterion's revisions
        family_wise = entry.get("family_wise", "")
        revisions = [Revision(r["date"], r["why"]) for r in entry.get("revisions", [])]
        claim = Claim(
            entry["claim"], module.statement, entry["criterion"], samples, "", family_wise, revisions=revisions
        )
        claim.corpora = entry.get("corpora", {})
        # older files have no effect sizes, and their pages none
        claim.pooled, claim.projection = entry.get("pooled", []), entry.get("projection", [])
        # older files judge nothing once (C4's lab stood in every sample)
        claim.once = {name: _judgement(part) for name, part in entry.get("once", {}).items()}
        claim.required = tuple(name for name, part in entry.get("once", {}).items() if part.get("required"))
        claim.numbers = entry.get("numbers", {})
        claims.append(claim)
    return claims


def _judgement(entry: dict[str, Any]) -> Judgement:
    """A sample's, or a part judged once's, judgement as claims.json keeps it. A part that could not test was
    written "not testable"; it has no deciding row, so its verdict counts nowhere (`verdict.can_test`) and reads
    back inconclusive."""
    verdict = "inconclusive" if entry["verdict"] == "not testable" else entry["verdict"]
    return Judgement(verdict, pd.DataFrame(entry["evidence"]).fillna(float("nan")))


def _rows(claim: Claim, names: Sequence[str]) -> str:
    """The named rows as `name: A value (interval) [B: value (interval)]`, joined for a table cell."""
    parts = []
    for name in names:
        values = []
        for sample, judgement in claim.samples.items():
            rows = judgement.evidence[judgement.evidence["evidence"] == name]
            if not rows.empty:
                e = rows.iloc[0]
                mark = "" if e["says"] == SAYS[judgement.verdict] else f", {e['says']}"
                values.append(f"{sample}: {estimate_text(e)}{mark}")
        parts.append(f"{name}: {'; '.join(values)}")
    return "<br>".join(parts).replace("|", "\\|")


def verdict_table(claims: Sequence[Claim]) -> str:
    """One row per claim: the claim with the dates its criterion was revised, the verdict, each sample's, and the
    one or two rows that decided it in both samples (and why a part the claim needs could not test)."""
    lines = ["| claim | verdict | samples | what decided it |", "|---|---|---|---|"]
    for claim in claims:
        verdict = f"**{claim.verdict}**{_per_corpus(claim)}"
        dates = f" (criterion revised {revised(claim.revisions)})" if claim.revisions else ""
        cell = f"{claim.claim}: {claim.statement}{dates}"
        # a part the claim needs that cannot test keeps it from consistent: its first row says why
        why = "".join(f"<br>{line}" for line in claim.untested())
        lines.append(f"| {cell} | {verdict} | {_parts(claim)} | {_rows(claim, claim.deciding())}{why} |")
    return "\n".join(lines)


def _parts(claim: Claim) -> str:
    """Each sample's verdict, then each part judged once with its own ("lab, judged once: not testable"; a part the
    claim needs says so: "window (needed), judged once: ...")."""
    samples = [f"{name} {j.verdict}" for name, j in claim.samples.items()]
    return ", ".join(samples + claim.once_verdicts())


def _per_corpus(claim: Claim) -> str:
    """On several corpora, each corpus's verdict, to stand after the claim's; else nothing."""
    corpora = claim.by_corpus()
    return "" if len(corpora) == 1 else " (" + ", ".join(f"{c} {v}" for c, v in corpora.items()) + ")"


def _evidence(judgement: Judgement) -> str:
    lines = ["| evidence | value | 95% interval | threshold | says | deciding |", "|---|---|---|---|---|---|"]
    for _, e in judgement.evidence.iterrows():
        interval = "exact" if pd.isna(e["lo"]) else f"{e['lo']:.3g} to {e['hi']:.3g}"
        unit = f" {e['unit']}" if e["unit"] else ""
        cells = [
            e["evidence"],
            f"{e['value']:.4g}{unit}",
            interval,
            e["threshold"],
            e["says"],
            "yes" if e["deciding"] else "reported",
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _effects(claim: Claim) -> list[str]:
    """The lines that lead a claim's evidence: its rows pooled over the samples and, for an inconclusive claim,
    the power projection (posleak.experiments.paper.effects); none where its claims.json has none."""
    out = []
    if claim.pooled:
        out += ["", f"**Effect sizes, {POOLED}** (they do not decide the verdict). {POOLED_NOTE}", ""]
        out += [_markdown(pooled_table(claim))]
    if claim.projection:
        out += [
            "",
            f"**Power projection** ({PROJECTION_NOTE}): the documents per sample at which each row a sample "
            "left unclear would decide, from the pooled value and spread (intervals shrink as 1/√C).",
            "",
        ]
        out += [_markdown(projection_table(claim))]
    return out


def _markdown(table: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += [
        "| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in table.itertuples(False)
    ]
    return "\n".join(lines)


def results_home(plan: str) -> tuple[Path, Path]:
    """Where a run of `plan` is rendered, relative to the checkout: its page and the folder of its claims.json and
    figures. The README's plan: docs/results.md and docs/results/; any other: docs/results-PLAN.md and
    docs/results/PLAN/."""
    if plan == README_PLAN:
        return Path("docs") / "results.md", RESULTS
    name = safe_name(plan) or "plan"
    return Path("docs") / f"results-{name}.md", RESULTS / name


def results_page(claims: Sequence[Claim], source: Path, figures: Sequence[Path], plan: str = README_PLAN) -> str:
    """The page of a run of `plan` (docs/results.md for the README's plan): every claim's criterion with its
    revisions (none in a claims.json older than them), verdicts, its effect sizes where its claims.json has them
    (`_effects`), full evidence in both samples, and its figures."""
    title = "# What the reproduction found" + ("" if plan == README_PLAN else f": the `{plan}` plan")
    out = [
        title,
        "",
        f"Generated from [{source.name}]({source.relative_to('docs')}) by `posleak paper --render-docs`; do not edit. "
        "Each claim is judged on two disjoint samples (A and B) by the criterion in its module, first written before "
        "the data and revised since, each time after verdicts had been seen (method.md §13 dates every revision and "
        "says why; a claim below lists those its run was judged under); it is consistent, or not, only where both "
        "samples agree"
        f"{_on_corpora(claims)}{_once_rule(claims)}.",
        "",
        verdict_table(claims),
    ]
    for claim in claims:
        out += ["", f"## {claim.claim}: {claim.statement}", "", criterion_text(claim.criterion, claim.revisions), ""]
        out += [f"**Family-wise rule.** {claim.family_wise}.", ""] if claim.family_wise else []
        out += [f"**Verdict: {claim.verdict}**{_per_corpus(claim)} ({_parts(claim)})."]
        out += _effects(claim)
        for name, judgement in claim.samples.items():
            out += ["", f"Sample {name}:", "", _evidence(judgement)]
        for name, judgement in claim.once.items():
            out += ["", f"Judged once, {claim.once_name(name)} ({once_verdict(judgement)}):", "", _evidence(judgement)]
        for figure in (f for f in figures if f.name.startswith(f"{claim.claim.lower()}_")):
            out += ["", f"![{figure.stem}]({figure.relative_to('docs')})"]
    return "\n".join(out) + "\n"


def _on_corpora(claims: Sequence[Claim]) -> str:
    """How the corpora's verdicts join, where the claims were judged on several (`verdict.across_corpora`)."""
    corpora = list(claims[0].corpora) if claims else []
    if len(corpora) < 2:
        return ""
    named = ", ".join(corpora)
    return f"; it was judged on each of the corpora {named}, and is consistent, or not, only where every corpus is"


def _once_rule(claims: Sequence[Claim]) -> str:
    """How evidence judged once joins the samples' verdict (`verdict.with_once`), where a claim has any; else
    nothing (older claims.json files judged nothing once)."""
    named = [f"{claim.claim}'s {name}" for claim in claims for name in claim.once]
    if not named:
        return ""
    return (
        f"; evidence judged once rather than per sample ({', '.join(named)}) joins that verdict where it can test: "
        "consistent only where all are, not consistent where any is; a part the claim needs (marked so) that "
        "cannot test leaves it inconclusive at best"
    )


def render_docs(run: Path, root: Path) -> list[Path]:
    """Copy `run`'s claims.json and figures into the results folder of its plan (`results_home`, the plan read
    from its manifest), then write that plan's page from the copy, and for the README's plan the README's table;
    returns the files written. Refuses, writing nothing, a run without claims.json or a manifest that names its
    plan, or (for the README's plan) a README without the two markers."""
    readme = root / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    problems = []
    if not (run / "claims.json").is_file():
        problems.append(f"{run}: no claims.json (a folder written by posleak paper)")
    plan = _plan_of(run)
    if plan is None:
        problems.append(f"{run}: no manifest.json naming its plan (a folder written by posleak paper)")
    start = text.find(BEGIN.split("{source}")[0])
    if plan in (README_PLAN, None) and (start < 0 or END not in text[start:]):
        problems.append(f"{readme}: no verdict table markers ({BEGIN.format(source='…')} … {END})")
    if problems or plan is None:
        raise BadInput(problems)
    page, home = results_home(plan)
    results = root / home
    (results / "figures").mkdir(parents=True, exist_ok=True)
    if (run / "claims.json").resolve() != (results / "claims.json").resolve():
        shutil.copyfile(run / "claims.json", results / "claims.json")
        for figure, target in run_figures(run):
            (results / "figures" / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(figure, results / "figures" / target)
    source = home / "claims.json"
    claims = read_claims(root / source)
    figures = sorted(p.relative_to(root) for p in (results / "figures").rglob("*.png"))
    _write_text(root / page, results_page(claims, source, figures, plan))
    if plan != README_PLAN:
        return [root / page, results / "claims.json"]
    end = text.index(END, start)
    table = f"{BEGIN.format(source=source)}\n{verdict_table(claims)}\n"
    _write_text(readme, text[:start] + table + text[end:])
    return [readme, root / page, results / "claims.json"]


def _plan_of(run: Path) -> str | None:
    """The name of the plan a reproduction ran, from its manifest; None where it has none that says."""
    try:
        return json.loads((run / "manifest.json").read_text())["plan"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_figures(run: Path) -> list[tuple[Path, Path]]:
    """Each figure of a reproduction with where it goes under docs/results/figures: a run of one corpus has them in
    OUT/figures (kept by name); a run of several in OUT/corpora/NAME/figures (kept under NAME/)."""
    found = [(figure, Path(figure.name)) for figure in sorted((run / "figures").glob("*.png"))]
    for folder in sorted((run / CORPORA).glob("*/figures")):
        found += [(figure, Path(folder.parent.name, figure.name)) for figure in sorted(folder.glob("*.png"))]
    return found
