"""Speed and memory of `analyze` on smollm2-135m against plain transformers forwards (issue: analyze).

For each length T, on the same N = 4 sequences, in one process and interleaved over repeats:
  (a) plain `model(input_ids)` with SDPA, (b) eager with `output_attentions=True`,
  (c) `analyze` on the coarse grid, (d) `analyze` on the exact grid,
and the ratios c/a and d/b (medians over repeats). Peak memory of each is measured in a fresh
subprocess (peak RSS minus the RSS after loading the model), since a process's peak cannot be reset.

    python benchmarks/bench_analyze.py                 # T = 512 and 2048 (a, b, c, d), T = 8192 (a, c)
    python benchmarks/bench_analyze.py --lengths 512   # a quicker look
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from posleak.analyze import AnalyzeConfig, analyze_model, sequences_for
from posleak.capture import use_posleak_attention
from posleak.models.load import LoadedModel, load_model

MODEL = "smollm2-135m"
NUM_SEQS = 4


def _config(seq_len: int, grid: str = "coarse") -> AnalyzeConfig:
    return AnalyzeConfig(seq_len=seq_len, num_seqs=NUM_SEQS, batch_size=1, grid=grid, cross_documents=True)


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
        config = _config(seq_len, grid)
        analyze_model(model, batch, dataclasses.replace(config), loaded=loaded, progress=False)

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


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_memory(seq_len: int, task: str) -> float:
    """Child mode: peak RSS (MB) that one run of `task` adds above the loaded model."""
    loaded = load_model(MODEL)
    tasks = _tasks(loaded, seq_len)
    before = _rss_mb()
    tasks[task]()
    return _rss_mb() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--memory-child", nargs=2, metavar=("T", "TASK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        print(json.dumps(measure_memory(int(args.memory_child[0]), args.memory_child[1])))
        return

    torch.manual_seed(0)
    loaded = load_model(MODEL)
    results = {}
    for seq_len in args.lengths:
        tasks, wanted = _tasks(loaded, seq_len), _wanted(seq_len)
        times: dict[str, list[float]] = {name: [] for name in wanted}
        for _ in range(args.repeats):  # interleaved, so that drifting machine load hits every task alike
            for name in wanted:
                start = time.perf_counter()
                tasks[name]()
                times[name].append(time.perf_counter() - start)
        seconds = {name: statistics.median(t) for name, t in times.items()}
        memory = {
            name: json.loads(
                subprocess.run(
                    [sys.executable, __file__, "--memory-child", str(seq_len), name],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            for name in wanted
        }
        row = {"T": seq_len, "seconds": seconds, "peak_mb_above_model": memory}
        row["c/a"] = seconds["c_analyze_coarse"] / seconds["a_sdpa"]
        row["mem c/a"] = memory["c_analyze_coarse"] / memory["a_sdpa"]
        if "d_analyze_exact" in seconds:
            row["d/b"] = seconds["d_analyze_exact"] / seconds["b_eager_attentions"]
        results[seq_len] = row
        print(json.dumps(row, indent=1), flush=True)
    print("\nT      c/a (target ≤ 1.3 at 2048)   d/b (target ≤ 1.0 at 2048)   peak mem c/a (target ≤ 1.5 at 8192)")
    for seq_len, row in results.items():
        d_b = f"{row['d/b']:.2f}" if "d/b" in row else "-"
        print(f"{seq_len:<6} {row['c/a']:<28.2f} {d_b:<28} {row['mem c/a']:.2f}")


if __name__ == "__main__":
    main()
