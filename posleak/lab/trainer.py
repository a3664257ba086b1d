"""Train a lab model: AdamW, warm-up then cosine decay, clipping, periodic evaluation, resumable checkpoints.

`train(spec, config, out)` writes into `out`:

- `model.safetensors`, `config.json` (a `LabConfig`), the tokenizer files, `metrics.parquet`
  (`step, train_loss, val_loss, tokens_per_s`; val_loss is NaN between evaluations) and, last,
  `train.json` (the options and provenance) — its presence means the run finished;
- `checkpoints/step-NNNNNN/` (model, optimizer state in safetensors, trainer state in JSON) and
  `checkpoints/latest`, a one-line pointer replaced atomically once a checkpoint is complete.

Determinism: the weights are initialised under `torch.manual_seed(seed)` and the batch of step s is
a pure function of (seed, s) — the rows of an epoch are a seeded permutation of every training
window — so nothing but the step number has to be restored. A resumed run therefore takes the same
batches and the same learning rates as an uninterrupted one and ends with the same weights.

Data: the corpus is split by document (a document goes to validation when the first byte of its
SHA-256 falls below val_fraction·256, so the split does not move when other documents change);
training windows are cut from the training documents joined by <eos> (`make_sequences` with
cross_documents), and position 0 of every row is <bos> when the spec says bos=True.

Threads: lab models are small, and torch's intra-op threads cost more in synchronisation than they
save: on this project's 2-core machine one thread trains the tiny preset about three times faster than
two. `train` therefore runs with `threads=1` unless told otherwise (None keeps torch's setting), and
parallelism comes from running trials side by side (`posleak.lab.sweep`).

Device and precision: `device` (auto: CUDA, else MPS, else the CPU) is where the model trains and is
evaluated; `dtype` bfloat16 or float16 trains in mixed precision (torch.autocast for the forward passes,
float32 weights and optimizer state; float16 with a gradient scaler). Evaluation and analysis run in float32.
The device is not part of a run's identity (a run started on one device resumes on another); a dtype other
than float32 is.

Prefix attention (`prefix:P`): positions below P − 1 see the token they would predict, so their
targets are left out of the loss, here and in every evaluation.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, load_model, save_file, save_model
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from posleak.data.batches import TokenBatch, make_sequences
from posleak.data.corpus import Corpus, load_corpus, make_corpus
from posleak.device import DEVICES, DTYPES, Placement
from posleak.errors import BadInput, PosleakError
from posleak.lab.tasks import TASKS, TaskBatch, generate, length_problems, parse_tasks, task_tokenizer
from posleak.lab.tokenizer import train_tokenizer
from posleak.models.lab.config import LabSpec
from posleak.models.lab.hf_config import LabConfig
from posleak.models.lab.model import LabForCausalLM, build_lab_model, load_lab_model, quiet_transformers
from posleak.validate import out_folder_problems

METRICS_COLUMNS = ("step", "train_loss", "val_loss", "tokens_per_s")
# Evaluation lengths are multiples of the training length (length generalisation); a learned
# position table must cover the longest.
MAX_LENGTH_MULTIPLE = 4


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and data options of one training run."""

    steps: int = 800
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # the cosine decays to lr·min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.1  # on matrices and embeddings; norms, sinks and biases are not decayed
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_seqs: int = 32
    checkpoint_every: int = 200
    seed: int = 0
    corpus: str = "stdlib"
    vocab_size: int = 512
    val_fraction: float = 0.15  # of documents by hash; about 6% of the stdlib corpus's text
    task: str | None = None  # a posleak.lab.tasks name: train on its rows instead of the corpus
    device: str = "auto"  # where it trains and is evaluated (module docstring): not part of its identity
    dtype: str = "float32"  # bfloat16 | float16: mixed-precision training

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be at least 1, got {getattr(self, name)}"
            for name in ("steps", "seq_len", "batch_size", "eval_every", "eval_seqs", "checkpoint_every")
            if getattr(self, name) < 1
        ]
        if self.seq_len == 1:
            problems.append(f"seq_len {self.seq_len} is too short; use at least 2")
        if not self.lr > 0:
            problems.append(f"lr {self.lr} must be positive")
        if not 0.0 < self.val_fraction < 1.0:
            problems.append(f"val_fraction {self.val_fraction} must lie strictly between 0 and 1")
        if self.device not in DEVICES:
            problems.append(f"unknown device {self.device!r}; use one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            problems.append(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.task is not None:
            try:
                (name,) = parse_tasks(self.task)
            except (PosleakError, ValueError):
                problems.append(f"unknown task {self.task}; use one of {', '.join(TASKS)}")
            else:  # rows at 1× up to MAX_LENGTH_MULTIPLE × the training length are evaluated
                longest = MAX_LENGTH_MULTIPLE * self.seq_len
                problems += length_problems(name, self.seq_len) or length_problems(name, longest)
        if problems:
            raise BadInput(problems)

    def lr_at(self, step: int) -> float:
        """Linear warm-up over warmup_steps, then cosine from lr down to lr·min_lr_ratio at the last step."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        span = max(1, self.steps - self.warmup_steps - 1)
        progress = min(1.0, (step - self.warmup_steps) / span)
        low = self.lr * self.min_lr_ratio
        return low + 0.5 * (self.lr - low) * (1.0 + math.cos(math.pi * progress))

    @property
    def placement(self) -> Placement:
        return Placement(self.device, self.dtype)

    def precision(self, device: torch.device) -> AbstractContextManager[Any]:
        """The forward passes' autocast on `device` for a mixed-precision dtype (nothing for float32)."""
        if self.dtype == "float32":
            return nullcontext()
        return torch.autocast(device.type, dtype=self.placement.torch_dtype())

    def to_dict(self) -> dict[str, Any]:
        """The run's identity: the options that change its result (module docstring)."""
        values = asdict(self)
        del values["device"]
        # runs keep the identity (and trial keys) they had before tasks and precisions existed
        for name, default in (("task", None), ("dtype", "float32")):
            if values[name] == default:
                del values[name]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise PosleakError(f"unknown training options {unknown}; known: {sorted(names)}")
        return cls(**values)


@dataclass
class LabData:
    """The tokenizer and the two document splits of one corpus."""

    tokenizer: PreTrainedTokenizerFast
    train: Corpus
    val: Corpus


def prepare_data(config: TrainConfig, tokenizer: PreTrainedTokenizerFast | None = None) -> LabData:
    """Load the corpus, split it by document and train the tokenizer on the training documents (unless
    `tokenizer`, the one saved with a checkpoint, is given)."""
    corpus = load_corpus(config.corpus)
    threshold = config.val_fraction * 256
    is_val = [hashlib.sha256(doc.encode()).digest()[0] < threshold for doc in corpus.documents]
    train_docs = [doc for doc, val in zip(corpus.documents, is_val, strict=True) if not val]
    val_docs = [doc for doc, val in zip(corpus.documents, is_val, strict=True) if val]
    if not train_docs or not val_docs:
        raise PosleakError(
            f"corpus '{corpus.name}' has {len(corpus)} documents, too few to split into training and validation; "
            "use a larger corpus"
        )
    train = make_corpus(f"{corpus.name}[train]", train_docs)
    val = make_corpus(f"{corpus.name}[val]", val_docs)
    return LabData(tokenizer=tokenizer or train_tokenizer(train, config.vocab_size), train=train, val=val)


# random streams of task rows: training, validation, evaluation at each length, the probe's, the analysis's
TASK_TRAIN, TASK_VAL, TASK_EVAL, TASK_PROBE, TASK_ANALYSIS = 0, 1, 2, 3, 4


def task_rows(task: str, num_rows: int, length: int, bos: bool, seed: Sequence[int]) -> TaskBatch:
    """Rows of `task` with `length` tokens; without a BOS, rows one token longer with their `<bos>` cut off."""
    if bos:
        return generate(task, num_rows, length, seed)
    rows = generate(task, num_rows, length + 1, seed)
    return TaskBatch(task, rows.ids[:, 1:].contiguous(), rows.answers[:, 1:].contiguous())


def lab_sequences(data: LabData, split: str, seq_len: int, num_seqs: int | None, bos: bool, seed: int) -> TokenBatch:
    """Windows of one split (joined by <eos>), <bos> at position 0 when `bos`; all of them when num_seqs is None,
    else at most num_seqs (fewer when the split holds fewer)."""
    corpus = data.train if split == "train" else data.val
    lengths = [len(ids) for ids in data.tokenizer(list(corpus.documents), add_special_tokens=False)["input_ids"]]
    available = (sum(lengths) + len(lengths) - 1) // (seq_len - bos)
    count = available if num_seqs is None else min(num_seqs, available)
    if count < 1:
        raise PosleakError(
            f"the {split} split of corpus '{corpus.name}' holds no window of {seq_len} tokens; "
            "lower seq_len or use a larger corpus"
        )
    return make_sequences(
        corpus, data.tokenizer, seq_len, count, bos="on" if bos else "off", seed=seed, cross_documents=True
    )


def loss_mask(config: LabConfig, seq_len: int) -> torch.Tensor:
    """Which next-token targets (positions 1..T−1) count: all but those a bidirectional prefix can see."""
    keep = torch.ones(seq_len - 1, dtype=torch.bool)
    keep[: max(0, config.prefix_length - 1)] = False
    return keep


def token_losses(model: LabForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Per-target cross-entropy (B, T−1) of predicting ids[:, 1:] from the prefix, on the model's device."""
    ids = ids.to(model.device)
    logits = model(input_ids=ids).logits[:, :-1]
    return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none").view(ids.shape[0], -1)


@torch.no_grad()
def evaluate_loss(
    model: LabForCausalLM, ids: torch.Tensor, batch_size: int = 16, targets: torch.Tensor | None = None
) -> float:
    """Mean next-token cross-entropy (nats) over every counted target of `ids` (`targets`, (N, T − 1) bool: a
    task's answers; else all but a prefix's)."""
    was_training = model.training
    model.eval()
    keep = loss_mask(model.config, ids.shape[1]).expand(ids.shape[0], -1) if targets is None else targets
    total, count = 0.0, 0
    for start in range(0, ids.shape[0], batch_size):
        losses = token_losses(model, ids[start : start + batch_size])[keep[start : start + batch_size].to(model.device)]
        total += float(losses.double().sum())
        count += losses.numel()
    model.train(was_training)
    return total / count


class BatchOrder:
    """The rows of step s: epoch e visits every training row once, in a permutation seeded by (seed, e)."""

    def __init__(self, num_rows: int, batch_size: int, seed: int) -> None:
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def rows(self, step: int) -> torch.Tensor:
        flat = torch.arange(step * self.batch_size, (step + 1) * self.batch_size)
        epochs, offsets = flat // self.num_rows, flat % self.num_rows
        return torch.stack([self._permutation(int(e))[o] for e, o in zip(epochs, offsets, strict=True)])

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.num_rows, generator=generator)
        return self._perm


@dataclass
class TrainResult:
    """Where the run lives and what it measured."""

    out: Path
    metrics: pd.DataFrame
    finished: bool  # False when `until` stopped it before config.steps
    step: int

    def model(self) -> LabForCausalLM:
        return load_lab_model(str(self.out))


def train(
    spec: LabSpec,
    config: TrainConfig,
    out: str | Path,
    *,
    until: int | None = None,
    progress: bool = True,
    threads: int | None = 1,
) -> TrainResult:
    """Train (or resume, or return a finished run) into `out`; stop after step `until` when given."""
    if problems := out_folder_problems(out) + config.placement.problems():
        raise BadInput(problems)
    with torch_threads(threads):
        return _train(spec, config, Path(out), until, progress)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside the block (None: unchanged)."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _train(spec: LabSpec, config: TrainConfig, out: Path, until: int | None, progress: bool) -> TrainResult:
    identity = {"spec": spec.to_dict(), "train": config.to_dict()}
    finished = _finished_run(out, identity)
    if finished is not None:
        return finished
    data = prepare_data(config) if config.task is None else None
    tokenizer = data.tokenizer if data is not None else task_tokenizer()
    model_config = spec.config(
        tokenizer.vocab_size, MAX_LENGTH_MULTIPLE * config.seq_len, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    device = config.placement.torch_device()
    model = build_lab_model(model_config, seed=config.seed).to(device).train()
    optimizer = _optimizer(model, config)
    scaler = torch.amp.GradScaler(device.type, enabled=config.dtype == "float16")  # float16 gradients underflow
    state = _resume(out, identity, model, optimizer, scaler)
    batches = _batches(config, spec, model_config, data)
    if data is not None:
        val_targets = None
        val_ids = lab_sequences(data, "val", config.seq_len, config.eval_seqs, spec.bos, config.seed).ids
    else:
        assert config.task is not None
        val = task_rows(config.task, config.eval_seqs, config.seq_len, spec.bos, (config.seed, TASK_VAL))
        val_ids, val_targets = val.ids, val.answers
    stop = config.steps if until is None else min(until, config.steps)
    metrics: list[dict[str, float]] = state["metrics"]
    # the bar as a context: closed (its line ended) before an error is printed below it
    with tqdm(total=stop, initial=state["step"], desc=f"train {spec.pe}/{spec.norm}", disable=not progress) as bar:
        for step in range(state["step"], stop):
            started = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = config.lr_at(step)
            ids, keep = batches(step)
            with config.precision(device):  # the device resolved once, not probed every step
                loss = token_losses(model, ids.to(device))[keep.to(device)].mean()
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            tokens_per_s = config.batch_size * config.seq_len / (time.perf_counter() - started)
            train_loss = loss.item()
            done = step + 1
            val_loss = (
                evaluate_loss(model, val_ids, targets=val_targets)  # float32, as every evaluation
                if done % config.eval_every == 0 or done == config.steps
                else math.nan
            )
            metrics.append({"step": done, "train_loss": train_loss, "val_loss": val_loss, "tokens_per_s": tokens_per_s})
            bar.set_postfix(loss=f"{train_loss:.3f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
            bar.update()
            if done % config.checkpoint_every == 0 or done == stop:
                _save_checkpoint(out, identity, done, model, optimizer, metrics, scaler)
    frame = pd.DataFrame(metrics, columns=list(METRICS_COLUMNS))
    if stop < config.steps:
        return TrainResult(out=out, metrics=frame, finished=False, step=stop)
    _save_final(out, identity, model, tokenizer, frame, data)
    return TrainResult(out=out, metrics=frame, finished=True, step=config.steps)


def _batches(
    config: TrainConfig, spec: LabSpec, model_config: LabConfig, data: LabData | None
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """The rows of step s and which of their targets count, a pure function of (seed, s): corpus windows in
    a seeded order, or a task's rows drawn from the stream (seed, TASK_TRAIN, s)."""
    if data is None:
        assert config.task is not None
        task = config.task

        def task_step(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            rows = task_rows(task, config.batch_size, config.seq_len, spec.bos, (config.seed, TASK_TRAIN, step))
            return rows.ids, rows.answers

        return task_step
    rows = lab_sequences(data, "train", config.seq_len, None, spec.bos, config.seed).ids
    keep = loss_mask(model_config, config.seq_len).expand(config.batch_size, -1)
    order = BatchOrder(rows.shape[0], config.batch_size, config.seed)
    return lambda step: (rows[order.rows(step)], keep)


def _optimizer(model: LabForCausalLM, config: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, config.beta2))


def _finished_run(out: Path, identity: dict[str, Any]) -> TrainResult | None:
    record = out / "train.json"
    if not record.is_file():
        return None
    saved = json.loads(record.read_text())
    _check_identity(out, saved, identity)
    return TrainResult(
        out=out, metrics=pd.read_parquet(out / "metrics.parquet"), finished=True, step=saved["train"]["steps"]
    )


def _check_identity(out: Path, saved: dict[str, Any], identity: dict[str, Any]) -> None:
    if {"spec": saved["spec"], "train": saved["train"]} != identity:
        raise PosleakError(
            f"'{out}' holds a different run (other lab or training options); choose another --out or remove it"
        )


def _checkpoint_dir(out: Path) -> Path | None:
    pointer = out / "checkpoints" / "latest"
    return out / "checkpoints" / pointer.read_text().strip() if pointer.is_file() else None


def _resume(
    out: Path,
    identity: dict[str, Any],
    model: LabForCausalLM,
    optimizer: torch.optim.AdamW,
    scaler: torch.amp.GradScaler,
) -> dict[str, Any]:
    folder = _checkpoint_dir(out)
    if folder is None:
        return {"step": 0, "metrics": []}
    state = json.loads((folder / "trainer_state.json").read_text())
    _check_identity(out, state, identity)
    load_model(model, str(folder / "model.safetensors"), device=str(next(model.parameters()).device))
    tensors = load_file(str(folder / "optimizer.safetensors"))
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = tensor
    optimizer.load_state_dict({"state": per_param, "param_groups": state["param_groups"]})
    if state.get("scaler"):
        scaler.load_state_dict(state["scaler"])  # float16: the gradient scale it had reached
    return state


def _save_checkpoint(
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
    (tmp / "trainer_state.json").write_text(json.dumps(trainer_state))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _atomic_write(root / "latest", name + "\n")
    for old in root.glob("step-*"):
        if old.name != name:
            shutil.rmtree(old)


def _save_final(
    out: Path,
    identity: dict[str, Any],
    model: LabForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    metrics: pd.DataFrame,
    data: LabData | None,
) -> None:
    """Model, tokenizer and metrics first, `train.json` last: a folder with train.json is complete."""
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
    }
    _atomic_write(out / "train.json", json.dumps(record, indent=2))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
