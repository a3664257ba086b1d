"""posleak.measure against brute force: the decomposition, ΔR², the grid, the bootstrap, checkpoints.

The reference (tests/reference.py) materialises every logit in float64 and applies DESIGN.md §3.1–3.2
literally. Tiny random models of each family run at T = 48, longer than their sliding windows, with
sequences fed in batches of 2 so that accumulation across batches is exercised. Relative errors are
normwise per layer (max |ours − reference| / max |reference|).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from reference import check_against_reference, reference_dr2, run
from tiny import FAMILIES, WINDOW, tiny_model

from posleak.capture import AttentionCall, MaskSpec
from posleak.measure import (
    MAGNITUDES,
    DecompositionAccumulator,
    Grid,
    Units,
    cell_sums,
    components,
    identity_weights,
    magnitudes,
    percentile_interval,
    resample_weights,
    resampled_magnitudes,
    sum_of_squares,
)
from posleak.measure.regression import DesignMoments, delta_r2, kv_heads

T = 3 * WINDOW
TOLERANCE = 1e-5
# A coarse grid with geometric bins already at T = 48 (the default one is exact below 64).
SMALL_COARSE = dict(kind="coarse", linear_until=8, bins_per_octave=2)


def _ids(model: torch.nn.Module, num_seqs: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (num_seqs, T), generator=gen)


# -------------------------------------------------------------------------------------------- grid


def test_coarse_edges_are_linear_then_geometric() -> None:
    grid = Grid(2048)
    edges = grid.edges
    assert edges[:65] == tuple(range(65)) and edges[-1] == 2048
    assert all(b > a for a, b in itertools.pairwise(edges))
    widths = np.diff(edges[64:])
    assert widths[0] == 6 and widths[-1] > 100  # 64·2^(1/8) ≈ 69.8 → 70; ~8 bins per doubling
    assert len(edges) - 65 == pytest.approx(8 * math.log2(2048 / 64), abs=1)
    assert Grid(2048, "exact").edges == tuple(range(2049))
    assert Grid(48).edges == tuple(range(49))
    assert Grid(2048).describe() == {
        "kind": "coarse",
        "seq_len": 2048,
        "bins": grid.num_bins,
        "linear_until": 64,
        "bins_per_octave": 8,
    }


@pytest.mark.parametrize("window", [None, 5, 16, 100])
def test_layout_counts_the_valid_pairs_of_each_cell(window: int | None) -> None:
    grid = Grid(90, **SMALL_COARSE)
    mask = MaskSpec(window=window)
    layout = grid.layout(mask)
    i = torch.arange(90)[:, None]
    valid = mask.valid(i, i - torch.arange(90)[None, :]) & (i - torch.arange(90)[None, :] >= 0)
    for c in range(layout.num_cells):
        q0, q1, d0, d1 = (int(getattr(layout, name)[c]) for name in ("q_lo", "q_hi", "d_lo", "d_hi"))
        assert layout.count[c] == valid[q0 : q1 + 1, d0 : d1 + 1].sum()
    assert layout.count.sum() == valid.sum()
    ones = layout.to_cells(torch.ones(90))
    torch.testing.assert_close(ones, torch.ones_like(ones))  # to_cells is a mean over each cell's pairs
    assert layout.storage_index.unique().numel() == layout.num_cells


def test_prefix_masks_are_refused_clearly() -> None:
    with pytest.raises(NotImplementedError, match="prefix"):
        Grid(16).layout(MaskSpec(prefix=4))


# ------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("grid", ["exact", "coarse"])
def test_decomposition_matches_brute_force(family: str, grid: str) -> None:
    """g, m, r, every magnitude (early/all, corrected and raw), the offset map and ΔR² of s and ℓ."""
    model = tiny_model(family)
    layout_grid = Grid(T, "exact") if grid == "exact" else Grid(T, **SMALL_COARSE)
    errors = check_against_reference(model, _ids(model, 6), layout_grid, early=12, tolerance=TOLERANCE)
    assert set(errors) >= {"g", "m", "r", "identity", "cell_sums", "dr2_logit", "dr2_logattn", *MAGNITUDES}


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3", "gpt_oss"])
def test_exact_grid_with_a_bootstrap_matches_brute_force(family: str) -> None:
    """With resamples the exact grid's point estimate goes through components.py (per-cell arrays), without
    them through exact.py (row blocks of the dense sums): both against the reference."""
    model = tiny_model(family)
    check_against_reference(model, _ids(model, 6), Grid(T, "exact"), early=12, resamples=20, tolerance=TOLERANCE)


@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("grid", ["exact", "coarse"])
def test_odd_number_of_sequences(family: str, grid: str) -> None:
    """N = 5: the last sequence is in neither half; the other cell-sum path than `auto` where there is one."""
    model = tiny_model(family)
    layout_grid = Grid(T, "exact") if grid == "exact" else Grid(T, **SMALL_COARSE)
    path = "auto" if family == "gemma2" else ("bilinear" if grid == "exact" else "materialised")
    check_against_reference(model, _ids(model, 5), layout_grid, early=12, path=path, tolerance=TOLERANCE)


def test_identity_holds_on_every_valid_cell() -> None:
    """mean_n ℓ = g + m + r, with ℓ from the materialised logits and log Z (exact grid)."""
    model = tiny_model("gemma3")
    _, result, recorder = run(model, _ids(model, 4), Grid(T, "exact"))
    for profile in result.layer_profiles:
        logits, log_z = recorder.layers[profile.layer].stacked()
        layout = profile.layout
        i, d = layout.q_lo.numpy(), layout.d_lo.numpy()
        mean_logattn = (logits[:, :, i, i - d] - log_z[:, :, i]).mean(0)
        identity = (layout.from_offsets(profile.g) + profile.m_cell + profile.r).numpy()
        assert np.abs(identity - mean_logattn).max() < 1e-6 * np.abs(mean_logattn).max()


def test_coarse_grid_with_one_position_bins_equals_exact_grid() -> None:
    """Below 64 the default coarse grid has one position per bin: the same numbers as the exact grid."""
    model = tiny_model("mistral")
    ids = _ids(model, 4)
    exact = run(model, ids, Grid(T, "exact"), resamples=0)[1]
    coarse = run(model, ids, Grid(T, "coarse"), resamples=0)[1]
    assert coarse.grid.num_bins == exact.grid.num_bins == T
    for name in MAGNITUDES:
        torch.testing.assert_close(coarse.magnitudes[name], exact.magnitudes[name], rtol=1e-5, atol=1e-7)
    for a, b in zip(coarse.layer_profiles, exact.layer_profiles, strict=True):
        torch.testing.assert_close(a.r, b.r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.m, b.m, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(coarse.dr2, exact.dr2, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("grid", [Grid(T, "exact"), Grid(T, **SMALL_COARSE), Grid(200, "coarse")])
def test_cell_sum_paths_agree(grid: Grid) -> None:
    model = tiny_model("gemma3")
    seq_len = grid.seq_len
    calls = _calls(model, torch.randint(0, 96, (2, seq_len), generator=torch.Generator().manual_seed(3)))
    for call in calls:
        layout = grid.layout(call.mask)
        bilinear = cell_sums(call, layout, "bilinear")
        materialised = cell_sums(call, layout, "materialised")
        torch.testing.assert_close(bilinear, materialised, rtol=1e-5, atol=1e-5 * bilinear.abs().max().item())
        brute = _brute_force_cell_sums(call, layout)
        torch.testing.assert_close(bilinear, brute, rtol=1e-9, atol=1e-9 * brute.abs().max().item())


def _calls(model: torch.nn.Module, ids: torch.Tensor) -> list[AttentionCall]:
    from posleak.capture import CaptureSession, use_posleak_attention

    kept: list[AttentionCall] = []

    class Keep:
        needs_attended_keys = False

        def update(self, call: AttentionCall) -> None:
            kept.append(call)

    CaptureSession([Keep()]).forward(use_posleak_attention(model), ids)
    return kept


def _brute_force_cell_sums(call: AttentionCall, layout) -> torch.Tensor:
    logits = call.query.double() @ call.key.double().mT * call.scaling
    seq_len = call.seq_len
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    valid = call.mask.valid(i, j)
    out = torch.zeros(*logits.shape[:2], layout.num_cells, dtype=torch.float64)
    for c in range(layout.num_cells):
        q0, q1, d0, d1 = (int(getattr(layout, name)[c]) for name in ("q_lo", "q_hi", "d_lo", "d_hi"))
        inside = valid & (i >= q0) & (i <= q1) & (i - j >= d0) & (i - j <= d1)
        out[..., c] = (logits * inside).sum((-1, -2))
    return out


# ------------------------------------------------------------------------ purely relative logits


def _relative_call(
    seq_len: int,
    window: int | None = None,
    sink: torch.Tensor | None = None,
    norm: str = "softmax",
    softcap: float | None = None,
    batch: int = 2,
    first_index: int = 0,
) -> tuple[AttentionCall, torch.Tensor]:
    """Logits s_ij = f_h(i − j) exactly: q_i = R(iθ)u, k_j = R(jθ)v give u·R((j − i)θ)v (RoPE's own
    construction), the same in every sequence. Returns the call and f (H, T) evaluated at d = 0..T−1."""
    heads, pairs = 2, 6
    gen = torch.Generator().manual_seed(7)
    theta = 1.0 / 30 ** (torch.arange(pairs, dtype=torch.float64) / pairs)
    u = torch.randn(heads, pairs, 2, generator=gen, dtype=torch.float64)
    v = torch.randn(heads, pairs, 2, generator=gen, dtype=torch.float64)

    def rotate(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:  # x (H, P, 2), angle (T, P) → (H, T, 2P)
        cos, sin = torch.cos(angle), torch.sin(angle)
        first = x[:, None, :, 0] * cos - x[:, None, :, 1] * sin
        second = x[:, None, :, 0] * sin + x[:, None, :, 1] * cos
        return torch.stack([first, second], dim=-1).flatten(-2)

    position = torch.arange(seq_len, dtype=torch.float64)[:, None] * theta
    query = rotate(u, position).float()[None].expand(batch, -1, -1, -1).contiguous()
    key = rotate(v, position).float()[None].expand(batch, -1, -1, -1).contiguous()
    mask = MaskSpec(window=window)
    logits = query.double() @ key.double().mT
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    f = torch.stack([logits[0, :, d, 0] for d in range(seq_len)], dim=-1)  # s_{d,0} = f(d)
    masked = logits.masked_fill(~mask.dense(seq_len), float("-inf"))
    log_z_keys = torch.logsumexp(masked, dim=-1)
    log_z = log_z_keys if sink is None else torch.logaddexp(log_z_keys, sink.double()[None, :, None])
    if norm == "sigmoid":
        log_z = torch.zeros_like(log_z)
    call = AttentionCall(
        layer=0,
        query=query,
        key=key,
        value=torch.zeros_like(query),
        scaling=1.0,
        softcap=softcap,
        sink=sink,
        norm=norm,
        mask=mask,
        log_z=log_z.float(),
        log_z_keys=log_z_keys.float(),
        output=torch.zeros_like(query),
        attended_keys=None,
        sequence_index=torch.arange(first_index, first_index + batch),
    )
    return call, f


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(window=7),
        dict(sink=torch.tensor([0.5, -1.0])),
        dict(norm="sigmoid"),
        dict(softcap=2.0, window=9),
    ],
    ids=["causal", "window", "sink", "sigmoid", "softcap"],
)
@pytest.mark.parametrize("grid_kind", ["exact", "coarse"])
def test_purely_relative_logits_have_no_residual_component(case: dict, grid_kind: str) -> None:
    """Exact grid (materialised path) and the default coarse grid, one position per bin below 64
    (bilinear path). On wider bins r need not vanish: g is a bin mean there."""
    seq_len = 40
    accumulator = DecompositionAccumulator(grid_kind, seq_len, 4, early=10)
    for start in (0, 2):
        call, f = _relative_call(seq_len, first_index=start, **case)
        accumulator.update(call)
    result = accumulator.result(resamples=0)
    profile = result.layer_profiles[0]
    scale = f.abs().max().item()
    assert profile.r.abs().max() < 1e-5 * scale
    for name in ("resid_early", "resid_all", "resid_early_raw", "resid_all_raw"):
        assert result.magnitudes[name].abs().max() < 1e-5 * scale
    window = case.get("window") or seq_len
    # m(i) = −logsumexp over d ≤ min(i, W − 1) of f(d) (with the sink logit; 0 for sigmoid)
    expected = torch.stack([-torch.logsumexp(f[:, : min(i, window - 1) + 1], dim=-1) for i in range(seq_len)], -1)
    if "sink" in case:
        expected = -torch.logaddexp(-expected, case["sink"].double()[:, None])
    if case.get("norm") == "sigmoid":
        expected = torch.zeros_like(expected)
    torch.testing.assert_close(profile.m, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(profile.g[:, :window], f[:, :window], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------- ΔR²


@pytest.mark.parametrize(("grid", "path"), [("coarse", "auto"), ("exact", "bilinear"), ("exact", "materialised")])
def test_delta_r2_from_running_sums_equals_least_squares(grid: str, path: str) -> None:
    """On data unlike attention logits too: s with a strong absolute-position trend, with and without a
    window. Bilinear sums are float64 throughout; materialised ones start from float32 logits."""
    gen = torch.Generator().manual_seed(0)
    for window in (None, 6):
        call, _ = _relative_call(30, window=window)
        call.query = call.query + torch.randn(call.query.shape, generator=gen) * 0.3
        call.query = call.query + torch.arange(30, dtype=torch.float32)[:, None] / 30  # absolute position
        logits = call.query.double() @ call.key.double().mT
        call.log_z = torch.logsumexp(logits.masked_fill(~call.mask.dense(30), float("-inf")), dim=-1).float()
        expected = reference_dr2(logits.masked_fill(~call.mask.dense(30), float("nan")).numpy(), call.log_z.numpy())
        accumulator = DecompositionAccumulator(grid, 30, 2, path=path)
        accumulator.update(call)
        ours = delta_r2(accumulator.layers[0].regression, DesignMoments.of(call.mask, 30, 2))
        np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-8 if path != "materialised" else 1e-5)


@pytest.mark.parametrize("path", ["bilinear", "materialised"])
def test_delta_r2_is_nan_for_a_degenerate_design(path: str) -> None:
    for seq_len, window in ((8, 1), (1, None)):  # only d = 0: [1, d] is singular; T = 1: a single pair
        call, _ = _relative_call(seq_len, window=window)
        accumulator = DecompositionAccumulator("exact", seq_len, 2, path=path)
        accumulator.update(call)
        assert delta_r2(accumulator.layers[0].regression, DesignMoments.of(call.mask, seq_len, 2)).isnan().all()


@pytest.mark.parametrize(("seq_len", "window", "dim", "groups"), [(48, None, 16, 2), (100, 7, 32, 3), (130, 64, 64, 1)])
def test_sum_of_squares_without_logits(seq_len: int, window: int | None, dim: int, groups: int) -> None:
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 2, groups, seq_len, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(2, 2, seq_len, dim, generator=gen, dtype=torch.float64)
    logits = torch.einsum("bkgid,bkjd->bkgij", query, key)
    valid = MaskSpec(window=window).dense(seq_len)
    expected = (logits.square() * valid).sum((-1, -2))
    torch.testing.assert_close(sum_of_squares(query, key, window), expected, rtol=1e-12, atol=0.0)


def test_kv_heads_finds_the_groups() -> None:
    call, _ = _relative_call(10)
    call.key = call.key.repeat_interleave(3, dim=1)
    keys, groups = kv_heads(call)
    assert groups == 3 and torch.equal(keys.repeat_interleave(3, dim=1), call.key)
    call.key[:, 1] += 1.0  # heads of a would-be group differ: no grouping
    assert kv_heads(call)[1] == 1


# ---------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_intervals_contain_the_point_estimate() -> None:
    model = tiny_model("llama")
    _, result, _ = run(model, _ids(model, 8), Grid(T, "exact"), early=12, resamples=200)
    frame = result.per_layer()
    for name in ("mask_early", "mask_all", "resid_early", "resid_all"):
        assert (frame[f"{name}_lo"] <= frame[name]).all() and (frame[name] <= frame[f"{name}_hi"]).all(), name
        assert (frame[f"{name}_lo"] < frame[f"{name}_hi"]).any(), name


def test_bootstrap_collapses_on_identical_sequences() -> None:
    model = tiny_model("gemma3")
    ids = _ids(model, 1).repeat(6, 1)
    _, result, _ = run(model, ids, Grid(T, "exact"), early=12, resamples=50)
    frame = result.per_layer()
    for name in ("mask_early", "mask_all", "resid_early", "resid_all"):
        np.testing.assert_allclose(frame[f"{name}_lo"], frame[name], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(frame[f"{name}_hi"], frame[name], rtol=1e-9, atol=1e-12)


def test_resampling_weights_of_ones_reproduce_the_point_estimate() -> None:
    model = tiny_model("mistral")
    accumulator, result, _ = run(model, _ids(model, 6), Grid(T, **SMALL_COARSE), early=12)
    ranges = {"early": (1, 12), "all": (1, T)}
    for index, layer in enumerate(result.layers):
        sums = accumulator.layers[layer]
        layout = result.layer_profiles[index].layout
        weights = identity_weights(accumulator.units.count)
        parts = components(sums.arrays(layout), layout, accumulator.units, weights)
        again = magnitudes(parts, layout, ranges)
        for name in MAGNITUDES:
            assert torch.equal(again[name][0], result.magnitudes[name][index])


@pytest.mark.parametrize(("family", "grid"), [("mistral", "coarse"), ("gemma3", "exact"), ("gpt_oss", "coarse")])
def test_resampled_magnitudes_equal_recomputing_the_components(family: str, grid: str) -> None:
    """The bootstrap's second-moment shortcut against components() + magnitudes() on the same weights, for
    random resamples (some with a half not drawn) and the point estimate; windows, sinks, uniform and
    partial cells included."""
    model = tiny_model(family)
    layout_grid = Grid(T, "exact") if grid == "exact" else Grid(T, **SMALL_COARSE)
    accumulator, result, _ = run(model, _ids(model, 6), layout_grid, early=12, resamples=0)
    ranges = {"early": (1, 12), "all": (1, T)}
    weights = torch.cat([identity_weights(6), resample_weights(6, 40, seed=5)])
    assert (weights[:, :3].sum(1) == 0).any() or (weights[:, 3:].sum(1) == 0).any()  # an empty half is covered
    for index, layer in enumerate(result.layers):
        sums = accumulator.layers[layer]
        layout = result.layer_profiles[index].layout
        arrays = sums.arrays(layout)
        point = components(arrays, layout, accumulator.units, identity_weights(6))
        direct = magnitudes(components(arrays, layout, accumulator.units, weights), layout, ranges)
        shortcut = resampled_magnitudes(arrays, layout, accumulator.units, weights, ranges, point)
        for name in MAGNITUDES:
            torch.testing.assert_close(shortcut[name], direct[name], rtol=1e-9, atol=1e-12, equal_nan=True)
    assert not layout_grid.layout(MaskSpec()).uniform.all() or grid == "exact"  # partial cells exercised


def test_resample_weights_and_percentiles() -> None:
    weights = resample_weights(7, 300, seed=3)
    assert weights.shape == (300, 7) and (weights.sum(1) == 7).all()
    assert torch.equal(weights, resample_weights(7, 300, seed=3))
    assert not torch.equal(weights, resample_weights(7, 300, seed=4))
    lo, hi = percentile_interval(torch.tensor([[1.0, float("nan")], [2.0, float("nan")], [3.0, float("nan")]]), 0.5)
    assert lo[0] == 1.5 and hi[0] == 2.5 and lo[1].isnan() and hi[1].isnan()


# ------------------------------------------------------------------------------ units, checkpoints


def test_units_split_sequences_into_halves() -> None:
    assert Units("sequence", 5).halves.tolist() == [0, 0, 1, 1, -1]
    assert Units("halves", 5).halves.tolist() == [0, 1, -1]
    assert Units("halves", 5).of(torch.arange(5)).tolist() == [0, 0, 1, 1, 2]
    assert Units("halves", 6).sizes.tolist() == [3.0, 3.0]
    assert Units("halves", 1).halves.tolist() == [-1]


@pytest.mark.parametrize("budget", [10_000, 250_000], ids=["from-the-start", "at-the-global-layer"])
def test_halves_mode_when_per_sequence_sums_do_not_fit(budget: int) -> None:
    """Per sequence, a sliding layer's exact-grid sums take 4 heads × (48 × 16 × 4 + 48 × 8) bytes, the
    global layer's 4 × (48² × 4 + 48 × 8): with 5 sequences the two sliding layers fit in 250 000 bytes,
    the global one does not, and the sums already kept are folded into halves."""
    model = tiny_model("gemma3")
    ids = _ids(model, 5)
    per_sequence, point, _ = run(model, ids, Grid(T, "exact"), early=12, resamples=20)
    accumulator = DecompositionAccumulator("exact", T, 5, early=12, memory_budget_bytes=budget)
    from posleak.capture import CaptureSession

    session = CaptureSession([accumulator])
    for start in range(0, 5, 2):
        session.forward(model, ids[start : start + 2], torch.arange(start, min(5, start + 2)))
    halves = accumulator.result(resamples=20)
    assert per_sequence.units.mode == "sequence" and accumulator.units.mode == "halves"
    assert accumulator.layers[0].cells.shape[0] == 3
    for name in MAGNITUDES:
        torch.testing.assert_close(halves.magnitudes[name], point.magnitudes[name], rtol=1e-5, atol=1e-7)
    assert halves.bootstrap is None and "memory budget" in halves.bootstrap_note
    assert halves.per_layer()["resid_all_lo"].isna().all()


def test_without_per_sequence_sums_the_halves_are_kept_from_the_start() -> None:
    """`per_sequence=False` (analyze without a bootstrap): units A, B, rest from the first call, same numbers."""
    from posleak.capture import CaptureSession

    model = tiny_model("mistral")
    ids = _ids(model, 5)
    _, point, _ = run(model, ids, Grid(T, "exact"), early=12)
    accumulator = DecompositionAccumulator("exact", T, 5, early=12, per_sequence=False)
    CaptureSession([accumulator]).forward(model, ids)
    assert accumulator.units.mode == "halves" and accumulator.layers[0].cells.shape[0] == 3
    result = accumulator.result(resamples=20)
    for name in MAGNITUDES:
        torch.testing.assert_close(result.magnitudes[name], point.magnitudes[name], rtol=1e-5, atol=1e-7)
    assert result.bootstrap is None and "per_sequence=False" in result.bootstrap_note


def test_checkpoint_and_resume_gives_the_same_result(tmp_path) -> None:
    from posleak.capture import CaptureSession

    model = tiny_model("gpt_oss")
    ids = _ids(model, 6)
    whole = run(model, ids, Grid(T, **SMALL_COARSE), early=12, resamples=30)[1]
    first = DecompositionAccumulator(Grid(T, **SMALL_COARSE), T, 6, early=12)
    CaptureSession([first]).forward(model, ids[:2], torch.arange(2))
    torch.save(first.state_dict(), tmp_path / "state.pt")
    resumed = DecompositionAccumulator(Grid(T, **SMALL_COARSE), T, 6, early=12)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt"))
    session = CaptureSession([resumed])
    for start in (2, 4):
        session.forward(model, ids[start : start + 2], torch.arange(start, start + 2))
    result = resumed.result(resamples=30)
    for name in MAGNITUDES:
        torch.testing.assert_close(result.magnitudes[name], whole.magnitudes[name], rtol=1e-12, atol=0.0)
        torch.testing.assert_close(result.bootstrap[name], whole.bootstrap[name], rtol=1e-12, atol=0.0)
    with pytest.raises(ValueError, match="checkpoint is for"):
        DecompositionAccumulator("exact", T, 6).load_state_dict(first.state_dict())


def test_bad_streams_are_refused() -> None:
    call, _ = _relative_call(20)
    accumulator = DecompositionAccumulator("exact", 20, 4)
    accumulator.update(call)
    with pytest.raises(ValueError, match="already holds"):
        accumulator.update(call)
    with pytest.raises(ValueError, match="has not seen sequences"):
        accumulator.result()
    with pytest.raises(ValueError, match="outside"):
        DecompositionAccumulator("exact", 20, 1).update(call)
    with pytest.raises(ValueError, match="length"):
        DecompositionAccumulator("exact", 21, 2).update(call)


# ------------------------------------------------------------------------------------------ tables


def test_tables_have_the_analyze_columns() -> None:
    model = tiny_model("qwen2")
    _, result, _ = run(model, _ids(model, 4), Grid(T, **SMALL_COARSE), early=12, resamples=20)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    per_head = result.per_head()
    assert list(per_head.columns) == [
        "layer",
        "head",
        "mask_early",
        "mask_all",
        "resid_early",
        "resid_all",
        "resid_early_raw",
        "resid_all_raw",
        "dr2_logit",
        "dr2_logattn",
    ]
    assert len(per_head) == layers * heads
    per_layer = result.per_layer()
    values = ["mask_early", "mask_all", "resid_early", "resid_all"]
    assert list(per_layer.columns) == ["layer", *values, *(f"{v}_{b}" for v in values for b in ("lo", "hi"))]
    np.testing.assert_allclose(per_layer["mask_all"], per_head.groupby("layer")["mask_all"].mean())
    profiles = result.profiles()
    assert list(profiles.columns) == ["layer", "head", "q_lo", "q_hi", "d_lo", "d_hi", "cells", "g", "m", "r"]
    cells = sum(p.layout.num_cells for p in result.layer_profiles)
    assert len(profiles) == cells * heads
    assert list(result.offset_map().columns) == ["layer", "q_lo", "q_hi", "d_lo", "d_hi", "value"]
    assert len(result.offset_map()) == cells
    assert result.describe()["grid"]["kind"] == "coarse"


def test_rebinned_profiles_are_count_weighted_means_of_the_exact_cells() -> None:
    """Exact-grid tables written on the coarse grid: each coarse cell is the mean of the exact cells in it."""
    model = tiny_model("mistral")
    _, result, _ = run(model, _ids(model, 4), Grid(T, "exact"), early=12)
    coarse = Grid(T, **SMALL_COARSE)
    fine_table, coarse_table = result.profiles(), result.profiles(coarse)
    assert len(coarse_table) < len(fine_table)
    for row in coarse_table.sample(20, random_state=0).itertuples():
        inside = fine_table[
            (fine_table["layer"] == row.layer)
            & (fine_table["head"] == row.head)
            & fine_table["q_lo"].between(row.q_lo, row.q_hi)
            & fine_table["d_lo"].between(row.d_lo, row.d_hi)
        ]
        assert inside["cells"].sum() == row.cells
        for name in ("g", "m", "r"):
            assert np.isclose(inside[name].mean(), getattr(row, name), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", ["mistral", "gemma3", "gpt_oss"])
def test_exact_profiles_summed_onto_a_coarse_grid_equal_rebinned_ones(family: str) -> None:
    """`result(profile_grid=...)` sums the dense exact-grid sums straight onto the coarse cells (exact.py);
    the per-cell profile rebinned afterwards is the reference. Magnitudes do not depend on it."""
    model = tiny_model(family)
    accumulator, result, _ = run(model, _ids(model, 4), Grid(T, "exact"), early=12)
    coarse = Grid(T, **SMALL_COARSE)
    binned = accumulator.result(resamples=0, profile_grid=coarse)
    for direct, rebinned in zip(binned.layer_profiles, (p.on(coarse) for p in result.layer_profiles), strict=True):
        assert direct.layout.grid == coarse
        for name in ("g_cell", "m_cell", "r", "offset_map"):
            torch.testing.assert_close(getattr(direct, name), getattr(rebinned, name), rtol=1e-9, atol=1e-12)
    for name in MAGNITUDES:
        assert torch.equal(binned.magnitudes[name], result.magnitudes[name])
