"""`posleak batch SPEC`: many analyses from a YAML list of models × settings, then one comparison
(posleak.experiments.batch).

The parser imports nothing heavy; the handler imports what it runs.
"""

from __future__ import annotations

import argparse
import sys

from posleak.cli.options import add_backend_options


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("batch", help="many analyses from a YAML list of models × settings, then one comparison")
    parser.add_argument("spec", help="batch file (YAML: name, models, base, grid; see posleak.experiments.batch)")
    parser.add_argument("--out", required=True, help="output folder: runs/ and comparison/ (rerun to resume)")
    add_backend_options(parser, "analyses")
    parser.set_defaults(handler=_batch)


def _batch(args: argparse.Namespace) -> int:
    from posleak.experiments.batch import BatchSpec, run_batch

    summary = run_batch(BatchSpec.read(args.spec), args.out, backend=args.backend, address=args.address)
    print(f"wrote {args.out}: runs/, comparison/ (comparison.parquet, figures/, report.html)", file=sys.stderr)
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0
