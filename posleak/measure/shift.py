"""The attention shift (docs/method.md §7): how much attention moves because of the within-row term w.

For query i, p_i = softmax over its valid keys of g + w(i, ·) and q_i = softmax of g alone (the row term c
cancels in a softmax). Since g + w = mean ℓ − c and mean ℓ = a − log Z, p_i is the softmax of a(i, ·), the mean
over sequences of the logits, and needs no g; q_i needs only g. Per query posleak forms

- the symmetrised KL divergence ½[KL(p‖q) + KL(q‖p)] = ½ Σ_d (p − q)(log p − log q), for the mean logits of all
  sequences (raw) and over pairs of distinct documents: with p^u the softmax of document u's mean logits, the mean
  over ordered pairs u ≠ v (weighted by their sequences, n_u·n_v) of ½ Σ_d (p^u − q)(log p^v − log q).
  Distinct documents are independent, so the noise of one does not meet the noise of the other: with no w,
  E[p^u − q] and E[log p^v − log q] are each of second order in the noise and their product of fourth; the raw
  form's noise is of second order (measured on planted layers with no w at σ = 4: raw 0.47–0.76 nats, over pairs
  0.00x);
- the total variation ½ Σ_d |p − q| for all sequences, and over the same pairs ½ Σ_d (p^u − q) sign(p^v − q):
  one document's change signed by another's, 0 in expectation with no w and never above the true TV in expectation
  (E[x·sign(x + e)] ≤ |x|).

Every pair of distinct documents is used, not two halves: each document's p^u is formed once, and the sum over
pairs is (Σ_u n_u x_u)·(Σ_v n_v y_v) − Σ_u n_u² x_u·y_u, so the cost is one softmax per document and query.

The symmetrised KL rather than KL(p‖q) alone because its pairwise form exists: KL(p‖q) has no product form
whose pairs' noise cancels (a split-half jackknife of it left 0.05–0.22 nats on those planted layers). Both
distributions are over the valid keys: a learned sink logit is not a key. Sigmoid attention does not normalise
over keys, so it has no shift (NaN).

A row costs O(T·N·D) products and O(T) exponentials per head, against O(1) per row for every other measure,
so each range's shift is the mean over at most SHIFT_QUERIES of its queries, evenly spaced (`range_queries`):
exact where the range has no more queries than that (the early range always), an estimate of the mean over
all of them otherwise (its error, measured on planted layers, is in docs/method.md §7).
The queries are taken whole (every valid key), block by block of rows.
"""

from __future__ import annotations

import torch

from posleak.capture.masks import MaskSpec
from posleak.capture.session import soft_cap

# The per-row statistics, in order (stats[k] is (H, S)).
SHIFT_STATS = ("kl_all", "kl_pairs", "tv_all", "tv_pairs")
# Queries sampled over 1 ≤ i < T beside the early ones (docs/method.md §7).
SHIFT_QUERIES = 64
# Float64 elements per (H, rows, keys) array of one block of rows: a few MB, so that a block stays in cache.
_BLOCK_ELEMENTS = 1 << 20
# The logit given to pairs outside the mask: exp(it − max) is exactly 0 and 0 times it is 0 (−inf would give NaN).
_FAR_BELOW = -1e300


def range_queries(lo: int, hi: int, sampled: int = SHIFT_QUERIES) -> torch.Tensor:
    """The queries of the range lo ≤ i < hi the shift is formed from: all of them when there are at most
    `sampled` (S), else i_k = lo + ⌊k(hi − lo)/S⌋ for k = 0 … S − 1, evenly spaced."""
    count = hi - lo
    if count <= sampled:
        return torch.arange(lo, hi)
    return lo + torch.arange(sampled) * count // sampled


def shift_queries(ranges: dict[str, tuple[int, int]], sampled: int = SHIFT_QUERIES) -> torch.Tensor:
    """Every query some range's sample holds (`range_queries`), sorted."""
    return torch.unique(torch.cat([range_queries(lo, hi, sampled) for lo, hi in ranges.values()]))


def shift_rows(
    query: torch.Tensor,
    keys: torch.Tensor,
    mask: MaskSpec,
    softcap: float | None,
    g: torch.Tensor,
    groups: list[torch.Tensor],
    rows: torch.Tensor,
) -> torch.Tensor:
    """SHIFT_STATS of each query in `rows`, (4, H, S), float64 on the device of `query`.

    `query` (KV, G, T, N, D) and `keys` (KV, T, N, D) are bilinear.Stacked's (float64, the keys scaled); `g`
    (H, W) the relative part of all sequences; `groups` the sequence indices of each document (their union is
    every sequence). With a single document there are no pairs, and the pair statistics are NaN."""
    heads = query.shape[0] * query.shape[1]
    out = torch.full((len(SHIFT_STATS), heads, len(rows)), float("nan"), dtype=torch.float64, device=query.device)
    rows = rows.to(query.device)
    log_norm_g = torch.logcumsumexp(g, -1)  # LSE_{d' ≤ d} g(d')
    for start, end in row_blocks(rows, heads):
        part = rows[start:end]
        out[..., start:end] = _block_stats(query, keys, mask, softcap, g, log_norm_g, groups, part)
    return out


