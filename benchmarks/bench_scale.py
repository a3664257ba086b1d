"""Cost of posleak's measurement at the scale of 7B–70B checkpoints: one synthetic layer of each named shape.

For each shape (the attention of a real checkpoint: heads H, KV heads, head dim D, layers L, sliding window),
length T and number of sequences N: random q (N, H, T, D) and k (N, KV, T, D) in float32 on the device (a
fixed seed, one per row), the exact log Z_i (log-sum-exp over query i's valid keys, in float64 on the device),
and `measure_layer` with `MeasureSpec(seq_len=T, num_seqs=N, table_grid=Grid(T, "coarse"))` (plus `beyond=W`
for a windowed shape), timed once after one untimed warm-up of both ways of summing at a small size (T = 256,
N = 2: thread pools, FFT plans and kernel choices are one-time costs). `measure_layer` is handed the capture
on the device that made it, as the in-forward path hands it, and forms its float64 sums there where the device
has float64 (posleak.device.sums_device). N ≥ 2 (the noise correction pairs distinct sequences).

Printed per row: seconds per layer; the achieved float64 GFLOP/s, the operation count below over those seconds,
against the device's peak, measured on the spot as the best of a few float64 n × n matmuls on that device
(n = 2048 on the CPU, 8192 elsewhere, 2n³ operations each); peak memory above the resident capture (on CUDA
`torch.cuda.max_memory_allocated`, on the CPU the kernel's high-water mark, as bench_analyze.py measures it);
and projected times: one whole-model analysis = seconds per layer × L, and `posleak paper --quick` at that
scale = A × L × seconds per layer, A the analyses of the --quick plan (posleak.experiments.paper.counts.
analysis_count: the shared analyses of both samples, C4's window line where the plan measures it, C3's runs and
its selection baselines); the projection assumes every one of them is a model of this shape at this T and N and
counts only the measurement (not the forwards, the lab's small models or the report).

Operation count (multiply-adds count 2, as in the peak's matmul). `measure_layer` takes the path that
posleak.measure.layer_sums.choose_path takes: materialised for T ≤ 2·N·D, else bilinear. With W = min(T,
window), b = 128 positions per Gram block, A = ⌈T / b⌉ blocks, c = the grid's linear bins (64):
  bilinear (posleak/measure/bilinear.py), the O(T·(N·D)²) Gram products and the O(T log T) column sums:
    full Gram blocks   (H + KV)·(A − 1)·b·N(N + 1)·D²: the Q_i Q_iᵀ of every query block after the first (per
                       head) and the K_j K_jᵀ of every key block before the last (per KV head), over the pairs
                       of sequences n ≤ n' (N(N + 1)/2 blocks of D × D); none under a window W < 2b; their inner
                       products add 1/b of that and are left out;
    partial Gram blocks 2N(D + N)·H·b²·Σ_δ (A − δ): the logits of the diagonal blocks (δ = 0) and, under a
                       window, of the blocks at its edge, and each block's N × N Gram;
    column sums, FFT   per pass 2.5·L·log2(L)·N·(D·(H + KV) + H) + 8·N·H·D·(T + 1), L = 2T: a real FFT of every
                       dimension of q and k (2.5·L·log2 L each, the usual count), the spectra's products summed
                       over D, one inverse per head and sequence; one pass for all queries and one per other
                       segment that column_sums sums by FFT (its rule);
    column sums, direct 2·N·H·D·Σ (hi − lo)·hi: the logits of the short segments it sums directly;
    rows and sink score 6·H·T·N·D: q_i against the sums of k and of j·k over its keys, and against key 0;
    tables             2·H·N·D·(T·(2c − 1) + Σ_e (T − e')): q against 2c − 1 keys per row of the near offsets'
                       blocks, and q_i against the prefix sum at each far edge e that row i reaches (e' = min(e,
                       W) − 1);
  materialised (layer_sums._materialised), per block of r query rows (N·H·r·W ≤ 2²¹ logits, r ≤ 64) ending at
  q1: logits 2·N·H·D·r·(r + min(q1, W) − 1) and Gram 2·N²·H·r·min(q1, W);
  both paths, the attention shift (posleak/measure/shift.py), per block of its sampled rows (shift.row_blocks)
  against the k keys from the first row's first valid key to the last row: 2·H·rows·k·(N·D + 5), the mean
  logits of the two halves of the documents (N·D wide in all) and five row-wise dot products.
Every term but the FFTs and the rows' products is a matrix product whose count tests/test_benchmarks.py checks
against torch's own FlopCounterMode. The elementwise passes (prefix sums, masks, casts, binning) are not
counted: they are bound by memory, not arithmetic, so the GFLOP/s is the rate of the arithmetic above, a lower
bound of the work done.

    python benchmarks/bench_scale.py                                    # every shape × T = 2048, 4096, 8192 × N = 8, 16
    python benchmarks/bench_scale.py --shapes llama-3.1-8b mistral-7b-v0.1 --lengths 2048 --num-seqs 8
    python benchmarks/bench_scale.py --device cuda --json scale.json    # the rows also as JSON
    python benchmarks/bench_scale.py --project-from scale.json          # rows not in scale.json projected from it:
                                    # their operation count at the GFLOP/s of a measured row of the same path
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_analyze's memory meter, also when imported

from bench_analyze import PeakMemory

from posleak.capture.masks import MaskSpec
from posleak.capture.store import CallFacts, LayerCapture
from posleak.device import Placement
from posleak.experiments.paper.claims.plans import QUICK
from posleak.experiments.paper.counts import analysis_count
from posleak.measure import Grid, MeasureSpec, measure_layer, segment_boundaries
from posleak.measure.layer_sums import SumsPath, choose_path
from posleak.measure.shift import row_blocks, shift_queries
from posleak.store.jsonfile import dumps

PAPER_QUICK_ANALYSES = analysis_count(QUICK)  # the projection's A (module docstring)
_GRAM_BLOCK = 128  # positions per Gram block of the bilinear path (bilinear._GRAM_BLOCK_WIDTH for D = 128)
_BLOCK_ELEMENTS = 1 << 21  # float64 logits per block of the materialised path (layer_sums._BLOCK_ELEMENTS)
_LOG_Z_ELEMENTS = 1 << 27  # float64 logits per block of query rows of the exact log Z: 1 GiB at a time


@dataclass(frozen=True)
class Shape:
    """The attention of one layer of a named checkpoint (its config.json), and its number of layers."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    window: int | None = None  # sliding window W of every layer


