"""Each intervention does what it declares and nothing more (tiny models, against direct computation)."""

from __future__ import annotations

import pytest
import torch
from tiny import WINDOW, tiny_model, tiny_tokenizer
from transformers import PreTrainedModel

from posleak.capture import AttentionEdits, CaptureSession, QueryStats, ResidualCapture, use_posleak_attention
from posleak.errors import PosleakError
from posleak.intervene import Interventions
from posleak.intervene.embedding import mean_embedding

T = 3 * WINDOW


def _ids(model: PreTrainedModel, batch: int = 3, seed: int = 2) -> torch.Tensor:
    ids = torch.randint(4, model.config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = 3  # a BOS-like token at position 0 (not 0: tiny Gemma's padding row is zero)
    return ids


def _resid(model: PreTrainedModel, ids: torch.Tensor, edits: AttentionEdits | None = None) -> torch.Tensor:
    """All positions of every resid index, (L + 1, N, T, d)."""
    with ResidualCapture(model, positions=range(ids.shape[1])) as capture:
        CaptureSession(edits=edits).forward(model, ids)
    return capture.states()


@pytest.mark.parametrize("kind", ["mean", "zero", "random", "token:w11"])
def test_bos_replacement_changes_position0_embedding_only(kind: str) -> None:
    model = use_posleak_attention(tiny_model("gemma3"))  # Gemma scales inside its embedding module
    ids = _ids(model)
    base = _resid(model, ids)
    spec = Interventions(replace_bos=kind, seed=3)
    with spec.applied(model, tiny_tokenizer(), bos_at_0=True):
        replaced = _resid(model, ids)
    torch.testing.assert_close(replaced[0, :, 1:], base[0, :, 1:], rtol=0, atol=0)
    got = replaced[0, :, 0]
    module = model.get_input_embeddings()
    with torch.no_grad():
        if kind == "mean":
            expected = module(torch.arange(model.config.vocab_size)).mean(0).expand_as(got)
        elif kind == "zero":
            expected = torch.zeros_like(got)
        elif kind == "token:w11":
            expected = module(torch.tensor([11]))[0].expand_as(got)
    if kind == "random":
        torch.testing.assert_close(got.norm(dim=-1), base[0, :, 0].norm(dim=-1))
        assert not torch.allclose(got[0], got[1])  # a direction per sequence
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(replaced[-1, :, 1:], base[-1, :, 1:])  # and later positions feel it


def test_mean_embedding_carries_the_modules_scale() -> None:
    model = tiny_model("gemma3")
    raw_mean = model.get_input_embeddings().weight.mean(0)
    scale = model.config.hidden_size**0.5
    torch.testing.assert_close(mean_embedding(model), raw_mean * scale, rtol=1e-5, atol=1e-6)


def test_replace_bos_without_bos_is_refused() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    with (
        pytest.raises(PosleakError, match="needs a BOS"),
        Interventions(replace_bos="zero").applied(model, None, False),
    ):
        pass


def test_patching_reproduces_the_source_position0() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model)
    source = ids.clone()
    source[:, 0] = 42  # the source input: another token at position 0
    source_states = _resid(model, source)[:, 0, 0]
    spec = Interventions(patch_pos0="id:42", patch_layers="1..2")
    with spec.applied(model, None, bos_at_0=True):
        patched = _resid(model, ids)
    base = _resid(model, ids)
    for layer in (1, 2):
        torch.testing.assert_close(patched[layer, :, 0], source_states[layer].expand_as(patched[layer, :, 0]))
    torch.testing.assert_close(patched[0], base[0])  # unpatched layer before the patch is untouched
    assert not torch.allclose(patched[2, :, 1:], base[2, :, 1:])  # later positions read the patched h_0


def _with_overrides(model: PreTrainedModel, spec: Interventions) -> PreTrainedModel:
    config = model.config.__class__.from_dict({**model.config.to_dict(), **spec.config_overrides(model.config)})
    twin = type(model)(config).float().eval()
    twin.load_state_dict(model.state_dict())
    return use_posleak_attention(twin)


def test_ntk_factor_one_and_global_window_without_windows_change_nothing() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model)
    base = _resid(model, ids)
    torch.testing.assert_close(_resid(_with_overrides(model, Interventions(rope_scaling="ntk:1")), ids), base)
    edits = Interventions(window="global").attention_edits()
    torch.testing.assert_close(_resid(model, ids, edits), base, rtol=0, atol=0)


def test_ntk_scaling_moves_the_base_and_changes_attention() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    spec = Interventions(rope_scaling="ntk:4")
    params = spec.config_overrides(model.config)["rope_parameters"]
    dim = model.config.hidden_size // model.config.num_attention_heads
    assert params["rope_theta"] == pytest.approx(model.config.rope_parameters["rope_theta"] * 4 ** (dim / (dim - 2)))
    ids = _ids(model)
    assert not torch.allclose(_resid(_with_overrides(model, spec), ids), _resid(model, ids))


def test_gemma_rope_scaling_applies_to_every_layer_type() -> None:
    model = tiny_model("gemma3")
    params = Interventions(rope_scaling="linear:2").config_overrides(model.config)["rope_parameters"]
    assert {p["rope_type"] for p in params.values()} == {"linear"}
    assert {p["factor"] for p in params.values()} == {2.0}


def test_window_override_masks_exactly_beyond_the_window() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model)
    windowed = _resid(model, ids, Interventions(window=str(WINDOW)).attention_edits())
    base = _resid(model, ids)
    torch.testing.assert_close(windowed[:, :, :WINDOW], base[:, :, :WINDOW], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(windowed[:, :, WINDOW:], base[:, :, WINDOW:])


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablating_key0_of_a_head_that_gives_it_no_attention_changes_nothing(mode: str) -> None:
    model = use_posleak_attention(tiny_model("mistral", window=1))  # queries attend only to themselves
    ids = _ids(model)
    base = _resid(model, ids)
    edits = Interventions(ablate_sink_values="0.1,1.0,1.3", ablate_mode=mode).attention_edits()
    torch.testing.assert_close(_resid(model, ids, edits), base, rtol=0, atol=0)


def test_ablating_key0_of_a_reading_head_changes_later_queries_only() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model)
    base = _resid(model, ids)
    edits = Interventions(ablate_sink_values="0.0,0.1,0.2,0.3").attention_edits()
    ablated = _resid(model, ids, edits)
    torch.testing.assert_close(ablated[:, :, 0], base[:, :, 0], rtol=0, atol=0)  # position 0 untouched
    assert not torch.allclose(ablated[1, :, 1:], base[1, :, 1:])


def test_auto_ablation_uses_the_sink_heads() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    stats = QueryStats()
    CaptureSession([stats]).forward(model, _ids(model))
    heads = stats.result().sink_heads
    sink_heads = {layer: tuple(heads[layer].nonzero().flatten().tolist()) for layer in range(heads.shape[0])}
    edits = Interventions(ablate_sink_values="auto").attention_edits(sink_heads)
    assert edits.ablate_key0 == {layer: hs for layer, hs in sink_heads.items() if hs}


def test_bad_intervention_options_are_one_line_errors() -> None:
    with pytest.raises(PosleakError, match="rope-scaling"):
        Interventions(rope_scaling="ntk:abc").config_overrides(tiny_model("llama").config)
    with pytest.raises(PosleakError, match="--window"):
        Interventions(window="wide").attention_edits()
    with pytest.raises(PosleakError, match="ablate-sink-values"):
        Interventions(ablate_sink_values="3").attention_edits()
