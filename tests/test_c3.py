"""C3 on constructed inputs with a known answer: each unit's questions from its own runs, the claim over its units,
a model built with sink heads that write nothing; and the sink heads and matched controls `posleak paper`
ablates, on a model built with them and against a brute force."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from constructed import even_estimate
from tiny import SINK_T, sink_ids, sink_model, sink_scores

from posleak.data.batches import TokenBatch
from posleak.experiments.evidence import Estimate, percent_change
from posleak.experiments.paper.claims.c3.claim import claim_c3, over_units, question_verdicts
from posleak.experiments.paper.claims.c3.heads import CLOCK, head_list, heads_by_layer, matched_controls, sink_heads
from posleak.experiments.paper.claims.c3.units import Design, unit_rows
from posleak.interventions import AblateSinkValues, HoldSinkClock, Interventions, PatchKv0
from posleak.pipeline import AnalysisResult, AnalyzeConfig, analyze_model, prepared_model

CLOSED, OPEN = {"run": 0.0}, {"run": 0.02}
LOWERS = even_estimate(-25.0, 2.0)  # beyond both questions' thresholds (10.6% and 1%)
SLIGHTLY = even_estimate(-5.0, 1.0)  # beyond 1% but leaving 95% of the component: not on (a)'s scale
QUIET = even_estimate(-0.2, 0.3)  # a control's change: no lowering beyond 1%
RAISES = even_estimate(0.5, 0.3)


def _unit(clock: Estimate, patch: Estimate, controls: list[Estimate] | None = None, full: bool = True) -> dict:
    """A unit's changes by run name: the clock removal (a) and the K/V patch (b) of the sinks and of each control
    (here the same change for both questions), and (full) the reported runs."""
    controls = [QUIET, even_estimate(0.1, 0.3)] if controls is None else controls
    changes = {}
    for run, sinks in (("clock", clock), ("kv0", patch)):
        changes |= {f"{run}-sinks": sinks, **{f"{run}-control{k}": c for k, c in enumerate(controls)}}
    if full:
        reported = {"ablate-sinks": even_estimate(2.0, 1.0), "ablate-sinks-mean": even_estimate(3.0, 1.0)}
        changes |= reported | {"ablate-control0": QUIET, "patch-pos0": LOWERS}
    return changes


BOTH = _unit(LOWERS, LOWERS)
CLOCK_ONLY = _unit(LOWERS, RAISES)  # position carried by the clock; another token's trajectory changes nothing
CONTENT_ONLY = _unit(RAISES, LOWERS)
OUTDONE = _unit(LOWERS, LOWERS, [even_estimate(-35.0, 1.0)], full=False)  # a layer-matched control lowers it more
UNCLEAR = _unit(even_estimate(-11.0, 2.0), even_estimate(-1.5, 1.0))  # −13 to −9, −2.5 to −0.5: each maybe short
MOVES_ONLY = _unit(SLIGHTLY, SLIGHTLY)  # the sinks' edits move the component by 5%: (a) not consistent, (b) is
YES, NO, OPEN_Q = "consistent", "not consistent", "inconclusive"


@pytest.mark.parametrize(
    ("changes", "verdicts"),
    [
        (BOTH, {"a": YES, "b": YES}),
        (CLOCK_ONLY, {"a": YES, "b": NO}),
        (CONTENT_ONLY, {"a": NO, "b": YES}),
        (OUTDONE, {"a": NO, "b": NO}),
        (UNCLEAR, {"a": OPEN_Q, "b": OPEN_Q}),
        (MOVES_ONLY, {"a": NO, "b": YES}),
        ({}, {"a": "untestable", "b": "untestable"}),  # no sink head, or no matched control: cannot test either
    ],
)
def test_a_c3_unit_answers_each_question_from_its_own_runs(changes: dict[str, Estimate], verdicts: dict) -> None:
    """A unit's verdict on each question: its edit of the sink heads below the question's threshold ((a) 10.6%,
    a fifth of the squared component: a 5% lowering leaves 95% and is not consistent; (b) 1%) and below each
    matched control; the value ablation (here raising the magnitude) and the position-0 patch are reported, never
    deciding. Every row names its unit and its question."""
    rows = _unit_rows("m", changes)
    assert question_verdicts({"m": rows}) == {"m": verdicts}
    assert all(r["evidence"].startswith(f"m: ({q})") for q in "ab" for r in rows[q] if r["deciding"])
    draws = [k for k in range(len(changes)) if f"clock-control{k}" in changes]
    for q, what in (("a", "clock removal"), ("b", "K/V patch")):
        deciding = [r["evidence"] for r in rows[q] if r["deciding"]]
        expected = [f"m: ({q}) {what} of sink heads: change", *(f"m: ({q}) {what} − control {k}" for k in draws)]
        assert deciding == expected or not changes
    reported = {r["evidence"] for r in rows["b"] if not r["deciding"]}
    assert {
        "m: value ablation (zero): change",
        "m: position-0 patch: change",
    } <= reported or "ablate-sinks" not in changes


def _unit_rows(label: str, changes: dict[str, Estimate]) -> dict[str, list[dict[str, Any]]]:
    """A unit's rows; no runs stand for a unit that cannot test C3 (here: no sink heads)."""
    return unit_rows(label, changes, None if changes else "untestable, no sink heads (α₀ > 0.3)")


