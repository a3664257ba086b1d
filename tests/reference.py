"""Brute-force reference for posleak.measure: every logit materialised, DESIGN.md §3.1–3.2 applied literally.

`Recorder` keeps, per layer, all logits s_ij (recomputed in float64 from the call's post-RoPE q and k,
soft-capped like the model) and log Z_i of every sequence. `reference(...)` computes g, m, r, the
magnitudes, the split-half correction and ΔR² (numpy.linalg.lstsq on the materialised cells) with
explicit loops and masks, in float64. On a coarse grid it applies the grid's definitional choices the
same literal way: every offset takes its bin's g, cell values are means over the cell's pairs,
magnitudes run over the cells whose query bin lies wholly in the range, weighted by their pairs.

`check_against_reference(model, ids, grid, early)` runs a model once with both the recorder and a
`DecompositionAccumulator` and returns the largest relative error of every quantity; the lead's
real-model checks reuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from posleak.capture import AttentionCall, CaptureSession, MaskSpec, use_posleak_attention
from posleak.capture.session import soft_cap
from posleak.measure import MAGNITUDES, Decomposition, DecompositionAccumulator, Grid
from posleak.measure.decomposition import CellPath


@dataclass
class RecordedLayer:
    mask: MaskSpec
    sigmoid: bool
    sink: np.ndarray | None  # (H,)
    logits: dict[int, np.ndarray] = field(default_factory=dict)  # sequence → (H, T, T), NaN where invalid
    log_z: dict[int, np.ndarray] = field(default_factory=dict)  # sequence → (H, T)

    def stacked(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, H, T, T) logits and (N, H, T) log Z in input order."""
        order = sorted(self.logits)
        return np.stack([self.logits[n] for n in order]), np.stack([self.log_z[n] for n in order])


class Recorder:
    """An accumulator that keeps everything (tests only)."""

    needs_attended_keys = False

    def __init__(self) -> None:
        self.layers: dict[int, RecordedLayer] = {}

    def update(self, call: AttentionCall) -> None:
        sink = None if call.sink is None else call.sink.double().numpy()
        layer = self.layers.setdefault(call.layer, RecordedLayer(call.mask, call.norm == "sigmoid", sink))
        logits = soft_cap(call.query.double() @ call.key.double().mT * call.scaling, call.softcap)
        valid = call.mask.dense(call.seq_len)
        logits = logits.masked_fill(~valid, float("nan")).numpy()
        for row, seq in enumerate(call.sequence_index.tolist()):
            layer.logits[seq] = logits[row]
            layer.log_z[seq] = call.log_z[row].double().numpy()


@dataclass
class Reference:
    """Per layer: g per offset (H, T), m per query (H, T), per-cell values (H, C) on the grid's layout,
    per-cell means of ℓ (the identity's left side), magnitudes (H,) and ΔR² (H, 2)."""

    g: np.ndarray
    m: np.ndarray
    cell_sums: np.ndarray  # Σ over n and the cell's valid pairs of s
    cell_g: np.ndarray
    cell_m: np.ndarray
    cell_r: np.ndarray
    cell_mean_logattn: np.ndarray
    offset_map: np.ndarray  # (C,): mean over heads
    magnitudes: dict[str, np.ndarray]
    dr2: np.ndarray


def by_offset(values: np.ndarray) -> np.ndarray:
    """(..., T, T) indexed (i, j) → (..., T, T) indexed (i, d = i − j); NaN where j < 0."""
    seq_len = values.shape[-1]
    out = np.full(values.shape, np.nan)
    for d in range(seq_len):
        i = np.arange(d, seq_len)
        out[..., i, d] = values[..., i, i - d]
    return out


