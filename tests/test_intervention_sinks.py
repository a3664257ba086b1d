"""Interventions on how later queries read key 0 (the sink): the value at key 0 ablated, key 0's key and value
patched from another token, key 0's weight held at its mean or removed, and the sink heads an `auto` chooses,
each doing what it declares and nothing more (tiny models, against brute-force forwards with the attention
edited by hand); bad options as one-line errors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from intervening import resid_states, tiny_ids, verbatim_batch
from tiny import SINK_T, sink_ids, sink_model, sink_scores, tiny_model
from transformers import AttentionInterface, PreTrainedModel

from posleak.capture import (
    AttentionCall,
    AttentionEdits,
    CaptureSession,
    MaskSpec,
    ResidualCapture,
    use_posleak_attention,
)
from posleak.errors import PosleakError
from posleak.interventions import Interventions
from posleak.interventions.heads import parse_heads
from posleak.interventions.key0_reads import Key0Reads
from posleak.interventions.key0_values import Key0ValueAblation
from posleak.pipeline import AnalyzeConfig, analyze_model, prepared_model, sink_heads_of


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablating_key0_of_a_head_that_gives_it_no_attention_changes_nothing(mode: str) -> None:
    model = use_posleak_attention(tiny_model("mistral", window=1))  # queries attend only to themselves
    ids = tiny_ids(model)
    base = resid_states(model, ids)
    edits = Interventions.from_options(ablate_sink_values="0.1,1.0,1.3", ablate_mode=mode).attention_edits()
    torch.testing.assert_close(resid_states(model, ids, edits), base, rtol=0, atol=0)


def test_ablating_key0_of_a_reading_head_changes_later_queries_only() -> None:
    model = use_posleak_attention(tiny_model("llama"))
    ids = tiny_ids(model)
    base = resid_states(model, ids)
    edits = Interventions.from_options(ablate_sink_values="0.0,0.1,0.2,0.3").attention_edits()
    ablated = resid_states(model, ids, edits)
    torch.testing.assert_close(ablated[:, :, 0], base[:, :, 0], rtol=0, atol=0)  # position 0 untouched
    assert not torch.allclose(ablated[1, :, 1:], base[1, :, 1:])


def _ablating_attention(heads: dict[int, tuple[int, ...]], mode: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """Attention from the definition (float64) in which the queries i ≥ 1 of `heads` (layer → heads) read key 0's
    value as zero (`mode` "zero") or as the mean of the values at keys 1.. of their sequence ("mean")."""

    def attention(module, query, key, value, attention_mask, scaling=None, sliding_window=None, **kwargs):  # type: ignore[no-untyped-def]
        k, v, attend = _by_definition(query, key, value, scaling, sliding_window)
        out = attend(k, v)
        for head in heads.get(int(module.layer_idx), ()):
            ablated = v.clone()
            ablated[:, head, 0] = 0.0 if mode == "zero" else v[:, head, 1:].mean(dim=-2)
            out[:, head, 1:] = attend(k, ablated)[:, head, 1:]
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    return attention


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablating_key0_equals_a_brute_force_forward_with_the_value_replaced(mode: str) -> None:
    """--ablate-sink-values: every resid state equals a float64 brute force in which the named heads' queries
    i ≥ 1 read a replaced value at key 0 (heads that share a KV head with one left alone, in Gemma windowed layers
    too); query 0 keeps its own value."""
    model = use_posleak_attention(tiny_model("gemma3"))
    ids, heads = tiny_ids(model), "0.1,1.2,1.3,2.0"
    ablated = resid_states(
        model, ids, Interventions.from_options(ablate_sink_values=heads, ablate_mode=mode).attention_edits()
    )
    previous = model.config._attn_implementation
    try:
        AttentionInterface.register("ablate_reference", _ablating_attention(parse_heads(heads), mode))
        model.set_attn_implementation("ablate_reference")
        reference = resid_states(model, ids)
    finally:
        model.set_attn_implementation(previous)
    torch.testing.assert_close(ablated, reference.to(ablated), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(ablated[-1, :, 1:], resid_states(model, ids)[-1, :, 1:])  # the ablation acted


def test_the_value_ablation_edits_before_the_other_output_edits() -> None:
    """The output edits apply in registry order, whatever order the options are given in: the value ablation
    first (on the model's own output), then the reweightings of key 0."""
    given = Interventions.from_options(remove_sink_reads="0.1", hold_sink_clock="0.2", ablate_sink_values="0.1")
    edits = given.attention_edits().output_edits
    assert [type(edit) for edit in edits] == [Key0ValueAblation, Key0Reads, Key0Reads]
    assert [edit.target for edit in edits[1:]] == ["mean", "zero"]


def _by_definition(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None, window: int | None
) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """A layer's attention written from the definition, in float64: its keys and values (GQA expanded) and
    `attend(keys, values)`, the causal (and windowed) softmax attention of its queries over them."""
    groups = query.shape[1] // key.shape[1]
    q = query.double()
    k, v = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(q.shape[-2])[None, :]
    valid = (j <= i) & ((i - j < window) if window else True)

    def attend(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        logits = (q @ keys.transpose(-1, -2) * scale).masked_fill(~valid, float("-inf"))
        return torch.softmax(logits, dim=-1) @ values

    return k, v, attend


def _brute_force_attention(
    record: dict[int, tuple[torch.Tensor, torch.Tensor]],
    patch: dict[int, tuple[int, ...]],
) -> Callable[..., tuple[torch.Tensor, None]]:
    """Causal (and windowed) softmax attention in float64, written from the definition: it keeps k_0 and v_0 of
    every query head in `record` (layer → (H, D) each) where `patch` is empty, and otherwise lets the queries
    i ≥ 1 of `patch`'s heads attend over `record`'s k_0 and v_0 in place of their own."""

    def attention(module, query, key, value, attention_mask, scaling=None, sliding_window=None, **kwargs):  # type: ignore[no-untyped-def]
        layer = int(module.layer_idx)
        k, v, attend = _by_definition(query, key, value, scaling, sliding_window)
        out = attend(k, v)
        if not patch:
            record[layer] = (k[0, :, 0].clone(), v[0, :, 0].clone())
        for head in patch.get(layer, ()):
            k2, v2 = k.clone(), v.clone()
            k2[:, head, 0], v2[:, head, 0] = record[layer][0][head], record[layer][1][head]
            out[:, head, 1:] = attend(k2, v2)[:, head, 1:]
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    return attention


def _brute_forceresid_states(model: PreTrainedModel, ids: torch.Tensor, source: int, heads: str) -> torch.Tensor:
    """`_resid` of the key-0 patch by brute force: a forward of `source` alone records its k_0, v_0; a second
    forward of `ids` patches them into `heads`."""
    record: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    previous = model.config._attn_implementation
    try:
        passes = (("kv0_record", {}, torch.tensor([[source]])), ("kv0_patch", parse_heads(heads), ids))
        for name, patch, inputs in passes:
            AttentionInterface.register(name, _brute_force_attention(record, patch))
            model.set_attn_implementation(name)
            with ResidualCapture(model, positions=range(inputs.shape[1])) as capture, torch.no_grad():
                model.model(input_ids=inputs, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    return capture.states()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_key0_patch_equals_a_brute_force_forward_with_the_source_tokens_key_and_value(family: str) -> None:
    """--patch-kv0: every resid state equals a float64 brute force in which the named heads' queries i ≥ 1 read
    key 0's key and value from a second forward of the source token alone (across GQA groups, and, in Gemma,
    windowed layers where later queries cannot see key 0); position 0 is untouched; the patch ran in each layer
    it names, once per forward."""
    model = use_posleak_attention(tiny_model(family))
    ids, heads = tiny_ids(model), "0.1,1.2,1.3,2.0"
    base = resid_states(model, ids)
    edits = Interventions.from_options(patch_kv0="id:42", kv0_heads=heads).attention_edits(model=model)
    patched = resid_states(model, ids, edits)
    reference = _brute_forceresid_states(model, ids, 42, heads)
    torch.testing.assert_close(patched, reference.to(patched), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(patched[:, :, 0], base[:, :, 0], rtol=0, atol=0)  # position 0 untouched
    assert not torch.allclose(patched[-1, :, 1:], base[-1, :, 1:])  # later queries read the source's key 0
    (patch,) = edits.output_edits
    assert patch.patched == {0: 1, 1: 1, 2: 1}


def test_key0_patch_from_the_token_already_there_changes_nothing() -> None:
    """Patching key 0 with the key and value of the token that stands at position 0 is the identity: the
    source's one-token forward gives exactly the sequence's own k_0 and v_0 (position 0 is closed)."""
    model = use_posleak_attention(tiny_model("qwen2"))
    ids = tiny_ids(model)
    edits = Interventions.from_options(patch_kv0="id:3", kv0_heads="0.0,1.1,2.3").attention_edits(model=model)
    torch.testing.assert_close(resid_states(model, ids, edits), resid_states(model, ids), rtol=1e-5, atol=1e-5)


# α_0 at T = 32 (tests/tiny.py): 0.995, 0.269 (below ε = 0.3), 0.341 (above), 0.962, 0.999; other heads 0.099.
SINK_LOGITS = {(0, 0): 8.0, (0, 1): 1.4, (0, 2): 1.8, (1, 3): 6.0, (2, 1): 10.0}
SINK_HEADS = {0: (0, 2), 1: (3,), 2: (1,)}


@pytest.mark.parametrize(
    ("logits", "expected"),
    [(SINK_LOGITS, SINK_HEADS), ({k: v for k, v in SINK_LOGITS.items() if k != (2, 1)}, {**SINK_HEADS, 2: ()})],
)
def test_sink_heads_of_a_model_built_with_them(
    logits: dict[tuple[int, int], float], expected: dict[int, tuple[int, ...]]
) -> None:
    """`sink_heads_of` returns exactly the heads whose analytic α_0 exceeds 0.3, including one just above and none
    just below, and --ablate-sink-values auto turns them into key-0 ablations of those heads (no empty layer)."""
    analytic = sink_scores(logits, layers=3)
    assert {layer: tuple(analytic[layer].gt(0.3).nonzero().flatten().tolist()) for layer in range(3)} == expected
    batch = verbatim_batch(sink_ids())
    config = AnalyzeConfig(seq_len=SINK_T, num_seqs=batch.num_seqs, batch_size=2)
    heads = sink_heads_of(sink_model(logits), batch, config.execution.batch_size)
    assert heads == expected
    (ablation,) = Interventions.from_options(ablate_sink_values="auto").attention_edits(heads).output_edits
    assert ablation.heads == {layer: chosen for layer, chosen in expected.items() if chosen}


def test_auto_ablation_ablates_exactly_the_sink_heads() -> None:
    """An analysis with --ablate-sink-values auto records the constructed sink heads as ablated, and its sink
    scores are the analytic α_0 (value ablation leaves the attention weights alone)."""
    batch = verbatim_batch(sink_ids())
    config = AnalyzeConfig(
        seq_len=SINK_T,
        num_seqs=batch.num_seqs,
        bootstrap=0,
        interventions=Interventions.from_options(ablate_sink_values="auto"),
    )
    result = analyze_model(prepared_model(sink_model(SINK_LOGITS), batch, config.analysis, "sink-lab"), progress=False)
    ablated = result.manifest["interventions"][0]["sink_heads_ablated"]
    assert ablated == {str(layer): list(heads) for layer, heads in SINK_HEADS.items()}
    scores = result.per_head.sort_values(["layer", "head"])["sink_score"].to_numpy().reshape(3, 4)
    np.testing.assert_allclose(scores, sink_scores(SINK_LOGITS, layers=3), atol=1e-6)


# ------------------------------------------------------------- key 0's weight held at its mean, or removed

READS = [("hold_sink_clock", "mean"), ("remove_sink_reads", "zero")]


def _reweighted_attention(heads: dict[int, tuple[int, ...]], target: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """Softmax attention in float64 from the definition (scaling, soft-cap, window, learned sink logit), whose
    `heads` have their weight rows edited: for each query i ≥ 1 that sees key 0, a'_{i,0} = ā (the mean of a_{i,0}
    over those queries, `target` "mean") or 0 ("zero"), a'_{i,j} = a_{i,j}·(1 − a'_{i,0})/(1 − a_{i,0}) for the
    other keys; query 0 and queries that do not see key 0 keep their rows."""

    def attention(  # type: ignore[no-untyped-def]
        module, query, key, value, attention_mask, scaling=None, sliding_window=None, softcap=None, s_aux=None, **kw
    ):
        layer, groups = int(module.layer_idx), query.shape[1] // key.shape[1]
        q = query.double()
        k, v = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
        logits = q @ k.transpose(-1, -2) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        i, j = torch.arange(q.shape[-2])[:, None], torch.arange(q.shape[-2])[None, :]
        valid = (j <= i) & ((i - j < sliding_window) if sliding_window else True)
        logits = logits.masked_fill(~valid, float("-inf"))
        if s_aux is not None:  # the sink's column takes weight and contributes no value
            sink = s_aux.double()[None, :, None, None].expand(*logits.shape[:-1], 1)
            weights = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(logits, dim=-1)
        sees = valid[1:, 0]
        for head in heads.get(layer, ()):
            rows = weights[:, head, 1:].clone()  # (B, T − 1, T)
            old = rows[:, :, 0]
            new = old[:, sees].mean(-1, keepdim=True).expand_as(old) if target == "mean" else torch.zeros_like(old)
            rows[:, :, 1:] *= ((1 - new) / (1 - old))[..., None]
            rows[:, :, 0] = new
            weights[:, head, 1:] = torch.where(sees[None, :, None], rows, weights[:, head, 1:])
        return (weights @ v).to(query.dtype).transpose(1, 2).contiguous(), None

    return attention


def _logits(model: PreTrainedModel, ids: torch.Tensor, edits: AttentionEdits | None = None) -> torch.Tensor:
    """The model's next-token logits with posleak's attention, under `edits`."""
    with CaptureSession(edits=edits).active(torch.arange(ids.shape[0])), torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize(("option", "target"), READS)
@pytest.mark.parametrize("family", ["llama", "gemma3", "gemma2", "gpt_oss"])
def test_key0_reweighting_equals_a_forward_with_the_attention_rows_edited_by_hand(
    family: str, option: str, target: str
) -> None:
    """--hold-sink-clock and --remove-sink-reads: the model's logits equal, to 1e-5, those of a float64 forward
    whose attention rows of the named heads are edited from the definition (GQA, Gemma 3's windows that hide key
    0 from later queries, Gemma 2's soft-cap, GPT-OSS's learned sink); the edit ran once in each layer it names,
    and moved the logits by far more than that."""
    model = use_posleak_attention(tiny_model(family))
    ids, heads = tiny_ids(model), "0.1,1.2,1.3,2.0"
    edits = Interventions.from_options(**{option: heads}).attention_edits()
    edited = _logits(model, ids, edits)
    previous = model.config._attn_implementation
    try:
        AttentionInterface.register("key0_reads_by_hand", _reweighted_attention(parse_heads(heads), target))
        model.set_attn_implementation("key0_reads_by_hand")
        with torch.no_grad():
            reference = model(input_ids=ids, use_cache=False).logits
    finally:
        model.set_attn_implementation(previous)
    torch.testing.assert_close(edited, reference, rtol=0, atol=1e-5)
    assert (edited - _logits(model, ids)).abs().max() > 1e-2  # the path ran and moved the predictions
    (edit,) = edits.output_edits
    assert edit.edited == {0: 1, 1: 1, 2: 1}


def _call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: MaskSpec) -> AttentionCall:
    """A softmax attention call of `query`, `key` and `value` (B, H, T, ·; scaling 1), computed from the
    definition."""
    batch, _, seq_len, _ = query.shape
    logits = (query @ key.transpose(-1, -2)).masked_fill(~mask.dense(seq_len), float("-inf"))
    log_z = torch.logsumexp(logits, dim=-1)
    return AttentionCall(
        layer=0, query=query, key=key, value=value, scaling=1.0, softcap=None, sink=None, norm="softmax", mask=mask,
        log_z=log_z, log_z_keys=log_z, output=torch.softmax(logits, dim=-1) @ value, attended_keys=None,
        sequence_index=torch.arange(batch),
    )  # fmt: skip


@pytest.mark.parametrize(("option", "target"), READS)
def test_key0_reweighting_changes_exactly_key0s_weight_and_keeps_each_row_a_distribution(
    option: str, target: str
) -> None:
    """On a hand-built float64 call whose values are the identity (its output is its weight matrix): in the named heads,
    for the queries i ≥ 1 that see key 0, a'_{i,0} is the mean of a_{i,0} over them (so that mean is kept) or 0,
    the other keys keep their proportions and each row sums to 1; query 0, queries whose window hides key 0 and
    the head not named are untouched; and the clock removal leaves a head whose a_{i,0} is one constant c
    unchanged."""
    seq_len, window, c = 12, 6, 0.4
    mask = MaskSpec(window=window)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 3, seq_len, 4, generator=generator, dtype=torch.float64)
    key = torch.randn(2, 3, seq_len, 4, generator=generator, dtype=torch.float64)
    # head 1: s_{i,j} = 0 for j ≥ 1 and s_{i,0} = log(c·i/(1 − c)), so a_{i,0} = c for every query i ≥ 1 that sees it
    key[:, 1] = 0.0
    key[:, 1, 0, 0] = 1.0
    query[:, 1, 1:, 0] = torch.log(c * torch.arange(1, seq_len, dtype=torch.float64) / (1 - c))
    call = _call(query, key, torch.eye(seq_len, dtype=torch.float64).expand(2, 3, seq_len, seq_len), mask)
    weights = call.output
    (edit,) = Interventions.from_options(**{option: "0.0,0.1"}).attention_edits().output_edits
    new = edit(call)

    sees = torch.arange(seq_len) < window  # the queries that see key 0
    sees[0] = False  # query 0 is not edited
    torch.testing.assert_close(new[:, 2], weights[:, 2], rtol=0, atol=0)  # the head not named
    torch.testing.assert_close(new[:, :, ~sees], weights[:, :, ~sees], rtol=0, atol=0)  # query 0, hidden key 0
    old0, new0 = weights[:, :2, sees, 0], new[:, :2, sees, 0]
    torch.testing.assert_close(new[:, :2].sum(-1), torch.ones_like(new[:, :2].sum(-1)), rtol=0, atol=1e-12)
    ratio = new[:, :2, sees, 1:] / weights[:, :2, sees, 1:].clamp(min=1e-300)
    shown = weights[:, :2, sees, 1:] > 0  # the keys a row sees keep their proportions
    expected = ((1 - new0) / (1 - old0))[..., None].expand_as(ratio)
    torch.testing.assert_close(ratio[shown], expected[shown], rtol=1e-12, atol=0)
    if target == "mean":
        torch.testing.assert_close(new0, old0.mean(-1, keepdim=True).expand_as(new0), rtol=1e-12, atol=0)
        torch.testing.assert_close(new0.mean(-1), old0.mean(-1), rtol=1e-12, atol=0)
        torch.testing.assert_close(weights[:, 1, sees, 0], torch.full_like(new0[:, 1], c), rtol=1e-12, atol=0)
        torch.testing.assert_close(new[:, 1], weights[:, 1], rtol=0, atol=1e-12)  # a constant read is kept
    else:
        assert new0.abs().max() == 0
    assert (new[:, 0, sees] - weights[:, 0, sees]).abs().max() > 1e-2  # it edited the random head


@pytest.mark.parametrize(("option", "target"), READS)
def test_key0_reweighting_of_a_head_that_reads_only_key_0_is_the_attention_over_the_other_keys(
    option: str, target: str
) -> None:
    """A float32 head whose a_{i,0} is 1 up to rounding (logit 40 above the others; 1 − a_{i,0} is float32 noise of
    either sign): the edited output of queries i ≥ 1 is ā·v_0 + (1 − ā)·(softmax over keys 1.. alone)·v to float32
    precision, where the correction (o_i − a_{i,0}·v_0)/(1 − a_{i,0}) would divide rounding by rounding."""
    generator = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(1, 1, 10, 4, generator=generator) for _ in range(3))
    query[..., 0], key[..., 0] = 1.0, 0.0
    key[:, :, 0, 0] = 40.0
    call = _call(query, key, value, MaskSpec())
    weight0 = call.attention_on_key0()[..., 1:].double()
    assert bool(((1 - weight0).abs() < 1e-5).all())
    (edit,) = Interventions.from_options(**{option: "0.0"}).attention_edits().output_edits
    new = edit(call)
    logits = query[..., 1:, :].double() @ key[..., 1:, :].double().transpose(-1, -2)
    rest = torch.softmax(logits.masked_fill(~MaskSpec().dense(9), float("-inf")), dim=-1) @ value[..., 1:, :].double()
    held = weight0.mean() if target == "mean" else 0.0
    expected = held * value[..., :1, :].double() + (1 - held) * rest
    torch.testing.assert_close(new[..., 1:, :].double(), expected, rtol=0, atol=1e-6)
    assert target == "mean" or (new[..., 1:, :] - call.output[..., 1:, :]).abs().max() > 0.1
    torch.testing.assert_close(new[..., 0, :], call.output[..., 0, :], rtol=0, atol=0)


class _Outputs:
    """Keeps every layer's attention output as the model passed it on (after edits)."""

    needs_attended_keys = False

    def __init__(self) -> None:
        self.outputs: dict[int, torch.Tensor] = {}

    def update(self, call: AttentionCall) -> None:
        self.outputs[call.layer] = call.output.clone()


@pytest.mark.parametrize(("option", "target"), READS)
def test_key0_reweighting_of_a_model_leaves_other_heads_layers_and_query_0_alone(option: str, target: str) -> None:
    """In a tiny Llama with heads 1.0 and 1.2 named: layer 0's attention outputs, layer 1's other heads and query 0
    of every head are bit for bit the unedited ones; the named heads' later queries are not."""
    model = use_posleak_attention(tiny_model("llama"))
    ids = tiny_ids(model)
    base, edited = _Outputs(), _Outputs()
    CaptureSession([base]).forward(model, ids)
    CaptureSession([edited], Interventions.from_options(**{option: "1.0,1.2"}).attention_edits()).forward(model, ids)
    torch.testing.assert_close(edited.outputs[0], base.outputs[0], rtol=0, atol=0)
    torch.testing.assert_close(edited.outputs[1][:, [1, 3]], base.outputs[1][:, [1, 3]], rtol=0, atol=0)
    torch.testing.assert_close(edited.outputs[1][:, :, 0], base.outputs[1][:, :, 0], rtol=0, atol=0)
    assert (edited.outputs[1][:, [0, 2], 1:] - base.outputs[1][:, [0, 2], 1:]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("option", "key"), [("hold_sink_clock", "sink_heads_clock_held"), ("remove_sink_reads", "sink_heads_reads_removed")]
)
def test_auto_key0_reweighting_edits_exactly_the_sink_heads(option: str, key: str) -> None:
    """`auto` records the constructed sink heads as the ones edited, edits exactly those, and leaves the sink scores
    the analytic α_0 (the edit changes the heads' outputs only)."""
    batch = verbatim_batch(sink_ids())
    config = AnalyzeConfig(
        seq_len=SINK_T,
        num_seqs=batch.num_seqs,
        bootstrap=0,
        interventions=Interventions.from_options(**{option: "auto"}),
    )
    result = analyze_model(prepared_model(sink_model(SINK_LOGITS), batch, config.analysis, "sink-lab"), progress=False)
    assert result.manifest["interventions"][0][key] == {str(layer): list(heads) for layer, heads in SINK_HEADS.items()}
    (edit,) = Interventions.from_options(**{option: "auto"}).attention_edits(SINK_HEADS).output_edits
    assert edit.heads == {layer: heads for layer, heads in SINK_HEADS.items() if heads}
    scores = result.per_head.sort_values(["layer", "head"])["sink_score"].to_numpy().reshape(3, 4)
    np.testing.assert_allclose(scores, sink_scores(SINK_LOGITS, layers=3), atol=1e-6)


def test_bad_intervention_options_are_one_line_errors() -> None:
    with pytest.raises(PosleakError, match="rope-scaling"):
        Interventions.from_options(rope_scaling="ntk:abc").config_overrides(tiny_model("llama").config)
    with pytest.raises(PosleakError, match="--window"):
        Interventions.from_options(window="wide").attention_edits()
    with pytest.raises(PosleakError, match="ablate-sink-values"):
        Interventions.from_options(ablate_sink_values="3").attention_edits()
    with pytest.raises(PosleakError, match="--kv0-heads"):
        Interventions.from_options(patch_kv0="id:1", kv0_heads="1-2").attention_edits(model=tiny_model("llama"))
    for option in ("hold_sink_clock", "remove_sink_reads"):
        flag = "--" + option.replace("_", "-")
        assert Interventions.from_options(**{option: "1.x"}).problems(None, None) == [
            f"bad {flag} '1.x'; use auto or L.H,L.H (layer.head)"
        ]
        with pytest.raises(PosleakError, match=flag):
            Interventions.from_options(**{option: "3"}).attention_edits()


@pytest.mark.parametrize("option", ["hold_sink_clock", "remove_sink_reads"])
def test_key0_reweighting_refuses_sigmoid_attention(option: str) -> None:
    """Sigmoid attention has no normaliser, so no row whose sum a reweighting of key 0 keeps: a one-line refusal."""
    from posleak.models.lab.config import LabSpec
    from posleak.models.lab.hf_config import LabConfig
    from posleak.models.lab.model import build_lab_model

    config = LabConfig.from_spec(LabSpec(size="tiny", norm="sigmoid"), 32, 2 * SINK_T, bos_id=0, eos_id=None)
    model = use_posleak_attention(build_lab_model(config, seed=0).eval())
    flag = "--" + option.replace("_", "-")
    with pytest.raises(PosleakError, match=f"^{flag} reweights a softmax row; layer 0's attention is sigmoid") as err:
        CaptureSession(edits=Interventions.from_options(**{option: "0.0"}).attention_edits()).forward(model, sink_ids())
    assert "\n" not in str(err.value)
