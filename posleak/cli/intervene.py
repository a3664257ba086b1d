"""`posleak intervene MODEL`: a baseline and an intervened run on the same sequences, and the effect
(posleak.commands.intervene).

The parser imports nothing heavy; the handler imports what it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posleak.cli.options import add_analysis_options, add_intervention_options, config_from, interventions_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("intervene", help="baseline vs intervened run on the same sequences, and the effect")
    parser.add_argument("model", help="built-in name, checkpoint folder, or hub id")
    add_analysis_options(parser)
    add_intervention_options(parser)
    parser.set_defaults(handler=_intervene)


def _intervene(args: argparse.Namespace) -> int:
    from posleak.cli.summary import intervention_lines
    from posleak.commands.intervene import OVERALL, intervene

    config = config_from(args, interventions_from(args))
    run = intervene(args.model, config, out=Path(args.out), trust_remote_code=args.trust_remote_code)
    overall = run.effect[run.effect["layer"] == OVERALL]
    print(f"wrote {args.out}: effect.parquet, report.html, baseline/, intervened/", file=sys.stderr)
    print(overall.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print("\n".join(intervention_lines(run)))
    return 0
