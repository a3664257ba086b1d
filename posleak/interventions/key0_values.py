"""The value at key 0, as chosen heads' later queries read it, replaced (docs/method.md §9): the edit behind
`--ablate-sink-values` (posleak.interventions.ablate_sinks).

Query 0 keeps reading its own value: position 0 stays the closed system it was, and what is removed is exactly
what later queries read from the sink. Exact, as a correction of the output: o_i += a_{i,0}·(v_0' − v_0) for
i ≥ 1, with v_0' zero or the mean of the other keys' values in that sequence and head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.capture.session import AttentionCall
from posleak.data.kinds import AblateMode


@dataclass(frozen=True)
class Key0ValueAblation:
    """An output edit (posleak.capture.AttentionEdits.output_edits): in each layer's `heads`, the value at key 0
    that queries i ≥ 1 read replaced by zero (`mode` "zero") or the mean of the other keys' values ("mean")."""

    heads: dict[int, tuple[int, ...]]
    mode: AblateMode = "zero"

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        heads = self.heads.get(call.layer)
        if not heads:
            return call.output
        index = torch.tensor(heads, device=call.value.device)
        old = call.value[:, index, 0]
        new = torch.zeros_like(old) if self.mode == "zero" else call.value[:, index, 1:].mean(dim=-2)
        weight = call.attention_on_key0()[:, index, 1:, None]
        output = call.output.clone()
        output[:, index, 1:] += weight * (new - old)[:, :, None, :]
        return output
