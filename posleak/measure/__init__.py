"""Measurements on captured attention: the decomposition by rows (g, c, w), the attention shift, ΔR², bootstrap
intervals."""

from posleak.measure.bootstrap import percentile_interval, redrawn_resamples, resample_weights, resampling_units
from posleak.measure.components import (
    MAGNITUDES,
    NOISE_CORRECTION,
    SHIFTS,
    LayerProfile,
    layer_value,
    magnitudes,
    mask_component,
    profile,
)
from posleak.measure.decomposition import (
    LAYER_MAGNITUDES,
    MEASURES,
    Decomposition,
    LayerResult,
    MeasureSpec,
    measure_layer,
    measured_magnitudes,
)
from posleak.measure.grid import CellLayout, Grid, GridKind
from posleak.measure.layer_sums import LayerSums, segment_boundaries, sum_layer
from posleak.measure.regression import DesignMoments, delta_r2, running_sums

__all__ = [
    "LAYER_MAGNITUDES",
    "MAGNITUDES",
    "MEASURES",
    "NOISE_CORRECTION",
    "SHIFTS",
    "CellLayout",
    "Decomposition",
    "DesignMoments",
    "Grid",
    "GridKind",
    "LayerProfile",
    "LayerResult",
    "LayerSums",
    "MeasureSpec",
    "delta_r2",
    "layer_value",
    "magnitudes",
    "mask_component",
    "measure_layer",
    "measured_magnitudes",
    "percentile_interval",
    "profile",
    "redrawn_resamples",
    "resample_weights",
    "resampling_units",
    "running_sums",
    "segment_boundaries",
    "sum_layer",
]