@pytest.mark.parametrize(
    ("closed", "units", "verdict", "questions"),
    [
        (CLOSED, [BOTH, BOTH, BOTH], YES, {"a": YES, "b": YES}),
        (OPEN, [BOTH, BOTH, BOTH], NO, {"a": YES, "b": YES}),  # the closed system fails
        # the sinks carry position whatever trajectory they read: the claim holds, (b) says the content does not matter
        (CLOSED, [CLOCK_ONLY, CLOCK_ONLY, BOTH], YES, {"a": YES, "b": NO}),
        (CLOSED, [CONTENT_ONLY, BOTH, BOTH], OPEN_Q, {"a": OPEN_Q, "b": YES}),  # one model against (a)
        (CLOSED, [CONTENT_ONLY, OUTDONE, BOTH], NO, {"a": NO, "b": OPEN_Q}),  # a majority against (a)
        (CLOSED, [CONTENT_ONLY, OUTDONE, BOTH, BOTH], OPEN_Q, {"a": OPEN_Q, "b": OPEN_Q}),  # half is not more
        (CLOSED, [BOTH, UNCLEAR, BOTH], OPEN_Q, {"a": OPEN_Q, "b": OPEN_Q}),
        # a unit that cannot test (no sink heads) is left out: the claim is judged on those that can, either way
        (CLOSED, [BOTH, {}, BOTH], YES, {"a": YES, "b": YES}),
        (CLOSED, [CONTENT_ONLY, {}, {}], NO, {"a": NO, "b": YES}),
        (CLOSED, [{}, {}], OPEN_Q, {"a": OPEN_Q, "b": OPEN_Q}),  # no unit can test: never vacuously consistent
    ],
)
def test_claim_c3_verdicts(closed: dict[str, float], units: list[dict], verdict: str, questions: dict) -> None:
    """The claim from the closed system and question (a) over its units, and each question's own verdict
    (docs/method.md §13): consistent when all units are, not consistent when more than half are not. Every unit's
    rows of both questions are in the evidence under its label; only the closed system's and (a)'s decide."""
    rows = {f"u{k}": _unit_rows(f"u{k}", changes) for k, changes in enumerate(units)}
    judgement = claim_c3(closed, rows)
    assert judgement.verdict == verdict
    by_unit = question_verdicts(rows)
    assert {q: over_units(v[q] for v in by_unit.values()) for q in "ab"} == questions
    evidence = judgement.evidence
    assert {e.split(":")[0] for e in evidence["evidence"]} - {"closed system"} == set(rows)
    deciding = evidence.loc[evidence["deciding"], "evidence"]
    assert all(e.startswith("closed system") or ": (a) " in e for e in deciding)
    assert not deciding.str.contains("untestable").any()
    assert evidence["evidence"].str.contains(": \\(b\\) ").any()


