"""C1 and C2 on constructed inputs with a known answer: both components' layer means (C1) and the early mask
component (C2) judged on the same runs, C1's residual-stream component split by keys, and the nulls each reports."""

from __future__ import annotations

import numpy as np
import pytest
from constructed import resampled_run

from posleak.experiments.paper.claims.c1.claim import claim_c1
from posleak.experiments.paper.claims.c2.claim import claim_c2
from posleak.pipeline import AnalysisResult


def _model(resid: float, mask: float, mask_early: float, spread: float = 0.1, seed: int = 0) -> AnalysisResult:
    """Four layers at the given levels, each resample scaled by a relative spread."""
    levels = {"resid_all": resid, "mask_all": mask, "mask_early": mask_early}
    return resampled_run({name: [level] * 4 for name, level in levels.items()}, spread, seed)[0]


PRESENT = _model(0.5, 0.3, 0.4)
FAINT = _model(0.01, 0.3, 0.01)  # the residual-stream and early mask components clearly below 0.05 nats
BORDERLINE = _model(0.055, 0.3, 0.055, spread=0.5)  # intervals straddle 0.05 nats


@pytest.mark.parametrize(
    ("models", "verdict"),
    [
        ({"a": PRESENT, "b": PRESENT}, "consistent"),
        ({"a": PRESENT, "b": FAINT}, "not consistent"),
        ({"a": PRESENT, "b": BORDERLINE}, "inconclusive"),
    ],
)
def test_claim_c1_and_c2_verdicts(models: dict[str, AnalysisResult], verdict: str) -> None:
    """Both components' layer means above 0.05 nats in every model (C1), the early mask component (C2)."""
    c1, c2 = claim_c1(models), claim_c2(models)
    assert c1.verdict == verdict and c2.verdict == verdict
    rows = c1.evidence.set_index("evidence")
    assert rows.loc["a: resid_all", "value"] == pytest.approx(0.5)
    assert rows.loc["a: resid_all", "lo"] > 0.05


def test_c1_reports_the_residual_stream_component_split_by_keys_beside_it() -> None:
    """resid_all's key-0 column and the rest, their layer means (0.45 and 0.2 nats here, against the numpy mean of
    each layer's value), stand beside it as reported rows: they decide nothing, the verdict is resid_all's and
    mask_all's; a run without the split columns (written before it) shows none."""
    values = {"resid_all": [0.5] * 4, "mask_all": [0.3] * 4, "resid_all_key0": [0.4, 0.5, 0.4, 0.5]}
    split, _ = resampled_run(values | {"resid_all_rest": [0.1, 0.3, 0.2, 0.2]}, 0.1, seed=2)
    rows = claim_c1({"a": split, "b": PRESENT}).evidence.set_index("evidence")
    assert rows.loc["a: resid_all, its key-0 column", "value"] == pytest.approx(np.mean([0.4, 0.5, 0.4, 0.5]))
    assert rows.loc["a: resid_all, without key 0", "value"] == pytest.approx(0.2)
    assert not rows.loc[["a: resid_all, its key-0 column", "a: resid_all, without key 0"], "deciding"].any()
    assert not any(name.startswith("b: resid_all, ") for name in rows.index)
    assert claim_c1({"a": split, "b": PRESENT}).verdict == "consistent"


# Nulls of PRESENT's sequences: the residual-stream magnitude (0.5 nats, ±5% per resample) far below, at, or above
# the text's; the causal-mask one at 0.9 nats on every null, above the text's 0.3 (it is shown, never deciding).
FLOOR = {kind: _model(0.2, 0.9, 0.9, spread=0.05, seed=s) for s, kind in enumerate(("shuffle", "shift"))}
AS_HIGH = {"shuffle": _model(0.5, 0.9, 0.9, seed=3), "shift": FLOOR["shift"]}
HIGHER = {"shuffle": _model(0.9, 0.9, 0.9, spread=0.05, seed=4), "shift": FLOOR["shift"]}


@pytest.mark.parametrize(("nulls", "share"), [(FLOOR, 40.0), (AS_HIGH, 100.0), (HIGHER, 180.0)])
def test_c1_reports_the_share_its_shuffle_null_keeps_and_c2_shows_the_nulls(
    nulls: dict[str, AnalysisResult], share: float
) -> None:
    """C1: the two magnitudes decide whatever the nulls give (no token null decides: it keeps the paper's own
    mechanism, docs/method.md §13–14); the share of resid_all kept on the shuffled tokens, 100·null/text paired
    resample by resample, and every null's magnitudes are reported; C2 shows its nulls and is unchanged."""
    c1 = claim_c1({"a": PRESENT}, {"a": nulls})
    assert c1.verdict == "consistent"
    rows = c1.evidence.set_index("evidence")
    assert list(rows.index[rows["deciding"]]) == ["a: resid_all", "a: mask_all"]
    kept = rows.loc["a: resid_all kept without word order (shuffle / text)"]
    assert kept["value"] == pytest.approx(share) and kept["threshold"] == "> 50"
    text, null = (_layers_of(result) for result in (PRESENT, nulls["shuffle"]))
    assert (kept["lo"], kept["hi"]) == pytest.approx(tuple(np.percentile(100 * null / text, [2.5, 97.5])))
    assert rows.loc["a: resid_all, shuffle null", "value"] == pytest.approx(nulls["shuffle"].per_layer["resid_all"][0])
    assert {"a: resid_all, shift null", "a: mask_all, shuffle null", "a: mask_all, shift null"} < set(rows.index)
    c2 = claim_c2({"a": PRESENT}, {"a": nulls})
    assert c2.verdict == "consistent"
    assert list(c2.evidence["evidence"]) == [
        "a: mask_early",
        "a: mask_early, shuffle null",
        "a: mask_early, shift null",
    ]
    assert list(c2.evidence["deciding"]) == [True, False, False]


def _layers_of(result: AnalysisResult) -> np.ndarray:
    """The mean over layers of resid_all in each resample, from the bootstrap table as numpy reads it."""
    table = result.bootstrap.pivot(index="resample", columns="layer", values="resid_all")
    return table.mean(axis=1).to_numpy()
