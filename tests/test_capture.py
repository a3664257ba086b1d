"""The instrumented attention path against transformers' own eager attention, on tiny models.

Parity: every hidden state and the logits match eager to 1e-5 with posleak's function, and the
session's call counter proves that function ran. Accumulators: log Z, a_{i,0} and entropy equal the
values computed from the logits and weights that HF's eager function itself formed (recorded by a
wrapper around the model family's `eager_attention_forward`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import transformers.masking_utils as masking
from harness import token_batch
from tiny import FAMILIES, WINDOW, tiny_model

from posleak.capture import (
    AttentionEdits,
    CaptureSession,
    QueryStats,
    ResidualCapture,
    closed_system,
    decoder_layers,
    require_closed_system,
    use_posleak_attention,
)
from posleak.capture.attention import blockwise_attention
from posleak.capture.masks import MaskSpec, model_mask, spec_of
from posleak.capture.session import AttentionCall, OutputEdit
from posleak.capture.store import CaptureMemory, QKRecorder
from posleak.errors import PosleakError
from posleak.interventions.window import WindowOverride
from posleak.pipeline import AnalyzeConfig, analyze_model, prepared_model

T = 3 * WINDOW  # longer than every sliding window


def _ids(model: torch.nn.Module, batch: int = 2, seq_len: int = T, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, seq_len), generator=gen)


def _eager(model: torch.nn.Module, ids: torch.Tensor):
    model.set_attn_implementation("eager")
    with torch.no_grad():
        return model(ids, output_hidden_states=True, use_cache=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_and_logits_match_eager(family: str) -> None:
    model = tiny_model(family)
    ids = _ids(model)
    reference = _eager(model, ids)
    use_posleak_attention(model)
    session = CaptureSession([QueryStats()])
    with session.active(torch.arange(ids.shape[0])), torch.no_grad():
        ours = model(ids, output_hidden_states=True, use_cache=False)
    layers = model.config.num_hidden_layers
    assert dict(session.calls) == {layer: 1 for layer in range(layers)}, "posleak's attention did not run"
    assert len(ours.hidden_states) == layers + 1
    for layer, (a, b) in enumerate(zip(reference.hidden_states, ours.hidden_states, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"hidden state {layer}")
    torch.testing.assert_close(ours.logits, reference.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_uncaptured_path_matches_eager(family: str) -> None:
    """Without a session the function takes torch's SDPA (or the block-wise path): same numbers."""
    model = tiny_model(family)
    ids = _ids(model)
    reference = _eager(model, ids)
    use_posleak_attention(model)
    with torch.no_grad():
        ours = model(ids, use_cache=False)
    torch.testing.assert_close(ours.logits, reference.logits, rtol=1e-5, atol=1e-5)


@contextmanager
def _record_eager(model: torch.nn.Module) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Wrap the family's eager attention function to keep what it formed: logits and weights."""
    modeling = importlib.import_module(type(model).__module__)
    original = modeling.eager_attention_forward
    records: list[dict[str, torch.Tensor]] = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        output, weights = original(module, query, key, value, attention_mask, **kwargs)
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        logits = query @ key.transpose(-1, -2) * kwargs["scaling"]
        if kwargs.get("softcap") is not None:
            logits = kwargs["softcap"] * torch.tanh(logits / kwargs["softcap"])
        logits = logits + attention_mask
        sinks = getattr(module, "sinks", None)
        records.append({"logits": logits, "weights": weights, "sinks": sinks})
        return output, weights

    modeling.eager_attention_forward = recording
    try:
        yield records
    finally:
        modeling.eager_attention_forward = original


