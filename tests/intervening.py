"""Helpers of the intervention tests (test_intervention_inputs.py, test_intervention_sinks.py, test_intervene.py):
token ids for the tiny models at a length where their sliding windows act, the residual states of a forward, and a
batch of given ids taken verbatim."""

from __future__ import annotations

import torch
from tiny import WINDOW
from transformers import PreTrainedModel

from posleak.capture import AttentionEdits, CaptureSession, ResidualCapture
from posleak.data.batches import TokenBatch

T = 3 * WINDOW


def tiny_ids(model: PreTrainedModel, batch: int = 3, seed: int = 2) -> torch.Tensor:
    """`batch` rows of T random ids of `model`'s vocabulary, drawn by `seed`, with one token at position 0."""
    ids = torch.randint(4, model.config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = 3  # a BOS-like token at position 0 (not 0: tiny Gemma's padding row is zero)
    return ids


def resid_states(model: PreTrainedModel, ids: torch.Tensor, edits: AttentionEdits | None = None) -> torch.Tensor:
    """All positions of every resid index, (L + 1, N, T, d)."""
    with ResidualCapture(model, positions=range(ids.shape[1])) as capture:
        CaptureSession(edits=edits).forward(model, ids)
    return capture.states()


def verbatim_batch(ids: torch.Tensor) -> TokenBatch:
    """The rows of `ids` as sequences, taken verbatim (no BOS policy, no corpus)."""
    return TokenBatch(ids, "verbatim", None, ids[:, 0].clone(), source="test", source_name="test", seed=None)
