"""How wide the deciding rows' 95% intervals are against their values, in a reproduction's claims.json.

For every deciding row of every sample, and of every part judged once (C4's lab, counted once: `Claim.once`), with
a finite interval (the rows a verdict is judged on): its relative width
(high − low) / |value|. Prints the count, the median and the quartiles, the rows whose interval is a point
(high = low: a bootstrap that degenerated) and the rows with no interval (fewer documents than an interval needs,
docs/method.md §6). docs/performance.md and docs/method.md §15.4 quote it for `make run`'s claims.json.

    python scripts/deciding_widths.py runs/paper/claims.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def deciding_rows(claims: list[dict]) -> list[tuple[str, str, dict]]:
    """(claim, sample or part, row) of every deciding row with a number, in the file's order: the samples', then
    the parts judged once (none in files older than `Claim.once`)."""
    return [
        (claim["claim"], name, row)
        for claim in claims
        for name, judged in [*claim["samples"].items(), *claim.get("once", {}).items()]
        for row in judged["evidence"]
        if row.get("deciding") and isinstance(row.get("value"), int | float)
    ]


def has_interval(row: dict) -> bool:
    """Both ends present and finite (an end of exactly 0 counts)."""
    return all(row.get(end) is not None and math.isfinite(row[end]) for end in ("lo", "hi"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("claims", type=Path, help="a reproduction's claims.json")
    args = parser.parse_args()
    rows = deciding_rows(json.loads(args.claims.read_text()))
    with_interval = [(c, s, r) for c, s, r in rows if has_interval(r)]
    without = [(c, s, r) for c, s, r in rows if not has_interval(r)]
    ratios = np.array([(r["hi"] - r["lo"]) / abs(r["value"]) for _, _, r in with_interval if r["value"] != 0])
    points = [(c, s, r["evidence"]) for c, s, r in with_interval if r["hi"] == r["lo"]]
    print(f"{args.claims}: {len(rows)} deciding rows, {len(with_interval)} with an interval")
    if len(ratios):
        q1, median, q3 = np.quantile(ratios, [0.25, 0.5, 0.75])
        print(f"(high − low) / |value|: median {median:.2f} (quartiles {q1:.2f} to {q3:.2f}) over {len(ratios)} rows")
    print(f"intervals collapsed to a point: {len(points)}")
    for claim, sample, evidence in points:
        print(f"  {claim} {sample}: {evidence}")
    for claim, sample, row in without:
        print(f"  no interval: {claim} {sample}: {row['evidence']}")


if __name__ == "__main__":
    main()
