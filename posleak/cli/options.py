"""The options several commands share, and the configurations they make.

The measurement commands (`inspect`, `analyze`, `intervene`, `batch`, `paper`): options that mirror a field of
`AnalyzeConfig` or an intervention's option (posleak.interventions.registry, which makes those options) have no
argparse default (`argparse.SUPPRESS`), so the default of the field or option applies and is written in one place.
The lab commands (`train`, `lab`, `sweep`): the training options mirror `TrainConfig` fields and stay None unless
given, so `TrainConfig`'s own defaults apply. Nothing here imports anything heavy (torch, transformers, pandas take
seconds): what builds a configuration imports it when called.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from posleak.data.kinds import BOS_POLICIES, GRIDS, NULLS
from posleak.device import DEVICE_MAPS, DEVICES, DTYPES, Placement
from posleak.interventions.registry import option_defaults, registered_options
from posleak.runner import BACKENDS
from posleak.validate import Problems, out_folder_problems

if TYPE_CHECKING:
    from posleak.interventions import Interventions
    from posleak.lab.trainer import TrainConfig
    from posleak.pipeline import AnalyzeConfig

T = TypeVar("T")


def add_analysis_options(parser: argparse.ArgumentParser) -> None:
    """The options of `AnalyzeConfig` (their defaults are its defaults: see the module docstring)."""
    unset = argparse.SUPPRESS
    parser.add_argument("--seq-len", type=int, default=unset, help="sequence length T")
    parser.add_argument("--num-seqs", type=int, default=unset, help="number of sequences N")
    parser.add_argument("--batch-size", type=int, default=unset, help="sequences per forward pass")
    parser.add_argument("--bos", choices=BOS_POLICIES, default=unset, help="BOS at position 0")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--corpus", default=unset, help="stdlib | bible-web | FILE.txt | FOLDER | FILE.jsonl[:field]")
    source.add_argument("--tokens", default=unset, help="a .npy file of token ids (N×T), taken verbatim")
    parser.add_argument(
        "--cross-documents", action="store_true", default=unset, help="let sequences run across documents"
    )
    parser.add_argument(
        "--windows-per-document",
        type=int,
        default=unset,
        metavar="K",
        help="at most K windows of each document, one of every document before a second of any (1: N sequences "
        "of N distinct documents; default: no limit)",
    )
    parser.add_argument(
        "--grid",
        choices=GRIDS,
        default=unset,
        help="resolution of the profile and offset-map tables (exact: one cell per pair, T ≤ 256); "
        "magnitudes are over single pairs whatever the grid",
    )
    parser.add_argument("--early", type=int, default=unset, help="early queries are 1 ≤ i < K")
    parser.add_argument(
        "--beyond",
        type=int,
        default=unset,
        help="the range 'beyond' is W ≤ i < T on any model (default: the model's sliding window; method §3)",
    )
    parser.add_argument("--seed", type=int, default=unset, help="corpus sampling and random interventions")
    parser.add_argument("--bootstrap", type=int, default=unset, help="bootstrap resamples")
    parser.add_argument("--out", required=True, help="run folder (rerun with the same arguments to resume)")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow code shipped with the checkpoint")
    add_placement_options(parser, defaults=False)
    parser.add_argument(
        "--measure-budget",
        default=unset,
        metavar="BYTES|auto",
        help="captures up to this size (e.g. 8GiB) stay on the model's device and each layer is measured there "
        "during the last forward; beyond it they go to the run folder (auto: half the free CUDA memory; on the "
        "CPU 0, its captures being the run's checkpoints)",
    )


def add_null_options(parser: argparse.ArgumentParser) -> None:
    """--null and --null-seed: the analysis of a null of the same sequences (docs/method.md §14)."""
    unset = argparse.SUPPRESS
    group = parser.add_argument_group("nulls (docs/method.md §14)")
    group.add_argument(
        "--null",
        choices=NULLS,
        default=unset,
        help="analyse the same sequences with each row's tokens circularly shifted or shuffled (a BOS stays at 0)",
    )
    group.add_argument("--null-seed", type=int, default=unset, help="the null's draw (with --null; default 0)")


def add_placement_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """--device, --dtype, --device-map, --max-memory (posleak.device); `defaults=False`: none of their own, for
    options that are `AnalyzeConfig` fields (the module docstring says why)."""
    placement = Placement()
    group = parser.add_argument_group("device and precision (docs/method.md §4: the sums stay float64)")

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    group.add_argument(
        "--device", choices=DEVICES, default=default(placement.device), help="auto: CUDA, else MPS, else CPU"
    )
    group.add_argument(
        "--dtype", choices=DTYPES, default=default(placement.dtype), help="the model's weights and activations"
    )
    group.add_argument(
        "--device-map",
        choices=DEVICE_MAPS,
        default=default(placement.device_map),
        help="spread the layers over devices",
    )
    group.add_argument(
        "--max-memory",
        default=default(placement.max_memory),
        metavar="DEV=SIZE,..",
        help="with --device-map: cpu=8GiB,0=20GiB",
    )


def add_backend_options(parser: argparse.ArgumentParser, units: str) -> None:
    parser.add_argument(
        "--backend", choices=list(BACKENDS), default="local", help=f"run the {units} here or as Ray tasks"
    )
    parser.add_argument("--address", help="an existing Ray cluster (default: start a local one)")


def placement_from(args: argparse.Namespace) -> Placement:
    return Placement(args.device, args.dtype, args.device_map, args.max_memory)


def add_intervention_options(parser: argparse.ArgumentParser) -> None:
    """One option for each registered intervention's options (posleak.interventions.registry), in its order."""
    group = parser.add_argument_group("interventions (docs/method.md §9)")
    for option in registered_options():
        if option.flag:
            group.add_argument(
                option.flag_name,
                default=argparse.SUPPRESS,
                metavar=None if option.choices else option.metavar,
                choices=option.choices,
                help=option.help,
            )


def options_given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options given on the command line among `names`."""
    wanted = set(names)
    return {name: value for name, value in vars(args).items() if name in wanted}


def interventions_from(args: argparse.Namespace) -> Interventions:
    from posleak.interventions import Interventions

    return Interventions(**options_given(args, option_defaults()))


def config_from(args: argparse.Namespace, interventions: Interventions) -> AnalyzeConfig:
    from posleak.pipeline import AnalyzeConfig

    return AnalyzeConfig(**options_given(args, AnalyzeConfig.OPTIONS), interventions=interventions)


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """The options of `TrainConfig` (`train` and `lab`)."""
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


def add_trial_backend_options(parser: argparse.ArgumentParser) -> None:
    """Where the lab's trials run (`lab` and `sweep`): --backend, --address and, on the local backend, --jobs."""
    add_backend_options(parser, "trials")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="local backend: trials at a time (default: CPU count)"
    )


def train_options(args: argparse.Namespace) -> dict[str, Any]:
    """The training options given on the command line (`TrainConfig` fields)."""
    from posleak.lab.trainer import TrainConfig

    # --task names the lab's tasks, set per trial
    options = options_given(args, (field.name for field in dataclasses.fields(TrainConfig)))
    return {name: value for name, value in options.items() if name != "task" and value is not None}


def train_config(args: argparse.Namespace) -> TrainConfig:
    """The training options given on the command line over TrainConfig's defaults."""
    from posleak.lab.trainer import TrainConfig

    return TrainConfig(**train_options(args))


def checked_config(args: argparse.Namespace, build: Callable[[], T]) -> T:
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
