"""Which keys a query sees: the causal mask, a sliding window, a bidirectional prefix.

The accumulators need the mask's structure (which offsets are valid for query i), not a T×T tensor. The
structure is the model's own: `model_mask` is posleak's entry in transformers' `AttentionMaskInterface`, so
every mask a model asks transformers for (causal, sliding, chunked, per layer type) reaches posleak's attention
with the `MaskSpec` it equals, however the model's attention module is written (Phi-MoE builds a sliding mask
but passes no `sliding_window` to its attention). A dense mask is built at most once per forward and length
(see `dense`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers.masking_utils import causal_mask_function, sdpa_mask

SPEC_ATTRIBUTE = "posleak_spec"  # the MaskSpec model_mask attaches to the mask tensor it returns


@dataclass(frozen=True)
class MaskSpec:
    """The valid pairs (i, j): j ≤ i (causal), i − j < window (sliding), and, for queries inside a
    bidirectional prefix of length `prefix`, every key of that prefix."""

    causal: bool = True
    window: int | None = None
    prefix: int = 0

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be ≥ 1, got {self.window}")

    @staticmethod
    def of_dense(mask: torch.Tensor) -> MaskSpec | None:
        """The spec whose valid pairs are exactly those of a (B, 1, T, T) boolean mask that is the same for every
        sequence: every key (not causal), or a causal mask with an optional sliding window; None for any other
        (padding, chunks, bidirectional image tokens)."""
        rows = mask[:, 0]
        if not bool((rows == rows[:1]).all()):
            return None
        valid, pos = rows[0], torch.arange(rows.shape[-1], device=mask.device)
        if bool(valid.all()):
            return MaskSpec(causal=False)
        first = valid.int().argmax(-1)  # the first valid key of each query
        if not torch.equal(valid, (pos[None, :] >= first[:, None]) & (pos[None, :] <= pos[:, None])):
            return None
        width = int((pos - first).max()) + 1
        if not torch.equal(first, (pos - width + 1).clamp(min=0)):
            return None
        return MaskSpec(window=width if width < valid.shape[-1] else None)

    def plain_causal_at(self, seq_len: int) -> bool:
        """True when, at this length, the valid pairs are the lower triangle (the flash kernel's is_causal).

        A window at least T wide admits every causal pair; the kernels then take the same is_causal call as
        without a window, so such a window changes no number, bit for bit (an intervention that changes
        nothing leaves everything unchanged)."""
        no_window = self.window is None or self.window >= seq_len
        return self.causal and no_window and self.prefix == 0

    def restricts(self, seq_len: int) -> bool:
        """Whether the mask excludes any pair at this length (an encoder-style mask does not)."""
        if self.causal:
            return seq_len > 1
        return self.window is not None and self.window < seq_len

    def valid(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Boolean validity of (i, j), broadcasting the two index tensors."""
        ok = j <= i if self.causal else torch.ones_like(i - j, dtype=torch.bool)
        if self.window is not None:
            ok = ok & (i - j < self.window)
        if self.prefix > 0:
            ok = ok | ((i < self.prefix) & (j < self.prefix))
        return ok

    def dense(self, seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The T×T boolean mask (True = attend). Cached: one per spec, length and device."""
        return _dense(self, seq_len, str(device))

    def additive(self, seq_len: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """The T×T additive mask (0 or −inf) the flash kernel takes. Cached like `dense`."""
        return _additive(self, seq_len, dtype, str(device))


@lru_cache(maxsize=8)
def _dense(spec: MaskSpec, seq_len: int, device: str) -> torch.Tensor:
    pos = torch.arange(seq_len, device=device)
    return spec.valid(pos[:, None], pos[None, :])


@lru_cache(maxsize=8)
def _additive(spec: MaskSpec, seq_len: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    mask = torch.zeros(seq_len, seq_len, dtype=dtype, device=device)
    return mask.masked_fill_(~_dense(spec, seq_len, device), float("-inf"))


def model_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    use_vmap: bool = False,
    device: torch.device | str = "cpu",
    **kwargs: object,
) -> torch.Tensor:
    """transformers' `AttentionMaskInterface` signature: the boolean mask the model asks for, as sdpa gets it (one
    row of the batch without padding, which broadcasts), carrying the `MaskSpec` it equals as `SPEC_ATTRIBUTE`
    (None where it is none: padding, a cache, chunks shorter than the sequence). A real tensor, so a model that
    does arithmetic on its mask (Doge) still runs up to its attention call."""
    dense = sdpa_mask(
        batch_size=batch_size if attention_mask is not None else 1,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        use_vmap=use_vmap,
        device=device,
    )
    whole = q_length == kv_length and q_offset == kv_offset == 0
    setattr(dense, SPEC_ATTRIBUTE, MaskSpec.of_dense(dense) if whole else None)
    return dense


def spec_of(mask: torch.Tensor) -> MaskSpec | None:
    """The `MaskSpec` a mask tensor equals: the one `model_mask` attached, else (a copy or slice of it) read from a
    4-D boolean mask; None for any other tensor (an additive mask a model made of its own)."""
    if hasattr(mask, SPEC_ATTRIBUTE):
        return getattr(mask, SPEC_ATTRIBUTE)
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[-1] != mask.shape[-2]:
        return None
    return MaskSpec.of_dense(mask)
