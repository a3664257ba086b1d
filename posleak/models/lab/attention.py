"""The lab decoder's attention and position parts: RoPE tables and rotation, ALiBi slopes, the sinusoidal
encoding, and `LabAttention`.

Attention goes through transformers' `AttentionInterface` (default: posleak's function), with the
real post-RoPE q and k. Two things are folded into q and k so that every logit the function sees
is the true logit and the decomposition's bilinear path holds unchanged:

- ALiBi: q' = [q, slope·√D, −slope·√D·i], k' = [k, j, 1], so scale·q'·k' = scale·q·k − slope·(i − j);
- the sigmoid logit bias b_h: q' = [q, b_h·√D], k' = [k, 1].

Values are zero-padded to the width of q' (torch's CPU flash kernel wants one head size) and the
padding is cut from the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from posleak.errors import PosleakError
from posleak.models.lab.hf_config import LabConfig

# transformers' own implementations ignore posleak_norm, posleak_prefix and s_aux: a lab model under
# them would silently compute something else.
_BUILTIN_IMPLEMENTATIONS = frozenset({"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"})


def _refuse_eager(*args: object, **kwargs: object) -> None:
    raise PosleakError("lab models have no eager attention; call posleak.capture.use_posleak_attention(model)")


def alibi_slopes(heads: int) -> torch.Tensor:
    """Press et al.'s head slopes: 2^(−8h/H) for H a power of two, interleaved otherwise."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if heads & (heads - 1) == 0:
        return torch.tensor(power_of_two(heads))
    low = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(low) + power_of_two(2 * low)[0::2][: heads - low])


def rope_tables(config: LabConfig, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (B, 1, T, rotary_dim), rotate-half layout, for (B, T) position ids."""
    dim = config.rotary_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = (position_ids.double() * config.rope_position_scale)[..., None] * inv_freq.to(position_ids.device)
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dimensions of each head (rotate-half pairing); pass the rest."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def sinusoidal_embedding(position_ids: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Vaswani et al.'s fixed encoding, (B, T, hidden): sin on even, cos on odd dimensions."""
    freq = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float64) * (-math.log(10000.0) / hidden))
    angles = position_ids.double()[..., None] * freq.to(position_ids.device)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :hidden].to(dtype)


class LabAttention(nn.Module):
    """Multi-head attention; q and k carry every position term, so the attention function sees true logits."""

    def __init__(self, config: LabConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = True
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        heads = config.num_attention_heads
        self.sink = nn.Parameter(torch.zeros(heads)) if config.norm == "sink" else None
        sigmoid = config.norm == "sigmoid"
        self.logit_bias = nn.Parameter(torch.full((heads,), config.sigmoid_bias_init)) if sigmoid else None

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        batch, seq_len, _ = hidden.shape
        qkv = self.qkv_proj(hidden).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
        if rope is not None:
            query, key = apply_rope(query, rope[0], rope[1]), apply_rope(key, rope[0], rope[1])
        query, key = self._fold_logit_terms(query, key, position_ids)
        if query.shape[-1] > self.head_dim:
            value = F.pad(value, (0, query.shape[-1] - self.head_dim))
        attend = self._attention_function()
        out, _ = attend(self, query, key, value, None, dropout=0.0, scaling=self.scaling, **self._mask_kwargs())
        out = out[..., : self.head_dim].reshape(batch, seq_len, -1)
        return self.o_proj(out)

    def _attention_function(self) -> Callable:
        implementation = self.config._attn_implementation
        if implementation in _BUILTIN_IMPLEMENTATIONS:
            raise PosleakError(
                f"lab models do not run under '{implementation}' attention (it ignores their mask and "
                "normalisation); call posleak.capture.use_posleak_attention(model)"
            )
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, _refuse_eager)

    def _mask_kwargs(self) -> dict[str, object]:
        config = self.config
        kwargs: dict[str, object] = {"posleak_norm": "sigmoid" if config.norm == "sigmoid" else "softmax"}
        if config.sliding_window is not None:
            kwargs["sliding_window"] = config.sliding_window
        if config.prefix_length:
            kwargs["posleak_prefix"] = config.prefix_length
        if self.sink is not None:
            kwargs["s_aux"] = self.sink
        return kwargs

    def _fold_logit_terms(
        self, query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the ALiBi and sigmoid-bias columns (module docstring); a no-op for other variants."""
        q_cols: list[torch.Tensor] = []
        k_cols: list[torch.Tensor] = []
        batch, heads, seq_len, _ = query.shape
        root = 1.0 / self.scaling
        if self.config.pe == "alibi":
            slope = alibi_slopes(heads).to(query)[None, :, None] * root  # (1, H, 1)
            pos = position_ids.to(query.dtype)[:, None, :]  # (B, 1, T)
            q_cols += [slope.expand(batch, heads, seq_len), -slope * pos]
            k_cols += [pos.expand(batch, heads, seq_len), torch.ones_like(pos).expand(batch, heads, seq_len)]
        if self.logit_bias is not None:
            q_cols.append((self.logit_bias.to(query) * root)[None, :, None].expand(batch, heads, seq_len))
            k_cols.append(query.new_ones(batch, heads, seq_len))
        if not q_cols:
            return query, key
        return torch.cat([query, torch.stack(q_cols, -1)], -1), torch.cat([key, torch.stack(k_cols, -1)], -1)
