"""Running one analysis (docs/architecture.md): forward passes with posleak's attention capture each layer's q, k
and log Z and the position-0 residual states (`_capture`) → one pass over each layer's logits measures it
(`_measure`; on the in-forward path during the last batch's forward, pipeline/capture_paths.py) → the typed result,
written to the run folder (pipeline/write.py). Every measured layer is kept in the run folder's `.partial/`, so an
interrupted run, rerun with the same arguments, resumes where it stopped; one process at a time holds the folder.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from posleak.capture import (
    AttentionCall,
    CaptureSession,
    QueryStats,
    ResidualCapture,
    closed_system,
    require_closed_system,
)
from posleak.capture.query_stats import QueryStatsResult
from posleak.capture.store import Captures, QKRecorder
from posleak.data.batches import TokenBatch, iter_batches
from posleak.device import sums_device
from posleak.errors import PosleakError
from posleak.measure import Decomposition, LayerResult, MeasureSpec
from posleak.measure.behaviour import next_token_scores, token_table
from posleak.models.facts import ModelFacts
from posleak.pipeline.capture_paths import (
    IN_FORWARD,
    InForwardMeasure,
    captures_for,
    freed_memory_kept,
    measure_spec,
    measured_layer,
    where_captures_wait,
)
from posleak.pipeline.prepare import PreparedRun
from posleak.pipeline.result import AnalysisResult
from posleak.pipeline.write import result_tables, run_manifest, write_run
from posleak.store import COMPLETE, RunFolder


def analyze_model(
    prepared: PreparedRun, out: Path | str | None = None, *, progress: bool = True, report: bool = True
) -> AnalysisResult:
    """Analyse the prepared run (`prepare`, `prepared_model`), into the run folder `out` if given (a finished one
    is read back, an unfinished one resumed).

    Two stages: forward passes that capture each layer's q, k and log Z (on the device during the last
    forward, or one file per batch, the run's checkpoint), then one pass over each layer's logits that
    measures it (one checkpoint per layer). `report=False` leaves the run folder without its figures and
    report.html (its tables and manifest are the same)."""
    if out is None:
        return _analyze(prepared, None, progress, report)
    run = RunFolder(Path(out))
    with run.claim(prepared.fingerprint()) as state:  # one process at a time
        if state == COMPLETE:
            return AnalysisResult.read(run)
        return _analyze(prepared, run, progress, report)


def _analyze(prepared: PreparedRun, run: RunFolder | None, progress: bool, report: bool) -> AnalysisResult:
    """Capture, measure, and build the result; with a run folder, write it there and mark it finished."""
    started = time.perf_counter()
    model, batch, options = prepared.model, prepared.batch, prepared.options
    kept = where_captures_wait(run, model, batch, options)
    with captures_for(run, kept) as captures:
        if kept == IN_FORWARD:
            sink_heads, spec, layers, measure_s = _capture_and_measure(prepared, captures, run, progress)
            forward_s = time.perf_counter() - started - measure_s
        else:
            sink_heads = _capture(prepared, captures, QKRecorder(captures), progress)
            forward_s = time.perf_counter() - started
            spec = measure_spec(batch, options.measure, {layer: captures.facts(layer) for layer in captures.layers()})
            layers = _measure(captures, spec, run, prepared.model_id, progress)
            measure_s = time.perf_counter() - started - forward_s
        where = {"device": str(sums_device(model.device)), "captures": kept}
        measured_layers = Decomposition.of(layers, spec, where)
        states = torch.cat(captures.extra("pos0"), dim=1)
        closed = closed_system(states, states[0])  # group by the vector at position 0 (after interventions)
        require_closed_system(closed)
        scores = [torch.cat(captures.extra(name)) for name in ("nll", "correct")] if options.measure.scores else None
    result = result_tables(measured_layers, states, closed)
    if scores is not None:
        result.tokens = token_table(*scores, batch.ids)
    timings = {"forward_s": forward_s, "measure_s": measure_s, "total_s": time.perf_counter() - started}
    timings = {name: round(seconds, 3) for name, seconds in timings.items()}
    result.manifest = run_manifest(prepared, measured_layers, closed, sink_heads, timings)
    if run is not None:
        write_run(run, result, report)
        run.finish(result.manifest)
        result.run = run
    return result


def _capture(
    prepared: PreparedRun,
    captures: Captures,
    recorder: QKRecorder,
    progress: bool,
    measurer: InForwardMeasure | None = None,
) -> dict[int, tuple[int, ...]] | None:
    """Run every batch not captured yet, `recorder` writing each layer's captures; returns the sink heads an
    `auto` ablation chose (else None). A `measurer` measures each layer during the last batch's forward."""
    model, batch, options, tokenizer = prepared.model, prepared.batch, prepared.options, prepared.tokenizer
    interventions, batch_size = options.interventions, options.execution.batch_size
    sink_heads = sink_heads_of(model, batch, batch_size) if interventions.needs_sink_heads else None
    chunks = list(iter_batches(batch, batch_size))
    todo = [index for index in range(len(chunks)) if not captures.has(index)]
    if not todo:
        return sink_heads
    bar = tqdm(
        total=len(chunks),
        initial=len(chunks) - len(todo),
        desc=f"forward {prepared.model_id}",
        unit="batch",
        disable=not progress,
    )
    layers = ModelFacts.from_config(model.config).layers
    accumulators = [recorder, *([measurer] if measurer is not None else []), LayerProgress(bar, layers)]
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
            _check_finite(pos0, prepared.model_id)
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
    with bar as layers, freed_memory_kept():
        for layer in layers:
            state = run.load_partial(f"layer{layer}") if run is not None else None
            results.append(
                measured_layer(captures.layer(layer), spec, run)
                if state is None
                else LayerResult.from_state(state, spec)
            )
    return results


def _capture_and_measure(
    prepared: PreparedRun, captures: Captures, run: RunFolder | None, progress: bool
) -> tuple[dict[int, tuple[int, ...]] | None, MeasureSpec, list[LayerResult], float]:
    """The in-forward path, from captures that never leave the device: the sink heads, the spec, the layers in
    order and the seconds spent measuring. Layers measured before a kill are read back, neither kept nor
    measured again. With one batch, every layer's window (the spec's range "beyond") is known only once its
    forward has passed the last layer, so each layer is measured right after that forward instead of during it."""
    layers = ModelFacts.from_config(prepared.model.config).layers
    saved = {layer: run.load_partial(f"layer{layer}") if run is not None else None for layer in range(layers)}
    saved = {layer: state for layer, state in saved.items() if state is not None}
    measurer = InForwardMeasure(captures, prepared.batch, prepared.options.measure, run, saved)
    sink_heads = _capture(prepared, captures, measurer.recorder, progress, measurer)
    spec = measurer.spec or measure_spec(prepared.batch, prepared.options.measure, measurer.facts)
    results = {layer: LayerResult.from_state(state, spec) for layer, state in measurer.saved.items()}
    results |= measurer.results
    started = time.perf_counter()
    with freed_memory_kept():
        for layer in sorted(set(measurer.facts) - set(results)):  # one batch: measured after its forward
            results[layer] = measured_layer(captures.layer(layer), spec, run)
            captures.drop_layer(layer)
    seconds = measurer.seconds + time.perf_counter() - started
    return sink_heads, spec, [results[layer] for layer in sorted(results)], seconds


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
