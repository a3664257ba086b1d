"""Position 0 measures (docs/method.md §8): fingerprint constancy of h_0 across inputs, and the probe of position
0's identity in later positions.

The closed-system check itself lives with the residual capture (`posleak.capture.residual`), since
every run makes it.

**The identity probe** (claim C6): each of S sequences is run K times, its token at position 0 replaced by each of
K candidate tokens and nothing else changed, and the hidden states h_i^(l) at later positions i are kept. Whatever
in them varies with the variant comes from position 0, so the question is whether a held-out sequence's states
tell which candidate produced them. The classifier is the nearest class mean after each sequence's mean over its
K variants is subtracted (what the rest of the sequence puts there cancels), in float64, cross-validated by
sequence (leave one out: the class means come from the other S − 1 sequences), per layer and position. Its
accuracy with no information is 1/K: a state that does not depend on the variant is equally near every class mean
(ties share the credit), and one that depends on it by noise alone is no nearer its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from posleak.capture.residual import CLOSED_SYSTEM_RTOL, ResidualCapture
from posleak.capture.session import Accumulator, AttentionEdits, CaptureSession
from posleak.errors import PosleakError


def fingerprint_constancy(pos0_states: torch.Tensor) -> torch.Tensor:
    """Mean pairwise cosine similarity of h_0^(l) across the N inputs, per layer; shape (layers,).

    pos0_states: (layers, N, d). 1.0 when every input has the same position-0 state (an auto-prepended
    BOS), lower when the token at position 0 varies. N = 1 gives NaN: there is no pair.
    """
    states = torch.nn.functional.normalize(pos0_states.double(), dim=-1)
    n = states.shape[1]
    if n < 2:
        return torch.full((states.shape[0],), float("nan"), dtype=torch.float64)
    gram = states @ states.transpose(1, 2)  # (layers, N, N)
    off_diagonal = gram.sum(dim=(1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    return off_diagonal / (n * (n - 1))


def first_token_variants(ids: torch.Tensor, candidates: Sequence[int]) -> torch.Tensor:
    """(S·K, T): row s·K + k is sequence s of `ids` (S×T) with candidates[k] at position 0."""
    variants = ids.repeat_interleave(len(candidates), dim=0)
    variants[:, 0] = torch.tensor(list(candidates), dtype=ids.dtype).repeat(ids.shape[0])
    return variants


@torch.no_grad()
def variant_states(
    model: PreTrainedModel,
    ids: torch.Tensor,
    candidates: Sequence[int],
    positions: Sequence[int],
    batch_size: int,
    edits: AttentionEdits | None = None,
    accumulators: Sequence[Accumulator] = (),
) -> torch.Tensor:
    """h_i^(l) at `positions` of every first-token variant of `ids` (S×T) under `edits`: (L + 1, S, K, P, d);
    `accumulators` see the same forwards (row s·K + k of `first_token_variants`). A forward holds the K variants of
    `batch_size` sequences."""
    variants, count = first_token_variants(ids, candidates), len(candidates)
    step = batch_size * count
    with ResidualCapture(model, positions=positions) as capture:
        session = CaptureSession(accumulators, edits)
        for start in range(0, variants.shape[0], step):
            rows = torch.arange(start, min(start + step, variants.shape[0]))
            session.forward(model, variants[rows], rows)
    return capture.states().unflatten(1, (ids.shape[0], count))


def identity_accuracy(states: torch.Tensor) -> torch.Tensor:
    """The probe's held-out accuracy of each sequence, per layer, (L, S) float64, from `states` (L, S, K, P, d):
    the share of its K·P states (each variant at each position) whose nearest class mean, among the K of the other
    sequences at that layer and position, is their own variant's. Distances within CLOSED_SYSTEM_RTOL of the
    layer's mean state norm count as ties, whose credit is shared: states equal up to float rounding (a later
    position that cannot see position 0) score 1/K exactly, not whichever class rounding favours."""
    layers, seqs, count, positions, width = states.shape
    if seqs < 2:
        raise PosleakError(f"the identity probe holds out one sequence of several; {seqs} is too few (use ≥ 2)")
    x = states.double()
    centred = x - x.mean(dim=2, keepdim=True)  # what the rest of the sequence puts there cancels
    others = (centred.sum(dim=1, keepdim=True) - centred) / (seqs - 1)  # each class's mean without sequence s
    held = centred.permute(0, 1, 3, 2, 4).reshape(-1, count, width)  # (L·S·P, K variants, d)
    means = others.permute(0, 1, 3, 2, 4).reshape(-1, count, width)  # (L·S·P, K classes, d)
    distance = torch.cdist(held, means, compute_mode="donot_use_mm_for_euclid_dist")  # direct differences
    scale = x.norm(dim=-1).mean(dim=(1, 2, 3)).repeat_interleave(seqs * positions)
    tied = distance <= distance.amin(dim=-1, keepdim=True) + CLOSED_SYSTEM_RTOL * scale[:, None, None]
    credit = tied.diagonal(dim1=1, dim2=2).double() / tied.sum(dim=-1)  # (L·S·P, K)
    return credit.reshape(layers, seqs, positions, count).mean(dim=(2, 3))
