"""benchmarks/bench_scale.py at its smallest, on the CPU: its rows, its exact log Z against a brute force of the
materialised masked logits, and its operation count against torch's own count of the matrix products run."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_scale

from posleak.experiments.paper.claims.plans import QUICK
from posleak.experiments.paper.counts import analysis_count

CPU = torch.device("cpu")
# Mistral's shape with a window shorter than these small lengths, so that the windowed sums are exercised
SMALL_WINDOW = dataclasses.replace(bench_scale.SHAPES["mistral-7b-v0.1"], window=300)


def brute_log_z(query: torch.Tensor, keys: torch.Tensor, scaling: float, window: int | None) -> torch.Tensor:
    """torch.logsumexp over the valid keys of every T × T logit, formed in float64 with the keys repeated per
    query head and the mask built from triangles."""
    heads, seq_len = query.shape[1], query.shape[2]
    repeated = keys.double().repeat_interleave(heads // keys.shape[1], dim=1)
    logits = query.double() @ repeated.mT * scaling
    valid = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    if window is not None:
        valid &= torch.ones(seq_len, seq_len, dtype=torch.bool).triu(-(window - 1))
    return logits.masked_fill(~valid, float("-inf")).logsumexp(-1)


@pytest.mark.parametrize(("shape", "seq_len"), [(bench_scale.SHAPES["qwen2.5-7b"], 128), (SMALL_WINDOW, 400)])
def test_log_z_is_the_brute_force(shape: bench_scale.Shape, seq_len: int) -> None:
    capture = bench_scale.synthetic_layer(shape, seq_len, 2, CPU, seed=3)
    assert capture.query.shape == (2, shape.heads, seq_len, shape.head_dim)
    assert capture.keys.shape == (2, shape.kv_heads, seq_len, shape.head_dim)
    expected = brute_log_z(capture.query, capture.keys, shape.head_dim**-0.5, shape.window)
    assert torch.allclose(capture.log_z.double(), expected, rtol=0, atol=2e-6)
    # under the window, queries past it normalise over W keys, not i + 1: the two must differ there
    unwindowed = brute_log_z(capture.query, capture.keys, shape.head_dim**-0.5, None)
    assert (shape.window is None) == torch.allclose(capture.log_z.double(), unwindowed, rtol=0, atol=2e-6)


@pytest.mark.parametrize(
    ("shape", "seq_len", "path"),
    [
        (bench_scale.SHAPES["qwen2.5-7b"], 128, "materialised"),
        (bench_scale.SHAPES["qwen2.5-7b"], 640, "bilinear"),
        (SMALL_WINDOW, 768, "bilinear"),
    ],
)
def test_operation_count_matches_torch_flop_counter(shape: bench_scale.Shape, seq_len: int, path: str) -> None:
    capture = bench_scale.synthetic_layer(shape, seq_len, 2, CPU, seed=0)
    spec = bench_scale.measure_spec(shape, seq_len, 2)
    assert bench_scale.choose_path(capture, spec.path) == path
    with FlopCounterMode(display=False) as counter:
        bench_scale.measure_layer(capture, spec)
    count = bench_scale.operation_count(shape, spec, path)
    # torch counts the matrix products only: not the FFTs nor the rows' elementwise products
    products = sum(value for name, value in count.items() if name not in ("column sums, FFT", "rows and sink score"))
    assert products == pytest.approx(counter.get_total_flops(), rel=0.02)


def test_bench_scale_prints_and_writes_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    argv = ["--device", "cpu", "--shapes", "qwen2.5-7b", "--lengths", "128", "--num-seqs", "2", "--json", str(out)]
    bench_scale.main(argv)
    rows = json.loads(out.read_text())
    assert [(row["name"], row["T"], row["N"], row["path"]) for row in rows] == [("Qwen2.5-7B", 128, 2, "materialised")]
    row = rows[0]
    assert row["source"] == "measured" and row["device"] == "cpu"
    assert row["seconds_per_layer"] > 0 and row["gflops"] > 0 and row["peak_gflops"] > 0
    assert row["peak_mib_above_capture"] >= 0
    assert row["capture_mib"] * 2**20 == 4 * 2 * 128 * (28 * 128 + 4 * 128 + 28)  # q, k and log Z in float32
    assert row["model_s"] == pytest.approx(28 * row["seconds_per_layer"])
    assert row["paper_quick_s"] == pytest.approx(analysis_count(QUICK) * 28 * row["seconds_per_layer"])
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Qwen2.5-7B       128   2   materialised") for line in printed)

    # projected: the measured row as it was, an unmeasured length at the measured row's rate
    projected = tmp_path / "projected.json"
    sizes = ["--lengths", "128", "192", "--num-seqs", "2"]
    bench_scale.main([*argv[:4], *sizes, "--project-from", str(out), "--json", str(projected)])
    again, longer = json.loads(projected.read_text())
    assert again == row
    assert longer["source"] == "projected from Qwen2.5-7B T = 128, N = 2" and longer["peak_mib_above_capture"] is None
    assert longer["gflops"] == pytest.approx(row["gflops"])
    assert longer["seconds_per_layer"] > row["seconds_per_layer"]


def test_bench_scale_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_scale.main(["--device", "cpu", "--lengths", "1", "--num-seqs", "1"])
    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors == [
        "bench_scale: error: --lengths 1: a length must be ≥ 2",
        "bench_scale: error: --num-seqs 1: the measurement's noise correction needs N ≥ 2",
    ]
