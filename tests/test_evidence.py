"""Effect sizes first (issue 43; docs/method.md §13): an estimate's units from its run, two samples' estimates pooled,
the power projection of the documents that would decide a row, and where claims.json, report.html and the docs page
show them. Every estimate is built here from real tensors whose answer is computed by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from posleak.experiments.evidence import (
    Estimate,
    documents_to_decide,
    layer_mean,
    percent_change,
    pooled,
    seed_mean,
    sequence_mean,
)
from posleak.pipeline import AnalysisResult


def _exact(centre: float, half_width: float, units: int | None) -> Estimate:
    """Resamples spread evenly so that the 95% percentile interval is centre ± half_width: of 1001 even points over
    [c − w, c + w], the 2.5% and 97.5% quantiles fall on the 26th and 976th, c ∓ 0.95·w."""
    spread = half_width / 0.95 * torch.linspace(-1, 1, 1001, dtype=torch.float64)
    return Estimate(centre, centre + spread, units)


def test_exact_estimates_have_the_interval_they_are_built_with() -> None:
    """The premise of the projections below."""
    assert _exact(0.3, 0.2, 16).interval == pytest.approx((0.1, 0.5), abs=1e-12)


def test_the_pooled_estimate_is_the_documents_weighted_mean_resample_by_resample() -> None:
    """A (8 documents) and B (24): value and every resample (8·a + 24·b)/32, worked out by hand; units 32. Equal
    weights where a sample's units are unknown. Resamples that do not pair are refused."""
    a = Estimate(1.0, torch.tensor([0.8, 1.0, 1.2, 1.1], dtype=torch.float64), 8)
    b = Estimate(2.0, torch.tensor([2.4, 1.6, 2.0, 2.2], dtype=torch.float64), 24)
    both = pooled([a, b])
    assert both.value == pytest.approx(1.75)
    torch.testing.assert_close(both.samples, torch.tensor([2.0, 1.45, 1.8, 1.925], dtype=torch.float64))
    assert both.units == 32
    assert both.interval == pytest.approx(tuple(np.quantile([2.0, 1.45, 1.8, 1.925], [0.025, 0.975])))
    equal = pooled([a, Estimate(2.0, b.samples)])
    assert equal.value == pytest.approx(1.5) and equal.units is None
    torch.testing.assert_close(equal.samples, torch.tensor([1.6, 1.3, 1.6, 1.65], dtype=torch.float64))
    with pytest.raises(ValueError, match="do not pair"):
        pooled([a, Estimate(2.0, torch.zeros(5, dtype=torch.float64), 24)])


@pytest.mark.parametrize(
    ("estimate", "threshold", "direction", "expected"),
    [
        (_exact(0.3, 0.2, 16), 0.2, "above", ("supports", 64)),  # h 0.2, gap 0.1: 16·(0.2/0.1)² = 64
        (_exact(0.1, 0.2, 16), 0.2, "above", ("contradicts", 64)),  # the wrong side: the upper half faces it
        (_exact(-3.0, 1.0, 10), -1.0, "below", ("supports", 3)),  # 10·(1/2)² = 2.5, rounded up
        (_exact(-0.5, 1.0, 10), -1.0, "below", ("contradicts", 40)),  # 10·(1/0.5)² = 40
        (_exact(0.3, 0.15, 10), 0.2, "above", ("supports", 23)),  # 10·1.5² = 22.5
        (_exact(0.5, 0.1, 16), 0.2, "above", ("supports", 2)),  # decided already: 16/9 → 2, fewer than it has
        (_exact(0.3, 0.2, None), 0.2, "above", None),  # no documents to count
        (_exact(0.2, 0.2, 16), 0.2, "above", None),  # on the threshold: no side to decide
    ],
)
def test_the_projection_is_the_documents_at_which_the_half_width_meets_the_gap(
    estimate: Estimate, threshold: float, direction: str, expected: tuple[str, int] | None
) -> None:
    assert documents_to_decide(estimate, threshold, direction) == expected  # type: ignore[arg-type]


def _run(values: list[float], manifest: dict) -> AnalysisResult:
    """A run of resid_all per layer, each resample k adding 0.01·k, with the manifest given."""
    layers = len(values)
    bootstrap = pd.DataFrame(
        {
            "resample": np.repeat(np.arange(50), layers),
            "layer": np.tile(np.arange(layers), 50),
            "resid_all": np.add.outer(0.01 * np.arange(50), values).ravel(),
        }
    )
    per_layer = pd.DataFrame({"layer": range(layers), "resid_all": values})
    empty = pd.DataFrame()
    return AnalysisResult(empty, per_layer, empty, empty, empty, bootstrap, manifest)


def test_an_estimate_counts_the_documents_its_run_resamples() -> None:
    """Distinct documents from the manifest (4 windows of 3 documents: 3); each sequence its own where the run
    names none (num_seqs); none where the manifest does not say. Paired differences and changes keep the fewer;
    a seed mean draws seeds, not documents; a mean over sequences counts their documents."""
    three = _run([0.2, 0.4], {"data": {"documents": ["a", "b", "a", "c"], "num_seqs": 4}})
    five = _run([0.3, 0.5], {"data": {"documents": None, "num_seqs": 5}})
    assert layer_mean(three, "resid_all").units == 3
    assert layer_mean(five, "resid_all").units == 5
    assert layer_mean(_run([0.2, 0.4], {}), "resid_all").units is None
    assert percent_change(three, three, "resid_all").units == 3
    assert layer_mean(five, "resid_all").minus(layer_mean(three, "resid_all")).units == 3
    assert seed_mean([layer_mean(three, "resid_all")] * 3).units is None
    values = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    assert sequence_mean(values, 20, 0, (0, 0, 1, 2)).units == 3
    assert sequence_mean(values, 20, 0).units == 4
