"""Inputs built with a known answer for the paper's claims (tests/test_c*.py, test_evidence.py, test_verdict.py,
test_paper_corpora.py): runs whose per-layer magnitudes and resamples are set, estimates whose interval is set, and
evidence rows on either side of a threshold; the claims in order and the verdicts a claim can have."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from posleak.experiments.evidence import Estimate
from posleak.experiments.paper.verdict import evidence_row, fact_row
from posleak.pipeline import AnalysisResult

CLAIMS = ["C1", "C2", "C3", "C4", "C5", "C6"]
VERDICTS = {"consistent", "not consistent", "inconclusive"}

# ---------------------------------------------------------------------------- verdicts on constructed inputs
# Each claim's criterion (paper/claims/c1 … c6, with its dated revisions) applied to inputs built here with a known
# answer, and the estimates it is judged on (evidence.py) against numpy computations of their definitions.

RESAMPLES = 400


def result_of(
    per_layer: pd.DataFrame | None = None,
    per_head: pd.DataFrame | None = None,
    bootstrap: pd.DataFrame | None = None,
    manifest: dict[str, Any] | None = None,
) -> AnalysisResult:
    empty = pd.DataFrame()
    return AnalysisResult(
        per_head if per_head is not None else empty,
        per_layer if per_layer is not None else empty,
        empty,
        empty,
        empty,
        bootstrap if bootstrap is not None else empty,
        manifest=manifest or {},
    )


def resampled_run(
    values: dict[str, list[float]], spread: float, seed: int
) -> tuple[AnalysisResult, dict[str, np.ndarray]]:
    """A run whose per-layer magnitudes are `values` and whose resample r multiplies layer l by (1 + spread·z_rl),
    z standard normal drawn with `seed`; also the resampled arrays (R, L) per measure, for the numpy reference."""
    rng = np.random.default_rng(seed)
    layers = len(next(iter(values.values())))
    per_layer = pd.DataFrame({"layer": range(layers), **values})
    resampled = {
        name: np.asarray(v) * (1 + spread * rng.standard_normal((RESAMPLES, layers))) for name, v in values.items()
    }
    rows = {"resample": np.repeat(np.arange(RESAMPLES), layers), "layer": np.tile(np.arange(layers), RESAMPLES)}
    table = pd.DataFrame({**rows, **{name: a.ravel() for name, a in resampled.items()}}).sample(
        frac=1, random_state=seed
    )
    return result_of(per_layer, bootstrap=table), resampled


def percentile_interval(samples: np.ndarray) -> tuple[float, float]:
    return tuple(np.quantile(samples, [0.025, 0.975]))  # type: ignore[return-value]


def even_estimate(centre: float, half_width: float) -> Estimate:
    """Resamples spread evenly over [centre − w, centre + w]: the 95% interval is almost exactly that range."""
    return Estimate(centre, torch.linspace(centre - half_width, centre + half_width, 1001, dtype=torch.float64))


NEAR = evidence_row("near", even_estimate(0.08, 0.01), 0.05, "above", "nats")  # 0.07 to 0.09: just above 0.05
FAR = evidence_row("far", even_estimate(1.0, 0.1), 0.05, "above", "nats")
LOWERING = evidence_row("lowering", even_estimate(-5.0, 1.0), -1.0, "below", "%")
CLOSED_FACT = fact_row("closed", 0.0, True, False, "≤ 1e-05")
SHORT = evidence_row("short", even_estimate(0.04, 0.005), 0.05, "above", "nats")  # 0.035 to 0.045: just below
# 4 to 6 against < −1: far on the wrong side
RAISING = evidence_row("raising", even_estimate(5.0, 1.0), -1.0, "below", "%")
STRADDLING = evidence_row("straddling", even_estimate(0.05, 0.02), 0.05, "above", "nats")
