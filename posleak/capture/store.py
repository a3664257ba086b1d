"""Captured queries and keys: what the decomposition needs of each attention call, kept on disk or in memory.

The magnitudes of docs/method.md are sums over single (query, offset) pairs of quantities averaged over
sequences, so their squares need every pair of sequences at once (a Gram matrix of their logits). The
forward passes therefore keep each layer's post-RoPE queries, the distinct keys (no GQA repeat) and
log Z_i exactly as the model computed them, and the measurement (posleak.measure.layer_sums) takes
them up layer by layer after the last batch.

`QKRecorder` is the accumulator that writes them to a `CaptureFolder` as the forward reaches each layer
(one file per batch and layer, then one that marks the batch done: the files are also the checkpoint of an
interrupted run); `CaptureFolder.layer` reads one layer of every batch back in sequence order. Memory grows
with T: one layer's tensors of one batch during the forwards, one layer of all sequences when measuring.
`CaptureMemory` keeps the same records in memory: on the CPU, or (`on_host=False`) on the device where q and k
were made, so that a layer can be measured there during the last batch's forward (`layer(..., in_flight=...)`)
and then freed (`drop_layer`), with nothing copied to the host.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from posleak.capture.masks import MaskSpec
from posleak.capture.session import AttentionCall
from posleak.store import atomic_write
from posleak.store.jsonfile import dumps

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

    def __init__(self, folder: Captures, skip: frozenset[int] = frozenset()) -> None:
        self.folder = folder
        self.batch: int | None = None
        self.facts: dict[int, CallFacts] = {}
        self.skip = skip  # layers whose captures are not needed (measured before a resume)

    def update(self, call: AttentionCall) -> None:
        if self.batch is None:
            raise ValueError("QKRecorder.batch is not set: say which batch the forward belongs to")
        facts = CallFacts.of(call)
        if self.facts.setdefault(call.layer, facts) != facts:
            raise ValueError(f"layer {call.layer} changed its attention from {self.facts[call.layer]} to {facts}")
        if call.layer in self.skip:
            return
        log_z = torch.zeros_like(call.log_z) if call.norm == "sigmoid" else call.log_z
        # float32 whatever the model's dtype: exact for half-precision q and k, and what the measurement
        # (float64, docs/method.md §4) reads; on the CPU unless the captures stay where they were made.
        tensors = {
            name: tensor.detach().to("cpu" if self.folder.on_host else tensor.device, torch.float32)
            for name, tensor in (("query", call.query), ("keys", call.distinct_keys), ("log_z", log_z))
        }
        self.folder.write_layer(self.batch, call.layer, tensors, facts)


class Captures(ABC):
    """Where the forwards leave each batch's captures: per batch, each layer's q, keys and log Z with the call's
    facts, then a closing record (sequence indices, extra tensors) that marks the batch done. Subclasses store
    them; reading them back per layer, in sequence order, is shared."""

    on_host = True  # whether the recorder copies the tensors to the CPU before they are written here

    def has(self, batch: int) -> bool:
        return batch in self.batches()

    @abstractmethod
    def write_layer(self, batch: int, layer: int, tensors: dict[str, torch.Tensor], facts: CallFacts) -> None: ...

    @abstractmethod
    def finish_batch(self, batch: int, sequence_index: torch.Tensor, extra: dict[str, torch.Tensor]) -> None:
        """Mark the batch done, with its sequence indices and `extra` tensors (e.g. residual states)."""

    @abstractmethod
    def batches(self) -> list[int]:
        """The finished batches, in order."""

    @abstractmethod
    def layers(self) -> list[int]: ...

    @abstractmethod
    def _layer_part(self, batch: int, layer: int) -> tuple[dict[str, torch.Tensor], CallFacts]: ...

    @abstractmethod
    def _closing(self, batch: int) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def drop_layer(self, layer: int) -> None:
        """Free layer `layer` of every batch, measured: nothing reads it again."""

    def extra(self, name: str) -> list[torch.Tensor]:
        """The `extra` tensor `name` of every finished batch, in batch order."""
        return [self._closing(batch)[f"extra.{name}"] for batch in self.batches()]

    def facts(self, layer: int) -> CallFacts:
        """How layer `layer` computed its attention (from the first finished batch)."""
        return self._layer_part(self.batches()[0], layer)[1]

    def layer(self, layer: int, in_flight: tuple[int, torch.Tensor] | None = None) -> LayerCapture:
        """Layer `layer` of every finished batch, rows ordered by sequence index; `in_flight`: (batch, sequence
        indices) of a batch whose forward has written this layer but is not finished, taken as well."""
        parts: dict[str, list[torch.Tensor]] = {"query": [], "keys": [], "log_z": [], "index": []}
        facts = None
        batches = [(batch, self._closing(batch)["sequence_index"]) for batch in self.batches()]
        for batch, index in [*batches, *([in_flight] if in_flight is not None else [])]:
            tensors, batch_facts = self._layer_part(batch, layer)
            if facts is not None and batch_facts != facts:
                raise ValueError(f"layer {layer} computed differently in batch {batch}: {batch_facts} vs {facts}")
            facts = batch_facts
            for name in ("query", "keys", "log_z"):
                parts[name].append(tensors[name])
            parts["index"].append(index)
        if facts is None:
            raise ValueError("no captured batches")
        order = torch.cat(parts["index"]).argsort()
        query, keys, log_z = (torch.cat(parts[name]) for name in ("query", "keys", "log_z"))
        if not torch.equal(order, torch.arange(len(order))):  # batches in input order need no second copy
            query, keys, log_z = query[order], keys[order], log_z[order]
        return LayerCapture(layer=layer, facts=facts, query=query, keys=keys, log_z=log_z)


class CaptureFolder(Captures):
    """On disk: per batch one safetensors file per layer (the facts as metadata) and, written last, the closing
    file. Every file is written atomically, so a killed run leaves whole files only, and the files are the
    checkpoint of an interrupted run."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _done_path(self, batch: int) -> Path:
        return self.path / _DONE_FILE.format(batch)

    def has(self, batch: int) -> bool:
        return self._done_path(batch).exists()

    def write_layer(self, batch: int, layer: int, tensors: dict[str, torch.Tensor], facts: CallFacts) -> None:
        data = {name: value.detach().contiguous() for name, value in tensors.items()}
        blob = save(data, metadata={"facts": dumps(asdict(facts))})
        # not synced: a batch counts as done only once its closing file (synced) exists, and a power cut that
        # loses layer files costs recomputing that batch, while a sync per layer costs seconds per run
        atomic_write(self.path / _LAYER_FILE.format(batch, layer), lambda file: file.write(blob), sync=False)

    def finish_batch(self, batch: int, sequence_index: torch.Tensor, extra: dict[str, torch.Tensor]) -> None:
        data = {f"extra.{name}": value.detach().contiguous() for name, value in extra.items()}
        blob = save(data | {"sequence_index": sequence_index.long().contiguous()})
        atomic_write(self._done_path(batch), lambda file: file.write(blob))

    def batches(self) -> list[int]:
        return sorted(int(path.name[5:10]) for path in self.path.glob(_DONE_FILE.replace("{:05d}", "?" * 5)))

    def _layer_part(self, batch: int, layer: int) -> tuple[dict[str, torch.Tensor], CallFacts]:
        with safe_open(str(self.path / _LAYER_FILE.format(batch, layer)), framework="pt") as file:
            return {name: file.get_tensor(name) for name in file.keys()}, _facts(file.metadata())

    def _closing(self, batch: int) -> dict[str, torch.Tensor]:
        return load_file(self._done_path(batch))

    def drop_layer(self, layer: int) -> None:
        """Nothing: the files stay, the checkpoint of an interrupted run, until the run finishes."""

    def layers(self) -> list[int]:
        batches = self.batches()
        if not batches:
            return []
        pattern = _LAYER_FILE.format(batches[0], 0).replace("layer000", "layer???")
        return sorted(int(path.name.split(".layer")[1][:3]) for path in self.path.glob(pattern))


