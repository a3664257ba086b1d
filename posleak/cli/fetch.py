"""`posleak fetch NAME|all`: download, verify and convert a built-in model into the cache."""

from __future__ import annotations

import argparse

from posleak.models import zoo


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("fetch", help="download, verify and convert a built-in model into the cache")
    parser.add_argument("name", metavar="NAME|all", help=f"one of {', '.join(zoo.ZOO)}, or all")
    parser.add_argument("--force", action="store_true", help="download and convert again, replacing the cached copy")
    parser.set_defaults(handler=_fetch)


def _fetch(args: argparse.Namespace) -> int:
    print(zoo.fetch(args.name, force=args.force, progress=True))
    return 0
