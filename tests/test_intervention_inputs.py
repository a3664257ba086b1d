"""Interventions on what the model is given: the BOS embedding replaced, position 0 patched from another token, RoPE
scaled at load time and the attention window overridden, each doing what it declares and nothing more (tiny
models, against direct computation)."""

from __future__ import annotations

import pytest
import torch
from intervening import resid_states, tiny_ids
from tiny import WINDOW, tiny_model, tiny_tokenizer
from transformers import PreTrainedModel

from posleak.capture import use_posleak_attention
from posleak.errors import PosleakError
from posleak.interventions import Interventions
from posleak.interventions.embedding import mean_embedding


@pytest.mark.parametrize("kind", ["mean", "zero", "random", "token:w11"])
def test_bos_replacement_changes_position0_embedding_only(kind: str) -> None:
    model = use_posleak_attention(tiny_model("gemma3"))  # Gemma scales inside its embedding module
    ids = tiny_ids(model)
    base = resid_states(model, ids)
    spec = Interventions.from_options(replace_bos=kind, seed=3)
    with spec.applied(model, tiny_tokenizer(), bos_at_0=True):
        replaced = resid_states(model, ids)
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
        Interventions.from_options(replace_bos="zero").applied(model, None, False),
    ):
        pass


def test_patching_reproduces_the_source_position0() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = tiny_ids(model)
    source = ids.clone()
    source[:, 0] = 42  # the source input: another token at position 0
    source_states = resid_states(model, source)[:, 0, 0]
    spec = Interventions.from_options(patch_pos0="id:42", patch_layers="1..2")
    with spec.applied(model, None, bos_at_0=True):
        patched = resid_states(model, ids)
    base = resid_states(model, ids)
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
    ids = tiny_ids(model)
    base = resid_states(model, ids)
    torch.testing.assert_close(
        resid_states(_with_overrides(model, Interventions.from_options(rope_scaling="ntk:1")), ids), base
    )
    edits = Interventions.from_options(window="global").attention_edits()
    torch.testing.assert_close(resid_states(model, ids, edits), base, rtol=0, atol=0)


def test_ntk_scaling_moves_the_base_and_changes_attention() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    spec = Interventions.from_options(rope_scaling="ntk:4")
    params = spec.config_overrides(model.config)["rope_parameters"]
    dim = model.config.hidden_size // model.config.num_attention_heads
    assert params["rope_theta"] == pytest.approx(model.config.rope_parameters["rope_theta"] * 4 ** (dim / (dim - 2)))
    ids = tiny_ids(model)
    assert not torch.allclose(resid_states(_with_overrides(model, spec), ids), resid_states(model, ids))


def test_gemma_rope_scaling_applies_to_every_layer_type() -> None:
    model = tiny_model("gemma3")
    params = Interventions.from_options(rope_scaling="linear:2").config_overrides(model.config)["rope_parameters"]
    assert {p["rope_type"] for p in params.values()} == {"linear"}
    assert {p["factor"] for p in params.values()} == {2.0}


def test_window_override_masks_exactly_beyond_the_window() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = tiny_ids(model)
    windowed = resid_states(model, ids, Interventions.from_options(window=str(WINDOW)).attention_edits())
    base = resid_states(model, ids)
    torch.testing.assert_close(windowed[:, :, :WINDOW], base[:, :, :WINDOW], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(windowed[:, :, WINDOW:], base[:, :, WINDOW:])
