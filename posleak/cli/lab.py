"""`posleak train`, `posleak lab` and `posleak sweep`: the lab commands (posleak.lab).

The parsers read only modules without torch (`posleak.models.lab.config`, `posleak.cli.analyze`); the training options
mirror `TrainConfig` fields and have no argparse default (`argparse.SUPPRESS`), so `TrainConfig`'s own
defaults apply. The handlers import what they run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from posleak.cli.analyze import add_backend_options, given
from posleak.device import DEVICES, DTYPES
from posleak.models.lab.config import NORMS, PE_KINDS, SIZES, TASK_NAMES, TASK_SEEDS, TASK_VARIANTS, VARIANTS, LabSpec
from posleak.validate import Problems, out_folder_problems

if TYPE_CHECKING:
    from posleak.lab.trainer import TrainConfig

T = TypeVar("T")


def add_parser(sub: argparse._SubParsersAction) -> None:
    train_parser = sub.add_parser("train", help="train one lab model from scratch")
    _add_model_options(train_parser)
    _add_training_options(train_parser)
    train_parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for lab sizes)")
    train_parser.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    train_parser.set_defaults(handler=_train)

    lab_parser = sub.add_parser("lab", help="compare lab variants (position encodings, masks, norms) at one budget")
    lab_parser.add_argument("--size", choices=list(SIZES), default="tiny")
    lab_parser.add_argument("--bos", choices=["on", "off"], default="on")
    lab_parser.add_argument(
        "--variants",
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all; with tasks: {','.join(TASK_VARIANTS)})",
    )
    lab_parser.add_argument("--ntk-factor", type=float, default=4.0, help="NTK factor of the rope-ntk variant")
    tasks = lab_parser.add_argument_group("tasks that need position (posleak.lab.tasks; instead of the corpus)")
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
    _add_training_options(lab_parser)
    _add_backend_options(lab_parser)
    lab_parser.add_argument("--out", required=True, help="output folder (rerun to resume; finished variants stay)")
    lab_parser.set_defaults(handler=_lab)

    sweep_parser = sub.add_parser("sweep", help="run a YAML grid of lab configurations × seeds")
    sweep_parser.add_argument("spec", help="sweep spec (YAML: name, base, grid, seeds, eval)")
    _add_backend_options(sweep_parser)
    sweep_parser.add_argument("--out", required=True, help="output folder (finished trials are never rerun)")
    sweep_parser.set_defaults(handler=_sweep)


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


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    # unset options stay None: they take TrainConfig's defaults for the corpus, TASK_TRAIN's for tasks
    unset = None
    group = parser.add_argument_group("training")
    group.add_argument("--steps", type=int, default=unset)
    group.add_argument("--seq-len", type=int, default=unset, help="training length T")
    group.add_argument("--batch-size", type=int, default=unset)
    group.add_argument("--lr", type=float, default=unset, help="peak learning rate")
    group.add_argument("--warmup-steps", type=int, default=unset)
    group.add_argument("--eval-every", type=int, default=unset)
    group.add_argument("--checkpoint-every", type=int, default=unset)
    group.add_argument("--seed", type=int, default=unset)
    group.add_argument("--corpus", default=unset, help="stdlib | bible-web | FILE.txt | FOLDER | FILE.jsonl[:field]")
    group.add_argument("--vocab-size", type=int, default=unset, help="BPE vocabulary trained on the corpus")
    group.add_argument("--device", choices=DEVICES, default=unset, help="where to train and evaluate (auto: the best)")
    group.add_argument(
        "--dtype", choices=DTYPES, default=unset, help="bfloat16|float16: mixed-precision training (default float32)"
    )


def _add_backend_options(parser: argparse.ArgumentParser) -> None:
    add_backend_options(parser, "trials")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="local backend: trials at a time (default: CPU count)"
    )


def _train_options(args: argparse.Namespace) -> dict[str, Any]:
    """The training options given on the command line (`TrainConfig` fields)."""
    from posleak.lab.trainer import TrainConfig

    # --task names the lab's tasks, set per trial
    options = given(args, (field.name for field in dataclasses.fields(TrainConfig)))
    return {name: value for name, value in options.items() if name != "task" and value is not None}


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """The training options given on the command line over TrainConfig's defaults."""
    from posleak.lab.trainer import TrainConfig

    return TrainConfig(**_train_options(args))


def _checked(args: argparse.Namespace, build: Callable[[], T]) -> T:
    """`build()`'s configuration, refused with every problem of it and of --out at once: the one check of the
    output folder of each lab command."""
    problems = Problems()
    config = None
    with problems.collecting():
        config = build()
    problems.extend(out_folder_problems(args.out))
    problems.raise_any()
    assert config is not None
    return config


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
            config = _train_config(args)
        problems.raise_any()
        assert spec is not None and config is not None
        return spec, config

    spec, config = _checked(args, build)
    from posleak.lab.trainer import train

    result = train(spec, config, Path(args.out), threads=args.threads)
    last = result.metrics.dropna(subset=["val_loss"]).iloc[-1]
    print(f"trained {result.step} steps: val loss {last['val_loss']:.4f} → {result.out}")
    return 0


def _lab(args: argparse.Namespace) -> int:
    if args.task is not None or args.tasks is not None or args.seeds is not None:
        return _task_lab(args)
    from posleak.lab.plan import run_plan
    from posleak.lab.trial import EvalConfig
    from posleak.lab.variants import LabRun

    config = _checked(
        args,
        lambda: LabRun(
            size=args.size,
            bos=args.bos == "on",
            train=_train_config(args),
            eval=EvalConfig(),
            variants=_names(args.variants or ",".join(VARIANTS)),
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


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _task_lab(args: argparse.Namespace) -> int:
    """`posleak lab --task NAME | --tasks all|A,B [--seeds 0,1,2]`: every option checked before any training."""
    from posleak.lab.choices import TaskLab
    from posleak.lab.plan import run_plan

    config = _checked(
        args,
        lambda: TaskLab.from_options(
            task=args.task,
            tasks=args.tasks,
            seeds=args.seeds,
            train_options=_train_options(args),
            variants=_names(args.variants or ",".join(TASK_VARIANTS)),
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


def _sweep(args: argparse.Namespace) -> int:
    from posleak.lab.plan import run_plan
    from posleak.lab.sweep import SweepSpec

    spec = _checked(args, lambda: SweepSpec.read(args.spec))
    table = run_plan(spec.plan(), args.out, backend=args.backend, address=args.address, jobs=args.jobs).table
    print(f"{len(table)} trials → {Path(args.out) / 'sweep.parquet'}, report: {Path(args.out) / 'report.html'}")
    return 0
