"""Running one analysis: forward passes with posleak's attention, capturing each layer's q, k and log Z
(capture/store.py) and the position-0 residual states → one pass over each layer's logits that measures it
(measure/decomposition.py) → the typed result, written to the run folder (pipeline/write.py). When the
captures fit the measure budget (Execution.measure_budget) they stay on the model's device and each layer
is measured during the last batch's forward ("in-forward"); else every finished batch is kept on disk (or in
CPU memory). Every measured layer is kept in the run folder's `.partial/`, so an interrupted run, rerun with
the same arguments, resumes where it stopped; one process at a time holds the folder.
"""

from __future__ import annotations

import ctypes
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posleak.capture import (
    AttentionCall,
    CaptureSession,
    QueryStats,
    ResidualCapture,
    closed_system,
    require_closed_system,
)
from posleak.capture.query_stats import QueryStatsResult
from posleak.capture.store import CallFacts, CaptureFolder, CaptureMemory, Captures, LayerCapture, QKRecorder
from posleak.data.batches import TokenBatch, iter_batches
from posleak.data.recipe import Recipe
from posleak.device import CPU_BUDGET_BYTES, measure_budget, sums_device
from posleak.errors import BadInput, PosleakError
from posleak.measure import Decomposition, LayerResult, MeasureSpec, measure_layer, resampling_units
from posleak.measure.behaviour import next_token_scores, token_table
from posleak.models.facts import ModelFacts
from posleak.models.load import LoadedModel
from posleak.pipeline.config import AnalysisOptions, MeasureOptions
from posleak.pipeline.prepare import run_args
from posleak.pipeline.result import AnalysisResult
from posleak.pipeline.write import result_tables, run_manifest, write_run
from posleak.store import COMPLETE, RunFolder

# How the captures waited for the measurement, in the manifest: this, "memory" (the CPU's) or "folder".
IN_FORWARD = "in-forward"
# glibc's largest dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX): see _freed_memory_kept
_MMAP_CEILING = 32 << 20


def analyze_model(
    model: PreTrainedModel,
    batch: TokenBatch,
    options: AnalysisOptions,
    *,
    recipe: Recipe | None = None,
    out: Path | str | None = None,
    loaded: LoadedModel | None = None,
    model_id: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = True,
    report: bool = True,
) -> AnalysisResult:
    """Analyse `batch` on `model` (already switched to posleak attention).

    Two stages: forward passes that capture each layer's q, k and log Z (on the device during the last
    forward, or one file per batch, the run's checkpoint), then one pass over each layer's logits that
    measures it (one checkpoint per layer).
    `loaded` supplies provenance for a checkpoint (its id and file hash); a lab model passes `model_id`. The
    `recipe` that made the sequences, where a command made them, is part of the run folder's fingerprint.
    `report=False` leaves the run folder without its figures and report.html (its tables and manifest are the same).
    """
    tokenizer = loaded.tokenizer if loaded is not None else tokenizer
    model_id = loaded.name if loaded is not None else (model_id or type(model).__name__)
    # Any N: with one sequence the noise-corrected magnitudes are NaN (docs/method.md §3); the commands,
    # `analyze` and `intervene`, refuse that before loading anything.
    if problems := options.measure.problems(batch.seq_len, None) + options.execution.problems():
        raise BadInput(problems)
    if out is None:
        return _analyze(model, batch, options, None, loaded, model_id, tokenizer, progress, report)
    run = RunFolder(Path(out))
    identity = recipe.identity() | options.identity() if recipe is not None else options.identity()
    with run.claim(run_args(model_id, loaded, batch, identity)) as state:  # one process at a time
        if state == COMPLETE:
            return AnalysisResult.read(run)
        return _analyze(model, batch, options, run, loaded, model_id, tokenizer, progress, report)


def _analyze(
    model: PreTrainedModel,
    batch: TokenBatch,
    options: AnalysisOptions,
    run: RunFolder | None,
    loaded: LoadedModel | None,
    model_id: str,
    tokenizer: PreTrainedTokenizerBase | None,
    progress: bool,
    report: bool = True,
) -> AnalysisResult:
    """Capture, measure, and build the result; with a run folder, write it there and mark it finished."""
    started = time.perf_counter()
    kept = _where_captures_wait(run, model, batch, options)
    with _captures(run, model, batch, kept) as captures:
        if kept == IN_FORWARD:
            sink_heads, spec, layers, measure_s = _capture_and_measure(
                model, batch, options, captures, tokenizer, model_id, run, progress
            )
            forward_s = time.perf_counter() - started - measure_s
        else:
            sink_heads = _capture(model, batch, options, captures, tokenizer, model_id, progress)
            forward_s = time.perf_counter() - started
            windows = [captures.facts(layer).window for layer in captures.layers()]
            spec = _measure_spec(batch, options.measure, windows)
            layers = _measure(captures, spec, run, model_id, progress)
            measure_s = time.perf_counter() - started - forward_s
        where = {"device": str(sums_device(model.device)), "captures": kept}
        measured = Decomposition.of(layers, spec, where)
        states = torch.cat(captures.extra("pos0"), dim=1)
        closed = closed_system(states, states[0])  # group by the vector at position 0 (after interventions)
        require_closed_system(closed)
        scores = [torch.cat(captures.extra(name)) for name in ("nll", "correct")] if options.measure.scores else None
    result = result_tables(measured, states, closed)
    if scores is not None:
        result.tokens = token_table(*scores, batch.ids)
    timings = {"forward_s": forward_s, "measure_s": measure_s, "total_s": time.perf_counter() - started}
    timings = {name: round(seconds, 3) for name, seconds in timings.items()}
    manifest = run_manifest(model, model_id, loaded, batch, options, tokenizer, measured, closed, sink_heads, timings)
    result.manifest = manifest
    if run is not None:
        write_run(run, result, report)
        run.finish(manifest)
        result.run = run
    return result


