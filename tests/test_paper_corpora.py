"""A reproduction on several corpora: a claim judged on two corpora, side by side in claims.json and the pages, the
top of its folder, and `--corpus` reaching every analysis, a bad corpus refused before any work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli import run_main
from constructed import FAR, RAISING, even_estimate

from posleak.data.recipe import Recipe
from posleak.experiments.paper import FULL, QUICK, paper_plan, render
from posleak.experiments.paper.corpora import corpus_problems, side_by_side
from posleak.experiments.paper.plan import ROLES
from posleak.experiments.paper.report import write_top
from posleak.experiments.paper.reproduction import analysis_config
from posleak.experiments.paper.verdict import Claim, across_corpora, evidence_row, judge
from posleak.store import RunFolder, write_json


def _judged_on(corpus: str, verdict: str) -> Claim:
    """C1 judged on `corpus` alone, both samples giving `verdict` (as `reproduce` leaves a claim of one corpus)."""
    # 0.03 to 0.07 against > 0.05: unclear
    edge = evidence_row("edge", even_estimate(0.05, 0.02), 0.05, "above", "nats")
    rows = {"consistent": [FAR], "not consistent": [RAISING], "inconclusive": [FAR, edge]}[verdict]
    claim = Claim("C1", "A statement.", "criterion", {"A": judge(rows), "B": judge(rows)}, "method")
    claim.corpora = {corpus: {"name": corpus, "sha256": "0" * 64, "origin": None, "samples": ["A", "B"]}}
    claim.models = {"standard": {"spec": "smollm2-135m", "sha256": "1" * 64}}
    return claim


@pytest.mark.parametrize(
    ("stdlib", "bible", "verdict"),
    [
        ("consistent", "consistent", "consistent"),
        ("not consistent", "not consistent", "not consistent"),
        ("consistent", "not consistent", "inconclusive"),
        ("consistent", "inconclusive", "inconclusive"),
        ("inconclusive", "not consistent", "inconclusive"),
    ],
)
def test_a_claim_on_two_corpora_is_consistent_or_not_only_where_both_are(
    tmp_path: Path, stdlib: str, bible: str, verdict: str
) -> None:
    """The rule of the corpora (method §13) each way, on the claim joined from both corpora's judgements, and
    the same claim read back from the claims.json it writes, the two corpora side by side in its pages."""
    assert across_corpora([stdlib, bible]) == verdict  # type: ignore[list-item]
    per_corpus = {name: [_judged_on(name, v)] for name, v in (("stdlib", stdlib), ("bible-web", bible))}
    [claim] = side_by_side(per_corpus)
    assert claim.verdict == verdict and claim.by_corpus() == {"stdlib": stdlib, "bible-web": bible}
    assert list(claim.samples) == ["stdlib A", "stdlib B", "bible-web A", "bible-web B"]
    assert claim.corpora["bible-web"]["samples"] == ["bible-web A", "bible-web B"]
    path = tmp_path / "claims.json"
    write_json(path, [claim.to_json()], default=float)
    [back] = render.read_claims(path)
    assert back.verdict == verdict and back.by_corpus() == claim.by_corpus() and back.corpora == claim.corpora
    assert json.loads(path.read_text())[0]["verdict"] == verdict
    table = render.verdict_table([back])
    assert f"**{verdict}** (stdlib {stdlib}, bible-web {bible})" in table and "bible-web B " in table
    page = render.results_page([back], Path("docs/results/claims.json"), [])
    assert "Sample bible-web A:" in page and "judged on each of the corpora stdlib, bible-web" in page


def test_the_top_of_a_reproduction_on_two_corpora_shows_them_side_by_side(tmp_path: Path) -> None:
    """OUT's manifest names each corpus with its provenance and folder; report.html gives each corpus's verdict and
    the evidence of its samples beside the other's."""
    claims = side_by_side({name: [_judged_on(name, "consistent")] for name in ("stdlib", "bible-web")})
    write_top(RunFolder(tmp_path), FULL, claims, {"corpus_folders": {"stdlib": "corpora/stdlib"}})
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert list(manifest["corpora"]) == manifest["plan"]["corpora"] == ["stdlib", "bible-web"]
    assert manifest["corpora"]["bible-web"]["samples"] == ["bible-web A", "bible-web B"]
    assert manifest["corpus_folders"] == {"stdlib": "corpora/stdlib"} and manifest["verdicts"] == {"C1": "consistent"}
    report = (tmp_path / "report.html").read_text()
    assert "per corpus: stdlib consistent, bible-web consistent" in report
    assert all(f"Evidence, sample {corpus} {s}" in report for corpus in ("stdlib", "bible-web") for s in "AB")


def test_paper_draws_from_the_corpus_it_is_given_and_refuses_a_bad_one_before_any_work(tmp_path: Path) -> None:
    """`--corpus` reaches every analysis's recipe (the default's resume fingerprint unchanged); the full plan
    judges on stdlib and bible-web; a corpus that cannot be read, or one named twice, is one line each."""
    plan, problems = paper_plan(QUICK, corpora=["bible-web"])
    assert problems == [] and plan.corpora == ("bible-web",) and FULL.corpora == ("stdlib", "bible-web")
    assert {analysis_config(plan, role).recipe.corpus for role in ROLES} == {"bible-web"}
    # the default is the recipe's own default, so that the run folders of earlier reproductions still resume
    assert analysis_config(QUICK, "standard").recipe.corpus == Recipe().corpus == "stdlib"
    path = tmp_path / "plan.yaml"
    path.write_text("base: {corpora: [bible-web, stdlib]}\n")
    assert paper_plan(QUICK, None, path)[0].corpora == ("bible-web", "stdlib")
    assert paper_plan(QUICK, None, path, ["stdlib"])[0].corpora == ("stdlib",)  # --corpus wins over the file
    assert corpus_problems(plan) == []
    found = corpus_problems(replace(QUICK, corpora=("nosuch", "bible-web", "bible-web")))
    assert len(found) == 2 and found[0].startswith("corpus 'nosuch' is neither") and "named twice" in found[1]
    out = tmp_path / "paper"  # an unknown role besides, so that nothing could run were the corpus let through
    proc = run_main("paper", "--corpus", "nosuch", "--corpus", "bible-web", "--models", "nosuch=x", "--out", str(out))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and not out.exists(), proc.stderr
    corpus = [line for line in lines if line.startswith("posleak: error: corpus ")]  # bible-web is read well
    assert len(corpus) == 1 and corpus[0].startswith("posleak: error: corpus 'nosuch' is neither"), proc.stderr
