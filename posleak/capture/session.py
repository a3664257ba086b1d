"""A capture session: what the attention function hands to accumulators, and the edits it applies.

`CaptureSession.forward(model, ids, sequence_index)` runs one batch with the session active; each
attention call builds an `AttentionCall` (the layer's real q, k, v, its mask structure and log Z)
and passes it to every accumulator's `update`. Accumulators reduce it to small tensors and drop it,
so nothing of size T×T per head survives the layer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from posleak.capture.masks import MaskSpec
from posleak.capture.residual import base_of
from posleak.errors import PosleakError

_ACTIVE: ContextVar[CaptureSession | None] = ContextVar("posleak_capture_session", default=None)


def active_session() -> CaptureSession | None:
    return _ACTIVE.get()


def soft_cap(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Gemma 2-style logit soft-capping, c·tanh(s/c); the identity when the model has none."""
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


@dataclass
class AttentionCall:
    """One layer's attention on one batch, as the model computed it (query heads, GQA expanded)."""

    layer: int
    query: torch.Tensor  # (B, H, T, D), post-RoPE
    key: torch.Tensor  # (B, H, T, D), post-RoPE, each KV head repeated for its `groups` query heads
    value: torch.Tensor  # (B, H, T, Dv)
    scaling: float
    softcap: float | None
    sink: torch.Tensor | None  # (H,) learned sink logits, where the model has them
    norm: str  # "softmax" or "sigmoid"
    mask: MaskSpec
    log_z: torch.Tensor  # (B, H, T): log Z_i over the valid keys plus the sink logit (0 for sigmoid)
    log_z_keys: torch.Tensor  # (B, H, T): log Z_i over the valid keys alone
    output: torch.Tensor  # (B, H, T, Dv); once recorded, after every output edit (AttentionEdits)
    attended_keys: torch.Tensor | None  # (B, H, T, D): Σ_j a_ij k_j, when an accumulator asked for it
    sequence_index: torch.Tensor  # (B,) position of each row in the input order
    groups: int = 1  # query heads per KV head (GQA)

    @property
    def seq_len(self) -> int:
        return self.query.shape[-2]

    @property
    def distinct_keys(self) -> torch.Tensor:
        """The KV heads' keys without the GQA repeat, (B, H / groups, T, D)."""
        return self.key[:, :: self.groups]

    def logits(self, q0: int, q1: int) -> torch.Tensor:
        """The pre-softmax logits s_ij of queries q0..q1−1, shape (B, H, q1−q0, T), −inf where invalid."""
        query, key = _wide(self.query[:, :, q0:q1]), _wide(self.key)
        block = soft_cap(query @ key.transpose(-1, -2) * self.scaling, self.softcap)
        return block.masked_fill(~self.mask.dense(self.seq_len, block.device)[q0:q1], float("-inf"))

    def key0_logits(self) -> torch.Tensor:
        """s_{i,0} for every query, shape (B, H, T), −inf where key 0 is outside the query's mask."""
        products = _wide(self.query) @ _wide(self.key[:, :, :1]).transpose(-1, -2)
        logits = soft_cap(products.squeeze(-1) * self.scaling, self.softcap)
        valid = self.mask.dense(self.seq_len, logits.device)[:, 0]
        return logits.masked_fill(~valid, float("-inf"))

    def attention_on_key0(self) -> torch.Tensor:
        """a_{i,0}, shape (B, H, T); for sigmoid normalisation the (unnormalised) gate on key 0."""
        if self.norm == "sigmoid":
            return torch.sigmoid(self.key0_logits())
        return torch.exp(self.key0_logits() - self.log_z)


MaskEdit = Callable[[MaskSpec], MaskSpec]  # the mask structure a layer asked for → the one it computes with
OutputEdit = Callable[[AttentionCall], torch.Tensor]  # a call → its edited output (B, H, T, Dv)


