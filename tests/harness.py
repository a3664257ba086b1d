"""Running posleak's default analysis with the reference recording the same attention calls (tests only)."""

from __future__ import annotations

import math

import torch
from reference import LogitRecorder, grid_edges, table_errors

from posleak.capture import use_posleak_attention
from posleak.data.batches import TokenBatch
from posleak.pipeline import AnalysisResult, AnalyzeConfig, analyze_model, prepared_model

EARLY = 12


def token_batch(ids: torch.Tensor) -> TokenBatch:
    return TokenBatch(
        ids=ids,
        bos="verbatim",
        bos_id=None,
        pos0_token_ids=ids[:, 0].clone(),
        source="test",
        source_name="random ids",
        seed=None,
    )


def analyze_recorded(
    model: torch.nn.Module, ids: torch.Tensor, grid: str = "coarse", bootstrap: int = 0, batch_size: int = 2
) -> tuple[AnalysisResult, LogitRecorder]:
    """`analyze_model` on `ids` (the default path) with the reference recording every attention call."""
    model = use_posleak_attention(model)
    config = AnalyzeConfig(
        seq_len=ids.shape[1], num_seqs=ids.shape[0], batch_size=batch_size, grid=grid, early=EARLY, bootstrap=bootstrap
    )
    with LogitRecorder(model) as recorder:
        result = analyze_model(prepared_model(model, token_batch(ids), config.analysis, "tiny"), progress=False)
    # the instrumented path ran: the recorder wrapped posleak's own function, once per layer and batch
    assert recorder.previous == "posleak"
    layers = model.config.num_hidden_layers
    assert sorted(recorder.layers) == list(range(layers)) == result.per_layer["layer"].tolist()
    assert all(len(layer.queries) == math.ceil(ids.shape[0] / batch_size) for layer in recorder.layers.values())
    return result, recorder


def errors_of(result: AnalysisResult, recorder: LogitRecorder, exact: bool = False) -> dict[str, float]:
    edges = grid_edges(int(result.manifest["data"]["seq_len"]), exact=exact)
    return table_errors(result.per_head, result.per_layer, result.profiles, result.offset_map, recorder, EARLY, edges)
