"""`posleak sweep SPEC`: a YAML grid of lab configurations × seeds (posleak.lab.sweep).

The parser reads only modules without torch (`posleak.models.lab.config`, `posleak.cli.options`); the handler
imports what it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posleak.cli.options import add_trial_backend_options, checked_config


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("sweep", help="run a YAML grid of lab configurations × seeds")
    parser.add_argument("spec", help="sweep spec (YAML: name, base, grid, seeds, eval)")
    add_trial_backend_options(parser)
    parser.add_argument("--out", required=True, help="output folder (finished trials are never rerun)")
    parser.set_defaults(handler=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from posleak.lab.plan import run_plan
    from posleak.lab.sweep import SweepSpec

    spec = checked_config(args, lambda: SweepSpec.read(args.spec))
    table = run_plan(spec.plan(), args.out, backend=args.backend, address=args.address, jobs=args.jobs).table
    print(f"{len(table)} trials → {Path(args.out) / 'sweep.parquet'}, report: {Path(args.out) / 'report.html'}")
    return 0