@pytest.mark.parametrize("family", FAMILIES)
def test_query_stats_equal_eager_materialised_attention(family: str) -> None:
    model = tiny_model(family)
    ids = _ids(model)
    model.set_attn_implementation("eager")
    with _record_eager(model) as records, torch.no_grad():
        model(ids, use_cache=False)
    assert len(records) == model.config.num_hidden_layers

    use_posleak_attention(model)
    stats = QueryStats()
    CaptureSession([stats]).forward(model, ids)
    result = stats.result()

    for layer, rec in enumerate(records):
        logits, weights = rec["logits"].double(), rec["weights"].double()
        if rec["sinks"] is not None:
            sink = rec["sinks"].double()[None, :, None, None].expand(*logits.shape[:-1], 1)
            logits_all = torch.cat([logits, sink], dim=-1)
        else:
            logits_all = logits
        # the reference logits are the ones eager normalised: softmax reproduces its weights
        probs = torch.softmax(logits_all, dim=-1)
        torch.testing.assert_close(probs[..., : weights.shape[-1]], weights, rtol=1e-5, atol=1e-6)
        log_z = torch.logsumexp(logits_all, dim=-1)
        entropy = -torch.xlogy(probs, probs).sum(-1)
        torch.testing.assert_close(result.log_z[layer], log_z.mean(0), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result.attn_key0[layer], weights[..., 0].mean(0), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(result.entropy[layer], entropy.mean(0), rtol=1e-5, atol=1e-5)
        sink_score = weights[:, :, 1:, 0].mean(dim=(0, 2))
        torch.testing.assert_close(result.sink_score[layer], sink_score, rtol=1e-5, atol=1e-6)


def test_sliding_window_is_applied() -> None:
    """Removing Mistral's window changes the output: the mask the function builds is not a no-op."""
    model = use_posleak_attention(tiny_model("mistral"))
    ids = _ids(model)
    states = []
    for edits in (AttentionEdits(), AttentionEdits(mask_edits=(WindowOverride(None),))):
        session = CaptureSession(edits=edits)
        states.append(session.forward(model, ids).last_hidden_state)
    assert not torch.allclose(states[0][:, WINDOW:], states[1][:, WINDOW:], atol=1e-4)
    torch.testing.assert_close(states[0][:, :WINDOW], states[1][:, :WINDOW], rtol=1e-5, atol=1e-5)


class _Outputs:
    """Keeps each layer's attention output as the session records it (after every edit)."""

    needs_attended_keys = False

    def __init__(self) -> None:
        self.by_layer: dict[int, torch.Tensor] = {}

    def update(self, call: AttentionCall) -> None:
        self.by_layer[call.layer] = call.output.clone()


def _outputs(model: torch.nn.Module, ids: torch.Tensor, *edits: OutputEdit) -> dict[int, torch.Tensor]:
    recorder = _Outputs()
    CaptureSession([recorder], AttentionEdits(output_edits=edits)).forward(model, ids)
    return recorder.by_layer


def _head_edit(layer: int, head: int, value: float | None) -> OutputEdit:
    """An output edit from outside posleak: `head`'s output in `layer` set to `value` (None: plus one)."""

    def edit(call: AttentionCall) -> torch.Tensor:
        output = call.output.clone()
        if call.layer == layer:
            output[:, head] = output[:, head] + 1 if value is None else value
        return output

    return edit


def test_an_output_edit_from_outside_acts_on_exactly_its_head_and_edits_compose_in_order() -> None:
    """AttentionEdits applies whatever output edits it is given, nothing named after one intervention: zeroing
    head 1 of layer 1 changes that head's output there and nothing else of that layer or the layers before it (bit
    for bit), and the layers after it see the change; two edits apply in their order, each to the output the one
    before it left."""
    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model)
    base, zeroed = _outputs(model, ids), _outputs(model, ids, _head_edit(1, 1, 0.0))
    expected = base[1].clone()
    expected[:, 1] = 0.0
    torch.testing.assert_close(zeroed[0], base[0], rtol=0, atol=0)
    torch.testing.assert_close(zeroed[1], expected, rtol=0, atol=0)
    assert not torch.allclose(zeroed[2], base[2])
    then_one = _outputs(model, ids, _head_edit(1, 1, 0.0), _head_edit(1, 1, None))
    torch.testing.assert_close(then_one[1][:, 1], torch.ones_like(expected[:, 1]), rtol=0, atol=0)
    torch.testing.assert_close(_outputs(model, ids, _head_edit(1, 1, None), _head_edit(1, 1, 0.0))[1], expected)


def test_padding_mask_is_refused() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(PosleakError, match="unpadded"), torch.no_grad():
        model(ids, attention_mask=mask[:, None, None, :].float(), use_cache=False)


def test_the_model_mask_is_read_as_the_spec_it_equals() -> None:
    """transformers' own causal, sliding and chunked masks (masking_utils) through posleak's mask entry: the
    first two are the MaskSpec whose pairs they are, chunks shorter than T and padding are no spec."""
    length, pad = 12, torch.ones(2, 12, dtype=torch.bool)
    pad[1, :2] = False
    cases = [
        (masking.causal_mask_function, None, MaskSpec()),
        (masking.sliding_window_causal_mask_function(5), None, MaskSpec(window=5)),
        (masking.sliding_window_causal_mask_function(length), None, MaskSpec()),
        (masking.chunked_causal_mask_function(length, torch.zeros(2, dtype=torch.long)), None, MaskSpec()),
        (masking.chunked_causal_mask_function(4, torch.zeros(2, dtype=torch.long)), None, None),
        (masking.causal_mask_function, pad, None),
    ]
    for function, padding, expected in cases:
        mask = model_mask(2, length, length, mask_function=function, attention_mask=padding)
        reference = masking.sdpa_mask(
            2, length, length, mask_function=function, attention_mask=padding, allow_is_causal_skip=False
        )
        assert torch.equal(mask.expand_as(reference), reference)  # the model's own mask, unchanged
        assert spec_of(mask) == expected and spec_of(mask.clone()) == expected
        if expected is not None:
            assert torch.equal(expected.dense(length), reference[0, 0])


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_position0_is_a_closed_system(family: str) -> None:
    model = use_posleak_attention(tiny_model(family))
    ids = _ids(model, batch=4)
    ids[:, 0] = 7
    with ResidualCapture(model, positions=[0]) as capture:
        CaptureSession().forward(model, ids)
    states = capture.states()[:, :, 0]
    assert states.shape == (len(decoder_layers(model)) + 1, 4, model.config.hidden_size)
    report = closed_system(states, ids[:, 0])
    assert report.groups == 1 and report.holds, report.max_rel_spread
    # a later position does see the rest of the input
    with ResidualCapture(model, positions=[5]) as later:
        CaptureSession().forward(model, ids)
    assert not closed_system(later.states()[:, :, 0], ids[:, 0]).holds


