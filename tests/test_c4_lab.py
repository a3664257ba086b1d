"""C4's lab line judged once (issue 44): its lines on synthetic lab runs whose slopes, levels and sink scores are
set, each line deciding only where its models can test the claim; the rule that joins a claim's samples with a
part judged once; and claims.json, pages and corpora carrying that part once. Last, the lab line at tiny size: the
lab decoder trained three ways and analysed, its slopes against numpy's least squares."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from constructed import VERDICTS

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.experiments.evidence import Estimate, depth_slope
from posleak.experiments.paper import QUICK, render
from posleak.experiments.paper.claims.c4.lab import LAB, LabRuns, claim_c4_lab, lab_runs
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.corpora import side_by_side
from posleak.experiments.paper.plan import LabBudget
from posleak.experiments.paper.reproduction import Reproduction
from posleak.experiments.paper.thresholds import MIN_MAGNITUDE
from posleak.experiments.paper.verdict import Claim, Judgement, can_test, evidence_row, judge, once_verdict
from posleak.pipeline import AnalysisResult
from posleak.store import write_json

RESAMPLES = 400
LAYERS = 8
SINK = 0.9  # α₀ of a lab model's sink head where it has one
NO_SINK = 0.07  # the largest α₀ make run's lab models reached (0.04–0.08)


def _run(resid_all: np.ndarray, resid_beyond: np.ndarray, sink: float, seed: int) -> AnalysisResult:
    """A lab analysis: per-layer magnitudes as given, resample r of layer l scaled by (1 + 0.01·z_rl), and two heads
    whose largest sink score is `sink`."""
    rng = np.random.default_rng(seed)
    values = {"resid_all": resid_all, "resid_beyond": resid_beyond}
    boot = {name: v * (1 + 0.01 * rng.standard_normal((RESAMPLES, LAYERS))) for name, v in values.items()}
    bootstrap = pd.DataFrame(
        {
            "resample": np.repeat(np.arange(RESAMPLES), LAYERS),
            "layer": np.tile(np.arange(LAYERS), RESAMPLES),
            **{name: b.ravel() for name, b in boot.items()},
        }
    )
    per_layer = pd.DataFrame({"layer": range(LAYERS), **values})
    per_head = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "sink_score": [sink, 0.02]})
    empty = pd.DataFrame()
    return AnalysisResult(per_head, per_layer, empty, empty, empty, bootstrap, manifest={})


def _lab(
    slopes: dict[str, list[float]],
    level: dict[str, float] | None = None,
    beyond: dict[str, list[float]] | None = None,
    sinks: dict[str, float] | None = None,
) -> LabRuns:
    """Lab runs with the given slopes of resid_all against relative depth (one per seed) from a level of 0.5 (or
    `level`), resid_beyond the same unless `beyond` gives its own, and a sink head of α₀ SINK unless `sinks` says."""
    depth = np.linspace(0, 1, LAYERS)
    runs = {}
    for k, (variant, seeds) in enumerate(slopes.items()):
        start = (level or {}).get(variant, 0.5)
        sink = (sinks or {}).get(variant, SINK)
        past = (beyond or slopes)[variant]
        runs[variant] = [
            _run(start + slope * depth, start + past[i] * depth, sink, seed=10 * k + i) for i, slope in enumerate(seeds)
        ]
    return LabRuns(runs)


# window > rope > rope under NTK at inference, which also lowers the level (0.5 → 0.4: −20%)
ORDER = {"rope": [0.2, 0.25], "window": [0.6, 0.5], "large-base": [0.2, 0.2], "ntk": [0.0, -0.05]}
LOWER = {"ntk": 0.4}


@pytest.mark.parametrize(
    ("lab", "verdict"),
    [
        (_lab(ORDER, LOWER), "consistent"),
        (_lab({**ORDER, "window": [-0.3, -0.2]}, LOWER), "not consistent"),  # the window model flattens
        # steeper over all queries, flatter past its window: the window line reads past the window
        (_lab(ORDER, LOWER, beyond={**ORDER, "window": [-0.3, -0.2]}), "not consistent"),
        (_lab({**ORDER, "rope": [0.2, 0.45], "window": [0.6, 0.4]}, LOWER), "inconclusive"),  # a seed pair crosses
        (_lab(ORDER, {"ntk": 0.9}), "not consistent"),  # NTK at inference raises the level (+45%)
        # the large-base model reverses everything it is compared on, and decides nothing: it is not NTK scaling
        (_lab({**ORDER, "large-base": [0.9, 0.95]}, {**LOWER, "large-base": 0.9}), "consistent"),
    ],
)
def test_the_lab_s_lines_decide_each_way_where_its_models_can_test(lab: LabRuns, verdict: str) -> None:
    """Models with a sink head and resid_all far above C1's threshold: the lab's own verdict goes either way."""
    judgement = claim_c4_lab(lab)
    assert judgement.verdict == verdict and can_test(judgement) and lab.untestable() == {}
    deciding = judgement.evidence.loc[judgement.evidence["deciding"], "evidence"]
    assert list(deciding) == [
        "(3) lab slope beyond the window: window − rope",
        "(3) lab slope: rope − NTK at inference",
        "(4) lab: NTK at inference against none, resid_all",
    ]


def test_a_lab_line_whose_models_lack_the_mechanism_is_untestable_and_decides_nothing() -> None:
    """No sink head (α₀ ≤ 0.3) in some seed's model, or a resid_all interval not above 0.05 nats: the line reports,
    names why, and leaves the verdict; the other line still decides. Each variant's testability is its weakest
    seed's largest α₀ and the seed mean of its layer-mean resid_all."""
    no_sinks = _lab(ORDER, LOWER, sinks=dict.fromkeys(ORDER, NO_SINK))
    judgement = claim_c4_lab(no_sinks)
    assert not can_test(judgement) and once_verdict(judgement) == "not testable"
    assert set(no_sinks.untestable()) == {"window", "NTK at inference"}
    untestable = judgement.evidence[judgement.evidence["evidence"].str.contains("untestable")]
    assert len(untestable) == 2 and not untestable["deciding"].any()
    rows = judgement.evidence.set_index("evidence")
    assert rows.loc["lab rope: largest α₀, weakest seed", "value"] == pytest.approx(NO_SINK)
    # a component at C1's threshold: 0.05 nats, its interval not above it
    faint = _lab({v: [0.0, 0.0] for v in ORDER}, dict.fromkeys(ORDER, MIN_MAGNITUDE))
    assert set(faint.untestable()) == {"window", "NTK at inference"}
    assert faint.testability("rope").resid.value == pytest.approx(MIN_MAGNITUDE)
    # one seed of the window model without a sink head: the window line leaves, the NTK line (rope's) decides
    window_off = _lab({**ORDER, "window": [-0.3, -0.2]}, LOWER)
    window_off.runs["window"][1].per_head["sink_score"] = [SINK_THRESHOLD, 0.02]
    judgement = claim_c4_lab(window_off)
    assert list(window_off.untestable()) == ["window"]
    rows = judgement.evidence.set_index("evidence")
    assert not rows.loc["(3) lab slope beyond the window: window − rope", "deciding"]
    assert rows.loc["(3) lab slope beyond the window: window − rope", "says"] == "contradicts"  # reported only
    assert judgement.verdict == "consistent"  # on the NTK line alone


