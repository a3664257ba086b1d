"""The files of a lab training run: resumable checkpoints and the finished model.

`checkpoints/step-NNNNNN/` holds the model and the optimizer state in safetensors and the trainer state in
JSON; `checkpoints/latest` is a one-line pointer replaced atomically once a checkpoint is complete, so a
run killed at any moment resumes from the last complete checkpoint. The finished run's model, tokenizer and
metrics come first and `train.json` last: a folder with train.json is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import transformers
from safetensors.torch import load_file, load_model, save_file, save_model
from transformers import PreTrainedTokenizerFast

from posleak.errors import PosleakError
from posleak.lab.data import LabData
from posleak.models.lab.model import LabForCausalLM, quiet_transformers
from posleak.store import atomic_write
from posleak.store.jsonfile import dumps, nan_for_none, write_json


def check_identity(out: Path, saved: dict[str, Any], identity: dict[str, Any]) -> None:
    if {"spec": saved["spec"], "train": saved["train"]} != identity:
        raise PosleakError(
            f"'{out}' holds a different run (other lab or training options); choose another --out or remove it"
        )


def checkpoint_dir(out: Path) -> Path | None:
    pointer = out / "checkpoints" / "latest"
    return out / "checkpoints" / pointer.read_text().strip() if pointer.is_file() else None


def resume(
    out: Path,
    identity: dict[str, Any],
    model: LabForCausalLM,
    optimizer: torch.optim.AdamW,
    scaler: torch.amp.GradScaler,
) -> dict[str, Any]:
    folder = checkpoint_dir(out)
    if folder is None:
        return {"step": 0, "metrics": []}
    state = json.loads((folder / "trainer_state.json").read_text())
    check_identity(out, state, identity)
    load_model(model, str(folder / "model.safetensors"), device=str(next(model.parameters()).device))
    tensors = load_file(str(folder / "optimizer.safetensors"))
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = tensor
    optimizer.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})
    if state.get("scaler"):
        scaler.load_state_dict(state["scaler"])  # float16: the gradient scale it had reached
    # a step without an evaluation has val_loss NaN, written as null: NaN again, as in an uninterrupted run
    return {**state, "metrics": [nan_for_none(step) for step in state["metrics"]]}


def save_checkpoint(
    out: Path,
    identity: dict[str, Any],
    step: int,
    model: LabForCausalLM,
    optimizer: torch.optim.AdamW,
    metrics: list[dict[str, float]],
    scaler: torch.amp.GradScaler,
) -> None:
    """Write step-NNNNNN in a temporary folder, rename it, then move the `latest` pointer; drop older ones."""
    root = out / "checkpoints"
    name = f"step-{step:06d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    optim_state = optimizer.state_dict()
    tensors = {f"{index}.{key}": value for index, state in optim_state["state"].items() for key, value in state.items()}
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    trainer_state = {
        **identity,
        "step": step,
        "param_groups": optim_state["param_groups"],
        "metrics": metrics,
        "scaler": scaler.state_dict(),  # empty unless float16
    }
    (tmp / "trainer_state.json").write_text(dumps(trainer_state))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    atomic_write(root / "latest", lambda file: file.write(f"{name}\n".encode()))
    for old in root.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old)


def save_final(
    out: Path,
    identity: dict[str, Any],
    model: LabForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    metrics: pd.DataFrame,
    data: LabData | None,
    stopped: tuple[int, str],
) -> None:
    """Model, tokenizer and metrics first, `train.json` last: a folder with train.json is complete. `stopped`: the
    last step trained and why it stopped there (target, plateau, cap)."""
    tmp = out / ".final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_transformers():
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    metrics.to_parquet(tmp / "metrics.parquet", index=False)
    for path in tmp.iterdir():
        os.replace(path, out / path.name)
    tmp.rmdir()
    record = {
        **identity,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {"train": data.train.provenance(), "val": data.val.provenance()} if data is not None else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "final_train_loss": float(metrics["train_loss"].iloc[-1]),
        "final_val_loss": float(metrics["val_loss"].dropna().iloc[-1]),
        "stopped_step": stopped[0],
        "stop_reason": stopped[1],
    }
    write_json(out / "train.json", record)
