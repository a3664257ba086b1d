"""ΔR² leakage (DESIGN.md §3.2) from running sums, never from materialised cells.

Per head, ordinary least squares of y over all valid (n, i, j) on [1, d] (relative) and on [1, i, j]
(full), for y = s (logit) and y = ℓ = s − log Z_i (log-attention); ΔR² = R²_full − R²_rel. Because
d = i − j, [1, d] is nested in [1, i, j]. The sums needed are Σy, Σy², Σy·i, Σy·j over the data and the
moments of i and j over the valid pairs, which follow from the mask alone (`KeyRanges`).

Per query row an attention call supplies rowsum_i = Σ_j s_ij, rowjsum_i = Σ_j j·s_ij and Σ_j s_ij²
(`RowSums`: from the bilinear form here, from materialised logit blocks in decomposition.py); the ℓ sums
then follow from log Z_i without touching a logit again:
Σℓ = Σs − Σ_i n_i z_i, Σℓ·i = Σs·i − Σ_i i n_i z_i, Σℓ·j = Σs·j − Σ_i z_i J_i,
Σℓ² = Σs² − 2 Σ_i z_i rowsum_i + Σ_i n_i z_i²   (n_i valid keys of query i, J_i = Σ of their positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
import torch.nn.functional as F

from posleak.capture.masks import MaskSpec
from posleak.capture.session import AttentionCall

# Order of the eight running sums kept per head: y = s, then y = ℓ.
SUM_FIELDS = ("s", "ss", "si", "sj", "l", "ll", "li", "lj")
# Relative size below which a variance or a determinant counts as zero (a degenerate design).
_DEGENERATE = 1e-12


# ------------------------------------------------------------------------------------------ design


@dataclass(frozen=True)
class KeyRanges:
    """The valid keys of each query under a causal (optionally windowed) mask: j ∈ [first_i, i]."""

    count: torch.Tensor  # (T,) float64: n_i
    j_sum: torch.Tensor  # (T,) float64: Σ_j j
    j_sq_sum: torch.Tensor  # (T,) float64: Σ_j j²

    @staticmethod
    def of(mask: MaskSpec, seq_len: int) -> KeyRanges:
        return _key_ranges(mask, seq_len)


@lru_cache(maxsize=16)
def _key_ranges(mask: MaskSpec, seq_len: int) -> KeyRanges:
    if not mask.causal or mask.prefix > 0:
        raise NotImplementedError(f"ΔR² supports causal masks with an optional sliding window, not {mask}")
    last = torch.arange(seq_len, dtype=torch.float64)
    first = torch.zeros_like(last) if mask.window is None else torch.clamp(last - mask.window + 1, min=0)

    def power_sum(upto: torch.Tensor, power: int) -> torch.Tensor:  # Σ_{j=0}^{upto} j^power, exact in float64
        return upto * (upto + 1) / 2 if power == 1 else upto * (upto + 1) * (2 * upto + 1) / 6

    return KeyRanges(
        count=last - first + 1,
        j_sum=power_sum(last, 1) - power_sum(first - 1, 1),
        j_sq_sum=power_sum(last, 2) - power_sum(first - 1, 2),
    )


@dataclass(frozen=True)
class DesignMoments:
    """Means, variances and covariance of i and j over all valid (n, i, j); independent of n."""

    count: float  # number of valid (n, i, j)
    mean_i: float
    mean_j: float
    var_i: float
    var_j: float
    cov_ij: float

    @staticmethod
    def of(mask: MaskSpec, seq_len: int, num_seqs: int) -> DesignMoments:
        ranges = KeyRanges.of(mask, seq_len)
        i = torch.arange(seq_len, dtype=torch.float64)
        pairs = ranges.count.sum()
        mean_i = (i * ranges.count).sum() / pairs
        mean_j = ranges.j_sum.sum() / pairs
        return DesignMoments(
            count=float(pairs) * num_seqs,
            mean_i=float(mean_i),
            mean_j=float(mean_j),
            var_i=float((i * i * ranges.count).sum() / pairs - mean_i**2),
            var_j=float(ranges.j_sq_sum.sum() / pairs - mean_j**2),
            cov_ij=float((i * ranges.j_sum).sum() / pairs - mean_i * mean_j),
        )


def delta_r2(sums: torch.Tensor, design: DesignMoments) -> torch.Tensor:
    """ΔR² for y = s and y = ℓ from the running sums (..., 8) → (..., 2); NaN where the design or y
    is degenerate (a constant y, or i and j — or d — without spread, as at T = 1 or a window of 1)."""
    return torch.stack([_delta_r2_one(sums[..., k : k + 4], design) for k in (0, 4)], dim=-1)


def _delta_r2_one(sums: torch.Tensor, design: DesignMoments) -> torch.Tensor:
    # Centred moments: the raw normal equations are badly conditioned for long sequences (i ~ T).
    n = design.count
    mean_y = sums[..., 0] / n
    var_y = sums[..., 1] / n - mean_y**2
    cov_yi = sums[..., 2] / n - mean_y * design.mean_i
    cov_yj = sums[..., 3] / n - mean_y * design.mean_j
    var_d = design.var_i - 2 * design.cov_ij + design.var_j
    det = design.var_i * design.var_j - design.cov_ij**2
    # full model [1, i, j]: explained variance c_yᵀ C⁻¹ c_y with C the covariance of (i, j)
    explained_full = (design.var_j * cov_yi**2 - 2 * design.cov_ij * cov_yi * cov_yj + design.var_i * cov_yj**2) / det
    explained_rel = (cov_yi - cov_yj) ** 2 / var_d
    scale_y = sums[..., 1] / n
    degenerate = (
        (var_y <= _DEGENERATE * scale_y)
        | (det <= _DEGENERATE * design.var_i * design.var_j)
        | (var_d <= _DEGENERATE * (design.var_i + design.var_j))
    )
    result = (explained_full - explained_rel) / var_y
    return torch.where(degenerate, torch.full_like(result, float("nan")), result)


# ---------------------------------------------------------------------------------- per-call sums


@dataclass
class RowSums:
    """One call's sums over each query's valid keys, float64: Σ_j s_ij and Σ_j j·s_ij per sequence, head
    and query (B, H, T), and Σ_ij s_ij² per sequence and head (B, H)."""

    total: torch.Tensor
    position_weighted: torch.Tensor
    squares: torch.Tensor

    def running_sums(self, log_z: torch.Tensor, ranges: KeyRanges) -> torch.Tensor:
        """The eight sums of SUM_FIELDS for each (sequence, head), (B, H, 8) float64 on the CPU."""
        rowsum, rowjsum, z = self.total.double().cpu(), self.position_weighted.double().cpu(), log_z.double().cpu()
        i = torch.arange(z.shape[-1], dtype=torch.float64)
        n, j_sum = ranges.count, ranges.j_sum
        s, si, sj = rowsum.sum(-1), (rowsum * i).sum(-1), rowjsum.sum(-1)
        ss = self.squares.double().cpu()
        return torch.stack(
            [
                s,
                ss,
                si,
                sj,
                s - (n * z).sum(-1),
                ss - 2 * (z * rowsum).sum(-1) + (n * z * z).sum(-1),
                si - (i * n * z).sum(-1),
                sj - (j_sum * z).sum(-1),
            ],
            dim=-1,
        )


def log_z_of(call: AttentionCall) -> torch.Tensor:
    """log Z_i as the decomposition uses it: the call's (with any sink logit), and 0 for sigmoid attention,
    whose weights are not normalised (ℓ = s there)."""
    return torch.zeros_like(call.log_z) if call.norm == "sigmoid" else call.log_z


def kv_heads(call: AttentionCall) -> tuple[torch.Tensor, int]:
    """The distinct keys (B, KV, T, D) and the group size: call.key repeats each KV head `groups` times
    (repeat_interleave), and every head of a group has identical keys, checked exactly."""
    key, heads = call.key, call.key.shape[1]
    groups = 1
    while groups < heads and torch.equal(key[:, groups], key[:, 0]):
        groups += 1
    if heads % groups or not torch.equal(key, key[:, ::groups].repeat_interleave(groups, dim=1)):
        groups = 1
    return key[:, ::groups], groups


@dataclass
class Bilinear:
    """A call's logits as s_ij = q_i·k_j (no soft-cap), in float64: queries pre-scaled and grouped by
    KV head, (B, KV, G, T, D); the distinct keys (B, KV, T, D) and their prefix sums K[p] = Σ_{j<p} k_j."""

    query: torch.Tensor
    keys: torch.Tensor
    window: int | None

    @staticmethod
    def of(call: AttentionCall) -> Bilinear:
        if call.softcap is not None:
            raise ValueError("soft-capped logits are not bilinear in q and k")
        keys, groups = kv_heads(call)
        batch, heads, seq_len, dim = call.query.shape
        # contiguous: every use below runs along positions and dimensions (a transposed view is ~1.5× slower)
        query = call.query.to(torch.float64, memory_format=torch.contiguous_format) * call.scaling
        query = query.view(batch, heads // groups, groups, seq_len, dim)
        return Bilinear(query, keys.double(), call.mask.window)

    @cached_property
    def prefix(self) -> torch.Tensor:
        return _prefix_sums(self.keys)

    def row_sums(self) -> RowSums:
        batch, kv, groups = self.query.shape[:3]
        return RowSums(
            *self.first_moments(), sum_of_squares(self.query, self.keys, self.window).view(batch, kv * groups)
        )

    def first_moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Σ_j s_ij and Σ_j j·s_ij, (B, H, T): q_i against differences of prefix sums of k and of j·k."""
        batch, kv, groups, seq_len, _ = self.query.shape
        position = torch.arange(seq_len, dtype=torch.float64, device=self.keys.device)
        sums = [self.prefix, _prefix_sums(self.keys * position[:, None])]
        # keys first_i .. i with first_i = max(0, i − W + 1): X[i + 1] − X[first_i], by slicing
        lag = seq_len if self.window is None else min(self.window, seq_len)
        over_keys = [x[:, :, 1:] - F.pad(x[:, :, : seq_len - lag + 1], (0, 0, lag - 1, 0)) for x in sums]
        rowsum, rowjsum = ((self.query * x.unsqueeze(2)).sum(-1).view(batch, kv * groups, seq_len) for x in over_keys)
        return rowsum, rowjsum