def test_claim_c3_on_a_model_whose_sink_heads_write_nothing() -> None:
    """A model built with sink heads whose outputs are zeroed (tests/tiny.py): removing their clock, patching their
    key and value at key 0, or ablating the value, cannot change anything downstream, so the measured change is
    exactly 0 and the unit is not consistent on either question. Each edit ran: the run's manifest records it and
    the heads edited are the model's sink heads."""
    ids = sink_ids()
    batch = TokenBatch(ids, "verbatim", None, ids[:, 0].clone(), source="test", source_name="test", seed=None)
    config = AnalyzeConfig(seq_len=SINK_T, num_seqs=batch.num_seqs, bootstrap=50)
    model = sink_model(SINK_LOGITS)
    baseline = analyze_model(prepared_model(model, batch, config.analysis, "sink-lab"), progress=False)
    sinks = sink_heads(baseline.per_head)
    later = [layer for layer in baseline.per_layer["layer"] if layer > sinks["layer"].min()]
    changes = {}
    for name, edit in (
        ("clock-sinks", Interventions(HoldSinkClock(head_list(sinks)))),
        ("kv0-sinks", Interventions(PatchKv0("id:5", head_list(sinks)))),
        ("ablate-sinks", Interventions(AblateSinkValues(head_list(sinks)))),
    ):
        run = analyze_model(
            prepared_model(model, batch, config.replace(interventions=edit).analysis, "sink-lab"), progress=False
        )
        assert set(run.manifest["interventions"][0].values()) & {"0.0,1.3,0.2"}
        changes[name] = percent_change(baseline, run, "resid_all", later)
        assert changes[name].value == 0.0 and changes[name].interval == (0.0, 0.0)
    unchanged = percent_change(baseline, baseline, "resid_all", later)
    deciding = {k: changes[k] for k in ("clock-sinks", "kv0-sinks")} | {"clock-control0": unchanged}
    rows = unit_rows("m", deciding | {"kv0-control0": unchanged})
    assert question_verdicts({"m": rows}) == {"m": {"a": NO, "b": NO}}


def test_heads_by_layer_reads_as_wrapping_per_layer_lists() -> None:
    heads = pd.DataFrame({"layer": [4, 3, 3, 10], "head": [2, 7, 0, 1]})
    assert heads_by_layer(heads) == "L3: 0 7; L4: 2; L10: 1"
    assert heads_by_layer(heads.iloc[:0]) == "-"


# ------------------------------------------------------------------------- sink heads of a model built with them

# α_0 at T = 32 (tests/tiny.py): (0, 0) 0.995, (0, 1) 0.269 (below ε = 0.3), (0, 2) 0.341, (1, 3) 0.962,
# (2, 1) 0.999 (in the last layer); every other head 0.099.
SINK_LOGITS = {(0, 0): 8.0, (0, 1): 1.4, (0, 2): 1.8, (1, 3): 6.0, (2, 1): 10.0}


def _per_head(logits: dict[tuple[int, int], float]) -> pd.DataFrame:
    ids = sink_ids()
    batch = TokenBatch(ids, "verbatim", None, ids[:, 0].clone(), source="test", source_name="test", seed=None)
    config = AnalyzeConfig(seq_len=SINK_T, num_seqs=batch.num_seqs, bootstrap=0)
    return analyze_model(
        prepared_model(sink_model(logits), batch, config.analysis, "sink-lab"), progress=False
    ).per_head


@pytest.mark.parametrize(
    ("logits", "expected"),
    [
        (SINK_LOGITS, [(0, 0), (1, 3), (0, 2)]),  # by sink score; (2, 1) is in the last layer
        # The last layer without a sink head: layer 1's sink head has a later layer and stays a candidate.
        ({k: v for k, v in SINK_LOGITS.items() if k != (2, 1)}, [(0, 0), (1, 3), (0, 2)]),
    ],
)
def test_sink_heads_and_their_controls(logits: dict[tuple[int, int], float], expected: list[tuple[int, int]]) -> None:
    """The heads `posleak paper` ablates for C3: every sink head (α_0 > 0.3) outside the model's last layer, strongest
    first, on a real analysis of a model whose sink heads are known by construction; the controls: as many non-sink
    heads outside the last layer, a different set per draw, the same set for the same draw."""
    per_head = _per_head(logits)
    chosen = sink_heads(per_head)
    assert list(zip(chosen["layer"], chosen["head"], strict=True)) == expected
    analytic = sink_scores(logits, layers=3)
    np.testing.assert_allclose(
        chosen["sink_score"], [float(analytic[layer, head]) for layer, head in expected], atol=1e-6
    )
    draws = [matched_controls(per_head, chosen, draw) for draw in range(3)]
    last = per_head["layer"].max()
    for heads in draws:
        pairs = set(zip(heads["layer"], heads["head"], strict=True))
        assert len(pairs) == len(expected) and not pairs & set(expected) and (heads["layer"] < last).all()
        assert (heads["sink_score"] <= 0.3).all()
        assert sorted(heads["layer"]) == sorted(chosen["layer"])  # each layer has non-sink heads to spare
    assert head_list(matched_controls(per_head, chosen, 1)) == head_list(draws[1])