def _measure_spec(batch: TokenBatch, options: MeasureOptions, windows: list[int | None]) -> MeasureSpec:
    """What the layers are measured with; `windows`: every layer's (the range "beyond" starts at the least, or
    where the options put it)."""
    return MeasureSpec(
        batch.seq_len,
        batch.num_seqs,
        options.tables_grid(batch.seq_len),
        early=options.early,
        resamples=options.bootstrap,
        seed=options.seed,
        beyond=options.beyond or min((window for window in windows if window), default=None),
        units=resampling_units(batch.documents),
    )


def _where_captures_wait(
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
def _captures(run: RunFolder | None, model: PreTrainedModel, batch: TokenBatch, kept: str) -> Iterator[Captures]:
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


def _capture(
    model: PreTrainedModel,
    batch: TokenBatch,
    options: AnalysisOptions,
    captures: Captures,
    tokenizer: PreTrainedTokenizerBase | None,
    model_id: str,
    progress: bool,
    measurer: InForwardMeasure | None = None,
) -> dict[int, tuple[int, ...]] | None:
    """Run every batch not captured yet; returns the sink heads an `auto` ablation chose (else None). A
    `measurer` measures each layer during the last batch's forward (its layers measured before are not kept)."""
    interventions, batch_size = options.interventions, options.execution.batch_size
    sink_heads = sink_heads_of(model, batch, batch_size) if interventions.needs_sink_heads else None
    chunks = list(iter_batches(batch, batch_size))
    todo = [index for index in range(len(chunks)) if not captures.has(index)]
    if not todo:
        return sink_heads
    bar = tqdm(
        total=len(chunks),
        initial=len(chunks) - len(todo),
        desc=f"forward {model_id}",
        unit="batch",
        disable=not progress,
    )
    recorder = QKRecorder(captures)
    layers = ModelFacts.from_config(model.config).layers
    accumulators = [recorder, *([measurer] if measurer is not None else []), LayerProgress(bar, layers)]
    if measurer is not None:
        measurer.facts, recorder.skip = recorder.facts, frozenset(measurer.saved)
    session = CaptureSession(accumulators, edits=interventions.attention_edits(sink_heads, model, tokenizer))
    # the bar as a context: closed (its line ended) before an error is printed below it
    with bar, interventions.applied(model, tokenizer, bos_at_0=batch.bos_id is not None):
        for index in todo:
            seq_index, ids = chunks[index]
            recorder.batch = index
            measuring = measurer.during(index, seq_index, todo) if measurer is not None else nullcontext()
            with ResidualCapture(model, positions=[0]) as residual, measuring:
                output = session.forward(model, ids, seq_index)
            pos0 = residual.states()[:, :, 0]
            _check_finite(pos0, model_id)
            extra = {"pos0": pos0}
            if options.measure.scores:
                # the model's own predictions from this same forward (interventions included): no second pass
                extra["nll"], extra["correct"] = next_token_scores(model, output.last_hidden_state, ids)
            captures.finish_batch(index, seq_index, extra)
            bar.update(1)
    return sink_heads


def _measure(
    captures: Captures, spec: MeasureSpec, run: RunFolder | None, model_id: str, progress: bool
) -> list[LayerResult]:
    """Measure every layer from its captures; each finished layer is kept for a resume."""
    results = []
    bar = tqdm(captures.layers(), desc=f"measure {model_id}", unit="layer", disable=not progress)
    with bar as layers, _freed_memory_kept():
        for layer in layers:
            state = run.load_partial(f"layer{layer}") if run is not None else None
            if state is None:
                result = _measured(captures.layer(layer), spec, run)
            else:
                result = LayerResult.from_state(state, spec)
            results.append(result)
    return results


def _measured(capture: LayerCapture, spec: MeasureSpec, run: RunFolder | None) -> LayerResult:
    """One layer measured, and kept in the run folder for a resume."""
    result = measure_layer(capture, spec)
    if run is not None:
        run.save_partial(f"layer{capture.layer}", result.state())
    return result


def _capture_and_measure(
    model: PreTrainedModel,
    batch: TokenBatch,
    options: AnalysisOptions,
    captures: Captures,
    tokenizer: PreTrainedTokenizerBase | None,
    model_id: str,
    run: RunFolder | None,
    progress: bool,
) -> tuple[dict[int, tuple[int, ...]] | None, MeasureSpec, list[LayerResult], float]:
    """The in-forward path, from captures that never leave the device: the sink heads, the spec, the layers in
    order and the seconds spent measuring. Layers measured before a kill are read back, neither kept nor
    measured again. With one batch, every layer's window (the spec's range "beyond") is known only once its
    forward has passed the last layer, so each layer is measured right after that forward instead of during it."""
    layers = ModelFacts.from_config(model.config).layers
    saved = {layer: run.load_partial(f"layer{layer}") if run is not None else None for layer in range(layers)}
    measurer = InForwardMeasure(
        captures, batch, options.measure, run, {k: v for k, v in saved.items() if v is not None}
    )
    sink_heads = _capture(model, batch, options, captures, tokenizer, model_id, progress, measurer)
    spec = measurer.spec or _measure_spec(batch, options.measure, [facts.window for facts in measurer.facts.values()])
    results = {layer: LayerResult.from_state(state, spec) for layer, state in measurer.saved.items()}
    results |= measurer.results
    started = time.perf_counter()
    with _freed_memory_kept():
        for layer in sorted(set(measurer.facts) - set(results)):  # one batch: measured after its forward
            results[layer] = _measured(captures.layer(layer), spec, run)
            captures.drop_layer(layer)
    seconds = measurer.seconds + time.perf_counter() - started
    return sink_heads, spec, [results[layer] for layer in sorted(results)], seconds


class InForwardMeasure:
    """An accumulator, after the QKRecorder: once `begin` names the last batch, measures each layer as soon as
    that batch's q and k of it are captured, on their device, keeps it for a resume and frees its captures.
    `saved`: the states of layers measured before a resume (not measured again); `results`: those measured."""

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
        self.facts: dict[int, CallFacts] = {}  # every layer's, the QKRecorder's (set by _capture)
        self.spec: MeasureSpec | None = None
        self.in_flight: tuple[int, torch.Tensor] | None = None
        self.results: dict[int, LayerResult] = {}
        self.seconds = 0.0

    def during(self, batch: int, sequence_index: torch.Tensor, todo: list[int]) -> AbstractContextManager[None]:
        """What the forward of `batch` runs in: for the last of several batches (an earlier one has shown every
        layer's facts, the spec's windows), measuring each layer with freed memory kept for the next."""
        if batch != todo[-1] or len(todo) < 2:
            return nullcontext()
        self.spec = _measure_spec(self.batch, self.options, [facts.window for facts in self.facts.values()])
        self.in_flight = batch, sequence_index
        return _freed_memory_kept()

    def update(self, call: AttentionCall) -> None:
        if self.in_flight is None or self.spec is None or call.layer in self.saved:
            return
        started = time.perf_counter()
        capture = self.captures.layer(call.layer, in_flight=self.in_flight)
        self.captures.drop_layer(call.layer)
        self.results[call.layer] = _measured(capture, self.spec, self.run)
        self.seconds += time.perf_counter() - started


@contextmanager
def _freed_memory_kept() -> Iterator[None]:
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


class LayerProgress:
    """An accumulator that only shows, on the batch bar, which layer the forward has reached."""

    needs_attended_keys = False

    def __init__(self, bar: tqdm, layers: int) -> None:
        self.bar, self.layers = bar, layers

    def update(self, call: AttentionCall) -> None:
        self.bar.set_postfix_str(f"layer {call.layer + 1}/{self.layers}", refresh=True)


def _check_finite(states: torch.Tensor, model_id: str) -> None:
    if not torch.isfinite(states).all():
        layer = int((~torch.isfinite(states)).flatten(1).any(1).nonzero()[0])
        raise PosleakError(f"{model_id}: NaN or Inf in the activations at resid[{layer}]; check the dtype and weights")


def sink_heads_of(model: PreTrainedModel, batch: TokenBatch, batch_size: int) -> dict[int, tuple[int, ...]]:
    """Heads with α_0 > ε on these sequences without any intervention (for a head list `auto`)."""
    return attention_stats(model, batch, batch_size).sink_heads_by_layer()


def attention_stats(
    model: PreTrainedModel, batch: TokenBatch, batch_size: int, *, desc: str | None = None, progress: bool = False
) -> QueryStatsResult:
    """Sink scores and rates of `batch` on `model` as it is (no capture kept); `desc`: the label of a batch bar."""
    stats = QueryStats(entropy=False)
    session = CaptureSession([stats])
    chunks = list(iter_batches(batch, batch_size))
    for seq_index, ids in tqdm(chunks, desc=desc, unit="batch", disable=not progress):
        session.forward(model, ids, seq_index)
    return stats.result()
