"""`posleak train` and the trainer (posleak.lab.trainer) on real tiny lab models: it learns, is deterministic,
trains in mixed precision, resumes exactly (also when interrupted off a checkpoint or while writing one), and
stops at its target, on a plateau or at its cap."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from cli import assert_error_lines, run_main
from optimizer_steps import optimizer_steps
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from posleak.cli import main
from posleak.errors import PosleakError
from posleak.lab import checkpoint as checkpoint_module
from posleak.lab.tasks import generate
from posleak.lab.trainer import TrainConfig, train
from posleak.models.lab.config import LabSpec
from posleak.models.lab.hf_config import LabConfig
from posleak.models.lab.model import LabForCausalLM, build_lab_model, load_lab_model, register_lab_model

VOCAB = 96

# ------------------------------------------------------------------------------------------ trainer

TINY_TRAIN = TrainConfig(steps=24, seq_len=32, batch_size=8, lr=3e-3, warmup_steps=4, eval_every=8, checkpoint_every=8)


def test_trainer_lowers_the_loss_and_saves_a_loadable_model(tmp_path: Path) -> None:
    result = train(LabSpec(size="tiny"), TINY_TRAIN, tmp_path, progress=False)
    metrics = result.metrics
    assert list(metrics.columns) == ["step", "train_loss", "val_loss", "val_acc", "tokens_per_s"]
    assert metrics["step"].tolist() == list(range(1, 25))
    assert metrics["val_acc"].isna().all()  # a corpus run has no exact match
    assert metrics["train_loss"].iloc[0] > math.log(512) - 0.1
    val = metrics["val_loss"].dropna()
    assert val.iloc[-1] < metrics["train_loss"].iloc[0] - 0.8
    assert pd.read_parquet(tmp_path / "metrics.parquet").equals(metrics)
    register_lab_model()
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(model, LabForCausalLM)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.bos_token_id == model.config.bos_token_id == 0
    record = json.loads((tmp_path / "train.json").read_text())
    assert (record["train"]["steps"], record["stopped_step"], record["stop_reason"]) == (24, 24, "cap")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_same_seed_same_weights_and_resume_equals_uninterrupted(tmp_path: Path) -> None:
    config = TrainConfig(steps=12, seq_len=32, batch_size=4, warmup_steps=2, eval_every=6, checkpoint_every=6)
    spec = LabSpec(size="tiny", pe="alibi", norm="sink")
    first = train(spec, config, tmp_path / "a", progress=False)
    train(spec, config, tmp_path / "b", progress=False)
    resumed_part = train(spec, config, tmp_path / "c", until=5, progress=False)
    assert not resumed_part.finished and not (tmp_path / "c" / "model.safetensors").exists()
    resumed = train(spec, config, tmp_path / "c", progress=False)
    a, b, c = (_weights(tmp_path / name) for name in "abc")
    assert a.keys() == b.keys() == c.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"same seed, different {name}"
        assert torch.equal(a[name], c[name]), f"resumed run differs in {name}"
    assert resumed.metrics["train_loss"].tolist() == first.metrics["train_loss"].tolist()
    other = train(spec, TrainConfig(**{**config.to_dict(), "seed": 1}), tmp_path / "d", progress=False)
    embedding = "model.embed_tokens.weight"
    assert other.finished and not torch.equal(_weights(tmp_path / "d")[embedding], a[embedding])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_training_runs_in_its_dtype_resumes_exactly_and_is_its_own_run(
    tmp_path: Path, dtype: str
) -> None:
    """--dtype bfloat16|float16 trains in mixed precision: the forward under the run's precision computes in that
    dtype while the weights stay float32; its losses differ from float32's by about the dtype's roundoff (they
    would be equal if autocast had not run); a run interrupted off a checkpoint (float16: with its gradient
    scale) ends with the same weights; the dtype is part of the run's identity, float32 and the device are not
    (so the trial keys of earlier float32 runs stay)."""
    spec = LabSpec(size="tiny", pe="rope")
    base = TrainConfig(steps=8, seq_len=16, batch_size=4, warmup_steps=2, eval_every=4, checkpoint_every=3)
    mixed = replace(base, dtype=dtype)
    model = build_lab_model(LabConfig.from_spec(spec, VOCAB, 64, 0, 1), seed=0)
    with mixed.precision(torch.device("cpu")):
        logits = model(input_ids=torch.randint(VOCAB, (2, 16))).logits
    assert logits.dtype == getattr(torch, dtype) and model.lm_head.weight.dtype == torch.float32

    plain = train(spec, base, tmp_path / "float32", progress=False)
    whole = train(spec, mixed, tmp_path / "whole", progress=False)
    train(spec, mixed, tmp_path / "resumed", until=4, progress=False)
    resumed = train(spec, mixed, tmp_path / "resumed", progress=False)
    gap = (whole.metrics["train_loss"] - plain.metrics["train_loss"]).abs()
    roundoff = {"bfloat16": 2.0**-8, "float16": 2.0**-11}[dtype]
    assert 0 < gap.max() < 64 * roundoff * plain.metrics["train_loss"].max()
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert resumed.metrics["train_loss"].tolist() == whole.metrics["train_loss"].tolist()

    assert json.loads((tmp_path / "whole" / "train.json").read_text())["train"]["dtype"] == dtype
    assert "dtype" not in base.to_dict() and "device" not in base.to_dict()
    assert replace(base, device="cpu").to_dict() == base.to_dict()
    with pytest.raises(PosleakError, match="different run"):
        train(spec, base, tmp_path / "whole", progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_train_and_lab_refuse_a_device_this_machine_lacks_before_any_work(tmp_path: Path) -> None:
    for command in ("train", "lab"):
        proc = run_main(command, "--device", "cuda", "--steps", "2", "--out", str(tmp_path / command))
        assert_error_lines(proc, "--device cuda: this machine has no CUDA device")
        assert not (tmp_path / command).exists()


def test_cli_train_and_a_finished_run_is_not_retrained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["train", "--pe", "nope", "--steps", "4", "--seq-len", "16", "--batch-size", "4", "--eval-every", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    stamp = (tmp_path / "train.json").stat().st_mtime_ns
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "train.json").stat().st_mtime_ns == stamp
    assert main([*argv, "--pe", "rope", "--out", str(tmp_path)]) == 2
    assert "different run" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ resuming where it is hard


RESUME_TRAIN = TrainConfig(steps=12, seq_len=32, batch_size=4, warmup_steps=2, eval_every=4, checkpoint_every=5)
RESUME_SPEC = LabSpec(size="tiny", pe="rope", norm="sink")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RESUME_SPEC trained for RESUME_TRAIN's 12 steps in one go."""
    out = tmp_path_factory.mktemp("uninterrupted")
    train(RESUME_SPEC, RESUME_TRAIN, out, progress=False)
    return out


