"""`posleak models` (list the built-in models) and `posleak fetch NAME|all` (download, verify, convert)."""

from __future__ import annotations

import argparse
from typing import Any

from posleak.models import zoo
from posleak.store.jsonfile import dumps


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    listing = subparsers.add_parser("models", help="list the built-in models and whether they are fetched")
    listing.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    listing.set_defaults(handler=_models, light=True)

    fetch = subparsers.add_parser("fetch", help="download, verify and convert a built-in model into the cache")
    fetch.add_argument("name", metavar="NAME|all", help=f"one of {', '.join(zoo.ZOO)}, or all")
    fetch.add_argument("--force", action="store_true", help="download and convert again, replacing the cached copy")
    fetch.set_defaults(handler=_fetch)


def _rows() -> list[dict[str, Any]]:
    """One row per built-in model: the registry's facts (no model is loaded) and whether it is fetched."""
    return [
        {"name": e.name, **e.expected.to_dict(), "checkpoint": e.checkpoint, "fetched": zoo.is_fetched(e.name)}
        for e in zoo.ZOO.values()
    ]


def _models(args: argparse.Namespace) -> int:
    rows = _rows()
    if args.json:
        print(dumps(rows, indent=2))
        return 0
    header = ["name", "architecture", "layers", "heads/KV", "RoPE base", "window", "auto BOS", "fetched"]
    table = [header] + [
        [
            r["name"],
            r["architecture"],
            str(r["layers"]),
            f"{r['heads']}/{r['kv_heads']}",
            ", ".join(f"{kind.removesuffix('_attention')} {_short(theta)}" for kind, theta in r["rope_theta"].items()),
            str(r["sliding_window"] or "-"),
            "yes" if r["auto_bos"] else "no",
            "yes" if r["fetched"] else "no",
        ]
        for r in rows
    ]
    widths = [max(len(line[c]) for line in table) for c in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return 0


def _short(value: float) -> str:
    """1e5 rather than 100000.0, so bases of different size read alike."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _fetch(args: argparse.Namespace) -> int:
    print(zoo.fetch(args.name, force=args.force, progress=True))
    return 0
