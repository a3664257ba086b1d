"""Captured queries and keys: what the decomposition needs of each attention call, kept on disk.

The magnitudes of docs/method.md are sums over single (query, offset) pairs of quantities averaged over
sequences, so their squares need every pair of sequences at once (a Gram matrix of their logits). The
forward passes therefore keep each layer's post-RoPE queries, the distinct keys (no GQA repeat) and
log Z_i exactly as the model computed them, and the measurement (posleak.measure.layer_sums) takes
them up layer by layer after the last batch.

`QKRecorder` is the accumulator that keeps them for the batch in flight; `CaptureFolder` writes one
safetensors file per batch (atomically: a batch is done when its file exists, so the files are also the
checkpoint of an interrupted run) and reads one layer of every batch back in sequence order. Memory grows
with T: one batch in flight during the forwards, one layer of all sequences during the reduction.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from posleak.capture.masks import MaskSpec
from posleak.capture.session import AttentionCall

_BATCH_FILE = "batch{:05d}.safetensors"


@dataclass(frozen=True)
class CallFacts:
    """What a layer's attention does besides q·k: the same for every batch of one run."""

    scaling: float
    softcap: float | None
    causal: bool
    window: int | None
    prefix: int
    norm: str  # "softmax" or "sigmoid"
    sink: tuple[float, ...] | None  # learned per-head sink logits, where the model has them

    @property
    def mask(self) -> MaskSpec:
        return MaskSpec(causal=self.causal, window=self.window, prefix=self.prefix)

    @staticmethod
    def of(call: AttentionCall) -> CallFacts:
        return CallFacts(
            scaling=float(call.scaling),
            softcap=None if call.softcap is None else float(call.softcap),
            causal=call.mask.causal,
            window=call.mask.window,
            prefix=call.mask.prefix,
            norm=call.norm,
            sink=None if call.sink is None else tuple(call.sink.double().tolist()),
        )


@dataclass
class LayerCapture:
    """One layer's attention inputs for N sequences in input order."""

    layer: int
    facts: CallFacts
    query: torch.Tensor  # (N, H, T, D), post-RoPE, unscaled
    keys: torch.Tensor  # (N, KV, T, D), post-RoPE
    log_z: torch.Tensor  # (N, H, T): log Z_i with any sink logit; 0 for sigmoid attention (no normaliser)

    @property
    def num_seqs(self) -> int:
        return self.query.shape[0]

    @property
    def seq_len(self) -> int:
        return self.query.shape[2]


class QKRecorder:
    """Keeps each layer's q, distinct keys and log Z of the batch in flight (an accumulator)."""

    needs_attended_keys = False

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.facts: dict[int, CallFacts] = {}

    def update(self, call: AttentionCall) -> None:
        facts = CallFacts.of(call)
        if self.facts.setdefault(call.layer, facts) != facts:
            raise ValueError(f"layer {call.layer} changed its attention from {self.facts[call.layer]} to {facts}")
        log_z = torch.zeros_like(call.log_z) if call.norm == "sigmoid" else call.log_z
        # clone: the tensors must outlive the forward, and a view would keep the model's buffers alive
        self.tensors[f"{call.layer}.query"] = call.query.detach().clone(memory_format=torch.contiguous_format)
        self.tensors[f"{call.layer}.keys"] = call.distinct_keys.detach().clone(memory_format=torch.contiguous_format)
        self.tensors[f"{call.layer}.log_z"] = log_z.detach().float().contiguous()

    def take(self) -> dict[str, torch.Tensor]:
        """The batch's tensors, leaving the recorder empty for the next batch."""
        tensors, self.tensors = self.tensors, {}
        return tensors


class CaptureFolder:
    """One safetensors file per batch: the recorder's tensors, the batch's sequence indices, the facts."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def batch_path(self, batch: int) -> Path:
        return self.path / _BATCH_FILE.format(batch)

    def has(self, batch: int) -> bool:
        return self.batch_path(batch).exists()

    def write(
        self, batch: int, sequence_index: torch.Tensor, recorder: QKRecorder, extra: dict[str, torch.Tensor]
    ) -> None:
        """Write the batch's captures and `extra` tensors (named freely, e.g. residual states) atomically."""
        tensors = recorder.take() | {f"extra.{name}": value.contiguous() for name, value in extra.items()}
        tensors["sequence_index"] = sequence_index.long().contiguous()
        facts = {str(layer): asdict(fact) for layer, fact in recorder.facts.items()}
        target = self.batch_path(batch)
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            save_file(tensors, str(tmp), metadata={"facts": json.dumps(facts)})
            with open(tmp, "rb") as file:
                os.fsync(file.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def batches(self) -> list[Path]:
        return sorted(self.path.glob(_BATCH_FILE.replace("{:05d}", "*")))

    def extra(self, name: str) -> list[torch.Tensor]:
        """The `extra` tensor `name` of every batch, in batch order."""
        out = []
        for path in self.batches():
            with safe_open(str(path), framework="pt") as file:
                out.append(file.get_tensor(f"extra.{name}"))
        return out

    def layers(self) -> list[int]:
        paths = self.batches()
        if not paths:
            return []
        with safe_open(str(paths[0]), framework="pt") as file:
            return sorted(int(layer) for layer in json.loads(file.metadata()["facts"]))

    def layer(self, layer: int) -> LayerCapture:
        """Layer `layer` of every batch, rows ordered by sequence index."""
        parts: dict[str, list[torch.Tensor]] = {"query": [], "keys": [], "log_z": [], "index": []}
        facts = None
        for path in self.batches():
            with safe_open(str(path), framework="pt") as file:
                stored = json.loads(file.metadata()["facts"])[str(layer)]
                batch_facts = CallFacts(**{**stored, "sink": None if stored["sink"] is None else tuple(stored["sink"])})
                if facts is not None and batch_facts != facts:
                    raise ValueError(f"layer {layer} computed differently in {path.name}: {batch_facts} vs {facts}")
                facts = batch_facts
                for name in ("query", "keys", "log_z"):
                    parts[name].append(file.get_tensor(f"{layer}.{name}"))
                parts["index"].append(file.get_tensor("sequence_index"))
        if facts is None:
            raise ValueError(f"no captured batches in {self.path}")
        order = torch.cat(parts["index"]).argsort()
        query, keys, log_z = (torch.cat(parts[name])[order] for name in ("query", "keys", "log_z"))
        return LayerCapture(layer=layer, facts=facts, query=query, keys=keys, log_z=log_z)
