"""The lab models (posleak.models.lab) on real tiny lab models: position encodings, masks and norms do what they
say, the posleak attention path matches an explicit reference, initialisation and loading, and the position
probe.

The reference attention below is written from the definitions (ALiBi as an explicit −slope·(i − j) bias,
the masks from the attention string, the three normalisations), not from posleak's code, and is
registered with transformers' AttentionInterface so the same lab model runs under either.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from harness import analyze_recorded, errors_of
from reference import assert_close
from transformers import AttentionInterface

from posleak.capture import CaptureSession, QueryStats, use_posleak_attention
from posleak.capture.session import AttentionCall
from posleak.errors import PosleakError
from posleak.measure.probe import PROBE_COLUMNS, ProbeConfig, probe_positions
from posleak.models.lab.config import NORMS, PE_KINDS, LabSpec
from posleak.models.lab.hf_config import LabConfig
from posleak.models.lab.model import LabForCausalLM, build_lab_model, load_lab_model

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
