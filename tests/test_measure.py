"""posleak.measure against brute force: the decomposition, ΔR², the sink score, the tables, the bootstrap.

The reference (tests/reference.py) records q and k through its own wrapper of the attention function,
materialises every logit in float64 and applies the definitions of docs/method.md pair by pair; it shares
no code with posleak.measure or posleak.capture. Tiny random models of each family run at T = 48, longer
than their sliding windows, through `analyze_model` (the default path of `posleak analyze`), with the
sequences in batches of 2. Relative errors are normwise per layer (max |ours − reference| / max |reference|)
and NaN-aware.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import EARLY, analyze_recorded, errors_of
from reference import (
    MAGNITUDES,
    SHIFTS,
    LogitRecorder,
    assert_close,
    grid_edges,
    identity_accuracy_by_hand,
    identity_error,
    magnitude_allowance,
    model_window,
    reference_dr2,
    reference_layer,
    relative_error,
    table_errors,
)
from tiny import FAMILIES, WINDOW, tiny_model

from posleak.capture import use_posleak_attention
from posleak.capture.masks import MaskSpec
from posleak.capture.residual import CLOSED_SYSTEM_RTOL
from posleak.capture.store import CallFacts, CaptureFolder, LayerCapture, QKRecorder
from posleak.experiments.evidence import sequence_mean
from posleak.interventions import Interventions, RemoveSinkReads
from posleak.measure import (
    Decomposition,
    Grid,
    LayerResult,
    MeasureSpec,
    bilinear,
    measure_layer,
    percentile_interval,
    redrawn_resamples,
    resample_weights,
    resampling_units,
)
from posleak.measure.components import _log_cumulative_sum_exp
from posleak.measure.layer_sums import segment_boundaries, sum_layer
from posleak.measure.planted import Planted, planted_layer
from posleak.measure.position0 import first_token_variants, identity_accuracy, variant_states
from posleak.measure.regression import DesignMoments, delta_r2, running_sums

T = 3 * WINDOW
TOLERANCE = 1e-5


def _ids(model: torch.nn.Module, num_seqs: int, seq_len: int = T, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (num_seqs, seq_len), generator=gen)


# ------------------------------------------------------------------------- against the reference


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("grid", ["exact", "coarse"])
def test_analyze_matches_brute_force(family: str, grid: str) -> None:
    """Every magnitude (early / all, corrected and raw) per head and per layer, ΔR² of s and ℓ, the sink
    score, the attention shift, and g, c, m_count, w and the offset map on every cell of the table grid. The
    coarse grid runs at T = 96 so that it has geometric bins (beyond 64); windows act at both lengths."""
    model = tiny_model(family)
    seq_len = T if grid == "exact" else 96
    result, recorder = analyze_recorded(model, _ids(model, 6, seq_len), grid=grid)
    errors = errors_of(result, recorder, exact=grid == "exact")
    assert_close(errors, TOLERANCE)
    checked = {"dr2_logit", "dr2_logattn", "sink_score", "profiles.w", "profiles.c", "offset_map"}
    assert set(errors) >= {*MAGNITUDES, *SHIFTS, *checked}
    assert result.manifest["measurement"]["table_grid"]["kind"] == grid


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("num_seqs", [5, 1])
def test_odd_and_single_sequences(family: str, num_seqs: int) -> None:
    """N = 5: an odd number of sequences, every one in the pairs. N = 1: no pair of distinct sequences, so the
    corrected magnitudes are NaN in both (and the raw ones defined); batches of 3 end with a short one."""
    model = tiny_model(family)
    result, recorder = analyze_recorded(model, _ids(model, num_seqs), batch_size=3)
    assert_close(errors_of(result, recorder, exact=False), TOLERANCE)
    corrected = result.per_head[["resid_early", "resid_all"]]
    assert corrected.isna().all().all() == (num_seqs == 1)
    assert result.per_head["resid_all_raw"].notna().all()


def test_identity_holds_on_every_valid_cell() -> None:
    """mean_n ℓ = g + c + w on every (i, d) pair, ℓ from the reference's own logits and log Z."""
    model = tiny_model("gemma3")
    result, recorder = analyze_recorded(model, _ids(model, 4), grid="exact")
    assert identity_error(result.profiles, recorder, EARLY) < TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("path", ["bilinear", "materialised"])
