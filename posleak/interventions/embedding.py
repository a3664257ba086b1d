"""BOS embedding replacement (docs/method.md §9): position 0's input vector swapped before the forward.

Vectors live where the embedding module's output lives, after any scale the model applies inside
it (Gemma multiplies by √d_model there), because the replacement is made on that output by a
forward hook. Kinds: `mean` (mean of the output over the whole vocabulary), `random` (a seeded
Gaussian direction with the norm of the vector it replaces), `zero`, `token:TEXT` (the output for
the single token TEXT encodes to).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers import PreTrainedModel

from posleak.capture.session import active_session


@torch.no_grad()
def mean_embedding(model: PreTrainedModel, chunk: int = 16384) -> torch.Tensor:
    """Mean of the embedding module's output over every token id (chunked: vocabularies are large)."""
    module = model.get_input_embeddings()
    vocab = module.weight.shape[0]
    total = torch.zeros(module.weight.shape[1], dtype=torch.float64)
    for start in range(0, vocab, chunk):
        ids = torch.arange(start, min(vocab, start + chunk), device=module.weight.device)
        total += module(ids).double().sum(0)
    return (total / vocab).to(module.weight.dtype)


def replacement_vector(model: PreTrainedModel, kind: str, token: int | None) -> torch.Tensor | None:
    """The vector for `kind` (`token`: the id a `token:TEXT` kind names, else None), or None for `random` (made
    per row, to match each row's norm)."""
    module = model.get_input_embeddings()
    if token is not None:
        with torch.no_grad():
            return module(torch.tensor([token], device=module.weight.device))[0]
    if kind == "mean":
        return mean_embedding(model)
    if kind == "zero":
        return torch.zeros(module.weight.shape[1], dtype=module.weight.dtype)
    return None


@contextmanager
def replaced_position0(model: PreTrainedModel, vector: torch.Tensor | None, seed: int = 0) -> Iterator[None]:
    """Within the block, the embedding output at position 0 is `vector` in every row (None: a random
    direction per row, seeded by `seed` and the row's sequence index so that a resumed run draws the
    same vectors, scaled to the norm of the row's original vector)."""

    def hook(module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        if vector is None:
            session = active_session()
            rows = session.sequence_index.tolist() if session is not None else range(output.shape[0])
            noise = torch.stack([_direction(output.shape[-1], seed, row) for row in rows]).to(output)
            scale = output[:, 0].norm(dim=-1, keepdim=True) / noise.norm(dim=-1, keepdim=True)
            output[:, 0] = noise * scale
        else:
            output[:, 0] = vector.to(output)
        return output

    # prepend: captures registered earlier must see the replaced vector
    handle = model.get_input_embeddings().register_forward_hook(hook, prepend=True)
    try:
        yield
    finally:
        handle.remove()


def _direction(dim: int, seed: int, row: int) -> torch.Tensor:
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed * 1_000_003 + row))
