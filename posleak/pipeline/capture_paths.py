"""The capture paths: where one analysis's captures wait for their measurement, behind the `Captures` interface
(capture/store.py). On the model's device, each layer measured during the last batch's forward as soon as its q
and k are captured ("in-forward", `InForwardMeasure`), when they fit the measure budget
(Execution.measure_budget); else every finished batch kept in the run folder (the run's checkpoint) or, without a
run folder, in CPU memory. Each measured layer is kept in the run folder's `.partial/` for a resume, wherever it
was measured.
"""

from __future__ import annotations

import ctypes
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from transformers import PreTrainedModel

from posleak.capture import AttentionCall
from posleak.capture.store import CallFacts, CaptureFolder, CaptureMemory, Captures, LayerCapture, QKRecorder
from posleak.data.batches import TokenBatch
from posleak.device import CPU_BUDGET_BYTES, measure_budget
from posleak.measure import LayerResult, MeasureSpec, measure_layer, resampling_units
from posleak.models.facts import ModelFacts
from posleak.pipeline.config import AnalysisOptions, MeasureOptions
from posleak.store import RunFolder

# How the captures waited for the measurement, in the manifest: this, "memory" (the CPU's) or "folder".
IN_FORWARD = "in-forward"
# glibc's largest dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX): see freed_memory_kept
_MMAP_CEILING = 32 << 20


def where_captures_wait(
    run: RunFolder | None, model: PreTrainedModel, batch: TokenBatch, options: AnalysisOptions
) -> str:
    """IN_FORWARD when the captures of every layer fit the measure budget of the model's device, unless the run
    folder holds captured batches of an earlier try (the captured path resumes from them); else "folder" (the
    run folder's, or a temporary one) or "memory" (the CPU's, without a run folder, up to CPU_BUDGET_BYTES)."""
    folder = run.partial_dir / "captures" if run is not None else None
    captured_before = folder is not None and folder.is_dir() and bool(CaptureFolder(folder).batches())
    # a model spread over devices by a device map fills them: on the in-forward path only with a budget given
    spread = len({str(where) for where in (getattr(model, "hf_device_map", None) or {}).values()}) > 1
    spec = options.execution.measure_budget
    budget = 0 if spread and spec == "auto" else measure_budget(spec, model.device, run_folder=run is not None)
    size = capture_bytes(model, batch)
    if not captured_before and size <= budget:
        return IN_FORWARD
    return "memory" if run is None and size <= CPU_BUDGET_BYTES else "folder"


@contextmanager
def captures_for(run: RunFolder | None, kept: str) -> Iterator[Captures]:
    """On the in-forward path, memory on the device where q and k are made; else the run's own capture folder
    (kept for a resume until the run finishes), or without a run folder CPU memory or a temporary folder."""
    if kept != "folder":
        yield CaptureMemory(on_host=kept == "memory")
        return
    if run is not None:
        yield CaptureFolder(run.partial_dir / "captures")
        return
    with tempfile.TemporaryDirectory(prefix="posleak-captures-") as folder:
        yield CaptureFolder(Path(folder))


def capture_bytes(model: PreTrainedModel, batch: TokenBatch) -> int:
    """What the captures of `batch` take: per layer and sequence, q, distinct keys and log Z in float32."""
    facts = ModelFacts.from_config(model.config)
    per_layer = batch.num_seqs * batch.seq_len * ((facts.heads + facts.kv_heads) * facts.head_dim + facts.heads) * 4
    return per_layer * facts.layers


def measure_spec(batch: TokenBatch, options: MeasureOptions, facts: dict[int, CallFacts]) -> MeasureSpec:
    """What the layers are measured with, given every layer's captured `facts` (the range "beyond" starts at the
    least window, or where the options put it)."""
    windows = [layer.window for layer in facts.values() if layer.window]
    return MeasureSpec(
        batch.seq_len,
        batch.num_seqs,
        options.tables_grid(batch.seq_len),
        early=options.early,
        resamples=options.bootstrap,
        seed=options.seed,
        beyond=options.beyond or min(windows, default=None),
        units=resampling_units(batch.documents),
    )


