"""Planted layers: synthetic captures of one attention layer where the truth is known (docs/method.md §3, §6).

Random q and k with no RoPE under a causal mask: query i sees i + 1 keys and nothing else depends on i, so the
residual-stream component is 0 by construction. Optional planted effects put absolute position back in: a sink at
key 0 (a fixed number of nats on every query's key 0) and a logit term in i·j. Sequences can also be windows of
a few documents that share part of their q and k (as windows of one text share its topic and style): no position
either, but the windows of a document are not independent draws. The test suite measures these to show that no
effect centres on 0 and a planted one is found at its size; `scripts/interval_coverage.py` draws many of them to
measure how often the bootstrap intervals cover the truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.capture.store import CallFacts, LayerCapture


@dataclass(frozen=True)
class Planted:
    """What a planted layer holds. `sigma`: the logits' spread; `token_scale`: every query times exp(N(0, 0.5²))
    drawn per token id (as real models' query norms vary with the token); `sink`: nats added on key 0;
    `product`: product·(i/T)(j/T)·4 added to every logit; `documents`: sequence n is a window of document
    n mod `documents` (0: each its own), `shared` the part of its q's and k's variance its document gives it."""

    sigma: float = 2.0
    token_scale: bool = False
    sink: float = 0.0
    product: float = 0.0
    seq_len: int = 256
    num_seqs: int = 16
    heads: int = 4
    dim: int = 16
    documents: int = 0
    shared: float = 0.0

    @property
    def units(self) -> tuple[int, ...] | None:
        """Each sequence's document, numbered in order of first appearance (posleak.measure.bootstrap)."""
        return tuple(n % self.documents for n in range(self.num_seqs)) if self.documents else None


def planted_layer(planted: Planted, seed: int, layer: int = 0) -> LayerCapture:
    """One planted layer's capture (q, k (N, H, T, D + 2) and log Z), drawn with `seed`."""
    p = planted
    n, t, gen = p.num_seqs, p.seq_len, torch.Generator().manual_seed(seed)
    query = torch.randn(n, p.heads, t, p.dim, generator=gen)
    keys = torch.randn(n, p.heads, t, p.dim, generator=gen)
    if p.documents:  # each document's own q and k, the same at the same place in each of its windows
        of_doc = torch.arange(n) % p.documents
        doc_query, doc_keys = (torch.randn(p.documents, p.heads, t, p.dim, generator=gen) for _ in range(2))
        query = (1 - p.shared) ** 0.5 * query + p.shared**0.5 * doc_query[of_doc]
        keys = (1 - p.shared) ** 0.5 * keys + p.shared**0.5 * doc_keys[of_doc]
    if p.token_scale:
        tokens = torch.randint(0, 50, (n, t), generator=gen)
        per_token = torch.exp(0.5 * torch.randn(50, generator=gen))
        query = query * per_token[tokens][:, None, :, None]
    scaling = p.sigma / p.dim**0.5  # q·k has variance D, so the logits have spread σ
    position = torch.arange(t, dtype=torch.float32) / t
    extra_q = torch.stack([torch.ones(t), 2 * position], -1)  # the sink's and the product's coordinates
    extra_k = torch.stack([(position == 0).float() * p.sink, 2 * position * p.product], -1) / scaling
    query = torch.cat([query, extra_q.expand(n, p.heads, t, 2)], -1)
    keys = torch.cat([keys, extra_k.expand(n, p.heads, t, 2)], -1)
    logits = (query.double() @ keys.double().mT) * scaling
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    log_z = torch.logsumexp(logits.masked_fill(~causal, -torch.inf), -1).float()
    facts = CallFacts(scaling=scaling, softcap=None, causal=True, window=None, prefix=0, norm="softmax", sink=None)
    return LayerCapture(layer=layer, facts=facts, query=query, keys=keys, log_z=log_z)
