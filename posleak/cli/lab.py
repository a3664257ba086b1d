"""`posleak lab`: lab variants (position encodings, masks, norms) compared at one budget, on the corpus or on
tasks that need position (posleak.lab).

The parser reads only modules without torch (`posleak.models.lab.config`, `posleak.cli.options`); the handler
imports what it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posleak.cli.options import (
    add_training_options,
    add_trial_backend_options,
    checked_config,
    train_config,
    train_options,
)
from posleak.models.lab.config import SIZES, TASK_NAMES, TASK_SEEDS, TASK_VARIANTS, VARIANTS


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("lab", help="compare lab variants (position encodings, masks, norms) at one budget")
    parser.add_argument("--size", choices=list(SIZES), default="tiny")
    parser.add_argument("--bos", choices=["on", "off"], default="on")
    parser.add_argument(
        "--variants",
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all; with tasks: {','.join(TASK_VARIANTS)})",
    )
    parser.add_argument("--ntk-factor", type=float, default=4.0, help="NTK factor of the rope-ntk variant")
    tasks = parser.add_argument_group("tasks that need position (posleak.lab.tasks; instead of the corpus)")
    tasks.add_argument("--task", help=f"train the variants on one task: {', '.join(TASK_NAMES)}")
    tasks.add_argument("--tasks", help="all, or comma-separated task names: writes choices.parquet")
    tasks.add_argument(
        "--seeds",
        help=f"comma-separated training seeds of a task run (default {','.join(map(str, TASK_SEEDS))}; "
        "intervals are over seeds)",
    )
    tasks.add_argument(
        "--target",
        type=float,
        help="stop a trial once its validation exact match reaches this share (default 0.99; --steps is the cap, "
        "default 2000)",
    )
    tasks.add_argument(
        "--patience",
        type=int,
        help="stop a trial after this many evaluations (every --eval-every steps, default 50) that improved on "
        "neither its best exact match nor its best validation loss (default 6)",
    )
    add_training_options(parser)
    add_trial_backend_options(parser)
    parser.add_argument("--out", required=True, help="output folder (rerun to resume; finished variants stay)")
    parser.set_defaults(handler=_lab)


def _lab(args: argparse.Namespace) -> int:
    if args.task is not None or args.tasks is not None or args.seeds is not None:
        return _task_lab(args)
    from posleak.lab.plan import run_plan
    from posleak.lab.trial import EvalConfig
    from posleak.lab.variants import LabRun

    config = checked_config(
        args,
        lambda: LabRun(
            size=args.size,
            bos=args.bos == "on",
            train=train_config(args),
            eval=EvalConfig(),
            variants=_comma_separated(args.variants or ",".join(VARIANTS)),
            ntk_factor=args.ntk_factor,
        ),
    )
    table = run_plan(config.plan(), args.out, backend=args.backend, address=args.address, jobs=args.jobs).table
    print(
        table[["variant", "ppl_1x", "ppl_2x", "ppl_4x", "probe_r2_best", "mask_all", "resid_all"]].to_string(
            index=False
        )
    )
    print(f"report: {Path(args.out) / 'report.html'}")
    return 0


def _comma_separated(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _task_lab(args: argparse.Namespace) -> int:
    """`posleak lab --task NAME | --tasks all|A,B [--seeds 0,1,2]`: every option checked before any training."""
    from posleak.lab.choices import TaskLab
    from posleak.lab.plan import run_plan

    config = checked_config(
        args,
        lambda: TaskLab.from_options(
            task=args.task,
            tasks=args.tasks,
            seeds=args.seeds,
            train_options=train_options(args),
            variants=_comma_separated(args.variants or ",".join(TASK_VARIANTS)),
            size=args.size,
            bos=args.bos == "on",
            ntk_factor=args.ntk_factor,
        ),
    )
    outcome = run_plan(config.plan(), args.out, backend=args.backend, address=args.address, jobs=args.jobs)
    choices = outcome.extras["choices"]
    first = choices[choices["multiple"] == choices["multiple"].min()]
    columns = ["task", "variant", "outcome", "steps", "rank", "accuracy", "accuracy_lo", "accuracy_hi", "beats"]
    print(first[columns].to_string(index=False))
    print(f"choices: {Path(args.out) / 'choices.parquet'}, report: {Path(args.out) / 'report.html'}")
    return 0
