"""Speed and memory of `analyze` on smollm2-135m against plain transformers forwards (issue: analyze).

For each length T, on the same N = 4 sequences, in one process and interleaved over repeats:
  (a) plain `model(input_ids)` with SDPA, (b) eager with `output_attentions=True`,
  (c) `analyze` on the coarse grid (defaults: 200 bootstrap resamples),
  (d) `analyze` on the exact grid without bootstrap intervals (`--bootstrap 0`: resampling every one of
      the T²/2 cells 200 times would dwarf the forward; intervals are a coarse-grid feature),
and the ratios c/a and d/b (medians over repeats). Peak memory of each is the largest resident set
size a sampling thread sees during the task, minus the resident size when the task starts (torch hands
large blocks back to the system when it frees them, so each task starts from the same floor).

    python benchmarks/bench_analyze.py                 # T = 512 and 2048 (a, b, c, d), T = 8192 (a, c)
    python benchmarks/bench_analyze.py --lengths 512   # a quicker look
    python benchmarks/bench_analyze.py --lengths 2048 --tasks a c   # some of the tasks only
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable

import psutil
import torch

from posleak.analyze import AnalyzeConfig, analyze_model, sequences_for
from posleak.capture import use_posleak_attention
from posleak.models.load import LoadedModel, load_model

MODEL = "smollm2-135m"
NUM_SEQS = 4


def _config(seq_len: int, grid: str = "coarse") -> AnalyzeConfig:
    bootstrap = AnalyzeConfig().bootstrap if grid == "coarse" else 0
    return AnalyzeConfig(
        seq_len=seq_len, num_seqs=NUM_SEQS, batch_size=1, grid=grid, cross_documents=True, bootstrap=bootstrap
    )


def _tasks(loaded: LoadedModel, seq_len: int) -> dict[str, Callable[[], object]]:
    model = loaded.model
    batch = sequences_for(loaded, _config(seq_len))

    @torch.no_grad()
    def plain(implementation: str, **kwargs: object) -> None:
        model.set_attn_implementation(implementation)
        try:
            for row in batch.ids:
                model(row[None], use_cache=False, **kwargs)
        finally:
            use_posleak_attention(model)

    def analysis(grid: str) -> None:
        analyze_model(model, batch, _config(seq_len, grid), loaded=loaded, progress=False)

    return {
        "a_sdpa": lambda: plain("sdpa"),
        "b_eager_attentions": lambda: plain("eager", output_attentions=True),
        "c_analyze_coarse": lambda: analysis("coarse"),
        "d_analyze_exact": lambda: analysis("exact"),
    }


def _wanted(seq_len: int) -> list[str]:
    return (
        ["a_sdpa", "c_analyze_coarse"]
        if seq_len > 2048
        else ["a_sdpa", "b_eager_attentions", "c_analyze_coarse", "d_analyze_exact"]
    )


class PeakMemory:
    """Samples this process's resident set size every few milliseconds while the block runs."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.process = psutil.Process()

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def added_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", choices=["a", "b", "c", "d"], help="default: all that apply to T")
    args = parser.parse_args()

    torch.manual_seed(0)
    loaded = load_model(MODEL)
    results = {}
    for seq_len in args.lengths:
        tasks, wanted = _tasks(loaded, seq_len), _wanted(seq_len)
        wanted = [name for name in wanted if args.tasks is None or name[0] in args.tasks]
        times: dict[str, list[float]] = {name: [] for name in wanted}
        memory: dict[str, float] = {name: 0.0 for name in wanted}
        repeats = args.repeats if seq_len <= 2048 else 1
        for _ in range(repeats):  # interleaved, so that drifting machine load hits every task alike
            for name in wanted:
                with PeakMemory() as peak:
                    start = time.perf_counter()
                    tasks[name]()
                    times[name].append(time.perf_counter() - start)
                memory[name] = max(memory[name], peak.added_mb)
        seconds = {name: statistics.median(t) for name, t in times.items()}
        row = {"T": seq_len, "seconds": seconds, "peak_mb_above_model": memory}
        if {"a_sdpa", "c_analyze_coarse"} <= seconds.keys():
            row["c/a"] = seconds["c_analyze_coarse"] / seconds["a_sdpa"]
            row["mem c/a"] = memory["c_analyze_coarse"] / memory["a_sdpa"]
        if {"b_eager_attentions", "d_analyze_exact"} <= seconds.keys():
            row["d/b"] = seconds["d_analyze_exact"] / seconds["b_eager_attentions"]
        results[seq_len] = row
        print(json.dumps(row, indent=1), flush=True)
    print("\nT      c/a (target ≤ 1.3 at 2048)   d/b (target ≤ 1.0 at 2048)   peak mem c/a (target ≤ 1.5 at 8192)")
    for seq_len, row in results.items():
        c_a, d_b, mem = (f"{row[key]:.2f}" if key in row else "-" for key in ("c/a", "d/b", "mem c/a"))
        print(f"{seq_len:<6} {c_a:<28} {d_b:<28} {mem}")


if __name__ == "__main__":
    main()