def _judged(verdict: str, name: str = "(3) lab slope") -> Judgement:
    """A judgement with one deciding row, `name`, that gives `verdict`, or, for "not testable", only a reported
    row."""
    if verdict == "not testable":
        reported = evidence_row(
            "lab window line: untestable (no sink head)", _estimate(0.0, 1.0), 0.0, "above", "", False
        )
        return judge([reported])
    centre = {"consistent": 1.0, "not consistent": -1.0, "inconclusive": 0.0}[verdict]
    return judge([evidence_row(name, _estimate(centre, 0.5), 0.0, "above", "nats per depth")])


def _estimate(centre: float, half_width: float) -> Estimate:
    return Estimate(centre, torch.linspace(centre - half_width, centre + half_width, 1001, dtype=torch.float64))


@pytest.mark.parametrize(
    ("a", "b", "lab", "verdict"),
    [
        ("consistent", "consistent", "consistent", "consistent"),
        ("consistent", "consistent", "not consistent", "not consistent"),  # the lab contradicts
        ("not consistent", "not consistent", "consistent", "not consistent"),  # the samples do
        ("consistent", "consistent", "inconclusive", "inconclusive"),
        ("consistent", "inconclusive", "consistent", "inconclusive"),  # the samples do not replicate
        ("consistent", "not consistent", "not consistent", "not consistent"),
        # a lab that cannot test leaves the samples' verdict, whatever it is
        ("consistent", "consistent", "not testable", "consistent"),
        ("not consistent", "not consistent", "not testable", "not consistent"),
        ("inconclusive", "inconclusive", "not testable", "inconclusive"),
    ],
)
def test_a_claim_joins_its_samples_with_the_part_judged_once(a: str, b: str, lab: str, verdict: str) -> None:
    """Consistent only where the replicated samples and every part judged once that can test are consistent, not
    consistent where any is, inconclusive otherwise; claims.json states the joined verdict and the lab's own."""
    claim = _claim({"A": a, "B": b}, lab)
    assert _judged(a).verdict == a and (lab == "not testable" or _judged(lab).verdict == lab)
    assert claim.samples_verdict == (a if a == b else "inconclusive")
    assert claim.verdict == verdict
    entry = claim.to_json()
    assert entry["verdict"] == verdict and entry["once"][LAB]["verdict"] == lab


