"""`posleak paper --quick` end to end on the built-in models: one verdict per claim, the numbers behind
it, the tables the issue names, and a report that renders in a real browser."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from browser import CHROMIUM, SKIP_REASON, check_in_chromium
from cli import run_cli

from posleak.models.load import LoadedModel

CLAIMS = ["C1", "C2", "C3", "C4", "C5", "C6"]
VERDICTS = {"consistent", "not consistent", "inconclusive"}


@pytest.fixture(scope="module")
def paper(tmp_path_factory: pytest.TempPathFactory, zoo_model) -> Path:
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"):
        zoo_model(name)  # fetched (idempotent) before the timed command
    out = tmp_path_factory.mktemp("paper") / "quick"
    proc = run_cli("paper", "--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == CLAIMS
    return out


@pytest.mark.slow
def test_claims_json_has_a_verdict_and_numbers_per_claim(paper: Path) -> None:
    claims = json.loads((paper / "claims.json").read_text())
    assert [c["claim"] for c in claims] == CLAIMS
    for claim in claims:
        assert claim["verdict"] in VERDICTS
        assert claim["numbers"] and claim["criterion"]
    c5 = next(c for c in claims if c["claim"] == "C5")
    assert set(c5["numbers"]) == {"paper", "mean", "random", "zero"}


@pytest.mark.slow
def test_position0_tables(paper: Path) -> None:
    position0 = pd.read_parquet(paper / "position0.parquet")
    assert {"layer", "fingerprint_cos_bos", "fingerprint_cos_nobos"} <= set(position0.columns)
    gemma = position0[position0["model"] == "gemma3-270m"]
    assert (gemma["fingerprint_cos_bos"] > 1 - 1e-6).all()  # constant with the auto-prepended BOS
    assert (gemma["fingerprint_cos_nobos"] < 1 - 1e-3).any()
    readers = pd.read_parquet(paper / "sink_readers.parquet")
    assert list(readers.columns) == ["layer", "head", "sink_score", "effect", "effect_lo", "effect_hi"]
    assert (readers["sink_score"] > 0.3).all() and readers["effect"].is_monotonic_increasing


@pytest.mark.slow
def test_every_run_folder_is_complete(paper: Path) -> None:
    manifest = json.loads((paper / "manifest.json").read_text())
    readers = pd.read_parquet(paper / "sink_readers.parquet")
    folders = sorted((paper / "runs").iterdir())
    # 3 models, 2 NTK factors, Gemma with BOS and 3 replacements, one run per ablated sink head
    assert len(folders) == 9 + len(readers)
    assert set(manifest["runs"].values()) <= {str(folder) for folder in folders}
    for folder in folders:
        assert json.loads((folder / "manifest.json").read_text())["status"] == "complete", folder


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_paper_report_renders_in_chromium(paper: Path, tmp_path: Path) -> None:
    assert check_in_chromium(paper / "report.html", tmp_path) >= 6  # a figure per claim at least


@pytest.mark.slow
def test_rerun_resumes_from_finished_runs(paper: Path, smollm2: LoadedModel) -> None:
    proc = run_cli("paper", "--quick", "--out", str(paper))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "analyze" not in proc.stderr  # every analysis was read back, none recomputed
