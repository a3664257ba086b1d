"""`posleak inspect`, `analyze`, `intervene`, `batch`, `compare` and `paper`: the measurement commands.

The parsers import nothing heavy (torch, transformers, pandas take seconds): options that mirror a field of
`AnalyzeConfig` or an intervention's option (posleak.interventions.registry, which makes those options) have no
argparse default (`argparse.SUPPRESS`), so the default of the field or option applies and is written in one place;
the handlers import what they run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posleak.data.kinds import BOS_POLICIES, GRIDS, NULLS
from posleak.device import DEVICE_MAPS, DEVICES, DTYPES, Placement
from posleak.experiments.paper.claims.plans import FULL, QUICK
from posleak.experiments.paper.plan import Plan
from posleak.interventions.registry import option_defaults, registered_options
from posleak.runner import BACKENDS
from posleak.store.jsonfile import dumps

if TYPE_CHECKING:
    from posleak.interventions import Interventions
    from posleak.pipeline import AnalyzeConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    inspect = sub.add_parser("inspect", help="a model's position facts and per-layer sink rate")
    inspect.add_argument("model", help="built-in name, checkpoint folder, or hub id")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument("--seq-len", type=int, default=128)
    inspect.add_argument("--num-seqs", type=int, default=8)
    inspect.add_argument("--trust-remote-code", action="store_true", help="allow code shipped with the checkpoint")
    add_placement_options(inspect, defaults=True)
    inspect.set_defaults(handler=_inspect)

    analyze_parser = sub.add_parser("analyze", help="the decomposition of docs/method.md §2 into a run folder")
    analyze_parser.add_argument("model", help="built-in name, checkpoint folder, or hub id")
    add_analysis_options(analyze_parser)
    add_intervention_options(analyze_parser)
    add_null_options(analyze_parser)
    analyze_parser.set_defaults(handler=_analyze)

    intervene = sub.add_parser("intervene", help="baseline vs intervened run on the same sequences, and the effect")
    intervene.add_argument("model", help="built-in name, checkpoint folder, or hub id")
    add_analysis_options(intervene)
    add_intervention_options(intervene)
    intervene.set_defaults(handler=_intervene)

    batch = sub.add_parser("batch", help="many analyses from a YAML list of models × settings, then one comparison")
    batch.add_argument("spec", help="batch file (YAML: name, models, base, grid; see posleak.experiments.batch)")
    batch.add_argument("--out", required=True, help="output folder: runs/ and comparison/ (rerun to resume)")
    add_backend_options(batch, "analyses")
    batch.set_defaults(handler=_batch)

    compare = sub.add_parser("compare", help="architecture comparison of finished runs (docs/method.md §10)")
    compare.add_argument("runs", nargs="+", help="run folders written by posleak analyze")
    compare.add_argument("--labels", nargs="+", help="one label per run (default: model id and interventions)")
    compare.add_argument("--out", required=True, help="folder for the comparison")
    compare.set_defaults(handler=_compare)

    _add_paper_parser(sub)


def _add_paper_parser(sub: argparse._SubParsersAction) -> None:
    """`posleak paper` and its options (`_paper` runs it)."""
    paper = sub.add_parser("paper", help="reproduce claims C1–C6 of arXiv 2606.06160 (built-in models or any, by role)")
    size = paper.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"the default: {plan_sizes(QUICK)}")
    size.add_argument("--full", action="store_true", help=plan_sizes(FULL))
    paper.add_argument(
        "--models",
        metavar="ROLE=MODEL,...",
        help="each role's model: standard, large-base, sliding, bos (default: the built-ins; bos follows sliding)",
    )
    paper.add_argument("--plan", metavar="PLAN.yaml", help="a plan file: per role the model, T and N; other sizes")
    paper.add_argument(
        "--corpus",
        action="append",
        metavar="NAME",
        help="the corpus every analysis draws from: stdlib | bible-web | FILE.txt | ...; repeat it to judge every "
        "claim on each, side by side (default: stdlib; --full: stdlib and bible-web)",
    )
    paper.add_argument("--out", default="runs/paper", help="output folder (rerun to resume)")
    paper.add_argument(
        "--render-docs",
        metavar="RUN",
        help="run nothing: copy a finished reproduction's claims.json and figures into docs/results/ and write the "
        "README's verdict table and docs/results.md from them (in the current folder, a checkout of posleak); a run "
        "of another plan than --quick goes to docs/results/PLAN/ and docs/results-PLAN.md",
    )
    add_backend_options(paper, "analyses and lab trials")
    add_placement_options(paper, defaults=True)
    paper.set_defaults(handler=_paper)


def plan_sizes(plan: Plan) -> str:
    """A plan's sizes for its --help line, from the plan itself (its analyses and time: docs/performance.md)."""
    (seq_len, num_seqs), (sliding_len, sliding_seqs) = plan.size("standard"), plan.size("sliding")
    return (
        f"N = {num_seqs} documents per sample at T = {seq_len} ({sliding_seqs} at T = {sliding_len} for "
        f"the sliding role), {plan.bootstrap} resamples, C4's lab at {len(plan.lab.seeds)} seeds of {plan.lab.steps} "
        f"steps, on {' and '.join(plan.corpora)} (its analyses and time: docs/performance.md)"
    )


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
    given = Placement()
    group = parser.add_argument_group("device and precision (docs/method.md §4: the sums stay float64)")

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    group.add_argument(
        "--device", choices=DEVICES, default=default(given.device), help="auto: CUDA, else MPS, else CPU"
    )
    group.add_argument(
        "--dtype", choices=DTYPES, default=default(given.dtype), help="the model's weights and activations"
    )
    group.add_argument(
        "--device-map", choices=DEVICE_MAPS, default=default(given.device_map), help="spread the layers over devices"
    )
    group.add_argument(
        "--max-memory",
        default=default(given.max_memory),
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


def given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The options given on the command line among `names`."""
    wanted = set(names)
    return {name: value for name, value in vars(args).items() if name in wanted}


def interventions_from(args: argparse.Namespace) -> Interventions:
    from posleak.interventions import Interventions

    return Interventions(**given(args, option_defaults()))


def config_from(args: argparse.Namespace, interventions: Interventions) -> AnalyzeConfig:
    from posleak.pipeline import AnalyzeConfig

    return AnalyzeConfig(**given(args, AnalyzeConfig.OPTIONS), interventions=interventions)


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


def _analyze(args: argparse.Namespace) -> int:
    from posleak.cli.summary import analysis_lines
    from posleak.commands.analyze import analyze

    config = config_from(args, interventions_from(args))
    result = analyze(args.model, config, out=Path(args.out), trust_remote_code=args.trust_remote_code)
    per_layer = result.per_layer
    print(f"wrote {args.out}: report.html, per_head/per_layer/profiles/offset_map.parquet, figures/", file=sys.stderr)
    print(
        per_layer[["layer", "layer_type", "mask_early", "mask_all", "resid_early", "resid_all", "sink_rate"]].to_string(
            index=False, float_format=lambda x: f"{x:.4f}"
        )
    )
    print("\n".join(analysis_lines(result)))
    return 0


def _intervene(args: argparse.Namespace) -> int:
    from posleak.cli.summary import intervention_lines
    from posleak.commands.intervene import OVERALL, intervene

    config = config_from(args, interventions_from(args))
    run = intervene(args.model, config, out=Path(args.out), trust_remote_code=args.trust_remote_code)
    overall = run.effect[run.effect["layer"] == OVERALL]
    print(f"wrote {args.out}: effect.parquet, report.html, baseline/, intervened/", file=sys.stderr)
    print(overall.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print("\n".join(intervention_lines(run)))
    return 0


def _batch(args: argparse.Namespace) -> int:
    from posleak.experiments.batch import BatchSpec, run_batch

    summary = run_batch(BatchSpec.read(args.spec), args.out, backend=args.backend, address=args.address)
    print(f"wrote {args.out}: runs/, comparison/ (comparison.parquet, figures/, report.html)", file=sys.stderr)
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from posleak.experiments.compare import compare_runs

    summary = compare_runs(args.runs, out=Path(args.out), labels=args.labels)
    print(f"wrote {args.out}: comparison.parquet, figures/, report.html", file=sys.stderr)
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    return 0


def _paper(args: argparse.Namespace) -> int:
    from posleak.cli.summary import paper_lines
    from posleak.errors import BadInput
    from posleak.experiments.paper import FULL, QUICK, paper_plan, reproduce
    from posleak.experiments.paper.run import reproduction_problems

    if args.render_docs:
        from posleak.experiments.paper.render import render_docs

        written = render_docs(Path(args.render_docs), Path.cwd())
        print(f"wrote {', '.join(str(p.relative_to(Path.cwd())) for p in written)}", file=sys.stderr)
        return 0
    start = dataclasses.replace(FULL if args.full else QUICK, placement=placement_from(args))
    plan, problems = paper_plan(start, args.models, args.plan, args.corpus)
    if problems:  # with every other problem of the run, before any work
        raise BadInput(reproduction_problems(Path(args.out), plan, args.backend, found=problems))
    claims = reproduce(Path(args.out), plan, backend=args.backend, address=args.address)
    print(f"wrote {args.out}: report.html, claims.json, runs/", file=sys.stderr)
    print("\n".join(paper_lines(claims)))
    return 0
