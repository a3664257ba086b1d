"""Capture: posleak's attention function, capture sessions, accumulators and residual hooks."""

from posleak.capture.attention import IMPLEMENTATION, posleak_attention, use_posleak_attention
from posleak.capture.masks import MaskSpec
from posleak.capture.query_stats import QueryStats, QueryStatsResult
from posleak.capture.residual import ResidualCapture, closed_system, decoder_layers, require_closed_system
from posleak.capture.session import Accumulator, AttentionCall, AttentionEdits, CaptureSession

__all__ = [
    "IMPLEMENTATION",
    "Accumulator",
    "AttentionCall",
    "AttentionEdits",
    "CaptureSession",
    "MaskSpec",
    "QueryStats",
    "QueryStatsResult",
    "ResidualCapture",
    "closed_system",
    "decoder_layers",
    "posleak_attention",
    "require_closed_system",
    "use_posleak_attention",
]
