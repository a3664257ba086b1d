"""`posleak paper --quick` end to end on the built-in models at test sizes (a plan file): one verdict per claim,
the numbers behind it, the tables the claims name, complete run folders, samples that share no document, a report
that renders in a real browser, and a rerun that resumes every finished run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest
from browser import check_in_chromium, needs_chromium, section_tables, table_layout
from cli import file_stamps, run_cli, strict_json_files
from constructed import CLAIMS, VERDICTS

from posleak.data.batches import part_documents
from posleak.data.corpus import load_corpus
from posleak.experiments.evidence import layer_mean
from posleak.experiments.paper import QUICK, paper_plan, reproduce
from posleak.experiments.paper.claim import ClaimModule
from posleak.experiments.paper.claims.c1.options import C1Options
from posleak.experiments.paper.claims.c3.options import C3Options
from posleak.experiments.paper.claims.c4.options import C4Options
from posleak.experiments.paper.claims.c5.claim import DECIDING, KEY_PARTS, removed_name
from posleak.experiments.paper.claims.c6.probe import IDENTITY_COLUMNS
from posleak.experiments.paper.claims.registry import CLAIMS as REGISTERED
from posleak.experiments.paper.plan import ROLES, SAMPLES, Plan
from posleak.experiments.paper.reproduction import PARTS, SELECTION, SampleRuns, selection_seqs
from posleak.experiments.paper.requests import Request
from posleak.experiments.paper.verdict import SAYS, Judgement, evidence_row, fact_row, judge
from posleak.models.load import LoadedModel
from posleak.pipeline import AnalysisResult

# The reproduction end to end at test sizes: `--quick`'s roles, runs, claims and tables, with T, N, the bootstrap and
# the lab made small through a plan file (the --plan a user has), so that the suite proves the mechanics in minutes.
# The verdicts a reader sees come from a real `make run` (`posleak paper --quick`, its time on a quiet 2-core
# Intel Xeon, docs/performance.md), rendered into docs/results.md and the README, which
# tests/test_paper_render.py checks against the claims.json they name.
TEST_PLAN = """\
roles:
  standard: {seq_len: 128, num_seqs: 4}
  large-base: {seq_len: 128, num_seqs: 4}
  sliding: {seq_len: 576, num_seqs: 4}
base: {bootstrap: 50, fingerprint_seqs: 4, lab_steps: 40, lab_seq_len: 32, lab_analyze_seqs: 8, c3_reported: true,
  sink_seq_len: 256, window_seq_len: 1024, window_num_seqs: 4}