def _scores(sinks: dict[int, list[int]], layers: int, heads: int) -> pd.DataFrame:
    """A per-head table: the heads listed per layer are sink heads (α₀ 0.9), every other head 0.1; each head's
    clock (resid_all_key0) a distinct value, larger for sink heads."""
    rng = np.random.default_rng(7)
    return pd.DataFrame(
        [
            {
                "layer": layer,
                "head": head,
                "sink_score": 0.9 if head in sinks.get(layer, []) else 0.1,
                CLOCK: (1.0 if head in sinks.get(layer, []) else 0.0) + float(rng.uniform(0.0, 0.9)),
            }
            for layer in range(layers)
            for head in range(heads)
        ]
    )


def _pairs(heads: pd.DataFrame) -> list[tuple[int, int]]:
    return list(zip(heads["layer"], heads["head"], strict=True))


def test_matched_controls() -> None:
    """C3's controls: per draw, as many non-sink heads in each layer as it has sink heads, never a sink head nor
    one of the last layer, each matched on its clock (resid_all_key0). Against a brute force: draw 0 is, layer by
    layer, the non-sink heads whose clocks are nearest the sink heads', taken largest sink clock first; each later
    draw the same among the heads the earlier draws left, so the draws are disjoint while a layer has heads to
    spare. Where a layer has too few non-sink heads the rest come from the nearest layers with some left; where
    the model has fewer non-sink heads than sink heads, the unit is untestable (no control is matched)."""
    per_head = _scores({0: [0, 1], 2: [5], 3: [2, 3, 4], 5: [0]}, layers=6, heads=8)  # layer 5 is the last
    sinks = sink_heads(per_head)
    clock = per_head.set_index(["layer", "head"])[CLOCK]
    draws = [matched_controls(per_head, sinks, draw) for draw in range(2)]
    used: set[tuple[int, int]] = set()
    for heads in draws:
        assert sorted(heads["layer"]) == sorted(sinks["layer"]) == [0, 0, 2, 3, 3, 3]
        assert not set(_pairs(heads)) & set(_pairs(sinks)) and (heads["sink_score"] <= 0.3).all()
        assert len(set(_pairs(heads))) == len(heads)
        expected: set[tuple[int, int]] = set()  # the brute force: greedy by sink clock over the heads left
        for _, sink in sinks.sort_values(CLOCK, ascending=False).iterrows():
            layer = [pair for pair in clock.index if pair[0] == sink["layer"] and pair not in set(_pairs(sinks))]
            free = [pair for pair in layer if pair not in used | expected]  # the earlier draws' heads left out
            free = free or [pair for pair in layer if pair not in expected]  # unless the layer has none to spare
            expected.add(min(free, key=lambda pair: abs(clock[pair] - sink[CLOCK])))
        assert set(_pairs(heads)) == expected
        used |= expected
    assert len(set(_pairs(draws[0])) & set(_pairs(draws[1]))) == 1  # layer 3: 5 non-sink heads for 2 × 3
    assert head_list(matched_controls(per_head, sinks, 1)) == head_list(draws[1])

    # layer 1 all sink heads: its four controls come from layers 0 and 2, the nearest; the last layer gives none
    short = _scores({1: [0, 1, 2, 3], 2: [0], 3: [1]}, layers=4, heads=4)
    for draw in range(5):
        heads = matched_controls(short, sink_heads(short), draw)
        assert len(heads) == 5 and set(heads["layer"]) <= {0, 2} and len(set(_pairs(heads))) == 5
        assert (heads["sink_score"] <= 0.3).all()
    # fewer non-sink heads (outside the last layer) than sink heads: no matched control, the unit cannot test C3
    few = _scores({0: [0, 1, 2], 1: [0, 1, 2]}, layers=3, heads=4)
    design = Design.of(_selection(few), draws=2)
    assert (
        design.untestable()
        == "untestable, 6 sink heads (α₀ > 0.3) and only 2 non-sink heads outside the last layer to match them"
    )
    assert design.interventions(reported=True) == {} and design.controls == []
    # as many as sink heads (layer 2, the last, gives none): testable, each draw matches every sink head
    enough = _scores({0: [0, 1, 2], 1: [0]}, layers=3, heads=4)
    design = Design.of(_selection(enough), draws=2)
    assert design.untestable() is None and [len(c) for c in design.controls] == [4, 4]
    assert Design.of(_selection(_scores({}, layers=3, heads=4)), draws=2).untestable() == (
        "untestable, no sink heads (α₀ > 0.3)"
    )


def _selection(per_head: pd.DataFrame) -> AnalysisResult:
    """A selection baseline holding only what a C3 design reads: its per-head and per-layer tables."""
    empty = pd.DataFrame()
    per_layer = pd.DataFrame({"layer": sorted(per_head["layer"].unique())})
    return AnalysisResult(per_head, per_layer, empty, empty, empty, empty, {})
