"""Captured queries and keys: what the decomposition needs of each attention call, kept on disk.

The magnitudes of docs/method.md are sums over single (query, offset) pairs of quantities averaged over
sequences, so their squares need every pair of sequences at once (a Gram matrix of their logits). The
forward passes therefore keep each layer's post-RoPE queries, the distinct keys (no GQA repeat) and
log Z_i exactly as the model computed them, and the measurement (posleak.measure.layer_sums) takes
them up layer by layer after the last batch.

`QKRecorder` is the accumulator that writes them to a `CaptureFolder` as the forward reaches each layer
(one file per batch and layer, then one that marks the batch done: the files are also the checkpoint of an
interrupted run); `CaptureFolder.layer` reads one layer of every batch back in sequence order. Memory grows
with T: one layer's tensors of one batch during the forwards, one layer of all sequences when measuring.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from posleak.capture.masks import MaskSpec
from posleak.capture.session import AttentionCall
from posleak.report.runfolder import atomic_write

_LAYER_FILE = "batch{:05d}.layer{:03d}.safetensors"
_DONE_FILE = "batch{:05d}.safetensors"


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
    """An accumulator that writes each layer's q, distinct keys and log Z of the batch in flight to the
    capture folder as soon as the forward reaches it: one layer's tensors are in memory at a time."""

    needs_attended_keys = False

    def __init__(self, folder: CaptureFolder) -> None:
        self.folder = folder
        self.batch: int | None = None
        self.facts: dict[int, CallFacts] = {}

    def update(self, call: AttentionCall) -> None:
        if self.batch is None:
            raise ValueError("QKRecorder.batch is not set: say which batch the forward belongs to")
        facts = CallFacts.of(call)
        if self.facts.setdefault(call.layer, facts) != facts:
            raise ValueError(f"layer {call.layer} changed its attention from {self.facts[call.layer]} to {facts}")
        log_z = torch.zeros_like(call.log_z) if call.norm == "sigmoid" else call.log_z
        tensors = {"query": call.query, "keys": call.distinct_keys, "log_z": log_z.float()}
        self.folder.write_layer(self.batch, call.layer, tensors, facts)


class CaptureFolder:
    """Per batch, one safetensors file per layer (q, keys, log Z, and the call's facts as metadata) and,
    written last, one with the batch's sequence indices and extra tensors: the batch is done when that
    file exists. Every file is written atomically, so a killed run leaves whole files only."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _done_path(self, batch: int) -> Path:
        return self.path / _DONE_FILE.format(batch)

    def has(self, batch: int) -> bool:
        return self._done_path(batch).exists()

    def write_layer(self, batch: int, layer: int, tensors: dict[str, torch.Tensor], facts: CallFacts) -> None:
        data = {name: value.detach().contiguous() for name, value in tensors.items()}
        blob = save(data, metadata={"facts": json.dumps(asdict(facts))})
        # not synced: a batch counts as done only once its closing file (synced) exists, and a power cut that
        # loses layer files costs recomputing that batch, while a sync per layer costs seconds per run
        atomic_write(self.path / _LAYER_FILE.format(batch, layer), lambda file: file.write(blob), sync=False)

    def finish_batch(self, batch: int, sequence_index: torch.Tensor, extra: dict[str, torch.Tensor]) -> None:
        """Mark the batch done, with its sequence indices and `extra` tensors (e.g. residual states)."""
        data = {f"extra.{name}": value.detach().contiguous() for name, value in extra.items()}
        blob = save(data | {"sequence_index": sequence_index.long().contiguous()})
        atomic_write(self._done_path(batch), lambda file: file.write(blob))

    def batches(self) -> list[int]:
        """The finished batches, in order."""
        return sorted(int(path.name[5:10]) for path in self.path.glob(_DONE_FILE.replace("{:05d}", "?" * 5)))

    def extra(self, name: str) -> list[torch.Tensor]:
        """The `extra` tensor `name` of every finished batch, in batch order."""
        return [load_file(self._done_path(batch))[f"extra.{name}"] for batch in self.batches()]

    def layers(self) -> list[int]:
        batches = self.batches()
        if not batches:
            return []
        pattern = _LAYER_FILE.format(batches[0], 0).replace("layer000", "layer???")
        return sorted(int(path.name.split(".layer")[1][:3]) for path in self.path.glob(pattern))

    def layer(self, layer: int) -> LayerCapture:
        """Layer `layer` of every finished batch, rows ordered by sequence index."""
        parts: dict[str, list[torch.Tensor]] = {"query": [], "keys": [], "log_z": [], "index": []}
        facts = None
        for batch in self.batches():
            path = self.path / _LAYER_FILE.format(batch, layer)
            with safe_open(str(path), framework="pt") as file:
                stored = json.loads(file.metadata()["facts"])
                batch_facts = CallFacts(**{**stored, "sink": None if stored["sink"] is None else tuple(stored["sink"])})
                if facts is not None and batch_facts != facts:
                    raise ValueError(f"layer {layer} computed differently in {path.name}: {batch_facts} vs {facts}")
                facts = batch_facts
                for name in ("query", "keys", "log_z"):
                    parts[name].append(file.get_tensor(name))
            parts["index"].append(load_file(self._done_path(batch))["sequence_index"])
        if facts is None:
            raise ValueError(f"no captured batches in {self.path}")
        order = torch.cat(parts["index"]).argsort()
        query, keys, log_z = (torch.cat(parts[name])[order] for name in ("query", "keys", "log_z"))
        return LayerCapture(layer=layer, facts=facts, query=query, keys=keys, log_z=log_z)
