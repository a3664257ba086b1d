"""`posleak analyze MODEL`: the decomposition of docs/method.md §2 into a run folder (posleak.commands.analyze).

The parser imports nothing heavy; the handler imports what it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posleak.cli.options import (
    add_analysis_options,
    add_intervention_options,
    add_null_options,
    config_from,
    interventions_from,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("analyze", help="the decomposition of docs/method.md §2 into a run folder")
    parser.add_argument("model", help="built-in name, checkpoint folder, or hub id")
    add_analysis_options(parser)
    add_intervention_options(parser)
    add_null_options(parser)
    parser.set_defaults(handler=_analyze)


def _analyze(args: argparse.Namespace) -> int:
    from posleak.cli.summary import analysis_lines
    from posleak.commands.analyze import analyze

    config = config_from(args, interventions_from(args))
    result = analyze(args.model, config, out=Path(args.out), trust_remote_code=args.trust_remote_code)
    per_layer = result.per_layer
    print(f"wrote {args.out}: report.html, per_head/per_layer/profiles/offset_map.parquet, figures/", file=sys.stderr)
    print(
        per_layer[["layer", "layer_type", "mask_early", "mask_all", "resid_early", "resid_all", "sink_rate"]].to_string(
            index=False, float_format=lambda x: f"{x:.4f}"
        )
    )
    print("\n".join(analysis_lines(result)))
    return 0
