"""The residual-stream and causal-mask magnitudes of the same runs under the earlier estimand and under the
decomposition by rows (docs/method.md §2), per model, as a Markdown table from the runs' own files.

    python scripts/estimand_before_after.py OLD_RUNS NEW_RUNS

OLD_RUNS and NEW_RUNS each hold one run folder per model (the same name in both), written by `posleak analyze`
with the same options before and after the change. The earlier estimand's resid_* is r = mean ℓ − g − m_count
(split-half, clipped per head at 0, heads averaged) and its mask_* is the count term, mask_count_* now. "not w"
is the part of the earlier value that the within-row term w does not account for, in quadrature, √(before² −
after²) of the means over layers: the Jensen gap of the row term and the clipping floor that the earlier
estimand counted as residual-stream position.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd


def _quadrature(before: float, after: float) -> str:
    """The part of the earlier value that w does not account for, in quadrature: √(before² − after²)."""
    gap = before * abs(before) - after * abs(after)
    return f"{math.copysign(math.sqrt(abs(gap)), gap):.3f}"


def row(model: str, old: pd.DataFrame, new: pd.DataFrame) -> str:
    cells = [model]
    for queries in ("early", "all"):
        before, after = old[f"resid_{queries}"].mean(), new[f"resid_{queries}"].mean()
        cells += [f"{before:.3f}", f"{after:.3f}", _quadrature(before, after)]
    cells += [f"{old['mask_all'].mean():.3f}", f"{new['mask_all'].mean():.3f}", f"{new['shift_kl_all'].mean():.4f}"]
    return "| " + " | ".join(cells) + " |"


def main(old_root: Path, new_root: Path) -> None:
    print(
        "| model | resid_early before | after | not w | resid_all before | after | not w "
        "| mask_all before (count term) | after (row term) | shift_kl_all |"
    )
    print("|---" * 10 + "|")
    for new_run in sorted(p for p in new_root.iterdir() if (p / "per_layer.parquet").exists()):
        old = pd.read_parquet(old_root / new_run.name / "per_layer.parquet")
        print(row(new_run.name, old, pd.read_parquet(new_run / "per_layer.parquet")))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