def test_both_ways_of_summing_match_brute_force(family: str, path: str, tmp_path: Path) -> None:
    """The layer sums formed without logits (bilinear) and from offset-ordered logit blocks (materialised),
    each against the reference, at T = 100 (not a multiple of the Gram blocks; geometric table bins)."""
    model = tiny_model(family)
    captures, reference = _captured(model, _ids(model, 5, seq_len=100), tmp_path)
    spec = MeasureSpec(
        100,
        5,
        Grid(100),
        early=EARLY,
        resamples=0,
        path=path,
        beyond=model_window(reference),  # type: ignore[arg-type]
    )
    if family == "gemma2" and path == "bilinear":  # soft-capped logits are not bilinear
        with pytest.raises(ValueError, match="soft-capped"):
            measure_layer(captures.layer(0), spec)
        return
    result = Decomposition.of([measure_layer(captures.layer(layer), spec) for layer in captures.layers()], spec)
    per_layer = result.per_layer()
    errors = table_errors(
        result.per_head(), per_layer, result.profiles(), result.offset_map(), reference, EARLY, grid_edges(100)
    )
    assert_close(errors, TOLERANCE)


@pytest.mark.parametrize("path", ["bilinear", "materialised"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sums_are_formed_on_the_device_of_the_captured_q(device: str, path: str, tmp_path: Path) -> None:
    """Each layer's sums are formed where its captured q and k are: the float64 tensors they are made of live on
    that device (LayerSums.device is read off them; on CUDA the device's own allocator shows them), the results
    come back to the CPU, say where they were formed, and match the brute force. On CUDA every magnitude also
    equals the CPU's (float64 both: 1e-10 relative)."""
    if device == "cuda" and not torch.cuda.is_available():
        reason = f"no CUDA device here (torch {torch.__version__}): the CUDA variant of this test needs one"
        print(f"skipped: {reason}")
        pytest.skip(reason)
    model = tiny_model("mistral")
    captures, reference = _captured(model, _ids(model, 5, seq_len=100), tmp_path)
    spec = MeasureSpec(100, 5, Grid(100), early=EARLY, resamples=0, path=path, beyond=model_window(reference))  # type: ignore[arg-type]
    results = []
    for layer in captures.layers():
        on_host = captures.layer(layer)
        capture = dataclasses.replace(
            on_host, **{name: getattr(on_host, name).to(device) for name in ("query", "keys", "log_z")}
        )
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        sums = sum_layer(capture, segment_boundaries(100, spec.ranges), spec.table_grid, path)
        assert sums.device == str(capture.query.device) and sums.device.startswith(device)
        assert {sums.rows.device.type, sums.gram.device.type, sums.table.device.type} == {"cpu"}
        if device == "cuda":  # the float64 copies of q and k (8 bytes a number) were allocated on the GPU
            assert torch.cuda.max_memory_allocated() - before >= 8 * capture.query.numel()
            host = measure_layer(on_host, spec)
        result = measure_layer(capture, spec)
        assert result.device == sums.device
        if device == "cuda":
            for name in MAGNITUDES:
                torch.testing.assert_close(result.point[name], host.point[name], rtol=1e-10, atol=1e-12, equal_nan=True)
        results.append(result)
    measured = Decomposition.of(results, spec)
    assert measured.describe()["device"] == results[0].device
    errors = table_errors(
        measured.per_head(),
        measured.per_layer(),
        measured.profiles(),
        measured.offset_map(),
        reference,
        EARLY,
        grid_edges(100),
    )
    assert_close(errors, TOLERANCE)


@pytest.mark.parametrize(
    ("seq_len", "window", "dim", "groups", "num_seqs"),
    [(48, None, 16, 2, 3), (100, 7, 32, 3, 2), (130, 64, 64, 1, 4), (97, 40, 32, 2, 1)],
)
def test_bilinear_sums_against_materialised_logits(
    seq_len: int, window: int | None, dim: int, groups: int, num_seqs: int
) -> None:
    """Row, column, Gram and table sums without logits against the same sums of every logit, float64
    throughout (rtol 1e-10): windows shorter than, equal to and not a multiple of the Gram blocks."""
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(num_seqs, 2 * groups, seq_len, dim, generator=gen)  # float32, like a capture
    keys = torch.randn(num_seqs, 2, seq_len, dim, generator=gen)
    scaling = dim**-0.5
    grouped = query.double().view(num_seqs, 2, groups, seq_len, dim)
    logits = torch.einsum("nkgid,nkjd->nkgij", grouped, keys.double() * scaling).flatten(1, 2)  # (N, H, T, T)
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    valid = (j <= i) & (i - j < (window or seq_len))
    logits = logits * valid
    span = min(seq_len, window or seq_len)
    boundaries = (0, 1, 9, seq_len)
    stacked = bilinear.Stacked.of(query, keys, scaling)
    rows, offset_weighted = bilinear.row_sums(stacked, window)
    torch.testing.assert_close(rows, logits.sum(-1), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(offset_weighted, (logits * (i - j)).sum((0, -1)), rtol=1e-10, atol=1e-9)
    columns = bilinear.column_sums(stacked, boundaries, span)
    gram = bilinear.gram(stacked, window, boundaries)
    for s, (lo, hi) in enumerate(itertools.pairwise(boundaries)):
        by_offset = torch.stack(
            [torch.diagonal(logits[..., lo:hi, :], offset=lo - d, dim1=-2, dim2=-1).sum(-1) for d in range(span)],
            dim=-1,
        )
        torch.testing.assert_close(columns[s], by_offset, rtol=1e-10, atol=1e-9)
        # each segment by FFT too: column_sums sums short ones directly and takes the largest as the rest
        by_fft = bilinear._fft_columns(stacked, lo, hi, span)
        torch.testing.assert_close(by_fft.view_as(by_offset), by_offset, rtol=1e-10, atol=1e-9)
        flat = logits[:, :, lo:hi].transpose(0, 1).flatten(2)
        torch.testing.assert_close(gram[s], flat @ flat.mT, rtol=1e-10, atol=1e-9)
    grid = Grid(seq_len, linear_until=8, bins_per_octave=2)
    table = bilinear.table_sums(stacked, window, grid)
    expected = torch.zeros_like(table)
    bins = grid.bin_of_position
    for a in range(seq_len):
        for d in range(min(a, span - 1) + 1):
            expected[:, bins[a], bins[d]] += logits[:, :, a, a - d].sum(0)
    torch.testing.assert_close(table, expected, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("spread", [3.0, 900.0], ids=["shifted-exp", "underflow-fallback"])
def test_log_cumulative_sum_exp_against_a_running_logaddexp(spread: float) -> None:
    """m(i)'s log-sum-exp over offsets against numpy's running logaddexp, with logits spread narrowly (the
    cumulative sums of shifted exponentials) and by hundreds of nats (where those would underflow)."""
    g = np.random.default_rng(0).normal(size=(3, 4, 300)) * spread
    expected = np.logaddexp.accumulate(g, axis=-1)
    np.testing.assert_allclose(_log_cumulative_sum_exp(torch.tensor(g)).numpy(), expected, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------ purely relative logits


def _relative_capture(
    seq_len: int,
    window: int | None = None,
    sink: tuple[float, ...] | None = None,
    norm: str = "softmax",
    softcap: float | None = None,
    num_seqs: int = 4,
) -> tuple[LayerCapture, torch.Tensor]:
    """Logits s_ij = f_h(i − j) exactly: q_i = R(iθ)u, k_j = R(jθ)v give u·R((j − i)θ)v (RoPE's own
    construction), the same in every sequence. Returns the capture and f (H, T) at d = 0..T−1."""
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
    query = rotate(u, position).float()[None].expand(num_seqs, -1, -1, -1).contiguous()
    key = rotate(v, position).float()[None].expand(num_seqs, -1, -1, -1).contiguous()
    logits = query.double() @ key.double().mT
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    f = torch.stack([logits[0, :, d, 0] for d in range(seq_len)], dim=-1)  # s_{d,0} = f(d)
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    valid = (j <= i) & (i - j < (window or seq_len))
    log_z = torch.logsumexp(logits.masked_fill(~valid, float("-inf")), dim=-1)
    if sink is not None:
        log_z = torch.logaddexp(log_z, torch.tensor(sink, dtype=torch.float64)[None, :, None])
    if norm == "sigmoid":
        log_z = torch.zeros_like(log_z)
    facts = CallFacts(scaling=1.0, softcap=softcap, causal=True, window=window, prefix=0, norm=norm, sink=sink)
    return LayerCapture(layer=0, facts=facts, query=query, keys=key, log_z=log_z.float()), f


@pytest.mark.parametrize(
    "case",
    [dict(), dict(window=7), dict(sink=(0.5, -1.0)), dict(norm="sigmoid"), dict(softcap=2.0, window=9)],
    ids=["causal", "window", "sink", "sigmoid", "softcap"],
)
def test_purely_relative_logits_have_no_residual_component(case: dict) -> None:
    """w ≡ 0 on every pair, so every residual-stream magnitude and the attention shift are 0, g = f and the count
    term m_count(i) = −logsumexp over d ≤ min(i, W − 1) of f(d) (with the sink logit; 0 for sigmoid), which the row
    term c equals (every sequence has the same logits, so mean log Z_i is that log-sum-exp): analytic values."""
    seq_len = 40
    capture, f = _relative_capture(seq_len, **case)
    result = measure_layer(capture, MeasureSpec(seq_len, 4, Grid(seq_len, "exact"), early=10, resamples=0))
    scale = f.abs().max().item()
    assert result.profile.w.abs().max() < 1e-5 * scale
    shifts = [f"shift_{kind}_{name}{raw}" for kind in ("kl", "tv") for name in ("early", "all") for raw in ("", "_raw")]
    for name in ("resid_early", "resid_all", "resid_early_raw", "resid_all_raw", *shifts):
        value = result.point[name]
        assert value.isnan().all() if case.get("norm") == "sigmoid" and "shift" in name else value.abs().max() < 1e-5
    window = case.get("window") or seq_len
    expected = torch.stack([-torch.logsumexp(f[:, : min(i, window - 1) + 1], dim=-1) for i in range(seq_len)], -1)
    if "sink" in case:
        expected = -torch.logaddexp(-expected, torch.tensor(case["sink"], dtype=torch.float64)[:, None])
    if case.get("norm") == "sigmoid":
        expected = torch.zeros_like(expected)
    torch.testing.assert_close(result.profile.m_count, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(result.profile.c, expected, rtol=1e-5, atol=1e-5)  # sigmoid: both 0
    torch.testing.assert_close(result.profile.g, f[:, :window], rtol=1e-6, atol=1e-6)
    assert result.point["mask_all"].min() > 0.01 or case.get("norm") == "sigmoid"


# --------------------------------------------------------------------------------------------- ΔR²


@pytest.mark.parametrize("window", [None, 6])
def test_delta_r2_from_running_sums_equals_least_squares(window: int | None) -> None:
    """On data unlike attention logits too: s with a strong absolute-position trend, with a large mean
    (the case where raw sums of inconsistent precision cancel), with and without a window."""
    capture, _ = _relative_capture(30, window=window, num_seqs=2)
    gen = torch.Generator().manual_seed(0)
    capture.query = capture.query + torch.randn(capture.query.shape, generator=gen) * 0.3
    capture.query = capture.query + torch.arange(30, dtype=torch.float32)[:, None] / 30 + 4.0
    logits = capture.query.double() @ capture.keys.double().mT
    i, j = torch.arange(30)[:, None], torch.arange(30)[None, :]
    valid = (j <= i) & (i - j < (window or 30))
    capture.log_z = torch.logsumexp(logits.masked_fill(~valid, float("-inf")), dim=-1).float()  # as a kernel gives
    expected = reference_dr2(logits.masked_fill(~valid, float("nan")).numpy(), capture.log_z.double().numpy())
    sums = sum_layer(capture, (0, 1, 30), Grid(30))
    ours = delta_r2(running_sums(sums), DesignMoments.of(MaskSpec(window=window), 30, 2))
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-8)


def test_delta_r2_is_nan_for_a_degenerate_design() -> None:
    for seq_len, window in ((8, 1), (1, None)):  # only d = 0: [1, d] is singular; T = 1: a single pair
        capture, _ = _relative_capture(seq_len, window=window, num_seqs=2)
        sums = sum_layer(capture, (0, seq_len), Grid(seq_len))
        assert delta_r2(running_sums(sums), DesignMoments.of(MaskSpec(window=window), seq_len, 2)).isnan().all()


# ---------------------------------------------------------------------------------------- bootstrap


def _captured(model: torch.nn.Module, ids: torch.Tensor, folder: Path) -> tuple[CaptureFolder, LogitRecorder]:
    """Every layer's captures of `ids` in batches of 2, with the reference recording the same calls."""
    from posleak.capture import CaptureSession

    model = use_posleak_attention(model)
    captures = CaptureFolder(folder)
    recorder = QKRecorder(captures)
    with LogitRecorder(model) as reference:
        session = CaptureSession([recorder])
        for batch, start in enumerate(range(0, ids.shape[0], 2)):
            index = torch.arange(start, min(ids.shape[0], start + 2))
            recorder.batch = batch
            session.forward(model, ids[index], index)
            captures.finish_batch(batch, index, {})
    return captures, reference


@pytest.mark.parametrize("family", ["mistral", "gpt_oss"])
def test_bootstrap_equals_recomputing_each_resample_from_scratch(family: str, tmp_path: Path) -> None:
    """Each resample's magnitudes (from per-sequence sums and the Gram matrices) against the reference
    recomputed on the resampled sequences themselves (repeats included, each copy from its original's document, so
    that the pairs of the noise correction leave out a sequence against its own copy), with the same weights; then
    the percentile intervals of the layer means."""
    model = tiny_model(family)
    num_seqs, resamples = 6, 24
    captures, reference = _captured(model, _ids(model, num_seqs), tmp_path)
    spec = MeasureSpec(T, num_seqs, Grid(T), early=EARLY, resamples=resamples, seed=3, beyond=model_window(reference))
    weights = resample_weights(num_seqs, resamples, seed=3)
    assert (weights.max(1).values >= 2).any()  # a document drawn twice: its copies are no pair
    for layer in captures.layers():
        result = measure_layer(captures.layer(layer), spec)
        _, drawn = spec.resampling()  # type: ignore[misc]
        ours = {name: result.resampled[name][drawn] for name in MAGNITUDES}  # type: ignore[index]
        expected: dict[str, list[np.ndarray]] = {name: [] for name in MAGNITUDES}
        allowance: dict[str, float] = {}
        for draw in weights.long().tolist():
            sequences = [n for n, times in enumerate(draw) for _ in range(times)]
            ref = reference_layer(reference.layers[layer], EARLY, sequences, sequences, beyond=spec.beyond)
            for name in MAGNITUDES:
                expected[name].append(ref.magnitudes[name])
                allowance[name] = max(allowance.get(name, 0.0), magnitude_allowance(name, ref, reference.layers[layer]))
        for name in MAGNITUDES:
            # 1e-6, except past the window: there r is small against the logits whose products the expansion of
            # components.py subtracts, and float64 keeps fewer of its digits (1.05e-6 on tiny gpt-oss)
            tolerance = 1e-5 if "beyond" in name else 1e-6
            assert relative_error(ours[name].numpy(), np.stack(expected[name]), allowance[name]) < tolerance, name
            lo, hi = percentile_interval(ours[name].mean(-1))
            expected_interval = np.quantile(np.stack(expected[name]).mean(-1), [0.025, 0.975])
            np.testing.assert_allclose([lo, hi], expected_interval, rtol=tolerance, atol=allowance[name])


def test_bootstrap_collapses_on_identical_sequences() -> None:
    """Six copies of one sequence: every resample is the sample itself, so intervals are points."""
    model = tiny_model("gemma3")
    result, _ = analyze_recorded(model, _ids(model, 1).repeat(6, 1), bootstrap=50)
    frame = result.per_layer
    for name in ("mask_early", "mask_all", "resid_early", "resid_all"):
        np.testing.assert_allclose(frame[f"{name}_lo"], frame[name], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(frame[f"{name}_hi"], frame[name], rtol=1e-9, atol=1e-12)


def test_an_interval_needs_four_documents_and_is_never_a_point_from_them() -> None:
    """Eight windows of three documents: a bootstrap over three would move among seven distinct draws, so there is
    no interval (NaN, and the note says why); of four documents the intervals of a planted layer with no position
    are finite, wider than a point, and drawn from resamples that each hold two documents at least."""
    for documents, formed in ((3, False), (4, True)):
        planted = Planted(2.0, seq_len=64, num_seqs=8, documents=documents, shared=0.5)
        spec = MeasureSpec(64, 8, Grid(64), resamples=200, seed=1, units=planted.units)
        result = Decomposition.of([measure_layer(planted_layer(planted, 0), spec)], spec)
        lo, hi = result.layer_interval("resid_all")
        assert bool(lo.isfinite().all() and (hi - lo > 1e-3).all()) == formed
        assert (result.bootstrap_note is None) == formed
        if not formed:
            assert "3 documents" in result.bootstrap_note and lo.isnan().all()  # type: ignore[operator]


def test_resample_weights_and_percentiles() -> None:
    weights = resample_weights(7, 300, seed=3)
    assert weights.shape == (300, 7) and (weights.sum(1) == 7).all()
    assert torch.equal(weights, resample_weights(7, 300, seed=3))
    assert not torch.equal(weights, resample_weights(7, 300, seed=4))
    lo, hi = percentile_interval(torch.tensor([[1.0, float("nan")], [2.0, 5.0], [3.0, 6.0]]), 0.5)
    assert lo[0] == 1.5 and hi[0] == 2.5 and lo[1].isnan() and hi[1].isnan()  # a NaN resample is never dropped


def test_no_resample_holds_a_single_document() -> None:
    """A draw of one document repeated has no pair of distinct documents: it is drawn again, never dropped. At
    C = 2 half the draws are, at C = 4 about 1/64; each count is what the manifest records, and the draws that held
    two documents from the start are kept as they were."""
    for count, resamples in ((2, 400), (4, 2000), (8, 200)):
        weights = resample_weights(count, resamples, seed=5)
        assert ((weights > 0).sum(1) >= 2).all()
        redrawn = redrawn_resamples(count, resamples, seed=5)
        plain = torch.randint(count, (resamples, count), generator=torch.Generator().manual_seed(5))
        single = plain.amin(1) == plain.amax(1)
        assert redrawn >= int(single.sum())  # a draw again may itself be single, and is drawn once more
        kept = torch.zeros(resamples, count, dtype=torch.float64).scatter_add_(
            1, plain, torch.ones_like(plain, dtype=torch.float64)
        )
        assert torch.equal(weights[~single], kept[~single])
    assert 150 < redrawn_resamples(2, 400, seed=5) < 600 and 10 < redrawn_resamples(4, 2000, seed=5) < 60


def test_resampling_by_document() -> None:
    """Units are documents numbered by first appearance; a resample draws as many documents as there are, each
    with all its sequences; with every sequence its own document the draw is the sequences' own."""
    documents = ("os", "re", "os", "json", "re", "os")
    units = resampling_units(documents)
    assert units == (0, 1, 0, 2, 1, 0)
    assert resampling_units(("os",) * 6) is None and resampling_units(None) is None  # one document: by sequence
    weights = resample_weights(6, 500, seed=3, units=torch.tensor(units))
    drawn = weights[:, [0, 1, 3]]  # one sequence of each document: how often its document was drawn
    assert (
        (drawn.sum(1) == 3).all() and (weights[:, 0] == weights[:, 2]).all() and (weights[:, 0] == weights[:, 5]).all()
    )
    assert torch.equal(resample_weights(6, 500, seed=3, units=torch.arange(6)), resample_weights(6, 500, seed=3))


def test_a_mean_over_windows_of_few_documents_is_covered_by_resampling_documents() -> None:
    """Windows of 6 documents, 5 each, whose values share their document's effect (sd 1) besides their own (sd
    0.5), true mean 0: over 400 draws the 95% interval resampling documents covers 0 in ≥ 85% (87.75% here: a
    percentile interval over 6 units is itself narrow by about √(5/6)); resampling sequences, as if the 30
    windows were independent, in ≤ 70% (60.75%: too narrow by about √5 in the shared part)."""
    generator = torch.Generator().manual_seed(0)
    units = tuple(k // 5 for k in range(30))
    covered = {"documents": 0, "sequences": 0}
    for draw in range(400):
        values = torch.randn(6, generator=generator)[list(units)] + 0.5 * torch.randn(30, generator=generator)
        for name, by in (("documents", units), ("sequences", None)):
            lo, hi = sequence_mean(values, 400, seed=draw, units=by).interval
            covered[name] += bool(lo <= 0 <= hi)
    assert covered["documents"] >= 0.85 * 400, covered
    assert covered["sequences"] <= 0.70 * 400, covered


# ------------------------------------------------------------------------- the identity probe (C6)

CANDIDATES = list(range(10, 18))  # K = 8 first tokens of the tiny vocabulary
PROBE_AT = (8, 16, 24, 31)


def test_identity_accuracy_equals_a_hand_loop() -> None:
    """Layers of states with no class signal (exact ties: every variant equal), pure noise, a weak and a strong
    planted class offset: the vectorised probe equals a hand loop over every held-out guess, in float64."""
    generator = torch.Generator().manual_seed(0)
    shape = (5, 8, 2, 6)  # S, K, P, d of each layer
    noise = torch.randn(4, *shape, generator=generator)
    offsets = torch.randn(1, 8, 1, 6, generator=generator)  # one per class
    tied = noise[0, :, :1].expand(shape)  # every variant equal: a state that cannot see position 0
    states = torch.stack([tied, noise[1], noise[2] + 0.5 * offsets, noise[3] + 3 * offsets])
    ours = identity_accuracy(states)
    expected = identity_accuracy_by_hand(states.numpy(), CLOSED_SYSTEM_RTOL)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=0, atol=1e-12)
    assert ours.dtype == torch.float64 and (ours[0] == 1 / 8).all() and ours[3].mean() > 0.5


def test_identity_accuracy_centres_on_chance_without_signal_and_finds_a_planted_one() -> None:
    """Over 200 draws of states that vary by noise alone (S = 8, K = 8), the mean held-out accuracy is 1/K within
    0.005 (its standard error is about 0.002); a class offset of half the noise's scale gives ≫ chance."""
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack(
        [identity_accuracy(torch.randn(1, 8, 8, 4, 32, generator=generator)).mean() for _ in range(200)]
    )
    assert abs(draws.mean().item() - 1 / 8) < 0.005
    planted = torch.randn(1, 8, 8, 4, 32, generator=generator) + 0.5 * torch.randn(1, 1, 8, 1, 32, generator=generator)
    assert identity_accuracy(planted).mean() > 0.6


def test_a_tiny_llama_carries_its_first_token_to_later_positions_and_loses_it_without_any_read_of_key_0() -> None:
    """A random tiny Llama (3 layers, T = 32, S = 8, K = 8): at every later layer the probe tells the first token
    (≥ 95%, chance 12.5%); the embedding of later positions, K identical first tokens, and the model with every
    head's reads of key 0 removed (nothing from position 0 reaches a later position) all score 1/K exactly."""
    model = use_posleak_attention(tiny_model("llama"))
    ids = torch.randint(4, model.config.vocab_size, (8, 32), generator=torch.Generator().manual_seed(0))
    accuracy = identity_accuracy(variant_states(model, ids, CANDIDATES, PROBE_AT, batch_size=4))
    assert (accuracy[0] == 1 / 8).all() and (accuracy[1:].mean(1) >= 0.95).all()
    same = identity_accuracy(variant_states(model, ids, [CANDIDATES[0]] * 8, PROBE_AT, batch_size=4))
    every = ",".join(f"{layer}.{head}" for layer in range(3) for head in range(4))
    edits = Interventions(RemoveSinkReads(every)).attention_edits()
    removed = identity_accuracy(variant_states(model, ids, CANDIDATES, PROBE_AT, batch_size=4, edits=edits))
    assert (same == 1 / 8).all() and (removed == 1 / 8).all()


def test_first_token_variants_change_position_0_alone() -> None:
    ids = torch.arange(12).reshape(2, 6)
    variants = first_token_variants(ids, [90, 91, 92])
    assert variants[:, 0].tolist() == [90, 91, 92, 90, 91, 92]
    assert torch.equal(variants[:, 1:], ids[:, 1:].repeat_interleave(3, dim=0)) and ids[0, 0] == 0


# ------------------------------------------------------------------------- grid, captures, results


def test_grid_edges_follow_the_documented_rule() -> None:
    for seq_len in (48, 96, 2048, 8192):
        assert list(Grid(seq_len).edges) == grid_edges(seq_len)
        assert list(Grid(seq_len, "exact").edges) == grid_edges(seq_len, exact=True)
    widths = np.diff(Grid(2048).edges[64:])
    assert widths[0] == 6 and widths[-1] > 100  # 64·2^(1/8) ≈ 69.8 → 70; ~8 bins per doubling


def test_captures_come_back_in_input_order(tmp_path: Path) -> None:
    """Batches written out of order (a resumed run) are read back by sequence index; a batch whose forward
    did not finish (layer files without the closing file) does not count."""
    from posleak.capture import CaptureSession

    model = use_posleak_attention(tiny_model("llama"))
    ids = _ids(model, 4)
    captures = CaptureFolder(tmp_path / "batches")
    recorder = QKRecorder(captures)
    session = CaptureSession([recorder])
    for batch, rows in ((1, [2, 3]), (0, [0, 1]), (2, [0, 1])):
        index = torch.tensor(rows)
        recorder.batch = batch
        session.forward(model, ids[index], index)
        if batch < 2:  # batch 2 is "killed" before it finishes
            captures.finish_batch(batch, index, {"marker": index.double()})
    whole = CaptureFolder(tmp_path / "whole")
    everything = QKRecorder(whole)
    everything.batch = 0
    CaptureSession([everything]).forward(model, ids)
    whole.finish_batch(0, torch.arange(4), {})
    assert captures.batches() == [0, 1] and captures.layers() == [0, 1, 2]
    torch.testing.assert_close(captures.layer(1).query, whole.layer(1).query, rtol=1e-6, atol=1e-6)
    assert [t.tolist() for t in captures.extra("marker")] == [[0.0, 1.0], [2.0, 3.0]]


def test_layer_results_survive_a_checkpoint(tmp_path: Path) -> None:
    """A measured layer saved and read back (a resume) gives the same tables, bit for bit."""
    model = tiny_model("gemma3")
    captures, _ = _captured(model, _ids(model, 4), tmp_path / "captures")
    spec = MeasureSpec(T, 4, Grid(T), early=EARLY, resamples=10)
    result = measure_layer(captures.layer(0), spec)
    torch.save(result.state(), tmp_path / "layer.pt")
    again = LayerResult.from_state(torch.load(tmp_path / "layer.pt", weights_only=True), spec)
    assert again.profile.layout == result.profile.layout
    for name in MAGNITUDES:
        torch.testing.assert_close(again.point[name], result.point[name], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(again.resampled[name], result.resampled[name], rtol=0, atol=0, equal_nan=True)  # type: ignore[index]
    assert torch.equal(again.profile.w, result.profile.w) and torch.equal(again.dr2, result.dr2)
    for name in SHIFTS:
        torch.testing.assert_close(again.point[name], result.point[name], rtol=0, atol=0, equal_nan=True)


def test_mismatched_captures_and_prefix_masks_are_refused() -> None:
    capture, _ = _relative_capture(20)
    with pytest.raises(ValueError, match="holds 4 × 20 tokens"):
        measure_layer(capture, MeasureSpec(20, 5, Grid(20)))
    capture.facts = CallFacts(1.0, None, causal=True, window=None, prefix=4, norm="softmax", sink=None)
    with pytest.raises(NotImplementedError, match="prefix"):
        measure_layer(capture, MeasureSpec(20, 4, Grid(20)))


def test_tables_have_the_analyze_columns() -> None:
    model = tiny_model("qwen2")
    result, _ = analyze_recorded(model, _ids(model, 4, seq_len=96), bootstrap=20)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    per_head = result.per_head
    assert list(per_head.columns) == [
        "layer",
        "head",
        "sink_score",
        *MAGNITUDES,
        *SHIFTS,
        "dr2_logit",
        "dr2_logattn",
    ]
    assert len(per_head) == layers * heads
    values = [f"{kind}_{name}" for kind in ("mask", "resid") for name in ("early", "all", "beyond")]
    values += [f"resid_{name}_{part}" for part in ("key0", "rest") for name in ("early", "all", "beyond")]
    assert list(result.per_layer.columns) == [
        "layer",
        "layer_type",
        "window",
        *values,
        *(f"{v}_{b}" for v in values for b in ("lo", "hi")),
        *(name for name in (*MAGNITUDES, *SHIFTS) if name not in values),
        "sink_rate",
    ]
    # a layer's magnitude is the root of the mean over heads of the squares; its shift the mean over heads
    rms = np.sqrt(per_head.groupby("layer")["mask_all"].apply(lambda v: (v**2).mean()))
    np.testing.assert_allclose(result.per_layer["mask_all"], rms)
    np.testing.assert_allclose(result.per_layer["shift_kl_all"], per_head.groupby("layer")["shift_kl_all"].mean())
    profile_columns = ["layer", "head", "q_lo", "q_hi", "d_lo", "d_hi", "cells", "g", "c", "m_count", "w"]
    assert list(result.profiles.columns) == profile_columns
    assert list(result.offset_map.columns) == ["layer", "q_lo", "q_hi", "d_lo", "d_hi", "value"]
    assert len(result.profiles) == len(result.offset_map) * heads
    assert result.manifest["measurement"]["table_grid"]["kind"] == "coarse"
    assert len(result.bootstrap) == 20 * layers
