"""The dated revisions of the claims' criteria (ClaimModule.revisions, verdict.Revision): what each module records,
claims.json's round trip, and where readers see them (report.html, the README's table, the docs pages)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from posleak.experiments.paper import FULL, render
from posleak.experiments.paper.claims.registry import CLAIMS
from posleak.experiments.paper.report import write_top
from posleak.experiments.paper.verdict import Claim, Revision, fact_row, judge
from posleak.store import RunFolder, write_json

FIRST_WRITTEN = dt.date(2026, 11, 30)  # the criteria's first text (git history: 6d825d2), before any data
REVISIONS = [Revision("2026-12-01", "a threshold moved for a stated reason"), Revision("2026-12-03", "a new rule")]


def test_every_claim_module_dates_its_revisions_as_iso_dates_in_order() -> None:
    """Each revision's date is an ISO date (YYYY-MM-DD exactly) after the criteria were first written, the dates of a
    module run oldest first, and each says why, once."""
    for module in CLAIMS:
        dates = [dt.date.fromisoformat(r.date) for r in module.revisions]
        assert [d.isoformat() for d in dates] == [r.date for r in module.revisions], module.name
        assert dates == sorted(dates) and all(d > FIRST_WRITTEN for d in dates), module.name
        whys = [r.why for r in module.revisions]
        assert all(whys) and len(set(whys)) == len(whys), module.name


def _claim(name: str, revisions: list[Revision]) -> Claim:
    """A claim judged consistent on both samples by one exact row, its criterion revised on `revisions`."""
    rows = [fact_row("exact row", 1.0, holds=True, fails=False, threshold="> 0")]
    claim = Claim(name, f"Statement of {name}.", f"criterion of {name}", {"A": judge(rows), "B": judge(rows)}, "")
    claim.revisions = revisions
    claim.corpora = {"stdlib": {"name": "stdlib", "sha256": "0" * 64, "origin": None, "samples": ["A", "B"]}}
    claim.models = {"standard": {"spec": "smollm2-135m", "sha256": "1" * 64}}
    return claim


def test_claims_json_keeps_the_revisions_and_an_older_file_without_them_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "claims.json"
    write_json(path, [_claim("C1", REVISIONS).to_json(), _claim("C2", []).to_json()], default=float)
    assert json.loads(path.read_text())[0]["revisions"] == [{"date": r.date, "why": r.why} for r in REVISIONS]
    revised, unrevised = render.read_claims(path)
    assert revised.revisions == REVISIONS and unrevised.revisions == []
    older = [{k: v for k, v in entry.items() if k != "revisions"} for entry in json.loads(path.read_text())]
    path.write_text(json.dumps(older))
    assert [claim.revisions for claim in render.read_claims(path)] == [[], []]


def test_the_readme_table_and_results_page_say_revised_for_a_revised_criterion_only(tmp_path: Path) -> None:
    """The README's table names the dates in the claim's cell; the page heads the criterion with them and lists each
    revision with its reason; the claim without revisions shows neither."""
    path = tmp_path / "claims.json"
    write_json(path, [_claim("C1", REVISIONS).to_json(), _claim("C2", []).to_json()], default=float)
    claims = render.read_claims(path)
    table = render.verdict_table(claims).splitlines()
    assert "| C1: " in table[2] and "(criterion revised 2026-12-01, 2026-12-03) |" in table[2]
    assert "| C2: " in table[3] and "revised" not in table[3]
    page = render.results_page(claims, Path("docs/results/claims.json"), [])
    c1, c2 = page.split("\n## C1: ")[1].split("\n## C2: ")
    assert "**Criterion (revised 2026-12-01, 2026-12-03).** criterion of C1" in c1
    assert "- 2026-12-01: a threshold moved for a stated reason\n- 2026-12-03: a new rule" in c1
    assert "**Criterion.** criterion of C2" in c2 and "revised" not in c2


def test_report_says_revised_where_a_criterion_was_and_not_before_the_data(tmp_path: Path) -> None:
    write_top(RunFolder(tmp_path), FULL, [_claim("C1", REVISIONS), _claim("C2", [])], {})
    report = (tmp_path / "report.html").read_text()
    c1, c2 = report.split("Statement of C1.")[-1].split("Statement of C2.")[-2:]
    assert "Criterion (revised 2026-12-01, 2026-12-03)." in c1
    assert "<li>2026-12-01: a threshold moved for a stated reason</li><li>2026-12-03: a new rule</li>" in c1
    assert "revised" not in c2 and "Criterion.</strong> criterion of C2" in c2
    assert "before the data" not in report
