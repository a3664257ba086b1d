"""posleak's attention function, registered with transformers' `AttentionInterface` as "posleak".

Every model posleak analyses (registry checkpoints and lab models) runs its attention through
`posleak_attention`. It receives the model's own post-RoPE q and k, so RoPE is never re-derived. It
builds the causal / sliding / prefix mask itself from the layer's structure (transformers builds no
mask for an implementation it does not know), and when a `CaptureSession` is active it hands the
call to the session's streaming accumulators. No T×T tensor outlives the call.

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

from posleak.capture.masks import MaskSpec
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
    """Register the function (idempotent) and switch `model` to it."""
    AttentionInterface.register(IMPLEMENTATION, posleak_attention)
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
    _refuse_unsupported(query, key, attention_mask)
    _refuse_short_chunks(module, query.shape[-2])
    session = active_session()
    scaling = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    norm = str(kwargs.get("posleak_norm", "softmax"))
    spec = MaskSpec(
        causal=bool(getattr(module, "is_causal", True)),
        window=sliding_window,
        prefix=int(kwargs.get("posleak_prefix", 0) or 0),
    )
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    value = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    dropout = dropout if module.training else 0.0

    if session is None:
        output = _attend_uncaptured(query, key, value, spec, scaling, dropout, softcap, s_aux, norm)
        return output.transpose(1, 2).contiguous(), None

    layer = int(module.layer_idx)
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


def _refuse_unsupported(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """A padding mask or a KV cache: posleak analyses whole unpadded sequences in one forward."""
    if attention_mask is not None:
        raise PosleakError(
            "posleak's attention builds its own causal and window masks; pass unpadded input_ids "
            "without an attention mask"
        )
    if query.shape[-2] != key.shape[-2]:
        raise PosleakError("posleak analyses whole sequences in one forward; disable the KV cache (use_cache=False)")


def _refuse_short_chunks(module: torch.nn.Module, seq_len: int) -> None:
    """Llama 4's chunked layers see only their own chunk of keys, a mask posleak does not build: refuse where a
    chunk is shorter than the sequence rather than attend over keys the model would not see."""
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None) or []
    layer = getattr(module, "layer_idx", None)
    if isinstance(layer, int) and layer < len(types) and types[layer] == "chunked_attention":
        chunk = getattr(config, "attention_chunk_size", None)
        if chunk is not None and chunk < seq_len:
            raise PosleakError(
                f"layer {layer} uses chunked attention of {chunk} positions, shorter than the sequence ({seq_len}); "
                "posleak does not build chunked masks"
            )


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