def test_closed_system_check_catches_a_non_causal_model() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    for layer in decoder_layers(model):
        layer.self_attn.is_causal = False
    ids = _ids(model, batch=3)
    ids[:, 0] = 5
    with ResidualCapture(model, positions=[0]) as capture:
        CaptureSession().forward(model, ids)
    report = closed_system(capture.states()[:, :, 0], ids[:, 0])
    with pytest.raises(PosleakError, match=r"closed-system check failed at resid\[1\]"):
        require_closed_system(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_models_match_eager_beyond_the_window(name: str, request: pytest.FixtureRequest) -> None:
    """T = 600 > Gemma's 512 window: every hidden state and the logits, eager vs posleak, to 1e-5
    relative to each layer's scale (the residual stream grows to hundreds in later layers)."""
    from posleak.pipeline import AnalyzeConfig, sequences_for

    loaded = request.getfixturevalue(name)
    model = loaded.model
    ids = sequences_for(loaded, AnalyzeConfig(seq_len=600, num_seqs=1, cross_documents=True).recipe).ids
    try:
        reference = _eager(model, ids)
    finally:
        use_posleak_attention(model)
    session = CaptureSession([QueryStats()])
    with session.active(torch.arange(1)), torch.no_grad():
        ours = model(ids, output_hidden_states=True, use_cache=False)
    assert dict(session.calls) == {layer: 1 for layer in range(model.config.num_hidden_layers)}
    if name == "gemma3":
        windows = {session.masks[layer].window for layer in session.masks}
        assert windows == {512, None}, "the sliding layers must have run with their window"
    for layer, (a, b) in enumerate(zip(reference.hidden_states, ours.hidden_states, strict=True)):
        error = float((a - b).abs().max() / a.abs().max())
        assert error <= 1e-5, f"hidden state {layer}: relative error {error:.2e}"
    error = float((reference.logits - ours.logits).abs().max() / reference.logits.abs().max())
    assert error <= 1e-5, f"logits: relative error {error:.2e}"


def _captured_run(model: torch.nn.Module, ids: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], CaptureMemory]:
    """Every hidden state and each layer's captured log Z of one captured forward."""
    captures = CaptureMemory()
    recorder = QKRecorder(captures)
    recorder.batch = 0
    session = CaptureSession([recorder, QueryStats()])
    with session.active(torch.arange(ids.shape[0])), torch.no_grad():
        hidden = model(ids, output_hidden_states=True, use_cache=False).hidden_states
    captures.finish_batch(0, torch.arange(ids.shape[0]), {})
    return hidden, captures


@pytest.mark.parametrize("family", FAMILIES)
def test_blockwise_path_forced_on_the_cpu_equals_the_fused_kernel(family: str) -> None:
    """The block-wise path (what a device without a fused log-sum-exp kernel runs) against the CPU flash kernel,
    on the same model and ids: every hidden state (the attention outputs, carried through the layers), each
    layer's log Z, and every number of the per-head and per-layer tables (all magnitudes, ΔR², sink scores)
    to 1e-5. Soft-capped families (Gemma 2) take the block-wise path either way, so for them this is the
    switch's no-op; sliding windows (Mistral, Gemma 2/3) and sinks (gpt-oss) go through masks and log Z."""
    model = use_posleak_attention(tiny_model(family))
    ids = _ids(model, batch=4)
    fused_hidden, fused = _captured_run(model, ids)
    with blockwise_attention():
        block_hidden, block = _captured_run(model, ids)
    for layer, (a, b) in enumerate(zip(fused_hidden, block_hidden, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"hidden state {layer}")
    for layer in fused.layers():
        torch.testing.assert_close(block.layer(layer).log_z, fused.layer(layer).log_z, rtol=1e-5, atol=1e-5)

    config = AnalyzeConfig(seq_len=T, num_seqs=4, batch_size=2, early=12, bootstrap=0)
    fused_result = analyze_model(prepared_model(model, token_batch(ids), config.analysis, "tiny"), progress=False)
    with blockwise_attention():
        block_result = analyze_model(prepared_model(model, token_batch(ids), config.analysis, "tiny"), progress=False)
    for table in ("per_head", "per_layer"):
        a, b = getattr(fused_result, table), getattr(block_result, table)
        numbers = [c for c in a.columns if a[c].dtype.kind == "f"]
        assert {"mask_early", "mask_all", "resid_early", "resid_all"} <= set(numbers)
        torch.testing.assert_close(
            torch.tensor(b[numbers].to_numpy()),
            torch.tensor(a[numbers].to_numpy()),
            rtol=1e-5,
            atol=1e-5,
            equal_nan=True,
        )
