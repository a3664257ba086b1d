"""The one pipeline under every command: prepare (every check, all problems at once) → run (capture → measure →
typed result) → write (tables, manifest, report)."""

from posleak.pipeline.analysis import AnalysisResult, AnalyzeConfig, analyze_model

__all__ = ["AnalysisResult", "AnalyzeConfig", "analyze_model"]
