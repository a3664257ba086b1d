"""`posleak analyze`: one model, one set of sequences, the measurements of docs/method.md, one run folder.

The flow in one function: sequences → forward passes with posleak's attention, capturing each layer's q,
k and log Z (capture/store.py) and the position-0 residual states → one pass over each layer's logits that
measures it (measure/decomposition.py) → tables, figures, report, manifest. Before any of it, `analyze`
checks every option against the model and the output folder (`checked_input`) and refuses all problems
at once. Every finished batch and every measured layer is kept in the run folder's `.partial/`, so an
interrupted run, rerun with the same arguments, resumes where it stopped; one process at a time holds
the folder.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
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
from posleak.capture.residual import ClosedSystemReport
from posleak.capture.store import CaptureFolder, CaptureMemory, Captures, QKRecorder
from posleak.data.batches import BOS_POLICIES, TokenBatch, iter_batches, load_token_file, make_sequences, shape_problems
from posleak.data.corpus import load_corpus
from posleak.device import Placement
from posleak.errors import BadInput, PosleakError
from posleak.intervene import Interventions
from posleak.measure import LAYER_MAGNITUDES, Decomposition, Grid, LayerResult, MeasureSpec, measure_layer
from posleak.measure.behaviour import next_token_scores, token_table
from posleak.measure.position0 import fingerprint_constancy
from posleak.models.load import LoadedModel, load_model
from posleak.report import figures
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.store import COMPLETE, RunFolder, TokenCount, provenance
from posleak.validate import Problems, out_folder_problems

# Without a run folder (nothing to resume), captures up to this size stay in memory instead of a temporary folder.
MEMORY_CAPTURES_BYTES = 1 << 30
# Profile tables on the exact grid grow as T²·heads·layers rows: refused beyond this length.
EXACT_TABLES_UP_TO = 256
# The noise correction compares two halves of the sequences and the bootstrap resamples them.
MIN_SEQS = 2
MAX_RESAMPLES = 100_000  # percentile intervals settle long before; each resample holds N weights in memory
SEEDS = 2**32
# glibc's largest dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX): see _freed_memory_kept
_MMAP_CEILING = 32 << 20


@dataclass(frozen=True)
class AnalyzeConfig:
    """What determines an analysis run (and its resume fingerprint), besides the model."""

    seq_len: int = 256
    num_seqs: int = 16
    batch_size: int = 4
    bos: str = "auto"
    corpus: str = "stdlib"
    tokens: str | None = None  # a .npy file of token ids (N×T), taken verbatim instead of the corpus
    cross_documents: bool = False
    grid: str = "coarse"
    early: int = 32
    seed: int = 0
    bootstrap: int = 200
    interventions: Interventions = field(default_factory=Interventions)
    # Where the model runs (posleak.device): the dtype changes the model's q, k and log Z, so it is part of the
    # resume fingerprint like every option; the sums stay float64 on the CPU whatever these say.
    device: str = Placement.device
    dtype: str = Placement.dtype
    device_map: str | None = Placement.device_map
    max_memory: str | None = Placement.max_memory

    @property
    def placement(self) -> Placement:
        return Placement(self.device, self.dtype, self.device_map, self.max_memory)

    def problems(self, seq_len: int, num_seqs: int | None) -> list[str]:
        """What is wrong with these options for `num_seqs` sequences (None: any number) of `seq_len` tokens,
        before any model is asked (the interventions are checked on their own, `Interventions.problems`)."""
        found = []
        if num_seqs is not None and num_seqs < MIN_SEQS:
            found.append(
                f"{num_seqs} sequence(s) are too few: the noise correction of the residual-stream magnitude "
                f"compares two halves of the sequences and its intervals resample them, so both need at least "
                f"{MIN_SEQS}; use --num-seqs {MIN_SEQS} or more (or {MIN_SEQS}+ rows in a token file)"
            )
        if self.batch_size < 1:
            found.append(f"--batch-size {self.batch_size} is below 1; use a batch size of at least 1")
        if self.early < 2:
            found.append(f"--early {self.early} leaves no early queries (1 ≤ i < K); use K ≥ 2")
        if not 0 <= self.bootstrap <= MAX_RESAMPLES:
            found.append(
                f"--bootstrap {self.bootstrap} is out of range; use 0 (no intervals) up to {MAX_RESAMPLES} resamples"
            )
        if not 0 <= self.seed < SEEDS:
            found.append(f"--seed {self.seed} is out of range; use a seed from 0 to {SEEDS - 1}")
        if self.bos not in BOS_POLICIES:
            found.append(f"unknown --bos {self.bos!r}; use one of {', '.join(BOS_POLICIES)}")
        if self.grid not in ("coarse", "exact"):
            found.append(f"unknown --grid {self.grid!r}; use coarse or exact")
        if self.grid == "exact" and seq_len > EXACT_TABLES_UP_TO:
            found.append(
                f"--grid exact writes one table row per (query, offset) pair and head, too many at T = {seq_len}; "
                f"use --grid coarse (the magnitudes are the same on every grid) or T ≤ {EXACT_TABLES_UP_TO}"
            )
        return found


@dataclass
class AnalysisResult:
    """The tables of one run (the run folder holds the same as Parquet) and its manifest."""

    per_head: pd.DataFrame
    per_layer: pd.DataFrame
    profiles: pd.DataFrame
    offset_map: pd.DataFrame
    position0: pd.DataFrame  # resid index, fingerprint constancy and closed-system spread of h_0
    bootstrap: pd.DataFrame  # per resample and layer, the mean over heads of each magnitude (paired runs)
    manifest: dict[str, Any]
    run: RunFolder | None = None
    # per sequence and query position: next-token loss and top-1 hit (posleak.measure.behaviour)
    tokens: pd.DataFrame = field(default_factory=pd.DataFrame)

    TABLES = ("per_head", "per_layer", "profiles", "offset_map", "position0", "bootstrap")

    @classmethod
    def read(cls, run: RunFolder) -> AnalysisResult:
        tables = {name: run.read_table(name) for name in cls.TABLES}
        # a folder finished before next-token scores were kept has no tokens table; it reads back without
        tokens = run.read_table("tokens") if run.table_path("tokens").is_file() else pd.DataFrame()
        return cls(**tables, manifest=run.read_manifest(), run=run, tokens=tokens)


def analyze(
    spec: str,
    config: AnalyzeConfig,
    *,
    out: Path | str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> AnalysisResult:
    """Load the model `spec` (built-in name, folder, hub id), make the sequences, and analyse.

    Every problem with the input is refused at once (BadInput) before anything runs or is written."""
    if out is not None and finished_here(RunFolder(Path(out)), spec, config):
        return AnalysisResult.read(RunFolder(Path(out)))  # finished before: skip loading the model
    loaded, batch = checked_input(spec, config, out, trust_remote_code)
    loaded = load_for(spec, config.interventions, trust_remote_code, base=loaded, placement=config.placement)
    return analyze_model(loaded.model, batch, config, out=out, loaded=loaded, progress=progress)


def finished_here(run: RunFolder, spec: str, config: AnalyzeConfig, command: str | None = None) -> bool:
    """Whether `run` holds this run of `command` (None: analyze), finished: judged by the model spec and the
    options it recorded, so that a finished run is read back without loading the model."""
    if not run.is_complete:
        return False
    args = run.read_manifest().get("args") or {}
    same_config = args.get("config") == json.loads(json.dumps(dataclasses.asdict(config)))
    return same_config and args.get("model") == spec and args.get("command") == command


def checked_input(
    spec: str,
    config: AnalyzeConfig,
    out: Path | str | None,
    trust_remote_code: bool = False,
    base: LoadedModel | None = None,
) -> tuple[LoadedModel, TokenBatch]:
    """The model (without load-time interventions; `base`: already loaded) and the sequences of `analyze`, once
    every option has been checked against the others, the model's facts and the output folder; BadInput lists
    every problem. Nothing is run on the model and nothing is written."""
    problems = Problems()
    if out is not None:
        problems.extend(out_folder_problems(out))
    if placement_problems := config.placement.problems():
        problems.extend(placement_problems)  # no model loads where it cannot run
        problems.extend(config.problems(config.seq_len, config.num_seqs))
        problems.raise_any()
    loaded = base if base is not None else checked_model(problems, spec, trust_remote_code, config.placement)
    batch = checked_sequences(problems, loaded, config)
    if loaded is not None and batch is not None:
        problems.extend(token_file_bos_problems(loaded, batch, config))
    problems.extend(config.interventions.problems(loaded, None if batch is None else batch.bos_id is not None))
    if out is not None and loaded is not None and batch is not None and not problems.found:
        with problems.collecting():
            RunFolder(Path(out)).state(run_args(loaded.name, loaded, batch, config))
    problems.raise_any()
    assert loaded is not None and batch is not None  # no problem found, so both were made
    return loaded, batch


def checked_model(
    problems: Problems, spec: str, trust_remote_code: bool, placement: Placement | None = None
) -> LoadedModel | None:
    """The model `spec` without load-time interventions; None, with the reason in `problems`, if it will not load."""
    with problems.collecting():
        return load_model(spec, trust_remote_code=trust_remote_code, placement=placement)
    return None


def checked_sequences(problems: Problems, loaded: LoadedModel | None, config: AnalyzeConfig) -> TokenBatch | None:
    """The sequences of `config` for `loaded` (None: it did not load), adding what stops them and every problem
    of the options for their shape to `problems`; None when they cannot be made."""
    if config.tokens is not None:
        batch = None
        with problems.collecting():
            batch = sequences_for(loaded, config) if loaded is not None else load_token_file(config.tokens)
        if batch is not None:
            problems.extend(config.problems(batch.seq_len, batch.num_seqs))
        return batch
    options = config.problems(config.seq_len, config.num_seqs)
    options += shape_problems(config.seq_len, None, loaded.facts.max_positions if loaded is not None else None)
    problems.extend(options)
    if loaded is None or options:
        with problems.collecting():
            load_corpus(config.corpus)  # the corpus's own problems, at least
        return None
    with problems.collecting():
        return sequences_for(loaded, config)
    return None


def token_file_bos_problems(loaded: LoadedModel, batch: TokenBatch, config: AnalyzeConfig) -> list[str]:
    """A token file is taken verbatim: --bos can only state what its first column holds."""
    bos = loaded.tokenizer.bos_token_id
    if config.bos == "on" and batch.bos_id is None:
        has = f"the tokenizer's BOS id {bos}" if bos is not None else "a BOS (the tokenizer has none)"
        return [
            f"--bos on with --tokens: the rows of {batch.source_name} do not all start with {has}; a token file is "
            "taken verbatim, so put the BOS in its first column or drop --bos on"
        ]
    if config.bos == "off" and batch.bos_id is not None:
        return [
            f"--bos off with --tokens: every row of {batch.source_name} starts with the BOS id {bos}; a token file "
            "is taken verbatim, so remove that column or drop --bos off"
        ]
    return []


def load_for(
    spec: str,
    interventions: Interventions,
    trust_remote_code: bool = False,
    base: LoadedModel | None = None,
    placement: Placement | None = None,
) -> LoadedModel:
    """The model with the load-time interventions (RoPE scaling) applied to its config (`base`: the model
    already loaded without them), where `placement` says."""
    loaded = base if base is not None else load_model(spec, trust_remote_code=trust_remote_code, placement=placement)
    overrides = interventions.config_overrides(loaded.model.config)
    if overrides:
        loaded = load_model(spec, trust_remote_code=trust_remote_code, config_overrides=overrides, placement=placement)
    return loaded


def sequences_for(loaded: LoadedModel, config: AnalyzeConfig) -> TokenBatch:
    max_len = loaded.facts.max_positions
    if config.tokens is not None:
        return load_token_file(
            config.tokens, vocab_size=loaded.facts.vocab_size, max_len=max_len, bos_id=loaded.tokenizer.bos_token_id
        )
    return make_sequences(
        load_corpus(config.corpus),
        loaded.tokenizer,
        config.seq_len,
        config.num_seqs,
        bos=config.bos,  # type: ignore[arg-type]
        seed=config.seed,
        cross_documents=config.cross_documents,
        max_len=max_len,
    )


def analyze_model(
    model: PreTrainedModel,
    batch: TokenBatch,
    config: AnalyzeConfig,
    *,
    out: Path | str | None = None,
    loaded: LoadedModel | None = None,
    model_id: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    progress: bool = True,
) -> AnalysisResult:
    """Analyse `batch` on `model` (already switched to posleak attention).

    Two stages: forward passes that capture each layer's q, k and log Z (one file per batch, the run's
    checkpoint), then one pass over each layer's logits that measures it (one checkpoint per layer).
    `loaded` supplies provenance for a checkpoint (its id and file hash); a lab model passes `model_id`.
    """
    tokenizer = loaded.tokenizer if loaded is not None else tokenizer
    model_id = loaded.name if loaded is not None else (model_id or type(model).__name__)
    # Any N: with one sequence the noise-corrected magnitudes are NaN (docs/method.md §3); the commands,
    # `analyze` and `intervene`, refuse that before loading anything.
    if problems := config.problems(batch.seq_len, None):
        raise BadInput(problems)
    if out is None:
        return _analyze(model, batch, config, None, loaded, model_id, tokenizer, progress)
    run = RunFolder(Path(out))
    with run.claim(run_args(model_id, loaded, batch, config)) as state:  # one process at a time
        if state == COMPLETE:
            return AnalysisResult.read(run)
        return _analyze(model, batch, config, run, loaded, model_id, tokenizer, progress)


def _analyze(
    model: PreTrainedModel,
    batch: TokenBatch,
    config: AnalyzeConfig,
    run: RunFolder | None,
    loaded: LoadedModel | None,
    model_id: str,
    tokenizer: PreTrainedTokenizerBase | None,
    progress: bool,
) -> AnalysisResult:
    table_grid = tables_grid(config, batch.seq_len)
    started = time.perf_counter()
    with _captures(run, model, batch) as captures:
        sink_heads = _capture(model, batch, config, captures, tokenizer, model_id, progress)
        forward_s = time.perf_counter() - started
        states = torch.cat(captures.extra("pos0"), dim=1)
        closed = closed_system(states, states[0])  # group by the vector at position 0 (after interventions)
        require_closed_system(closed)
        windows = [window for layer in captures.layers() if (window := captures.facts(layer).window)]
        spec = MeasureSpec(
            batch.seq_len,
            batch.num_seqs,
            table_grid,
            early=config.early,
            resamples=config.bootstrap,
            seed=config.seed,
            beyond=min(windows, default=None),
        )
        measured = Decomposition.of(_measure(captures, spec, run, model_id, progress), spec)
        measure_s = time.perf_counter() - started - forward_s
        nll, correct = torch.cat(captures.extra("nll")), torch.cat(captures.extra("correct"))
    result = _tables(measured, states, closed)
    result.tokens = token_table(nll, correct, batch.ids)
    timings = {
        "forward_s": round(forward_s, 3),
        "measure_s": round(measure_s, 3),
        "total_s": round(time.perf_counter() - started, 3),
    }
    manifest = _manifest(model, model_id, loaded, batch, config, tokenizer, measured, closed, sink_heads, timings)
    result.manifest = manifest
    if run is not None:
        _write(run, result)
        run.finish(manifest)
        result.run = run
    return result


@contextmanager
def _captures(run: RunFolder | None, model: PreTrainedModel, batch: TokenBatch) -> Iterator[Captures]:
    """The run's own capture folder (kept for a resume until the run finishes); without a run folder, memory
    when the captures fit MEMORY_CAPTURES_BYTES, else a temporary folder."""
    if run is not None:
        yield CaptureFolder(run.partial_dir / "captures")
        return
    if capture_bytes(model, batch) <= MEMORY_CAPTURES_BYTES:
        yield CaptureMemory()
        return
    with tempfile.TemporaryDirectory(prefix="posleak-captures-") as folder:
        yield CaptureFolder(Path(folder))


def capture_bytes(model: PreTrainedModel, batch: TokenBatch) -> int:
    """What the captures of `batch` take: per layer and sequence, q, distinct keys and log Z in float32."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_layer = batch.num_seqs * batch.seq_len * ((heads + kv) * dim + heads) * 4
    return per_layer * config.num_hidden_layers


