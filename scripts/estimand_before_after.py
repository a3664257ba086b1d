"""The residual-stream and causal-mask magnitudes of the same runs under the earlier estimand and under the
decomposition by rows (docs/method.md §2), per model, as a Markdown table from the runs' own files.

    python scripts/estimand_before_after.py OLD_RUNS NEW_RUNS

OLD_RUNS and NEW_RUNS each hold one run folder per model (the same name in both), written by `posleak analyze`
with the same options before and after the change. The earlier estimand's resid_* is r = mean ℓ − g − m_count
(split-half, clipped per head at 0, heads averaged) and its mask_* is the count term, mask_count_* now. "not w"
is the part of the earlier value that the within-row term w does not account for, in quadrature, √(before² −
alike²) of the means over layers, where "after, as before" is w aggregated as the earlier estimand was (each head's
root clipped at 0, heads averaged; "after" is the root of the heads' mean signed square, method.md §3): the Jensen
gap of the row term that the earlier estimand counted as residual-stream position (a negative value: w larger).
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


def evidence_row(model: str, old: pd.DataFrame, new: pd.DataFrame, new_heads: pd.DataFrame) -> str:
    cells = [model]
    for queries in ("early", "all"):
        before, after = old[f"resid_{queries}"].mean(), new[f"resid_{queries}"].mean()
        # the new w aggregated as the earlier estimand was (heads' roots clipped at 0, averaged), so that the
        # difference from `before` is the estimand's alone
        alike = new_heads.assign(v=new_heads[f"resid_{queries}"].clip(lower=0)).groupby("layer")["v"].mean().mean()
        cells += [f"{before:.3f}", f"{after:.3f}", f"{alike:.3f}", _quadrature(before, alike)]
    cells += [f"{old['mask_all'].mean():.3f}", f"{new['mask_all'].mean():.3f}", f"{new['shift_kl_all'].mean():.3f}"]
    return "| " + " | ".join(cells) + " |"


def main(old_root: Path, new_root: Path) -> None:
    print(
        "| model | resid_early before | after | after, as before | not w | resid_all before | after "
        "| after, as before | not w | mask_all before (count term) | after (row term) | shift_kl_all |"
    )
    print("|---" * 12 + "|")
    for new_run in sorted(p for p in new_root.iterdir() if (p / "per_layer.parquet").exists()):
        old = pd.read_parquet(old_root / new_run.name / "per_layer.parquet")
        new, heads = (pd.read_parquet(new_run / f"{table}.parquet") for table in ("per_layer", "per_head"))
        print(evidence_row(new_run.name, old, new, heads))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
