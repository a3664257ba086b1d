"""The one pipeline under every command: prepare (every check, all problems at once) → run (capture → measure →
typed result) → write (tables, manifest, report)."""

from posleak.pipeline.analysis import (
    AnalysisResult,
    AnalyzeConfig,
    analyze_model,
    checked_model,
    finished_here,
    load_for,
    sequences_for,
)
from posleak.pipeline.analysis import checked_input as prepare

__all__ = [
    "AnalysisResult",
    "AnalyzeConfig",
    "analyze_model",
    "checked_model",
    "finished_here",
    "load_for",
    "prepare",
    "sequences_for",
]