def _capture(
    model: PreTrainedModel,
    batch: TokenBatch,
    config: AnalyzeConfig,
    captures: Captures,
    tokenizer: PreTrainedTokenizerBase | None,
    model_id: str,
    progress: bool,
) -> dict[int, tuple[int, ...]] | None:
    """Run every batch not captured yet; returns the sink heads an `auto` ablation chose (else None)."""
    interventions = config.interventions
    sink_heads = _sink_heads(model, batch, config) if interventions.needs_sink_heads else None
    chunks = list(iter_batches(batch, config.batch_size))
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
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    session = CaptureSession([recorder, LayerProgress(bar, layers)], edits=interventions.attention_edits(sink_heads))
    # the bar as a context: closed (its line ended) before an error is printed below it
    with bar, interventions.applied(model, tokenizer, bos_at_0=batch.bos_id is not None):
        for index in todo:
            seq_index, ids = chunks[index]
            recorder.batch = index
            with ResidualCapture(model, positions=[0]) as residual:
                output = session.forward(model, ids, seq_index)
            pos0 = residual.states()[:, :, 0]
            _check_finite(pos0, model_id)
            # the model's own predictions from this same forward (interventions included): no second pass
            nll, correct = next_token_scores(model, output.last_hidden_state, ids)
            captures.finish_batch(index, seq_index, {"pos0": pos0, "nll": nll, "correct": correct})
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
                result = measure_layer(captures.layer(layer), spec)
                if run is not None:
                    run.save_partial(f"layer{layer}", result.state())
            else:
                result = LayerResult.from_state(state, spec)
            results.append(result)
    return results


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


