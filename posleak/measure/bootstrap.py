"""Bootstrap over the sequences' documents: resampling units, weights and percentile intervals.

The unit of a resample is the document: windows cut from one document share its topic and style, so they are not
independent draws, and a resample draws C documents with replacement, each with all its windows (a cluster
bootstrap). Where the sequences come from fewer than two known documents (one text file, a token file, windows
across documents) each sequence is its own unit. With one window per document the two are the same draw.

Every resample holds at least two distinct units: the noise correction pairs distinct documents (components.py),
so a resample of one document repeated has no pair and no corrected magnitude. Such a draw (probability C^(1−C):
1/64 at C = 4, 5e-7 at C = 8) is drawn again, from the same generator, so that no resample is ever dropped; the
bootstrap is then the one conditional on two distinct units, and `redrawn` counts how many draws that changed
(the manifest records it).

Below MIN_BOOTSTRAP_UNITS units there is no interval: with two, every resample that holds both is the sample
itself and the interval is a point; with three, seven distinct resamples make a 95% interval of their extremes.

A resample is written as integer weights per sequence (how often its unit was drawn), so the resampled sum of any
per-sequence quantity is weights × per-sequence sums: one matrix product serves every resample. Weights of all
ones are the original sample, which is how the point estimates are computed too: the same code. A weighted mean
divides by the weights' sum, which varies from resample to resample where documents hold different numbers of
windows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# The fewest units (documents, or sequences where documents are unknown) a bootstrap interval is formed over.
MIN_BOOTSTRAP_UNITS = 4


def resampling_units(documents: Sequence[str] | None) -> tuple[int, ...] | None:
    """The unit each sequence is resampled with, numbered 0, 1, … in order of first appearance: its document (by
    title) where the sequences come from at least two; None (each sequence its own unit) otherwise."""
    if documents is None or len(set(documents)) < 2:
        return None
    number = {title: k for k, title in enumerate(dict.fromkeys(documents))}  # in order of first appearance
    return tuple(number[title] for title in documents)


def unit_ids(num_seqs: int, units: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """Each sequence's unit as a CPU tensor (N,): `units`, or each sequence its own (0 … N − 1)."""
    return torch.arange(num_seqs) if units is None else torch.as_tensor(units).cpu()


def _draws(count: int, resamples: int, seed: int) -> tuple[torch.Tensor, int]:
    """(resamples, count) unit indices drawn with replacement, every row holding two distinct units where
    count ≥ 2 (rows of one unit are drawn again from the same generator), and how many rows were drawn again."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(count, (resamples, count), generator=generator)
    redrawn = 0
    while count >= 2 and resamples:
        single = torch.nonzero(draws.amin(1) == draws.amax(1))[:, 0]
        if not len(single):
            break
        redrawn += len(single)
        draws[single] = torch.randint(count, (len(single), count), generator=generator)
    return draws, redrawn


def resample_weights(
    num_seqs: int, resamples: int, seed: int, units: Sequence[int] | torch.Tensor | None = None
) -> torch.Tensor:
    """(resamples, num_seqs) float64 draw counts: each resample draws as many units as there are (default: each
    sequence is one) with replacement, at least two distinct (module docstring), and a sequence counts as often as
    its unit was drawn. Seeded, so two runs on the same sequences (a baseline and an intervention) resample them
    identically; with every sequence its own unit the draw is the same as without units."""
    of = unit_ids(num_seqs, units)
    count = int(of.max()) + 1
    draws, _ = _draws(count, resamples, seed)
    drawn = torch.zeros(resamples, count, dtype=torch.float64)
    drawn.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
    return drawn[:, of]


def redrawn_resamples(num_units: int, resamples: int, seed: int) -> int:
    """How many of `resample_weights`' draws held a single unit and were drawn again (the manifest records it)."""
    return _draws(num_units, resamples, seed)[1]


def percentile_interval(samples: torch.Tensor, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Percentile interval over the first dimension of `samples`. No resample is dropped: one NaN resample makes
    the interval NaN (a measure a range does not have is NaN in every resample, and so is its interval)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    tail = (1 - level) / 2
    bounds = torch.quantile(samples.double(), torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=0)
    return bounds[0], bounds[1]
