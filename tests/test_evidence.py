"""Effect sizes first (issue 43; docs/method.md §13): an estimate's units from its run, two samples' estimates pooled,
the power projection of the documents that would decide a row, and where claims.json, report.html and the docs page
show them. Every estimate is built here from real tensors whose answer is computed by hand. Below them, the estimates
the claims are judged on (layer mean, paired percent change, depth slope, seed mean) and the p-value of a contradiction,
against numpy computations of their definitions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from constructed import even_estimate, percentile_interval, resampled_run

from posleak.experiments.evidence import (
    Estimate,
    depth_slope,
    layer_mean,
    percent_change,
    seed_mean,
    sequence_mean,
)
from posleak.experiments.paper import QUICK, render
from posleak.experiments.paper.claims.c5.claim import KEY_PARTS, Replacement, claim_c5
from posleak.experiments.paper.corpora import side_by_side
from posleak.experiments.paper.effects import POOLED, PROJECTION_NOTE, add_effects, documents_to_decide, pooled
from posleak.experiments.paper.report import write_top
from posleak.experiments.paper.verdict import Claim, Judgement, evidence_row, fact_row, judge
from posleak.pipeline import AnalysisResult
from posleak.store import RunFolder, write_json


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


def _claim(a: list[dict], b: list[dict], name: str = "C1") -> Claim:
    """A claim judged on samples A and B of the stdlib, from their rows."""
    return _judged({"A": judge(a), "B": judge(b)}, name)


def _judged(samples: dict[str, Judgement], name: str = "C1") -> Claim:
    claim = Claim(name, "A statement.", "criterion", samples, "method")
    claim.corpora = {"stdlib": {"name": "stdlib", "sha256": "0" * 64, "origin": None, "samples": ["A", "B"]}}
    claim.models = {"standard": {"spec": "smollm2-135m", "sha256": "1" * 64}}
    return claim


def _inconclusive() -> Claim:
    """A and B share the resamples of "edge" and "wrong", so the pooled interval is each one's, from 8 + 8 = 16
    documents: half-width 0.2 against a gap of 0.1 projects 16·(0.2/0.1)² = 64 documents per sample."""
    decided = evidence_row("decided", _exact(1.0, 0.1, 8), 0.05, "above", "nats")
    edge = evidence_row("edge", _exact(0.3, 0.2, 8), 0.2, "above", "nats")  # 0.1 to 0.5 against > 0.2: unclear
    wrong = evidence_row("wrong", _exact(0.1, 0.2, 8), 0.2, "above", "nats")  # −0.1 to 0.3, the value short of it
    seeds = evidence_row("seeds", _exact(0.3, 0.2, None), 0.2, "above", "nats")  # a lab row: over seeds
    untested = fact_row("untested", 0, False, False, "> 0 to test")
    reported = evidence_row("reported", _exact(0.0, 0.1, 8), 0.05, "above", "nats", deciding=False)
    a = Estimate(1.0, torch.tensor([0.8, 1.0, 1.2, 1.1], dtype=torch.float64), 8)  # as in the hand computation
    b = Estimate(2.0, torch.tensor([2.4, 1.6, 2.0, 2.2], dtype=torch.float64), 24)
    a_weighted, b_weighted = (evidence_row("weighted", e, 0.5, "above", "nats") for e in (a, b))
    return _claim(
        [decided, edge, wrong, seeds, untested, reported, a_weighted],
        [decided, edge, wrong, seeds, untested, reported, b_weighted],
    )


def test_each_deciding_row_is_pooled_and_each_row_left_unclear_projected() -> None:
    """Every deciding row with an estimate in both samples is pooled (an exact row is not, a reported row is not);
    a row decided in both samples has no projection; the others have one, or say why not. The verdict is the
    samples' still."""
    claim = _inconclusive()
    add_effects([claim])
    assert claim.verdict == "inconclusive"
    pooled_rows = {e["evidence"]: e for e in claim.pooled}
    assert list(pooled_rows) == ["decided", "edge", "wrong", "seeds", "weighted"]
    weighted = pooled_rows["weighted"]
    assert weighted["value"] == pytest.approx(1.75) and weighted["documents"] == {"A": 8, "B": 24}
    by_hand = np.quantile([2.0, 1.45, 1.8, 1.925], [0.025, 0.975])
    assert (weighted["lo"], weighted["hi"]) == pytest.approx(tuple(by_hand))
    assert weighted["says"] == "supports" and weighted["weights"] == "documents" and weighted["label"] == POOLED
    assert pooled_rows["edge"]["samples"] == {"A": "unclear", "B": "unclear"} and pooled_rows["edge"]["agree"]
    assert (pooled_rows["edge"]["lo"], pooled_rows["edge"]["hi"]) == pytest.approx((0.1, 0.5))
    assert pooled_rows["seeds"]["weights"] == "equal"
    projected = {e["evidence"]: e for e in claim.projection}
    assert list(projected) == ["edge", "wrong", "seeds", "untested"]  # "decided" and "weighted" decide in A and B
    assert (projected["edge"]["documents_needed"], projected["edge"]["would_say"]) == (64, "supports")
    assert (projected["wrong"]["documents_needed"], projected["wrong"]["would_say"]) == (64, "contradicts")
    assert projected["edge"]["documents"] == {"A": 8, "B": 8}
    assert projected["seeds"]["documents_needed"] is None and "seeds" in projected["seeds"]["why_none"]
    assert projected["untested"]["why_none"].startswith("an exact row")
    assert all(e["label"] == PROJECTION_NOTE for e in claim.projection)