def run_args(model_id: str, loaded: LoadedModel | None, batch: TokenBatch, config: AnalyzeConfig) -> dict[str, Any]:
    """What the resume fingerprint covers: the model file, the exact tokens, and every option."""
    return {
        "model": model_id,
        "model_sha256": loaded.file_hash if loaded is not None else None,
        "tokens_sha256": _tokens_hash(batch.ids),
        "config": dataclasses.asdict(config),
    }


def _tokens_hash(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def _check_finite(states: torch.Tensor, model_id: str) -> None:
    if not torch.isfinite(states).all():
        layer = int((~torch.isfinite(states)).flatten(1).any(1).nonzero()[0])
        raise PosleakError(f"{model_id}: NaN or Inf in the activations at resid[{layer}]; check the dtype and weights")


def _sink_heads(model: PreTrainedModel, batch: TokenBatch, config: AnalyzeConfig) -> dict[int, tuple[int, ...]]:
    """Heads with α_0 > ε on these sequences without any intervention (for --ablate-sink-values auto)."""
    stats = QueryStats(entropy=False)
    session = CaptureSession([stats])
    for seq_index, ids in iter_batches(batch, config.batch_size):
        session.forward(model, ids, seq_index)
    heads = stats.result().sink_heads
    return {layer: tuple(heads[layer].nonzero().flatten().tolist()) for layer in range(heads.shape[0])}


def _tables(decomposition: Decomposition, pos0_states: torch.Tensor, closed: ClosedSystemReport) -> AnalysisResult:
    position0 = pd.DataFrame(
        {
            "layer": range(pos0_states.shape[0]),
            "fingerprint_cos": fingerprint_constancy(pos0_states).numpy(),
            "closed_spread": closed.max_rel_spread.numpy(),
        }
    )
    return AnalysisResult(
        per_head=decomposition.per_head(),
        per_layer=_layer_layout(decomposition).merge(decomposition.per_layer(), on="layer"),
        profiles=decomposition.profiles(),
        offset_map=decomposition.offset_map(),
        position0=position0,
        bootstrap=_bootstrap_table(decomposition),
        manifest={},
    )


def tables_grid(config: AnalyzeConfig, seq_len: int) -> Grid:
    """The grid the profile and offset-map tables are written on (T ≤ EXACT_TABLES_UP_TO for the exact grid,
    `AnalyzeConfig.problems`); the magnitudes never depend on it."""
    return Grid(seq_len, "exact" if config.grid == "exact" else "coarse")


def _bootstrap_table(decomposition: Decomposition) -> pd.DataFrame:
    """Long table of resampled layer magnitudes; the resampling weights depend only on (N, R, seed), so
    two runs on the same sequences share them and their differences can be bootstrapped pairwise."""
    columns = ["resample", "layer", *LAYER_MAGNITUDES]
    if decomposition.bootstrap is None:
        return pd.DataFrame(columns=columns)
    samples = {name: decomposition.bootstrap[name].mean(-1) for name in LAYER_MAGNITUDES}  # (R, L)
    resamples, layers = samples[LAYER_MAGNITUDES[0]].shape
    frame = pd.DataFrame(
        {
            "resample": torch.arange(resamples).repeat_interleave(layers).numpy(),
            "layer": torch.tensor(decomposition.layers).repeat(resamples).numpy(),
        }
    )
    for name in LAYER_MAGNITUDES:
        frame[name] = samples[name].flatten().numpy()
    return frame


def _layer_layout(decomposition: Decomposition) -> pd.DataFrame:
    """Layer type and window as the run computed them (after any window override)."""
    windows = [profile.layout.mask.window for profile in decomposition.layer_profiles]
    return pd.DataFrame(
        {
            "layer": decomposition.layers,
            "layer_type": ["sliding_attention" if w is not None else "full_attention" for w in windows],
            "window": [w or 0 for w in windows],
        }
    )


def _manifest(
    model: PreTrainedModel,
    model_id: str,
    loaded: LoadedModel | None,
    batch: TokenBatch,
    config: AnalyzeConfig,
    tokenizer: PreTrainedTokenizerBase | None,
    decomposition: Decomposition,
    closed: ClosedSystemReport,
    sink_heads: dict[int, tuple[int, ...]] | None,
    timings: dict[str, float],
) -> dict[str, Any]:
    interventions = config.interventions.describe()
    if sink_heads is not None:
        interventions["sink_heads_ablated"] = {str(k): list(v) for k, v in sink_heads.items() if v}
    manifest = provenance(
        model_id=model_id,
        model_hash=loaded.file_hash if loaded is not None else None,
        dtype=str(model.dtype).removeprefix("torch."),
        attention_path=(
            "posleak (fused kernel with log-sum-exp: torch's flash kernel on the CPU, memory-efficient on CUDA; "
            "block-wise where soft-capped or on other devices); logits formed again in float64 from the captured "
            "q and k (float32 copies) for the measurement"
        ),
        bos_policy=batch.bos_policy,
        position0_tokens=_position0_tokens(batch, tokenizer),
        seq_len=batch.seq_len,
        num_seqs=batch.num_seqs,
        corpus=config.tokens or config.corpus,
        seed=config.seed,
        grid=decomposition.grid.describe(),
        interventions=[interventions] if interventions else [],
        timings=timings,
    )
    manifest["data"] |= batch.provenance()
    manifest["measurement"] = decomposition.describe()
    manifest["early"] = config.early
    manifest["placement"] = {
        "device": str(model.device),  # the first layer's, under a device map
        "device_map": sorted({str(where) for where in (getattr(model, "hf_device_map", None) or {}).values()}),
        "requested": config.placement.to_dict(),
    }
    if loaded is not None:
        manifest["model"]["facts"] = loaded.facts.to_dict()
        manifest["model"]["gguf_sha256"] = loaded.source_hash
    manifest["closed_system"] = {
        "holds": closed.holds,
        "groups": closed.groups,
        "max_rel_spread": float(closed.max_rel_spread.max()),
    }
    return manifest


def _position0_tokens(batch: TokenBatch, tokenizer: PreTrainedTokenizerBase | None) -> list[TokenCount]:
    ids, counts = batch.pos0_token_ids.unique(return_counts=True)
    order = counts.argsort(descending=True)[:20]  # the most frequent; with a BOS there is one
    return [
        TokenCount(
            id=int(ids[k]),
            text=tokenizer.decode([int(ids[k])]) if tokenizer is not None else str(int(ids[k])),
            sequences=int(counts[k]),
        )
        for k in order
    ]


def _write(run: RunFolder, result: AnalysisResult) -> None:
    for name in (*AnalysisResult.TABLES, "tokens"):
        run.write_table(name, getattr(result, name))
    early = result.manifest["early"]
    paths = {
        "magnitudes": figures.component_magnitudes(
            result.per_layer,
            run.figure_path("magnitudes"),
            range_labels=(f"early queries (1 ≤ i < {early})", "all queries (1 ≤ i < T)"),
        ),
        "profiles": figures.profiles_figure(result.profiles, result.per_layer, run.figure_path("profiles")),
        "offset_map": figures.offset_map_figure(result.offset_map, run.figure_path("offset_map")),
    }
    render_report(
        run,
        f"posleak analysis: {result.manifest['model']['id']}",
        report_sections(result, paths),
        manifest=result.manifest,
    )


def report_sections(result: AnalysisResult, paths: dict[str, Path]) -> list[Section]:
    """The sections of one analysis run's report (also reused by `intervene` and `paper`)."""
    per_layer = result.per_layer
    closed = result.manifest["closed_system"]
    summary = (
        f"Mean over layers: causal-mask magnitude **{per_layer['mask_all'].mean():.3g}** (all queries), "
        f"residual-stream magnitude **{per_layer['resid_all'].mean():.3g}** (noise-corrected). "
        f"Position 0 closed system: {'holds' if closed['holds'] else 'VIOLATED'} "
        f"(largest relative spread {closed['max_rel_spread']:.2g} over {closed['groups']} group(s))."
    )
    return [
        Section(
            "Components by layer",
            summary
            + "\n\nMagnitudes are root-mean-square deviations over valid (query, offset) cells, docs/method.md §3; "
            "bands are bootstrap intervals over sequences.",
            figures=[FigureBlock(paths["magnitudes"], "Causal-mask m(i) and residual-stream r(i, d) magnitudes.")],
            tables=[TableBlock("Per layer", per_layer, source="per_layer.parquet")],
        ),
        Section(
            "Profiles",
            "m(i) where the causal-mask component is largest; r(i, d) where the residual-stream one is.",
            figures=[FigureBlock(paths["profiles"]), FigureBlock(paths["offset_map"], "Offset-normalised map.")],
        ),
        Section(
            "Per head",
            "Sink score α₀ (mean attention on key 0 over queries i ≥ 1), magnitudes and ΔR² leakage per head.",
            tables=[TableBlock("Per head", result.per_head, collapsed=True, source="per_head.parquet")],
        ),
    ]