def measured_layer(capture: LayerCapture, spec: MeasureSpec, run: RunFolder | None) -> LayerResult:
    """One layer measured, and kept in the run folder for a resume."""
    result = measure_layer(capture, spec)
    if run is not None:
        run.save_partial(f"layer{capture.layer}", result.state())
    return result


class InForwardMeasure:
    """The recorder of the in-forward path and an accumulator after it: once `during` names the last batch,
    measures each layer as soon as that batch's q and k of it are captured, on their device, keeps it for a
    resume and frees its captures. `saved`: the states of layers measured before a resume (neither captured nor
    measured again); `results`: those measured here."""

    needs_attended_keys = False

    def __init__(
        self,
        captures: Captures,
        batch: TokenBatch,
        options: MeasureOptions,
        run: RunFolder | None,
        saved: dict[int, dict[str, torch.Tensor]],
    ) -> None:
        self.captures, self.batch, self.options, self.run, self.saved = captures, batch, options, run, saved
        self.recorder = QKRecorder(captures, skip=frozenset(saved))
        self.spec: MeasureSpec | None = None
        self.in_flight: tuple[int, torch.Tensor] | None = None
        self.results: dict[int, LayerResult] = {}
        self.seconds = 0.0

    @property
    def facts(self) -> dict[int, CallFacts]:
        """Every layer's attention facts, as the recorder saw them."""
        return self.recorder.facts

    def during(self, batch: int, sequence_index: torch.Tensor, todo: list[int]) -> AbstractContextManager[None]:
        """What the forward of `batch` runs in: for the last of several batches (an earlier one has shown every
        layer's facts, the spec's windows), measuring each layer with freed memory kept for the next."""
        if batch != todo[-1] or len(todo) < 2:
            return nullcontext()
        self.spec = measure_spec(self.batch, self.options, self.facts)
        self.in_flight = batch, sequence_index
        return freed_memory_kept()

    def update(self, call: AttentionCall) -> None:
        if self.in_flight is None or self.spec is None or call.layer in self.saved:
            return
        started = time.perf_counter()
        capture = self.captures.layer(call.layer, in_flight=self.in_flight)
        self.captures.drop_layer(call.layer)
        self.results[call.layer] = measured_layer(capture, self.spec, self.run)
        self.seconds += time.perf_counter() - started


@contextmanager
def freed_memory_kept() -> Iterator[None]:
    """Let glibc keep freed memory in the heap for reuse while the layers are measured. Each layer allocates
    and frees the same large temporaries; handed back to the system, they fault in page by page again for the
    next layer, a quarter of the measurement's time. Elsewhere than glibc this does nothing.

    glibc cannot go back to its dynamic thresholds once they are set (its first default, 128 KB, rises to the
    size of each mapped block freed, up to 32 MB, with the trim threshold at twice that). Pinned at 128 KB they
    would map every later block over 128 KB afresh: the forwards of a later analysis in the same process took
    18 to 19 s instead of 16 to 17 s (smollm2-135m, T = 2048, N = 4). So afterwards they stay where the
    dynamic ones end in a process that frees large blocks: 32 MB and 64 MB."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        yield
        return
    trim, mmap = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
    # Blocks up to 32 MB come from the heap and stay there; larger ones are mapped and handed back, so that
    # what the heap keeps cannot fragment into more than the largest layer's temporaries (T = 8192: a heap
    # that kept everything grew by 35 MB a layer, 1 GB over smollm2's 30 layers)
    mallopt(mmap, _MMAP_CEILING)
    mallopt(trim, 256 << 20)
    try:
        yield
    finally:
        mallopt(trim, 2 * _MMAP_CEILING)
