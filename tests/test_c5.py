"""C5 on the squared component: the % of resid_early² a BOS replacement removes, through the key-0 column and
through the other keys, against brute force on synthetic and on real result tables; the claim's verdict on either
side of the band."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from posleak.commands.intervene import intervene
from posleak.experiments.evidence import Estimate, mean_square, share_removed
from posleak.experiments.paper.claims.c5.claim import (
    DECIDING,
    KEY_PARTS,
    WHOLE,
    Replacement,
    change_name,
    claim_c5,
    effect_table,
    loss_change,
    removed_name,
    replacement,
)
from posleak.interventions import Interventions, ReplaceBos
from posleak.pipeline import AnalysisResult, AnalyzeConfig

KEY0, REST = f"{WHOLE}_key0", f"{WHOLE}_rest"
LAYERS, RESAMPLES = 4, 40


def _signed_root(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.sqrt(np.abs(x))


def _synthetic(seed: int) -> AnalysisResult:
    """A run of LAYERS layers whose key-0 and rest magnitudes are drawn (the rest at times negative, as a
    noise-corrected magnitude can be) and whose resid_early is the signed root of key0² + rest² (signed squares),
    per layer and per resample, as the analysis writes them."""
    rng = np.random.default_rng(seed)
    key0 = rng.uniform(0.5, 2.0, (RESAMPLES + 1, LAYERS))
    rest = rng.uniform(-0.3, 0.8, (RESAMPLES + 1, LAYERS))
    resid = _signed_root(key0 * np.abs(key0) + rest * np.abs(rest))
    columns = {WHOLE: resid, KEY0: key0, REST: rest}
    per_layer = pd.DataFrame({"layer": range(LAYERS), **{name: v[0] for name, v in columns.items()}})
    bootstrap = pd.DataFrame(
        {
            "resample": np.repeat(np.arange(RESAMPLES), LAYERS),
            "layer": np.tile(np.arange(LAYERS), RESAMPLES),
            **{name: v[1:].ravel() for name, v in columns.items()},
        }
    )
    empty = pd.DataFrame()
    return AnalysisResult(empty, per_layer, empty, empty, empty, bootstrap, {"data": {"num_seqs": 6}})


def _brute_mean_square(values: list[float]) -> float:
    """Σ_l v_l·|v_l| / L, one layer at a time."""
    total = 0.0
    for v in values:
        total += v * abs(v)
    return total / len(values)


def _brute_removed(base: AnalysisResult, new: AnalysisResult, part: str, table: str) -> list[float]:
    """100·(part²(base) − part²(new)) / resid_early²(base) from `table` (per_layer: one value; bootstrap: one per
    resample), with the squares' means over layers taken one row at a time."""
    rows = [None] if table == "per_layer" else range(RESAMPLES)
    out = []
    for k in rows:

        def of(run: AnalysisResult, measure: str, k: int | None = k) -> list[float]:
            frame = getattr(run, table)
            frame = frame if k is None else frame[frame["resample"] == k]
            return [float(v) for v in frame.sort_values("layer")[measure]]

        b, n, whole = (_brute_mean_square(of(r, m)) for r, m in ((base, part), (new, part), (base, WHOLE)))
        out.append(100 * (b - n) / whole)
    return out


def test_the_share_removed_is_the_brute_force_share_of_the_squared_component_and_the_parts_add() -> None:
    """On two synthetic runs: the value and every resample of each part's share equal the brute-force computation,
    and the key-0 column's share plus the other keys' is the whole's (their squares add), which the change of the
    mean of the roots does not do."""
    base, new = _synthetic(0), _synthetic(1)
    for part in KEY_PARTS:
        got = share_removed(base, new, part, WHOLE)
        assert got.value == pytest.approx(_brute_removed(base, new, part, "per_layer")[0], rel=1e-12)
        expected = torch.tensor(_brute_removed(base, new, part, "bootstrap"), dtype=torch.float64)
        torch.testing.assert_close(got.samples, expected, rtol=1e-12, atol=1e-12)
    whole, key0, rest = (share_removed(base, new, part, WHOLE) for part in KEY_PARTS)
    assert key0.value + rest.value == pytest.approx(whole.value, rel=1e-12)
    torch.testing.assert_close(key0.samples + rest.samples, whole.samples)
    effect = replacement(base, new)
    roots_added = effect.change(KEY0).value + effect.change(REST).value
    assert abs(roots_added - effect.change(WHOLE).value) > 0.01  # nats: roots, they do not add


