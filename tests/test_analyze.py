"""`posleak analyze` end to end: real models against the brute-force reference, the run folder,
resuming, bad input on the command line, and position 0 on the real models."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli import assert_one_line_error, file_stamps, run_cli, run_main, strict_json_files
from reference import LogitRecorder, assert_close, grid_edges, table_errors
from tiny import tiny_checkpoint, tiny_model, word_corpus

from posleak.capture import CaptureSession, QueryStats, ResidualCapture, closed_system, use_posleak_attention
from posleak.commands.analyze import analyze
from posleak.data.batches import TokenBatch
from posleak.data.kinds import BosPolicy
from posleak.errors import PosleakError
from posleak.interventions import Interventions, Window
from posleak.measure import LAYER_MAGNITUDES
from posleak.models.load import LoadedModel
from posleak.pipeline import (
    AnalysisResult,
    AnalyzeConfig,
    PreparedRun,
    analyze_model,
    capture_paths,
    prepared_model,
    sequences_for,
)
from posleak.store import RunFolder
from posleak.store.jsonfile import dumps, nan_for_none
from posleak.store.manifest import fingerprint

TOLERANCE = 1e-5


def _batch(ids: torch.Tensor) -> TokenBatch:
    return TokenBatch(
        ids=ids,
        bos="verbatim",
        bos_id=None,
        pos0_token_ids=ids[:, 0].clone(),
        source="test",
        source_name="random ids",
        seed=None,
    )


def _tiny_run(tmp_path: Path | None, **changes: object) -> AnalysisResult:
    model = use_posleak_attention(tiny_model("gemma3"))
    ids = torch.randint(3, model.config.vocab_size, (6, 40), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 2
    config = AnalyzeConfig(seq_len=40, num_seqs=6, batch_size=2, bootstrap=50).replace(**changes)
    return analyze_model(prepared_model(model, _batch(ids), config.analysis, "tiny-gemma3"), tmp_path, progress=False)


# ----------------------------------------------------------------------------------- run folders


def test_run_folder_has_every_table_figure_and_report(tmp_path: Path) -> None:
    result = _tiny_run(tmp_path / "run")
    run = tmp_path / "run"
    for name in AnalysisResult.TABLES:
        assert (run / f"{name}.parquet").exists(), name
    for figure in ("magnitudes", "profiles", "offset_map"):
        assert (run / "figures" / f"{figure}.png").stat().st_size > 1000
    html = (run / "report.html").read_text()
    assert "data:image/png;base64," in html and "tiny-gemma3" in html
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert (
        manifest["grid"]["kind"] == "coarse" and manifest["data"]["seq_len"] == 40 and manifest["data"]["num_seqs"] == 6
    )
    assert manifest["bos"]["position0_tokens"] == [{"id": 2, "text": "2", "sequences": 6}]
    assert manifest["closed_system"]["holds"]
    assert strict_json_files(run)[run / "manifest.json"] == manifest  # every JSON of the folder parses strictly
    assert list(result.per_layer["layer_type"]) == ["sliding_attention", "sliding_attention", "full_attention"]
    assert set(result.per_head.columns) == {
        "layer",
        "head",
        "sink_score",
        *(f"{kind}_{name}" for kind in ("mask", "mask_count", "resid") for name in ("early", "all", "beyond")),
        *(f"{kind}_{name}_raw" for kind in ("mask", "resid") for name in ("early", "all", "beyond")),
        *(
            f"resid_{name}_{part}{raw}"
            for part in ("key0", "rest")
            for name in ("early", "all", "beyond")
            for raw in ("", "_raw")
        ),
        *(
            f"shift_{kind}_{name}{raw}"
            for kind in ("kl", "tv")
            for name in ("early", "all", "beyond")
            for raw in ("", "_raw")
        ),
        "dr2_logit",
        "dr2_logattn",
    }
    # the tiny Gemma 3 has a window of 16 < T = 40: the beyond range (16 ≤ i < 40) is measured
    assert result.manifest["measurement"]["beyond"] == 16 and result.per_layer["resid_beyond"].notna().all()
    bounds = result.per_layer
    for name in LAYER_MAGNITUDES:
        assert (bounds[f"{name}_lo"] <= bounds[name] + 1e-12).all() and (
            bounds[name] <= bounds[f"{name}_hi"] + 1e-12
        ).all()
    # a finished run is read back, not recomputed: no forward runs and no file is written again
    written = {path: path.stat().st_mtime_ns for path in run.rglob("*") if path.is_file()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CaptureSession, "forward", _no_forward)
        again = _tiny_run(run)
    assert {path: path.stat().st_mtime_ns for path in run.rglob("*") if path.is_file()} == written
    pd.testing.assert_frame_equal(again.per_layer, result.per_layer)


def test_every_json_posleak_writes_is_strict_with_null_for_a_missing_number(tmp_path: Path) -> None:
    """NaN, inf and -inf, as Python floats, numpy and torch scalars, at any depth, are written as null (jq and
    JSON.parse reject the bare NaN that json.dumps writes); every other value comes back as it went in, finite
    floats to the last bit; a reader of a flat record of numbers gets NaN back for each null."""
    third = 1 / 3
    record = {
        "a": float("nan"),
        "b": [1.5, float("inf"), np.float32("nan"), np.float64(-np.inf), torch.tensor(float("nan"))],
        "c": {"d": (np.int64(3), None, True, "NaN"), "e": third, "f": np.bool_(True)},
    }
    assert "NaN" in json.dumps(record, default=float)  # what the standard library writes, the bug
    inner = {"d": [3, None, True, "NaN"], "e": third, "f": True}
    expected = {"a": None, "b": [1.5, None, None, None, None], "c": inner}
    assert json.loads(dumps(record), parse_constant=_no_constant) == expected
    RunFolder(tmp_path).write_manifest(record)  # the run folder's manifest goes through the same writer
    assert strict_json_files(tmp_path)[tmp_path / "manifest.json"] == expected
    back = nan_for_none(json.loads(dumps({"x": float("nan"), "y": 2.0, "z": "s"})))
    assert np.isnan(back["x"]) and back["y"] == 2.0 and back["z"] == "s"


def test_analyze_ends_with_the_headline_magnitudes_and_writes_strict_json(tmp_path: Path) -> None:
    """The last lines of `posleak analyze`: each magnitude's mean over layers with the percentile interval of the
    resamples' means over layers (numpy's quantile of bootstrap.parquet), the mean ΔR² over heads and the closed
    system; every JSON file of the run folder parses strictly."""
    model, corpus, out = tiny_checkpoint(tmp_path / "model"), word_corpus(tmp_path / "words.txt"), tmp_path / "run"
    proc = run_main("analyze", str(model), "--corpus", str(corpus), "--seq-len", "24", "--num-seqs", "6",
                    "--bootstrap", "40", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("headline: mean over layers, nats, 95%"))
    per_layer, per_head = pd.read_parquet(out / "per_layer.parquet"), pd.read_parquet(out / "per_head.parquet")
    means = pd.read_parquet(out / "bootstrap.parquet").groupby("resample").mean()
    shown = {line.split()[0]: line for line in lines[start + 1 :]}
    measures = ["mask_early", "mask_all", "resid_early", "resid_all", "resid_early_key0", "resid_all_key0",
                "resid_early_rest", "resid_all_rest"]  # fmt: skip
    assert [line.split()[0] for line in lines[start + 1 : start + 9]] == measures
    for measure in measures:
        lo, hi = np.quantile(means[measure], [0.025, 0.975])
        value = per_layer[measure].mean()
        assert shown[measure].split(maxsplit=1)[1].startswith(f"{value:.4g} ({lo:.3g} to {hi:.3g})  "), shown[measure]
    assert shown["resid_all_key0"].endswith("residual stream, all queries, its key-0 column")
    for line, kind in zip(lines[start + 9 : start + 11], ("kl", "tv"), strict=True):
        shifts = [f"{q} queries {per_layer[f'shift_{kind}_{q}'].mean():.3g}" for q in ("early", "all")]
        assert line.startswith("  attention moved by w") and line.endswith(", ".join(shifts)), line
    assert lines[start + 11] == (
        f"  ΔR² of absolute position over the offset (§7), mean over heads: logits {per_head['dr2_logit'].mean():.3g}, "
        f"log-attention {per_head['dr2_logattn'].mean():.3g}"
    )
    assert lines[start + 12].startswith("  position 0 closed system (§8): holds") and len(lines) == start + 13
    assert len(strict_json_files(out)) >= 1


def _no_constant(name: str) -> object:
    raise AssertionError(f"bare {name} in the JSON")


def _no_forward(*args: object, **kwargs: object) -> None:
    raise AssertionError("a finished run must not run the model again")


def _interrupting(stage: str, after: int, counts: dict[str, int]) -> object:
    """A replacement for CaptureSession.forward ("forward") or analyze's measure_layer ("measure") that
    counts its calls and raises KeyboardInterrupt once, on call number `after` + 1 of its stage."""
    original = CaptureSession.forward if stage == "forward" else capture_paths.measure_layer

    def wrapped(*args: object, **kwargs: object) -> object:
        counts[stage] = counts.get(stage, 0) + 1
        if counts[stage] == after + 1 and not counts.get("interrupted"):
            counts["interrupted"] = 1
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize(("stage", "after", "redone"), [("forward", 2, 1), ("measure", 1, 2)])
def test_interrupted_run_resumes_without_redoing_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: str, after: int, redone: int
) -> None:
    """Interrupted in the third batch's forward (two batches captured) or in the second layer's measurement
    (one layer kept): the rerun redoes only what was left and ends with the same tables, bit for bit."""
    whole = _tiny_run(tmp_path / "whole")
    counts: dict[str, int] = {}
    target = (CaptureSession, "forward") if stage == "forward" else (capture_paths, "measure_layer")
    monkeypatch.setattr(*target, _interrupting(stage, after, counts))
    with pytest.raises(KeyboardInterrupt):
        _tiny_run(tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "partial"  # marked unfinished, and the lock was let go
    assert not (tmp_path / "run" / ".lock").exists()
    counts[stage] = 0
    resumed = _tiny_run(tmp_path / "run")
    assert counts[stage] == redone
    for name in AnalysisResult.TABLES:
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), check_exact=True)


def test_resuming_with_other_arguments_is_refused(tmp_path: Path) -> None:
    _tiny_run(tmp_path / "run")
    with pytest.raises(PosleakError, match="different run"):
        _tiny_run(tmp_path / "run", early=8)


@pytest.mark.slow
def test_analyze_writes_a_complete_run_folder_and_a_rerun_reads_it_back(tmp_path: Path) -> None:
    """Exit 0, a manifest with status complete, per_layer.parquet with a row per layer, the report; rerun with the
    same arguments, no file of the folder is written again."""
    out = tmp_path / "run"
    args = ("analyze", "smollm2-135m", "--seq-len", "32", "--num-seqs", "4", "--bootstrap", "20", "--out", str(out))
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    per_layer = pd.read_parquet(out / "per_layer.parquet")
    assert {"layer", "mask_early", "mask_all", "resid_early", "resid_all"} <= set(per_layer.columns)
    assert per_layer["layer"].tolist() == list(range(30))
    assert (out / "report.html").stat().st_size > 10_000

    finished = file_stamps(out)
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert file_stamps(out) == finished, "the finished run was computed again"


# ----------------------------------------------------------------------------------- the in-forward path

IN_FORWARD = "1GiB"  # a measure budget the tiny model's captures fit: the in-forward path on the CPU


@pytest.mark.parametrize("batch_size", [2, 6])
def test_in_forward_path_gives_the_captured_paths_tables(tmp_path: Path, batch_size: int) -> None:
    """Captures kept where q and k were made, each layer measured during the last forward (three batches of 2)
    or right after it (one batch of 6): every table equals the captured path's (the run folder's captures, the
    CPU's default with a run folder) and the in-memory path's, bit for bit, and the manifest says which path
    ran and that the sums ran on the CPU, the device of the captured q."""
    captured = _tiny_run(tmp_path / "captured", batch_size=batch_size)
    in_forward = _tiny_run(tmp_path / "in-forward", batch_size=batch_size, measure_budget=IN_FORWARD)
    in_memory = _tiny_run(None, batch_size=batch_size, measure_budget="0")
    paths = [run.manifest["measurement"]["captures"] for run in (captured, in_forward, in_memory)]
    assert paths == ["folder", "in-forward", "memory"]
    assert {run.manifest["measurement"]["device"] for run in (captured, in_forward, in_memory)} == {"cpu"}
    assert in_forward.manifest["measurement"]["beyond"] == 16  # every layer's window known before the first
    for other in (in_forward, in_memory):
        for name in AnalysisResult.TABLES:
            pd.testing.assert_frame_equal(getattr(other, name), getattr(captured, name), check_exact=True)


def test_interrupted_in_forward_run_redoes_the_forwards_and_keeps_the_measured_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted in the last forward while measuring its second layer: the run folder holds the first layer's
    measurement and no captures; the rerun redoes all three forwards, measures only the two layers left and
    ends with the uninterrupted run's tables, bit for bit."""
    whole = _tiny_run(tmp_path / "whole", measure_budget=IN_FORWARD)
    counts: dict[str, int] = {}
    monkeypatch.setattr(capture_paths, "measure_layer", _interrupting("measure", 1, counts))
    with pytest.raises(KeyboardInterrupt):
        _tiny_run(tmp_path / "run", measure_budget=IN_FORWARD)
    partial = tmp_path / "run" / ".partial"
    assert sorted(path.name for path in partial.iterdir()) == ["layer0.pt"]  # no captures, on disk or elsewhere
    counts["measure"] = 0
    monkeypatch.setattr(CaptureSession, "forward", _counting(CaptureSession.forward, counts))
    resumed = _tiny_run(tmp_path / "run", measure_budget=IN_FORWARD)
    assert counts == {"measure": 2, "forward": 3, "interrupted": 1}
    assert resumed.manifest["measurement"]["captures"] == "in-forward"
    for name in AnalysisResult.TABLES:
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), check_exact=True)


