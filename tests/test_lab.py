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
from pathlib import Path

import pandas as pd
import pytest
import torch
from harness import analyze_recorded, errors_of
from reference import assert_close
from safetensors.torch import load_file
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

from posleak.capture import CaptureSession, QueryStats, use_posleak_attention
from posleak.capture.session import AttentionCall
from posleak.cli import main
from posleak.errors import PosleakError
from posleak.lab.compare import LAB_COLUMNS, LabRun, run_lab
from posleak.lab.config import NORMS, PE_KINDS, LabConfig, LabSpec
from posleak.lab.model import LabForCausalLM, build_lab_model
from posleak.lab.sweep import SweepSpec, run_sweep
from posleak.lab.trainer import TrainConfig, train
from posleak.lab.trial import MARKER, EvalConfig, trial_folder
from posleak.measure.probe import PROBE_COLUMNS, ProbeConfig, probe_positions

VOCAB = 96
T = 48
WINDOW = 8
PREFIX = 12
REFERENCE = "lab_reference"


def _config(pe: str = "rope", norm: str = "softmax", attention: str = "causal", layers: int = 2) -> LabConfig:
    config = LabSpec(size="tiny", pe=pe, norm=norm, attention=attention).config(VOCAB, 4 * T, bos_id=0, eos_id=1)
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
    brute force of the definitions; sigmoid attention has log Z ≡ 0, so m ≡ 0 exactly and only r is left."""
    result, recorder = analyze_recorded(_model(pe, norm, attention), _ids(batch=6))
    assert_close(errors_of(result, recorder), 1e-5)
    if norm == "sigmoid":
        assert (result.per_head[["mask_early", "mask_all"]] == 0).all().all()
        assert (result.profiles["m"] == 0).all() and result.per_head["resid_all_raw"].min() > 0


def test_sink_logit_enters_log_z() -> None:
    model, ids = _model("rope", "sink"), _ids()
    call = _record(model, ids)[0]
    torch.testing.assert_close(call.log_z, _log_z_from_definition(call, "causal", "sink"), rtol=1e-5, atol=1e-5)
    assert bool((call.log_z > call.log_z_keys).all())


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
    assert list(metrics.columns) == ["step", "train_loss", "val_loss", "tokens_per_s"]
    assert metrics["step"].tolist() == list(range(1, 25))
    assert metrics["train_loss"].iloc[0] > math.log(512) - 0.1
    val = metrics["val_loss"].dropna()
    assert val.iloc[-1] < metrics["train_loss"].iloc[0] - 0.8
    assert pd.read_parquet(tmp_path / "metrics.parquet").equals(metrics)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(model, LabForCausalLM)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.bos_token_id == model.config.bos_token_id == 0
    assert json.loads((tmp_path / "train.json").read_text())["train"]["steps"] == 24


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
    table = run_lab(config, tmp_path, progress=False)
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
    table = run_sweep(spec, tmp_path, backend="ray", progress=False)
    assert len(table) == 4 and set(table["pe"]) == {"rope", "nope"} and set(table["seed"]) == {0, 1}
    first = _markers(tmp_path, spec)
    again = run_sweep(spec, tmp_path, backend="ray", progress=False)
    assert _markers(tmp_path, spec) == first, "a finished trial ran again"
    pd.testing.assert_frame_equal(again, table)
    assert (tmp_path / "sweep.parquet").is_file() and (tmp_path / "report.html").is_file()
