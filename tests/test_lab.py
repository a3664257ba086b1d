"""`posleak lab` on real tiny lab models: the variants trained and measured at one budget, their table and report;
on tasks that need position, the variants over seeds, their intervals, ranks and outcomes, and bad input refused
before any work."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli import assert_error_lines, run_cli, run_main, strict_json_files
from transformers import AutoTokenizer

from posleak.lab.choices import TASK_EVAL, TASK_TRAIN, TaskLab
from posleak.lab.data import lab_sequences, prepare_data
from posleak.lab.plan import run_plan
from posleak.lab.tasks import generate
from posleak.lab.train_config import outcome
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, trial_folder
from posleak.lab.variants import LAB_COLUMNS, LabRun
from posleak.models.lab.model import load_lab_model

# --------------------------------------------------------------------------------------- lab, sweep

TINY_EVAL = EvalConfig(probe_seqs=8, analyze_seqs=4, batch_size=4, bootstrap=0)


def test_lab_writes_its_table_and_report(tmp_path: Path) -> None:
    train_config = TrainConfig(steps=6, seq_len=32, batch_size=4, warmup_steps=2, eval_every=3, checkpoint_every=6)
    config = LabRun(train=train_config, eval=TINY_EVAL, variants=("rope", "rope-ntk", "sigmoid"))
    table = run_plan(config.plan(), tmp_path, progress=False).table
    assert list(table.columns[: len(LAB_COLUMNS)]) == list(LAB_COLUMNS)
    assert table["variant"].tolist() == ["rope", "rope-ntk", "sigmoid"]
    assert (tmp_path / "lab.parquet").is_file() and (tmp_path / "report.html").is_file()
    # rope-ntk reuses the rope training: one model folder for the two.
    assert len(list((tmp_path / "models").glob("*/train.json"))) == 2
    sigmoid = table.set_index("variant").loc["sigmoid"]
    assert sigmoid["mask_all"] == 0.0
    assert table["ppl_1x"].between(1.0, 600.0).all()


@pytest.mark.slow
def test_cli_lab_trains_and_measures_each_variant(tmp_path: Path) -> None:
    """`posleak lab` as a user runs it: one row per variant, the window variant at W = T/4, the perplexity at the
    training length equal to exp(mean cross-entropy) of the saved model over every validation window."""
    argv = ["--steps", "4", "--seq-len", "16", "--batch-size", "4", "--eval-every", "2", "--warmup-steps", "1"]
    proc = run_cli("lab", "--variants", "rope,window", *argv, "--jobs", "1", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_parquet(tmp_path / "lab.parquet")
    assert table["variant"].tolist() == ["rope", "window"] and table["attention"].tolist() == ["causal", "window:4"]
    assert (tmp_path / "report.html").is_file() and "window" in proc.stdout

    config = TrainConfig(steps=4, seq_len=16, batch_size=4, eval_every=2, warmup_steps=1)
    run = LabRun(train=config, variants=("rope", "window"))
    for variant, row in zip(run.variants, table.itertuples(index=False), strict=True):
        trial = run.trial(variant)
        folder = tmp_path / "models" / trial.train_key
        model = load_lab_model(str(folder))
        data = prepare_data(config, AutoTokenizer.from_pretrained(folder))
        ids = lab_sequences(data, "val", 16, None, bos=True, seed=0).ids
        with torch.no_grad():
            logits = model(ids).logits[:, :-1].double()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        assert row.ppl_1x == pytest.approx(math.exp(float(loss)), rel=1e-5), variant
        per_layer = pd.read_parquet(trial_folder(tmp_path, trial) / "per_layer.parquet")
        assert row.mask_all == pytest.approx(per_layer["mask_all"].mean()) and row.mask_all > 0


# ------------------------------------------------------------------------------ tasks that need position (issue 12)

T_QUANTILE_2 = 4.302652729911275  # Student's t, 97.5th percentile, 2 degrees of freedom (tables)


@pytest.mark.slow
def test_cli_lab_task_trains_three_variants_over_three_seeds(tmp_path: Path) -> None:
    """`posleak lab --task index` with 3 variants × 3 seeds at tiny size: one row per trial; each trial's accuracy
    at 1× recomputed from its saved model on the rows it was scored on (fresh rows of the evaluation stream) by
    greedy decoding; the per-variant intervals the t-interval over seeds; ranks and `beats` what the intervals
    say; the analytic chance level of the index task."""
    argv = ["--steps", "30", "--seq-len", "16", "--batch-size", "8", "--eval-every", "10", "--warmup-steps", "3"]
    proc = run_cli(
        "lab", "--task", "index", "--variants", "rope,nope,learned", *argv, "--jobs", "2", "--out", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_parquet(tmp_path / "lab.parquet")
    assert sorted(table["variant"]) == sorted(f"index/{v}" for v in ("rope", "nope", "learned") for _ in range(3))
    assert sorted(table["seed"]) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert table[["mask_all", "resid_all", "probe_r2_best", "train_s"]].notna().all().all()
    assert (table["chance_1x"] == 1 / 7).all() and (table["chance_4x"] == 1 / 31).all()  # n = ⌊(L − 1)/2⌋

    config = TaskLab(
        tasks=("index",),
        variants=("rope", "nope", "learned"),
        train=replace(TASK_TRAIN, steps=30, seq_len=16, batch_size=8, eval_every=10, warmup_steps=3),
    )
    trial = config.labs()[1].trial("nope")  # seed 1
    row = table[table["trial"] == trial.key].iloc[0]
    model = load_lab_model(str(tmp_path / "models" / trial.train_key))
    rows = generate("index", TASK_EVAL.task_seqs, 16, (1, 2, 1))
    assert rows.answers.sum(dim=1).eq(2).all()  # two queries a row at 16 tokens
    with torch.no_grad():
        right = model(input_ids=rows.ids).logits[:, :-1].argmax(-1) == rows.ids[:, 1:]
    every = torch.stack([right[n][rows.answers[n]].all() for n in range(len(right))])
    assert row["acc_1x"] == pytest.approx(float(every.double().mean()), abs=1e-12)

    variants = pd.read_parquet(tmp_path / "variants.parquet").set_index("variant")
    for variant, group in table.groupby(table["variant"].str.split("/").str[1]):
        for measure in ("acc_1x", "mask_all", "resid_all", "probe_r2_best"):
            values = group[measure].to_numpy()
            half = T_QUANTILE_2 * values.std(ddof=1) / np.sqrt(3)
            lo, hi = values.mean() - half, values.mean() + half
            if measure == "acc_1x":
                lo, hi = max(lo, 0.0), min(hi, 1.0)
            got = variants.loc[variant, [measure, f"{measure}_lo", f"{measure}_hi"]].to_numpy(dtype=float)
            np.testing.assert_allclose(got, [values.mean(), lo, hi], rtol=1e-9, atol=1e-12)
    choices = pd.read_parquet(tmp_path / "choices.parquet")
    assert len(choices) == 9 and set(choices["multiple"]) == {1, 2, 4}
    for _, cell in choices.groupby("multiple"):
        by_name = cell.set_index("variant")
        for name, r in by_name.iterrows():
            assert r["rank"] == 1 + int((by_name["accuracy"] > r["accuracy"]).sum())
            beaten = sorted(o for o, s in by_name.iterrows() if o != name and r["accuracy_lo"] > s["accuracy_hi"])
            assert sorted(filter(None, r["beats"].split(","))) == beaten
    assert set(pd.read_parquet(tmp_path / "components.parquet")["component"]) == {
        "mask_all",
        "resid_all",
        "probe_r2_best",
    }
    assert "Architecture choices per task" in (tmp_path / "report.html").read_text()


def test_cli_lab_task_bad_input_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_main("lab", "--task", "nosuch", "--seeds", "0,x", "--variants", "rope,foo", "--out", str(out))
    assert_error_lines(proc, "unknown task nosuch", "bad --seeds '0,x'", "unknown lab variants ['foo']")
    proc = run_main("lab", "--tasks", "index,copy", "--seq-len", "300", "--out", str(out))
    assert_error_lines(proc, "task index takes rows of 9 to 992 tokens")
    proc = run_main("lab", "--task", "copy", "--tasks", "all", "--out", str(out))
    assert_error_lines(proc, "--task and --tasks name the same thing")
    assert not out.exists()


def test_a_rerun_reads_a_missing_measure_back_as_nan_from_strict_json(tmp_path: Path) -> None:
    """The copy task has no chance level (NaN): its trial's complete.json holds null there (strict JSON, which the
    standard library's bare NaN is not), and a rerun, which reads every finished trial's row back from that file,
    gives the table of the first run, NaN and float dtype included."""
    argv = ["lab", "--task", "copy", "--variants", "rope", "--seeds", "0", "--steps", "5", "--seq-len", "16",
            "--batch-size", "4", "--eval-every", "5", "--warmup-steps", "1", "--out", str(tmp_path)]  # fmt: skip
    assert run_main(*argv).returncode == 0
    first = pd.read_parquet(tmp_path / "lab.parquet")
    (marker,) = tmp_path.glob("trials/*/complete.json")
    assert strict_json_files(marker.parent)[marker]["row"]["chance_1x"] is None
    assert run_main(*argv).returncode == 0
    again = pd.read_parquet(tmp_path / "lab.parquet")
    assert first["chance_1x"].isna().all() and first["chance_1x"].dtype == np.float64
    pd.testing.assert_frame_equal(again, first)


def test_a_variant_is_unable_to_learn_only_when_its_seeds_stopped_on_a_plateau() -> None:
    assert outcome(["target"] * 3) == ("target 3", "learned")
    assert outcome(["plateau"] * 3) == ("plateau 3", "unable to learn")
    assert outcome(["plateau", "cap", "plateau"]) == ("plateau 2, cap 1", "not learned within the cap")
    assert outcome(["cap"] * 2) == ("cap 2", "not learned within the cap")
    assert outcome(["target", "plateau", "cap"]) == ("target 1, plateau 1, cap 1", "learned by 1 of 3 seeds")


def test_stopping_options_are_refused_in_one_line_each_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_main("lab", "--task", "copy", "--target", "1.5", "--patience", "0", "--out", str(out))
    assert_error_lines(proc, "target 1.5 must be an exact-match share in (0, 1]", "patience must be at least 1")
    proc = run_main("lab", "--variants", "rope", "--target", "0.9", "--out", str(out))
    assert_error_lines(proc, "--target and --patience stop a task run on its exact match")
    assert not out.exists()
