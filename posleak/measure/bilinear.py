"""The sums of layer_sums.py without forming the T × T logits: s_ij = q_i·k_j is bilinear in q and k.

Every function takes the scaled queries grouped by KV head, (N, KV, G, T, D), and the keys, (N, KV, T, D),
in float64 (exact products of the model's float32 q and k), and returns float64 sums over the valid pairs
of a causal mask with an optional window W. Soft-capped logits are not bilinear: layer_sums.py
materialises those.

- Row sums Σ_j s_ij (and Σ_j j·s_ij) are q_i against differences of prefix sums of k (and of j·k).
- Column sums Σ_{i∈S} s_{i,i−d} over a segment S of queries are cross-correlations of q (rows outside S
  zeroed) with k, by FFT in O(T log T); short segments are summed directly.
- Gram matrices Σ_{i∈S} Σ_j s^n_ij s^{n'}_ij: with positions cut into blocks of b, a query block α and a key
  block β all of whose pairs are valid contribute ⟨Σ_{i∈α} Q_i Q_iᵀ, Σ_{j∈β} K_j K_jᵀ⟩ per pair of sequences,
  where Q_i stacks q_i of the N sequences (N·D) and K_j their k_j; key blocks are summed by a running prefix,
  so the cost is O(T·(N·D)²). Only the diagonal block and, under a window, the blocks at its edge mix valid
  and invalid pairs; their logits are formed block by block.
- Table cells: offsets below the grid's linear part are single logits (a narrow band of offset-ordered
  blocks); a far bin's sum is q_i against a difference of prefix sums of k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posleak.measure.grid import Grid
from posleak.measure.offset_blocks import offset_block, reverse_keys


def prefix_sums(values: torch.Tensor) -> torch.Tensor:
    """Along positions (dim −2), with a leading 0: (..., T, D) → (..., T + 1, D)."""
    return F.pad(values.cumsum(-2), (0, 0, 1, 0))


def _over_valid_keys(prefix: torch.Tensor, window: int | None) -> torch.Tensor:
    """Σ over query i's valid keys j ∈ [max(0, i − W + 1), i] of what `prefix` sums: X[i + 1] − X[first_i]."""
    seq_len = prefix.shape[-2] - 1
    lag = seq_len if window is None else min(window, seq_len)
    return prefix[..., 1:, :] - F.pad(prefix[..., : seq_len - lag + 1, :], (0, 0, lag - 1, 0))