class CaptureMemory(Captures):
    """In memory: the same records, no disk. `on_host=False` keeps them on the device where q and k were made
    (the in-forward path of posleak.pipeline.run); a measured layer is freed with `drop_layer`."""

    def __init__(self, on_host: bool = True) -> None:
        self.on_host = on_host
        self._layers: dict[int, dict[int, tuple[dict[str, torch.Tensor], CallFacts]]] = {}
        self._done: dict[int, dict[str, torch.Tensor]] = {}

    def write_layer(self, batch: int, layer: int, tensors: dict[str, torch.Tensor], facts: CallFacts) -> None:
        kept = {name: value.detach().clone(memory_format=torch.contiguous_format) for name, value in tensors.items()}
        self._layers.setdefault(batch, {})[layer] = kept, facts

    def finish_batch(self, batch: int, sequence_index: torch.Tensor, extra: dict[str, torch.Tensor]) -> None:
        self._done[batch] = {f"extra.{name}": value.detach().clone() for name, value in extra.items()} | {
            "sequence_index": sequence_index.long().clone()
        }

    def batches(self) -> list[int]:
        return sorted(self._done)

    def _layer_part(self, batch: int, layer: int) -> tuple[dict[str, torch.Tensor], CallFacts]:
        return self._layers[batch][layer]

    def _closing(self, batch: int) -> dict[str, torch.Tensor]:
        return self._done[batch]

    def layers(self) -> list[int]:
        batches = self.batches()
        return sorted(self._layers.get(batches[0], {})) if batches else []

    def drop_layer(self, layer: int) -> None:
        for kept in self._layers.values():
            kept.pop(layer, None)


def _facts(metadata: dict[str, str]) -> CallFacts:
    stored = json.loads(metadata["facts"])
    return CallFacts(**{**stored, "sink": None if stored["sink"] is None else tuple(stored["sink"])})
