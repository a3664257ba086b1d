"""Estimates with bootstrap intervals, the numbers every verdict of `posleak paper` is judged on.

An analysis run keeps, per bootstrap resample and layer, the mean over heads of each magnitude
(`bootstrap.parquet`). Resamples are drawn with the run's seed, so two runs on the same sequences (a
baseline and an intervention, or two lab models evaluated on the same rows) draw them identically and
their resamples pair; runs on different sequences are independent, and pairing their k-th resamples is
then a draw of the two independent bootstraps together. From those tables: the mean over layers of a
magnitude and of its square, the percent change between two runs, the share of a squared magnitude that an
intervention removes, the slope against relative depth, and differences and averages of these; and, for a
quantity measured outside an analysis run (C6's probe), its mean over sequences, resampled over sequences.
Each is a point value, its resamples and a percentile interval (docs/method.md §6), and the number of units
(documents) its resamples draw, where they draw documents.

Two estimates of one quantity on disjoint samples pool into one, and an undecided one projects the documents that
would decide it: `posleak paper`'s effect sizes (posleak.experiments.paper.effects).

An estimate is judged against a threshold: it *supports* an expected direction when its whole interval
lies beyond the threshold, *contradicts* it when the whole interval lies on the other side, and is
*unclear* otherwise. `p_short` is the bootstrap p-value of a contradiction that Holm's rule over a claim's
rows uses (posleak.experiments.paper.verdict): read off the same percentile intervals, so that a row alone
contradicts at 95% exactly when its p_short is below 2.5%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from posleak.measure import percentile_interval, resample_weights
from posleak.pipeline import AnalysisResult, resampled_layers

Says = Literal["supports", "contradicts", "unclear"]
Direction = Literal["above", "below"]
LEVEL = 0.95
ALPHA = (1 - LEVEL) / 2  # the one-sided level of each end of a LEVEL interval


@dataclass(frozen=True)
class Estimate:
    """A point value and its bootstrap resamples (R,); the interval is their percentile interval. `units`: how many
    units (documents; sequences where each is its own) the resamples draw, None where they do not draw documents
    (a mean over lab seeds) or the run does not say."""

    value: float
    samples: torch.Tensor
    units: int | None = None

    @property
    def interval(self) -> tuple[float, float]:
        if self.samples.numel() == 0:
            return float("nan"), float("nan")
        lo, hi = percentile_interval(self.samples[:, None], LEVEL)
        return float(lo[0]), float(hi[0])

    def minus(self, other: Estimate) -> Estimate:
        mine, theirs = pair_resamples(self, other)
        return Estimate(self.value - other.value, mine - theirs, _fewer(self, other))

    def judge(self, threshold: float, direction: Direction) -> Says:
        """`above`: supports when lo > threshold, contradicts when hi < threshold; `below` the mirror."""
        lo, hi = self.interval
        beyond, short = (lo > threshold, hi < threshold) if direction == "above" else (hi < threshold, lo > threshold)
        return "supports" if beyond else "contradicts" if short else "unclear"

    def p_short(self, threshold: float, direction: Direction) -> float:
        """The one-sided level below which the percentile interval lies wholly short of `threshold` (below it for
        `above`, above it for `below`): the interval of level 1 − 2α is short exactly when α > p_short. 0 where
        every resample is short, 1 where none is, NaN with fewer than 2 resamples.

        With the resamples sorted, x_k < t ≤ x_{k+1}, and torch's linear interpolation (the q-quantile at
        h = q·(n − 1)), the (1 − α)-quantile lies below t exactly when (1 − α)(n − 1) < h* = k + (t − x_k) /
        (x_{k+1} − x_k), so p_short = 1 − h*/(n − 1). `below` is the same on −x and −t."""
        x = self.samples[~self.samples.isnan()].double()
        t = threshold if direction == "above" else -threshold
        x = (x if direction == "above" else -x).sort().values
        n = x.numel()
        if n < 2:
            return float("nan")
        k = int(torch.searchsorted(x, torch.tensor(t, dtype=x.dtype, device=x.device))) - 1  # x_k < t ≤ x_{k+1}
        if k < 0:
            return 1.0
        if k >= n - 1:
            return 0.0
        h = k + (t - float(x[k])) / (float(x[k + 1]) - float(x[k]))
        return 1 - h / (n - 1)


def pair_resamples(a: Estimate, b: Estimate) -> tuple[torch.Tensor, torch.Tensor]:
    if a.samples.shape != b.samples.shape:
        raise ValueError(f"resamples do not pair: {tuple(a.samples.shape)} and {tuple(b.samples.shape)}")
    return a.samples, b.samples


def _fewer(a: Estimate, b: Estimate) -> int | None:
    """The units of an estimate formed from two: the fewer of theirs (a paired pair has the same), the scarcer
    sample limiting the spread; None where either draws no documents."""
    return None if a.units is None or b.units is None else min(a.units, b.units)


def seed_mean(estimates: Sequence[Estimate], seed: int = 0) -> Estimate:
    """The mean over seeds (lab models trained alike but for their seed) with an interval over seeds: resample k
    draws len(estimates) seeds with replacement and averages their k-th resamples, so the interval holds both the
    spread between seeds and each seed's own. The draw depends only on (seeds, resamples, `seed`): estimates of two
    variants trained on the same seeds draw the same seeds and stay paired. It has no units: it draws seeds."""
    samples = torch.stack([e.samples for e in estimates])  # (S, R)
    count, resamples = samples.shape
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(count, (count, resamples), generator=generator).to(samples.device)
    return Estimate(sum(e.value for e in estimates) / count, samples.gather(0, drawn).mean(0))


def sequence_mean(values: torch.Tensor, resamples: int, seed: int, units: tuple[int, ...] | None = None) -> Estimate:
    """The mean over sequences of a per-sequence quantity `values` (S,), resampled by `units` (the sequences'
    documents, posleak.measure.bootstrap; None: each sequence its own) with `seed`: two quantities of the same
    sequences and seed draw the same resamples, so they pair."""
    x = values.double()
    weights = resample_weights(x.shape[0], resamples, seed, units)
    count = x.shape[0] if units is None else len(set(units))
    return Estimate(float(x.mean()), weights @ x / weights.sum(1), count)


def _units(result: AnalysisResult) -> int | None:
    """How many units the run's bootstrap resamples: its documents, or its sequences where each is its own
    (posleak.measure.bootstrap); None where its manifest does not say."""
    if result.units is not None:
        return len(set(result.units))
    return result.manifest.get("data", {}).get("num_seqs")


def _layers(result: AnalysisResult, measure: str, layers: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Point values (L,) and resamples (R, L) of `measure` over the chosen layers (default all)."""
    per_layer = result.per_layer.set_index("layer").sort_index()
    boot = resampled_layers(result.bootstrap, measure)
    if boot is None:
        raise ValueError("the run kept no bootstrap; rerun it with --bootstrap > 0")
    chosen = list(per_layer.index) if layers is None else list(layers)
    columns = [list(per_layer.index).index(layer) for layer in chosen]
    return torch.tensor(per_layer.loc[chosen, measure].to_numpy(), dtype=torch.float64), boot[:, columns]