def test_a_sample_that_disagrees_is_shown_beside_the_pooled_row_and_a_decided_claim_has_no_projection() -> None:
    near = evidence_row("near", _exact(0.3, 0.05, 8), 0.2, "above", "nats")  # 0.25 to 0.35: supports
    far = evidence_row("near", _exact(0.3, 0.2, 8), 0.2, "above", "nats")  # 0.1 to 0.5: unclear
    claim = _claim([near], [far])
    add_effects([claim])
    [e] = claim.pooled
    assert e["samples"] == {"A": "supports", "B": "unclear"} and not e["agree"]
    [p] = claim.projection
    assert p["documents_needed"] is not None and p["documents_needed"] > 8 and p["would_say"] == "supports"
    consistent = _claim([near], [near])
    add_effects([consistent])
    assert consistent.verdict == "consistent" and consistent.projection == [] and len(consistent.pooled) == 1


def test_a_band_is_pooled_and_projected_against_both_ends() -> None:
    """C5's row, judged against the band 20–60%: removed 25% of resid_early² ± 10 (15 to 35), 8 + 8 documents,
    lies inside and meets the low end first: 16·(10/5)² = 64 documents; outside, at 70% ± 20, the high end decides a
    contradiction at 16·(20/10)² = 64."""
    for removed, would in ((25.0, "supports"), (70.0, "contradicts")):
        share = _exact(removed, 2 * (removed - 20) if removed < 60 else 20.0, 8)
        nats = _exact(1.0, 0.1, 8)  # the parts and changes only report: not pooled, not projected
        effect = Replacement({p: nats for p in KEY_PARTS}, {p: nats for p in KEY_PARTS}, {p: share for p in KEY_PARTS})
        judged = claim_c5({"mean": effect})
        claim = _judged({"A": judged, "B": judged}, "C5")
        add_effects([claim])
        [e] = claim.pooled
        assert e["value"] == pytest.approx(removed) and e["threshold"] == "20–60" and e["says"] == "unclear"
        [p] = claim.projection
        assert (p["would_say"], p["documents_needed"]) == (would, 64)