class Accumulator(Protocol):
    """Reduces attention calls to small running sums. `needs_attended_keys` asks the attention
    function to return Σ_j a_ij k_j too (one flash call with [v | k] as values)."""

    needs_attended_keys: bool

    def update(self, call: AttentionCall) -> None: ...


@dataclass
class AttentionEdits:
    """Declared changes to what attention computes (docs/method.md §9), applied in every layer. The interventions
    above this floor supply them (posleak.interventions: each intervention's `edit_attention`, in registry order);
    this floor only applies them, each in order.

    mask_edits: each takes the mask structure the model asked for (as the edits before it left it) to the one
    attention is computed with (posleak.interventions.window).
    output_edits: each takes a call, its output as the edits before it left it, to its edited output
    (posleak.interventions.key0_values, key0, key0_reads).
    """

    mask_edits: tuple[MaskEdit, ...] = ()
    output_edits: tuple[OutputEdit, ...] = ()

    def add_mask_edit(self, edit: MaskEdit) -> None:
        """`edit` applied after the mask edits already declared (the registry's order)."""
        self.mask_edits = (*self.mask_edits, edit)

    def add_output_edit(self, edit: OutputEdit) -> None:
        """`edit` applied to the output the output edits already declared leave (the registry's order)."""
        self.output_edits = (*self.output_edits, edit)

    def mask_for(self, spec: MaskSpec) -> MaskSpec:
        """The mask structure attention computes with: the model's `spec` after every mask edit."""
        for edit in self.mask_edits:
            spec = edit(spec)
        return spec

    def edited_output(self, call: AttentionCall) -> torch.Tensor:
        """The call's output after every output edit of it."""
        output = call.output
        for edit in self.output_edits:
            call.output = output
            output = edit(call)
        return output


class CaptureSession:
    """Runs batches with posleak's attention function reporting to `accumulators`."""

    def __init__(self, accumulators: Sequence[Accumulator] = (), edits: AttentionEdits | None = None) -> None:
        self.accumulators = list(accumulators)
        self.edits = edits or AttentionEdits()
        self.calls: Counter[int] = Counter()  # attention calls seen per layer: proof the path ran
        self.masks: dict[int, MaskSpec] = {}  # the mask each layer computed with (after edits)
        self.sequence_index = torch.zeros(0, dtype=torch.long)
        self._this_forward: set[int] = set()  # layers whose attention ran in the active forward

    @property
    def needs_attended_keys(self) -> bool:
        return any(acc.needs_attended_keys for acc in self.accumulators)

    def record(self, call: AttentionCall) -> None:
        if call.layer in self._this_forward:
            # Differential attention (two softmax maps) or a block called again (a recurrent loop): the
            # decomposition measures one map per layer and sequence, and two would be summed into one
            raise PosleakError(
                f"layer {call.layer}'s attention ran twice in one forward (two softmax maps per layer, or a decoder "
                "block called again); posleak measures one attention map per layer and forward"
            )
        self._this_forward.add(call.layer)
        self.calls[call.layer] += 1
        self.masks[call.layer] = call.mask
        for acc in self.accumulators:
            acc.update(call)

    @contextmanager
    def active(self, sequence_index: torch.Tensor) -> Iterator[CaptureSession]:
        self.sequence_index = sequence_index
        self._this_forward = set()
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    @torch.no_grad()
    def forward(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        sequence_index: torch.Tensor | None = None,
        **kwargs: object,
    ) -> object:
        """One forward of the base model (no LM head: analysis never needs the logits)."""
        if sequence_index is None:
            sequence_index = torch.arange(input_ids.shape[0])
        # The embedding's device: the model's one device, or its first under a device map (accelerate's
        # hooks carry the hidden states on from there).
        input_ids = input_ids.to(model.get_input_embeddings().weight.device)
        with self.active(sequence_index):
            return base_of(model)(input_ids=input_ids, use_cache=False, **kwargs)


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """A half-precision model's q or k in float32 (exactly: float32 holds every bfloat16 and float16 value), so
    that the logits posleak forms from them are as precise as the fused kernels' float32 accumulators."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))
