"""`posleak inspect MODEL`: a model's position facts and per-layer sink rate (posleak.commands.inspect).

The parser imports nothing heavy; the handler imports what it runs.
"""

from __future__ import annotations

import argparse

from posleak.cli.options import add_placement_options, placement_from
from posleak.store.jsonfile import dumps


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("inspect", help="a model's position facts and per-layer sink rate")
    parser.add_argument("model", help="built-in name, checkpoint folder, or hub id")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--num-seqs", type=int, default=8)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow code shipped with the checkpoint")
    add_placement_options(parser, defaults=True)
    parser.set_defaults(handler=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    from posleak.commands.inspect import inspect_model

    info = inspect_model(
        args.model,
        seq_len=args.seq_len,
        num_seqs=args.num_seqs,
        trust_remote_code=args.trust_remote_code,
        placement=placement_from(args),
    )
    if args.json:
        print(dumps(info, indent=2))
        return 0
    facts = info["facts"]
    print(
        f"{info['model']}: {facts['architecture']}, {facts['layers']} layers, {facts['heads']} heads / "
        f"{facts['kv_heads']} KV, head dim {facts['head_dim']}, max positions {facts['max_positions']}"
    )
    for policy, token in info["position0"].items():
        shown = token if isinstance(token, str) else token.get("error") or f"{token['text']!r} (id {token['id']})"
        print(f"  position 0 with --bos {policy}: {shown}")
    print(
        f"  sink rate on {info['sink_rate']['num_seqs']} × {info['sink_rate']['seq_len']} tokens of "
        f"{info['sink_rate']['corpus']} (share of heads with α0 > 0.3)"
    )
    print(f"  {'layer':>5}  {'type':<17} {'window':>6}  {'rope θ':>10}  {'scaling':<12} {'sink rate':>9}")
    for layer, rate in enumerate(info["sink_rate"]["per_layer"]):
        window = facts["window"][layer] or "-"
        theta = facts["rope_theta"][layer]
        scaling = facts["rope_type"][layer] or "-"
        if facts["rope_factor"][layer]:
            scaling += f"×{facts['rope_factor'][layer]:g}"
        theta_text = f"{theta:.4g}" if theta is not None else "none"
        kind = facts["layer_types"][layer]
        print(f"  {layer:>5}  {kind:<17} {window!s:>6}  {theta_text:>10}  {scaling:<12} {rate:>9.2f}")
    return 0
