"""posleak's attention function, registered with transformers' `AttentionInterface` as "posleak".

Every model posleak analyses (registry checkpoints and lab models) runs its attention through
`posleak_attention`. It receives the model's own post-RoPE q and k, so RoPE is never re-derived, and the
mask the model asked transformers for as a `MaskSpec` (masks.model_mask, registered with the function); it
builds the causal / sliding / prefix mask from that structure, and when a `CaptureSession` is active it hands
the call to the session's streaming accumulators. No T×T tensor outlives the call.

Three ways to compute one call, chosen per call:
- no session, plain softmax: `F.scaled_dot_product_attention` (what training and plain use run);
- session, softmax without soft-cap: a fused kernel that also returns log Z_i (`_attend_fused`):
  torch's CPU flash kernel on the CPU, the memory-efficient kernel on CUDA (its log-sum-exp output);
- soft-cap, sigmoid normalisation, a learned sink while training, a device without such a kernel (MPS),
  or `blockwise_attention()` in force: the logits are materialised one block of queries at a time
  (`attend_materialised`), in float32 whatever the model's dtype (as the fused kernels accumulate).

Every tensor is created on the device of the q it meets, so a model spread over devices by a device map
runs each layer where that layer lives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from posleak.capture.masks import MaskSpec, model_mask, spec_of
from posleak.capture.session import AttentionCall, active_session, soft_cap
from posleak.errors import PosleakError

IMPLEMENTATION = "posleak"
# Materialise at most this many logits at once (B·H·block·T) in the block-wise path.
_BLOCK_ELEMENTS = 1 << 24
_BLOCKWISE: ContextVar[bool] = ContextVar("posleak_blockwise", default=False)


@contextmanager
def blockwise_attention() -> Iterator[None]:
    """Within this block, captured calls take the block-wise path even where a fused kernel exists: the
    path every device without one takes, testable on the CPU against the fused one."""
    token = _BLOCKWISE.set(True)
    try:
        yield
    finally:
        _BLOCKWISE.reset(token)


def use_posleak_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Register the function and its mask entry (idempotent) and switch `model` to it."""
    AttentionInterface.register(IMPLEMENTATION, posleak_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, model_mask)
    model.set_attn_implementation(IMPLEMENTATION)
    return model


def posleak_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The AttentionInterface signature: q (B, H, T, D), k and v (B, KV, T, D) → (B, T, H, Dv)."""
    if kwargs.get("position_bias") is not None:
        # Inkling adds a hidden-state-conditioned relative bias to q·k: logits posleak's measures do not form
        raise PosleakError(
            f"layer {getattr(module, 'layer_idx', '?')} adds a bias of its own to the attention logits "
            "(position_bias); posleak measures logits that are q·k (scaled, soft-capped) only"
        )
    spec = _mask_of_call(module, query, key, attention_mask, sliding_window, int(kwargs.get("posleak_prefix", 0) or 0))
    session = active_session()
    scaling = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    norm = str(kwargs.get("posleak_norm", "softmax"))
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    value = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    dropout = dropout if module.training else 0.0

    if session is None:
        output = _attend_uncaptured(query, key, value, spec, scaling, dropout, softcap, s_aux, norm)
        return output.transpose(1, 2).contiguous(), None

    layer = _layer_of(module)
    spec = session.edits.mask_for(spec)
    with_keys = norm == "softmax" and session.needs_attended_keys
    out, log_z_keys = _attend_captured(query, key, value, spec, scaling, softcap, norm, with_keys)
    out, log_z = _with_sink(out, log_z_keys, s_aux)
    output, attended_keys = (out[..., : value.shape[-1]], out[..., value.shape[-1] :]) if with_keys else (out, None)
    call = AttentionCall(
        layer=layer,
        query=query,
        key=key,
        value=value,
        scaling=scaling,
        softcap=softcap,
        sink=None if s_aux is None else s_aux.detach().float(),
        norm=norm,
        mask=spec,
        log_z=log_z,
        log_z_keys=log_z_keys,
        output=output,
        attended_keys=attended_keys,
        sequence_index=session.sequence_index,
        groups=groups,
    )
    call.output = session.edits.edited_output(call)
    session.record(call)
    return call.output.transpose(1, 2).contiguous(), None


def _layer_of(module: torch.nn.Module) -> int:
    """The layer a captured call is filed under: the module's own index."""
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        # Zamba shares one attention module among its hybrid layers: its calls name no layer to file them under
        raise PosleakError(
            f"{type(module).__name__} has no layer index of its own (one attention module shared by several "
            "layers?); posleak files each attention call under its layer and cannot measure it"
        )
    return layer


def _mask_of_call(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sliding_window: int | None,
    prefix: int,
) -> MaskSpec:
    """The call's mask: the model's own where transformers made it (the `MaskSpec` of `model_mask`'s tensor), else the
    layer's declared structure (a module that builds no mask through transformers: posleak's lab models). A
    window the call names at least T wide, which no mask shows, is kept: the tables state the declared window.

    Refused: a KV cache, and any other mask (padding, chunks shorter than the sequence, a mask of the model's
    own), since posleak analyses whole unpadded sequences under causal masks with an optional window."""
    if query.shape[-2] != key.shape[-2]:
        raise PosleakError("posleak analyses whole sequences in one forward; disable the KV cache (use_cache=False)")
    model_spec = None if attention_mask is None else spec_of(attention_mask)
    if attention_mask is not None and model_spec is None:
        layer = getattr(module, "layer_idx", "?")
        raise PosleakError(
            f"layer {layer}'s attention mask is not one posleak measures (causal with an optional sliding window "
            "over whole sequences): pass unpadded input_ids without an attention mask; chunks shorter than the "
            "sequence and other patterns are not measured"
        )
    causal = bool(getattr(module, "is_causal", True))
    if attention_mask is None:
        return MaskSpec(causal=causal, window=sliding_window, prefix=prefix)
    # a module that declares itself non-causal attends to every key as before (the mask's causality yields)
    causal = causal and model_spec.causal
    declared = sliding_window is not None and sliding_window >= query.shape[-2] and causal
    window = sliding_window if declared and model_spec.window is None else model_spec.window
    return MaskSpec(causal=causal, window=window, prefix=prefix)


