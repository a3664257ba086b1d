"""A brute-force reference for posleak's measurements: every logit materialised in float64, the method's
definitions (docs/method.md) applied literally, one (query, offset) pair at a time.

It shares no code with what it checks: it imports nothing from posleak's measuring or capturing packages.
`LogitRecorder` wraps whatever attention function the model runs (through transformers' own registry) and
keeps the q and k each call receives; the logits, the masks (causal, sliding window, bidirectional prefix),
log Z_i (log-sum-exp of its own logits, plus any sink logit), the query ranges and the table grid's bins
(from the grid's documented rule) are all computed here.

`relative_error` and `assert_close` compare NaN-aware: a NaN or infinity in one side where the other has
a finite number fails, and the error is normwise (max |ours − reference| / max |reference|).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

RANGES = ("early", "all", "beyond")
MAGNITUDES = (
    *(f"mask_{name}" for name in RANGES),
    *(f"mask_count_{name}" for name in RANGES),
    *(f"resid_{name}" for name in RANGES),
    *(f"resid_{name}_raw" for name in RANGES),
    *(f"mask_{name}_raw" for name in RANGES),
    *(f"resid_{name}_{part}{raw}" for part in ("key0", "rest") for name in RANGES for raw in ("", "_raw")),
)
SHIFTS = tuple(f"shift_{kind}_{name}{raw}" for kind in ("kl", "tv") for name in RANGES for raw in ("", "_raw"))
SHIFT_QUERIES = 64  # the documented default: at most 64 evenly spaced queries per range


# ------------------------------------------------------------------------------------------ recording


@dataclass
class RecordedLayer:
    """What one layer's attention received, over every forward: q (N, H, T, D), k (N, KV, T, D)."""

    scaling: float
    window: int | None
    softcap: float | None
    sink: np.ndarray | None  # (H,)
    causal: bool
    prefix: int
    sigmoid: bool
    queries: list[torch.Tensor] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)
    _materialised: tuple[np.ndarray, np.ndarray] | None = None

    def materialised(self) -> tuple[np.ndarray, np.ndarray]:
        """The logits and log Z of every recorded sequence (computed once)."""
        if self._materialised is None:
            logits = self.logits()
            self._materialised = logits, self.log_z(logits)
        return self._materialised

    def logits(self) -> np.ndarray:
        """s_ij in float64, (N, H, T, T), NaN where (i, j) is not a valid pair."""
        query, key = torch.cat(self.queries).double(), torch.cat(self.keys).double()
        heads, kv = query.shape[1], key.shape[1]
        key = key.repeat_interleave(heads // kv, dim=1)
        s = (query @ key.transpose(-1, -2) * self.scaling).numpy()
        if self.softcap is not None:
            s = self.softcap * np.tanh(s / self.softcap)
        return np.where(self.valid(s.shape[-1]), s, np.nan)

    def valid(self, seq_len: int) -> np.ndarray:
        """The mask, (T, T) bool: j ≤ i (causal), i − j < W (window); a prefix's queries see all of it."""
        i, j = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
        ok = j <= i if self.causal else np.ones((seq_len, seq_len), dtype=bool)
        if self.window is not None:
            ok = ok & (i - j < self.window)
        if self.prefix:
            ok = ok | ((i < self.prefix) & (j < self.prefix))
        return ok

    def log_z(self, logits: np.ndarray) -> np.ndarray:
        """log Z_i (N, H, T): log-sum-exp over the valid keys, plus the sink logit; 0 for sigmoid attention."""
        if self.sigmoid:
            return np.zeros(logits.shape[:-1])
        terms = [np.where(np.isnan(logits), -np.inf, logits)]
        if self.sink is not None:
            terms.append(np.broadcast_to(self.sink[None, :, None, None], (*logits.shape[:-1], 1)))
        both = np.concatenate(terms, axis=-1)
        top = both.max(axis=-1, keepdims=True)
        return (top + np.log(np.exp(both - top).sum(axis=-1, keepdims=True)))[..., 0]


def mask_window(mask: torch.Tensor | None) -> int | None:
    """The sliding window a 4-D mask tensor holds (boolean: True sees; additive: 0 sees), read from its first row of
    the batch: the most keys any query sees where some query sees fewer than all keys up to itself; else None. A
    model that builds a window but passes no `sliding_window` to its attention (Phi-MoE) has it only here."""
    if mask is None or mask.dim() != 4:
        return None
    sees = mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0
    counts = sees.sum(-1)
    causal = torch.arange(1, sees.shape[-1] + 1, device=counts.device)
    return int(counts.max()) if bool((counts < causal).any()) else None


class LogitRecorder:
    """`with LogitRecorder(model) as recorder:` every attention call of `model` inside the block is kept
    (per layer, in call order: batches in input order give sequences in input order) and then handed to
    the function the model ran before, unchanged."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.layers: dict[int, RecordedLayer] = {}

    def __enter__(self) -> LogitRecorder:
        self.previous = self.model.config._attn_implementation
        inner = ALL_ATTENTION_FUNCTIONS[self.previous]
        AttentionInterface.register(f"reference_{self.previous}", self._recording(inner))
        if self.previous in ALL_MASK_ATTENTION_FUNCTIONS:  # the model asks for the mask the inner function gets
            AttentionMaskInterface.register(f"reference_{self.previous}", ALL_MASK_ATTENTION_FUNCTIONS[self.previous])
        self.model.set_attn_implementation(f"reference_{self.previous}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.model.set_attn_implementation(self.previous)

    def _recording(self, inner: Callable) -> Callable:
        def attention(module, query, key, value, attention_mask, *args, **kwargs):  # type: ignore[no-untyped-def]
            sink = kwargs.get("s_aux")
            layer = self.layers.setdefault(
                int(module.layer_idx),
                RecordedLayer(
                    scaling=kwargs.get("scaling") or query.shape[-1] ** -0.5,
                    window=kwargs.get("sliding_window") or mask_window(attention_mask),
                    softcap=kwargs.get("softcap"),
                    sink=None if sink is None else sink.detach().double().numpy(),
                    causal=bool(getattr(module, "is_causal", True)),
                    prefix=int(kwargs.get("posleak_prefix") or 0),
                    sigmoid=kwargs.get("posleak_norm", "softmax") == "sigmoid",
                ),
            )
            layer.queries.append(query.detach().cpu().clone())  # the float64 reference runs on the CPU
            layer.keys.append(key.detach().cpu().clone())
            return inner(module, query, key, value, attention_mask, *args, **kwargs)

        return attention


# ------------------------------------------------------------------------------------- definitions


def by_offset(values: np.ndarray) -> np.ndarray:
    """(..., T, T) indexed (i, j) → (..., T, T) indexed (i, d = i − j); NaN where j < 0."""
    seq_len = values.shape[-1]
    out = np.full(values.shape, np.nan)
    for d in range(seq_len):
        i = np.arange(d, seq_len)
        out[..., i, d] = values[..., i, i - d]
    return out


@dataclass
class LayerReference:
    """One layer by the definitions: g (H, T) per offset, the row term c and the count term m_count (H, T) per
    query, per-pair w (H, T, T) indexed (i, d), the magnitudes and shifts (H,) of each range, ΔR² (H, 2) and the
    sink score α₀ (H,)."""

    g: np.ndarray
    c: np.ndarray
    m_count: np.ndarray
    w: np.ndarray
    mean_s: np.ndarray  # (H, T, T): mean over sequences of s_{i,i−d}
    mean_logattn: np.ndarray  # (H, T, T): mean over sequences of ℓ_{i,i−d}
    magnitudes: dict[str, np.ndarray]
    dr2: np.ndarray
    sink_score: np.ndarray


def query_ranges(seq_len: int, early: int, beyond: int | None) -> dict[str, tuple[int, int]]:
    """early = 1 ≤ i < K, all = 1 ≤ i < T, and beyond = W ≤ i < T for a model with a sliding window W < T."""
    ranges = {"early": (1, min(early, seq_len)), "all": (1, seq_len)}
    if beyond is not None and beyond < seq_len:
        ranges["beyond"] = (beyond, seq_len)
    return ranges


def model_window(recorder: LogitRecorder) -> int | None:
    """The smallest sliding window of the recorded layers, if any."""
    return min((layer.window for layer in recorder.layers.values() if layer.window), default=None)


def sampled_queries(lo: int, hi: int, sampled: int = SHIFT_QUERIES) -> list[int]:
    """The documented rule: every query of lo ≤ i < hi when there are at most S, else lo + ⌊k(hi − lo)/S⌋."""
    count = hi - lo
    return list(range(lo, hi)) if count <= sampled else [lo + k * count // sampled for k in range(sampled)]


def _softmax(row: np.ndarray) -> np.ndarray:
    top = row.max(axis=-1, keepdims=True)
    weights = np.exp(row - top)
    return weights / weights.sum(axis=-1, keepdims=True)


def _shift(s: np.ndarray, g: np.ndarray, valid: np.ndarray, units: list, rows: list[int]) -> dict[str, np.ndarray]:
    """The attention shift of docs/method.md §7 over `rows`, each (H,): for each query, with p the softmax over the
    valid keys of the mean logits (of all sequences, of each half) and q that of g, the symmetrised KL
    ½ Σ (p − q)(log p − log q) and the TV ½ Σ |p − q| of all sequences (raw), and across the halves
    ½ Σ (p_A − q)(log p_B − log q) (and B against A, averaged) and ¼ Σ [(p_A − q) sign(p_B − q) + (B, A)]. Half A
    is the sequences of the first ⌊C/2⌋ of the C documents in order of first appearance, B of the next ⌊C/2⌋."""
    documents = list(dict.fromkeys(units))
    half = len(documents) // 2
    halves = tuple([k for k, unit in enumerate(units) if unit in documents[lo : lo + half]] for lo in (0, half))
    per_row = []
    for i in rows:
        keys = valid[i]
        q = _softmax(g[:, keys])
        row = s[:, :, i]  # a view: indexing s by a group first would copy every query's logits
        p_all = _softmax(row[:, :, keys].mean(axis=0))
        nan = np.full(q.shape[0], np.nan)
        stats = [0.5 * ((p_all - q) * np.log(p_all / q)).sum(axis=1), nan, 0.5 * np.abs(p_all - q).sum(1), nan]
        if half:
            pa, pb = (_softmax(row[group][:, :, keys].mean(axis=0)) for group in halves)
            da, db = pa - q, pb - q
            stats[1] = 0.25 * ((da * np.log(pb / q)).sum(axis=1) + (db * np.log(pa / q)).sum(axis=1))
            stats[3] = 0.25 * (da * np.sign(db) + db * np.sign(da)).sum(axis=1)
        per_row.append(stats)
    kl_all, kl_halves, tv_all, tv_halves = np.mean(per_row, axis=0)
    return {"kl": kl_halves, "kl_raw": kl_all, "tv": tv_halves, "tv_raw": tv_all}


def reference_layer(
    layer: RecordedLayer,
    early: int,
    sequences: Sequence[int] | None = None,
    units: Sequence[object] | None = None,
    beyond: int | None = None,
    shift: bool = False,
) -> LayerReference:
    """The definitions on the recorded sequences `sequences` (indices, repeats allowed; default all in order), the
    k-th of them from document `units[k]` (default: each its own, a repeat the same as its original). The
    noise-corrected magnitudes are the mean, over every ordered pair of listed sequences of distinct documents, of
    the covariance of their own c and w (each sequence's from its own g), signed-rooted. The attention shift (NaN
    unless `shift`) forms every sampled row's softmax."""
    all_logits, all_log_z = layer.materialised()
    order = list(range(all_logits.shape[0])) if sequences is None else list(sequences)
    units = list(order) if units is None else list(units)
    logits, log_z = all_logits[order], all_log_z[order]
    num_seqs, heads, seq_len, _ = logits.shape
    s = by_offset(logits)  # (N, H, i, d)
    valid = ~np.isnan(s[0, 0])
    with warnings.catch_warnings():  # offsets beyond a window have no pair: their g is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        g = np.nanmean(s, axis=(0, 2))  # (H, d)
        mean_s = np.nanmean(s, axis=0)
    m_count = np.zeros((heads, seq_len))
    if not layer.sigmoid:
        for i in range(seq_len):
            terms = g[:, valid[i]]
            if layer.sink is not None:
                terms = np.concatenate([terms, layer.sink[:, None]], axis=1)
            top = terms.max(axis=1)
            m_count[:, i] = -(top + np.log(np.exp(terms - top[:, None]).sum(axis=1)))

    def by_rows(rows: list[int]) -> tuple[np.ndarray, np.ndarray]:  # c(i) and w(i, d) of the sequences `rows`
        if not rows:
            return np.full((heads, seq_len), np.nan), np.full((heads, seq_len, seq_len), np.nan)
        with warnings.catch_warnings():  # offsets beyond a window have no pair
            warnings.simplefilter("ignore", RuntimeWarning)
            own_g = np.nanmean(s[rows], axis=(0, 2))  # g of these sequences alone: each w is its own estimate
        deviation = np.mean([s[n] - log_z[n][:, :, None] for n in rows], axis=0) - own_g[:, None, :]
        c = np.zeros((heads, seq_len)) if layer.sigmoid else np.nanmean(deviation, axis=2)  # sigmoid: no row term
        return c, deviation - c[:, :, None]

    def rest(w: np.ndarray) -> np.ndarray:  # w without its key-0 column, each row that has one re-centred over j ≥ 1
        out = w.copy()
        for i in range(1, seq_len):
            if valid[i, i]:  # query i sees key 0 (offset d = i)
                others = valid[i].copy()
                others[i] = False
                out[:, i, others] -= out[:, i, others].mean(axis=1, keepdims=True)
                out[:, i, i] = 0.0
        return out

    c, w = by_rows(list(range(num_seqs)))
    own = [by_rows([k]) for k in range(num_seqs)]  # each sequence's own c and w
    w_rest, own_rest = rest(w), [rest(own_w) for _, own_w in own]
    pairs = [(k, m) for k in range(num_seqs) for m in range(num_seqs) if units[k] != units[m]]
    magnitudes = {name: np.full(heads, np.nan) for name in (*MAGNITUDES, *SHIFTS)}  # NaN where a range does not exist
    for name, (lo, hi) in query_ranges(seq_len, early, beyond).items():
        inside = valid.copy()
        inside[:lo] = False
        inside[hi:] = False

        def cov(x: np.ndarray, y: np.ndarray, inside: np.ndarray = inside) -> np.ndarray:
            # corrected two-pass: the second term removes the rounding of the first pass's means, which over
            # tens of thousands of pairs leaves ~1e-12·|m| where m is constant (past a sliding window)
            dx = x[:, inside] - x[:, inside].mean(axis=1, keepdims=True)
            dy = y[:, inside] - y[:, inside].mean(axis=1, keepdims=True)
            return (dx * dy).mean(axis=1) - dx.mean(axis=1) * dy.mean(axis=1)

        def per_pair(per_query: np.ndarray) -> np.ndarray:
            return np.broadcast_to(per_query[:, :, None], w.shape)

        magnitudes[f"mask_{name}_raw"] = np.sqrt(np.maximum(0.0, cov(per_pair(c), per_pair(c))))
        magnitudes[f"mask_count_{name}"] = np.sqrt(np.maximum(0.0, cov(per_pair(m_count), per_pair(m_count))))
        magnitudes[f"resid_{name}_raw"] = np.sqrt(np.maximum(0.0, cov(w, w)))
        if not layer.sigmoid:  # sigmoid attention's w is not centred per row: no split (NaN)
            rest_sq, all_sq = cov(w_rest, w_rest), cov(w, w)
            magnitudes[f"resid_{name}_rest_raw"] = np.sqrt(np.maximum(0.0, rest_sq))
            magnitudes[f"resid_{name}_key0_raw"] = np.sqrt(np.maximum(0.0, all_sq - rest_sq))
            if pairs:
                rest_pairs = np.mean([cov(own_rest[k], own_rest[m]) for k, m in pairs], axis=0)
                all_pairs = np.mean([cov(own[k][1], own[m][1]) for k, m in pairs], axis=0)
                for part, value in (("rest", rest_pairs), ("key0", all_pairs - rest_pairs)):
                    magnitudes[f"resid_{name}_{part}"] = np.sign(value) * np.sqrt(np.abs(value))
        for kind in ("resid", "mask"):
            if not pairs:
                magnitudes[f"{kind}_{name}"] = np.full(heads, np.nan)
                continue
            if kind == "resid":
                covariance = np.mean([cov(own[k][1], own[m][1]) for k, m in pairs], axis=0)
            else:
                covariance = np.mean([cov(per_pair(own[k][0]), per_pair(own[m][0])) for k, m in pairs], axis=0)
            magnitudes[f"{kind}_{name}"] = np.sign(covariance) * np.sqrt(np.abs(covariance))
        if shift and not layer.sigmoid:
            for kind, value in _shift(s, g, valid, units, sampled_queries(lo, hi)).items():
                magnitudes[f"shift_{kind.replace('_raw', '')}_{name}{'_raw' if kind.endswith('_raw') else ''}"] = value
    key0 = np.where(np.isnan(logits[..., 0]), -np.inf, logits[..., 0])  # (N, H, T)
    attention_on_key0 = 1 / (1 + np.exp(-key0)) if layer.sigmoid else np.exp(key0 - log_z)
    return LayerReference(
        g=g,
        c=c,
        m_count=m_count,
        w=w,
        mean_s=mean_s,
        mean_logattn=np.mean(s - log_z[..., None], axis=0),
        magnitudes=magnitudes,
        dr2=reference_dr2(logits, log_z),
        sink_score=attention_on_key0[:, :, 1:].mean(axis=(0, 2)),
    )


def layer_value(name: str, per_head: np.ndarray) -> np.ndarray:
    """A layer's value from its heads': the mean for a shift, else the root of the mean of the (signed) squares."""
    if name.startswith("shift_"):
        return per_head.mean(keepdims=True)
    mean = (per_head * np.abs(per_head)).mean(keepdims=True)
    return np.sign(mean) * np.sqrt(np.abs(mean))


def reference_dr2(logits: np.ndarray, log_z: np.ndarray) -> np.ndarray:
    """ΔR² per head for y = s and y = ℓ by least squares over every valid (n, i, j): (H, 2). One
    `numpy.linalg.lstsq` per design serves every head and both ys (its right-hand sides)."""
    heads = logits.shape[1]
    n, i, j = np.nonzero(~np.isnan(logits[:, 0]))
    s = logits[n, :, i, j]  # (pairs, H)
    ys = np.concatenate([s, s - log_z[n, :, i]], axis=1)  # (pairs, 2H)
    full = np.stack([np.ones_like(i), i, j], 1).astype(float)
    relative = np.stack([np.ones_like(i), i - j], 1).astype(float)
    total = ((ys - ys.mean(axis=0)) ** 2).sum(axis=0)
    r2 = [1 - _residual_ss(x, ys) / total for x in (full, relative)]
    return (r2[0] - r2[1]).reshape(2, heads).T


def _residual_ss(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    return ((y - x @ beta) ** 2).sum(axis=0)


# -------------------------------------------------------------------------------------- table grid


def grid_edges(seq_len: int, exact: bool = False, linear_until: int = 64, bins_per_octave: int = 8) -> list[int]:
    """The documented rule: one position per bin below `linear_until`, then edges at
    round(linear_until · 2^(k / bins_per_octave)) for k = 1, 2, …, each at least one past the previous,
    the last one T; the exact grid has one position per bin everywhere."""
    if exact:
        return list(range(seq_len + 1))
    edges = list(range(min(linear_until, seq_len) + 1))
    k = 1
    while edges[-1] < seq_len:
        edges.append(min(seq_len, max(round(linear_until * 2 ** (k / bins_per_octave)), edges[-1] + 1)))
        k += 1
    return edges


def _cells(valid: np.ndarray, edges: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The valid pairs (i, d), the cell of each (query bin · bins + offset bin), and the number of bins."""
    bin_of = np.searchsorted(np.asarray(edges), np.arange(valid.shape[0]), side="right") - 1
    bins = len(edges) - 1
    i, d = np.nonzero(valid)
    return i, d, bin_of[i] * bins + bin_of[d], bins


def cell_counts(valid: np.ndarray, edges: list[int]) -> dict[tuple[int, int], int]:
    """Valid pairs per cell: (first query, first offset of the cell) → count, for cells that hold one."""
    _, _, cell, bins = _cells(valid, edges)
    count = np.bincount(cell, minlength=bins * bins)
    return {(edges[c // bins], edges[c % bins]): int(count[c]) for c in np.nonzero(count)[0]}


def cell_means(values: np.ndarray, valid: np.ndarray, edges: list[int]) -> dict[tuple[int, int], np.ndarray]:
    """Mean over each cell's valid pairs of per-pair values (H, T, T) indexed (i, d): (first query, first
    offset of the cell) → (H,), for the cells that hold a valid pair."""
    i, d, cell, bins = _cells(valid, edges)
    count = np.bincount(cell, minlength=bins * bins)
    sums = np.stack([np.bincount(cell, weights=head[i, d], minlength=bins * bins) for head in values])
    return {(edges[c // bins], edges[c % bins]): sums[:, c] / count[c] for c in np.nonzero(count)[0]}


# -------------------------------------------------------------------------------------- comparison


def relative_error(ours: np.ndarray | torch.Tensor, ref: np.ndarray, allowance: float = 0.0) -> float:
    """max |ours − ref| / max |ref| over the finite entries; infinity where one side is NaN or infinite
    and the other is not (so a NaN result can never compare as close). `allowance` is an absolute error
    forgiven first (a known floor of precision, stated where it is used)."""
    ours, ref = np.asarray(ours, dtype=float), np.asarray(ref, dtype=float)
    if ours.shape != ref.shape:
        raise AssertionError(f"shapes differ: ours {ours.shape}, reference {ref.shape}")
    finite_ours, finite_ref = np.isfinite(ours), np.isfinite(ref)
    if (finite_ours != finite_ref).any():
        return float("inf")
    if not finite_ref.any():
        return 0.0
    scale = np.abs(ref[finite_ref]).max()
    error = max(0.0, np.abs(ours[finite_ref] - ref[finite_ref]).max() - allowance)
    return float(error / (scale if scale > 0 else 1.0))


def log_z_allowance(layer: RecordedLayer) -> float:
    """What posleak's log Z may differ by: it takes log Z from the model's float32 kernel (docs/method.md), so 4
    float32 units in the last place of the largest log Z are forgiven in what carries it (the row term c)."""
    return 4 * float(np.spacing(np.float32(np.abs(layer.materialised()[1]).max())))


def magnitude_allowance(name: str, ref: LayerReference, layer: RecordedLayer) -> float:
    """The absolute error forgiven in the magnitude `name`: the count term's magnitude is a spread of m_count, and
    where m_count is constant (every query past a sliding window sees W keys) the defined value is 0 while the
    reference's float64 mean over up to T² pairs leaves a residue of order log₂(T²)·eps·|m_count|; forgive
    1024 eps·max|m_count| (2e-13·max|m_count|). The row term's carries log Z (`log_z_allowance`). Others: none."""
    if name.startswith("mask_count_"):
        return float(1024 * np.finfo(float).eps * np.abs(ref.m_count).max())
    if name.startswith("resid_"):
        # both sides sum terms that cancel where w is 0 (a layer whose logits are all equal): posleak products of
        # logits (components.py), the root of a residue of order eps·s²; this reference ℓ − c, a residue of order
        # eps·|ℓ| (2.6e-16 on tiny Zaya, whose logits are all 0); forgive 1e-6 of the largest mean |ℓ|
        return float(1e-6 * np.nanmax(np.abs(ref.mean_logattn), initial=0.0))
    return log_z_allowance(layer) if name.startswith("mask_") else 0.0


def assert_close(errors: dict[str, float], tolerance: float) -> None:
    """Fail naming every quantity whose error is above `tolerance` (NaN errors fail too)."""
    failing = {name: error for name, error in errors.items() if not error <= tolerance}
    assert not failing, f"relative errors above {tolerance}: {failing}"


def table_errors(
    per_head: pd.DataFrame,
    per_layer: pd.DataFrame,
    profiles: pd.DataFrame,
    offset_map: pd.DataFrame,
    recorder: LogitRecorder,
    early: int,
    edges: list[int],
    shift: bool = True,
) -> dict[str, float]:
    """The largest relative error (over layers) of every column of posleak's tables against the
    definitions: per head (every magnitude, the attention shift unless not `shift`, ΔR², sink score), per layer
    (`layer_value` of the heads'), and the profile and offset-map cells on the grid with these `edges`."""
    errors: dict[str, list[float]] = {}

    def record(name: str, ours: object, ref: np.ndarray, allowance: float = 0.0) -> None:
        errors.setdefault(name, []).append(relative_error(np.asarray(ours, dtype=float), ref, allowance))

    beyond = model_window(recorder)
    for layer, recorded in sorted(recorder.layers.items()):
        ref = reference_layer(recorded, early, beyond=beyond, shift=shift)
        heads = per_head[per_head["layer"] == layer].sort_values("head")
        row = per_layer[per_layer["layer"] == layer]
        for name in (*MAGNITUDES, *SHIFTS) if shift else MAGNITUDES:
            allowance = magnitude_allowance(name, ref, recorded)
            record(name, heads[name], ref.magnitudes[name], allowance)
            if name in per_layer:
                record(f"per_layer.{name}", row[name], layer_value(name, ref.magnitudes[name]), allowance)
        record("dr2_logit", heads["dr2_logit"], ref.dr2[:, 0])
        record("dr2_logattn", heads["dr2_logattn"], ref.dr2[:, 1])
        record("sink_score", heads["sink_score"], ref.sink_score)

        valid = ~np.isnan(ref.w[0])
        per_pair = {
            "g": np.broadcast_to(ref.g[:, None, :], ref.w.shape),
            "c": np.broadcast_to(ref.c[:, :, None], ref.w.shape),
            "m_count": np.broadcast_to(ref.m_count[:, :, None], ref.w.shape),
            "w": ref.w,
        }
        cells = profiles[profiles["layer"] == layer]
        keys = list(zip(cells["q_lo"], cells["d_lo"], strict=True))
        counts = cell_counts(valid, edges)
        record("profiles.cells", cells["cells"], np.array([counts[key] for key in keys], dtype=float))
        for name, values in per_pair.items():
            means = cell_means(values, valid, edges)
            heads_of = cells["head"].to_numpy()
            record(
                f"profiles.{name}",
                cells[name],
                np.array([means[k][h] for k, h in zip(keys, heads_of, strict=True)]),
                # c carries log Z; w is a difference of terms of the size of ℓ (1e-12 of the largest forgiven)
                {"c": log_z_allowance(recorded), "w": 1e-12 * float(np.nanmax(np.abs(ref.mean_logattn)))}.get(name, 0),
            )
        mapped = offset_map[offset_map["layer"] == layer]
        means = cell_means(ref.mean_s - ref.g[:, None, :], valid, edges)
        map_keys = list(zip(mapped["q_lo"], mapped["d_lo"], strict=True))
        record("offset_map", mapped["value"], np.array([means[key].mean() for key in map_keys]))
        if set(keys) != set(means):
            errors.setdefault("profiles.cell_set", []).append(float("inf"))
        recorded._materialised = None  # one layer's logits at a time
    return {name: float(np.max(values)) for name, values in errors.items()}


def identity_error(profiles: pd.DataFrame, recorder: LogitRecorder, early: int) -> float:
    """mean over sequences of ℓ = g + c + w on every cell of an exact-grid profile table (worst layer)."""
    worst = 0.0
    for layer, recorded in recorder.layers.items():
        ref = reference_layer(recorded, early)
        cells = profiles[profiles["layer"] == layer]
        i, d, h = (cells[name].to_numpy() for name in ("q_lo", "d_lo", "head"))
        identity = cells["g"].to_numpy() + cells["c"].to_numpy() + cells["w"].to_numpy()
        worst = max(worst, relative_error(identity, ref.mean_logattn[h, i, d]))
    return worst


# ------------------------------------------------------------------------------------------ the identity probe


def identity_accuracy_by_hand(states: np.ndarray, tie: float) -> np.ndarray:
    """The identity probe's held-out accuracy (L, S) from states (L, S, K, P, d), one guess at a time: for held-out
    sequence s, layer l and position p, each variant's state minus the mean of s's K variants, against each class
    mean of the other sequences' states centred the same way; the nearest class wins, and the classes within
    `tie`·(the layer's mean state norm) of the nearest share the guess's credit."""
    layers, seqs, count, positions, _ = states.shape
    x = states.astype(np.float64)
    accuracy = np.zeros((layers, seqs))
    for layer in range(layers):
        scale = np.mean(
            [np.linalg.norm(x[layer, t, k, p]) for t in range(seqs) for k in range(count) for p in range(positions)]
        )
        for s in range(seqs):
            credit = 0.0
            for p in range(positions):
                centred = [
                    [x[layer, t, k, p] - x[layer, t, :, p].mean(axis=0) for k in range(count)] for t in range(seqs)
                ]
                for k in range(count):
                    distances = []
                    for j in range(count):
                        mean_j = sum(centred[t][j] for t in range(seqs) if t != s) / (seqs - 1)
                        distances.append(float(np.sqrt(np.sum((centred[s][k] - mean_j) ** 2))))
                    tied = [j for j, d in enumerate(distances) if d <= min(distances) + tie * scale]
                    credit += (k in tied) / len(tied)
            accuracy[layer, s] = credit / (count * positions)
    return accuracy
