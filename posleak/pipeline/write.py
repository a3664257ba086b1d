"""Writing one analysis run: its tables (from the measured decomposition), its manifest, figures and report
sections, and the run folder that holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import PreTrainedTokenizerBase

from posleak.capture.residual import ClosedSystemReport, skipped_layers
from posleak.data.batches import TokenBatch
from posleak.measure import LAYER_MAGNITUDES, Decomposition, layer_value
from posleak.measure.position0 import fingerprint_constancy
from posleak.pipeline.prepare import PreparedRun
from posleak.pipeline.result import AnalysisResult
from posleak.report import figures
from posleak.report.html import FigureBlock, Section, TableBlock, render_report
from posleak.store import RunFolder, TokenCount, provenance


def result_tables(
    decomposition: Decomposition, pos0_states: torch.Tensor, closed: ClosedSystemReport
) -> AnalysisResult:
    """The run's tables from its measured layers and its position-0 states (the manifest is added after)."""
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


def _bootstrap_table(decomposition: Decomposition) -> pd.DataFrame:
    """Long table of resampled layer magnitudes; the resampling weights depend only on (N, R, seed), so
    two runs on the same sequences share them and their differences can be bootstrapped pairwise."""
    columns = ["resample", "layer", *LAYER_MAGNITUDES]
    if decomposition.bootstrap is None:
        return pd.DataFrame(columns=columns)
    samples = {name: layer_value(name, decomposition.bootstrap[name]) for name in LAYER_MAGNITUDES}  # (R, L)
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


def run_manifest(
    prepared: PreparedRun,
    decomposition: Decomposition,
    closed: ClosedSystemReport,
    sink_heads: dict[int, tuple[int, ...]] | None,
    timings: dict[str, float],
) -> dict[str, Any]:
    """The run's manifest: provenance, the data, the measurement, where the model ran, the closed system."""
    model, model_id, loaded, batch = prepared.model, prepared.model_id, prepared.loaded, prepared.batch
    options, tokenizer = prepared.options, prepared.tokenizer
    interventions = options.interventions.describe(sink_heads)
    manifest = provenance(
        model_id=model_id,
        model_hash=loaded.file_hash if loaded is not None else None,
        dtype=str(model.dtype).removeprefix("torch."),
        attention_path=(
            "posleak (fused kernel with log-sum-exp: torch's flash kernel on the CPU, memory-efficient on CUDA; "
            "block-wise where soft-capped or on other devices); logits formed again in float64 from the captured "
            "q and k (float32 copies) for the measurement"
        ),
        data=batch.provenance(),
        position0_tokens=_position0_tokens(batch, tokenizer),
        grid=decomposition.grid.describe(),
        interventions=[interventions] if interventions else [],
        timings=timings,
    )
    manifest["measurement"] = decomposition.describe()
    manifest["early"] = options.measure.early
    manifest["placement"] = {
        "device": str(model.device),  # the first layer's, under a device map
        "device_map": sorted({str(where) for where in (getattr(model, "hf_device_map", None) or {}).values()}),
        "requested": options.execution.placement.to_dict(),
    }
    if loaded is not None:
        manifest["model"]["facts"] = loaded.facts.to_dict()
        manifest["model"]["gguf_sha256"] = loaded.source_hash
    # a hybrid's layers without attention, by the model's layer index ("3": "JambaMambaMixer, not attention")
    if skipped := skipped_layers(model):
        manifest["skipped_layers"] = {str(index): reason for index, reason in skipped.items()}
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


def write_run(run: RunFolder, result: AnalysisResult, report: bool = True) -> None:
    """The tables, figures and report of `result` in `run` (its manifest is written when the run finishes).
    `report=False` writes the tables only: for runs read by a command with a report of its own (`paper`, the lab),
    where drawing each run's figures was a third of an analysis at small sizes."""
    for name in AnalysisResult.TABLES:
        run.write_table(name, getattr(result, name))
    if not result.tokens.empty:  # a run without next-token scores (MeasureOptions.scores) has no tokens table
        run.write_table("tokens", result.tokens)
    if not report:
        return
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
        f"posleak analysis: {result.manifest['model']['id']}" + _null_title(result.manifest),
        report_sections(result, paths),
        manifest=result.manifest,
    )


def _null_title(manifest: dict[str, Any]) -> str:
    """What the report's title adds for a null run ("" for the sequences as they are)."""
    null = manifest["data"].get("null")
    return f" ({null} null, seed {manifest['data']['null_seed']})" if null else ""


def report_sections(result: AnalysisResult, paths: dict[str, Path]) -> list[Section]:
    """The sections of one analysis run's report (also reused by `intervene` and `paper`)."""
    per_layer = result.per_layer
    closed = result.manifest["closed_system"]
    summary = (
        f"Mean over layers: causal-mask magnitude **{per_layer['mask_all'].mean():.3g}** (all queries), "
        f"residual-stream magnitude **{per_layer['resid_all'].mean():.3g}** (noise-corrected), of which the column "
        f"of key 0 {per_layer['resid_all_key0'].mean():.3g} and the other keys "
        f"{per_layer['resid_all_rest'].mean():.3g} (resid² = key0² + rest², docs/method.md §3). "
        f"How much attention w moves (softmax of g + w against softmax of g, all queries): symmetrised KL "
        f"**{per_layer['shift_kl_all'].mean():.3g}** nats, total variation **{per_layer['shift_tv_all'].mean():.3g}** "
        "(means over layers of the noise-corrected shift, docs/method.md §7; no interval). "
        f"Position 0 closed system: {'holds' if closed['holds'] else 'VIOLATED'} "
        f"(largest relative spread {closed['max_rel_spread']:.2g} over {closed['groups']} group(s))."
    )
    if null := result.manifest["data"].get("null"):
        moved = "shuffled" if null == "shuffle" else "circularly shifted"
        summary = (
            f"**A null, not the text**: the tokens of every sequence were {moved} (the {null} null, seed "
            f"{result.manifest['data']['null_seed']}; a BOS at position 0 stays there) before the analysis, so these "
            f"are the magnitudes of the null (docs/method.md §14). " + summary
        )
    if skipped := result.manifest.get("skipped_layers"):
        summary += " Skipped: " + "; ".join(f"layer {index}: {reason}" for index, reason in skipped.items()) + "."
    return [
        Section(
            "Components by layer",
            summary
            + "\n\nMagnitudes are root-mean-square deviations over valid (query, offset) cells, docs/method.md §3; "
            "bands are bootstrap intervals over documents (§6).",
            figures=[FigureBlock(paths["magnitudes"], "Causal-mask c(i) and residual-stream w(i, d) magnitudes.")],
            tables=[TableBlock("Per layer", per_layer, source="per_layer.parquet")],
        ),
        Section(
            "Profiles",
            "c(i) and its count part m_count(i) where the causal-mask component is largest; w(i, d) where the "
            "residual-stream one is.",
            figures=[FigureBlock(paths["profiles"]), FigureBlock(paths["offset_map"], "Offset-normalised map.")],
        ),
        Section(
            "Per head",
            "Sink score α₀ (mean attention on key 0 over queries i ≥ 1), magnitudes and ΔR² leakage per head.",
            tables=[TableBlock("Per head", result.per_head, collapsed=True, source="per_head.parquet")],
        ),
    ]