def _counting(original: Callable[..., object], counts: dict[str, int]) -> Callable[..., object]:
    def counted(*args: object, **kwargs: object) -> object:
        counts["forward"] = counts.get("forward", 0) + 1
        return original(*args, **kwargs)

    return counted


def test_bad_measure_budget_is_one_line(tmp_path: Path) -> None:
    folder = tiny_checkpoint(tmp_path / "model")
    out = tmp_path / "run"
    assert_one_line_error(run_cli("analyze", str(folder), "--measure-budget", "lots", "--out", str(out)), "lots")
    assert not out.exists()


def test_window_override_is_recorded_in_the_tables(tmp_path: Path) -> None:
    result = _tiny_run(None, interventions=Interventions(Window("global")))
    assert list(result.per_layer["window"]) == [0, 0, 0]
    assert result.manifest["interventions"] == [{"window": "global"}]


def test_null_run_analyses_the_same_rows_moved_and_says_so(tmp_path: Path) -> None:
    """`analyze --null shuffle --null-seed 3`: every row holds the tokens of the plain run's row, moved (the BOS
    kept at 0); the manifest and the report say it is that null, and its folder is not reused by the plain run."""
    model, corpus = tiny_checkpoint(tmp_path / "model"), word_corpus(tmp_path / "words.txt")
    options = ("--corpus", str(corpus), "--seq-len", "24", "--num-seqs", "4", "--bos", "on", "--bootstrap", "10")
    runs = {"plain": (), "shuffle": ("--null", "shuffle", "--null-seed", "3")}
    for name, extra in runs.items():
        proc = run_main("analyze", str(model), *options, *extra, "--out", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr
    plain, null = (AnalysisResult.read(RunFolder(tmp_path / name)) for name in runs)
    targets = {"plain": plain.tokens, "shuffle": null.tokens}  # positions 1 … T − 1 of every row
    rows = {name: np.stack(t.groupby("seq")["target"].apply(np.array).to_list()) for name, t in targets.items()}
    assert (np.sort(rows["plain"], axis=1) == np.sort(rows["shuffle"], axis=1)).all()
    assert (rows["plain"] != rows["shuffle"]).any()
    assert (null.manifest["data"]["null"], null.manifest["data"]["null_seed"]) == ("shuffle", 3)
    assert plain.manifest["data"]["null"] is None and "null" not in plain.manifest["args"]["config"]
    assert null.manifest["data"]["pos0_token_id"] == plain.manifest["data"]["pos0_token_id"]  # the BOS
    assert "A null, not the text" in (tmp_path / "shuffle" / "report.html").read_text()
    again = run_main("analyze", str(model), *options, "--out", str(tmp_path / "shuffle"))
    assert again.returncode == 2 and "different run" in again.stderr


def test_null_options_are_checked_before_any_work(tmp_path: Path) -> None:
    folder, out = tiny_checkpoint(tmp_path / "model"), tmp_path / "run"
    assert_one_line_error(run_main("analyze", str(folder), "--null-seed", "5", "--out", str(out)), "without --null")
    assert not out.exists()
    assert AnalyzeConfig(null="reverse").problems((8, 4)) == ["unknown --null 'reverse'; use one of shift, shuffle"]


# The options a run folder's fingerprint covers (kept through the split of AnalyzeConfig by concern), and the
# fingerprint of the defaults since the interventions enter it by the options away from their defaults (before:
# every registered option, so that registering one changed every run's; tests/test_intervene.py's toy shows it no
# longer does). The noise correction's estimator enters it (since it pairs distinct documents in place of split
# halves, 2026-12-05), so that a run folder of the other estimator is never read back as finished.
IDENTITY_KEYS = {
    "seq_len", "num_seqs", "batch_size", "bos", "corpus", "tokens", "cross_documents", "grid", "early", "seed",
    "bootstrap", "interventions", "device", "dtype", "device_map", "max_memory", "noise_correction",
}  # fmt: skip
DEFAULT_FINGERPRINT = "d98b2d01cf5c7a5a870a992ea5098f4351582d89e8463e58d5ef87cf02b20a8d"


def test_each_option_goes_to_its_concern_and_the_fingerprints_stay() -> None:
    config = AnalyzeConfig(seq_len=64, bos="on", seed=3, grid="exact", batch_size=2, device="cpu", measure_budget="8")
    assert (config.recipe.seq_len, config.recipe.bos, config.recipe.seed) == (64, "on", 3)
    assert (config.measure.grid, config.measure.seed) == ("exact", 3)  # one --seed: sequences and resamples
    execution = config.execution
    assert (execution.batch_size, execution.placement.device, execution.measure_budget) == (2, "cpu", "8")
    changed = config.replace(seed=4)
    assert (changed.recipe.seed, changed.measure.seed, changed.recipe.bos) == (4, 4, "on")
    assert set(config.identity()) == IDENTITY_KEYS
    assert set(config.replace(null="shift").identity()) == IDENTITY_KEYS | {"null", "null_seed"}
    assert fingerprint({"config": AnalyzeConfig().identity()}) == DEFAULT_FINGERPRINT
    with pytest.raises(TypeError, match="unknown analysis option"):
        AnalyzeConfig(seq_length=64)


# ----------------------------------------------------------------------------------- real models


def _real_ids(loaded: LoadedModel, seq_len: int, num_seqs: int, bos: BosPolicy = "auto") -> torch.Tensor:
    config = AnalyzeConfig(seq_len=seq_len, num_seqs=num_seqs, bos=bos)
    return sequences_for(loaded, config.recipe).ids


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "seq_len", "num_seqs", "checked"),
    [("gemma3", 640, 4, range(18)), ("smollm2", 1024, 2, (0, 6, 12, 18, 24, 29))],
)
def test_real_models_match_brute_force(
    name: str, seq_len: int, num_seqs: int, checked: Sequence[int], request: pytest.FixtureRequest
) -> None:
    """Default `analyze` (coarse table grid) against the float64 brute force of the definitions: every
    magnitude of per_head and per_layer (raw and corrected), ΔR², sink scores, profile and offset-map cells.
    Gemma 3 with its BOS at T = 640 has 128 queries beyond its 512-token window: every layer, sliding and global.
    SmolLM2 at T = 1024: its layers are all alike, so six of them spread over its depth (first and last
    included): the test with all 30 took 342 s on 2 cores shared with other work, with these six 76 s alone; at
    N = 2 (88 s at N = 4 in a full suite run, 2026-12-04). Gemma 3 stays at N = 4: at N = 2 one head's early
    causal-mask magnitude is so near 0 that its float32 rounding reads as a relative error of 5.6e-5."""
    loaded: LoadedModel = request.getfixturevalue(name)
    config = AnalyzeConfig(seq_len=seq_len, num_seqs=num_seqs, batch_size=2, bootstrap=0)
    batch = sequences_for(loaded, config.recipe)
    assert (batch.bos_id is not None) == (name == "gemma3")
    with LogitRecorder(loaded.model) as recorder:
        result = analyze_model(PreparedRun.of(loaded, batch, config), progress=False)
    assert recorder.previous == "posleak" and len(recorder.layers) == loaded.facts.layers
    if name == "gemma3":
        assert {layer.window for layer in recorder.layers.values()} == {512, None}
    recorder.layers = {layer: recorder.layers[layer] for layer in checked}
    edges = grid_edges(seq_len)
    errors = table_errors(result.per_head, result.per_layer, result.profiles, result.offset_map, recorder, 32, edges)
    assert_close(errors, TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_position0_is_closed(name: str, request: pytest.FixtureRequest) -> None:
    loaded: LoadedModel = request.getfixturevalue(name)
    ids = _real_ids(loaded, 64, 6, bos="on")  # different content, the same BOS at position 0
    with ResidualCapture(loaded.model, positions=[0]) as capture:
        session = CaptureSession()
        for start in (0, 3):  # two batches: closed across batches too
            session.forward(loaded.model, ids[start : start + 3])
    report = closed_system(capture.states()[:, :, 0], ids[:, 0])
    assert report.groups == 1 and report.holds, report.max_rel_spread


@pytest.mark.slow
def test_gemma_fingerprint_is_constant_with_bos_only(gemma3: LoadedModel) -> None:
    from posleak.data.batches import without_bos
    from posleak.experiments.paper.claims.c6.claim import position0_states
    from posleak.measure.position0 import fingerprint_constancy

    batch = sequences_for(gemma3, AnalyzeConfig(seq_len=32, num_seqs=8, bos="auto").recipe)
    assert batch.bos_id == 2
    with_bos = fingerprint_constancy(position0_states(gemma3, batch, 4))
    without = fingerprint_constancy(position0_states(gemma3, without_bos(batch), 4))
    assert torch.allclose(with_bos, torch.ones_like(with_bos), atol=1e-6)
    assert (without < 1 - 1e-3).all()


@pytest.mark.slow
def test_real_model_log_z_and_sink_scores_match_eager(smollm2: LoadedModel) -> None:
    from test_capture import _record_eager

    model = smollm2.model
    ids = _real_ids(smollm2, 128, 2)
    model.set_attn_implementation("eager")
    try:
        with _record_eager(model) as records, torch.no_grad():
            model(ids, use_cache=False)
    finally:
        use_posleak_attention(model)
    stats = QueryStats()
    CaptureSession([stats]).forward(model, ids)
    result = stats.result()
    for layer, rec in enumerate(records):
        logits, weights = rec["logits"].double(), rec["weights"].double()
        torch.testing.assert_close(result.log_z[layer], torch.logsumexp(logits, -1).mean(0), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result.attn_key0[layer], weights[..., 0].mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_memory_at_8192_tokens(smollm2: LoadedModel) -> None:
    """T = 8192, N = 2, and the memory it takes: the peak resident size it adds stays below what a single T × T
    float32 logit array for the heads of one layer would take (2.4 GB). Two sequences are too few for an interval
    (docs/method.md §6): the magnitudes are finite, the bounds NaN, and the manifest says why."""
    from bench_analyze import PeakMemory

    config = AnalyzeConfig(seq_len=8192, num_seqs=2, batch_size=1, cross_documents=True, bootstrap=20)
    batch = sequences_for(smollm2, config.recipe)
    with PeakMemory() as peak:
        result = analyze_model(PreparedRun.of(smollm2, batch, config), progress=False)
    one_layer = smollm2.facts.heads * 8192**2 * 4 / 2**20
    assert peak.added_mb < one_layer, (peak.added_mb, one_layer)
    assert np.isfinite(result.per_layer[["mask_all", "resid_all"]].to_numpy()).all()
    assert result.per_layer[["resid_all_lo", "resid_all_hi"]].isna().all().all()
    assert "2 sequences" in result.manifest["measurement"]["bootstrap_note"]


# ----------------------------------------------------------------------------------- bad input


@pytest.mark.slow
def test_sequence_longer_than_the_model_allows(smollm2: LoadedModel, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert_one_line_error(
        run_cli("analyze", "smollm2-135m", "--seq-len", "100000", "--num-seqs", "2", "--out", str(out)), "100000"
    )
    assert not out.exists() or not any(out.iterdir())


def test_bos_on_without_a_bos_token(tmp_path: Path) -> None:
    """A real checkpoint folder on disk whose tokenizer has no BOS token."""
    folder = tiny_checkpoint(tmp_path / "no-bos-model", bos=False)
    corpus = word_corpus(tmp_path / "corpus.txt", words=2000)
    out = tmp_path / "run"
    args = ["analyze", str(folder), "--bos", "on", "--corpus", str(corpus), "--seq-len", "32", "--out", str(out)]
    assert_one_line_error(run_cli(*args), "BOS")
    assert not out.exists()


# bfloat16 keeps 8 significant bits: its unit roundoff is u = 2^-8 ≈ 0.0039. A bfloat16 forward rounds every
# weight and every activation to that precision (about u/2 each), so the model's q and k carry a relative error of
# a few u, carried and partly compounded through the residual stream of 30 layers; posleak then forms the logits
# from them exactly (float32 products, float64 sums), so the magnitudes inherit the model's error and add none.
# A magnitude is a root-mean-square of logit deviations: its error is that of the logits, u-sized relative to the
# logits' scale, not to the magnitude itself (a small magnitude of a large-logit layer can move by more than u of
# its own value). How many u depends on the CPU's bfloat16 kernels, which round the model's intermediate results
# differently. Measured (T = 64, N = 4, torch 2.13.0+cpu): a 2-core Intel Xeon, magnitudes 1.4u at most and sink
# scores 2.7u; a 2-core AMD EPYC (AVX512 kernels, 2026-12-07), mask_early 4.9u (mask_all 2.0u, resid_* 1.3u) and
# sink scores 2.9u. Hence: every per-layer magnitude within 8u of the largest value of its column, and every sink
# score (a probability) within 4u absolute. (Logits formed in bfloat16 would err by about u times a logit of
# several nats, tens of u of a magnitude: an estimate, not measured.)
BF16_U = 2.0**-8
MAGNITUDE_TOLERANCE_U = 8


@pytest.mark.slow
def test_bfloat16_analysis_of_smollm2_agrees_with_float32_within_its_precision() -> None:
    """The same sequences analysed with the model in float32 and in bfloat16: magnitudes and sink scores agree
    within a few u of bfloat16 (see above), they are not identical (the bfloat16 forward really ran), and the
    manifest records the dtype."""
    config = AnalyzeConfig(seq_len=64, num_seqs=4, bootstrap=0)
    full = analyze("smollm2-135m", config, progress=False)
    half = analyze("smollm2-135m", config.replace(dtype="bfloat16"), progress=False)
    assert full.manifest["model"]["dtype"] == "float32"
    assert half.manifest["model"]["dtype"] == "bfloat16"
    assert half.manifest["placement"]["requested"]["dtype"] == "bfloat16"
    differs = 0.0
    for column in ("mask_early", "mask_all", "resid_early", "resid_all"):
        a, b = full.per_layer[column].to_numpy(), half.per_layer[column].to_numpy()
        assert np.abs(b - a).max() <= MAGNITUDE_TOLERANCE_U * BF16_U * np.abs(a).max(), column
        differs = max(differs, float(np.abs(b - a).max()))
    sink_a, sink_b = full.per_head["sink_score"].to_numpy(), half.per_head["sink_score"].to_numpy()
    assert np.abs(sink_b - sink_a).max() <= 4 * BF16_U
    assert differs > 1e-6, "bfloat16 gave the float32 numbers: the dtype did not reach the model"


@pytest.mark.parametrize("measure_budget", ["0", IN_FORWARD])
def test_a_run_without_next_token_scores_has_the_same_tables_and_no_tokens(tmp_path: Path, measure_budget: str) -> None:
    """scores=False (what `paper` asks of its nulls): every table bit for bit the run's with scores, no tokens table
    in memory or in the folder (read back empty), and a fingerprint of its own; with scores the identity is as
    before the option existed."""
    scored = _tiny_run(tmp_path / "scored", measure_budget=measure_budget)
    bare = _tiny_run(tmp_path / "bare", measure_budget=measure_budget, scores=False)
    for name in AnalysisResult.TABLES:
        pd.testing.assert_frame_equal(getattr(bare, name), getattr(scored, name), check_exact=True)
    assert len(scored.tokens) == 6 * 39 and bare.tokens.empty
    assert (tmp_path / "scored" / "tokens.parquet").is_file() and not (tmp_path / "bare" / "tokens.parquet").exists()
    assert AnalysisResult.read(RunFolder(tmp_path / "bare")).tokens.empty
    assert "scores" not in AnalyzeConfig().identity() and AnalyzeConfig(scores=False).identity()["scores"] is False
