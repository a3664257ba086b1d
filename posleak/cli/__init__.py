"""The `posleak` command line: one module per subcommand group, each with `add_parser`.

Every subcommand mirrors a Python API function; the modules here only parse arguments, call it,
and print. A `PosleakError` becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from posleak.errors import PosleakError


def build_parser() -> argparse.ArgumentParser:
    from posleak.cli import analyze, lab, models

    parser = argparse.ArgumentParser(
        prog="posleak",
        description="Where does absolute position in a decoder's attention come from?",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (models, analyze, lab):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # transformers' per-tensor "Loading weights" bar is noise beside posleak's own progress bars.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return int(args.handler(args) or 0)
    except PosleakError as err:
        print(f"posleak: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("posleak: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