def _claim(samples: dict[str, str], lab: str | None) -> Claim:
    """C4 with a judgement of each sample's verdict, and the lab judged once as `lab` (None: judged nothing once)."""
    judged = {s: _judged(v, "(1) NTK at inference") for s, v in samples.items()}
    claim = Claim("C4", "statement", "criterion", judged, "method")
    if lab is not None:
        claim.once = {LAB: _judged(lab)}
        claim.numbers = {LAB: {"untestable": {"window": ["rope: no sink head"]} if lab == "not testable" else {}}}
    return claim


@pytest.mark.parametrize("lab", ["consistent", "not testable"])
def test_claims_json_keeps_the_part_judged_once_and_the_pages_show_it_once(tmp_path: Path, lab: str) -> None:
    """Written and read back: the verdict, the lab's verdict and evidence, its numbers (what cannot test); the page
    shows the lab's evidence once, the samples' evidence none of it, the verdict table names the lab's verdict."""
    claim = _claim({"A": "consistent", "B": "consistent"}, lab)
    path = tmp_path / "claims.json"
    write_json(path, [claim.to_json()], default=float)
    [back] = render.read_claims(path)
    assert back.verdict == claim.verdict == "consistent"
    assert list(back.once) == [LAB] and once_verdict(back.once[LAB]) == lab
    pd.testing.assert_frame_equal(back.once[LAB].evidence, claim.once[LAB].evidence, check_dtype=False)
    assert back.numbers == json.loads(json.dumps(claim.numbers))
    page = render.results_page([back], Path("docs/results/claims.json"), [])
    lab_row = claim.once[LAB].evidence["evidence"].iloc[0]
    assert page.count(f"Judged once, {LAB} ({lab}):") == 1 and page.count(f"| {lab_row} |") == 1
    assert f"{LAB}, judged once: {lab}" in render.verdict_table([back])


