"""C4's lines per sample (NTK at inference; the standard model's slope against the NTK-scaled one's) and its window
line judged once on its samples, on constructed inputs with a known answer; the claim needs its window line."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from constructed import even_estimate, resampled_run

from posleak.experiments.evidence import Estimate, depth_slope
from posleak.experiments.paper.claims.c4.claim import C4, claim_c4
from posleak.experiments.paper.claims.c4.window import WindowComparison, claim_window
from posleak.experiments.paper.verdict import Claim, with_once


def test_the_window_comparison_fits_the_sliding_model_on_its_windowed_layers() -> None:
    """C4's line (2) beyond the window (revised 2026-12-06, issue 44): a sliding model whose windowed layers stay
    flat beyond the window while its global layers (window 0) rise has slope 0 there, not the straight line
    through the sawtooth; the standard model's slope is fitted on every layer."""
    sawtooth = [0.1, 0.1, 0.8, 0.1, 0.1, 1.6]  # two local layers, then one global, twice
    sliding, _ = resampled_run({"resid_beyond": sawtooth}, 0.0, seed=0)
    sliding.per_layer["window"] = [512, 512, 0, 512, 512, 0]
    sliding.manifest.update(data={"seq_len": 2048, "source_name": "bible-web"}, measurement={"beyond": 512})
    standard, _ = resampled_run({"resid_beyond": [0.1, 0.2, 0.3, 0.4]}, 0.0, seed=1)
    window = WindowComparison.of(sliding, standard)
    assert (window.windowed, window.layers, window.where) == (4, 6, "i ≥ 512, T = 2048, bible-web")
    assert window.sliding.value == pytest.approx(0.0, abs=1e-12)
    assert depth_slope(sliding, "resid_beyond").value > 0.9  # the line through every layer rises
    assert window.standard.value == pytest.approx(np.polyfit(np.linspace(0, 1, 4), [0.1, 0.2, 0.3, 0.4], 1)[0])
    rows = claim_window({"A": window}, "").evidence.set_index("evidence")
    name = "A: (2) slope beyond the window (i ≥ 512, T = 2048, bible-web): sliding − standard"
    assert rows.loc[name, "says"] == "contradicts"


SLOPES = {"standard": even_estimate(0.1, 0.05), "ntk": even_estimate(-0.1, 0.05)}


@pytest.mark.parametrize(
    ("ntk", "slopes", "verdict"),
    [
        (even_estimate(-8.0, 1.0), SLOPES, "consistent"),
        (even_estimate(3.0, 1.0), SLOPES, "not consistent"),  # NTK raises it
        (even_estimate(-8.0, 1.0), {**SLOPES, "ntk": even_estimate(0.1, 0.1)}, "inconclusive"),
        (even_estimate(-8.0, 1.0), {**SLOPES, "ntk": even_estimate(0.3, 0.05)}, "not consistent"),  # NTK steeper
    ],
)
def test_claim_c4_verdicts(ntk: Estimate, slopes: dict[str, Estimate], verdict: str) -> None:
    """A sample's lines (NTK at inference; the standard model's slope against the NTK-scaled one's); consistent
    only when both support, not consistent when one contradicts. The window line and the lab are judged once,
    elsewhere: no row of a sample's evidence is theirs."""
    judgement = claim_c4(ntk, slopes)
    assert judgement.verdict == verdict
    rows = judgement.evidence.set_index("evidence")
    assert not any("lab" in name or "beyond the window" in name for name in rows.index)


WIDE = WindowComparison(
    even_estimate(0.3, 0.05),
    even_estimate(0.1, 0.05),
    seq_len=2048,
    window=512,
    windowed=15,
    layers=18,
    corpus="bible-web",
)
FLAT = replace(WIDE, sliding=even_estimate(0.1, 0.1))  # the interval of the difference holds 0
BELOW = replace(WIDE, sliding=even_estimate(-0.2, 0.05))  # the windowed layers' slope below the standard model's


@pytest.mark.parametrize(
    ("comparisons", "verdict", "deciding"),
    [
        ({"A": WIDE, "B": WIDE}, "consistent", 2),
        ({"A": BELOW, "B": BELOW}, "not consistent", 2),
        ({"A": WIDE, "B": BELOW}, "inconclusive", 2),  # the samples disagree: not replicated
        ({"A": FLAT, "B": WIDE}, "inconclusive", 2),
        # T = 640 < 4W: reported, deciding nothing, whatever it shows: the part cannot test
        ({"A": replace(WIDE, seq_len=640), "B": replace(WIDE, seq_len=640)}, "inconclusive", 0),
        ({}, "inconclusive", 0),  # not measured by the plan
    ],
)
def test_c4_s_window_line_is_judged_once_on_its_samples(comparisons: dict, verdict: str, deciding: int) -> None:
    """The window line (judged once, revised 2026-12-06): on each sample the sliding model's slope beyond the
    window against the standard one's, deciding only at T ≥ 4W, the verdict replicated over A and B; it goes either
    way on planted slopes. Every row names its sample; a line not measured says why in one row that decides
    nothing."""
    judgement = claim_window(comparisons, "not measured by the plan 'quick'")
    assert judgement.verdict == verdict
    rows = judgement.evidence
    assert int(rows["deciding"].sum()) == deciding
    assert all(name.startswith(tuple(f"{s}: " for s in comparisons)) for name in rows["evidence"]) or not comparisons
    if comparisons:
        assert "A: slope beyond the window: sliding (15 windowed layers of 18)" in set(rows["evidence"])
    else:
        assert rows["evidence"].tolist() == ["(2) slope beyond the window: not measured by the plan 'quick'"]


@pytest.mark.parametrize(
    ("samples", "window", "verdict"),
    [
        ("consistent", {"A": WIDE, "B": WIDE}, "consistent"),
        ("consistent", {}, "inconclusive"),  # the claim needs the window line: not measured, never consistent
        ("not consistent", {}, "not consistent"),  # a line the plan measured still contradicts
        ("consistent", {"A": BELOW, "B": BELOW}, "not consistent"),
    ],
)
def test_c4_needs_its_window_line(samples: str, window: dict, verdict: str) -> None:
    """C4 names its window line as needed (`required_once`): where it cannot test, the claim is inconclusive at
    best, where a part that is not needed (the lab) leaves the verdict; claims.json marks it, and a claims.json read
    back gives the same verdict."""
    once = {"window": claim_window(window, "not measured"), "lab": claim_window({}, "untestable lab")}
    claim = Claim("C4", "s", "c", {}, "m", once=once, required=C4.required_once)
    assert with_once(samples, claim.once, claim.required) == verdict
    assert with_once(samples, {"lab": once["lab"]}) == samples  # a part not needed that cannot test leaves it
    entry = claim.to_json()["once"]
    assert (entry["window"]["required"], entry["lab"]["required"]) == (True, False)
