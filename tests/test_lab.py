"""Tests of posleak.lab on real tiny lab models: position encodings, masks and norms do what they say,
the posleak attention path matches an explicit reference, the trainer learns, is deterministic and
resumes exactly, and a lab / sweep runs end to end (the Ray sweep is marked slow).

The reference attention below is written from the definitions (ALiBi as an explicit −slope·(i − j) bias,
the masks from the attention string, the three normalisations), not from posleak's code, and is
registered with transformers' AttentionInterface so the same lab model runs under either.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from cli import assert_error_lines, file_stamps, run_cli, run_main, strict_json_files
from harness import analyze_recorded, errors_of
from ray_hooks import plan_fault
from reference import assert_close
from safetensors.torch import load_file
from torch.optim.optimizer import register_optimizer_step_pre_hook
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

from posleak.capture import CaptureSession, QueryStats, use_posleak_attention
from posleak.capture.session import AttentionCall
from posleak.cli import main
from posleak.errors import PosleakError
from posleak.lab import checkpoint as checkpoint_module
from posleak.lab.choices import TASK_EVAL, TASK_TRAIN, TaskLab
from posleak.lab.data import lab_sequences, prepare_data
from posleak.lab.plan import run_plan
from posleak.lab.sweep import SweepSpec
from posleak.lab.tasks import generate
from posleak.lab.train_config import outcome
from posleak.lab.trainer import TrainConfig, train
from posleak.lab.trial import MARKER, EvalConfig, Trial, trial_folder
from posleak.lab.variants import LAB_COLUMNS, LabRun
from posleak.measure.probe import PROBE_COLUMNS, ProbeConfig, probe_positions
from posleak.models.lab.config import NORMS, PE_KINDS, LabSpec
from posleak.models.lab.hf_config import LabConfig
from posleak.models.lab.model import LabForCausalLM, build_lab_model, load_lab_model, register_lab_model

VOCAB = 96
T = 48
WINDOW = 8
PREFIX = 12
REFERENCE = "lab_reference"


def _config(pe: str = "rope", norm: str = "softmax", attention: str = "causal", layers: int = 2) -> LabConfig:
    spec = LabSpec(size="tiny", pe=pe, norm=norm, attention=attention)
    config = LabConfig.from_spec(spec, VOCAB, 4 * T, bos_id=0, eos_id=1)
    config.num_hidden_layers = layers
    return config


def _model(pe: str = "rope", norm: str = "softmax", attention: str = "causal", layers: int = 2) -> LabForCausalLM:
    model = build_lab_model(_config(pe, norm, attention, layers), seed=0).eval()
    # Non-zero sinks and biases, so that the tests see them act.
    with torch.no_grad():
        for block in model.model.layers:
            if block.self_attn.sink is not None:
                block.self_attn.sink.copy_(torch.linspace(-1.0, 2.0, block.self_attn.num_heads))
            if block.self_attn.logit_bias is not None:
                block.self_attn.logit_bias.add_(torch.linspace(-0.5, 0.5, block.self_attn.num_heads))
    return model


def _ids(batch: int = 2, seq_len: int = T, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


class Recorder:
    """An accumulator that keeps every layer's AttentionCall (fine at these sizes)."""

    needs_attended_keys = False

    def __init__(self) -> None:
        self.calls: dict[int, AttentionCall] = {}

    def update(self, call: AttentionCall) -> None:
        self.calls[call.layer] = call


def _record(model: LabForCausalLM, ids: torch.Tensor, **kwargs: object) -> dict[int, AttentionCall]:
    recorder = Recorder()
    CaptureSession([recorder]).forward(model, ids, **kwargs)
    return recorder.calls


def _raw_logits(call: AttentionCall) -> torch.Tensor:
    """scale · q · k over every pair, no mask: the true logits (q and k carry ALiBi and the bias)."""
    return call.query @ call.key.transpose(-1, -2) * call.scaling


def _valid(attention: str, seq_len: int) -> torch.Tensor:
    """The mask written from the definitions of causal / window:W / prefix:P."""
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    valid = j <= i
    kind, _, value = attention.partition(":")
    if kind == "window":
        valid &= (i - j) < int(value)
    if kind == "prefix":
        valid |= (i < int(value)) & (j < int(value))
    return valid


