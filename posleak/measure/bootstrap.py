"""Bootstrap over sequences: resampling weights and percentile intervals.

A resample draws N sequences with replacement. It is written as integer weights per sequence (how
often each was drawn), so the resampled sum of any per-sequence quantity is weights × per-sequence sums:
one matrix product serves every resample. Weights of all ones are the original sample, which is how the
point estimates are computed too: the same code.
"""

from __future__ import annotations

import torch


def resample_weights(num_seqs: int, resamples: int, seed: int) -> torch.Tensor:
    """(resamples, num_seqs) float64 draw counts, each row summing to num_seqs; seeded, so two runs on
    the same sequences (a baseline and an intervention) resample them identically."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(num_seqs, (resamples, num_seqs), generator=generator)
    weights = torch.zeros(resamples, num_seqs, dtype=torch.float64)
    return weights.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))


def percentile_interval(samples: torch.Tensor, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Percentile interval over the first dimension of `samples`, ignoring NaN resamples (a resample can
    be undefined, e.g. a split-half magnitude when no sequence of one half was drawn); NaN where all are."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    tail = (1 - level) / 2
    bounds = torch.nanquantile(samples.double(), torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=0)
    return bounds[0], bounds[1]