@pytest.fixture(scope="module")
def replaced_run(
    tmp_path_factory: pytest.TempPathFactory, checkpoint: tuple[Path, Path]
) -> tuple[AnalysisResult, AnalysisResult, pd.DataFrame]:
    """A tiny Llama (word-level tokenizer with a BOS) run by `posleak intervene` with its BOS embedding replaced
    by the vocabulary mean: baseline, replaced run and the behaviour table the command writes."""
    root = tmp_path_factory.mktemp("c5")
    folder, corpus = checkpoint
    config = AnalyzeConfig(
        seq_len=40,
        num_seqs=6,
        batch_size=3,
        bos="on",
        corpus=str(corpus),
        bootstrap=30,
        interventions=Interventions(ReplaceBos("mean")),
    )
    run = intervene(str(folder), config, out=root / "run", progress=False)
    return run.baseline, run.intervened, run.behaviour


def test_on_real_runs_the_squared_component_is_the_mean_over_layers_of_the_heads_mean_squares(
    replaced_run: tuple[AnalysisResult, AnalysisResult, pd.DataFrame],
) -> None:
    """From the analysis's per-head table: resid_early² is the mean over layers of each layer's mean over heads of
    the signed squares, and the same of its key-0 column plus the other keys' (resid² = key0² + rest², docs/method.md
    §3); the share removed is then 100·(1 − new/base) of those, and the parts' shares add to it."""
    base, new, _ = replaced_run

    def brute(run: AnalysisResult, measure: str) -> float:
        heads = run.per_head
        layers = [
            _brute_mean_square(list(heads[heads["layer"] == layer][measure])) for layer in sorted(set(heads.layer))
        ]
        return sum(layers) / len(layers)

    for run in (base, new):
        squares = {part: brute(run, part) for part in KEY_PARTS}
        assert mean_square(run, WHOLE).value == pytest.approx(squares[WHOLE], rel=1e-9)
        assert squares[KEY0] + squares[REST] == pytest.approx(squares[WHOLE], rel=1e-9)
    removed = share_removed(base, new, WHOLE, WHOLE)
    assert removed.value == pytest.approx(100 * (1 - brute(new, WHOLE) / brute(base, WHOLE)), rel=1e-9)
    parts = [share_removed(base, new, part, WHOLE) for part in (KEY0, REST)]
    assert sum(p.value for p in parts) == pytest.approx(removed.value, rel=1e-9, abs=1e-9)
    assert removed.samples.shape == (30,) and removed.units == 6


def test_the_loss_cost_beside_c5_is_the_behaviour_tables(
    replaced_run: tuple[AnalysisResult, AnalysisResult, pd.DataFrame],
) -> None:
    """The change of next-token loss in C5's table is the behaviour table's, as `posleak intervene` wrote it for the
    same two runs (same resamples), and each replacement's rows carry it beside every part."""
    base, new, behaviour = replaced_run
    loss = loss_change(base, new, resamples=30)
    written = behaviour[behaviour["measure"] == "loss"].set_index("bucket")
    for bucket in ("early", "all"):
        got = loss.loc[bucket, ["change", "change_lo", "change_hi"]].to_numpy(dtype=float)
        expected = written.loc[bucket, ["change", "change_lo", "change_hi"]].to_numpy(dtype=float)
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    table = effect_table({DECIDING: replacement(base, new)}, {DECIDING: loss})
    assert list(table["part"]) == list(KEY_PARTS)
    assert (table["loss_change_all_nats"] == loss.at["all", "change"]).all()
    shares = table.set_index("part")["removed_pct_of_resid_early_sq"]
    assert shares[KEY0] + shares[REST] == pytest.approx(shares[WHOLE], rel=1e-9, abs=1e-9)