def reference_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Attention from the definitions, on the un-augmented q and k of the lab module."""
    config, dim = module.config, module.head_dim
    q, k, v = query[..., :dim], key[..., :dim], value[..., :dim]
    heads, seq_len = q.shape[1], q.shape[2]
    logits = q @ k.transpose(-1, -2) * scaling
    offsets = (torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]).to(logits)
    if config.pe == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
        logits = logits - slopes[:, None, None] * offsets
    if config.norm == "sigmoid":
        logits = logits + module.logit_bias[:, None, None]
    logits = logits.masked_fill(~_valid(config.attention, seq_len), float("-inf"))
    if config.norm == "sigmoid":
        weights = torch.sigmoid(logits)
    elif config.norm == "sink":
        sink = module.sink[None, :, None, None].expand(*logits.shape[:-1], 1)
        weights = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :seq_len]
    else:
        weights = torch.softmax(logits, dim=-1)
    out = torch.nn.functional.pad(weights @ v, (0, value.shape[-1] - dim))
    return out.transpose(1, 2), None


AttentionInterface.register(REFERENCE, reference_attention)


# ------------------------------------------------------------------------------------------ parity


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("pe", PE_KINDS)
def test_posleak_path_matches_the_reference(pe: str, norm: str) -> None:
    ids = _ids()
    for attention in ("causal", f"window:{WINDOW}", f"prefix:{PREFIX}"):
        model = _model(pe, norm, attention)
        with torch.no_grad():
            ours = model(ids).logits
            model.set_attn_implementation(REFERENCE)
            reference = model(ids).logits
            use_posleak_attention(model)
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5, msg=f"{pe}/{norm}/{attention}")
        # The captured path (flash kernel with log Z, sink folded after) computes the same.
        session = CaptureSession([QueryStats()])
        with session.active(torch.arange(ids.shape[0])), torch.no_grad():
            captured = model(ids).logits
        assert dict(session.calls) == {0: 1, 1: 1}
        torch.testing.assert_close(captured, reference, rtol=1e-5, atol=1e-5, msg=f"captured {pe}/{norm}/{attention}")


def test_builtin_attention_is_refused() -> None:
    model = _model()
    model.set_attn_implementation("eager")  # what a plain from_pretrained gives
    with pytest.raises(PosleakError, match="use_posleak_attention"):
        model(_ids())


# -------------------------------------------------------------------------------- position encodings


def test_nope_logits_are_invariant_to_a_shift_of_position_ids() -> None:
    model, ids = _model("nope"), _ids()
    shifted = torch.arange(T).expand(2, T) + 37
    with torch.no_grad():
        assert torch.equal(model(ids).logits, model(ids, position_ids=shifted).logits)


def test_rope_logits_depend_only_on_the_offset() -> None:
    model = _model("rope")
    # The same token everywhere: layer 0's q_i and k_j differ only by their rotation, so s_ij = f(i − j).
    same = torch.full((1, T), 5)
    logits = _raw_logits(_record(model, same)[0])[0]  # (H, T, T)
    for offset in range(T):
        diagonal = torch.diagonal(logits, offset=-offset, dim1=-2, dim2=-1)
        torch.testing.assert_close(diagonal, diagonal[:, :1].expand_as(diagonal), rtol=1e-5, atol=1e-5)
    # For any content, shifting every position id changes no logit of any layer.
    ids = _ids()
    base = _record(model, ids)
    shifted = _record(model, ids, position_ids=torch.arange(T).expand(2, T) + 1000)
    for layer in base:
        torch.testing.assert_close(_raw_logits(shifted[layer]), _raw_logits(base[layer]), rtol=1e-4, atol=1e-4)
    # A learned absolute encoding, by contrast, makes the same-token logits depend on i itself.
    learned = _raw_logits(_record(_model("learned"), same)[0])[0]
    first = torch.diagonal(learned, offset=-1, dim1=-2, dim2=-1)
    assert (first - first[:, :1]).abs().max() > 1e-3


@pytest.mark.parametrize("start", [0, 4000])
def test_alibi_adds_exactly_minus_slope_times_offset(start: int) -> None:
    """ALiBi and NoPE models with the same weights: their logits differ by −slope_h·(i − j), also far out."""
    alibi, nope = _model("alibi"), _model("nope")
    nope.load_state_dict(alibi.state_dict())
    ids = _ids(seq_len=256)
    positions = torch.arange(256).expand(2, 256) + start
    with_alibi = _raw_logits(_record(alibi, ids, position_ids=positions)[0])
    without = _raw_logits(_record(nope, ids, position_ids=positions)[0])
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    offsets = (torch.arange(256)[:, None] - torch.arange(256)[None, :]).float()
    expected = without - slopes[None, :, None, None] * offsets
    valid = _valid("causal", 256)
    # float32 rounding of the folded columns: |slope·√D·i| reaches ~1.7e4 at i = 4255, error ~1e-3 there.
    tolerance = 2e-5 if start == 0 else 2e-3
    assert (with_alibi - expected)[..., valid].abs().max() < tolerance


# ------------------------------------------------------------------------------------------- masks


def _log_z_from_definition(call: AttentionCall, attention: str, norm: str) -> torch.Tensor:
    logits = _raw_logits(call).masked_fill(~_valid(attention, call.seq_len), float("-inf"))
    if norm == "sink":
        logits = torch.cat([logits, call.sink[None, :, None, None].expand(*logits.shape[:-1], 1)], dim=-1)
    return torch.logsumexp(logits, dim=-1)


@pytest.mark.parametrize("norm", ["softmax", "sink"])
def test_window_masks_exactly_the_offsets_at_least_w(norm: str) -> None:
    attention = f"window:{WINDOW}"
    model, ids = _model("rope", norm, attention, layers=1), _ids()
    call = _record(model, ids)[0]
    # The normaliser the kernel computed is the log-sum-exp over exactly d < W (plus the sink).
    torch.testing.assert_close(call.log_z, _log_z_from_definition(call, attention, norm), rtol=1e-5, atol=1e-5)
    # So the weights on the keys with d < W (and the sink) already sum to 1: every key at d ≥ W gets 0.
    weights = torch.exp(_raw_logits(call) - call.log_z[..., None]) * _valid(attention, T)
    total = weights.sum(-1) + (torch.exp(call.sink[None, :, None] - call.log_z) if norm == "sink" else 0.0)
    torch.testing.assert_close(total, torch.ones_like(total), rtol=1e-5, atol=1e-5)
    # Behaviour: with one layer, the output at i ignores token j exactly when i − j ≥ W.
    query = T - 1
    with torch.no_grad():
        base = model(ids).logits[:, query]
        for key in (query - WINDOW, query - WINDOW + 1):
            changed = ids.clone()
            changed[:, key] = (changed[:, key] + 1) % VOCAB
            out = model(changed).logits[:, query]
            if query - key >= WINDOW:
                assert torch.equal(out, base), "a key at offset ≥ W reached the query"
            else:
                assert not torch.allclose(out, base), "a key at offset < W did not reach the query"


def test_prefix_queries_see_their_whole_prefix() -> None:
    attention = f"prefix:{PREFIX}"
    model, ids = _model("rope", "softmax", attention, layers=1), _ids()
    call = _record(model, ids)[0]
    torch.testing.assert_close(call.log_z, _log_z_from_definition(call, attention, "softmax"), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        base = model(ids).logits
        last_of_prefix = ids.clone()
        last_of_prefix[:, PREFIX - 1] = (last_of_prefix[:, PREFIX - 1] + 1) % VOCAB
        after = ids.clone()
        after[:, PREFIX] = (after[:, PREFIX] + 1) % VOCAB
        moved = model(last_of_prefix).logits
        untouched = model(after).logits
    # Every prefix query, position 0 included, sees the prefix's last token...
    assert all(not torch.allclose(moved[:, i], base[:, i]) for i in range(PREFIX))
    # ...and none sees the first token after the prefix, which the next query does.
    assert torch.equal(untouched[:, :PREFIX], base[:, :PREFIX])
    assert not torch.allclose(untouched[:, PREFIX], base[:, PREFIX])


# ---------------------------------------------------------------------------------------- norms


@pytest.mark.parametrize(
    ("pe", "norm", "attention"),
    [
        ("rope", "softmax", "causal"),
        ("rope", "sink", "causal"),
        ("rope", "sigmoid", "causal"),
        ("alibi", "softmax", f"window:{WINDOW}"),
        ("learned", "softmax", "causal"),
        ("nope", "sink", "causal"),
    ],
)
def test_lab_models_match_brute_force(pe: str, norm: str, attention: str) -> None:
    """The default analysis of lab models (ALiBi and the logit bias live in q and k) against the float64
    brute force of the definitions; sigmoid attention has log Z ≡ 0, so the count term is 0 exactly, the row term c
    is the row mean of s − g, and the shift is NaN (no distribution over keys)."""
    result, recorder = analyze_recorded(_model(pe, norm, attention), _ids(batch=6))
    assert_close(errors_of(result, recorder), 1e-5)
    if norm == "sigmoid":
        assert (result.per_head[["mask_count_early", "mask_count_all"]] == 0).all().all()
        assert (result.profiles["m_count"] == 0).all() and result.per_head["resid_all_raw"].min() > 0
        assert result.per_head["shift_kl_all"].isna().all()


def test_sink_logit_enters_log_z() -> None:
    model, ids = _model("rope", "sink"), _ids()
    call = _record(model, ids)[0]
    torch.testing.assert_close(call.log_z, _log_z_from_definition(call, "causal", "sink"), rtol=1e-5, atol=1e-5)
    assert bool((call.log_z > call.log_z_keys).all())


def test_lab_models_start_from_torchs_initialisation_and_older_ones_load_as_saved(tmp_path: Path) -> None:
    """A new lab model: an output layer of its own, embeddings N(0, 1), every linear weight U(±1/√fan_in), a
    sinusoidal term of per-dimension rms 1 (the token embeddings'). A model saved under the old scheme
    (transformers' N(0, 0.02), tied embeddings) loads with its output layer tied and its sinusoidal term at
    0.02·√2, and gives the logits it gave when saved."""
    model = build_lab_model(_config("sinusoidal"), seed=0)
    embedding = model.model.embed_tokens.weight.detach()
    assert model.lm_head.weight.data_ptr() != embedding.data_ptr()
    assert abs(float(embedding.std()) - 1.0) < 0.03 and abs(float(embedding.mean())) < 0.03
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 4 * 2 + 1  # qkv, o, up and down in each of the 2 blocks, and the output layer
    for linear in linears:
        bound = 1.0 / math.sqrt(linear.in_features)
        weight = linear.weight.detach()
        assert float(weight.abs().max()) <= bound
        assert float(weight.std()) == pytest.approx(bound / math.sqrt(3.0), rel=0.05)
    positions = torch.arange(T)[None]
    with torch.no_grad():
        term = model.model._absolute_positions(positions, torch.float32)
    assert float(term.pow(2).mean().sqrt()) == pytest.approx(1.0, rel=0.02)

    old_config = _config("sinusoidal")
    old_config.initializer_range, old_config.tie_word_embeddings = 0.02, True
    old = build_lab_model(old_config, seed=0).eval()
    assert old.lm_head.weight.data_ptr() == old.model.embed_tokens.weight.data_ptr()
    assert float(old.model.embed_tokens.weight.detach().std()) == pytest.approx(0.02, rel=0.05)
    ids = _ids()
    with torch.no_grad():
        before = old(input_ids=ids).logits
    old.save_pretrained(tmp_path)
    loaded = load_lab_model(str(tmp_path))
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(loaded.model._absolute_positions(positions, torch.float32), term * 0.02)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, before, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ probe


def test_probe_finds_learned_positions_and_the_control_does_not() -> None:
    model = _model("learned")
    with torch.no_grad():
        model.model.embed_positions.weight.mul_(50.0)  # position dominates the input
    table = probe_positions(model, _ids(batch=16, seed=3), ProbeConfig(layers=(1,)))
    assert list(table.columns) == list(PROBE_COLUMNS)
    row = table[table["target"] == "log1p"].iloc[0]
    assert row["r2"] > 0.9 and row["r2_shuffled"] < 0.2


# ------------------------------------------------------------------------------------------ trainer

TINY_TRAIN = TrainConfig(steps=24, seq_len=32, batch_size=8, lr=3e-3, warmup_steps=4, eval_every=8, checkpoint_every=8)


def test_trainer_lowers_the_loss_and_saves_a_loadable_model(tmp_path: Path) -> None:
    result = train(LabSpec(size="tiny"), TINY_TRAIN, tmp_path, progress=False)
    metrics = result.metrics
    assert list(metrics.columns) == ["step", "train_loss", "val_loss", "val_acc", "tokens_per_s"]
    assert metrics["step"].tolist() == list(range(1, 25))
    assert metrics["val_acc"].isna().all()  # a corpus run has no exact match
    assert metrics["train_loss"].iloc[0] > math.log(512) - 0.1
    val = metrics["val_loss"].dropna()
    assert val.iloc[-1] < metrics["train_loss"].iloc[0] - 0.8
    assert pd.read_parquet(tmp_path / "metrics.parquet").equals(metrics)
    register_lab_model()
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(model, LabForCausalLM)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.bos_token_id == model.config.bos_token_id == 0
    record = json.loads((tmp_path / "train.json").read_text())
    assert (record["train"]["steps"], record["stopped_step"], record["stop_reason"]) == (24, 24, "cap")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_same_seed_same_weights_and_resume_equals_uninterrupted(tmp_path: Path) -> None:
    config = TrainConfig(steps=12, seq_len=32, batch_size=4, warmup_steps=2, eval_every=6, checkpoint_every=6)
    spec = LabSpec(size="tiny", pe="alibi", norm="sink")
    first = train(spec, config, tmp_path / "a", progress=False)
    train(spec, config, tmp_path / "b", progress=False)
    resumed_part = train(spec, config, tmp_path / "c", until=5, progress=False)
    assert not resumed_part.finished and not (tmp_path / "c" / "model.safetensors").exists()
    resumed = train(spec, config, tmp_path / "c", progress=False)
    a, b, c = (_weights(tmp_path / name) for name in "abc")
    assert a.keys() == b.keys() == c.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"same seed, different {name}"
        assert torch.equal(a[name], c[name]), f"resumed run differs in {name}"
    assert resumed.metrics["train_loss"].tolist() == first.metrics["train_loss"].tolist()
    other = train(spec, TrainConfig(**{**config.to_dict(), "seed": 1}), tmp_path / "d", progress=False)
    embedding = "model.embed_tokens.weight"
    assert other.finished and not torch.equal(_weights(tmp_path / "d")[embedding], a[embedding])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_training_runs_in_its_dtype_resumes_exactly_and_is_its_own_run(
    tmp_path: Path, dtype: str
) -> None:
    """--dtype bfloat16|float16 trains in mixed precision: the forward under the run's precision computes in that
    dtype while the weights stay float32; its losses differ from float32's by about the dtype's roundoff (they
    would be equal if autocast had not run); a run interrupted off a checkpoint (float16: with its gradient
    scale) ends with the same weights; the dtype is part of the run's identity, float32 and the device are not
    (so the trial keys of earlier float32 runs stay)."""
    spec = LabSpec(size="tiny", pe="rope")
    base = TrainConfig(steps=8, seq_len=16, batch_size=4, warmup_steps=2, eval_every=4, checkpoint_every=3)
    mixed = replace(base, dtype=dtype)
    model = build_lab_model(LabConfig.from_spec(spec, VOCAB, 64, 0, 1), seed=0)
    with mixed.precision(torch.device("cpu")):
        logits = model(input_ids=torch.randint(VOCAB, (2, 16))).logits
    assert logits.dtype == getattr(torch, dtype) and model.lm_head.weight.dtype == torch.float32

    plain = train(spec, base, tmp_path / "float32", progress=False)
    whole = train(spec, mixed, tmp_path / "whole", progress=False)
    train(spec, mixed, tmp_path / "resumed", until=4, progress=False)
    resumed = train(spec, mixed, tmp_path / "resumed", progress=False)
    gap = (whole.metrics["train_loss"] - plain.metrics["train_loss"]).abs()
    roundoff = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    assert 0 < gap.max() < 64 * roundoff * plain.metrics["train_loss"].max()
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed.metrics["train_loss"].tolist() == whole.metrics["train_loss"].tolist()

    assert json.loads((tmp_path / "whole" / "train.json").read_text())["train"]["dtype"] == dtype
    assert "dtype" not in base.to_dict() and "device" not in base.to_dict()
    assert replace(base, device="cpu").to_dict() == base.to_dict()
    with pytest.raises(PosleakError, match="different run"):
        train(spec, base, tmp_path / "whole", progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_train_and_lab_refuse_a_device_this_machine_lacks_before_any_work(tmp_path: Path) -> None:
    for command in ("train", "lab"):
        proc = run_main(command, "--device", "cuda", "--steps", "2", "--out", str(tmp_path / command))
        assert_error_lines(proc, "--device cuda: this machine has no CUDA device")
        assert not (tmp_path / command).exists()


def test_cli_train_and_a_finished_run_is_not_retrained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["train", "--pe", "nope", "--steps", "4", "--seq-len", "16", "--batch-size", "4", "--eval-every", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    stamp = (tmp_path / "train.json").stat().st_mtime_ns
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "train.json").stat().st_mtime_ns == stamp
    assert main([*argv, "--pe", "rope", "--out", str(tmp_path)]) == 2
    assert "different run" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- lab, sweep

TINY_EVAL = EvalConfig(probe_seqs=8, analyze_seqs=4, batch_size=4, bootstrap=0)


def test_lab_writes_its_table_and_report(tmp_path: Path) -> None:
    train_config = TrainConfig(steps=6, seq_len=32, batch_size=4, warmup_steps=2, eval_every=3, checkpoint_every=6)
    config = LabRun(train=train_config, eval=TINY_EVAL, variants=("rope", "rope-ntk", "sigmoid"))
    table = run_plan(config.plan(), tmp_path, progress=False).table
    assert list(table.columns[: len(LAB_COLUMNS)]) == list(LAB_COLUMNS)
    assert table["variant"].tolist() == ["rope", "rope-ntk", "sigmoid"]
    assert (tmp_path / "lab.parquet").is_file() and (tmp_path / "report.html").is_file()
    # rope-ntk reuses the rope training: one model folder for the two.
    assert len(list((tmp_path / "models").glob("*/train.json"))) == 2
    sigmoid = table.set_index("variant").loc["sigmoid"]
    assert sigmoid["mask_all"] == 0.0
    assert table["ppl_1x"].between(1.0, 600.0).all()


def _sweep_spec() -> SweepSpec:
    return SweepSpec.from_dict(
        {
            "name": "test",
            "base": {"size": "tiny", "steps": 4, "seq_len": 32, "batch_size": 4, "eval_every": 2, "warmup_steps": 1},
            "grid": {"pe": ["rope", "nope"]},
            "seeds": [0, 1],
            "eval": {"length_multiples": [1], "probe_seqs": 8, "analyze_seqs": 4, "batch_size": 4, "bootstrap": 0},
        }
    )


def _markers(out: Path, spec: SweepSpec) -> dict[str, tuple[int, str]]:
    stamps = {}
    for trial in spec.trials():
        marker = trial_folder(out, trial) / MARKER
        stamps[trial.key] = (marker.stat().st_mtime_ns, json.loads(marker.read_text())["finished_utc"])
    return stamps


def test_sweep_spec_errors_name_the_problem() -> None:
    with pytest.raises(PosleakError, match="unknown options"):
        SweepSpec.from_dict({"grid": {"colour": ["red"]}})
    with pytest.raises(PosleakError, match="non-empty list"):
        SweepSpec.from_dict({"grid": {"pe": "rope"}})
    assert len(_sweep_spec().trials()) == 4
    assert len({trial.key for trial in _sweep_spec().trials()}) == 4


@pytest.mark.slow
def test_sweep_on_a_local_ray_cluster_reruns_nothing(tmp_path: Path) -> None:
    spec = _sweep_spec()
    table = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert len(table) == 4 and set(table["pe"]) == {"rope", "nope"} and set(table["seed"]) == {0, 1}
    first = _markers(tmp_path, spec)
    again = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert _markers(tmp_path, spec) == first, "a finished trial ran again"
    pd.testing.assert_frame_equal(again, table)
    assert (tmp_path / "sweep.parquet").is_file() and (tmp_path / "report.html").is_file()


# ------------------------------------------------------------------------------------ resuming where it is hard


@contextmanager
def _optimizer_steps(interrupt_before: int | None = None) -> Iterator[list[int]]:
    """Counts the optimizer steps taken inside the block (every torch optimizer, through torch's global step
    hook); raises KeyboardInterrupt, as a Ctrl-C would, just before step number `interrupt_before`."""
    count = [0]

    def hook(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        count[0] += 1
        if count[0] == interrupt_before:
            raise KeyboardInterrupt

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield count
    finally:
        handle.remove()


RESUME_TRAIN = TrainConfig(steps=12, seq_len=32, batch_size=4, warmup_steps=2, eval_every=4, checkpoint_every=5)
RESUME_SPEC = LabSpec(size="tiny", pe="rope", norm="sink")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RESUME_SPEC trained for RESUME_TRAIN's 12 steps in one go."""
    out = tmp_path_factory.mktemp("uninterrupted")
    train(RESUME_SPEC, RESUME_TRAIN, out, progress=False)
    return out


@pytest.mark.parametrize("where", ["between checkpoints", "while writing a checkpoint"])
def test_training_interrupted_off_a_checkpoint_resumes_to_the_same_run(
    where: str, uninterrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints at steps 5 and 10 of 12. Interrupted before step 8 (steps 6 and 7 done and lost), or while the
    step-10 checkpoint is half written, the rerun goes back to step 5, takes the 7 steps left, and ends with the
    weights and losses of the uninterrupted run."""
    if where == "between checkpoints":
        with _optimizer_steps(interrupt_before=8), pytest.raises(KeyboardInterrupt):
            train(RESUME_SPEC, RESUME_TRAIN, tmp_path, progress=False)
    else:
        saves = [0]
        real_save_file = checkpoint_module.save_file

        def save_file(tensors: dict[str, torch.Tensor], path: str) -> None:  # the optimizer state of a checkpoint
            saves[0] += 1
            if saves[0] == 2:
                raise KeyboardInterrupt
            real_save_file(tensors, path)

        monkeypatch.setattr(checkpoint_module, "save_file", save_file)
        with pytest.raises(KeyboardInterrupt):
            train(RESUME_SPEC, RESUME_TRAIN, tmp_path, progress=False)
        monkeypatch.undo()
        assert (tmp_path / "checkpoints" / ".step-000010.tmp" / "model.safetensors").is_file()  # half a checkpoint
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000005"
    assert not (tmp_path / "train.json").exists()

    with _optimizer_steps() as steps:
        resumed = train(RESUME_SPEC, RESUME_TRAIN, tmp_path, progress=False)
    assert steps[0] == 12 - 5
    reference, weights = _weights(uninterrupted), _weights(tmp_path)
    assert reference.keys() == weights.keys()
    for name in reference:
        assert torch.equal(weights[name], reference[name]), name
    expected = pd.read_parquet(uninterrupted / "metrics.parquet")
    assert resumed.metrics["step"].tolist() == list(range(1, 13))
    for column in ("train_loss", "val_loss"):
        np.testing.assert_array_equal(resumed.metrics[column], expected[column])


RESUME_SWEEP = {
    "name": "resume",
    "base": {
        "size": "tiny",
        "steps": 6,
        "seq_len": 32,
        "batch_size": 4,
        "eval_every": 3,
        "eval_seqs": 8,
        "warmup_steps": 1,
        "checkpoint_every": 2,
    },
    "grid": {"pe": ["rope", "nope", "alibi"]},
    "seeds": [0],
    "eval": {"length_multiples": [1], "probe_seqs": 8, "analyze_seqs": 4, "batch_size": 4, "bootstrap": 0},
}
TIMINGS = ["train_s", "eval_s"]


@pytest.fixture(scope="module")
def reference_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """RESUME_SWEEP run once, uninterrupted, one trial after the other in this process."""
    out = tmp_path_factory.mktemp("reference-sweep")
    return out, run_plan(SweepSpec.from_dict(RESUME_SWEEP).plan(), out, progress=False, jobs=1).table


def _assert_same_results(table: pd.DataFrame, reference: pd.DataFrame) -> None:
    """Every column but the timings equal, bit for bit: training and measuring are deterministic."""
    pd.testing.assert_frame_equal(table.drop(columns=TIMINGS), reference.drop(columns=TIMINGS), check_exact=True)


def test_sweep_interrupted_mid_trial_resumes_without_redoing_finished_trials(
    tmp_path: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """Interrupted in the second trial's training (step 3 done, checkpoint at 2), a rerun leaves the first trial's
    files alone, takes the second from its checkpoint and the third from scratch, and ends equal to the
    uninterrupted sweep."""
    spec = SweepSpec.from_dict(RESUME_SWEEP)
    first, second, _ = spec.trials()
    with _optimizer_steps(interrupt_before=6 + 4), pytest.raises(KeyboardInterrupt):
        run_plan(spec.plan(), tmp_path, progress=False, jobs=1)
    assert (trial_folder(tmp_path, first) / MARKER).is_file()
    assert not (trial_folder(tmp_path, second) / MARKER).exists()
    assert (tmp_path / "models" / second.train_key / "checkpoints" / "latest").read_text().strip() == "step-000002"
    finished = file_stamps(trial_folder(tmp_path, first), tmp_path / "models" / first.train_key)

    with _optimizer_steps() as steps:
        table = run_plan(spec.plan(), tmp_path, progress=False, jobs=1).table
    assert steps[0] == (6 - 2) + 6
    assert file_stamps(trial_folder(tmp_path, first), tmp_path / "models" / first.train_key) == finished
    _assert_same_results(table, reference_sweep[1])


def _run_interval(out: Path, trial: Trial) -> tuple[datetime, datetime]:
    record = json.loads((trial_folder(out, trial) / MARKER).read_text())
    return datetime.fromisoformat(record["started_utc"]), datetime.fromisoformat(record["finished_utc"])


@pytest.mark.slow
def test_cli_sweep_in_worker_processes_equals_the_serial_sweep(
    tmp_path: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """`posleak sweep SPEC --jobs 2` runs the trials two at a time in a process pool (two of them overlap in time)
    and writes the same table as the serial sweep."""
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(RESUME_SWEEP))
    out = tmp_path / "out"
    proc = run_cli("sweep", str(spec_file), "--out", str(out), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 trials" in proc.stdout
    _assert_same_results(pd.read_parquet(out / "sweep.parquet"), reference_sweep[1])
    first, second = SweepSpec.from_dict(RESUME_SWEEP).trials()[:2]
    (start_a, end_a), (start_b, end_b) = _run_interval(out, first), _run_interval(out, second)
    assert start_a < end_b and start_b < end_a, "the first two trials did not run side by side"
    assert (out / "report.html").is_file()


@pytest.mark.slow
def test_cli_lab_trains_and_measures_each_variant(tmp_path: Path) -> None:
    """`posleak lab` as a user runs it: one row per variant, the window variant at W = T/4, the perplexity at the
    training length equal to exp(mean cross-entropy) of the saved model over every validation window."""
    argv = ["--steps", "4", "--seq-len", "16", "--batch-size", "4", "--eval-every", "2", "--warmup-steps", "1"]
    proc = run_cli("lab", "--variants", "rope,window", *argv, "--jobs", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_parquet(tmp_path / "lab.parquet")
    assert table["variant"].tolist() == ["rope", "window"] and table["attention"].tolist() == ["causal", "window:4"]
    assert (tmp_path / "report.html").is_file() and "window" in proc.stdout

    config = TrainConfig(steps=4, seq_len=16, batch_size=4, eval_every=2, warmup_steps=1)
    run = LabRun(train=config, variants=("rope", "window"))
    for variant, row in zip(run.variants, table.itertuples(index=False), strict=True):
        trial = run.trial(variant)
        folder = tmp_path / "models" / trial.train_key
        model = load_lab_model(str(folder))
        data = prepare_data(config, AutoTokenizer.from_pretrained(folder))
        ids = lab_sequences(data, "val", 16, None, bos=True, seed=0).ids
        with torch.no_grad():
            logits = model(ids).logits[:, :-1].double()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        assert row.ppl_1x == pytest.approx(math.exp(float(loss)), rel=1e-5), variant
        per_layer = pd.read_parquet(trial_folder(tmp_path, trial) / "per_layer.parquet")
        assert row.mask_all == pytest.approx(per_layer["mask_all"].mean()) and row.mask_all > 0


# ----------------------------------------------------------------------------------------- Ray, with faults


def _with_finished(out: Path, reference: Path, trials: list[Trial]) -> None:
    """Copy finished trials (measurements and trained model) of the reference sweep into `out`."""
    for trial in trials:
        shutil.copytree(trial_folder(reference, trial), trial_folder(out, trial))
        shutil.copytree(reference / "models" / trial.train_key, out / "models" / trial.train_key)


def _finished_stamps(out: Path, trials: list[Trial]) -> dict[Path, tuple[int, int]]:
    return file_stamps(*(trial_folder(out, trial) for trial in trials), *(out / "models" / t.train_key for t in trials))


@pytest.mark.slow
def test_ray_retries_a_worker_killed_mid_training_from_its_checkpoint(
    tmp_path: Path, ray_faults: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """Two of three trials finished before; on Ray the third's worker is killed (SIGKILL) right after its step-2
    checkpoint. Ray retries the task, the retry resumes from that checkpoint (the next checkpoints saved are 4 and
    6, not 2 again), the finished trials are not touched, and the table equals the uninterrupted sweep."""
    spec = SweepSpec.from_dict(RESUME_SWEEP)
    trials = spec.trials()
    _with_finished(tmp_path, reference_sweep[0], trials[:2])
    finished = _finished_stamps(tmp_path, trials[:2])
    plan_fault(ray_faults, "alibi", "checkpoint", times=1)
    table = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert (ray_faults / "deaths.log").read_text().splitlines() == ["alibi checkpoint"]
    assert (ray_faults / "checkpoints.log").read_text().split() == ["2", "4", "6"]
    assert _finished_stamps(tmp_path, trials[:2]) == finished
    _assert_same_results(table, reference_sweep[1])


@pytest.mark.slow
def test_ray_worker_that_keeps_dying_fails_the_sweep_and_a_rerun_finishes_it(
    tmp_path: Path, ray_faults: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """The third trial's worker dies as its measurements start, every time, until Ray gives up: the sweep stops
    with a one-line error naming the trial. Once the fault is gone, a rerun with that trial left to do finishes it
    without retraining its model or touching the finished trials, and the table equals the uninterrupted sweep."""
    spec = SweepSpec.from_dict(RESUME_SWEEP)
    trials = spec.trials()
    _with_finished(tmp_path, reference_sweep[0], trials[:2])
    plan_fault(ray_faults, "alibi", "measure", times=100)
    with pytest.raises(PosleakError, match=r"Ray worker died running trial pe=alibi .* rerun the same command") as err:
        run_plan(spec.plan(), tmp_path, backend="ray", progress=False)
    assert "\n" not in str(err.value)
    assert not (trial_folder(tmp_path, trials[2]) / MARKER).exists()
    assert len((ray_faults / "deaths.log").read_text().splitlines()) > 1  # Ray retried before giving up
    kept = _finished_stamps(tmp_path, trials[:2]) | file_stamps(tmp_path / "models" / trials[2].train_key)

    (ray_faults / "plan.json").unlink()
    table = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert _finished_stamps(tmp_path, trials[:2]) | file_stamps(tmp_path / "models" / trials[2].train_key) == kept
    _assert_same_results(table, reference_sweep[1])


# ------------------------------------------------------------------------------ tasks that need position (issue 12)

T_QUANTILE_2 = 4.302652729911275  # Student's t, 97.5th percentile, 2 degrees of freedom (tables)


@pytest.mark.slow
def test_cli_lab_task_trains_three_variants_over_three_seeds(tmp_path: Path) -> None:
    """`posleak lab --task index` with 3 variants × 3 seeds at tiny size: one row per trial; each trial's accuracy
    at 1× recomputed from its saved model on the rows it was scored on (fresh rows of the evaluation stream) by
    greedy decoding; the per-variant intervals the t-interval over seeds; ranks and `beats` what the intervals
    say; the analytic chance level of the index task."""
    argv = ["--steps", "30", "--seq-len", "16", "--batch-size", "8", "--eval-every", "10", "--warmup-steps", "3"]
    proc = run_cli(
        "lab", "--task", "index", "--variants", "rope,nope,learned", *argv, "--jobs", "2", "--out", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_parquet(tmp_path / "lab.parquet")
    assert sorted(table["variant"]) == sorted(f"index/{v}" for v in ("rope", "nope", "learned") for _ in range(3))
    assert sorted(table["seed"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert table[["mask_all", "resid_all", "probe_r2_best", "train_s"]].notna().all().all()
    assert (table["chance_1x"] == 1 / 7).all() and (table["chance_4x"] == 1 / 31).all()  # n = ⌊(L − 1)/2⌋

    config = TaskLab(
        tasks=("index",),
        variants=("rope", "nope", "learned"),
        train=replace(TASK_TRAIN, steps=30, seq_len=16, batch_size=8, eval_every=10, warmup_steps=3),
    )
    trial = config.labs()[1].trial("nope")  # seed 1
    row = table[table["trial"] == trial.key].iloc[0]
    model = load_lab_model(str(tmp_path / "models" / trial.train_key))
    rows = generate("index", TASK_EVAL.task_seqs, 16, (1, 2, 1))
    assert rows.answers.sum(dim=1).eq(2).all()  # two queries a row at 16 tokens
    with torch.no_grad():
        right = model(input_ids=rows.ids).logits[:, :-1].argmax(-1) == rows.ids[:, 1:]
    every = torch.stack([right[n][rows.answers[n]].all() for n in range(len(right))])
    assert row["acc_1x"] == pytest.approx(float(every.double().mean()), abs=1e-12)

    variants = pd.read_parquet(tmp_path / "variants.parquet").set_index("variant")
    for variant, group in table.groupby(table["variant"].str.split("/").str[1]):
        for measure in ("acc_1x", "mask_all", "resid_all", "probe_r2_best"):
            values = group[measure].to_numpy()
            half = T_QUANTILE_2 * values.std(ddof=1) / np.sqrt(3)
            lo, hi = values.mean() - half, values.mean() + half
            if measure == "acc_1x":
                lo, hi = max(lo, 0.0), min(hi, 1.0)
            got = variants.loc[variant, [measure, f"{measure}_lo", f"{measure}_hi"]].to_numpy(dtype=float)
            np.testing.assert_allclose(got, [values.mean(), lo, hi], rtol=1e-9, atol=1e-12)
    choices = pd.read_parquet(tmp_path / "choices.parquet")
    assert len(choices) == 9 and set(choices["multiple"]) == {1, 2, 4}
    for _, cell in choices.groupby("multiple"):
        by_name = cell.set_index("variant")
        for name, r in by_name.iterrows():
            assert r["rank"] == 1 + int((by_name["accuracy"] > r["accuracy"]).sum())
            beaten = sorted(o for o, s in by_name.iterrows() if o != name and r["accuracy_lo"] > s["accuracy_hi"])
            assert sorted(filter(None, r["beats"].split(","))) == beaten
    assert set(pd.read_parquet(tmp_path / "components.parquet")["component"]) == {
        "mask_all",
        "resid_all",
        "probe_r2_best",
    }
    assert "Architecture choices per task" in (tmp_path / "report.html").read_text()


def test_cli_lab_task_bad_input_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_main("lab", "--task", "nosuch", "--seeds", "0,x", "--variants", "rope,foo", "--out", str(out))
    assert_error_lines(proc, "unknown task nosuch", "bad --seeds '0,x'", "unknown lab variants ['foo']")
    proc = run_main("lab", "--tasks", "index,copy", "--seq-len", "300", "--out", str(out))
    assert_error_lines(proc, "task index takes rows of 9 to 992 tokens")
    proc = run_main("lab", "--task", "copy", "--tasks", "all", "--out", str(out))
    assert_error_lines(proc, "--task and --tasks name the same thing")
    assert not out.exists()


def test_a_rerun_reads_a_missing_measure_back_as_nan_from_strict_json(tmp_path: Path) -> None:
    """The copy task has no chance level (NaN): its trial's complete.json holds null there (strict JSON, which the
    standard library's bare NaN is not), and a rerun, which reads every finished trial's row back from that file,
    gives the table of the first run, NaN and float dtype included."""
    argv = ["lab", "--task", "copy", "--variants", "rope", "--seeds", "0", "--steps", "5", "--seq-len", "16",
            "--batch-size", "4", "--eval-every", "5", "--warmup-steps", "1", "--out", str(tmp_path)]  # fmt: skip
    assert run_main(*argv).returncode == 0
    first = pd.read_parquet(tmp_path / "lab.parquet")
    (marker,) = tmp_path.glob("trials/*/complete.json")
    assert strict_json_files(marker.parent)[marker]["row"]["chance_1x"] is None
    assert run_main(*argv).returncode == 0
    again = pd.read_parquet(tmp_path / "lab.parquet")
    assert first["chance_1x"].isna().all() and first["chance_1x"].dtype == np.float64
    pd.testing.assert_frame_equal(again, first)


def _count_run(out: Path, **options: Any) -> TrainConfig:
    """A count task at 8 tokens (answer: the marker's index among 3 content tokens), which the tiny RoPE model
    learns in about 70 steps: evaluated every 10 steps on 64 validation rows."""
    values = dict(task="count", seq_len=8, steps=300, batch_size=32, lr=3e-3, warmup_steps=10, eval_every=10)
    return TrainConfig(**{**values, "eval_seqs": 64, "checkpoint_every": 1000, "device": "cpu", **options})


def test_training_stops_at_its_target_on_a_plateau_or_at_its_cap(tmp_path: Path) -> None:
    """Three real runs: one that learns stops at the first evaluation whose exact match (recomputed here from the
    saved model by argmax over the validation rows' answers) reaches the target, every earlier one below it, and a
    run interrupted midway and resumed stops at the same step with the same metrics; a learning rate of 1e-12 moves
    nothing, so with patience 3 it stops on a plateau at its 4th evaluation; a cap below the learning time stops
    there. train.json and the result name the step and the reason."""
    spec = LabSpec(size="tiny", pe="rope")
    config = _count_run(tmp_path, target=0.99, patience=6)
    learned = train(spec, config, tmp_path / "learned", progress=False)
    assert learned.finished and learned.stop_reason == "target" and learned.step < config.steps
    evals = learned.metrics.dropna(subset=["val_loss"])
    assert int(evals["step"].iloc[-1]) == learned.step
    assert (evals["val_acc"].iloc[:-1] < 0.99).all() and evals["val_acc"].iloc[-1] >= 0.99
    rows = generate("count", 64, 8, (0, 1))  # the validation stream (seed 0, TASK_VAL)
    model = load_lab_model(str(tmp_path / "learned"))
    with torch.no_grad():
        predicted = model(input_ids=rows.ids).logits[:, :-1].argmax(-1)
    exact = [bool((predicted[n][rows.answers[n]] == rows.ids[n, 1:][rows.answers[n]]).all()) for n in range(64)]
    assert evals["val_acc"].iloc[-1] == pytest.approx(np.mean(exact), abs=1e-12)
    record = json.loads((tmp_path / "learned" / "train.json").read_text())
    assert (record["stopped_step"], record["stop_reason"]) == (learned.step, "target")

    resumed_config = replace(config, checkpoint_every=10)
    part = train(spec, resumed_config, tmp_path / "resumed", until=learned.step - 20, progress=False)
    assert not part.finished and part.step == learned.step - 20
    resumed = train(spec, resumed_config, tmp_path / "resumed", progress=False)
    assert (resumed.step, resumed.stop_reason) == (learned.step, "target")
    pd.testing.assert_frame_equal(
        resumed.metrics.drop(columns="tokens_per_s"), learned.metrics.drop(columns="tokens_per_s")
    )

    still = train(spec, _count_run(tmp_path, lr=1e-12, target=0.99, patience=3), tmp_path / "still", progress=False)
    assert (still.step, still.stop_reason) == (40, "plateau")
    capped = train(spec, _count_run(tmp_path, steps=20, target=0.99), tmp_path / "capped", progress=False)
    assert (capped.step, capped.stop_reason) == (20, "cap")
    assert capped.metrics["val_acc"].dropna().max() < 0.99


def test_a_variant_is_unable_to_learn_only_when_its_seeds_stopped_on_a_plateau() -> None:
    assert outcome(["target"] * 3) == ("target 3", "learned")
    assert outcome(["plateau"] * 3) == ("plateau 3", "unable to learn")
    assert outcome(["plateau", "cap", "plateau"]) == ("plateau 2, cap 1", "not learned within the cap")
    assert outcome(["cap"] * 2) == ("cap 2", "not learned within the cap")
    assert outcome(["target", "plateau", "cap"]) == ("target 1, plateau 1, cap 1", "learned by 1 of 3 seeds")


def test_stopping_options_are_refused_in_one_line_each_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_main("lab", "--task", "copy", "--target", "1.5", "--patience", "0", "--out", str(out))
    assert_error_lines(proc, "target 1.5 must be an exact-match share in (0, 1]", "patience must be at least 1")
    proc = run_main("lab", "--variants", "rope", "--target", "0.9", "--out", str(out))
    assert_error_lines(proc, "--target and --patience stop a task run on its exact match")
    assert not out.exists()