def reference(layer: RecordedLayer, grid: Grid, early: int) -> Reference:
    logits, log_z = layer.stacked()
    num_seqs, heads, seq_len, _ = logits.shape
    s = by_offset(logits)  # (N, H, i, d), NaN at invalid pairs
    valid = ~np.isnan(s[0, 0])
    bin_of = grid.bin_of_position.numpy()
    edges = grid.edges

    # g(d): mean over n and valid i of s_{i,i−d}; on a coarse grid, over the offsets of d's bin
    g = np.full((heads, seq_len), np.nan)
    for d in range(seq_len):
        lo, hi = edges[bin_of[d]], edges[bin_of[d] + 1]
        if valid[:, lo:hi].any():
            g[:, d] = np.nanmean(s[:, :, :, lo:hi], axis=(0, 2, 3))
    # m(i) = −log Σ over valid d of exp g(d), plus the sink logit; 0 for sigmoid attention
    m = np.zeros((heads, seq_len))
    if not layer.sigmoid:
        for i in range(seq_len):
            terms = g[:, valid[i]]
            if layer.sink is not None:
                terms = np.concatenate([terms, layer.sink[:, None]], axis=1)
            m[:, i] = -np.logaddexp.reduce(terms, axis=1)

    def residual(seqs: list[int]) -> np.ndarray:  # r(i, d) = mean over seqs of (s − g(d)) − (log Z_i + m(i))
        return np.mean(
            [(s[n] - g[:, None, :]) - (log_z[n][:, :, None] + m[:, :, None]) for n in seqs], axis=0
        )  # (H, i, d)

    half = num_seqs // 2
    r = residual(list(range(num_seqs)))
    if half:
        r_a, r_b = residual(list(range(half))), residual(list(range(half, 2 * half)))
    else:  # one sequence: no halves
        r_a = r_b = np.full_like(r, np.nan)
    logattn = np.mean(s - log_z[..., None], axis=0)

    layout = grid.layout(layer.mask)
    cells = list(
        zip(layout.q_lo.tolist(), layout.q_hi.tolist(), layout.d_lo.tolist(), layout.d_hi.tolist(), strict=True)
    )

    single = grid.kind == "exact"  # every cell is one pair: index it (a loop over 10⁵ cells is too slow)
    i, d = layout.q_lo.numpy(), layout.d_lo.numpy()

    def per_cell(values: np.ndarray) -> np.ndarray:  # mean over each cell's valid pairs, (H, i, d) → (H, C)
        if single:
            return values[:, i, d]
        return np.stack([np.nanmean(values[:, q0 : q1 + 1, d0 : d1 + 1], axis=(1, 2)) for q0, q1, d0, d1 in cells], 1)

    if single:
        count = np.ones(len(cells))
    else:
        count = np.array([valid[q0 : q1 + 1, d0 : d1 + 1].sum() for q0, q1, d0, d1 in cells], dtype=float)
    m_pairs = np.where(valid, m[:, :, None], np.nan)
    g_pairs = np.where(valid, g[:, None, :], np.nan)
    cell_sums = per_cell(s.sum(axis=0)) * count  # Σ over n and the cell's pairs: the mean times the count
    cell_m, cell_r, cell_r_a, cell_r_b = (per_cell(v) for v in (m_pairs, r, r_a, r_b))

    magnitudes = {}
    for name, (lo, hi) in {"early": (1, min(early, seq_len)), "all": (1, seq_len)}.items():
        inside = np.array([q0 >= lo and q1 < hi for q0, q1, _, _ in cells])
        w = count[inside] / count[inside].sum()

        def cov(x: np.ndarray, y: np.ndarray, w: np.ndarray = w, inside: np.ndarray = inside) -> np.ndarray:
            dx = x[:, inside] - (x[:, inside] * w).sum(1, keepdims=True)
            dy = y[:, inside] - (y[:, inside] * w).sum(1, keepdims=True)
            return (dx * dy * w).sum(1)

        magnitudes[f"mask_{name}"] = np.sqrt(cov(cell_m, cell_m))
        magnitudes[f"resid_{name}_raw"] = np.sqrt(cov(cell_r, cell_r))
        magnitudes[f"resid_{name}"] = np.sqrt(np.maximum(0.0, cov(cell_r_a, cell_r_b)))

    return Reference(
        g=g,
        m=m,
        cell_sums=cell_sums,
        cell_g=per_cell(g_pairs),
        cell_m=cell_m,
        cell_r=cell_r,
        cell_mean_logattn=per_cell(logattn),
        offset_map=per_cell(s.mean(axis=0) - g[:, None, :]).mean(0),  # NaN stays at invalid pairs
        magnitudes=magnitudes,
        dr2=reference_dr2(logits, log_z),
    )