def test_claims_json_the_report_and_the_docs_page_lead_with_the_effects(tmp_path: Path) -> None:
    """claims.json carries `pooled` and `projection` per claim, read back as written; report.html and the docs page
    show them before each sample's evidence, the projection labelled as one."""
    claim = _inconclusive()
    add_effects([claim])
    write_json(tmp_path / "claims.json", [claim.to_json()], default=float)
    [entry] = json.loads((tmp_path / "claims.json").read_text())
    assert [e["evidence"] for e in entry["pooled"]] == ["decided", "edge", "wrong", "seeds", "weighted"]
    assert entry["projection"][0]["documents_needed"] == 64 and entry["projection"][0]["label"] == PROJECTION_NOTE
    assert entry["projection"][3]["evidence"] == "untested" and entry["projection"][3]["value"] is None
    [back] = render.read_claims(tmp_path / "claims.json")
    assert back.pooled == entry["pooled"] and back.projection == entry["projection"]
    page = render.results_page([back], Path("docs/results/claims.json"), [])
    assert f"**Effect sizes, {POOLED}** (they do not decide the verdict)" in page
    assert "| edge | 0.3 nats | 0.1 to 0.5 | > 0.2 | unclear | A unclear, B unclear | A 8, B 8 |" in page
    assert "| weighted | 1.75 nats |" in page
    assert f"**Power projection** ({PROJECTION_NOTE})" in page
    assert "| edge | 0.3 nats (0.1 to 0.5) | > 0.2 | A 8, B 8 | 64 documents per sample: supports |" in page
    assert "| wrong | 0.1 nats (-0.1 to 0.3) | > 0.2 | A 8, B 8 | 64 documents per sample: contradicts |" in page
    assert page.index("Effect sizes") < page.index("Power projection") < page.index("Sample A:")
    write_top(RunFolder(tmp_path / "run"), QUICK, [claim], {})
    report = (tmp_path / "run" / "report.html").read_text()
    assert f"Effect sizes, {POOLED} (do not decide the verdict)" in report
    assert f"Power projection ({PROJECTION_NOTE})" in report and "64 documents per sample: contradicts" in report
    assert report.index("Effect sizes") < report.index("Evidence, sample A")


def test_on_two_corpora_each_corpus_pools_its_own_samples() -> None:
    """The samples of each corpus pool together, never across corpora; the tables name the corpus."""
    per_corpus = {}
    for corpus, centre in (("stdlib", 0.3), ("bible-web", 0.9)):
        edge = evidence_row("edge", _exact(centre, 0.2, 8), 0.2, "above", "nats")
        claim = _claim([edge], [edge])
        claim.corpora = {corpus: {"name": corpus, "sha256": "0" * 64, "origin": None, "samples": ["A", "B"]}}
        per_corpus[corpus] = [claim]
    [joined] = side_by_side(per_corpus)
    add_effects([joined])
    assert [(e["corpus"], e["value"]) for e in joined.pooled] == [("stdlib", 0.3), ("bible-web", 0.9)]
    assert joined.pooled[1]["samples"] == {"bible-web A": "supports", "bible-web B": "supports"}
    assert [(e["corpus"], e["documents_needed"]) for e in joined.projection] == [("stdlib", 64)]


# ---------------------------------------------------------------------------------------- estimates against numpy


def test_estimates_against_numpy() -> None:
    """Layer mean, paired percent change (on chosen layers) and the slope against relative depth, each with its
    percentile interval, against numpy on the same resamples; rows of the bootstrap table arrive shuffled."""
    values = {"resid_all": [0.2, 0.5, 0.4, 0.9, 0.7]}
    base, base_boot = resampled_run(values, 0.05, seed=0)
    new, new_boot = resampled_run({"resid_all": [0.25, 0.4, 0.44, 0.6, 0.7]}, 0.05, seed=1)
    mean = layer_mean(base, "resid_all")
    assert mean.value == pytest.approx(np.mean(values["resid_all"]))
    assert mean.interval == pytest.approx(percentile_interval(base_boot["resid_all"].mean(1)))
    layers = [1, 3]
    change = percent_change(base, new, "resid_all", layers)
    ratio = new_boot["resid_all"][:, layers].mean(1) / base_boot["resid_all"][:, layers].mean(1)
    assert change.value == pytest.approx(100 * ((0.4 + 0.6) / (0.5 + 0.9) - 1))
    assert change.interval == pytest.approx(percentile_interval(100 * (ratio - 1)))
    depth = np.linspace(0, 1, 5)
    slope = depth_slope(base, "resid_all")
    assert slope.value == pytest.approx(np.polyfit(depth, values["resid_all"], 1)[0])
    slopes = np.array([np.polyfit(depth, sample, 1)[0] for sample in base_boot["resid_all"]])
    assert slope.interval == pytest.approx(percentile_interval(slopes))
    difference = slope.minus(depth_slope(new, "resid_all"))
    other = np.array([np.polyfit(depth, sample, 1)[0] for sample in new_boot["resid_all"]])
    assert difference.interval == pytest.approx(percentile_interval(slopes - other))
    # on chosen layers, each at its depth in the whole stack
    chosen = depth_slope(base, "resid_all", [0, 2, 3])
    assert chosen.value == pytest.approx(np.polyfit(depth[[0, 2, 3]], np.array(values["resid_all"])[[0, 2, 3]], 1)[0])
    fitted = np.array([np.polyfit(depth[[0, 2, 3]], sample[[0, 2, 3]], 1)[0] for sample in base_boot["resid_all"]])
    assert chosen.interval == pytest.approx(percentile_interval(fitted))