def test_an_older_claims_json_without_a_part_judged_once_reads_back_as_before(tmp_path: Path) -> None:
    """A file written before `once` existed: the claim judges nothing once, its verdict is its samples', and the
    page says nothing of parts judged once."""
    entry = _claim({"A": "consistent", "B": "inconclusive"}, None).to_json()
    del entry["once"]
    path = tmp_path / "claims.json"
    write_json(path, [entry], default=float)
    [back] = render.read_claims(path)
    assert back.once == {} and back.verdict == "inconclusive"
    page = render.results_page([back], Path("docs/results/claims.json"), [])
    assert "judged once" not in page.lower()


def test_on_two_corpora_the_lab_is_judged_once_not_per_corpus() -> None:
    """The corpora's claims joined side by side: each corpus's samples, the lab once (its numbers too, unprefixed),
    and the joined verdict the rule of the corpora and then the lab's."""
    per_corpus = {name: [_claim({"A": "consistent", "B": "consistent"}, "not consistent")] for name in ("x", "y")}
    for name, (claim,) in per_corpus.items():
        claim.corpora = {name: {"samples": ["A", "B"]}}
    [joined] = side_by_side(per_corpus)
    assert list(joined.samples) == ["x A", "x B", "y A", "y B"] and list(joined.once) == [LAB]
    assert set(joined.numbers) == {LAB}
    assert joined.samples_verdict == "consistent" and joined.verdict == "not consistent"


@pytest.mark.slow
def test_the_lab_line_of_c4_trains_one_decoder_three_ways_at_tiny_size(tmp_path: Path) -> None:
    """C4's controlled line at tiny size: the 8-layer lab decoder trained with full causal RoPE, a sliding window of
    T/4 and a large base, 2 seeds each, every model analysed, the RoPE ones again under NTK scaling at inference;
    the slopes the criterion judges equal numpy's least squares on each run's own per-layer table; the lab's
    criterion runs on them."""
    tiny = replace(QUICK, lab=LabBudget(steps=8, seq_len=16, seeds=(0, 1), analyze_seqs=4), bootstrap=20)
    plan = tiny.with_option(C4Options, ntk_factors=(16.0,), lab_large_base=True)  # --quick leaves the large base out
    lab = lab_runs(Reproduction(tmp_path / "paper", plan, progress=False))
    counts = {variant: len(runs) for variant, runs in lab.runs.items()}
    assert counts == {"rope": 2, "window": 2, "large-base": 2, "ntk": 2}
    for runs in lab.runs.values():
        for run in runs:
            per_layer = run.per_layer.sort_values("layer")
            assert len(per_layer) == 8
            assert run.manifest["measurement"]["beyond"] == 4  # every variant measured past the window's 4
            expected = np.polyfit(np.linspace(0, 1, 8), per_layer["resid_all"], 1)[0]
            assert depth_slope(run, "resid_all").value == pytest.approx(expected)
    models = (tmp_path / "paper" / "lab" / "models").glob("*/config.json")
    configs = [json.loads(path.read_text()) for path in models]
    built = sorted(
        (c["num_hidden_layers"], c["rope_scale_kind"], c["rope_factor"], c["sliding_window"] or 0) for c in configs
    )
    # the NTK line's trials reuse the rope models: NTK scaling at inference trains nothing
    assert built == [(8, "none", 1.0, 0)] * 2 + [(8, "none", 1.0, 4)] * 2 + [(8, "ntk", 16.0, 0)] * 2
    # ... and analyse them scaled at evaluation, by the largest NTK factor
    rows = [json.loads(path.read_text())["row"] for path in (tmp_path / "paper" / "lab").glob("trials/*/complete.json")]
    scaled = sorted((row["name"], row["rope_scaling"], row["eval_overrides"]) for row in rows if row["eval_overrides"])
    assert scaled == [("ntk", "none", '{"rope_factor": 16.0, "rope_scale_kind": "ntk"}')] * 2
    judgement = claim_c4_lab(lab)
    assert judgement.verdict in VERDICTS
    expected = {"(3) lab slope beyond the window: window − rope", "(4) lab: NTK at inference against none, resid_all"}
    assert expected <= set(judgement.evidence["evidence"])
