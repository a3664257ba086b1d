"""Position 0 measures (docs/method.md §8): fingerprint constancy of h_0 across inputs.

The closed-system check itself lives with the residual capture (`posleak.capture.residual`), since
every run makes it.
"""

from __future__ import annotations

import torch


def fingerprint_constancy(pos0_states: torch.Tensor) -> torch.Tensor:
    """Mean pairwise cosine similarity of h_0^(l) across the N inputs, per layer; shape (layers,).

    pos0_states: (layers, N, d). 1.0 when every input has the same position-0 state (an auto-prepended
    BOS), lower when the token at position 0 varies. N = 1 gives NaN: there is no pair.
    """
    states = torch.nn.functional.normalize(pos0_states.double(), dim=-1)
    n = states.shape[1]
    if n < 2:
        return torch.full((states.shape[0],), float("nan"), dtype=torch.float64)
    gram = states @ states.transpose(1, 2)  # (layers, N, N)
    off_diagonal = gram.sum(dim=(1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)
    return off_diagonal / (n * (n - 1))
