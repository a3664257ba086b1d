"""The command line as a whole: an instant one (help and the model listing answer without importing torch or
transformers), and help texts that state no time and take the paper plans' sizes from the plans. Each command's own
tests are in its file (test_inspect.py, test_analyze.py, test_intervene.py, test_lab.py, ...)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from posleak.cli import build_parser
from posleak.cli import paper as paper_cli
from posleak.experiments.paper.claims.plans import FULL, QUICK
from posleak.experiments.paper.plan import Plan

# Run in a fresh interpreter: what is in sys.modules once `posleak ARGS` has answered (argparse's -h exits).
_IMPORTED_AFTER = """
import contextlib, io, json, sys
from posleak.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        code = main(sys.argv[1:])
    except SystemExit as exit_:
        code = exit_.code
heavy = sorted(name for name in ("torch", "transformers", "pandas", "ray") if name in sys.modules)
print(json.dumps({"code": code, "heavy": heavy, "out": out.getvalue()}))
"""
COMMANDS = ("inspect", "analyze", "intervene", "batch", "compare", "paper", "train", "lab", "sweep", "models", "fetch")


@pytest.mark.parametrize(
    "args", [("--help",), ("models",), ("models", "--json")] + [(command, "-h") for command in COMMANDS]
)
def test_help_and_the_model_listing_import_neither_torch_nor_transformers(args: tuple[str, ...]) -> None:
    """`posleak --help`, every `posleak COMMAND -h` and `posleak models` answer (exit 0, their text) with torch,
    transformers, pandas and Ray left unimported: each costs seconds (torch alone 3 s here)."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTED_AFTER, *args], capture_output=True, text=True, timeout=120, check=True
    )
    answer = json.loads(proc.stdout)
    assert answer["code"] == 0, proc.stderr
    assert answer["heavy"] == []
    if args in (("models",), ("models", "--json")):
        assert "smollm2-135m" in answer["out"] and "qwen2.5-coder-0.5b" in answer["out"]
    else:
        assert answer["out"].startswith("usage: posleak")


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Every option's help text of every command, by `COMMAND OPTION`."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {
        f"{name} {'/'.join(action.option_strings) or action.dest}": action.help or ""
        for name, command in commands.items()
        for action in command._actions
    }


def test_the_help_states_no_time_and_takes_the_paper_plans_sizes_from_the_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No --help text types a time (they change with the machine and the plan: docs/performance.md), and the numbers
    in `paper --quick` and `--full`'s are each plan's own, in order: N, T, the sliding role's N and T, the resamples,
    the lab's seeds and steps; a plan changed, its help follows."""
    helps = _helps(build_parser())
    assert not [key for key, text in helps.items() if re.search(r"\b(minutes?|hours?|seconds)\b|\d+ s\b", text)]

    def sizes(plan: Plan) -> list[int]:
        (seq_len, num_seqs), (sliding_len, sliding_seqs) = plan.size("standard"), plan.size("sliding")
        return [num_seqs, seq_len, sliding_seqs, sliding_len, plan.bootstrap, len(plan.lab.seeds), plan.lab.steps]

    def numbers(text: str) -> list[int]:
        return [int(n) for n in re.findall(r"(?<![\w.])\d+(?!\w)", text)]  # not the 4 of "C4"

    standard, sliding = (QUICK.size("standard")[0], 17), (1024, QUICK.size("sliding")[1])
    lab = replace(QUICK.lab, seeds=(0, 1), steps=50)
    changed = replace(QUICK, sizes={**QUICK.sizes, "standard": standard, "sliding": sliding}, bootstrap=300, lab=lab)
    assert sizes(changed) != sizes(QUICK)
    for quick in (QUICK, changed):
        monkeypatch.setattr(paper_cli, "QUICK", quick)
        helps = _helps(build_parser())
        assert numbers(helps["paper --quick"]) == sizes(quick)
        assert numbers(helps["paper --full"]) == sizes(FULL)
        assert " and ".join(FULL.corpora) in helps["paper --full"]