@pytest.mark.parametrize("where", ["between checkpoints", "while writing a checkpoint"])
def test_training_interrupted_off_a_checkpoint_resumes_to_the_same_run(
    where: str, uninterrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints at steps 5 and 10 of 12. Interrupted before step 8 (steps 6 and 7 done and lost), or while the
    step-10 checkpoint is half written, the rerun goes back to step 5, takes the 7 steps left, and ends with the
    weights and losses of the uninterrupted run."""
    if where == "between checkpoints":
        with optimizer_steps(interrupt_before=8), pytest.raises(KeyboardInterrupt):
            train(RESUME_SPEC, RESUME_TRAIN, tmp_path, progress=False)
    else:
        saves = [0]
        real_save_file = checkpoint_module.save_file

        def save_file(tensors: dict[str, torch.Tensor], path: str) -> None:  # the optimizer state of a checkpoint
            saves[0] += 1
            if saves[0] == 2:
                raise KeyboardInterrupt
            real_save_file(tensors, path)

        monkeypatch.setattr(checkpoint_module, "save_file", save_file)
        with pytest.raises(KeyboardInterrupt):
            train(RESUME_SPEC, RESUME_TRAIN, tmp_path, progress=False)
        monkeypatch.undo()
        assert (tmp_path / "checkpoints" / ".step-000010.tmp" / "model.safetensors").is_file()  # half a checkpoint
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-000005"
    assert not (tmp_path / "train.json").exists()

    with optimizer_steps() as steps:
        resumed = train(RESUME_SPEC, RESUME_TRAIN, tmp_path, progress=False)
    assert steps[0] == 12 - 5
    reference, weights = _weights(uninterrupted), _weights(tmp_path)
    assert reference.keys() == weights.keys()
    for name in reference:
        assert torch.equal(weights[name], reference[name]), name
    expected = pd.read_parquet(uninterrupted / "metrics.parquet")
    assert resumed.metrics["step"].tolist() == list(range(1, 13))
    for column in ("train_loss", "val_loss"):
        np.testing.assert_array_equal(resumed.metrics[column], expected[column])


def _count_run(out: Path, **options: Any) -> TrainConfig:
    """A count task at 8 tokens (answer: the marker's index among 3 content tokens), which the tiny RoPE model
    learns in about 70 steps: evaluated every 10 steps on 64 validation rows."""
    values = dict(task="count", seq_len=8, steps=300, batch_size=32, lr=3e-3, warmup_steps=10, eval_every=10)
    return TrainConfig(**{**values, "eval_seqs": 64, "checkpoint_every": 1000, "device": "cpu", **options})


def test_training_stops_at_its_target_on_a_plateau_or_at_its_cap(tmp_path: Path) -> None:
    """Three real runs: one that learns stops at the first evaluation whose exact match (recomputed here from the
    saved model by argmax over the validation rows' answers) reaches the target, every earlier one below it, and a
    run interrupted midway and resumed stops at the same step with the same metrics; a learning rate of 1e-12 moves
    nothing, so with patience 3 it stops on a plateau at its 4th evaluation; a cap below the learning time stops
    there. train.json and the result name the step and the reason."""
    spec = LabSpec(size="tiny", pe="rope")
    config = _count_run(tmp_path, target=0.99, patience=6)
    learned = train(spec, config, tmp_path / "learned", progress=False)
    assert learned.finished and learned.stop_reason == "target" and learned.step < config.steps
    evals = learned.metrics.dropna(subset=["val_loss"])
    assert int(evals["step"].iloc[-1]) == learned.step
    assert (evals["val_acc"].iloc[:-1] < 0.99).all() and evals["val_acc"].iloc[-1] >= 0.99
    rows = generate("count", 64, 8, (0, 1))  # the validation stream (seed 0, TASK_VAL)
    model = load_lab_model(str(tmp_path / "learned"))
    with torch.no_grad():
        predicted = model(input_ids=rows.ids).logits[:, :-1].argmax(-1)
    exact = [bool((predicted[n][rows.answers[n]] == rows.ids[n, 1:][rows.answers[n]]).all()) for n in range(64)]
    assert evals["val_acc"].iloc[-1] == pytest.approx(np.mean(exact), abs=1e-12)
    record = json.loads((tmp_path / "learned" / "train.json").read_text())
    assert (record["stopped_step"], record["stop_reason"]) == (learned.step, "target")

    resumed_config = replace(config, checkpoint_every=10)
    part = train(spec, resumed_config, tmp_path / "resumed", until=learned.step - 20, progress=False)
    assert not part.finished and part.step == learned.step - 20
    resumed = train(spec, resumed_config, tmp_path / "resumed", progress=False)
    assert (resumed.step, resumed.stop_reason) == (learned.step, "target")
    pd.testing.assert_frame_equal(
        resumed.metrics.drop(columns="tokens_per_s"), learned.metrics.drop(columns="tokens_per_s")
    )

    still = train(spec, _count_run(tmp_path, lr=1e-12, target=0.99, patience=3), tmp_path / "still", progress=False)
    assert (still.step, still.stop_reason) == (40, "plateau")
    capped = train(spec, _count_run(tmp_path, steps=20, target=0.99), tmp_path / "capped", progress=False)
    assert (capped.step, capped.stop_reason) == (20, "cap")
    assert capped.metrics["val_acc"].dropna().max() < 0.99