def row_blocks(rows: torch.Tensor, heads: int) -> list[tuple[int, int]]:
    """The blocks (start, end) of the sorted `rows` that shift_rows forms at once: as many rows as keep
    heads × rows × (keys up to the last of them) within _BLOCK_ELEMENTS (one row at least)."""
    blocks, start = [], 0
    while start < len(rows):
        keys_upto = rows[start:].double() + 1
        fits = (torch.arange(1, len(keys_upto) + 1, device=rows.device) * keys_upto * heads) <= _BLOCK_ELEMENTS
        end = start + max(1, int(fits.sum()))
        blocks.append((start, end))
        start = end
    return blocks


def _block_stats(
    query: torch.Tensor,
    keys: torch.Tensor,
    mask: MaskSpec,
    softcap: float | None,
    g: torch.Tensor,
    log_norm_g: torch.Tensor,
    groups: list[torch.Tensor],
    rows: torch.Tensor,
) -> torch.Tensor:
    """SHIFT_STATS of a block of rows (sorted), (4, H, rows), from the mean logits of each document over the keys
    up to the block's last row, indexed (row, key j); pairs outside the mask weigh 0."""
    window = mask.window or query.shape[2]
    first_key = max(0, int(rows[0]) - window + 1)
    key_pos = torch.arange(first_key, int(rows[-1]) + 1, device=query.device)
    valid = mask.valid(rows[:, None], key_pos[None, :])  # (rows, keys)
    g_at = g[:, (rows[:, None] - key_pos[None, :]).clamp(0, g.shape[-1] - 1)]  # (H, rows, keys)
    log_norm_g_rows = log_norm_g[:, rows.clamp(max=window - 1)]  # LSE over query i's valid offsets of g
    log_q = g_at - log_norm_g_rows[..., None]
    q = log_q.exp().mul_(valid)
    # per document u (n_u sequences): Σ n_u (p^u − q), Σ n_u log(p^u / q), Σ n_u sign(p^u − q), and the same
    # document's own products Σ n_u² (p^u − q)·log(p^u / q), Σ n_u² |p^u − q|, which the pairs leave out
    change, ratio, sign = (torch.zeros_like(q) for _ in range(3))
    own_kl, own_tv = (torch.zeros(q.shape[:2], dtype=torch.float64, device=q.device) for _ in range(2))
    summed_all = torch.zeros_like(q)
    for members in groups:
        summed = _summed_logits(query, keys, softcap, members, rows, key_pos)
        summed_all += summed
        size = len(members)
        p, log_ratio = _p_and_log_ratio(summed.div_(size), valid, log_q)
        moved = p.sub_(q)
        change.add_(moved, alpha=size)
        ratio.add_(log_ratio, alpha=size)
        sign.add_(moved.sign(), alpha=size)
        own_kl += size**2 * _row_dot(moved, log_ratio)
        own_tv += size**2 * moved.abs().sum(-1)
    sizes = torch.tensor([len(members) for members in groups], dtype=torch.float64)
    pairs = float(sizes.sum() ** 2 - (sizes**2).sum())  # ordered pairs of sequences of distinct documents
    out = torch.full((len(SHIFT_STATS), *q.shape[:2]), float("nan"), dtype=torch.float64, device=query.device)
    p_all, ratio_all = _p_and_log_ratio(summed_all.div_(float(sizes.sum())), valid, log_q)
    change_all = p_all.sub_(q)
    out[0], out[2] = 0.5 * _row_dot(change_all, ratio_all), 0.5 * change_all.abs_().sum(-1)
    if pairs > 0:
        out[1] = 0.5 * (_row_dot(change, ratio) - own_kl) / pairs
        out[3] = 0.5 * (_row_dot(change, sign) - own_tv) / pairs
    return out


def _row_dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ over the last dimension of x·y, (H, rows, keys) → (H, rows), without an elementwise product in memory."""
    return (x.unsqueeze(-2) @ y.unsqueeze(-1))[..., 0, 0]


def _summed_logits(
    query: torch.Tensor,
    keys: torch.Tensor,
    softcap: float | None,
    members: torch.Tensor,
    rows: torch.Tensor,
    key_pos: torch.Tensor,
) -> torch.Tensor:
    """Σ over the `members` sequences of s_ij for the block's rows i and keys j, (H, rows, keys). Without a
    soft-cap the sum over sequences is one product of the sequences' q and k side by side (N·D wide)."""
    kv, groups = query.shape[:2]
    members = members.to(query.device)
    q = query[:, :, rows][:, :, :, members]  # (KV, G, rows, n, D)
    k = keys[:, key_pos][:, :, members]  # (KV, keys, n, D)
    if softcap is None:
        summed = q.flatten(-2) @ k.flatten(-2).mT[:, None]  # (KV, G, rows, keys)
    else:
        summed = soft_cap(torch.einsum("kgrnd,kjnd->kgnrj", q, k), softcap).sum(2)
    return summed.reshape(kv * groups, len(rows), len(key_pos))


def _p_and_log_ratio(
    mean_logits: torch.Tensor, valid: torch.Tensor, log_q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """p = softmax over the valid keys of the mean logits and log(p / q), each (H, rows, keys) (`mean_logits` is
    overwritten). Invalid pairs get a logit far below any other: their p is exactly 0, so they add nothing."""
    logits = mean_logits.masked_fill_(~valid, _FAR_BELOW)
    top = logits.amax(-1, keepdim=True)
    weights = (logits - top).exp_()
    log_total = weights.sum(-1, keepdim=True).log_()
    log_p = logits.sub_(top).sub_(log_total)
    return weights.div_(log_total.exp()), log_p.sub_(log_q)
