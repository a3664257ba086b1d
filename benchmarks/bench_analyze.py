"""Speed and memory of `analyze` on smollm2-135m against plain transformers forwards.

For each length T, on the same sequences (N = 4; N = 2 beyond T = 8192), in one process and interleaved
over repeats:
  (a) plain `model(input_ids)` with SDPA, one sequence at a time,
  (b) eager with `output_attentions=True` (T ≤ 2048: what storing every attention map costs),
  (c) `analyze` with its defaults (exact magnitudes over single pairs, 200 bootstrap resamples), batch 1,
and the ratios c/a and c/b (medians over repeats). Each task first runs once, untimed, at T = 256: the
first forward of a process pays one-time costs (thread pools, kernel choices) that would land on whichever
task came first. Peak memory of each is the process's peak resident set size during the task (the kernel's
high-water mark, reset as the task starts) minus the resident size when it starts (torch hands large
blocks back to the system when it frees them, so each task starts from the same floor).

    python benchmarks/bench_analyze.py                   # T = 512, 2048 (a, b, c), 8192 (a, c), 16384 (a, c)
                                                         # (16384 is past smollm2's 8192: cost only)
    python benchmarks/bench_analyze.py --lengths 512     # a quicker look
    python benchmarks/bench_analyze.py --lengths 2048 --tasks a c   # some of the tasks only
    python benchmarks/bench_analyze.py --lengths 2048 --tasks c --repeats 1 --profile   # where (c)'s time goes
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from posleak.capture import use_posleak_attention
from posleak.data.batches import make_sequences
from posleak.data.corpus import load_corpus
from posleak.models.load import LoadedModel, load_model
from posleak.pipeline import AnalyzeConfig, PreparedRun, analyze_model, sequences_for
from posleak.store.jsonfile import dumps

MODEL = "smollm2-135m"


def _config(seq_len: int) -> AnalyzeConfig:
    return AnalyzeConfig(seq_len=seq_len, num_seqs=4 if seq_len <= 8192 else 2, batch_size=1, cross_documents=True)


def _tasks(loaded: LoadedModel, seq_len: int) -> dict[str, Callable[[], object]]:
    model = loaded.model
    config = _config(seq_len)
    if seq_len <= (loaded.facts.max_positions or seq_len):
        batch = sequences_for(loaded, config.recipe)
    else:  # past the model's trained context: a measurement of cost only, so posleak's length guard is bypassed
        corpus = load_corpus(config.recipe.corpus)
        batch = make_sequences(corpus, loaded.tokenizer, seq_len, config.recipe.num_seqs, cross_documents=True)

    @torch.no_grad()
    def plain(implementation: str, **kwargs: object) -> None:
        model.set_attn_implementation(implementation)
        try:
            for row in batch.ids:
                model(row[None], use_cache=False, **kwargs)
        finally:
            use_posleak_attention(model)

    def analysis() -> None:
        analyze_model(PreparedRun.of(loaded, batch, _config(seq_len)), progress=False)

    return {
        "a_sdpa": lambda: plain("sdpa"),
        "b_eager_attentions": lambda: plain("eager", output_attentions=True),
        "c_analyze": analysis,
    }


def _wanted(seq_len: int) -> list[str]:
    return ["a_sdpa", "c_analyze"] if seq_len > 2048 else ["a_sdpa", "b_eager_attentions", "c_analyze"]


class PeakMemory:
    """The largest resident set size while the block runs, above the size when it starts: the kernel's
    high-water mark (VmHWM), reset as the block starts through /proc/self/clear_refs (Linux). No sampling
    thread: it would miss peaks shorter than its interval, and on two cores it takes CPU time from the task."""

    def __enter__(self) -> PeakMemory:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size to the current one
        self.start = self.peak = _status_kb("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = _status_kb("VmHWM")

    @property
    def added_mb(self) -> float:
        return (self.peak - self.start) / 1024


def _status_kb(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}: the benchmark's memory figures need Linux")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192, 16384])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tasks", nargs="+", choices=["a", "b", "c"], help="default: all that apply to T")
    parser.add_argument("--profile", action="store_true", help="print cProfile's 30 costliest calls of each task")
    args = parser.parse_args()

    torch.manual_seed(0)
    loaded = load_model(MODEL)
    names = ("a_sdpa", "b_eager_attentions", "c_analyze")
    chosen = [name for name in names if args.tasks is None or name[0] in args.tasks]
    warm_up = _tasks(loaded, 256)
    for name in chosen:
        warm_up[name]()
    results = {}
    for seq_len in args.lengths:
        tasks, wanted = _tasks(loaded, seq_len), _wanted(seq_len)
        wanted = [name for name in wanted if name in chosen]
        times: dict[str, list[float]] = {name: [] for name in wanted}
        memory: dict[str, float] = {name: 0.0 for name in wanted}
        repeats = args.repeats if seq_len <= 2048 else 1
        for _ in range(repeats):  # interleaved, so that drifting machine load hits every task alike
            for name in wanted:
                profile = cProfile.Profile() if args.profile else None
                with PeakMemory() as peak:
                    start = time.perf_counter()
                    if profile is not None:
                        profile.runcall(tasks[name])
                    else:
                        tasks[name]()
                    times[name].append(time.perf_counter() - start)
                memory[name] = max(memory[name], peak.added_mb)
                if profile is not None:
                    print(f"--- {name}, T = {seq_len}")
                    pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
        seconds = {name: statistics.median(t) for name, t in times.items()}
        row = {
            "T": seq_len,
            "N": _config(seq_len).recipe.num_seqs,
            "seconds": seconds,
            "each_repeat": times,
            "peak_mb_above_model": memory,
        }
        if {"a_sdpa", "c_analyze"} <= seconds.keys():
            row["c/a"] = seconds["c_analyze"] / seconds["a_sdpa"]
            row["mem c/a"] = memory["c_analyze"] / memory["a_sdpa"]
        if {"b_eager_attentions", "c_analyze"} <= seconds.keys():
            row["c/b"] = seconds["c_analyze"] / seconds["b_eager_attentions"]
        results[seq_len] = row
        print(dumps(row, indent=1), flush=True)
    print("\nT      c/a (target ≤ 1.5 at 2048)   c/b    peak mem c/a (target ≤ 1.5 at 8192)")
    for seq_len, row in results.items():
        c_a, c_b, mem = (f"{row[key]:.2f}" if key in row else "-" for key in ("c/a", "c/b", "mem c/a"))
        print(f"{seq_len:<6} {c_a:<28} {c_b:<6} {mem}")


if __name__ == "__main__":
    main()
