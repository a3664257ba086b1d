"""Trainer throughput against a plain PyTorch loop: same lab model, same batches, AdamW, same steps, one process.

The trainer's cost per step is measured differentially — wall time of a 2N-step run minus an N-step run —
so its one-off costs (tokenizer, data, the final evaluation and save) cancel and everything it does per
step (schedule, clipping, metrics, progress bar, periodic checkpoints off) is counted. The plain loop
runs the same N steps after a short warm-up. Each is repeated and the fastest repeat kept, since other
processes on a shared machine only ever slow a run down. Both use one torch thread, the trainer's default.

    .venv/bin/python benchmarks/bench_trainer.py [--steps N] [--repeats R]

Prints tokens per second of each and their ratio (target ≥ 0.9).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from posleak.lab.data import BatchOrder, lab_sequences, prepare_data
from posleak.lab.train_config import MAX_LENGTH_MULTIPLE
from posleak.lab.trainer import TrainConfig, train
from posleak.models.lab.config import LabSpec
from posleak.models.lab.model import build_lab_model

SPEC = LabSpec(size="tiny")


def trainer_seconds(config: TrainConfig, root: Path) -> float:
    """Seconds of config.steps trainer steps: a 2N-step run minus an N-step run."""
    walls = []
    for steps in (config.steps, 2 * config.steps):
        run = TrainConfig(**{**config.to_dict(), "steps": steps})
        started = time.perf_counter()
        train(SPEC, run, root / f"steps-{steps}", progress=True)
        walls.append(time.perf_counter() - started)
    return walls[1] - walls[0]


def plain_seconds(config: TrainConfig, warmup: int = 5) -> float:
    """Seconds of config.steps steps of a bare loop over the trainer's own batches."""
    data = prepare_data(config)
    tokenizer = data.tokenizer
    model_config = SPEC.config(
        tokenizer.vocab_size, MAX_LENGTH_MULTIPLE * config.seq_len, tokenizer.bos_token_id, tokenizer.eos_token_id
    )
    model = build_lab_model(model_config, seed=config.seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    rows = lab_sequences(data, "train", config.seq_len, None, SPEC.bos, config.seed).ids
    order = BatchOrder(rows.shape[0], config.batch_size, config.seed)
    batches = [rows[order.rows(step)] for step in range(warmup + config.steps)]
    started = 0.0
    for step, ids in enumerate(batches):
        if step == warmup:
            started = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    # No evaluation or checkpoint inside the measured steps: the plain loop has neither.
    config = TrainConfig(
        steps=args.steps,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        eval_every=10**9,
        checkpoint_every=10**9,
    )
    torch.set_num_threads(1)
    trainer_best, plain_best = float("inf"), float("inf")
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            trainer_best = min(trainer_best, trainer_seconds(config, Path(tmp)))
        plain_best = min(plain_best, plain_seconds(config))
    tokens = config.steps * config.batch_size * config.seq_len
    trainer_rate, plain_rate = tokens / trainer_best, tokens / plain_best
    print(f"model: {SPEC.size} lab decoder, {config.batch_size}×{config.seq_len} tokens per step, {config.steps} steps")
    print(f"trainer    {trainer_rate:10,.0f} tokens/s")
    print(f"plain loop {plain_rate:10,.0f} tokens/s")
    print(f"ratio      {trainer_rate / plain_rate:10.3f}  (target ≥ 0.9)")


if __name__ == "__main__":
    main()
