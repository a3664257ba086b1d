"""The typed result of one analysis run (`AnalysisResult`), and reading a finished run folder back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from posleak.measure.bootstrap import resampling_units
from posleak.pipeline.config import AnalyzeConfig
from posleak.store import RunFolder
from posleak.store.jsonfile import dumps


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

    @property
    def units(self) -> tuple[int, ...] | None:
        """The resampling unit of each sequence, as its bootstrap drew them: its document (None: each sequence its
        own; posleak.measure.bootstrap). Another run on the same sequences resamples them alike with these."""
        return resampling_units(self.manifest.get("data", {}).get("documents"))


def finished_here(run: RunFolder, spec: str, config: AnalyzeConfig, command: str | None = None) -> bool:
    """Whether `run` holds this run of `command` (None: analyze), finished: judged by the model spec and the
    options it recorded, so that a finished run is read back without loading the model."""
    if not run.is_complete:
        return False
    args = run.read_manifest().get("args") or {}
    same_config = args.get("config") == json.loads(dumps(config.identity()))
    return same_config and args.get("model") == spec and args.get("command") == command


def resampled_layers(bootstrap: pd.DataFrame, measure: str) -> torch.Tensor | None:
    """(R, L) resampled layer magnitudes, or None when the run kept no bootstrap."""
    if bootstrap.empty:
        return None
    table = bootstrap.pivot(index="resample", columns="layer", values=measure).sort_index(axis=1)
    return torch.tensor(table.to_numpy(), dtype=torch.float64)
