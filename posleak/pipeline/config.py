"""The options of one analysis run, one object per concern: what sequences (`Recipe`, posleak.data.recipe), how
they are measured (`MeasureOptions`), how the forwards run (`Execution`: batch size, placement, measure budget)
and what is changed in the model (`Interventions`); `AnalyzeConfig` holds the four, and `AnalysisOptions` the
three that analyse finished sequences. Each checks its options before any model is asked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from posleak.data.kinds import GRIDS, GridKind
from posleak.data.recipe import Recipe, seed_problems
from posleak.device import Placement, budget_problems
from posleak.interventions import Interventions
from posleak.measure import NOISE_CORRECTION, Grid
from posleak.store.identity import identity, left_out_at_default

# Profile tables on the exact grid grow as T²·heads·layers rows: refused beyond this length.
EXACT_TABLES_UP_TO = 256
# The noise correction pairs sequences of distinct documents, so it needs two at least.
MIN_SEQS = 2
MAX_RESAMPLES = 100_000  # percentile intervals settle long before; each resample holds N weights in memory


@dataclass(frozen=True)
class MeasureOptions:
    """How the layers are measured (docs/method.md): the tables' grid, the early queries, the bootstrap, where
    the range "beyond" starts, and whether the model's own next-token scores are kept. The options added after the
    first run folders were written are left out of the fingerprint at their defaults (`left_out_at_default`), so
    that those folders keep resuming."""

    grid: GridKind = "coarse"
    early: int = 32
    bootstrap: int = 200
    seed: int = 0  # the bootstrap's draw: the run's --seed, which draws the sequences too
    # W of the range "beyond" = W ≤ i < T (docs/method.md §3): None, the model's sliding window (no range without
    # one); a number, those queries on any model, so that a model without a window is measured on the same
    # queries as a windowed one of width W at the same T
    beyond: int | None = left_out_at_default(None)
    # The model's next-token loss and top-1 hit at every query (tokens.parquet, posleak.measure.behaviour, method
    # §11), through its output layer: an eighth of smollm2-135m's forward at T = 256, more than half of
    # gemma3-270m's at T = 640 (its 262k-word vocabulary). False where nothing compares them (`paper`'s nulls).
    scores: bool = left_out_at_default(True)

    def problems(self, seq_len: int, num_seqs: int | None) -> list[str]:
        """What is wrong with these options for `num_seqs` sequences (None: any number) of `seq_len` tokens."""
        found = []
        if num_seqs is not None and num_seqs < MIN_SEQS:
            found.append(
                f"{num_seqs} sequence(s) are too few: the noise correction of the magnitudes pairs sequences of "
                f"distinct documents, so it needs at least {MIN_SEQS}; use --num-seqs {MIN_SEQS} or more (or "
                f"{MIN_SEQS}+ rows in a token file)"
            )
        if self.early < 2:
            found.append(f"--early {self.early} leaves no early queries (1 ≤ i < K); use K ≥ 2")
        if self.beyond is not None and not 1 <= self.beyond < seq_len:
            found.append(f"--beyond {self.beyond} leaves no queries W ≤ i < T = {seq_len}; use 1 ≤ W < {seq_len}")
        if not 0 <= self.bootstrap <= MAX_RESAMPLES:
            found.append(
                f"--bootstrap {self.bootstrap} is out of range; use 0 (no intervals) up to {MAX_RESAMPLES} resamples"
            )
        found += seed_problems(self.seed)
        if self.grid not in GRIDS:
            found.append(f"unknown --grid {self.grid!r}; use {' or '.join(GRIDS)}")
        if self.grid == "exact" and seq_len > EXACT_TABLES_UP_TO:
            found.append(
                f"--grid exact writes one table row per (query, offset) pair and head, too many at T = {seq_len}; "
                f"use --grid coarse (the magnitudes are the same on every grid) or T ≤ {EXACT_TABLES_UP_TO}"
            )
        return found

    def tables_grid(self, seq_len: int) -> Grid:
        """The grid the profile and offset-map tables are written on; the magnitudes never depend on it."""
        return Grid(seq_len, self.grid)


@dataclass(frozen=True)
class Execution:
    """How the forwards run: sequences per forward, where the model runs (posleak.device: the dtype changes the
    model's q, k and log Z; the sums are float64 whatever it says), and the bytes of captures that may stay on the
    model's device, each layer measured there during the last forward (posleak.device.measure_budget: "auto", a
    number of bytes or a size such as "8GiB"; beyond it they go to the host or the run folder: no number
    changes)."""

    batch_size: int = 4
    placement: Placement = field(default_factory=Placement)
    measure_budget: str = "auto"

    def problems(self) -> list[str]:
        """What is wrong with the batch size and the budget (the placement is checked on its own, before any
        model loads: `Placement.problems`)."""
        found = (
            []
            if self.batch_size >= 1
            else [f"--batch-size {self.batch_size} is below 1; use a batch size of at least 1"]
        )
        return found + budget_problems(self.measure_budget)


@dataclass(frozen=True)
class AnalysisOptions:
    """How finished sequences are analysed: everything of a run but the recipe of its sequences."""

    measure: MeasureOptions = field(default_factory=MeasureOptions)
    execution: Execution = field(default_factory=Execution)
    interventions: Interventions = field(default_factory=Interventions)

    def identity(self) -> dict[str, Any]:
        """The options a run's resume fingerprint covers: every one but `measure_budget`, which changes where the
        captures wait and no number, so that a killed run resumes under another budget."""
        return {
            **identity(self.measure),
            "noise_correction": NOISE_CORRECTION,
            "batch_size": self.execution.batch_size,
            **self.execution.placement.to_dict(),
            "interventions": self.interventions.to_dict(),
        }


# Where each option `AnalyzeConfig` takes by its command-line name goes (`seed` draws sequences and resamples).
_RECIPE = frozenset(f.name for f in dataclasses.fields(Recipe))
_MEASURE = frozenset(f.name for f in dataclasses.fields(MeasureOptions))
_PLACEMENT = frozenset(f.name for f in dataclasses.fields(Placement))
_EXECUTION = frozenset(f.name for f in dataclasses.fields(Execution)) - {"placement"}


@dataclass(frozen=True, init=False)
class AnalyzeConfig:
    """What determines an analysis run (and its resume fingerprint), besides the model: one object per concern.
    Built from its parts, from options by their command-line names (`AnalyzeConfig(seq_len=…, grid=…,
    device=…)`, each set in its part; `seed` in the recipe and the measurement), or both."""

    recipe: Recipe
    measure: MeasureOptions
    execution: Execution
    interventions: Interventions

    OPTIONS = _RECIPE | _MEASURE | _PLACEMENT | _EXECUTION  # the options by name, besides the parts

    def __init__(
        self,
        recipe: Recipe | None = None,
        measure: MeasureOptions | None = None,
        execution: Execution | None = None,
        interventions: Interventions | None = None,
        **options: Any,
    ) -> None:
        if unknown := sorted(set(options) - self.OPTIONS):
            raise TypeError(f"unknown analysis option(s) {unknown}; use {sorted(self.OPTIONS)}")

        def part(given: Any, names: frozenset[str]) -> Any:
            return dataclasses.replace(given, **{name: options[name] for name in names & set(options)})

        execution = part(execution or Execution(), _EXECUTION)
        parts = {
            "recipe": part(recipe or Recipe(), _RECIPE),
            "measure": part(measure or MeasureOptions(), _MEASURE),
            "execution": dataclasses.replace(execution, placement=part(execution.placement, _PLACEMENT)),
            "interventions": interventions if interventions is not None else Interventions(),
        }
        for name, value in parts.items():
            object.__setattr__(self, name, value)  # how a frozen dataclass sets its fields
        if self.recipe.seed != self.measure.seed:  # the fingerprint records one
            raise ValueError("one --seed draws the sequences and the resamples: give the recipe and measure the same")

    def replace(self, **options: Any) -> AnalyzeConfig:
        """These options changed, by their command-line names (`interventions`: an `Interventions`)."""
        interventions = options.pop("interventions", self.interventions)
        return AnalyzeConfig(self.recipe, self.measure, self.execution, interventions, **options)

    @property
    def analysis(self) -> AnalysisOptions:
        return AnalysisOptions(self.measure, self.execution, self.interventions)

    def identity(self) -> dict[str, Any]:
        """The options a run's resume fingerprint covers (`Recipe.identity`, `AnalysisOptions.identity`)."""
        return self.recipe.identity() | self.analysis.identity()

    def problems(self, shape: tuple[int, int] | None = None) -> list[str]:
        """What is wrong with these options, for sequences of `shape` (T, N; by default the recipe's: a token
        file's are known once it is read), before any model is asked (the interventions are checked on their
        own, `Interventions.problems`)."""
        seq_len, num_seqs = shape or (self.recipe.seq_len, self.recipe.num_seqs)
        found = self.measure.problems(seq_len, num_seqs) + self.execution.problems() + self.recipe.problems()
        return list(dict.fromkeys(found))  # the recipe and the bootstrap share --seed
