"""`posleak paper`: the reproduction of claims C1–C6 (posleak.experiments.paper), or with --render-docs the
README's verdict table and results pages from a finished one.

The parser imports nothing heavy; the handler imports what it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from posleak.cli.options import add_backend_options, add_placement_options, placement_from
from posleak.experiments.paper.claims.plans import FULL, QUICK
from posleak.experiments.paper.plan import Plan


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "paper", help="reproduce claims C1–C6 of arXiv 2606.06160 (built-in models or any, by role)"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"the default: {plan_sizes(QUICK)}")
    size.add_argument("--full", action="store_true", help=plan_sizes(FULL))
    parser.add_argument(
        "--models",
        metavar="ROLE=MODEL,...",
        help="each role's model: standard, large-base, sliding, bos (default: the built-ins; bos follows sliding)",
    )
    parser.add_argument("--plan", metavar="PLAN.yaml", help="a plan file: per role the model, T and N; other sizes")
    parser.add_argument(
        "--corpus",
        action="append",
        metavar="NAME",
        help="the corpus every analysis draws from: stdlib | bible-web | FILE.txt | ...; repeat it to judge every "
        "claim on each, side by side (default: stdlib; --full: stdlib and bible-web)",
    )
    parser.add_argument("--out", default="runs/paper", help="output folder (rerun to resume)")
    parser.add_argument(
        "--render-docs",
        metavar="RUN",
        help="run nothing: copy a finished reproduction's claims.json and figures into docs/results/ and write the "
        "README's verdict table and docs/results.md from them (in the current folder, a checkout of posleak); a run "
        "of another plan than --quick goes to docs/results/PLAN/ and docs/results-PLAN.md",
    )
    add_backend_options(parser, "analyses and lab trials")
    add_placement_options(parser, defaults=True)
    parser.set_defaults(handler=_paper)


def plan_sizes(plan: Plan) -> str:
    """A plan's sizes for its --help line, from the plan itself (its analyses and time: docs/performance.md)."""
    (seq_len, num_seqs), (sliding_len, sliding_seqs) = plan.size("standard"), plan.size("sliding")
    return (
        f"N = {num_seqs} documents per sample at T = {seq_len} ({sliding_seqs} at T = {sliding_len} for "
        f"the sliding role), {plan.bootstrap} resamples, C4's lab at {len(plan.lab.seeds)} seeds of {plan.lab.steps} "
        f"steps, on {' and '.join(plan.corpora)} (its analyses and time: docs/performance.md)"
    )


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