def _prefix_sums(values: torch.Tensor) -> torch.Tensor:
    """Along positions (dim 2), with a leading 0: (B, KV, T + 1, D)."""
    return torch.cat([torch.zeros_like(values[:, :, :1]), values.cumsum(2)], dim=2)


def sum_of_squares(query: torch.Tensor, key: torch.Tensor, window: int | None) -> torch.Tensor:
    """Σ over valid (i, j) of (q_i·k_j)² per query head, without forming the T×T logits.

    query (B, KV, G, T, D) already scaled, key (B, KV, T, D), both float64; returns (B, KV, G). Positions
    are cut into blocks; where every pair of a query block α and a key block β is valid, their share is
    ⟨Σ_{i∈α} q_i q_iᵀ, Σ_{j∈β} k_j k_jᵀ⟩ (Frobenius), summed over such β with prefix sums of the key
    Grams. Only the diagonal block and, under a window, the one or two blocks at its edge mix valid and
    invalid pairs; their logits are formed block by block. Cost ~T·D²·(H + KV) instead of T²·D·H/2.
    """
    batch, kv, groups, seq_len, dim = query.shape
    block = max(32, dim)  # balances the Gram work (T·D²) against the partial blocks (T·block·D)
    blocks = -(-seq_len // block)
    pad = (0, 0, 0, blocks * block - seq_len)
    q = F.pad(query, pad).view(batch, kv, groups, blocks, block, dim)
    k = F.pad(key, pad).view(batch, kv, blocks, block, dim)
    key_gram = k.transpose(-1, -2) @ k
    prefix = torch.cat([torch.zeros_like(key_gram[:, :, :1]), key_gram.cumsum(2)], dim=2)
    alpha = torch.arange(blocks, device=query.device)
    # key blocks β wholly valid for query block α: β < α, and under a window β ≥ α + 1 − ⌊W / block⌋
    whole = blocks if window is None else window // block
    full_lo = torch.minimum(torch.clamp(alpha + 1 - whole, min=0), alpha)
    total = torch.einsum("bkgnde,bknde->bkg", q.transpose(-1, -2) @ q, prefix[:, :, alpha] - prefix[:, :, full_lo])
    # the partly valid blocks, at block distance δ = α − β
    near = [0] if window is None else [0, *range(max(whole, 1), (window + block - 2) // block + 1)]
    positions = torch.arange(blocks * block, device=query.device).view(blocks, block)
    for delta in near:
        beta = alpha - delta
        i, j = positions[:, :, None], positions[beta.clamp(min=0)][:, None, :]
        valid = (beta >= 0)[:, None, None] & (j <= i) & (i < seq_len)
        if window is not None:
            valid &= i - j < window
        logits = q @ k[:, :, beta.clamp(min=0)].unsqueeze(2).transpose(-1, -2)
        total += (logits.square() * valid).sum(dim=(-1, -2, -3))
    return total