def reference_dr2(logits: np.ndarray, log_z: np.ndarray) -> np.ndarray:
    """ΔR² per head for y = s and y = ℓ by least squares over every valid (n, i, j): (H, 2)."""
    heads = logits.shape[1]
    n, i, j = np.nonzero(~np.isnan(logits[:, 0]))
    full = np.stack([np.ones_like(i), i, j], 1).astype(float)
    relative = np.stack([np.ones_like(i), i - j], 1).astype(float)
    out = np.full((heads, 2), np.nan)
    for h in range(heads):
        s = logits[n, h, i, j]
        for k, y in enumerate((s, s - log_z[n, h, i])):
            r2 = [1 - _residual_ss(x, y) / ((y - y.mean()) ** 2).sum() for x in (full, relative)]
            out[h, k] = r2[0] - r2[1]
    return out


def _residual_ss(x: np.ndarray, y: np.ndarray) -> float:
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(((y - x @ beta) ** 2).sum())


def relative_error(ours: np.ndarray | torch.Tensor, ref: np.ndarray) -> float:
    """max |ours − ref| / max |ref| over the entries where the reference is defined (normwise)."""
    ours = np.asarray(ours, dtype=float)
    defined = ~np.isnan(ref)
    if not defined.any():
        return 0.0 if np.isnan(ours).all() else float("inf")
    scale = np.abs(ref[defined]).max()
    return float(np.abs(ours[defined] - ref[defined]).max() / (scale if scale > 0 else 1.0))


def run(
    model: PreTrainedModel,
    ids: torch.Tensor,
    grid: Grid,
    early: int = 32,
    batch_size: int = 2,
    path: CellPath = "auto",
    resamples: int = 0,
) -> tuple[DecompositionAccumulator, Decomposition, Recorder]:
    """One pass over `ids` in batches with the accumulator and the recorder side by side."""
    use_posleak_attention(model)
    accumulator = DecompositionAccumulator(grid, ids.shape[1], ids.shape[0], early=early, path=path)
    recorder = Recorder()
    session = CaptureSession([accumulator, recorder])
    for start in range(0, ids.shape[0], batch_size):
        stop = min(ids.shape[0], start + batch_size)
        session.forward(model, ids[start:stop], torch.arange(start, stop))
    return accumulator, accumulator.result(resamples=resamples), recorder


def compare(result: Decomposition, accumulator: DecompositionAccumulator, recorder: Recorder) -> dict[str, float]:
    """Largest relative error (`relative_error`, per layer, max over layers) of every quantity."""
    errors: dict[str, float] = {}

    def record(name: str, value: float) -> None:
        errors[name] = max(errors.get(name, 0.0), value)

    for index, profile in enumerate(result.layer_profiles):
        ref = reference(recorder.layers[profile.layer], result.grid, result.early)
        layout = profile.layout
        sums = accumulator.layers[profile.layer]
        g_per_offset = profile.g[:, result.grid.bin_of_position].numpy()
        record("g", relative_error(np.where(np.isnan(ref.g), np.nan, g_per_offset), ref.g))
        record("m", relative_error(profile.m, ref.m))
        record("cell_sums", relative_error(sums.arrays(layout).cells.sum(0), ref.cell_sums))
        record("cell_g", relative_error(profile.g_cell, ref.cell_g))
        record("cell_m", relative_error(profile.m_cell, ref.cell_m))
        record("r", relative_error(profile.r, ref.cell_r))
        identity = profile.g_cell + profile.m_cell + profile.r
        record("identity", relative_error(identity, ref.cell_mean_logattn))
        record("offset_map", relative_error(profile.offset_map, ref.offset_map))
        for name in MAGNITUDES:
            record(name, relative_error(result.magnitudes[name][index], ref.magnitudes[name]))
        record("dr2_logit", relative_error(result.dr2[index, :, 0], ref.dr2[:, 0]))
        record("dr2_logattn", relative_error(result.dr2[index, :, 1], ref.dr2[:, 1]))
    return errors


def check_against_reference(
    model: PreTrainedModel,
    ids: torch.Tensor,
    grid: Grid | str,
    early: int = 32,
    batch_size: int = 2,
    path: CellPath = "auto",
    tolerance: float = 1e-5,
    resamples: int = 0,
) -> dict[str, float]:
    """Run `model` on `ids`, compare every quantity with the brute-force reference, and fail (AssertionError)
    when one differs by more than `tolerance` relative. Returns the errors."""
    grid = grid if isinstance(grid, Grid) else Grid(ids.shape[1], grid)
    accumulator, result, recorder = run(model, ids, grid, early, batch_size, path, resamples)
    errors = compare(result, accumulator, recorder)
    failing = {name: error for name, error in errors.items() if not error <= tolerance}
    assert not failing, f"relative errors above {tolerance}: {failing}"
    return errors
