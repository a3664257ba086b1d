"""The options of one analysis run (`AnalyzeConfig`) and their checks against each other and the sequences' shape,
before any model is asked."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posleak.data.kinds import BOS_POLICIES, GRIDS, NULLS, BosPolicy, GridKind, NullKind
from posleak.device import Placement, budget_problems
from posleak.intervene import Interventions
from posleak.measure import Grid

# Profile tables on the exact grid grow as T²·heads·layers rows: refused beyond this length.
EXACT_TABLES_UP_TO = 256
# The noise correction compares two halves of the sequences and the bootstrap resamples them.
MIN_SEQS = 2
MAX_RESAMPLES = 100_000  # percentile intervals settle long before; each resample holds N weights in memory
SEEDS = 2**32


@dataclass(frozen=True)
class AnalyzeConfig:
    """What determines an analysis run (and its resume fingerprint), besides the model."""

    seq_len: int = 256
    num_seqs: int = 16
    batch_size: int = 4
    bos: BosPolicy = "auto"
    corpus: str = "stdlib"
    tokens: str | None = None  # a .npy file of token ids (N×T), taken verbatim instead of the corpus
    cross_documents: bool = False
    grid: GridKind = "coarse"
    early: int = 32
    seed: int = 0
    bootstrap: int = 200
    interventions: Interventions = field(default_factory=Interventions)
    # Where the model runs (posleak.device): the dtype changes the model's q, k and log Z, so it is part of the
    # resume fingerprint like every option; the sums are float64 whatever these say.
    device: str = Placement.device
    dtype: str = Placement.dtype
    device_map: str | None = Placement.device_map
    max_memory: str | None = Placement.max_memory
    # Bytes of captures that may stay on the model's device, each layer measured there during the last forward
    # (posleak.device.measure_budget: "auto", a number of bytes or a size such as "8GiB"); beyond it, captures go
    # to the host or the run folder. It changes no number, only where the captures wait.
    measure_budget: str = "auto"
    # The analysis of a null of the sequences instead of the sequences (posleak.data.nulls, docs/method.md §14):
    # "shift" or "shuffle", drawn with `null_seed`; None analyses the sequences as they are.
    null: NullKind | None = None
    null_seed: int = 0

    @property
    def placement(self) -> Placement:
        return Placement(self.device, self.dtype, self.device_map, self.max_memory)

    def identity(self) -> dict[str, Any]:
        """The options a run's resume fingerprint covers: every one but `measure_budget`, which changes where the
        captures wait and no number, so a killed run resumes under another budget. Without a null the null's
        options are left out, so that the run folders written before nulls existed keep their fingerprint."""
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        options["interventions"] = self.interventions.to_dict()
        del options["measure_budget"]
        if self.null is None:
            del options["null"], options["null_seed"]
        return options

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
        found += budget_problems(self.measure_budget)
        found += self.null_problems()
        if self.grid not in GRIDS:
            found.append(f"unknown --grid {self.grid!r}; use {' or '.join(GRIDS)}")
        if self.grid == "exact" and seq_len > EXACT_TABLES_UP_TO:
            found.append(
                f"--grid exact writes one table row per (query, offset) pair and head, too many at T = {seq_len}; "
                f"use --grid coarse (the magnitudes are the same on every grid) or T ≤ {EXACT_TABLES_UP_TO}"
            )
        return found

    def null_problems(self) -> list[str]:
        """What is wrong with the null's options (`problems` includes them)."""
        found = []
        if self.null is not None and self.null not in NULLS:
            found.append(f"unknown --null {self.null!r}; use one of {', '.join(NULLS)}")
        if not 0 <= self.null_seed < SEEDS:
            found.append(f"--null-seed {self.null_seed} is out of range; use a seed from 0 to {SEEDS - 1}")
        elif self.null is None and self.null_seed != 0:
            found.append(f"--null-seed {self.null_seed} without --null; name the null it draws (shift or shuffle)")
        return found


def tables_grid(config: AnalyzeConfig, seq_len: int) -> Grid:
    """The grid the profile and offset-map tables are written on (T ≤ EXACT_TABLES_UP_TO for the exact grid,
    `AnalyzeConfig.problems`); the magnitudes never depend on it."""
    return Grid(seq_len, config.grid)
