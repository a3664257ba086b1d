"""The `posleak` command line: one module per subcommand, each with `add_parser`; the options several share in
`posleak.cli.options`.

Every subcommand mirrors a Python API function; the modules here only parse arguments, call it,
and print. Every problem with the input, from argparse or from a command's validation, becomes one
`posleak: error:` line on stderr and exit status 2; so does a full disk. Anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from posleak.errors import PosleakError, is_disk_full


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one `posleak: error:` line (the usage is one `-h` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"posleak: error: {self.prog}: {message} (see {self.prog} -h)\n")


def build_parser() -> argparse.ArgumentParser:
    from posleak.cli import analyze, batch, compare, fetch, inspect, intervene, lab, models, paper, sweep, train

    parser = Parser(
        prog="posleak",
        description="Where does absolute position in a decoder's attention come from?",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (models, fetch, inspect, analyze, intervene, batch, compare, paper, train, lab, sweep):
        module.add_parser(sub)
    return parser


def _quiet_transformers() -> None:
    """Hide transformers' per-tensor "Loading weights" bar, noise beside posleak's own progress bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Commands that never load a model say so (`light`): importing transformers would cost them a second.
    if not getattr(args, "light", False):
        _quiet_transformers()
    try:
        return int(args.handler(args) or 0)
    except PosleakError as err:
        for problem in err.problems:
            print(f"posleak: error: {problem}", file=sys.stderr)
        return 2
    except Exception as err:  # a full disk where no writer named the file (safetensors wraps the OS error)
        if not is_disk_full(err):
            raise
        print(f"posleak: error: disk full ({err}); free space and rerun the same command to resume", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("posleak: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
