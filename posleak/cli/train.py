"""`posleak train`: one lab model trained from scratch (posleak.lab.trainer).

The parser reads only modules without torch (`posleak.models.lab.config`, `posleak.cli.options`); the handler
imports what it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from posleak.cli.options import add_training_options, checked_config, train_config
from posleak.models.lab.config import NORMS, PE_KINDS, SIZES, LabSpec
from posleak.validate import Problems

if TYPE_CHECKING:
    from posleak.lab.trainer import TrainConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train one lab model from scratch")
    _add_model_options(parser)
    add_training_options(parser)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for lab sizes)")
    parser.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    parser.set_defaults(handler=_train)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    defaults = LabSpec()
    group = parser.add_argument_group("lab model")
    group.add_argument("--size", choices=list(SIZES), default=defaults.size)
    group.add_argument("--pe", choices=list(PE_KINDS), default=defaults.pe, help="position encoding")
    group.add_argument("--attention", default=defaults.attention, help="causal | window:W | prefix:P")
    group.add_argument("--norm", choices=list(NORMS), default=defaults.norm, help="attention normalisation")
    group.add_argument("--bos", choices=["on", "off"], default="on", help="<bos> at position 0 of every row")
    group.add_argument("--rope-base", type=float, default=defaults.rope_base, help="RoPE θ")
    group.add_argument("--rope-scaling", default=defaults.rope_scaling, help="none | ntk:K | linear:K")
    group.add_argument(
        "--rotary-fraction", type=float, default=defaults.rotary_fraction, help="share of each head RoPE rotates"
    )


def _train(args: argparse.Namespace) -> int:
    def build() -> tuple[LabSpec, TrainConfig]:
        problems = Problems()
        spec = config = None
        with problems.collecting():
            spec = LabSpec(
                size=args.size,
                pe=args.pe,
                attention=args.attention,
                norm=args.norm,
                bos=args.bos == "on",
                rope_base=args.rope_base,
                rope_scaling=args.rope_scaling,
                rotary_fraction=args.rotary_fraction,
            )
        with problems.collecting():
            config = train_config(args)
        problems.raise_any()
        assert spec is not None and config is not None
        return spec, config

    spec, config = checked_config(args, build)
    from posleak.lab.trainer import train

    result = train(spec, config, Path(args.out), threads=args.threads)
    last = result.metrics.dropna(subset=["val_loss"]).iloc[-1]
    print(f"trained {result.step} steps: val loss {last['val_loss']:.4f} → {result.out}")
    return 0
