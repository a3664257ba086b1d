"""What an intervention does to the model's predictions: next-token loss and top-1 accuracy by position.

Every analysis forward already runs the model on the sequences; `next_token_scores` takes that forward's
final hidden states through the model's own output layer, so the loss is that of exactly the run the
magnitudes come from (interventions included), at no second forward. Per query position i (which predicts
token i + 1) it keeps the cross-entropy and whether the top-1 prediction is the token that follows.

`behaviour_table` compares a baseline and an intervened run on the same sequences, by position bucket
(docs/method.md §11): the mean loss and accuracy of each run and their difference, with paired bootstrap
intervals that resample sequences with the same weights for both runs (and the same weights as the
magnitudes' intervals, `posleak.measure.bootstrap`). Runs of different lengths (`--bos off` removes the
BOS, T − 1 tokens) are aligned by the token predicted, not by position.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from posleak.measure.bootstrap import percentile_interval, resample_weights

FIRST_TOKENS = 4  # queries 0..3: the predictions made with almost no context, where position 0 weighs most
MEASURES = ("loss", "accuracy")
# The output layer's logits are formed a block of (rows × words) at a time, 4M float32 (16 MB): small enough
# for the allocator to reuse one block from its heap (a whole row of a 49k-word vocabulary, 200 MB per 1024
# rows, was mapped afresh each time and cost a page fault every 4 KB), and with rows enough that the layer's
# weights are read once per 2048 rows.
_LOGIT_ROWS = 2048
_LOGIT_ELEMENTS = 1 << 22


class ScoredRun(Protocol):
    """A run that kept its next-token scores (an analysis result): its `token_table`, one row per prediction."""

    @property
    def tokens(self) -> pd.DataFrame: ...


@torch.no_grad()
def next_token_scores(
    model: PreTrainedModel, hidden: torch.Tensor, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T − 1) cross-entropy (nats, float32) and top-1 hit of predicting ids[:, i + 1] from the final hidden
    state at i, through the model's output layer and its final soft-cap (Gemma 2), as its causal-LM head does.

    The vocabulary is taken a slice at a time: a running maximum, argmax and rescaled Σ exp per row give
    log Z = max + log Σ exp(logit − max), the loss log Z − logit[target], and the first word of highest logit
    (as argmax over the whole row)."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear output layer; next-token scores need a causal LM")
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    states = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    targets = ids[:, 1:].reshape(-1).to(states.device)
    nll = torch.empty(targets.shape, dtype=torch.float32)
    correct = torch.empty(targets.shape, dtype=torch.bool)
    vocab = head.out_features
    words = max(1, _LOGIT_ELEMENTS // min(_LOGIT_ROWS, max(1, targets.numel())))
    for start in range(0, targets.numel(), _LOGIT_ROWS):
        rows = slice(start, start + _LOGIT_ROWS)
        wanted = targets[rows]
        top = torch.full(wanted.shape, -math.inf, device=states.device)
        best = torch.zeros_like(wanted)
        total = torch.zeros(wanted.shape, device=states.device)
        picked = torch.zeros(wanted.shape, device=states.device)
        for w0 in range(0, vocab, words):
            w1 = min(vocab, w0 + words)
            bias = None if head.bias is None else head.bias[w0:w1]
            logits = F.linear(states[rows], head.weight[w0:w1], bias).float()
            if cap is not None:
                logits = cap * torch.tanh(logits / cap)
            inside = (wanted >= w0) & (wanted < w1)
            picked[inside] = logits[inside, wanted[inside] - w0]
            block_top, block_best = logits.max(-1)
            best = torch.where(block_top > top, block_best + w0, best)  # ties keep the earlier word
            new_top = torch.maximum(top, block_top)
            total = total * torch.exp(top - new_top) + logits.sub_(new_top[:, None]).exp_().sum(-1)
            top = new_top
        nll[rows] = top + torch.log(total) - picked
        correct[rows] = best == wanted
    shape = (ids.shape[0], ids.shape[1] - 1)
    return nll.view(shape), correct.view(shape)


def token_table(nll: torch.Tensor, correct: torch.Tensor, ids: torch.Tensor) -> pd.DataFrame:
    """Long table, one row per (sequence, query position): `seq, pos, target, nll, correct`."""
    num_seqs, queries = nll.shape
    return pd.DataFrame(
        {
            "seq": np.repeat(np.arange(num_seqs), queries),
            "pos": np.tile(np.arange(queries), num_seqs),
            "target": ids[:, 1:].reshape(-1).numpy(),
            "nll": nll.reshape(-1).double().numpy(),
            "correct": correct.reshape(-1).numpy(),
        }
    )


def buckets(seq_len: int, early: int) -> dict[str, tuple[int, int]]:
    """Query positions [lo, hi) of each bucket for sequences of `seq_len` tokens (queries 0..T − 2 predict):
    first 0 ≤ i < 4, early 4 ≤ i < K (the magnitudes' early range), middle K ≤ i < T/2, late T/2 ≤ i ≤ T − 2,
    and all; a bucket the length leaves empty is omitted."""
    last = seq_len - 1
    first = min(FIRST_TOKENS, last)
    early_end = min(max(early, first), last)
    middle_end = min(max(seq_len // 2, early_end), last)
    edges = {"first": (0, first), "early": (first, early_end), "middle": (early_end, middle_end)}
    edges |= {"late": (middle_end, last), "all": (0, last)}
    return {name: (lo, hi) for name, (lo, hi) in edges.items() if hi > lo}


def aligned(baseline: pd.DataFrame, intervened: pd.DataFrame, shift: int) -> pd.DataFrame:
    """The two token tables joined on (sequence, predicted token), positions in the baseline's coordinates:
    a run `shift` tokens shorter at the front (`--bos off`: 1) predicts the baseline's token at i + 1 from its
    query i − shift. Predictions one run has and the other lacks (the BOS's own, for `--bos off`) drop out."""
    moved = intervened.assign(pos=intervened["pos"] + shift)
    joined = baseline.merge(moved, on=["seq", "pos"], suffixes=("_base", "_new"), validate="one_to_one")
    if not (joined["target_base"] == joined["target_new"]).all():
        raise ValueError("the two runs do not predict the same tokens: they were not made on the same sequences")
    return joined


def behaviour_table(
    baseline: ScoredRun,
    intervened: ScoredRun,
    *,
    early: int = 32,
    resamples: int = 200,
    seed: int = 0,
    level: float = 0.95,
    units: tuple[int, ...] | None = None,
) -> pd.DataFrame:
    """Loss and accuracy of both runs by bucket, and intervened − baseline, with paired bootstrap intervals.

    Columns `bucket, query_lo, query_hi, tokens, measure, baseline, baseline_lo, baseline_hi, intervened,
    intervened_lo, intervened_hi, change, change_lo, change_hi`; `measure` is `loss` (nats) or `accuracy`
    (a fraction). Intervals resample the sequences by `units`, their documents (`resample_weights(N, resamples,
    seed, units)`, the magnitudes' draws too); NaN with `resamples` = 0."""
    base, new = baseline.tokens, intervened.tokens
    if base.empty or new.empty:
        raise ValueError("a run holds no next-token scores (made before posleak measured them); rerun it")
    seq_len = int(base["pos"].max()) + 2
    joined = aligned(base, new, seq_len - (int(new["pos"].max()) + 2))
    num_seqs = int(base["seq"].max()) + 1
    weights = torch.ones(1, num_seqs, dtype=torch.float64)
    if resamples > 0:
        weights = torch.cat([weights, resample_weights(num_seqs, resamples, seed, units)])
    rows = []
    for name, (lo, hi) in buckets(seq_len, early).items():
        cell = joined[(joined["pos"] >= lo) & (joined["pos"] < hi)]
        if cell.empty:
            continue
        count = _per_sequence(cell, "pos", num_seqs, "count")
        for measure, column in (("loss", "nll"), ("accuracy", "correct")):
            # Every resample's mean is a weighted ratio of per-sequence sums: one matrix product for all of them.
            means = {
                run: (weights @ _per_sequence(cell, f"{column}_{run}", num_seqs, "sum")) / (weights @ count)
                for run in ("base", "new")
            }
            change = means["new"] - means["base"]
            row: dict[str, object] = {
                "bucket": name,
                "query_lo": lo,
                "query_hi": hi,
                "tokens": len(cell),
                "measure": measure,
            }
            for label, values in (("baseline", means["base"]), ("intervened", means["new"]), ("change", change)):
                row[label] = float(values[0])
                bounds = percentile_interval(values[1:], level) if resamples > 0 else (torch.nan, torch.nan)
                row[f"{label}_lo"], row[f"{label}_hi"] = float(bounds[0]), float(bounds[1])
            rows.append(row)
    return pd.DataFrame(rows)


def _per_sequence(cell: pd.DataFrame, column: str, num_seqs: int, how: str) -> torch.Tensor:
    """(N,) float64 sum (or count) of `column` per sequence; 0 for a sequence with no token in the cell."""
    grouped = cell.groupby("seq")[column]
    values = grouped.sum() if how == "sum" else grouped.count()
    return torch.tensor(values.reindex(range(num_seqs), fill_value=0).to_numpy(dtype=np.float64))


def behaviour_lines(table: pd.DataFrame) -> list[str]:
    """One Markdown bullet per bucket: the change in loss and in accuracy with their intervals."""
    lines = []
    for name in dict.fromkeys(table["bucket"]):
        cell = table[table["bucket"] == name].set_index("measure")
        loss, acc = cell.loc["loss"], cell.loc["accuracy"]
        lines.append(
            f"- **{name}** (queries {int(loss.query_lo)}–{int(loss.query_hi) - 1}, {int(loss.tokens)} tokens): "
            f"loss {loss.baseline:.3f} → {loss.intervened:.3f} nats ({loss.change:+.3f}, 95% CI "
            f"{loss.change_lo:+.3f} to {loss.change_hi:+.3f}); top-1 accuracy {100 * acc.baseline:.1f}% → "
            f"{100 * acc.intervened:.1f}% ({100 * acc.change:+.1f} points, {100 * acc.change_lo:+.1f} to "
            f"{100 * acc.change_hi:+.1f})"
        )
    return lines
