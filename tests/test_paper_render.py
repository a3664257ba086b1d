"""`posleak paper --render-docs`: the README's verdict table and the results pages generated from the claims.json
they name, and the pages written from a run folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli import run_main
from constructed import CLAIMS

from posleak.experiments.paper import render

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_table_and_results_pages_are_generated_from_the_claims_json_they_name() -> None:
    """The README's verdict table and docs/results.md equal what `posleak paper --render-docs` writes from the
    claims.json the README names; each row's verdict is the one that claims.json states (read here as plain JSON).
    Every other plan's page (docs/results-PLAN.md) equals what it writes from that plan's claims.json."""
    readme = (ROOT / "README.md").read_text()
    marker = re.search(
        r"<!-- verdicts: generated from (\S+) by `posleak paper --render-docs`; do not edit -->\n", readme
    )
    assert marker, "the README has no generated verdict table"
    source = Path(marker.group(1))
    table = readme[marker.end() :].split(render.END)[0].strip()
    claims = render.read_claims(ROOT / source)
    assert table == render.verdict_table(claims)
    stated = [entry["verdict"] for entry in json.loads((ROOT / source).read_text())]
    assert [line.split(" | ")[1].strip("*") for line in table.splitlines()[2:]] == stated
    assert len(stated) == len(CLAIMS)
    assert source == render.results_home(render.README_PLAN)[1] / "claims.json"
    plans = [render.README_PLAN] + [p.stem.removeprefix("results-") for p in (ROOT / "docs").glob("results-*.md")]
    for plan in plans:
        page, home = render.results_home(plan)
        claims = render.read_claims(ROOT / home / "claims.json")
        figures = sorted(p.relative_to(ROOT) for p in (ROOT / home / "figures").rglob("*.png"))
        assert (ROOT / page).read_text() == render.results_page(claims, home / "claims.json", figures, plan), plan


def _paper_run(folder: Path, plan: str) -> Path:
    """A reproduction's folder as `render_docs` reads it: the shown claims.json, a manifest naming `plan`, a
    figure, and a second corpus's figure (a run of several corpora has one folder each)."""
    (folder / "figures").mkdir(parents=True)
    (folder / "claims.json").write_bytes((ROOT / render.RESULTS / "claims.json").read_bytes())
    (folder / "manifest.json").write_text(json.dumps({"status": "complete", "plan": {"name": plan}}))
    (folder / "figures" / "c1_resid_all.png").write_bytes(b"png")
    (folder / "corpora" / "bible-web" / "figures").mkdir(parents=True)
    (folder / "corpora" / "bible-web" / "figures" / "c1_mask_all.png").write_bytes(b"png2")
    return folder


def test_render_docs_writes_the_pages_of_a_run_and_refuses_bad_input(tmp_path: Path, monkeypatch) -> None:
    """From a run folder: claims.json and figures copied, the table between the README's markers replaced and
    the text around it kept. A folder without claims.json and a manifest, or a README without the markers, is one
    error line each (exit 2) and nothing is written. A run of the full plan gets its own page and folder and
    leaves the README as it was."""
    run = _paper_run(tmp_path / "run", "quick")
    root = tmp_path / "checkout"
    root.mkdir()
    monkeypatch.chdir(root)
    (root / "README.md").write_text("intro\n")
    proc = run_main("paper", "--render-docs", str(tmp_path / "nothing"))
    assert proc.returncode == 2
    assert proc.stderr.count("posleak: error:") == 3, proc.stderr
    assert "no claims.json" in proc.stderr and "no manifest.json" in proc.stderr and "markers" in proc.stderr
    assert sorted(p.name for p in root.iterdir()) == ["README.md"]
    (root / "README.md").write_text(f"intro\n{render.BEGIN.format(source='old')}\nstale\n{render.END}\nafter\n")
    proc = run_main("paper", "--render-docs", str(run))
    assert proc.returncode == 0, proc.stderr
    text = (root / "README.md").read_text()
    assert text.startswith("intro\n") and text.endswith(f"{render.END}\nafter\n") and "stale" not in text
    assert (root / render.RESULTS / "figures" / "c1_resid_all.png").read_bytes() == b"png"
    assert (root / render.RESULTS / "figures" / "bible-web" / "c1_mask_all.png").read_bytes() == b"png2"
    page = (root / "docs" / "results.md").read_text()
    assert page.startswith("# What the reproduction found\n")
    assert "![c1_resid_all](results/figures/c1_resid_all.png)" in page
    assert "![c1_mask_all](results/figures/bible-web/c1_mask_all.png)" in page

    full = _paper_run(tmp_path / "full", "full")
    (full / "figures" / "c1_resid_all.png").write_bytes(b"full png")
    proc = run_main("paper", "--render-docs", str(full))
    assert proc.returncode == 0, proc.stderr
    assert (root / "README.md").read_text() == text
    assert (root / render.RESULTS / "figures" / "c1_resid_all.png").read_bytes() == b"png"  # the quick run's kept
    assert (root / render.RESULTS / "full" / "figures" / "c1_resid_all.png").read_bytes() == b"full png"
    page = (root / "docs" / "results-full.md").read_text()
    assert page.startswith("# What the reproduction found: the `full` plan\n")
    assert "[claims.json](results/full/claims.json)" in page
    assert "![c1_resid_all](results/full/figures/c1_resid_all.png)" in page
    assert "![c1_mask_all](results/full/figures/bible-web/c1_mask_all.png)" in page
