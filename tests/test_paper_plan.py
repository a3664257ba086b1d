"""`posleak paper`'s plan: the models by role (`--models`, `--plan`: the built-ins' run folders kept, every bad
assignment refused from the real models' configs and tokenizers before any work), samples the corpora can hold,
and the counts of analyses and lab models that follow the plan's sizes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cli import run_main
from transformers import PreTrainedTokenizerBase

from posleak.data.batches import part_documents
from posleak.data.corpus import load_corpus
from posleak.experiments.paper import FULL, QUICK, paper_plan
from posleak.experiments.paper.claims.c1.options import C1Options
from posleak.experiments.paper.claims.c3.options import C3Options
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.claims.registry import CLAIMS
from posleak.experiments.paper.counts import analysis_count, lab_model_count
from posleak.experiments.paper.models import role_problems, role_tokenizers
from posleak.experiments.paper.plan import ROLES, Plan, role_for
from posleak.experiments.paper.reproduction import PARTS, shared_requests
from posleak.experiments.paper.samples import document_problems
from posleak.models.load import LoadedModel

# A bad role assignment is refused within this, the models' configs and tokenizers read; counted in CPU seconds
# of this process (its threads included), which a machine shared with other work does not stretch.
CHECK_BUDGET_S = 10.0

ROOT = Path(__file__).resolve().parents[1]


def test_models_by_role_keep_the_built_in_folders_and_name_others_after_their_spec(tmp_path: Path) -> None:
    builtins = "standard=smollm2-135m,large-base=qwen2.5-coder-0.5b,sliding=gemma3-270m,bos=gemma3-270m"
    named, problems = paper_plan(QUICK, builtins)
    assert problems == [] and named == QUICK  # the built-ins named explicitly are the default plan
    folders = [a.folder for a in shared_requests(named, CLAIMS, "A")]
    assert folders == [
        "smollm2-135m",
        "smollm2-135m-ntk4",
        "smollm2-135m-ntk16",
        "qwen2.5-coder-0.5b",
        "gemma3-270m",
        "gemma3-270m-bos",
        "gemma3-270m-bos-mean",
        "gemma3-270m-bos-random",
        "gemma3-270m-bos-zero",
        "smollm2-135m-shuffle",
        "smollm2-135m-shift",
        "qwen2.5-coder-0.5b-shuffle",
        "qwen2.5-coder-0.5b-shift",
        "gemma3-270m-shuffle",
        "gemma3-270m-shift",
    ]
    # "bos" follows "sliding" unless named; a hub id or a folder is named after its last part
    plan, problems = paper_plan(QUICK, "sliding=mistralai/Mistral-7B-v0.1, standard = /ckpt/Llama 3.1/")
    assert problems == []
    assert plan.roles["bos"].model == plan.roles["sliding"].model == "mistralai/Mistral-7B-v0.1"
    assert [plan.roles[r].folder for r in ("standard", "sliding", "bos")] == [
        "Llama_3.1",
        "Mistral-7B-v0.1",
        "Mistral-7B-v0.1-bos",
    ]
    assert plan.roles["large-base"] == ROLES["large-base"]
    assert shared_requests(plan, CLAIMS, "A")[1].folder == "Llama_3.1-ntk4"


def test_a_plan_file_sets_each_role_and_the_plan_s_sizes(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "roles:\n"
        "  standard: {model: smollm2-135m, seq_len: 128, num_seqs: 6}\n"
        "  sliding: {seq_len: 1024}\n"
        "  large-base: qwen2.5-coder-0.5b\n"
        "base: {ntk_factors: [2, 8], bootstrap: 50, lab_seeds: [3]}\n"
    )
    plan, problems = paper_plan(QUICK, "bos=smollm2-135m", path)
    assert problems == []
    assert plan.size("standard") == (128, 6) and plan.size("bos") == (128, 6)  # bos follows the standard size
    assert plan.size("sliding") == (1024, QUICK.size("sliding")[1]) and plan.size("large-base") == QUICK.size(
        "large-base"
    )
    assert (plan.option(C4Options).ntk_factors, plan.bootstrap, plan.lab.seeds) == ((2.0, 8.0), 50, (3,))
    assert plan.roles["bos"].folder == "smollm2-135m-bos" and plan.roles["sliding"] == ROLES["sliding"]
    path.write_text("roles:\n  nosuch: x\n  standard: {seq_len: -1}\nbase: {bootstrap: many, ntk_factors: []}\n")
    _, problems = paper_plan(QUICK, None, path)
    assert len(problems) == 4, problems
    assert [p.split(": ")[1].split(" ")[0] for p in problems] == ["unknown", "role", "base", "base"]
    path.write_text("base: {epochs: 3}\n")
    assert "unknown options ['epochs']" in paper_plan(QUICK, None, path)[1][0]
    path.write_text("base: [3]\n")
    assert paper_plan(QUICK, None, path)[1] == [
        f"paper plan '{path}': base must map Plan fields to values (ntk_factors: [4, 16], ...)"
    ]


@pytest.fixture(scope="module")
def edited_checkpoint(tmp_path_factory: pytest.TempPathFactory, zoo_model) -> Callable[..., Path]:
    """A checkpoint folder of smollm2-135m's own files (its weights linked, not copied) with its config or
    tokenizer config edited, or without the BPE merges that make `unmerged` words: a real model that fails one
    check."""
    source = zoo_model("smollm2-135m").path

    def make(
        name: str,
        config: dict[str, Any] | None = None,
        tokenizer: dict[str, Any] | None = None,
        unmerged: tuple[str, ...] = (),
    ) -> Path:
        folder = tmp_path_factory.mktemp(name)
        (folder / "model.safetensors").symlink_to(source / "model.safetensors")
        for file, changes in (("config.json", config), ("tokenizer_config.json", tokenizer)):
            (folder / file).write_text(json.dumps({**json.loads((source / file).read_text()), **(changes or {})}))
        vocabulary = json.loads((source / "tokenizer.json").read_text())
        merges = vocabulary["model"]["merges"]
        vocabulary["model"]["merges"] = [pair for pair in merges if "".join(pair) not in unmerged]
        (folder / "tokenizer.json").write_text(json.dumps(vocabulary))
        return folder

    return make


@pytest.mark.parametrize(
    ("models", "needles"),
    [
        ("sliding=smollm2-135m", ["roles standard and sliding would share", "has no sliding window"]),
        ("nosuch=x", ["unknown role 'nosuch'"]),
        ("standard=/no/such/dir", ["standard model /no/such/dir: no model '/no/such/dir'"]),
        ("standard,large-base=", ["'standard' is not ROLE=MODEL", "'large-base=' is not ROLE=MODEL"]),
    ],
)
def test_paper_refuses_a_bad_role_assignment_before_any_work(
    tmp_path: Path, zoo_model, models: str, needles: list[str]
) -> None:
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"):
        zoo_model(name)
    out = tmp_path / "paper"
    start = time.process_time()
    proc = run_main("paper", "--quick", "--models", models, "--out", str(out))
    elapsed = time.process_time() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == len(needles), proc.stderr
    for line, needle in zip(lines, needles, strict=True):
        assert line.startswith("posleak: error: ") and needle in line, line
    assert not out.exists() and elapsed < CHECK_BUDGET_S


def test_every_problem_of_the_models_in_their_roles_at_once(
    tmp_path: Path, zoo_model, edited_checkpoint: Callable[..., Path]
) -> None:
    """A tokenizer without a BOS in a BOS-needing role, a model shorter than its T, a window not shorter than T,
    an unknown role: one line each, nothing written."""
    zoo_model("gemma3-270m")
    no_bos = edited_checkpoint("nobos", tokenizer={"bos_token": None})
    short = edited_checkpoint("short", config={"max_position_embeddings": 128})
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"roles:\n  sliding: {{seq_len: 512}}\n  large-base: {{model: {short}, seq_len: 256}}\n")
    out = tmp_path / "paper"
    proc = run_main("paper", "--models", f"standard={no_bos},nosuch=1", "--plan", str(plan), "--out", str(out))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 4, proc.stderr
    assert "unknown role 'nosuch'" in lines[0]
    assert f"standard model {no_bos}: its tokenizer has no BOS token, and C6" in lines[1]
    assert f"large-base model {short}: its maximum positions (128) are shorter than its T = 256" in lines[2]
    assert "sliding model gemma3-270m: its sliding window W = 512 is not shorter than its T = 512" in lines[3]
    assert not out.exists()


def test_a_model_shorter_than_c4_s_window_line_is_refused_before_any_work(
    edited_checkpoint: Callable[..., Path],
) -> None:
    """C4's window line measures the standard and sliding models at its own T: a model whose maximum positions are
    shorter than that T is refused with its own line (the plan's T and the line's T each checked), and a model in a
    role the line does not measure is not held to it."""
    short = edited_checkpoint("short-window", config={"max_position_embeddings": 512})
    roles = {**QUICK.roles, **{role: role_for(role, str(short)) for role in ("standard", "large-base")}}
    found = [
        p
        for p in role_problems(replace(QUICK, roles=roles).with_option(C4Options, window_seq_len=2048))
        if str(short) in p
    ]
    assert found == [
        f"standard model {short}: its maximum positions (512) are shorter than C4's window line's T = 2048; lower "
        "window_seq_len in the plan file, or give the role another model"
    ]
    assert not [p for p in role_problems(replace(QUICK, roles=roles)) if str(short) in p]  # no line: nothing to hold


def test_a_tokenizer_that_splits_a_word_the_claims_put_at_position_0_is_refused_before_any_work(
    tmp_path: Path, zoo_model, edited_checkpoint: Callable[..., Path]
) -> None:
    """smollm2-135m's tokenizer without the merges that make "the" and "that": C3 patches from "the" and C6 puts
    both at position 0 in the standard model, so `paper` refuses in one line naming both, nothing written; the
    built-in models keep every word whole (the `paper` fixture runs them)."""
    for name in ("gemma3-270m", "qwen2.5-coder-0.5b"):
        zoo_model(name)
    split = edited_checkpoint("split", unmerged=("the", "that"))
    out = tmp_path / "paper"
    proc = run_main("paper", "--quick", "--models", f"standard={split}", "--out", str(out))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"model {split}: its tokenizer splits 'the', 'that'" in lines[0] and "C6's first tokens" in lines[0]
    assert not out.exists()


def _holding(corpus: str, tokenizer: PreTrainedTokenizerBase, content: int) -> dict[str, int]:
    """Per sample, the documents of its part that hold `content` tokens, each encoded here on its own."""
    documents = load_corpus(corpus)
    lengths = [len(tokenizer.encode(doc, add_special_tokens=False)) for doc in documents.documents]
    return {s: sum(lengths[k] >= content for k in part_documents(documents, PARTS[s], 0)) for s in PARTS}


def test_a_plan_whose_samples_hold_too_few_documents_is_refused_before_any_work(
    tmp_path: Path, zoo_model, smollm2: LoadedModel, gemma3: LoadedModel
) -> None:
    """The standard role at T = 512 and N = 30 (the bos role follows its sizes): the parts of A and B hold fewer
    documents long enough (counted here from each model's tokens) than the sequences each draw
    takes, one window per document: one line per sample and draw, naming the corpus, the sample, the count, T, N
    and what to lower, nothing written. The selection sample's draws are at the plan's sink_seq_len (256), which its
    documents hold."""
    zoo_model("qwen2.5-coder-0.5b")
    plan = tmp_path / "plan.yaml"
    plan.write_text("roles:\n  standard: {seq_len: 512, num_seqs: 30}\n")
    # smollm2 puts no BOS at position 0, gemma3 (the bos role's model) does: windows of 511 content tokens
    holding = {
        "smollm2-135m": _holding("stdlib", smollm2.tokenizer, 512),
        "gemma3-270m": _holding("stdlib", gemma3.tokenizer, 511),
    }
    expected = [
        ("smollm2-135m", "A", 30, "the standard role's analyses"),
        ("smollm2-135m", "B", 30, "the standard role's analyses"),
        ("gemma3-270m", "A", 30, "the bos role's analyses"),
        ("gemma3-270m", "B", 30, "the bos role's analyses"),
    ]
    assert all(holding[model][sample] < takes for model, sample, takes, _ in expected)
    out = tmp_path / "paper"
    proc = run_main("paper", "--quick", "--plan", str(plan), "--out", str(out))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == len(expected), proc.stderr
    for line, (model, sample, takes, what) in zip(lines, expected, strict=True):
        assert line == (
            f"posleak: error: corpus 'stdlib', sample {sample}: only {holding[model][sample]} of its documents hold a "
            f"window of 512 tokens of {model} for {what}, which takes {takes} (one window per document); lower "
            f"the {'bos' if model == 'gemma3-270m' else 'standard'} role's num_seqs or seq_len in a plan file to "
            "fit, or use a larger corpus"
        )
    assert not out.exists()


@pytest.mark.slow
def test_every_plan_fits_its_corpora() -> None:
    """--quick and --full draw every sample they take from the built-in corpora (the check before any work finds
    no problem), and --full takes the most the corpora allow: one more sequence at T = 512 or 768 does not fit."""
    tokenizers = role_tokenizers(FULL)
    assert document_problems(QUICK, tokenizers) == [] and document_problems(FULL, tokenizers) == []
    (seq_len, num_seqs), (sliding_len, sliding_seqs) = FULL.size("standard"), FULL.size("sliding")
    more = replace(
        FULL, sizes={**FULL.sizes, "standard": (seq_len, num_seqs + 1), "sliding": (sliding_len, sliding_seqs + 1)}
    ).with_option(C4Options, window_num_seqs=FULL.option(C4Options).window_num_seqs + 1)
    refused = document_problems(more, tokenizers)
    assert any("'bible-web', sample A" in line and "512 tokens" in line for line in refused), refused
    assert any("'stdlib', sample A" in line and "768 tokens of gemma3-270m" in line for line in refused), refused
    # C4's window line reads bible-web whatever the plan's corpora: at T = 2048 the stdlib docstrings could not hold it
    window = "2048 tokens of gemma3-270m for C4's window line (sliding model), which takes 21"
    assert any("'bible-web', sample B" in line and window in line for line in refused), refused
    on_stdlib = document_problems(QUICK.with_option(C4Options, window_seq_len=2048, window_corpus="stdlib"), tokenizers)
    assert any(line.startswith("corpus 'stdlib', sample A: only 4 of its documents") for line in on_stdlib), on_stdlib
    assert _holding("bible-web", tokenizers["smollm2-135m"], 512)["A"] == FULL.size("standard")[1]
    assert _holding("stdlib", tokenizers["gemma3-270m"], 768)["A"] == FULL.size("sliding")[1]  # C3's, without a BOS


def test_a_sample_of_fewer_than_four_documents_is_refused_before_any_work(zoo_model) -> None:
    """A bootstrap over fewer than 4 documents collapses or barely moves (docs/method.md §6): a plan that draws 3 per
    sample for a role is refused, one line naming the role, its size and the minimum (the bos role, which follows the
    standard role's size, too); 4 pass."""
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"):
        zoo_model(name)
    few = role_problems(replace(QUICK, sizes={**QUICK.sizes, "standard": (256, 3)}))
    assert [p for p in few if "too few for a bootstrap" in p] == [
        f"{role} (T = 256, N = 3): 3 documents per sample are too few for a bootstrap interval (docs/method.md §6); "
        "give the role num_seqs ≥ 4"
        for role in ("standard", "bos")
    ]
    assert not [p for p in role_problems(replace(QUICK, sizes={**QUICK.sizes, "standard": (256, 4)})) if "too few" in p]


PERFORMANCE = ROOT / "docs" / "performance.md"


def test_the_plan_s_counts_follow_its_sizes() -> None:
    """The analyses and lab models that docs/performance.md's current figures and bench_scale.py state, counted
    from the plan, against a count of the reproduction's runs by hand: per sample the standard model, it under each
    NTK factor, the large-base and sliding models, the BOS baseline and its 3 replacements, 2 nulls of each of the 3
    judged models (on sample A only where the plan runs no nulls on B), C4's window line's sliding and standard
    models where the plan measures it, and per C3 unit (3) 2 questions × (the sink heads + each control draw), plus
    4 reported runs where the plan has them; then each unit's selection baseline. Lab: 2 trained ways per seed, 3
    where the plan trains the large base."""

    def by_hand(plan: Plan) -> int:
        c3, c4 = plan.option(C3Options), plan.option(C4Options)
        per_unit = 2 * (1 + c3.control_draws) + (4 if c3.reported else 0)
        nulls = 3 * 2 * (2 if plan.option(C1Options).nulls_both_samples else 1)
        window = 0 if c4.window_seq_len is None else 2
        return 2 * (1 + len(c4.ntk_factors) + 2 + 1 + 3 + window + 3 * per_unit) + nulls + 3

    other = (
        replace(QUICK, lab=replace(QUICK.lab, seeds=(0, 1)))
        .with_option(C4Options, ntk_factors=(2.0, 4.0, 16.0), lab_large_base=True, window_seq_len=2048)
        .with_option(C3Options, control_draws=3, reported=True)
        .with_option(C1Options, nulls_both_samples=True)
    )
    assert (analysis_count(QUICK), lab_model_count(QUICK)) == (51, 10)
    assert (analysis_count(other), lab_model_count(other)) == (by_hand(other), 6) == (111, 6)
    assert analysis_count(QUICK) == by_hand(QUICK)
    with pytest.raises(ValueError, match="other BOS setting"):
        analysis_count(FULL)
    stated = re.search(r"runs \*\*(\d+) analyses\*\* and trains \*\*(\d+) lab models\*\*", PERFORMANCE.read_text())
    assert stated and tuple(map(int, stated.groups())) == (analysis_count(QUICK), lab_model_count(QUICK))
