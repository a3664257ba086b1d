"""The one pipeline under every command: prepare (every check, all problems at once) → run (capture → measure →
typed result) → write (tables, manifest, report)."""

from posleak.pipeline.config import AnalysisOptions, AnalyzeConfig, Execution, MeasureOptions
from posleak.pipeline.prepare import (
    Preparation,
    PreparedRun,
    checked_model,
    checked_sequences,
    load_for,
    prepare,
    prepared_model,
    sequences_for,
    token_file_bos_problems,
)
from posleak.pipeline.result import AnalysisResult, finished_here, resampled_layers
from posleak.pipeline.run import analyze_model, attention_stats, sink_heads_of

__all__ = [
    "AnalysisOptions",
    "AnalysisResult",
    "AnalyzeConfig",
    "Execution",
    "MeasureOptions",
    "Preparation",
    "PreparedRun",
    "analyze_model",
    "attention_stats",
    "checked_model",
    "checked_sequences",
    "finished_here",
    "load_for",
    "prepare",
    "prepared_model",
    "resampled_layers",
    "sequences_for",
    "sink_heads_of",
    "token_file_bos_problems",
]
