"""`posleak compare RUN...`: the architecture comparison of finished runs (posleak.experiments.compare).

The parser imports nothing heavy; the handler imports what it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("compare", help="architecture comparison of finished runs (docs/method.md §10)")
    parser.add_argument("runs", nargs="+", help="run folders written by posleak analyze")
    parser.add_argument("--labels", nargs="+", help="one label per run (default: model id and interventions)")
    parser.add_argument("--out", required=True, help="folder for the comparison")
    parser.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from posleak.experiments.compare import compare_runs

    summary = compare_runs(args.runs, out=Path(args.out), labels=args.labels)
    print(f"wrote {args.out}: comparison.parquet, figures/, report.html", file=sys.stderr)
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0
