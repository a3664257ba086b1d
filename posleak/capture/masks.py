"""Which keys a query sees: the causal mask, a sliding window, a bidirectional prefix.

posleak builds masks itself from the layer's declared structure instead of taking a T×T tensor from
transformers: the accumulators need the structure (which offsets are valid for query i), not a
tensor, and a dense mask is built at most once per forward and length (see `dense`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


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
