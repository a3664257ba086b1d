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
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import torch

from posleak.measure.grid import Grid
from posleak.measure.offset_blocks import offset_block, reverse_keys

# Rows of q per chunk of an elementwise pass: a few hundred KB, so that each chunk's temporaries stay in cache.
_ROWS = 64
# Dimensions per chunk of the FFT column sums: 8 and 16 ran as fast at T = 2048, 4 a tenth slower.
_FFT_DIMS = 8
# Positions per Gram block (a multiple of D): the full blocks' products against the partial blocks' logits.
_GRAM_BLOCK_WIDTH = 128
# Logits of the partial Gram blocks formed at once (KV·a·G·N·b²): a few MB.
_PARTIAL_ELEMENTS = 1 << 20
# Rows of a block of the tables' single-logit offsets (the exact grid's are T wide).
_TABLE_ROWS = 128


def inclusive_sums(values: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Cumulative sums along positions (dim −2), block by block: torch's cumsum over a dimension other than
    the last walks memory with a stride, and within blocks of 64 positions it stays in cache (2–3× faster)."""
    *lead, seq_len, dim = values.shape
    full = seq_len // block * block
    if full == 0:
        return values.cumsum(-2)
    head = values[..., :full, :].reshape(*lead, full // block, block, dim).cumsum(-2)
    head[..., 1:, :, :] += head[..., -1, :].cumsum(-2)[..., :-1, None, :]
    out = head.view(*lead, full, dim)
    if full == seq_len:
        return out
    return torch.cat([out, values[..., full:, :].cumsum(-2) + out[..., -1:, :]], dim=-2)


def prefix_sums(values: torch.Tensor) -> torch.Tensor:
    """Along positions (dim −2), with a leading 0: (..., T, D) → (..., T + 1, D)."""
    return torch.cat([torch.zeros_like(values[..., :1, :]), inclusive_sums(values)], dim=-2)


def _over_valid_keys(summed: torch.Tensor, window: int | None) -> torch.Tensor:
    """Σ over query i's valid keys j ∈ [max(0, i − W + 1), i] of some values, from their inclusive sums C
    along positions (..., T, D): C[i], less C[i − W] once the window has passed."""
    seq_len = summed.shape[-2]
    if window is None or window >= seq_len:
        return summed
    out = summed.clone()
    out[..., window:, :] -= summed[..., : seq_len - window, :]
    return out


def row_sums(stacked: Stacked, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ_j s_ij per sequence, head and query (N, H, T), and Σ_n Σ_d d·s_{i,i−d} per head and query (H, T): q_i
    against the sums over its valid keys of k and of j·k, in chunks of rows whose temporaries stay in cache
    (several times faster than one pass over every row)."""
    stacked_q, stacked_k, num_seqs = stacked.wide_query, stacked.wide_keys, stacked.num_seqs
    kv, groups, seq_len, _ = stacked_q.shape
    position = torch.arange(seq_len, dtype=torch.float64, device=stacked_q.device)
    over_keys = _over_valid_keys(stacked.key_prefix[:, 1:], window)  # (KV, T, N·D)
    over_positions = _over_valid_keys(inclusive_sums(stacked_k * position[:, None]), window)
    rows = torch.empty(2, kv, groups, seq_len, num_seqs, dtype=torch.float64, device=stacked_q.device)
    for i0 in range(0, seq_len, _ROWS):
        i1 = min(seq_len, i0 + _ROWS)
        part = stacked_q[:, :, i0:i1]
        for k, over in enumerate((over_keys, over_positions)):
            product = part * over[:, None, i0:i1]
            rows[k, :, :, i0:i1] = product.view(kv, groups, i1 - i0, num_seqs, -1).sum(-1)
    rows = rows.permute(0, 4, 1, 2, 3).reshape(2, num_seqs, kv * groups, seq_len)  # Σ_j s_ij and Σ_j j·s_ij
    return rows[0], (position * rows[0] - rows[1]).sum(0)


def logits_with_key(stacked: Stacked, key: int) -> torch.Tensor:
    """s_{i,key} of every query i (valid or not), (N, H, T): q_i against one key, in chunks of rows whose
    temporaries stay in cache (4× faster than one pass)."""
    kv, groups, seq_len, num_seqs, _ = stacked.stacked_query.shape
    key_vectors = stacked.stacked_keys[:, None, None, key]  # (KV, 1, 1, N, D)
    out = key_vectors.new_empty(kv, groups, seq_len, num_seqs)
    for i0 in range(0, seq_len, _ROWS):
        out[:, :, i0 : i0 + _ROWS] = (stacked.stacked_query[:, :, i0 : i0 + _ROWS] * key_vectors).sum(-1)
    return out.permute(3, 0, 1, 2).reshape(num_seqs, kv * groups, seq_len)


def column_sums(stacked: Stacked, boundaries: tuple[int, ...], span: int) -> torch.Tensor:
    """Σ_{i∈S} s_{i,i−d} for each segment S = [boundaries[s], boundaries[s + 1]) and offset d < span:
    (S, N, H, span). The largest segment is the total minus the others; the total is a cross-correlation
    by FFT (zero-padded to 2T: no wrap-around), the other segments direct sums when that is cheaper."""
    query, keys = stacked.query, stacked.keys
    num_seqs, kv, groups, seq_len, _ = query.shape
    segments = len(boundaries) - 1
    out = keys.new_zeros(segments, num_seqs, kv * groups, span)
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
            out[s] = _fft_columns(stacked, lo, hi, span)
    out[largest] = _fft_columns(stacked, 0, seq_len, span) - out.sum(0)
    return out


def _direct_columns(query: torch.Tensor, keys: torch.Tensor, lo: int, hi: int, span: int) -> torch.Tensor:
    """Σ_{lo ≤ i < hi} s_{i,i−d}, (N, H, span), from the logits of those queries."""
    num_seqs, kv, groups, _, _ = query.shape
    logits = query[..., lo:hi, :] @ keys[:, :, None, :hi].mT  # (N, KV, G, hi − lo, hi): s_ij
    out = logits.new_zeros(num_seqs, kv, groups, span)
    for i in range(lo, hi):
        d = min(i + 1, span)  # offsets 0..d−1 reach keys i..i−d+1
        out[..., :d] += logits[..., i - lo, i - d + 1 : i + 1].flip(-1)
    return out.view(num_seqs, kv * groups, span)


def _fft_columns(stacked: Stacked, lo: int, hi: int, span: int) -> torch.Tensor:
    """Σ_{lo ≤ i < hi} q_i·k_{i−d} for d < span as one cross-correlation per head, (N, H, span): the spectra of
    q (rows outside [lo, hi) zero) and of k along positions, zero-padded to 2T (no wrap-around), multiplied and
    summed over dimensions a few at a time. Each chunk of dimensions is copied, in float64, from the captured
    tensors into positions-last buffers (reused; their padding stays zero), where transforms run fastest: from
    the stacked layout, or along the strided position axis, the same sums took 1.3× to 1.6× as long."""
    query, keys = stacked.captured_query, stacked.captured_keys  # (N, KV, G, T, D), (N, KV, T, D)
    num_seqs, kv, groups, seq_len, dim = query.shape
    length, chunk = 2 * seq_len, min(dim, _FFT_DIMS)
    on = {"device": query.device}
    spectrum = torch.zeros(num_seqs, kv, groups, seq_len + 1, dtype=torch.complex128, **on)
    query_signal = torch.zeros(num_seqs, kv, groups, chunk, length, dtype=torch.float64, **on)
    keys_signal = torch.zeros(num_seqs, kv, chunk, length, dtype=torch.float64, **on)
    for d0 in range(0, dim, chunk):
        width = min(dim, d0 + chunk) - d0
        keys_part, query_part = keys_signal[:, :, :width], query_signal[:, :, :, :width]
        keys_part[..., :seq_len] = keys[..., d0 : d0 + width].transpose(-1, -2)
        keys_part[..., :seq_len] *= stacked.scaling  # the stacked keys' exact values
        query_part[..., lo:hi] = query[..., lo:hi, d0 : d0 + width].transpose(-1, -2)
        keys_f = torch.fft.rfft(keys_part).conj_physical_()  # (N, KV, c, T + 1)
        spectrum += (torch.fft.rfft(query_part) * keys_f[:, :, None]).sum(-2)
    return torch.fft.irfft(spectrum, n=length)[..., :span].reshape(num_seqs, kv * groups, span)


@dataclass(frozen=True)
class Stacked:
    """q and k of the N sequences side by side in float64, the scaling in the keys: Q (KV, G, T, N, D) and
    K (KV, T, N, D), so that one product of Q_i = [q¹_i … qᴺ_i] with K_j = [k¹_j … kᴺ_j] (N·D wide) serves every
    pair of sequences, or sums over them. `query` and `keys` view the same numbers per sequence; the captured
    tensors they were copied from are kept too, in their own dtype and layout, for the FFTs."""

    stacked_query: torch.Tensor
    stacked_keys: torch.Tensor
    captured_query: torch.Tensor  # (N, KV, G, T, D), as captured
    captured_keys: torch.Tensor  # (N, KV, T, D), as captured: unscaled
    scaling: float

    @staticmethod
    def of(query: torch.Tensor, keys: torch.Tensor, scaling: float) -> Stacked:
        """From queries (N, H, T, D) and keys (N, KV, T, D) in any float dtype: one converting copy each."""
        num_seqs, heads, seq_len, dim = query.shape
        kv = keys.shape[1]
        grouped = query.view(num_seqs, kv, heads // kv, seq_len, dim)
        on = {"dtype": torch.float64, "device": query.device}  # on the captures' device: no copy elsewhere
        stacked_q = torch.empty(kv, heads // kv, seq_len, num_seqs, dim, **on)
        stacked_q.copy_(grouped.permute(1, 2, 3, 0, 4))
        stacked_k = torch.empty(kv, seq_len, num_seqs, dim, **on).copy_(keys.permute(1, 2, 0, 3))
        return Stacked(stacked_q, stacked_k.mul_(scaling), grouped, keys, scaling)

    @property
    def num_seqs(self) -> int:
        return self.stacked_keys.shape[2]

    @property
    def dim(self) -> int:
        return self.stacked_keys.shape[3]

    @property
    def wide_query(self) -> torch.Tensor:
        """(KV, G, T, N·D)."""
        kv, groups, seq_len = self.stacked_query.shape[:3]
        return self.stacked_query.view(kv, groups, seq_len, -1)

    @property
    def wide_keys(self) -> torch.Tensor:
        """(KV, T, N·D)."""
        return self.stacked_keys.view(*self.stacked_keys.shape[:2], -1)

    @cached_property
    def key_prefix(self) -> torch.Tensor:
        """Prefix sums of the wide keys along positions, (KV, T + 1, N·D): K[p] = Σ_{j<p} k_j, formed once for
        the row sums and the tables."""
        return prefix_sums(self.wide_keys)

    @property
    def query(self) -> torch.Tensor:
        """Per sequence, grouped by KV head: (N, KV, G, T, D), a view."""
        return self.stacked_query.permute(3, 0, 1, 2, 4)

    @property
    def keys(self) -> torch.Tensor:
        """Per sequence, scaled: (N, KV, T, D), a view."""
        return self.stacked_keys.permute(2, 0, 1, 3)


def gram(stacked: Stacked, window: int | None, boundaries: tuple[int, ...]) -> torch.Tensor:
    """Σ_{i∈S} Σ_j s^n_ij s^{n'}_ij per segment S and head, (S, H, N, N), in O(T·(N·D)²) (module docstring)."""
    kv, groups, seq_len, num_seqs, dim = stacked.stacked_query.shape
    block = max(32, _GRAM_BLOCK_WIDTH // dim * dim)
    blocks = -(-seq_len // block)
    padded = blocks * block
    segments = len(boundaries) - 1
    out = stacked.stacked_keys.new_zeros(segments, kv, groups, num_seqs, num_seqs)
    stacked_q = _pad_positions(stacked.stacked_query, padded, dim=2)  # (KV, G, T', N, D)
    stacked_k = _pad_positions(stacked.stacked_keys, padded, dim=1)  # (KV, T', N, D)
    positions = torch.arange(padded, device=out.device).clamp(max=seq_len - 1)  # padding rows: zero q, any segment
    segment_of = torch.bucketize(positions, torch.tensor(boundaries, device=out.device), right=True) - 1
    sq = stacked_q.view(kv, groups, blocks, block, num_seqs * dim)
    sk = stacked_k.view(kv, blocks, block, num_seqs * dim)
    _add_full_blocks(out, sq, sk, window, segment_of.view(blocks, block), num_seqs)
    # per block, the N sequences of each query head side by side: (KV, A, G, N, b, D) against keys (KV, A, 1, N, D, b)
    q_blocks = stacked_q.view(kv, groups, blocks, block, num_seqs, dim).permute(0, 2, 1, 4, 3, 5)
    k_blocks = stacked_k.view(kv, blocks, block, num_seqs, dim).permute(0, 1, 3, 4, 2).unsqueeze(2)
    _add_partial_blocks(out, q_blocks, k_blocks, window, segment_of.view(blocks, block))
    return out.view(segments, kv * groups, num_seqs, num_seqs)


def _add_full_blocks(
    out: torch.Tensor,
    sq: torch.Tensor,
    sk: torch.Tensor,
    window: int | None,
    segment_of: torch.Tensor,
    num_seqs: int,
) -> None:
    """The pairs of query block α with the key blocks β ∈ [full_lo(α), α) all of whose pairs are valid:
    ⟨Σ_{i∈α} Q_i Q_iᵀ, Σ_β Σ_{j∈β} K_j K_jᵀ⟩ per pair of sequences, the key Grams summed by a running prefix
    (and, under a window, the prefixes still needed). Both Grams are symmetric, so only the blocks of sequence
    pairs n ≤ n' are formed (10 of 16 for N = 4) and the result is mirrored. One block at a time keeps the
    products in cache; a block that straddles a segment boundary (`segment_of`, (A, b)) is split by rows."""
    kv, groups, blocks, block, width = sq.shape
    dim = width // num_seqs
    whole = blocks if window is None else window // block  # key blocks α − whole + 1 .. α − 1 are all valid
    upper = torch.zeros_like(out)  # (S, KV, G, N, N): the pairs n ≤ n'
    running = sq.new_zeros(kv, width, width)  # at block α: Σ_{β < α} K-Gram, rows n ≤ cols n'
    history: dict[int, torch.Tensor] = {}  # β → Σ_{β' < β} K-Gram, kept for block β + whole − 1 (windows)
    for alpha in range(blocks):
        if window is not None and whole >= 2 and alpha >= 1:
            history[alpha] = running.clone()
        full_lo = min(max(alpha + 1 - whole, 0), alpha)
        if full_lo < alpha:
            key_part = running if full_lo == 0 else running - history.pop(full_lo)
            rows_segment = segment_of[alpha]
            for s in rows_segment.unique().tolist():  # one segment unless a boundary falls inside the block
                part = sq[:, :, alpha] if rows_segment[0] == rows_segment[-1] else sq[:, :, alpha, rows_segment == s]
                for n, (rows, cols), query_gram in _pair_blocks(part, num_seqs):
                    query_gram = query_gram.view(kv, groups, dim, -1, dim)
                    keys = key_part[:, rows, cols].view(kv, 1, dim, -1, dim)
                    upper[s, :, :, n, n:] += (query_gram * keys).sum(-1).sum(2)  # the contiguous sum first: fastest
        if alpha + 1 < blocks:
            for _, (rows, cols), key_gram in _pair_blocks(sk[:, alpha], num_seqs):
                running[:, rows, cols] += key_gram
    out += upper.triu() + upper.triu(1).mT


def _pair_blocks(x: torch.Tensor, num_seqs: int) -> Iterator[tuple[int, tuple[slice, slice], torch.Tensor]]:
    """The blocks of xᵀx (x: (..., rows, N·D)) for sequence n against sequences n' ≥ n, one n at a time:
    n, the block's (rows, columns) in the N·D × N·D matrix, and the block (..., D, (N − n)·D)."""
    dim = x.shape[-1] // num_seqs
    for n in range(num_seqs):
        rows, cols = slice(n * dim, (n + 1) * dim), slice(n * dim, None)
        yield n, (rows, cols), x[..., rows].mT @ x[..., cols]


def _add_partial_blocks(
    out: torch.Tensor,
    q_blocks: torch.Tensor,
    k_blocks: torch.Tensor,
    window: int | None,
    segment_of: torch.Tensor,
) -> None:
    """The key blocks that mix valid and invalid pairs with query block α: the diagonal block and, under a
    window, the blocks at the window's edge. Their logits are formed, a few query blocks at a time (`q_blocks`
    (KV, A, G, N, b, D) against `k_blocks` (KV, A, 1, N, D, b)), the invalid ones zeroed by triangles, and
    multiplied per pair of sequences over the whole block (row by row where it straddles a segment boundary)."""
    kv, blocks, groups, num_seqs, block = q_blocks.shape[:5]
    whole = blocks if window is None else window // block
    near = [0] if window is None else [0, *range(max(whole, 1), (window + block - 2) // block + 1)]
    straddles = segment_of[:, 0] != segment_of[:, -1]
    step = max(1, _PARTIAL_ELEMENTS // (kv * groups * num_seqs * block * block))
    for delta in near:
        for a0 in range(delta, blocks, step):  # blocks before δ would need keys before position 0
            a1 = min(blocks, a0 + step)
            logits = q_blocks[:, a0:a1] @ k_blocks[:, a0 - delta : a1 - delta]  # (KV, a, G, N, r, c)
            if delta == 0:
                logits.tril_()  # j ≤ i
            if window is not None:
                logits.triu_(delta * block - window + 1)  # i − j = δ·b + r − c < W
            flat = logits.flatten(-2)
            whole_block = flat @ flat.mT  # (KV, a, G, N, N)
            for alpha in range(a0, a1):
                if not straddles[alpha]:
                    out[segment_of[alpha, 0]] += whole_block[:, alpha - a0]
                    continue
                rows = logits[:, alpha - a0].transpose(-3, -2)  # (KV, G, r, N, c)
                per_row = rows @ rows.mT  # (KV, G, r, N, N)
                for s in segment_of[alpha].unique().tolist():
                    out[s] += per_row[:, :, segment_of[alpha] == s].sum(2)


def _pad_positions(values: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`values` zero-padded along positions (`dim`) to `length`; itself when it is that long already."""
    missing = length - values.shape[dim]
    if not missing:
        return values
    shape = list(values.shape)
    shape[dim] = missing
    return torch.cat([values, values.new_zeros(shape)], dim=dim)


def table_sums(stacked: Stacked, window: int | None, grid: Grid) -> torch.Tensor:
    """Σ over sequences and each cell's valid pairs of s, (H, bins, bins) indexed (query bin, offset bin).
    The sequences are summed inside every product, over the stacked N·D."""
    stacked_q, stacked_k = stacked.wide_query, stacked.wide_keys  # (KV, G, T, N·D), (KV, T, N·D)
    kv, groups, seq_len, _ = stacked_q.shape
    heads, bins = kv * groups, grid.num_bins
    span = min(seq_len, window or seq_len)
    near = min(grid.linear_bins, span)
    query_bin = grid.bin_of_position.to(stacked_q.device)
    dense = stacked_q.new_zeros(heads, bins, bins)
    # offsets below `near`: single logits, from blocks of rows in offset order (at least half of each product
    # is used; the rows are capped so that the exact grid's blocks stay a few MB)
    reversed_keys = reverse_keys(stacked_k, near)[None]
    rows = min(near, _TABLE_ROWS)
    for q0 in range(0, seq_len, rows):
        q1 = min(seq_len, q0 + rows)
        logits = offset_block(stacked_q[None], reversed_keys, q0, q1, near, None)[0]  # (H, rows, offsets < near)
        dense[..., : logits.shape[-1]].index_add_(1, query_bin[q0:q1], logits)
    if near >= span:
        return dense  # no far offsets
    # far bins: with K[p] = Σ_{j<p} k_j, the sum over a far bin's valid offsets is q_i·K[p(i, first)] −
    # q_i·K[p(i, first of the next bin)] where p(i, e) = max(0, i − min(e, W) + 1) clips to query i's first
    # valid key; for each edge e that is q_i against K shifted by min(e, W) − 1 positions (K[0] = 0, so
    # clamping below 0 adds nothing, and edges whose shift passes every row of a chunk are left out).
    shifts = torch.clamp(torch.tensor(grid.edges[near:], device=dense.device), max=span) - 1
    stacked_prefix = stacked.key_prefix  # (KV, T + 1, N·D)
    chunk = 32  # rows whose gathered prefixes stay in cache
    for c0 in range(0, seq_len, chunk):
        c1 = min(seq_len, c0 + chunk)
        reached = min(len(shifts), int(torch.searchsorted(shifts, c1 - 1)) + 1)  # edges past it add 0
        rows_here = torch.arange(c0, c1, device=dense.device)
        index = torch.clamp(rows_here[:, None] - shifts[None, :reached], min=0)  # (rows, E')
        at_edges = stacked_q[:, :, c0:c1].transpose(1, 2) @ stacked_prefix[:, index].mT  # (KV, rows, G, E')
        far = (at_edges[..., :-1] - at_edges[..., 1:]).permute(0, 2, 1, 3).reshape(heads, c1 - c0, -1)
        dense[..., near : near + far.shape[-1]].index_add_(1, query_bin[c0:c1], far)
    return dense
