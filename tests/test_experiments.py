"""`posleak paper`: each claim's verdict on constructed inputs with a known answer, the sink readers of a model
built with sink heads, and `posleak paper --quick` end to end on the built-in models (one verdict per claim, the
numbers behind it, the tables the issue names, and a report that renders in a real browser)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from browser import check_in_chromium, needs_chromium
from cli import file_stamps, run_cli
from tiny import SINK_T, sink_ids, sink_model, sink_scores

from posleak.analyze import AnalysisResult, AnalyzeConfig, analyze_model
from posleak.data.batches import TokenBatch
from posleak.experiments.paper import (
    _verdict,
    claim_c1,
    claim_c2,
    claim_c3,
    claim_c4,
    claim_c5,
    claim_c6,
    strongest_sink_heads,
)
from posleak.models.load import LoadedModel

CLAIMS = ["C1", "C2", "C3", "C4", "C5", "C6"]
VERDICTS = {"consistent", "not consistent", "inconclusive"}


@pytest.fixture(scope="module")
def paper(tmp_path_factory: pytest.TempPathFactory, zoo_model) -> Path:
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"):
        zoo_model(name)  # fetched (idempotent) before the timed command
    out = tmp_path_factory.mktemp("paper") / "quick"
    proc = run_cli("paper", "--quick", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == CLAIMS
    return out


@pytest.mark.slow
def test_claims_json_has_a_verdict_and_numbers_per_claim(paper: Path) -> None:
    claims = json.loads((paper / "claims.json").read_text())
    assert [c["claim"] for c in claims] == CLAIMS
    for claim in claims:
        assert claim["verdict"] in VERDICTS
        assert claim["numbers"] and claim["criterion"]
    c5 = next(c for c in claims if c["claim"] == "C5")
    assert set(c5["numbers"]) == {"paper", "mean", "random", "zero"}


@pytest.mark.slow
def test_position0_tables(paper: Path) -> None:
    position0 = pd.read_parquet(paper / "position0.parquet")
    assert {"layer", "fingerprint_cos_bos", "fingerprint_cos_nobos"} <= set(position0.columns)
    gemma = position0[position0["model"] == "gemma3-270m"]
    assert (gemma["fingerprint_cos_bos"] > 1 - 1e-6).all()  # constant with the auto-prepended BOS
    assert (gemma["fingerprint_cos_nobos"] < 1 - 1e-3).any()
    readers = pd.read_parquet(paper / "sink_readers.parquet")
    assert list(readers.columns) == ["layer", "head", "sink_score", "effect", "effect_lo", "effect_hi"]
    assert (readers["sink_score"] > 0.3).all() and readers["effect"].is_monotonic_increasing


@pytest.mark.slow
def test_every_run_folder_is_complete(paper: Path) -> None:
    manifest = json.loads((paper / "manifest.json").read_text())
    readers = pd.read_parquet(paper / "sink_readers.parquet")
    folders = sorted((paper / "runs").iterdir())
    # 3 models, 2 NTK factors, Gemma with BOS and 3 replacements, one run per ablated sink head
    assert len(folders) == 9 + len(readers)
    assert set(manifest["runs"].values()) <= {str(folder) for folder in folders}
    for folder in folders:
        assert json.loads((folder / "manifest.json").read_text())["status"] == "complete", folder


@pytest.mark.slow
@needs_chromium
def test_paper_report_renders_in_chromium(paper: Path, tmp_path: Path) -> None:
    assert check_in_chromium(paper / "report.html", tmp_path) >= 6  # a figure per claim at least


@pytest.mark.slow
def test_rerun_resumes_from_finished_runs(paper: Path, smollm2: LoadedModel) -> None:
    """Every analysis is read back, none recomputed: no file under runs/ is written again."""
    finished = file_stamps(paper / "runs")
    proc = run_cli("paper", "--quick", "--out", str(paper))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert file_stamps(paper / "runs") == finished


# ---------------------------------------------------------------------------- verdicts on constructed inputs
# Each claim's criterion (paper.py, declared before the data) applied to inputs built here with a known answer.


def _result(
    per_layer: pd.DataFrame | None = None,
    per_head: pd.DataFrame | None = None,
    profiles: pd.DataFrame | None = None,
    manifest: dict[str, Any] | None = None,
) -> AnalysisResult:
    empty = pd.DataFrame()
    return AnalysisResult(
        per_head if per_head is not None else empty,
        per_layer if per_layer is not None else empty,
        profiles if profiles is not None else empty,
        empty,
        empty,
        empty,
        manifest=manifest or {},
    )


@pytest.mark.parametrize(
    ("consistent", "not_consistent", "verdict"),
    [
        (True, False, "consistent"),
        (True, True, "consistent"),
        (False, True, "not consistent"),
        (False, False, "inconclusive"),
    ],
)
def test_verdict_is_three_way_and_consistent_wins(consistent: bool, not_consistent: bool, verdict: str) -> None:
    """Consistent wins when both conditions hold; neither gives inconclusive."""
    assert _verdict(consistent, not_consistent) == verdict


def _c1_run(resid_all_lo: list[float], mask_all: list[float]) -> AnalysisResult:
    layers = len(mask_all)
    per_layer = pd.DataFrame(
        {"layer": range(layers), "mask_all": mask_all, "resid_all": [0.2] * layers, "resid_all_lo": resid_all_lo}
    )
    per_head = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "dr2_logattn": [0.1, 0.3], "dr2_logit": [0.0, 0.2]})
    return _result(per_layer, per_head)


BOTH = _c1_run([0.1, 0.2, -0.1, 0.0], [0.5, 0.4, 0.3, 0.2])  # resid lower bound > 0 in exactly half the layers
RESID_MISSING = _c1_run([0.1, 0.0, -0.1, 0.0], [0.5, 0.4, 0.3, 0.2])  # only a quarter
MASK_GAP = _c1_run([0.1, 0.2, 0.3, 0.4], [0.5, 0.4, 0.0, 0.2])  # mask component 0 in one layer
NEITHER = _c1_run([0.0, -0.2, -0.1, 0.0], [0.5, 0.0, 0.3, 0.2])


@pytest.mark.parametrize(
    ("runs", "verdict"),
    [
        ({"a": BOTH, "b": _c1_run([0.1] * 4, [0.1] * 4)}, "consistent"),
        ({"a": BOTH, "b": RESID_MISSING}, "inconclusive"),
        ({"a": BOTH, "b": MASK_GAP}, "inconclusive"),
        ({"a": RESID_MISSING}, "inconclusive"),  # a mask component everywhere is not "neither"
        ({"a": NEITHER, "b": NEITHER}, "not consistent"),
        ({"a": NEITHER, "b": BOTH}, "inconclusive"),
    ],
)
def test_claim_c1_verdicts(runs: dict[str, AnalysisResult], verdict: str) -> None:
    """Both components in every model (resid lower bound > 0 in at least half the layers, mask > 0 in all):
    consistent; neither in any model: not consistent; otherwise inconclusive."""
    claim = claim_c1(runs)
    assert claim.verdict == verdict
    assert claim.numbers["a"]["layers_with_resid_lo_above_0"] == pytest.approx(
        float((runs["a"].per_layer["resid_all_lo"] > 0).mean())
    )
    assert claim.numbers["a"]["dr2_logattn_median"] == pytest.approx(0.2)


C2_EARLY = 8


def _c2_run(mask_lo_positive: int, falling: int, layers: int = 10) -> AnalysisResult:
    """`mask_lo_positive` layers with mask_early_lo > 0 and `falling` layers where m(i), the mean over two heads,
    falls over the early queries 0 ≤ i < 8. Beyond them m rises steeply in every layer, so a trend over all
    queries would rise."""
    per_layer = pd.DataFrame(
        {"layer": range(layers), "mask_early_lo": [0.1 if k < mask_lo_positive else 0.0 for k in range(layers)]}
    )
    rows = []
    for layer in range(layers):
        sign = -1.0 if layer < falling else 1.0
        for head, (slope, offset) in enumerate([(3.0, 0.0), (-0.5, 1.0)]):  # head 1 alone runs the other way
            for i in range(2 * C2_EARLY):
                m = sign * slope * np.log1p(i) + offset if i < C2_EARLY else 10.0 + i
                rows.append({"layer": layer, "head": head, "q_lo": i, "q_hi": i, "m": m})
    return _result(per_layer, profiles=pd.DataFrame(rows), manifest={"early": C2_EARLY})


@pytest.mark.parametrize(
    ("runs", "verdict", "shares"),
    [
        ({"a": _c2_run(10, 10), "b": _c2_run(9, 9)}, "consistent", (1.0, 1.0)),  # 90% is enough
        ({"a": _c2_run(10, 10), "b": _c2_run(8, 10)}, "inconclusive", (1.0, 1.0)),
        ({"a": _c2_run(10, 10), "b": _c2_run(10, 8)}, "inconclusive", (1.0, 1.0)),
        ({"a": _c2_run(4, 10), "b": _c2_run(10, 4)}, "not consistent", (0.4, 1.0)),
        ({"a": _c2_run(4, 10), "b": _c2_run(10, 10)}, "inconclusive", (0.4, 1.0)),
    ],
)
def test_claim_c2_verdicts(runs: dict[str, AnalysisResult], verdict: str, shares: tuple[float, float]) -> None:
    """Early mask bound > 0 and m(i) falling (early queries only, mean over heads) in ≥ 90% of layers of every
    model: consistent; either share below 50% in every model: not consistent; otherwise inconclusive."""
    claim = claim_c2(runs)
    assert claim.verdict == verdict
    numbers = claim.numbers["a"]
    assert (numbers["layers_mask_early_lo_above_0"], numbers["layers_m_falling"]) == pytest.approx(shares)


def _c3_run(holds: bool, spread: float = 1e-7) -> AnalysisResult:
    return _result(manifest={"closed_system": {"holds": holds, "max_rel_spread": spread}})


def _readers(*intervals: tuple[float, float]) -> pd.DataFrame:
    rows = [
        {"layer": k, "head": 1, "sink_score": 0.9, "effect": (lo + hi) / 2, "effect_lo": lo, "effect_hi": hi}
        for k, (lo, hi) in enumerate(intervals)
    ]
    return pd.DataFrame(rows, columns=["layer", "head", "sink_score", "effect", "effect_lo", "effect_hi"])


@pytest.mark.parametrize(
    ("holds", "readers", "verdict", "lowering"),
    [
        ([True, True], _readers((-30.0, -10.0), (-5.0, 4.0)), "consistent", 1),
        ([True, False], _readers((-30.0, -10.0)), "not consistent", 1),  # the closed system failed somewhere
        ([True, True], _readers((2.0, 9.0), (1.0, 3.0)), "not consistent", 0),  # every ablation raises it
        ([True, True], _readers((-5.0, 4.0), (2.0, 9.0)), "inconclusive", 0),
        ([True, True], _readers(), "inconclusive", 0),  # no sink head to ablate
    ],
)
def test_claim_c3_verdicts(holds: list[bool], readers: pd.DataFrame, verdict: str, lowering: int) -> None:
    """Closed system everywhere and one ablation interval below 0: consistent; a closed-system failure or every
    interval above 0: not consistent; otherwise inconclusive."""
    runs = [_c3_run(h, spread) for h, spread in zip(holds, (1e-7, 3e-2), strict=True)]
    claim = claim_c3(runs, readers)
    assert claim.verdict == verdict
    assert claim.numbers["closed_system_holds_in_all_runs"] == all(holds)
    assert claim.numbers["closed_system_max_rel_spread"] == 3e-2
    assert claim.numbers["sink_heads_whose_ablation_lowers_later_resid"] == lowering


def _effect_rows(overall: tuple[float, float, float], layer0: tuple[float, float, float]) -> pd.DataFrame:
    """An effect table whose overall row (layer −1) has (pct_change, pct_lo, pct_hi) `overall` for every measure and
    whose layer-0 row has `layer0`."""
    rows = [
        {"layer": layer, "measure": measure, "pct_change": pct[0], "pct_lo": pct[1], "pct_hi": pct[2]}
        for measure in ("mask_early", "mask_all", "resid_early", "resid_all")
        for layer, pct in ((0, layer0), (-1, overall))
    ]
    return pd.DataFrame(rows)


LOWERS, RAISES = (-30.0, -45.0, -12.0), (10.0, 2.0, 20.0)


def _summary(slope: float, spearman: float) -> pd.DataFrame:
    """The comparison table: the sliding-window run, and another run with the opposite trend."""
    return pd.DataFrame(
        {
            "run": ["gemma (sliding)", "smollm2"],
            "resid_all_slope": [slope, -slope],
            "resid_all_spearman": [spearman, -spearman],
            "mask_share_all": [0.7, 0.8],
        }
    )


@pytest.mark.parametrize(
    ("ntk", "summary", "verdict"),
    [
        ({4.0: _effect_rows(RAISES, RAISES), 16.0: _effect_rows(LOWERS, RAISES)}, _summary(0.01, 0.5), "consistent"),
        ({4.0: _effect_rows(LOWERS, LOWERS), 16.0: _effect_rows(RAISES, LOWERS)}, _summary(0.01, 0.5), "inconclusive"),
        ({16.0: _effect_rows(LOWERS, LOWERS)}, _summary(0.01, 0.3), "inconclusive"),  # ρ must exceed 0.3
        ({16.0: _effect_rows(LOWERS, LOWERS)}, _summary(0.0, 0.9), "inconclusive"),  # and the slope 0
        (
            {4.0: _effect_rows(LOWERS, LOWERS), 16.0: _effect_rows(RAISES, LOWERS)},
            _summary(-0.01, 0.5),
            "not consistent",
        ),
    ],
)
def test_claim_c4_verdicts(ntk: dict[float, pd.DataFrame], summary: pd.DataFrame, verdict: str) -> None:
    """(a) is judged on the largest NTK factor's overall row, (b) on the sliding-window run's trend."""
    claim = claim_c4(summary, ntk, "gemma (sliding)")
    assert claim.verdict == verdict
    assert claim.numbers["sliding_resid_spearman"] == summary["resid_all_spearman"].iloc[0]
    largest = max(ntk)
    overall = ntk[largest].set_index(["measure", "layer"]).loc[("resid_all", -1)]
    expected = {name: overall[name] for name in ("pct_change", "pct_lo", "pct_hi")}
    assert claim.numbers["ntk_effect_on_resid_all"][str(largest)] == pytest.approx(expected)


def _bos_effect(pct_change: float, pct_lo: float, pct_hi: float) -> pd.DataFrame:
    """An effect table whose overall resid_early row is the given change; a layer row that would meet the paper."""
    return _effect_rows((pct_change, pct_lo, pct_hi), (-40.0, -45.0, -35.0))


@pytest.mark.parametrize(
    ("effects", "verdict"),
    [
        ({"mean": _bos_effect(-40, -55, -25), "zero": _bos_effect(-5, -8, -2)}, "consistent"),  # removed 25..55%
        ({"mean": _bos_effect(-15, -20, -10)}, "consistent"),  # removed 10..20%: touches [20, 60]
        ({"mean": _bos_effect(-5, -8, -2), "zero": _bos_effect(-70, -80, -65)}, "not consistent"),  # 2..8%, 65..80%
        ({"mean": _bos_effect(5, 2, 10)}, "not consistent"),  # a rise: no reduction at all
        ({"mean": _bos_effect(-12, -30, 5), "zero": _bos_effect(-5, -8, -2)}, "inconclusive"),  # −5..30%: includes 0
    ],
)
def test_claim_c5_verdicts(effects: dict[str, pd.DataFrame], verdict: str) -> None:
    """removed = −(overall % change of resid_early), its interval the negated, swapped bounds."""
    claim = claim_c5(effects)
    assert claim.verdict == verdict
    for kind, effect in effects.items():
        change, lo, hi = effect[(effect["layer"] == -1) & (effect["measure"] == "resid_early")].iloc[0][
            ["pct_change", "pct_lo", "pct_hi"]
        ]
        assert claim.numbers[kind] == pytest.approx({"removed": -change, "removed_lo": -hi, "removed_hi": -lo})


def _fingerprint(bos: list[float], nobos: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"layer": range(len(bos)), "fingerprint_cos_bos": bos, "fingerprint_cos_nobos": nobos})


CONSTANT_AND_VARYING = _fingerprint([1.0, 0.9999, 1.0], [1.0, 0.95, 0.989])
NOT_CONSTANT = _fingerprint([1.0, 0.9998, 1.0], [1.0, 0.95, 0.98])
NOT_VARYING = _fingerprint([1.0, 1.0, 1.0], [1.0, 0.99, 0.995])


@pytest.mark.parametrize(
    ("fingerprints", "verdict"),
    [
        ({"a": CONSTANT_AND_VARYING, "b": CONSTANT_AND_VARYING}, "consistent"),
        ({"a": CONSTANT_AND_VARYING, "b": NOT_VARYING}, "inconclusive"),
        ({"a": NOT_CONSTANT, "b": NOT_VARYING}, "not consistent"),
        ({"a": NOT_CONSTANT, "b": CONSTANT_AND_VARYING}, "inconclusive"),
    ],
)
def test_claim_c6_verdicts(fingerprints: dict[str, pd.DataFrame], verdict: str) -> None:
    """cos ≥ 0.9999 in every layer with BOS and < 0.99 somewhere without, in every model: consistent; either
    failing in every model: not consistent; otherwise inconclusive."""
    claim = claim_c6(fingerprints)
    assert claim.verdict == verdict
    a = fingerprints["a"]
    assert claim.numbers["a"]["min_cos_with_bos"] == a["fingerprint_cos_bos"].min()
    assert claim.numbers["a"]["min_cos_without_bos"] == a["fingerprint_cos_nobos"].min()


# ------------------------------------------------------------------------- sink readers of a model built with them

# α_0 at T = 32 (tests/tiny.py): (0, 0) 0.995, (0, 1) 0.269 (below ε = 0.3), (0, 2) 0.341, (1, 3) 0.962,
# (2, 1) 0.999 (in the last layer); every other head 0.099.
SINK_LOGITS = {(0, 0): 8.0, (0, 1): 1.4, (0, 2): 1.8, (1, 3): 6.0, (2, 1): 10.0}


def _per_head(logits: dict[tuple[int, int], float]) -> pd.DataFrame:
    ids = sink_ids()
    batch = TokenBatch(ids, "verbatim", None, ids[:, 0].clone(), source="test", source_name="test", seed=None)
    config = AnalyzeConfig(seq_len=SINK_T, num_seqs=batch.num_seqs, bootstrap=0)
    return analyze_model(sink_model(logits), batch, config, model_id="sink-lab", progress=False).per_head


@pytest.mark.parametrize(
    ("logits", "count", "expected"),
    [
        (SINK_LOGITS, 10, [(0, 0), (1, 3), (0, 2)]),  # by sink score; (2, 1) is in the last layer
        (SINK_LOGITS, 2, [(0, 0), (1, 3)]),
        # The last layer without a sink head: layer 1's sink head has a later layer and stays a candidate.
        ({k: v for k, v in SINK_LOGITS.items() if k != (2, 1)}, 10, [(0, 0), (1, 3), (0, 2)]),
    ],
)
def test_sink_readers_are_the_strongest_sink_heads_before_the_last_layer(
    logits: dict[tuple[int, int], float], count: int, expected: list[tuple[int, int]]
) -> None:
    """The heads `posleak paper` ablates for C3: sink heads (α_0 > 0.3) outside the model's last layer, strongest
    first, at most `count`, on a real analysis of a model whose sink heads are known by construction."""
    per_head = _per_head(logits)
    chosen = strongest_sink_heads(per_head, count)
    assert list(zip(chosen["layer"], chosen["head"], strict=True)) == expected
    analytic = sink_scores(logits, layers=3)
    np.testing.assert_allclose(
        chosen["sink_score"], [float(analytic[layer, head]) for layer, head in expected], atol=1e-6
    )
