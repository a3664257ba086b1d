"""The path-specific position-0 patch (docs/method.md §9): the key and value at key 0 that chosen heads show
their later queries are those of another token's position-0 trajectory; nothing else changes.

Position 0 is a closed system, so its key and value in every layer are a function of its token alone: one
forward of the source token gives them (RoPE at position 0 is the identity, so the key is the post-RoPE one
the heads see). In a patched head, queries i ≥ 1 attend over the source's k_0 and v_0 in place of their
sequence's; query 0 keeps its own (position 0 stays what it was), and every other head, and the residual stream
at position 0, keep the real position 0. Unlike zeroing the value at key 0, the sink's logit moves with the
source's key, so the head's no-op role (how much attention key 0 absorbs) survives when the two tokens' sinks
are alike, and only which trajectory is read changes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from posleak.capture.attention import attend_materialised
from posleak.capture.session import AttentionCall, CaptureSession


class _Key0Recorder:
    """Keeps k_0 and v_0 of every query head in every layer (GQA expanded), as the model computed them."""

    needs_attended_keys = False

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def update(self, call: AttentionCall) -> None:
        self.keys[call.layer] = call.key[0, :, 0].clone()
        self.values[call.layer] = call.value[0, :, 0].clone()


@dataclass
class Key0Patch:
    """An output edit (posleak.capture.AttentionEdits.output_edits): in each layer's `heads`, queries i ≥ 1 read
    key 0 with the source's key and value (`keys`, `values`: layer → (H, D)). `patched` counts the calls it
    edited, per layer: proof that the path ran."""

    heads: dict[int, tuple[int, ...]]
    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    patched: Counter[int] = field(default_factory=Counter)

    def __call__(self, call: AttentionCall) -> torch.Tensor:
        heads = self.heads.get(call.layer)
        if not heads:
            return call.output
        index = torch.tensor(heads, device=call.query.device)
        key, value = call.key[:, index].clone(), call.value[:, index].clone()
        key[:, :, 0] = self.keys[call.layer][index].to(key)
        value[:, :, 0] = self.values[call.layer][index].to(value)
        sink = None if call.sink is None else call.sink[index].to(call.query.device)
        # exact for any mask, soft-cap, sink or normalisation: the heads' attention recomputed block by block
        patched, _ = attend_materialised(
            call.query[:, index], key, value, call.mask, call.scaling, call.softcap, sink, call.norm
        )
        output = call.output.clone()
        output[:, index, 1:] = patched[:, :, 1:].to(output)
        self.patched[call.layer] += 1
        return output


def key0_patch(model: PreTrainedModel, token_id: int, heads: dict[int, tuple[int, ...]]) -> Key0Patch:
    """The patch of `heads` with the position-0 key and value of `token_id` (one forward of that token alone)."""
    recorder = _Key0Recorder()
    CaptureSession([recorder]).forward(model, torch.tensor([[token_id]]))
    return Key0Patch(heads, recorder.keys, recorder.values)
