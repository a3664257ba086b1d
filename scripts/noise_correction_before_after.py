"""The noise-corrected magnitudes of the same analyses with split halves (before) and over every pair of distinct
documents (after, docs/method.md §3), per model, as a Markdown table from the runs' own files.

    python scripts/noise_correction_before_after.py OLD_RUNS NEW_RUNS

OLD_RUNS and NEW_RUNS each hold one run folder per model (the same name in both), written by `posleak analyze`
with the same options (so the same sequences and resamples) before and after the change. Per model and magnitude:
the mean over layers with its 95% bootstrap interval (posleak.experiments.evidence.layer_mean, what `posleak
analyze` prints), before and after, and the interval's width after over before. Before, a resample with an empty
half was NaN and the interval skipped it, as the code of the time did: the table counts them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from posleak.experiments.evidence import Estimate, layer_mean
from posleak.measure import measured_magnitudes
from posleak.pipeline import AnalysisResult
from posleak.store import RunFolder


def _cell(value: float, lo: float, hi: float) -> str:
    return f"{value:.3f} ({lo:.3f} to {hi:.3f})"


def main(old_root: Path, new_root: Path) -> None:
    print("| model | magnitude | split halves (before) | resamples dropped | all pairs (after) | width after/before |")
    print("|---|---|---|---|---|---|")
    for new_run in sorted(p for p in new_root.iterdir() if (p / "per_layer.parquet").exists()):
        old, new = (AnalysisResult.read(RunFolder(root / new_run.name)) for root in (old_root, new_root))
        for measure in measured_magnitudes(old.per_layer, new.per_layer):
            before, after = layer_mean(old, measure), layer_mean(new, measure)
            kept = before.samples[~before.samples.isnan()]
            (b_lo, b_hi), (a_lo, a_hi) = Estimate(before.value, kept).interval, after.interval
            dropped = f"{before.samples.numel() - kept.numel()} of {before.samples.numel()}"
            ratio = (a_hi - a_lo) / (b_hi - b_lo)
            cells = [new_run.name, measure, _cell(before.value, b_lo, b_hi), dropped, _cell(after.value, a_lo, a_hi)]
            print("| " + " | ".join([*cells, f"{ratio:.2f}"]) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