def layer_mean(result: AnalysisResult, measure: str, layers: Sequence[int] | None = None) -> Estimate:
    """The mean over layers of a per-layer magnitude (nats)."""
    point, boot = _layers(result, measure, layers)
    return Estimate(float(point.mean()), boot.mean(1), _units(result))


def percent_change(
    baseline: AnalysisResult, intervened: AnalysisResult, measure: str, layers: Sequence[int] | None = None
) -> Estimate:
    """100·(mean_l intervened / mean_l baseline − 1): the change of the layer mean, paired resample by resample."""
    base, new = layer_mean(baseline, measure, layers), layer_mean(intervened, measure, layers)
    b, n = pair_resamples(base, new)
    return Estimate(100 * (new.value / base.value - 1), 100 * (n / b - 1), _fewer(base, new))


def mean_square(result: AnalysisResult, measure: str, layers: Sequence[int] | None = None) -> Estimate:
    """The mean over layers of a magnitude's signed square v·|v| (nats²). A layer's value is the signed root of the
    mean over its heads of the (signed) squares (docs/method.md §3), so this is the mean over layers of each
    layer's mean square: parts whose squares add per head (resid² = key0² + rest²) add here too, which the mean
    of the roots (`layer_mean`) does not."""
    point, boot = _layers(result, measure, layers)
    return Estimate(float((point * point.abs()).mean()), (boot * boot.abs()).mean(1), _units(result))


def share_removed(
    baseline: AnalysisResult, intervened: AnalysisResult, part: str, whole: str, layers: Sequence[int] | None = None
) -> Estimate:
    """100·(part²(baseline) − part²(intervened)) / whole²(baseline), the squares `mean_square`'s: the % of the
    baseline's squared `whole` that the intervention removes through `part` (negative where it adds). The shares of
    parts whose squares add to the whole's add to the whole's own. Paired resample by resample."""
    base, new, total = (mean_square(r, m, layers) for r, m in ((baseline, part), (intervened, part), (baseline, whole)))
    b, n = pair_resamples(base, new)
    return Estimate(100 * (base.value - new.value) / total.value, 100 * (b - n) / total.samples, _fewer(base, new))


def depth_slope(result: AnalysisResult, measure: str, layers: Sequence[int] | None = None) -> Estimate:
    """Least-squares slope of the per-layer magnitude against relative depth l / (L − 1), in nats per unit
    depth: models of different depths compare on one scale (the whole stack, first layer to last). Fitted on
    `layers` (default all), each at its depth in the whole stack."""
    point, boot = _layers(result, measure, layers)
    every = sorted(result.per_layer["layer"])
    depth = torch.linspace(0, 1, len(every), dtype=torch.float64)
    if layers is not None:
        depth = depth[[every.index(layer) for layer in layers]]
    centred = depth - depth.mean()

    def slope(values: torch.Tensor) -> torch.Tensor:
        return ((values - values.mean(-1, keepdim=True)) * centred).sum(-1) / centred.square().sum()

    return Estimate(float(slope(point)), slope(boot), _units(result))
