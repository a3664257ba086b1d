"""`posleak analyze` end to end: real models against the brute-force reference, the run folder,
resuming, bad input on the command line, and position 0 on the real models."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cli import assert_one_line_error, run_cli
from reference import check_against_reference
from tiny import tiny_model, tiny_tokenizer

from posleak import analyze as analyze_module
from posleak.analyze import AnalysisResult, AnalyzeConfig, analyze_model, sequences_for
from posleak.capture import CaptureSession, QueryStats, ResidualCapture, closed_system, use_posleak_attention
from posleak.data.batches import TokenBatch
from posleak.errors import PosleakError
from posleak.intervene import Interventions
from posleak.intervene.effect import effect_table
from posleak.measure import LAYER_MAGNITUDES
from posleak.models.load import LoadedModel

TOLERANCE = 1e-5


def _batch(ids: torch.Tensor) -> TokenBatch:
    return TokenBatch(
        ids=ids,
        bos_policy="verbatim",
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
    config = dataclasses.replace(AnalyzeConfig(seq_len=40, num_seqs=6, batch_size=2, bootstrap=50), **changes)
    return analyze_model(model, _batch(ids), config, out=tmp_path, model_id="tiny-gemma3", progress=False)


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
    assert list(result.per_layer["layer_type"]) == ["sliding_attention", "sliding_attention", "full_attention"]
    assert set(result.per_head.columns) == {
        "layer",
        "head",
        "sink_score",
        "mask_early",
        "mask_all",
        "resid_early",
        "resid_all",
        "resid_early_raw",
        "resid_all_raw",
        "dr2_logit",
        "dr2_logattn",
    }
    bounds = result.per_layer
    for name in LAYER_MAGNITUDES:
        assert (bounds[f"{name}_lo"] <= bounds[name] + 1e-12).all() and (
            bounds[name] <= bounds[f"{name}_hi"] + 1e-12
        ).all()
    # a finished run is read back, not recomputed
    again = _tiny_run(tmp_path / "run")
    assert again.per_layer.equals(result.per_layer)


def test_interrupted_run_resumes_without_redoing_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = _tiny_run(None)
    monkeypatch.setattr(analyze_module, "CHECKPOINT_EVERY_S", 0.0)
    calls = {"n": 0}
    original = CaptureSession.forward

    def interrupted(self, model, input_ids, sequence_index=None, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the third batch of three: two are checkpointed
            raise KeyboardInterrupt
        return original(self, model, input_ids, sequence_index, **kwargs)

    monkeypatch.setattr(CaptureSession, "forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _tiny_run(tmp_path / "run")
    assert not (tmp_path / "run" / "manifest.json").exists()  # nothing that looks finished
    calls["n"] = 10  # from here on no interruption; count what the resumed run recomputes
    resumed = _tiny_run(tmp_path / "run")
    assert calls["n"] == 11, "the resumed run should redo only the unfinished third batch"
    for name in ("per_head", "per_layer", "position0"):
        a, b = getattr(resumed, name), getattr(reference, name)
        np.testing.assert_allclose(a.select_dtypes("number"), b.select_dtypes("number"), rtol=1e-12, atol=1e-12)


def test_resuming_with_other_arguments_is_refused(tmp_path: Path) -> None:
    _tiny_run(tmp_path / "run")
    with pytest.raises(PosleakError, match="different run"):
        _tiny_run(tmp_path / "run", early=8)


def test_window_override_is_recorded_in_the_tables(tmp_path: Path) -> None:
    result = _tiny_run(None, interventions=Interventions(window="global"))
    assert list(result.per_layer["window"]) == [0, 0, 0]
    assert result.manifest["interventions"] == [{"window": "global"}]


def test_paired_effect_of_a_null_intervention_is_zero() -> None:
    base = _tiny_run(None)
    effect = effect_table(base, base)
    assert (
        np.allclose(effect["pct_change"], 0) and np.allclose(effect["pct_lo"], 0) and np.allclose(effect["pct_hi"], 0)
    )
    assert set(effect["layer"]) == {-1, 0, 1, 2}


# ----------------------------------------------------------------------------------- real models


def _real_ids(loaded: LoadedModel, seq_len: int, num_seqs: int, bos: str = "auto") -> torch.Tensor:
    config = AnalyzeConfig(seq_len=seq_len, num_seqs=num_seqs, bos=bos)
    return sequences_for(loaded, config).ids


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "seq_len", "resamples"),
    [("smollm2", 128, 0), ("smollm2", 128, 20), ("gemma3", 128, 0), ("gemma3", 640, 0)],
)
def test_real_models_match_brute_force(name: str, seq_len: int, resamples: int, request: pytest.FixtureRequest) -> None:
    """Without resamples the exact grid's point estimate takes the row-block path (exact.py), with them
    the per-cell one (components.py)."""
    loaded: LoadedModel = request.getfixturevalue(name)
    ids = _real_ids(loaded, seq_len, 3 if seq_len > 512 else 4)
    errors = check_against_reference(loaded.model, ids, "exact", early=32, tolerance=TOLERANCE, resamples=resamples)
    assert max(errors.values()) <= TOLERANCE


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
    from posleak.experiments.paper import position0_states
    from posleak.intervene.effect import without_bos
    from posleak.measure.position0 import fingerprint_constancy

    batch = sequences_for(gemma3, AnalyzeConfig(seq_len=32, num_seqs=8, bos="auto"))
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
def test_memory_at_8192_tokens_completes(smollm2: LoadedModel) -> None:
    """DESIGN's streaming promise: the coarse grid at T = 8192 (N = 2) runs on this 2-core, 24 GiB machine."""
    config = AnalyzeConfig(seq_len=8192, num_seqs=2, batch_size=1, cross_documents=True, bootstrap=20)
    result = analyze_model(smollm2.model, sequences_for(smollm2, config), config, loaded=smollm2, progress=False)
    assert np.isfinite(result.per_layer["mask_all"]).all() and np.isfinite(result.per_layer["resid_all"]).all()


# ----------------------------------------------------------------------------------- bad input


def test_inspect_missing_path_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("inspect", "/no/such/path"), "/no/such/path")


@pytest.mark.slow
def test_sequence_longer_than_the_model_allows(smollm2: LoadedModel, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert_one_line_error(
        run_cli("analyze", "smollm2-135m", "--seq-len", "100000", "--num-seqs", "1", "--out", str(out)), "100000"
    )
    assert not out.exists() or not any(out.iterdir())


def test_bos_on_without_a_bos_token(tmp_path: Path) -> None:
    """A real checkpoint folder on disk whose tokenizer has no BOS token."""
    folder = tmp_path / "no-bos-model"
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer(bos=False).save_pretrained(folder)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"w{k % 90 + 2}" for k in range(2000)))
    out = tmp_path / "run"
    args = ["analyze", str(folder), "--bos", "on", "--corpus", str(corpus), "--seq-len", "32", "--out", str(out)]
    assert_one_line_error(run_cli(*args), "BOS")
    assert not out.exists()
