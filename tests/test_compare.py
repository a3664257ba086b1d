"""`posleak compare`: the comparison summary against scipy on hand-built per-layer tables, and the command on
real run folders as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli import run_cli
from scipy import stats
from tiny import tiny_model

from posleak.capture import use_posleak_attention
from posleak.cli import main
from posleak.data.batches import TokenBatch
from posleak.experiments.compare import summarise
from posleak.interventions import Interventions
from posleak.measure import LAYER_MAGNITUDES, measured_magnitudes
from posleak.pipeline import AnalyzeConfig, analyze_model, prepared_model


def _expected(per_layer: pd.DataFrame) -> dict[str, float]:
    """The summary row from its definition (DESIGN.md §3.5), with scipy: least-squares slope and Spearman ρ of
    the residual-stream magnitude against layer index; mask share = mean mask / (mean mask + mean resid)."""
    layers = per_layer["layer"].to_numpy(dtype=float)
    row: dict[str, float] = {"layers": len(layers)}
    for scope in ("early", "all"):
        mask, resid = per_layer[f"mask_{scope}"].to_numpy(), per_layer[f"resid_{scope}"].to_numpy()
        row[f"mask_{scope}"], row[f"resid_{scope}"] = mask.mean(), resid.mean()
        row[f"resid_{scope}_slope"] = stats.linregress(layers, resid).slope
        row[f"resid_{scope}_spearman"] = stats.spearmanr(layers, resid).statistic
        row[f"mask_share_{scope}"] = mask.mean() / (mask.mean() + resid.mean())
    return row


def test_summary_matches_scipy_on_a_hand_built_table() -> None:
    """Rows in shuffled order, tied resid values (Spearman with average ranks), a trend that is not monotone."""
    layers = np.arange(9)
    table = pd.DataFrame(
        {
            "layer": layers,
            "mask_early": 1.0 + 0.1 * np.cos(layers),
            "mask_all": 0.5 + 0.05 * layers,
            "resid_early": [0.2, 0.1, 0.3, 0.3, 0.25, 0.5, 0.4, 0.3, 0.9],
            "resid_all": [0.9, 0.7, 0.8, 0.7, 0.5, 0.6, 0.2, 0.3, 0.1],
        }
    ).sample(frac=1.0, random_state=0)
    row = summarise("hand-built", table)
    assert row["run"] == "hand-built"
    expected = _expected(table)
    assert set(row) == {"run", *expected}
    for name, value in expected.items():
        assert row[name] == pytest.approx(value, rel=1e-12, abs=1e-15), name
    assert row["resid_early_slope"] > 0 > row["resid_all_slope"]  # the two scopes are kept apart


def test_summary_of_fewer_than_three_layers_has_no_trend() -> None:
    """Two points make no trend: slope and ρ are NaN rather than a line through two points."""
    table = pd.DataFrame({"layer": [0, 1], **{name: [0.5, 0.7] for name in LAYER_MAGNITUDES}})
    row = summarise("two layers", table)
    assert np.isnan(row["resid_all_slope"]) and np.isnan(row["resid_all_spearman"])
    assert row["mask_share_all"] == pytest.approx(0.5)


def _analysis(family: str, out: Path, model_id: str, interventions: Interventions | None = None) -> None:
    """A finished `posleak analyze` run folder of a tiny model on random token ids."""
    model = use_posleak_attention(tiny_model(family))
    ids = torch.randint(3, model.config.vocab_size, (4, 40), generator=torch.Generator().manual_seed(0))
    batch = TokenBatch(ids, "verbatim", None, ids[:, 0].clone(), source="test", source_name="random ids", seed=None)
    config = AnalyzeConfig(seq_len=40, num_seqs=4, bootstrap=0, interventions=interventions or Interventions())
    analyze_model(prepared_model(model, batch, config.analysis, model_id), out, progress=False)


def test_compare_command_on_run_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`posleak compare RUN... --out DIR`: one summary row per run (labelled by model id and interventions) equal
    to the definition computed from that run's per_layer.parquet, a figure per magnitude, a report, a manifest."""
    runs = {
        "tiny-llama": tmp_path / "llama",
        "tiny-llama window=8": tmp_path / "llama-window",
        "tiny-gemma3": tmp_path / "gemma3",
    }
    _analysis("llama", runs["tiny-llama"], "tiny-llama")
    _analysis("llama", runs["tiny-llama window=8"], "tiny-llama", Interventions.from_options(window="8"))
    _analysis("gemma3", runs["tiny-gemma3"], "tiny-gemma3")
    out = tmp_path / "comparison"
    proc = run_cli("compare", *map(str, runs.values()), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]

    summary = pd.read_parquet(out / "comparison.parquet")
    assert summary["run"].tolist() == list(runs)
    for (label, folder), row in zip(runs.items(), summary.itertuples(index=False), strict=True):
        expected = _expected(pd.read_parquet(folder / "per_layer.parquet"))
        got = row._asdict()
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (label, name)
    assert not np.allclose(summary["mask_all"].iloc[0], summary["mask_all"].iloc[1])  # the window acted
    measured = measured_magnitudes(*(pd.read_parquet(folder / "per_layer.parquet") for folder in runs.values()))
    assert measured == [name for name in LAYER_MAGNITUDES if "beyond" not in name]  # one run has no window
    for measure in measured:
        assert (out / "figures" / f"{measure}.png").stat().st_size > 1000
    assert not (out / "figures" / "mask_beyond.png").exists()
    assert "tiny-llama window=8" in (out / "report.html").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["runs"] == {k: str(v) for k, v in runs.items()}

    (tmp_path / "unfinished").mkdir()
    assert main(["compare", str(runs["tiny-llama"]), str(tmp_path / "unfinished"), "--out", str(tmp_path / "x")]) == 2
    assert "is not a finished posleak run" in capsys.readouterr().err