SHAPES = {
    "llama-3.1-8b": Shape("Llama-3.1-8B", 32, 8, 128, 32),
    "mistral-7b-v0.1": Shape("Mistral-7B-v0.1", 32, 8, 128, 32, window=4096),
    "qwen2.5-7b": Shape("Qwen2.5-7B", 28, 4, 128, 28),
    "llama-3.1-70b": Shape("Llama-3.1-70B", 64, 8, 128, 80),
}


def float64_or_32(device: torch.device) -> torch.dtype:
    """float64 where the device has it (MPS has none)."""
    return torch.float32 if device.type == "mps" else torch.float64


def exact_log_z(query: torch.Tensor, keys: torch.Tensor, scaling: float, window: int | None) -> torch.Tensor:
    """log Z_i = log Σ_{j valid} exp(scaling · q_i·k_j) of queries (N, H, T, D) against keys (N, KV, T, D) (each
    KV head serves H / KV query heads), (N, H, T) float32, on their device: float64 logits a block of query rows
    at a time, so no N × H × T × T tensor exists at once."""
    num_seqs, heads, seq_len, dim = query.shape
    kv = keys.shape[1]
    wide = float64_or_32(query.device)
    grouped = query.view(num_seqs, kv, heads // kv, seq_len, dim)
    keys_t = keys.to(wide).mT  # (N, KV, D, T)
    mask, j = MaskSpec(window=window), torch.arange(seq_len, device=query.device)
    out = torch.empty(num_seqs, kv, heads // kv, seq_len, dtype=torch.float32, device=query.device)
    rows = max(1, _LOG_Z_ELEMENTS // (num_seqs * heads * seq_len))
    for i0 in range(0, seq_len, rows):
        i1 = min(seq_len, i0 + rows)
        logits = (grouped[..., i0:i1, :].to(wide) @ keys_t[:, :, None]) * scaling  # (N, KV, G, rows, T)
        valid = mask.valid(torch.arange(i0, i1, device=query.device)[:, None], j[None, :])
        out[..., i0:i1] = logits.masked_fill_(~valid, -math.inf).logsumexp(-1).float()
    return out.view(num_seqs, heads, seq_len)


def synthetic_layer(shape: Shape, seq_len: int, num_seqs: int, device: torch.device, seed: int) -> LayerCapture:
    """One layer's capture of that shape: standard normal q and k (logits of unit variance at 1/√D), exact log Z."""
    generator = torch.Generator(device).manual_seed(seed)
    kwargs = {"generator": generator, "device": device, "dtype": torch.float32}
    query = torch.randn(num_seqs, shape.heads, seq_len, shape.head_dim, **kwargs)
    keys = torch.randn(num_seqs, shape.kv_heads, seq_len, shape.head_dim, **kwargs)
    facts = synthetic_facts(shape)
    return LayerCapture(0, facts, query, keys, exact_log_z(query, keys, facts.scaling, shape.window))


def synthetic_facts(shape: Shape) -> CallFacts:
    """Softmax attention at 1/√D under a causal mask with the shape's window, no soft-cap, no sink."""
    return CallFacts(shape.head_dim**-0.5, None, causal=True, window=shape.window, prefix=0, norm="softmax", sink=None)


def measure_spec(shape: Shape, seq_len: int, num_seqs: int, path: SumsPath = "auto") -> MeasureSpec:
    """What `analyze` would measure at T and N: the coarse table grid, and range "beyond" under a window."""
    grid = Grid(seq_len, "coarse")
    return MeasureSpec(seq_len=seq_len, num_seqs=num_seqs, table_grid=grid, path=path, beyond=shape.window)


def operation_count(shape: Shape, spec: MeasureSpec, path: str) -> dict[str, float]:
    """The float64 operations of `measure_layer` on that layer by term (module docstring)."""
    heads, dim, seq_len, n = shape.heads, shape.head_dim, spec.seq_len, spec.num_seqs
    span = min(seq_len, shape.window or seq_len)
    if path == "materialised":
        rows = max(1, min(64, _BLOCK_ELEMENTS // (n * heads * span)))
        starts = torch.arange(0, seq_len, rows, dtype=torch.float64)
        height = torch.clamp(seq_len - starts, max=rows)
        width = torch.clamp(starts + height, max=span)  # offsets < min(q1, W) of each block
        logits = 2 * n * heads * dim * float((height * (height + width - 1)).sum())
        gram = 2 * n * n * heads * float((height * width).sum())
        return {"logits": logits, "Gram": gram, "attention shift": _shift_work(shape, spec)}
    block, window = _GRAM_BLOCK, shape.window
    blocks = -(-seq_len // block)
    whole = blocks if window is None else window // block  # as in bilinear.gram: key blocks wholly valid
    full = (shape.heads + shape.kv_heads) * (blocks - 1) * block * n * (n + 1) * dim**2 if whole >= 2 else 0
    near = [0] if window is None else [0, *range(max(whole, 1), (window + block - 2) // block + 1)]
    partial = 2 * n * (dim + n) * heads * block**2 * sum(max(blocks - delta, 0) for delta in near)
    passes, direct = _column_work(spec, span)
    length = 2 * seq_len
    per_pass = 2.5 * length * math.log2(length) * n * (dim * (heads + shape.kv_heads) + heads)
    per_pass += 8 * n * heads * dim * (seq_len + 1)
    grid = spec.table_grid
    linear = min(grid.linear_bins, span)
    far_shifts = torch.clamp(torch.tensor(grid.edges[linear:]), max=span) - 1  # row i reaches shifts ≤ i
    far = float(torch.clamp(seq_len - far_shifts, min=0).sum())
    return {
        "full Gram blocks": full,
        "partial Gram blocks": partial,
        "column sums, FFT": per_pass * passes,
        "column sums, direct": 2 * n * heads * dim * direct,
        "rows and sink score": 2 * heads * n * dim * seq_len * 3,
        "tables": 2 * heads * n * dim * (seq_len * (2 * linear - 1) + far),
        "attention shift": _shift_work(shape, spec),
    }


def _shift_work(shape: Shape, spec: MeasureSpec) -> float:
    """The attention shift's products (module docstring)."""
    rows = shift_queries(spec.ranges, spec.shift_queries)
    window = shape.window or spec.seq_len
    total = 0.0
    for start, end in row_blocks(rows, shape.heads):
        keys = int(rows[end - 1]) + 1 - max(0, int(rows[start]) - window + 1)
        total += 2 * shape.heads * (end - start) * keys * (spec.num_seqs * shape.head_dim + 5)
    return total


def _column_work(spec: MeasureSpec, span: int) -> tuple[int, int]:
    """The FFT passes of bilinear.column_sums (one for all queries, one for each other segment whose direct sum
    costs more than four transforms: its rule) and the logits Σ (hi − lo)·hi of the segments it sums directly."""
    bounds = segment_boundaries(spec.seq_len, spec.ranges)
    segments = list(itertools.pairwise(bounds))
    largest = max(segments, key=lambda s: s[1] - s[0])
    length = 2 * spec.seq_len
    fft_cost = length * math.ceil(math.log2(length))
    passes, direct = 1, 0
    for lo, hi in segments:
        if (lo, hi) != largest and (hi - lo) * min(hi, span) > 4 * fft_cost:
            passes += 1
        elif (lo, hi) != largest:
            direct += (hi - lo) * hi
    return passes, direct


def peak_gflops(device: torch.device) -> float:
    """The device's float64 matmul rate, measured now: the best of n × n products (2n³ operations each) over
    at least a second, after one untimed product."""
    size = 2048 if device.type == "cpu" else 8192
    a = torch.randn(size, size, dtype=float64_or_32(device), device=device)
    best, spent = 0.0, 0.0
    (a @ a).sum().item()
    while spent < 1.0:
        start = time.perf_counter()
        (a @ a).sum().item()  # .item() waits for the device
        elapsed = time.perf_counter() - start
        best, spent = max(best, 2 * size**3 / elapsed / 1e9), spent + elapsed
    return best


def timed_measure(capture: LayerCapture, spec: MeasureSpec) -> tuple[float, float]:
    """Seconds of `measure_layer` and the peak memory it adds above the resident capture, MB."""
    device = capture.query.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        resident = torch.cuda.memory_allocated(device)
    with PeakMemory() as host:
        start = time.perf_counter()
        measure_layer(capture, spec)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    if device.type == "cuda":
        return seconds, (torch.cuda.max_memory_allocated(device) - resident) / 2**20
    return seconds, host.added_mb


def bench_row(key: str, seq_len: int, num_seqs: int, device: torch.device, peak: float, seed: int) -> dict:
    """One measured row of the table: the layer built, measured once, its rate and the projections."""
    shape = SHAPES[key]
    capture = synthetic_layer(shape, seq_len, num_seqs, device, seed)
    spec = measure_spec(shape, seq_len, num_seqs)
    path = choose_path(capture, spec.path)
    seconds, memory = timed_measure(capture, spec)
    operations = operation_count(shape, spec, path)
    row = _row(shape, spec, path, operations, seconds, peak, "measured")
    return row | {"device": str(device), "peak_mib_above_capture": memory, "log_z_max": float(capture.log_z.max())}


def projected_row(key: str, seq_len: int, num_seqs: int, measured: list[dict]) -> dict:
    """A row not measured: its operation count at the float64 rate of a measured row that took the same path,
    of the same shape where there is one (the rate of a path depends on its block sizes, not on T)."""
    shape = SHAPES[key]
    spec = measure_spec(shape, seq_len, num_seqs)
    meta = {"device": "meta", "dtype": torch.float32}  # shapes only: which path the measurement would take
    capture = LayerCapture(
        0,
        synthetic_facts(shape),
        torch.empty(num_seqs, shape.heads, seq_len, shape.head_dim, **meta),
        torch.empty(num_seqs, shape.kv_heads, seq_len, shape.head_dim, **meta),
        torch.empty(num_seqs, shape.heads, seq_len, **meta),
    )
    path = choose_path(capture, spec.path)
    same_path = [row for row in measured if row["path"] == path and row["source"] == "measured"]
    if not same_path:
        raise ValueError(f"no measured row took the {path} path: measure one first")
    source = max(same_path, key=lambda row: (row["name"] == shape.name, row["T"], row["N"]))
    operations = operation_count(shape, spec, path)
    seconds = sum(operations.values()) / (source["gflops"] * 1e9)
    label = f"projected from {source['name']} T = {source['T']}, N = {source['N']}"
    return _row(shape, spec, path, operations, seconds, source["peak_gflops"], label) | {"device": source["device"]}


def _row(
    shape: Shape, spec: MeasureSpec, path: str, operations: dict[str, float], seconds: float, peak: float, source: str
) -> dict:
    """The figures of a row, measured or projected: rate, capture size, projections."""
    gflops = sum(operations.values()) / seconds / 1e9
    capture_bytes = 4 * spec.num_seqs * spec.seq_len * (shape.heads * shape.head_dim + shape.kv_heads * shape.head_dim)
    return {
        **asdict(shape),
        "T": spec.seq_len,
        "N": spec.num_seqs,
        "path": path,
        "source": source,
        "seconds_per_layer": seconds,
        "gflop": {name: value / 1e9 for name, value in operations.items()},
        "gflops": gflops,
        "peak_gflops": peak,
        "of_peak": gflops / peak,
        "capture_mib": (capture_bytes + 4 * spec.num_seqs * spec.seq_len * shape.heads) / 2**20,  # q, k, log Z
        "peak_mib_above_capture": None,
        "model_s": seconds * shape.layers,
        "paper_quick_s": seconds * shape.layers * PAPER_QUICK_ANALYSES,
    }


def warm_up(key: str, device: torch.device) -> None:
    """Both ways of summing once at T = 256, N = 2, untimed."""
    capture = synthetic_layer(SHAPES[key], 256, 2, device, seed=0)
    for path in ("materialised", "bilinear"):
        measure_layer(capture, measure_spec(SHAPES[key], 256, 2, path))


def device_name(device: torch.device) -> str:
    """What the device is: the GPU's name, or the CPU's model (/proc/cpuinfo) and torch's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {torch.get_num_threads()} threads"
    return device.type


def _hours(seconds: float) -> str:
    """Seconds, minutes or hours, whichever reads best."""
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def print_table(rows: list[dict]) -> None:
    print(
        "\nshape            T     N   path          s/layer  GFLOP  GFLOP/s  of peak  capture MiB  peak MiB  "
        f"model (× layers)  paper --quick (× {PAPER_QUICK_ANALYSES})  source"
    )
    for row in rows:
        memory = row["peak_mib_above_capture"]
        print(
            f"{row['name']:<16} {row['T']:<5} {row['N']:<3} {row['path']:<13} {row['seconds_per_layer']:>7.2f}  "
            f"{sum(row['gflop'].values()):>5.0f}  {row['gflops']:>7.1f}  {row['of_peak']:>7.0%}  "
            f"{row['capture_mib']:>11.0f}  {'–' if memory is None else f'{memory:.0f}':>8}  "
            f"{_hours(row['model_s']):>16}  {_hours(row['paper_quick_s']):>20}  {row['source']}"
        )


def _problems(args: argparse.Namespace) -> list[str]:
    """Every problem of the options, one line each, before any work."""
    problems = Placement(device=args.device).problems()
    problems += [f"--lengths {t}: a length must be ≥ 2" for t in args.lengths if t < 2]
    problems += [f"--num-seqs {n}: the measurement's noise correction needs N ≥ 2" for n in args.num_seqs if n < 2]
    if args.json is not None and (args.json.is_dir() or not args.json.parent.is_dir()):
        problems.append(f"--json {args.json}: not a file in an existing folder")
    if args.project_from is not None and not args.project_from.is_file():
        problems.append(f"--project-from {args.project_from}: no such file (write one with --json)")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--num-seqs", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--device", default="auto", help="auto (CUDA, else MPS, else the CPU), cpu, cuda or mps")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument(
        "--project-from",
        type=Path,
        metavar="JSON",
        help="measure nothing: the rows of JSON (from --json) that were asked for, the others projected from them",
    )
    args = parser.parse_args(argv)
    for problem in (problems := _problems(args)):
        print(f"bench_scale: error: {problem}", file=sys.stderr)
    if problems:
        sys.exit(2)
    wanted = [(key, t, n) for key in args.shapes for t in sorted(args.lengths) for n in sorted(args.num_seqs)]
    if args.project_from is not None:
        measured = json.loads(args.project_from.read_text())
        by_size = {(row["name"], row["T"], row["N"]): row for row in measured}
        rows = [by_size.get((SHAPES[k].name, t, n)) or projected_row(k, t, n, measured) for k, t, n in wanted]
    else:
        rows = measured_rows(wanted, Placement(device=args.device).torch_device())
    print_table(rows)
    if args.json is not None:
        args.json.write_text(dumps(rows, indent=1) + "\n")


def measured_rows(wanted: list[tuple[str, int, int]], device: torch.device) -> list[dict]:
    """The device's peak, one warm-up, then each (shape, T, N) built and measured, printed as it comes."""
    peak = peak_gflops(device)
    print(f"device {device} ({device_name(device)}), torch {torch.__version__}", flush=True)
    print(f"peak: {peak:.1f} GFLOP/s, the best float64 n × n matmul measured on it just now", flush=True)
    warm_up(wanted[0][0], device)
    rows = []
    for key, seq_len, num_seqs in wanted:
        rows.append(bench_row(key, seq_len, num_seqs, device, peak, seed=len(rows)))
        print(dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
