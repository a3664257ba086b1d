"""How chosen heads' later queries read key 0, reweighted (docs/method.md §9): the edit behind
`--hold-sink-clock` (posleak.interventions.hold_sink_clock) and `--remove-sink-reads`
(posleak.interventions.remove_sink_reads).

In a chosen head, each query i ≥ 1 that sees key 0 gives it the weight a'_{i,0} = ā, and every other key (and a
learned sink logit, where the model has one) the weight a_{i,j}·(1 − ā)/(1 − a_{i,0}), so the row keeps its sum.
For the clock removal ā = mean_i a_{i,0} over those queries (per sequence and head, within the call): the
average read of key 0 is kept and only how it varies with the query's position goes; for the read removal ā = 0.
Query 0 keeps its own attention (position 0 stays a closed system), and so do queries whose window hides key 0.

The output is exact: o'_i = ā·v_0 + (1 − ā)·o^rest_i, with o^rest_i = Σ_{j≥1} a_{i,j} v_j / (1 − a_{i,0}) the
head's attention over keys 1.. alone, recomputed (block-wise, with the call's soft-cap and sink logit). This equals
ā·v_0 + (1 − ā)/(1 − a_{i,0})·(o_i − a_{i,0}·v_0) without its division by 1 − a_{i,0}, which loses every digit of a
half-precision o_i in a head whose a_{i,0} is near 1 (and is 0/0 where it rounds to 1). a_{i,0} is the call's own
exp(s_{i,0} − log Z_i). Sigmoid attention has no normaliser, so no row to keep the sum of: refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import torch

from posleak.capture.attention import attend_materialised
from posleak.capture.masks import MaskSpec
from posleak.capture.session import AttentionCall
from posleak.errors import PosleakError


@dataclass
class Key0Reads:
    """An output edit (posleak.capture.AttentionEdits.output_edits): in each layer's `heads`, key 0's weight for
    the queries i ≥ 1 that see it set to their mean (`target` "mean") or to 0 ("zero"), the rest renormalised.
    `option` names the intervention in a refusal; `edited` counts the calls it edited, per layer: proof that the
    path ran."""

    heads: dict[int, tuple[int, ...]]
    target: Literal["mean", "zero"]
    option: str
    edited: Counter[int] = field(default_factory=Counter)

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        heads = self.heads.get(call.layer)
        if not heads:
            return call.output
        if call.norm != "softmax":
            raise PosleakError(
                f"{self.option} reweights a softmax row; layer {call.layer}'s attention is {call.norm}-normalised"
            )
        index = torch.tensor(heads, device=call.query.device)
        weight = call.attention_on_key0()[:, index, 1:]  # (B, h, T − 1), float32 or wider; 0 where key 0 is hidden
        sees = call.mask.dense(call.seq_len, weight.device)[1:, 0]  # (T − 1,): which queries i ≥ 1 see key 0
        if self.target == "mean":
            held = weight.sum(dim=-1, keepdim=True) / sees.sum().clamp(min=1)
        else:
            held = torch.zeros_like(weight[..., :1])
        sink = None if call.sink is None else call.sink[index].to(call.query.device)
        # keys 1.. seen from queries 1..: the call's mask shifted by one (causality and windows are relative;
        # a bidirectional prefix loses key 0)
        mask = MaskSpec(call.mask.causal, call.mask.window, max(call.mask.prefix - 1, 0))
        rest, _ = attend_materialised(
            call.query[:, index, 1:],
            call.key[:, index, 1:],
            call.value[:, index, 1:],
            mask,
            call.scaling,
            call.softcap,
            sink,
            call.norm,
        )
        wide = weight.dtype
        edited = held[..., None] * call.value[:, index, :1].to(wide) + (1 - held[..., None]) * rest.to(wide)
        output = call.output.clone()
        output[:, index, 1:] = torch.where(sees[:, None], edited, output[:, index, 1:].to(wide)).to(output)
        self.edited[call.layer] += 1
        return output