def _spread(centre: float, half_width: float) -> Estimate:
    """Resamples spread evenly over [centre − w, centre + w]: the 95% interval is almost exactly that range."""
    return Estimate(centre, torch.linspace(centre - half_width, centre + half_width, 1001, dtype=torch.float64), 16)


def _replacement(removed: float, half_width: float) -> Replacement:
    """A replacement that removes `removed`% ± half_width of resid_early²: `removed` + 25% through the key-0 column,
    and −25% through the other keys (they grow); magnitudes 1.2 → 1.0 nats (key 0 1.1 → 0.7, rest 0.2 → 0.5)."""
    nats = {WHOLE: (1.2, 1.0), KEY0: (1.1, 0.7), REST: (0.2, 0.5)}
    shares = {WHOLE: removed, KEY0: removed + 25, REST: -25.0}
    return Replacement(
        baseline={part: _spread(before, 0.05) for part, (before, _) in nats.items()},
        replaced={part: _spread(after, 0.05) for part, (_, after) in nats.items()},
        removed={part: _spread(share, half_width) for part, share in shares.items()},
    )


@pytest.mark.parametrize(
    ("replacements", "verdict"),
    [
        ({"mean": _replacement(35, 10), "zero": _replacement(4, 10)}, "consistent"),  # 25..45%: inside
        ({"mean": _replacement(25, 10)}, "inconclusive"),  # 15..35%: crosses the low end
        ({"mean": _replacement(55, 10)}, "inconclusive"),  # 45..65%: crosses the high end
        ({"mean": _replacement(5, 10), "random": _replacement(40, 5)}, "not consistent"),  # −5..15%: below
        ({"mean": _replacement(75, 10), "zero": _replacement(40, 5)}, "not consistent"),  # 65..85%: above
    ],
)
def test_c5_decides_on_the_mean_replacements_share_of_the_squared_component(
    replacements: dict[str, Replacement], verdict: str
) -> None:
    """Consistent when the vocabulary mean's % of resid_early² removed lies inside 20–60%, not consistent wholly
    outside, inconclusive across an end; the other replacements, the parts and the changes in nats are reported
    (a part that adds reads as contradicting removal, deciding nothing)."""
    judgement = claim_c5(replacements)
    assert judgement.verdict == verdict
    rows = judgement.evidence.set_index("evidence")
    assert list(rows.index[rows["deciding"]]) == [removed_name(DECIDING)]
    assert len(rows) == 6 * len(replacements)
    mean = replacements[DECIDING]
    decided = rows.loc[removed_name(DECIDING)]
    assert (decided["value"], decided["lo"], decided["hi"]) == pytest.approx(
        (mean.removed[WHOLE].value, *mean.removed[WHOLE].interval)
    )
    assert rows.loc[removed_name(DECIDING, REST), "says"] == "contradicts"  # the other keys grow
    assert rows.loc[change_name(DECIDING, KEY0), "value"] == pytest.approx(0.7 - 1.1)
    assert rows.loc[change_name(DECIDING, REST), "says"] == "contradicts"


def test_the_parts_rows_read_their_own_estimates() -> None:
    """Each part's row is that part's share and change, not the whole's: key 0 60% and 0.7 − 1.1 nats, the rest
    −25% and 0.5 − 0.2 nats, beside the whole's 35% and 1.0 − 1.2."""
    rows = claim_c5({DECIDING: _replacement(35, 10)}).evidence.set_index("evidence")["value"]
    assert rows[removed_name(DECIDING, KEY0)] == pytest.approx(60.0)
    assert rows[removed_name(DECIDING, REST)] == pytest.approx(-25.0)
    assert rows[change_name(DECIDING, REST)] == pytest.approx(0.3)
    assert rows[change_name(DECIDING, WHOLE)] == pytest.approx(-0.2)