def _attend_captured(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: MaskSpec,
    scaling: float,
    softcap: float | None,
    norm: str,
    with_keys: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A captured call's output and log Z over the keys (no sink yet), fused where a kernel allows; with
    `with_keys` the output carries the attention-weighted keys after the values."""
    # the fused kernels want one head size for q, k and v (MiMo-V2-Flash's values are narrower than its keys)
    same_size = query.shape[-1] == value.shape[-1]
    if softcap is None and norm == "softmax" and same_size and _has_fused_kernel(query.device):
        if with_keys:
            # The fused kernels want one head size: zero-padding q and k keeps every logit.
            pad = (0, value.shape[-1])
            return _attend_fused(F.pad(query, pad), F.pad(key, pad), torch.cat([value, key], dim=-1), spec, scaling)
        return _attend_fused(query, key, value, spec, scaling)
    values_in = torch.cat([value, key], dim=-1) if with_keys else value
    return attend_materialised(query, key, values_in, spec, scaling, softcap, None, norm)


def _attend_uncaptured(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: MaskSpec,
    scaling: float,
    dropout: float,
    softcap: float | None,
    sink: torch.Tensor | None,
    norm: str,
) -> torch.Tensor:
    if softcap is None and sink is None and norm == "softmax":
        seq_len = query.shape[-2]
        causal = spec.plain_causal_at(seq_len)
        mask = None if causal or not spec.restricts(seq_len) else spec.dense(seq_len, query.device)
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scaling
        )
    out, _ = attend_materialised(query, key, value, spec, scaling, softcap, sink, norm)
    return out


def _has_fused_kernel(device: torch.device) -> bool:
    return device.type in ("cpu", "cuda") and not _BLOCKWISE.get()


def _attend_fused(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, spec: MaskSpec, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused kernel: the output and the float32 log-sum-exp of each query's valid logits, (B, H, T)."""
    seq_len = query.shape[-2]
    causal = spec.plain_causal_at(seq_len)
    masked = not causal and spec.restricts(seq_len)
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    if query.device.type == "cuda":
        # Not run by posleak's tests (no GPU where they run); benchmarks/device_check.py checks it against
        # eager attention on a machine with one. The kernel pads its log-sum-exp to a multiple of 32
        # queries and wants the bias's rows 16-byte aligned: a wider bias, viewed at its width, gives both.
        bias = None
        if masked:
            width = -(-seq_len // 16) * 16
            bias = spec.additive(width, query.dtype, query.device)[:seq_len, :seq_len]
            bias = bias.expand(query.shape[0], query.shape[1], seq_len, seq_len)
        out, log_z, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, True, 0.0, causal, scale=scaling
        )
        return out, log_z[..., :seq_len]
    mask = spec.additive(seq_len, query.dtype, query.device) if masked else None
    out, log_z = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, causal, attn_mask=mask, scale=scaling
    )
    return out, log_z


def _with_sink(
    out: torch.Tensor, log_z_keys: torch.Tensor, sink: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold a learned per-head sink logit into the normaliser: the keys' weights shrink by Z_keys/Z."""
    if sink is None:
        return out, log_z_keys
    log_z = torch.logaddexp(log_z_keys, sink.to(log_z_keys.dtype)[None, :, None])
    return (out * torch.exp(log_z_keys - log_z).unsqueeze(-1)).to(out.dtype), log_z


def attend_materialised(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: MaskSpec,
    scaling: float,
    softcap: float | None,
    sink: torch.Tensor | None,
    norm: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with the logits formed one block of queries at a time; differentiable.

    Returns the output (in the value's dtype) and log Z_i (including the sink logit; 0 for sigmoid
    normalisation, whose weights are not normalised), in float32 or wider: logits and weights of a
    half-precision model are formed in float32 from its q and k, as the fused kernels do.
    """
    batch, heads, seq_len, _ = query.shape
    wide = torch.promote_types(query.dtype, torch.float32)
    block = max(1, _BLOCK_ELEMENTS // max(1, batch * heads * seq_len))
    valid = spec.dense(seq_len, query.device)
    outs, log_zs = [], []
    for q0 in range(0, seq_len, block):
        q1 = min(seq_len, q0 + block)
        logits = soft_cap(query[:, :, q0:q1].to(wide) @ key.to(wide).transpose(-1, -2) * scaling, softcap)
        logits = logits.masked_fill(~valid[q0:q1], float("-inf"))
        if norm == "sigmoid":
            weights = torch.sigmoid(logits)
            log_z = torch.zeros(logits.shape[:-1], dtype=logits.dtype, device=logits.device)
        elif norm == "softmax":
            log_z = torch.logsumexp(logits, dim=-1)
            if sink is not None:
                log_z = torch.logaddexp(log_z, sink.to(log_z.dtype)[None, :, None])
            weights = torch.exp(logits - log_z.unsqueeze(-1))
        else:
            raise ValueError(f"unknown attention normalisation {norm!r}; use softmax or sigmoid")
        outs.append((weights @ value.to(wide)).to(value.dtype))
        log_zs.append(log_z)
    return torch.cat(outs, dim=-2), torch.cat(log_zs, dim=-1)
