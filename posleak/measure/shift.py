"""The attention shift (docs/method.md §7): how much attention moves because of the within-row term w.

For query i, p_i = softmax over its valid keys of g + w(i, ·) and q_i = softmax of g alone (the row term c
cancels in a softmax). Since g + w = mean ℓ − c and mean ℓ = a − log Z, p_i is the softmax of a(i, ·), the mean
over sequences of the logits, and needs no g; q_i needs only g. Per query posleak forms

- the symmetrised KL divergence ½[KL(p‖q) + KL(q‖p)] = ½ Σ_d (p − q)(log p − log q), for the mean logits of all
  sequences (raw) and across two halves of the documents (`document_halves`): ½ Σ_d (p^A − q)(log p^B − log q)
  and the same with A and B swapped. Halves of distinct documents are independent, so the noise of one does not
  meet the noise of the other: with no w, E[p^A − q] and E[log p^B − log q] are each of second order in the
  noise and their product of fourth; the raw form's noise is of second order (measured on planted layers with no
  w at σ = 4: raw 0.47–0.76 nats, across the halves 0.00x);
- the total variation ½ Σ_d |p − q| for all sequences, and across the halves ¼ Σ_d [(p^A − q) sign(p^B − q) +
  (p^B − q) sign(p^A − q)]: A's change signed by B's, 0 in expectation with no w and never above the true TV in
  expectation (E[x·sign(x + e)] ≤ |x|).

Halves, not every pair of documents as the magnitudes take (components.py): the shift is not linear in the logits,
and p^u of a single document is the softmax of one window's logits, whose mean over windows is not the softmax of
the mean logits. On a planted layer with a sink at key 0 (σ = 2) a form over pairs of single windows stayed at
0.37 nats at every N while the shift it estimates (the raw form at N = 256) is 0.70; the halves' form tends to it
(0.63 at N = 16, 0.68 at 64, 0.69 at 256). Averaging the halves' form over 8 random splits of the documents did not
narrow its spread over seeds on those layers (0.0155 against 0.0154 nats with the sink, the same to 0.0001 with
no position; 2026-12-05), so one split is taken, in order.

The symmetrised KL rather than KL(p‖q) alone because its split-half form exists: KL(p‖q) has no product form
whose halves' noise cancels (a split-half jackknife of it left 0.05–0.22 nats on those planted layers). Both
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
SHIFT_STATS = ("kl_all", "kl_ab", "kl_ba", "tv_all", "tv_halves")
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


def document_halves(units: torch.Tensor) -> list[torch.Tensor]:
    """The sequence indices of half A, half B and of the rest, by document: of C documents numbered in order of
    first appearance (`units`, posleak.measure.bootstrap), A holds the first ⌊C/2⌋, B the next ⌊C/2⌋, the rest an
    odd last one. With one window per document that is the sequences' input order."""
    half = (int(units.max()) + 1) // 2
    return [
        torch.nonzero(in_half)[:, 0]
        for in_half in (units < half, (units >= half) & (units < 2 * half), units >= 2 * half)
    ]


def shift_rows(
    query: torch.Tensor,
    keys: torch.Tensor,
    mask: MaskSpec,
    softcap: float | None,
    g: torch.Tensor,
    groups: list[torch.Tensor],
    rows: torch.Tensor,
) -> torch.Tensor:
    """SHIFT_STATS of each query in `rows`, (5, H, S), float64 on the device of `query`.

    `query` (KV, G, T, N, D) and `keys` (KV, T, N, D) are bilinear.Stacked's (float64, the keys scaled); `g`
    (H, W) the relative part of all sequences; `groups` the sequence indices of half A, half B and any
    sequence in neither (their union is every sequence)."""
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
    """SHIFT_STATS of a block of rows (sorted), (5, H, rows), from the mean logits of each group over the keys
    up to the block's last row, indexed (row, key j); pairs outside the mask weigh 0."""
    window = mask.window or query.shape[2]
    first_key = max(0, int(rows[0]) - window + 1)
    key_pos = torch.arange(first_key, int(rows[-1]) + 1, device=query.device)
    valid = mask.valid(rows[:, None], key_pos[None, :])  # (rows, keys)
    g_at = g[:, (rows[:, None] - key_pos[None, :]).clamp(0, g.shape[-1] - 1)]  # (H, rows, keys)
    log_norm_g_rows = log_norm_g[:, rows.clamp(max=window - 1)]  # LSE over query i's valid offsets of g
    log_q = g_at - log_norm_g_rows[..., None]
    q = log_q.exp().mul_(valid)
    summed = {
        name: _summed_logits(query, keys, softcap, members, rows, key_pos)
        for name, members in zip(("a", "b", "rest"), groups, strict=True)
        if len(members)
    }
    sizes = {name: len(members) for name, members in zip(("a", "b", "rest"), groups, strict=True)}
    out = torch.full((len(SHIFT_STATS), *q.shape[:2]), float("nan"), dtype=torch.float64, device=query.device)
    p_all, ratio_all = _p_and_log_ratio(sum(summed.values()) / sum(sizes.values()), valid, log_q)
    change_all = p_all.sub_(q)
    out[0], out[3] = 0.5 * _row_dot(change_all, ratio_all), 0.5 * change_all.abs_().sum(-1)
    if "a" in summed and "b" in summed:
        (p_a, ratio_a), (p_b, ratio_b) = (_p_and_log_ratio(summed[x].div_(sizes[x]), valid, log_q) for x in "ab")
        change_a, change_b = p_a.sub_(q), p_b.sub_(q)
        out[1], out[2] = 0.5 * _row_dot(change_a, ratio_b), 0.5 * _row_dot(change_b, ratio_a)
        out[4] = 0.25 * (_row_dot(change_a, change_b.sign()) + _row_dot(change_b, change_a.sign()))
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
