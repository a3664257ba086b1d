"""`posleak models`: the built-in models and whether each is fetched."""

from __future__ import annotations

import argparse
from typing import Any

from posleak.models import zoo
from posleak.store.jsonfile import dumps


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="list the built-in models and whether they are fetched")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(handler=_models, light=True)


def _model_rows() -> list[dict[str, Any]]:
    """One row per built-in model: the registry's facts (no model is loaded) and whether it is fetched."""
    return [
        {"name": e.name, **e.expected.to_dict(), "checkpoint": e.checkpoint, "fetched": zoo.is_fetched(e.name)}
        for e in zoo.ZOO.values()
    ]


def _models(args: argparse.Namespace) -> int:
    rows = _model_rows()
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
            ", ".join(
                f"{kind.removesuffix('_attention')} {_short_base(theta)}" for kind, theta in r["rope_theta"].items()
            ),
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


def _short_base(value: float) -> str:
    """1e5 rather than 100000.0, so bases of different size read alike."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