def test_a_seed_mean_s_interval_holds_the_spread_between_seeds() -> None:
    """C4's lab line: five seeds whose own resamples do not vary (each seed exactly at its value) still get an
    interval, as wide as the bootstrap of a mean of five says (the resamples' variance is the values' population
    variance over 5, within 5% at 20,000 resamples); seeds that agree get their common interval; two variants on
    the same seeds stay paired (the difference of their seed means is the seed mean of their differences)."""
    values = np.array([0.10, 0.30, 0.20, 0.55, 0.05])
    constant = [Estimate(float(v), torch.full((20_000,), float(v), dtype=torch.float64)) for v in values]
    spread = seed_mean(constant)
    assert spread.value == pytest.approx(values.mean())
    assert float(spread.samples.var()) == pytest.approx(values.var() / len(values), rel=0.05)
    assert spread.interval[0] < values.mean() - 0.05 and spread.interval[1] > values.mean() + 0.05
    one = Estimate(0.2, torch.linspace(0.1, 0.3, 200, dtype=torch.float64))
    torch.testing.assert_close(seed_mean([one] * 5).samples, one.samples)
    others = [Estimate(float(v) / 2, torch.full((20_000,), float(v) / 2, dtype=torch.float64)) for v in values]
    paired = spread.minus(seed_mean(others))
    differences = [Estimate(a.value - b.value, a.samples - b.samples) for a, b in zip(constant, others, strict=True)]
    torch.testing.assert_close(paired.samples, seed_mean(differences).samples)


@pytest.mark.parametrize(
    ("estimate", "threshold", "direction", "says"),
    [
        (even_estimate(1.0, 0.5), 0.2, "above", "supports"),
        (even_estimate(1.0, 0.5), 1.2, "above", "unclear"),
        (even_estimate(1.0, 0.5), 1.6, "above", "contradicts"),
        (even_estimate(-5.0, 1.0), -1.0, "below", "supports"),
        (even_estimate(-1.0, 1.0), -1.0, "below", "unclear"),
        (even_estimate(0.5, 0.2), -1.0, "below", "contradicts"),
    ],
)
def test_an_estimate_supports_contradicts_or_is_unclear(
    estimate: Estimate, threshold: float, direction: str, says: str
) -> None:
    assert estimate.judge(threshold, direction) == says  # type: ignore[arg-type]


@pytest.mark.parametrize("direction", ["above", "below"])
def test_the_p_value_of_a_contradiction_is_where_the_percentile_interval_stops_reaching_the_threshold(
    direction: str,
) -> None:
    """Against numpy's percentile intervals (linear interpolation), at levels just either side of p: the interval
    of level 1 − 2α lies wholly short of the threshold exactly when α > p_short; 0 and 1 at the ends."""
    rng = np.random.default_rng(5)
    for trial in range(50):
        samples = rng.normal(rng.normal(), 1.0, 200)
        threshold = float(rng.normal(0.0, 1.5))
        p = Estimate(0.0, torch.tensor(samples)).p_short(threshold, direction)  # type: ignore[arg-type]
        if p == 0:
            assert _short(samples, threshold, direction, 1e-9), trial
        elif p < 0.5:  # beyond 0.5 "intervals" turn inside out: only the lower end is a test
            assert _short(samples, threshold, direction, p + 1e-9), (trial, p)
            assert not _short(samples, threshold, direction, p - 1e-9), (trial, p)
        else:
            assert not _short(samples, threshold, direction, 0.5 - 1e-9), (trial, p)
    assert Estimate(0.0, torch.tensor([1.0, 2.0, 3.0])).p_short(5.0, "above") == 0.0  # all short
    assert Estimate(0.0, torch.tensor([1.0, 2.0, 3.0])).p_short(0.5, "above") == 1.0  # none


def _short(samples: np.ndarray, threshold: float, direction: str, alpha: float) -> bool:
    """Whether numpy's percentile interval of level 1 − 2α lies wholly short of `threshold`."""
    if direction == "above":
        return bool(np.quantile(samples, 1 - alpha) < threshold)
    return bool(np.quantile(samples, alpha) > threshold)