def row_sums(query: torch.Tensor, keys: torch.Tensor, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_j s_ij per sequence, head and query (N, H, T), and Σ_n Σ_d d·s_{i,i−d} per head and query (H, T)."""
    num_seqs, kv, groups, seq_len, _ = query.shape
    position = torch.arange(seq_len, dtype=torch.float64)
    # Σ over each query's valid keys of k and of j·k, side by side: one product with q gives both sums
    both = torch.stack([keys, keys * position[:, None]], dim=-1)  # (N, KV, T, D, 2)
    over = _over_valid_keys(prefix_sums(both.flatten(-2)), window).view(both.shape)
    sums = (query.unsqueeze(-2) @ over.unsqueeze(2)).squeeze(-2)  # (N, KV, G, T, 2)
    rows = sums[..., 0].reshape(num_seqs, kv * groups, seq_len)
    weighted = sums[..., 1].reshape(num_seqs, kv * groups, seq_len)  # Σ_j j·s_ij
    return rows, (position * rows - weighted).sum(0)


def column_sums(query: torch.Tensor, keys: torch.Tensor, boundaries: tuple[int, ...], span: int) -> torch.Tensor:
    """Σ_{i∈S} s_{i,i−d} for each segment S = [boundaries[s], boundaries[s + 1]) and offset d < span:
    (S, N, H, span). The largest segment is the total minus the others; the total is a cross-correlation
    by FFT (zero-padded to 2T: no wrap-around), the other segments direct sums when that is cheaper."""
    num_seqs, kv, groups, seq_len, _ = query.shape
    segments = len(boundaries) - 1
    out = torch.zeros(segments, num_seqs, kv * groups, span, dtype=torch.float64)
    sizes = [boundaries[s + 1] - boundaries[s] for s in range(segments)]
    largest = max(range(segments), key=sizes.__getitem__)
    length = 2 * seq_len
    fft_cost = length * math.ceil(math.log2(length))
    for s in range(segments):
        lo, hi = boundaries[s], boundaries[s + 1]
        if s == largest:
            continue
        if (hi - lo) * min(hi, span) <= 4 * fft_cost:
            out[s] = _direct_columns(query, keys, lo, hi, span)
        else:
            out[s] = _fft_columns(query, keys, lo, hi, span)
    out[largest] = _fft_columns(query, keys, 0, seq_len, span) - out.sum(0)
    return out


def _direct_columns(query: torch.Tensor, keys: torch.Tensor, lo: int, hi: int, span: int) -> torch.Tensor:
    """Σ_{lo ≤ i < hi} s_{i,i−d}, (N, H, span), from the logits of those queries."""
    num_seqs, kv, groups, _, _ = query.shape
    logits = query[..., lo:hi, :] @ keys[:, :, None, :hi].mT  # (N, KV, G, hi − lo, hi): s_ij
    out = torch.zeros(num_seqs, kv, groups, span, dtype=torch.float64)
    for i in range(lo, hi):
        d = min(i + 1, span)  # offsets 0..d−1 reach keys i..i−d+1
        out[..., :d] += logits[..., i - lo, i - d + 1 : i + 1].flip(-1)
    return out.view(num_seqs, kv * groups, span)


def _fft_columns(query: torch.Tensor, keys: torch.Tensor, lo: int, hi: int, span: int) -> torch.Tensor:
    """Σ_{lo ≤ i < hi} q_i·k_{i−d} for d < span as one cross-correlation per head, (N, H, span); positions
    last, where the transforms run fastest."""
    num_seqs, kv, groups, seq_len, _ = query.shape
    length = 2 * seq_len
    keys_f = torch.fft.rfft(keys.transpose(-1, -2), n=length).conj()  # (N, KV, D, L/2 + 1)
    out = torch.empty(num_seqs, kv, groups, span, dtype=torch.float64)
    for g in range(groups):  # one query head per KV head at a time bounds the complex buffers
        rows = F.pad(query[:, :, g, lo:hi].transpose(-1, -2), (lo, seq_len - hi))  # (N, KV, D, T)
        spectrum = (torch.fft.rfft(rows, n=length) * keys_f).sum(-2)
        out[:, :, g] = torch.fft.irfft(spectrum, n=length)[..., :span]
    return out.view(num_seqs, kv * groups, span)


def stack(query: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k of the N sequences side by side: (KV, G, T, N·D) and (KV, T, N·D), so that one product of
    Q_i = [q¹_i … qᴺ_i] with K_j = [k¹_j … kᴺ_j] serves every pair of sequences, or sums over them."""
    num_seqs, kv, groups, seq_len, dim = query.shape
    stacked_q = query.permute(1, 2, 3, 0, 4).reshape(kv, groups, seq_len, num_seqs * dim)
    stacked_k = keys.permute(1, 2, 0, 3).reshape(kv, seq_len, num_seqs * dim)
    return stacked_q, stacked_k


def gram(
    query: torch.Tensor,
    keys: torch.Tensor,
    stacked: tuple[torch.Tensor, torch.Tensor],
    window: int | None,
    boundaries: tuple[int, ...],
) -> torch.Tensor:
    """Σ_{i∈S} Σ_j s^n_ij s^{n'}_ij per segment S and head, (S, H, N, N), in O(T·(N·D)²) (module docstring);
    `stacked` is `stack(query, keys)`."""
    num_seqs, kv, groups, seq_len, dim = query.shape
    block = max(32, dim)
    blocks = -(-seq_len // block)
    padded = blocks * block
    segments = len(boundaries) - 1
    out = torch.zeros(segments, kv, groups, num_seqs, num_seqs, dtype=torch.float64)
    sq = F.pad(stacked[0], (0, 0, 0, padded - seq_len)).view(kv, groups, blocks, block, num_seqs * dim)
    sk = F.pad(stacked[1], (0, 0, 0, padded - seq_len)).view(kv, blocks, block, num_seqs * dim)
    _add_full_blocks(out, sq, sk, window, boundaries, num_seqs)
    _add_partial_blocks(out, query, keys, window, boundaries, block)
    return out.view(segments, kv * groups, num_seqs, num_seqs)


def _add_full_blocks(
    out: torch.Tensor,
    sq: torch.Tensor,
    sk: torch.Tensor,
    window: int | None,
    boundaries: tuple[int, ...],
    num_seqs: int,
) -> None:
    """The pairs of query block α with the key blocks β ∈ [full_lo(α), α) all of whose pairs are valid:
    ⟨Σ_{i∈α} Q_i Q_iᵀ, Σ_β Σ_{j∈β} K_j K_jᵀ⟩ per pair of sequences, the key Grams summed by a running prefix
    (and, under a window, the prefixes still needed). One block at a time keeps the W × W products in cache;
    a block that straddles a segment boundary is split by rows."""
    kv, groups, blocks, block, width = sq.shape
    dim = width // num_seqs
    whole = blocks if window is None else window // block  # key blocks α − whole + 1 .. α − 1 are all valid
    positions = torch.arange(blocks * block).clamp(max=boundaries[-1] - 1)  # padding rows: zero q, any segment
    segment_of = torch.bucketize(positions, torch.tensor(boundaries), right=True) - 1
    running = torch.zeros(kv, width, width, dtype=torch.float64)  # at block α: Σ_{β < α} K-Gram
    history: dict[int, torch.Tensor] = {}  # β → Σ_{β' < β} K-Gram, kept for block β + whole − 1 (windows)
    for alpha in range(blocks):
        if window is not None and whole >= 2 and alpha >= 1:
            history[alpha] = running.clone()
        full_lo = min(max(alpha + 1 - whole, 0), alpha)
        if full_lo < alpha:
            key_part = running if full_lo == 0 else running - history.pop(full_lo)
            key_part = key_part.view(kv, 1, num_seqs, dim, num_seqs, dim)
            rows_segment = segment_of[alpha * block : (alpha + 1) * block]
            for s in rows_segment.unique().tolist():  # one segment unless a boundary falls inside the block
                part = sq[:, :, alpha] if rows_segment[0] == rows_segment[-1] else sq[:, :, alpha, rows_segment == s]
                query_gram = (part.mT @ part).view(kv, groups, num_seqs, dim, num_seqs, dim)
                out[s] += (query_gram * key_part).sum(-1).sum(3)  # the contiguous sum first: fastest
        if alpha + 1 < blocks:
            running += sk[:, alpha].mT @ sk[:, alpha]


def _add_partial_blocks(
    out: torch.Tensor,
    query: torch.Tensor,
    keys: torch.Tensor,
    window: int | None,
    boundaries: tuple[int, ...],
    block: int,
) -> None:
    """The key blocks that mix valid and invalid pairs with query block α: the diagonal block and, under a
    window, the blocks at the window's edge. Their logits are formed (the G query heads of a KV head as one
    product per block), the invalid ones zeroed by triangles, and multiplied per pair of sequences row by row."""
    num_seqs, kv, groups, seq_len, dim = query.shape
    blocks = -(-seq_len // block)
    padded = blocks * block
    whole = blocks if window is None else window // block
    near = [0] if window is None else [0, *range(max(whole, 1), (window + block - 2) // block + 1)]
    q_blocks = F.pad(query, (0, 0, 0, padded - seq_len)).view(num_seqs, kv, groups, blocks, block, dim)
    q_blocks = q_blocks.transpose(2, 3).reshape(num_seqs, kv, blocks, groups * block, dim)
    k_blocks = F.pad(keys, (0, 0, 0, padded - seq_len)).view(num_seqs, kv, blocks, block, dim)
    per_row = torch.zeros(kv, blocks, groups, block, num_seqs, num_seqs, dtype=torch.float64)
    for delta in near:
        if delta >= blocks:
            continue
        keys_at = k_blocks[:, :, torch.arange(blocks).sub(delta).clamp(min=0)]
        logits = (q_blocks @ keys_at.mT).view(num_seqs, kv, blocks, groups, block, block)  # row r, key column c
        logits[:, :, :delta] = 0  # key block before position 0
        if delta == 0:
            logits.tril_()  # j ≤ i
        if window is not None:
            logits.triu_(delta * block - window + 1)  # i − j = δ·b + r − c < W
        rows = logits.permute(1, 2, 3, 4, 0, 5).reshape(-1, num_seqs, block)
        per_row += (rows @ rows.mT).view(per_row.shape)
    per_row = per_row.transpose(1, 2).reshape(kv, groups, padded, num_seqs, num_seqs)
    for s in range(len(boundaries) - 1):
        out[s] += per_row[:, :, boundaries[s] : boundaries[s + 1]].sum(2)


def table_sums(
    query: torch.Tensor, keys: torch.Tensor, stacked: tuple[torch.Tensor, torch.Tensor], window: int | None, grid: Grid
) -> torch.Tensor:
    """Σ over sequences and each cell's valid pairs of s, (H, bins, bins) indexed (query bin, offset bin);
    `stacked` is `stack(query, keys)`."""
    _, kv, groups, seq_len, _ = query.shape
    heads, bins = kv * groups, grid.num_bins
    span = min(seq_len, window or seq_len)
    near = min(grid.linear_bins, span)
    query_bin = grid.bin_of_position
    dense = torch.zeros(heads, bins, bins, dtype=torch.float64)
    reversed_keys = reverse_keys(keys, span)
    for q0 in range(0, seq_len, near):  # blocks of `near` rows: half of each product is used
        q1 = min(seq_len, q0 + near)
        logits = offset_block(query, reversed_keys, q0, q1, near, None).sum(0)  # (H, rows, offsets < near)
        dense[..., : logits.shape[-1]].index_add_(1, query_bin[q0:q1], logits)
    if near >= span:
        return dense  # no far offsets
    # far bins: with K[p] = Σ_{j<p} k_j, the sum over a far bin's valid offsets is q_i·K[p(i, first)] −
    # q_i·K[p(i, first of the next bin)] where p(i, e) = max(0, i − min(e, W) + 1) clips to query i's first
    # valid key; for each edge e that is q_i against K shifted by min(e, W) − 1 positions (K[0] = 0, so
    # clamping below 0 adds nothing). The sequences are summed inside the product, over the stacked N·D.
    shifts = torch.clamp(torch.tensor(grid.edges[near:]), max=span) - 1
    stacked_q, stacked_prefix = stacked[0], prefix_sums(stacked[1])  # (KV, G, T, N·D), (KV, T + 1, N·D)
    chunk = 32  # rows whose gathered prefixes stay in cache
    for c0 in range(0, seq_len, chunk):
        c1 = min(seq_len, c0 + chunk)
        index = torch.clamp(torch.arange(c0, c1)[:, None] - shifts[None, :], min=0)  # (rows, E)
        at_edges = stacked_q[:, :, c0:c1].transpose(1, 2) @ stacked_prefix[:, index].mT  # (KV, rows, G, E)
        far = (at_edges[..., :-1] - at_edges[..., 1:]).permute(0, 2, 1, 3).reshape(heads, c1 - c0, -1)
        dense[..., near : near + far.shape[-1]].index_add_(1, query_bin[c0:c1], far)
    return dense
