"""Measurements on captured attention: the leakage decomposition (g, m, r), ΔR², bootstrap intervals."""

from posleak.measure.bootstrap import identity_weights, percentile_interval, resample_weights
from posleak.measure.components import (
    MAGNITUDES,
    Components,
    LayerProfile,
    UnitArrays,
    Units,
    components,
    magnitudes,
    mask_component,
)
from posleak.measure.decomposition import (
    LAYER_MAGNITUDES,
    Decomposition,
    DecompositionAccumulator,
    LayerSums,
    cell_sums,
    reduce_call,
)
from posleak.measure.grid import CellLayout, Grid, GridKind
from posleak.measure.regression import DesignMoments, KeyRanges, RowSums, delta_r2, sum_of_squares
from posleak.measure.resampled import resampled_magnitudes

__all__ = [
    "LAYER_MAGNITUDES",
    "MAGNITUDES",
    "CellLayout",
    "Components",
    "Decomposition",
    "DecompositionAccumulator",
    "DesignMoments",
    "Grid",
    "GridKind",
    "KeyRanges",
    "LayerProfile",
    "LayerSums",
    "RowSums",
    "UnitArrays",
    "Units",
    "cell_sums",
    "components",
    "delta_r2",
    "identity_weights",
    "magnitudes",
    "mask_component",
    "percentile_interval",
    "reduce_call",
    "resample_weights",
    "resampled_magnitudes",
    "sum_of_squares",
]
