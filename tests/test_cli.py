"""Success paths of the command line on a built-in model, run as a user would (a fresh interpreter):
`posleak inspect` against attention weights from transformers' own eager path, and `posleak analyze` writing a
complete run folder that a rerun reads back without rewriting a file. And an instant command line: help and the
model listing answer without importing torch or transformers."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from cli import file_stamps, run_cli

from posleak.capture import use_posleak_attention
from posleak.cli import analyze as analyze_cli
from posleak.cli import build_parser
from posleak.data.batches import make_sequences
from posleak.data.corpus import load_corpus
from posleak.experiments.paper.claims.plans import FULL, QUICK
from posleak.experiments.paper.plan import Plan
from posleak.models.load import LoadedModel


@pytest.mark.slow
def test_inspect_reports_the_facts_and_the_sink_rate_of_eager_attention(smollm2: LoadedModel) -> None:
    """The facts of SmolLM2 as the NOTES record them, and per layer the share of heads with α_0 > 0.3 computed from
    the attention weights transformers' eager attention returns on the same sequences."""
    proc = run_cli("inspect", "smollm2-135m", "--json", "--seq-len", "32", "--num-seqs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout)
    facts = info["facts"]
    assert (facts["layers"], facts["heads"], facts["kv_heads"]) == (30, 9, 3)
    assert facts["rope_theta"] == [1e5] * 30
    assert info["position0"]["auto"] == "first content token"  # SmolLM2 does not prepend its BOS
    assert info["position0"]["on"] == {"id": 1, "text": "<|im_start|>"}

    ids = make_sequences(load_corpus("stdlib"), smollm2.tokenizer, 32, 2, bos="auto", seed=0).ids
    model = smollm2.model
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(ids, output_attentions=True).attentions  # L × (N, H, T, T)
    finally:
        use_posleak_attention(model)
    alpha0 = torch.stack([weights[:, :, 1:, 0].double().mean(dim=(0, 2)) for weights in attentions])  # (L, H)
    assert (alpha0 - 0.3).abs().min() > 1e-4  # no head so near ε that rounding could flip it
    rates = (alpha0 > 0.3).double().mean(dim=1)
    assert rates.max() > 0  # SmolLM2 has sink heads
    assert info["sink_rate"]["per_layer"] == pytest.approx(rates.tolist(), abs=1e-4)  # printed to 4 places


@pytest.mark.slow
def test_analyze_writes_a_complete_run_folder_and_a_rerun_reads_it_back(tmp_path: Path) -> None:
    """Exit 0, a manifest with status complete, per_layer.parquet with a row per layer, the report; rerun with the
    same arguments, no file of the folder is written again."""
    out = tmp_path / "run"
    args = ("analyze", "smollm2-135m", "--seq-len", "32", "--num-seqs", "4", "--bootstrap", "20", "--out", str(out))
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    per_layer = pd.read_parquet(out / "per_layer.parquet")
    assert {"layer", "mask_early", "mask_all", "resid_early", "resid_all"} <= set(per_layer.columns)
    assert per_layer["layer"].tolist() == list(range(30))
    assert (out / "report.html").stat().st_size > 10_000

    finished = file_stamps(out)
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert file_stamps(out) == finished, "the finished run was computed again"


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

    sizes_changed = {
        **QUICK.sizes,
        "standard": (QUICK.size("standard")[0], 17),
        "sliding": (1024, QUICK.size("sliding")[1]),
    }
    lab = replace(QUICK.lab, seeds=(0, 1), steps=50)
    changed = replace(QUICK, sizes=sizes_changed, bootstrap=300, lab=lab)
    assert sizes(changed) != sizes(QUICK)
    for quick in (QUICK, changed):
        monkeypatch.setattr(analyze_cli, "QUICK", quick)
        helps = _helps(build_parser())
        assert numbers(helps["paper --quick"]) == sizes(quick)
        assert numbers(helps["paper --full"]) == sizes(FULL)
        assert " and ".join(FULL.corpora) in helps["paper --full"]