"""
# sink_seq_len as in --quick: at T = 128 every built-in has more sink heads than non-sink heads to match them, so no
# unit could test C3 or C6; at 256 qwen2.5-coder-0.5b can (150 sink heads, 172 others outside its last layer).
# C4's window line measured as --full does, on bible-web, at T = 1024 (2W: reported, deciding nothing) for time.
# 81 analyses (tables only, no per-run report), the lab and C6's probe: 5.5 minutes measured on a quiet 2-core
# Intel Xeon (2026-12-04), 9.1 in a full suite run beside other work; 14.3 on a 2-core AMD EPYC when each run
# still drew its own report. The budget leaves room for slower machines.
TEST_PLAN_BUDGET_S = 20 * 60


@pytest.fixture(scope="module")
def paper(tmp_path_factory: pytest.TempPathFactory, zoo_model) -> Path:
    for name in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"):
        zoo_model(name)  # fetched (idempotent) before the timed command
    folder = tmp_path_factory.mktemp("paper")
    (folder / "plan.yaml").write_text(TEST_PLAN)
    out = folder / "quick"
    proc = run_cli("paper", *_paper_args(out), timeout_s=TEST_PLAN_BUDGET_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder / "stdout.txt").write_text(proc.stdout)  # what the terminal showed, for the tests below
    return out


def _paper_args(out: Path) -> list[str]:
    """The command line of the `paper` fixture: --quick at the test sizes of the plan file beside OUT."""
    return ["--quick", "--plan", str(out.parent / "plan.yaml"), "--out", str(out)]


@pytest.mark.slow
def test_the_terminal_ends_with_each_verdict_and_the_rows_that_decided_it(paper: Path) -> None:
    """One line per claim, its verdict as claims.json has it, then one or two rows of its evidence, each quoting
    the value and interval of claims.json's row in every sample that has it; where no deciding row gave the verdict
    (every unit untestable; C3's closed system may still decide), one or two of the rows that say why; then, for
    each part the claim needs that cannot test (C4's window line, here below 4W), its first row."""
    claims = {c["claim"]: c for c in json.loads((paper / "claims.json").read_text())}
    lines = (paper.parent / "stdout.txt").read_text().splitlines()
    heads = [k for k, line in enumerate(lines) if not line.startswith(" ")]
    assert [lines[k].split()[0] for k in heads] == CLAIMS and heads[-1] < len(lines) - 1
    for k, end in zip(heads, [*heads[1:], len(lines)], strict=True):
        claim = claims[lines[k].split()[0]]
        assert lines[k].startswith(f"{claim['claim']} {claim['verdict']}: ")
        needed = [
            f"    {name} (needed): {part['evidence'][0]['evidence']}"
            for name, part in claim["once"].items()
            if part["required"] and part["verdict"] == "not testable"
        ]
        assert lines[end - len(needed) : end] == needed and (claim["claim"] == "C4") == bool(needed)
        end -= len(needed)
        assert 1 <= end - k - 1 <= 2
        for line in lines[k + 1 : end]:
            if line.startswith("    nothing decides: "):
                name = line.removeprefix("    nothing decides: ")
                rows, verdict = claim["samples"]["A"]["evidence"], claim["samples"]["A"]["verdict"]
                assert "untestable" in name and not any(r["deciding"] and r["says"] == SAYS[verdict] for r in rows)
                assert any(r["evidence"] == name and not r["deciding"] for r in rows)
                continue
            name = line.strip().split(": A ")[0]
            row = next(r for r in claim["samples"]["A"]["evidence"] if r["evidence"] == name)
            interval = "" if row["lo"] is None else f" ({row['lo']:.3g} to {row['hi']:.3g})"
            assert f"A {row['value']:.4g}" in line and interval in line and row["threshold"] in line, line


@pytest.mark.slow
def test_every_json_the_reproduction_writes_is_strict(paper: Path) -> None:
    """claims.json (whose exact rows have no interval: null), the manifests of the reproduction and of every run,
    the lab's trial markers and models: no bare NaN or Infinity anywhere."""
    files = strict_json_files(paper)
    assert paper / "claims.json" in files and len(files) > 2 * 13
    exact = [r for c in files[paper / "claims.json"] for s in c["samples"].values() for r in s["evidence"]]
    assert any(r["lo"] is None and r["hi"] is None for r in exact)  # the closed-system rows


@pytest.mark.slow
def test_claims_json_has_a_verdict_and_the_evidence_of_both_samples(paper: Path) -> None:
    claims = json.loads((paper / "claims.json").read_text())
    assert [c["claim"] for c in claims] == CLAIMS
    for claim in claims:
        assert claim["verdict"] in VERDICTS and claim["criterion"] and claim["family_wise"].startswith("Holm")
        assert set(claim["samples"]) == {"A", "B"}
        verdicts = [sample["verdict"] for sample in claim["samples"].values()]
        replicated = verdicts[0] if verdicts[0] == verdicts[1] else "inconclusive"
        # a part judged once (C4's lab, its window line) joins where it can test: consistent only where all are, not
        # where any is not; one the claim needs (the window line) that cannot test leaves it inconclusive at best
        once = claim["once"].values()
        parts = [replicated]
        parts += ["inconclusive" if o["verdict"] == "not testable" else o["verdict"] for o in once if o["required"]]
        parts += [o["verdict"] for o in once if not o["required"] and o["verdict"] != "not testable"]
        joined = (
            "consistent"
            if set(parts) == {"consistent"}
            else "not consistent"
            if "not consistent" in parts
            else "inconclusive"
        )
        assert claim["verdict"] == joined
        assert set(claim["once"]) == ({"lab", "window"} if claim["claim"] == "C4" else set())
        for sample in claim["samples"].values():
            assert sample["evidence"] and all(
                row["says"] in {"supports", "contradicts", "unclear"} for row in sample["evidence"]
            )
    c5 = next(c for c in claims if c["claim"] == "C5")
    rows = c5["samples"]["A"]["evidence"]
    deciding = [row["evidence"] for row in rows if row["deciding"]]
    assert deciding == [removed_name(DECIDING)]  # the one replacement that decides
    assert len(rows) == 3 * 2 * len(KEY_PARTS)  # per replacement: the whole's band row, two parts', three changes
    numbers = c5["numbers"]["A"]["replacements"]
    assert set(numbers) == {"mean", "random", "zero"} and set(numbers["mean"]) == set(KEY_PARTS)
    _effects_are_pooled_from_both_samples(paper, claims)


def _effects_are_pooled_from_both_samples(paper: Path, claims: list[dict[str, Any]]) -> None:
    """Every deciding row with an interval in both samples is pooled, its value between A's and B's, its
    documents those its runs drew (C2's row of the standard model: its baseline's manifests); an inconclusive
    claim projects each row a sample left unclear, a decided one none (posleak.experiments.paper.effects)."""
    for claim in claims:
        rows = {s: {r["evidence"]: r for r in sample["evidence"]} for s, sample in claim["samples"].items()}
        both = {n: (r, rows["B"][n]) for n, r in rows["A"].items() if r["deciding"] and n in rows["B"]}
        intervals = [n for n, (a, b) in both.items() if a["lo"] is not None and b["lo"] is not None]
        assert [e["evidence"] for e in claim["pooled"]] == intervals, claim["claim"]
        for e in claim["pooled"]:
            a, b = rows["A"][e["evidence"]]["value"], rows["B"][e["evidence"]]["value"]
            assert min(a, b) - 1e-9 <= e["value"] <= max(a, b) + 1e-9 and e["lo"] <= e["hi"]
            assert e["samples"] == {s: rows[s][e["evidence"]]["says"] for s in "AB"}
        unclear = [n for n, (a, b) in both.items() if "unclear" in {a["says"], b["says"]}]
        projected = [e["evidence"] for e in claim["projection"]]
        assert projected == (unclear if claim["verdict"] == "inconclusive" else []), claim["claim"]
    c2 = next(c for c in claims if c["claim"] == "C2")
    for sample in "AB":
        titles = json.loads((paper / "runs" / f"smollm2-135m-{sample}" / "manifest.json").read_text())["data"]
        [e] = [e for e in c2["pooled"] if e["evidence"] == "smollm2-135m: mask_early"]
        assert e["documents"][sample] == len(set(titles["documents"])) >= 2


@pytest.mark.slow
def test_position0_and_sink_ablation_tables(paper: Path) -> None:
    for sample in ("A", "B"):
        position0 = pd.read_parquet(paper / f"position0_{sample}.parquet")
        gemma = position0[position0["model"] == "gemma3-270m"]
        assert (gemma["fingerprint_cos_bos"] > 1 - 1e-6).all()  # constant with the auto-prepended BOS
        assert (gemma["fingerprint_cos_nobos"] < 1 - 1e-3).any()
        identity = pd.read_parquet(paper / f"identity_{sample}.parquet")
        assert list(identity.columns) == ["model", "layer", *IDENTITY_COLUMNS]
        # C6's fingerprint models: those whose tokenizer does not prepend a BOS (gemma3-270m's does)
        assert set(identity["model"]) == {"smollm2-135m", "qwen2.5-coder-0.5b"}
        ablation = pd.read_parquet(paper / f"sink_ablation_{sample}.parquet")
        assert list(ablation.columns) == ["unit", "run", "head_count", "heads", "change_pct", "lo", "hi"]
        units = _c3_units(paper, sample)
        assert len(units) == 3  # each model in its own BOS setting (--quick; the full plan adds the other)
        for label, unit in units.items():
            assert set(unit["questions"]) == {"a", "b"}
            runs = ablation[ablation["unit"] == label].set_index("run")
            full = unit["bos"] == "auto"  # the role's own BOS setting: every run
            expected = [
                f"{question}-{heads}"
                for question in ("clock", "kv0")
                for heads in ("sinks", *(f"control{k}" for k in range(QUICK.option(C3Options).control_draws)))
            ]
            # the runs reported, not judged, in the model's own BOS setting (--quick leaves them out; the plan file
            # above asks for them, as the full plan does)
            expected += ["ablate-sinks", "ablate-sinks-mean", "ablate-control0", "patch-pos0"] if full else []
            # the heads come from the selection sample's baseline, not from the sample that judges them
            assert unit["selection"].endswith("-selection") and unit["baseline"].endswith(f"-{sample}")
            per_head = pd.read_parquet(paper / "runs" / unit["selection"] / "per_head.parquet")
            before_last = per_head[per_head["layer"] < per_head["layer"].max()]
            pool = int((before_last["sink_score"] <= 0.3).sum())  # the heads a control may take
            if not 0 < int((before_last["sink_score"] > 0.3).sum()) <= pool:  # no sink head, or no matched control
                assert runs.empty and unit["runs"] == {} and label in _c3_numbers(paper, sample)["untestable"]
                assert set(unit["questions"].values()) == {"untestable"}
                continue
            assert list(runs.index) == expected == list(unit["runs"])
            assert set(unit["questions"].values()) <= VERDICTS
            sinks = _heads(runs.loc["kv0-sinks", "heads"])
            assert sinks == _heads(runs.loc["clock-sinks", "heads"])
            assert len(sinks) == runs.loc["kv0-sinks", "head_count"] == unit["sink_heads"]
            assert sinks == {
                (layer, head)
                for layer, head, score in before_last[["layer", "head", "sink_score"]].itertuples(False)
                if score > 0.3
            }
            for k in range(QUICK.option(C3Options).control_draws):
                control = _heads(runs.loc[f"kv0-control{k}", "heads"])
                assert control == _heads(runs.loc[f"clock-control{k}", "heads"])  # one control set for both questions
                assert len(control) == len(sinks) and not control & sinks


def _c3_numbers(paper: Path, sample: str) -> dict[str, Any]:
    claims = json.loads((paper / "claims.json").read_text())
    return next(c for c in claims if c["claim"] == "C3")["numbers"][sample]


def _c3_units(paper: Path, sample: str) -> dict[str, dict]:
    return _c3_numbers(paper, sample)["units"]


def _heads(by_layer: str) -> set[tuple[int, int]]:
    """`L3: 0 7; L4: 2` (the report's form) → {(3, 0), (3, 7), (4, 2)}."""
    heads = set()
    for part in by_layer.split("; "):
        layer, listed = part.split(": ")
        heads |= {(int(layer.removeprefix("L")), int(head)) for head in listed.split()}
    return heads


@pytest.mark.slow
def test_every_intervention_comes_with_its_effect_on_the_loss(paper: Path) -> None:
    """behaviour_{A,B}.parquet: each intervention the reproduction runs against its baseline; the loss and accuracy
    over all queries equal the means of the two runs' own next-token scores (their tokens.parquet)."""
    for sample in ("A", "B"):
        pairs = {
            ("C4", "ntk:4"): ("smollm2-135m", "smollm2-135m-ntk4"),
            ("C4", "ntk:16"): ("smollm2-135m", "smollm2-135m-ntk16"),
            **{
                ("C5", f"replace-bos {k}"): ("gemma3-270m-bos", f"gemma3-270m-bos-{k}")
                for k in ("mean", "random", "zero")
            },
        }
        pairs = {key: (base + f"-{sample}", new + f"-{sample}") for key, (base, new) in pairs.items()}
        for label, unit in _c3_units(paper, sample).items():
            pairs |= {("C3", f"{label}: {name}"): (unit["baseline"], folder) for name, folder in unit["runs"].items()}
        table = pd.read_parquet(paper / f"behaviour_{sample}.parquet")
        assert set(zip(table["claim"], table["intervention"], strict=True)) == set(pairs)
        whole = table[table["bucket"] == "all"].set_index(["claim", "intervention", "measure"])
        for key, (base, new) in pairs.items():
            for run, column in ((base, "baseline"), (new, "intervened")):
                tokens = pd.read_parquet(paper / "runs" / run / "tokens.parquet")
                assert whole.loc[(*key, "loss"), column] == pytest.approx(tokens["nll"].mean(), rel=1e-9)
                assert whole.loc[(*key, "accuracy"), column] == pytest.approx(tokens["correct"].mean(), rel=1e-9)


@pytest.mark.slow
def test_every_run_folder_is_complete(paper: Path) -> None:
    manifest = json.loads((paper / "manifest.json").read_text())
    folders = sorted((paper / "runs").iterdir())
    # per sample: smollm2, 2 NTK factors, qwen, gemma, Gemma with BOS and 3 replacements (9); on sample A, the
    # shuffle and shift nulls of smollm2, qwen and gemma (6); C3: each model in its own BOS setting, 8 runs (clock
    # removal and K/V patch of the sinks and of 1 control each, value zeroed and mean, 1 control, h_0 patched);
    # --quick leaves out the other BOS setting; a unit that cannot test C3 runs none. Once: C3's baseline of each
    # model on the selection sample (3). C4's window line (the test plan measures it) in OUT/window: the sliding
    # model and the standard one beyond its window, on each sample of bible-web at the line's T, without scores.
    c3 = _c3_numbers(paper, "A")
    testable = 3 - len(c3["untestable"])
    assert testable >= 1  # the test plan's sink_seq_len leaves one (qwen2.5-coder-0.5b)
    assert QUICK.option(C3Options).control_draws == 1 and not QUICK.option(C1Options).nulls_both_samples
    assert len(folders) == 2 * (9 + testable * 8) + 6 + 3  # the nulls on sample A only
    window = sorted((paper / "window").iterdir())
    assert [f.name for f in window] == [
        "gemma3-270m-A",
        "gemma3-270m-B",
        "smollm2-135m-beyond512-A",
        "smollm2-135m-beyond512-B",
    ]
    for folder in window:
        run = json.loads((folder / "manifest.json").read_text())
        assert run["status"] == "complete" and not (folder / "tokens.parquet").exists(), folder
        assert (run["data"]["source_name"], run["data"]["seq_len"], run["measurement"]["beyond"]) == (
            "bible-web",
            1024,
            512,
        )
    c4 = next(c for c in json.loads((paper / "claims.json").read_text()) if c["claim"] == "C4")
    line = c4["once"]["window"]
    assert line["required"] and line["verdict"] == "not testable"  # T = 1024 < 4W: reported, deciding nothing
    assert {r["evidence"].split(": ")[0] for r in line["evidence"]} == {"A", "B"}
    assert all(not r["deciding"] and "T below 4W: reported" in r["evidence"] for r in line["evidence"][:1])
    assert c4["numbers"]["window"]["A"]["runs"] == ["window/gemma3-270m-A", "window/smollm2-135m-beyond512-A"]
    assert len([folder for folder in folders if folder.name.endswith("-selection")]) == 3
    testing = {u["role"] for label, u in c3["units"].items() if label not in c3["untestable"]}
    compared_roles = {"standard", "bos"} | testing
    uncompared = {f"{ROLES[role].folder}-{s}" for role in ROLES if role not in compared_roles for s in SAMPLES}
    assert uncompared  # the test plan's gemma3-270m (T > window): its unit cannot test C3
    assert set(manifest["runs"].values()) <= {str(folder) for folder in folders}
    for folder in folders:
        assert json.loads((folder / "manifest.json").read_text())["status"] == "complete", folder
        # the tables the claims read, and no per-run report: the reproduction draws its own
        assert (folder / "per_layer.parquet").is_file() and not (folder / "report.html").exists(), folder
        # next-token scores wherever an intervention is compared with the run, nowhere else: not on a null, the
        # selection sample or beyond the window, nor on the baseline of a role no intervention is compared with (C4
        # compares with the standard model, C5 with the BOS one, C3 with each model whose unit can test it)
        compared = not re.search(r"-(shift|shuffle)-|-selection$|-beyond\d+-", folder.name)
        assert (folder / "tokens.parquet").is_file() == (compared and folder.name not in uncompared), folder
    trials = sorted((paper / "lab" / "trials").iterdir())
    # C4's lab: rope and window trained, and the rope models under NTK scaling at inference (--quick trains no
    # large-base model: its line is reported, not judged)
    assert not QUICK.option(C4Options).lab_large_base
    assert len(trials) == 3 * len(QUICK.lab.seeds) and all((trial / "complete.json").is_file() for trial in trials)


def test_samples_share_no_document_and_claims_json_names_them(paper: Path) -> None:
    """claims.json names, per sample (A, B and C3's selection sample), the documents its runs' windows were cut from,
    every model's: the three share none, and each lies in its sample's part of the deal. Every run folder's rows
    (the documents its manifest names for them; tests/test_data.py checks those against the tokens) are windows of
    distinct documents of its own sample, so its bootstrap resampled as many documents as it has rows; a selection
    run has half the rows of its model's run on A."""
    claims = json.loads((paper / "claims.json").read_text())
    corpus = claims[0]["corpora"]["stdlib"]
    named = {sample: set(titles) for sample, titles in corpus["documents"].items()}
    assert list(named) == ["A", "B", SELECTION] and all(c["corpora"] == claims[0]["corpora"] for c in claims)
    assert sum(map(len, named.values())) == len(set.union(*named.values()))
    stdlib = load_corpus("stdlib")
    for sample, titles in named.items():
        assert titles <= {stdlib.titles[k] for k in part_documents(stdlib, PARTS[sample], seed=0)}, sample
    used: dict[str, set[str]] = {sample: set() for sample in named}
    rows_of: dict[str, int] = {}
    for folder in (paper / "runs").iterdir():
        manifest = json.loads((folder / "manifest.json").read_text())
        sample = folder.name.rsplit("-", 1)[1]
        rows = manifest["data"]["documents"]
        assert len(rows) == manifest["data"]["num_seqs"] == len(set(rows)) and set(rows) <= named[sample], folder.name
        used[sample] |= set(rows)
        rows_of[folder.name] = len(rows)
        bootstrap = manifest["measurement"]["bootstrap"]
        assert bootstrap["unit"] == "document" and bootstrap["units"] == len(rows), folder.name
    # C6's probes draw from A and B without a run folder (its heads come from C3's selection runs)
    assert all(used[s] <= named[s] for s in named)
    selection = [name.removesuffix("-selection") for name in rows_of if name.endswith("-selection")]
    assert selection and all(rows_of[f"{n}-selection"] == selection_seqs(rows_of[f"{n}-A"]) for n in selection)


@pytest.mark.slow
@needs_chromium
def test_paper_report_renders_in_chromium(paper: Path, tmp_path: Path) -> None:
    """A figure per claim at least, and every claim section shows its evidence of both samples as tables."""
    assert check_in_chromium(paper / "report.html", tmp_path) >= 7
    tables = section_tables(paper / "report.html", tmp_path)
    claims = {heading.split(":")[0]: count for heading, count in tables.items() if heading[:1] == "C"}
    assert sorted(claims) == CLAIMS and all(count >= 2 for count in claims.values()), tables
    wrapping = [table for table in table_layout(paper / "report.html", tmp_path) if table["lines"]]
    assert len(wrapping) == 2 and all(table["fits"] for table in wrapping), wrapping  # C3's two tables fit the page


@pytest.mark.slow
def test_rerun_resumes_from_finished_runs(paper: Path, smollm2: LoadedModel) -> None:
    """Every analysis and lab model is read back, none recomputed: no file under runs/ or lab/ is written again."""
    finished = file_stamps(paper / "runs"), file_stamps(paper / "lab")
    proc = run_cli("paper", *_paper_args(paper))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (file_stamps(paper / "runs"), file_stamps(paper / "lab")) == finished


# ---------------------------------------------------------------------------- a claim added in one line
# A claim is one package and one line in the registry (posleak.experiments.paper.claims.registry): here two toy
# claims, defined in the test, ask for the same analysis, the standard model on the shuffle null of sample A
# (--quick runs it there for C1 and C2, so the `paper` fixture's folder holds it), and run through `reproduce` on
# the test plan beside the registry's claims (whose requests decide which baselines keep their next-token scores, and
# so their fingerprints), in a copy of the fixture's folder: the analysis, which C1 and C2 ask for too, is read back
# once and handed to every claim that asked for it by its key.


class _ToyNull(ClaimModule):
    """A toy claim: the standard model's residual-stream magnitude on the shuffle null of sample A, above 0."""

    name = "T1"
    statement = "The standard model's residual-stream component survives shuffled tokens."
    criterion = "The mean over layers of resid_all on the shuffle null of sample A has a 95% interval above 0 nats."
    method = "A toy claim of the tests, reading one shared analysis."
    roles = ("standard",)
    handed: ClassVar[dict[str, list[AnalysisResult | None]]] = {}  # per claim name, the results `judge` was handed

    @classmethod
    def requests(cls, plan: Plan, sample: str) -> list[Request]:
        if sample != "A":
            return []
        role = plan.roles["standard"]
        return [Request(f"{role.key}-shuffle", "standard", f"{role.folder}-shuffle", null="shuffle")]

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        null = runs.get(f"{runs.roles['standard'].key}-shuffle")
        self.handed.setdefault(self.name, []).append(null)
        if null is None:  # sample B: the plan runs no null there
            return judge([fact_row("no null on this sample", 0, False, False, "a null", deciding=False)])
        return judge([evidence_row("resid_all, shuffle null", layer_mean(null, "resid_all"), 0.0, "above", "nats")])

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        return "A toy claim: the paper says nothing of it."

    def figures(self, runs: SampleRuns) -> list[Path]:
        return []


class _ToyTwin(_ToyNull):
    """The same request under another claim's name: merged with the first, the analysis runs once."""

    name = "T2"


@pytest.mark.slow
def test_a_claim_registered_in_one_line_runs_through_the_reproduction(paper: Path, tmp_path: Path) -> None:
    """Two toy claims asking for one analysis get the same result, read back from its folder (no file under runs/
    written again), and claims.json judges each on the value the folder's own per-layer table gives."""
    _ToyNull.handed.clear()
    out = tmp_path / "toy"
    shutil.copytree(paper, out)
    finished = file_stamps(out / "runs")
    plan, problems = paper_plan(QUICK, None, paper.parent / "plan.yaml")
    assert problems == []
    claims = reproduce(out, plan, progress=False, claims=(*REGISTERED, _ToyNull, _ToyTwin))
    assert file_stamps(out / "runs") == finished
    (first, none_first), (second, none_second) = _ToyNull.handed["T1"], _ToyNull.handed["T2"]
    assert first is second and none_first is None and none_second is None  # one result for both; none on B
    folder = out / "runs" / f"{plan.roles['standard'].folder}-shuffle-A"
    expected = pd.read_parquet(folder / "per_layer.parquet")["resid_all"].mean()
    written = {c["claim"]: c for c in json.loads((out / "claims.json").read_text())}
    assert [c.claim for c in claims] == list(written) == [*CLAIMS, "T1", "T2"]
    for name in ("T1", "T2"):
        (row_a,) = written[name]["samples"]["A"]["evidence"]
        assert row_a["value"] == pytest.approx(expected, rel=1e-12)
