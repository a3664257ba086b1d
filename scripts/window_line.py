"""C4's window line alone, as a plan measures it inside `posleak paper`: the sliding model and the standard one at
the plan's window_seq_len (T ≥ 4W) on its window_corpus, on samples A and B, judged once (docs/method.md §13).

The full plan runs it among some 290 analyses (more than two hours on 2 cores); this runs its four analyses only
(`posleak.experiments.paper.claims.c4.window`), into OUT/window/NAME-SAMPLE, the folders `posleak paper --full --out
OUT` would write (rerun to resume), and prints each analysis's time and the line's evidence and verdict.
docs/method.md §13 quotes it for the built-ins.

    python scripts/window_line.py --out runs/window            # the full plan's line: T = 2048, bible-web
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from posleak.experiments.paper import FULL
from posleak.experiments.paper.claims.c4.window import WindowComparison, claim_window, not_measured, window_runs
from posleak.experiments.paper.reproduction import Reproduction
from posleak.experiments.paper.verdict import estimate_text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where OUT/window/ is written (or resumed)")
    args = parser.parse_args()
    plan = FULL  # --quick does not measure the line
    start = time.perf_counter()
    runs = window_runs(Reproduction(args.out, plan, progress=True))
    print(f"window line of the {plan.name} plan: {time.perf_counter() - start:.0f} s")
    for sample, pair in runs.items():
        for result in pair:
            timings = result.manifest["timings_s"]
            print(f"  {sample} {result.run.path.name}: {timings['total_s']:.0f} s (forward {timings['forward_s']:.0f})")
    judgement = claim_window({s: WindowComparison.of(*pair) for s, pair in runs.items()}, not_measured(plan))
    print(f"verdict: {judgement.verdict}")
    for _, row in judgement.evidence.iterrows():
        print(f"  {row['evidence']}: {estimate_text(row)}, {row['says']}{'' if row['deciding'] else ' (reported)'}")


if __name__ == "__main__":
    main()
