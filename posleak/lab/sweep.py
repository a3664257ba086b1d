"""Running lab trials, and sweeps: a YAML grid of lab configurations × seeds, each a trial (train, then measure),
locally or on Ray.

`SweepSpec.plan()` is the sweep's `LabPlan`, run like every lab plan by `posleak.lab.plan.run_plan`.

Spec file:

```yaml
name: pe-by-norm            # optional, the report's title
base:                       # lab and training options shared by every trial
  size: tiny
  steps: 300
  seq_len: 64
grid:                       # every combination of these values is one configuration
  pe: [rope, nope]
  norm: [softmax, sigmoid]
seeds: [0, 1]               # each configuration runs once per seed
eval:                       # optional EvalConfig fields
  probe_seqs: 16
```

Keys of `base` and `grid` are `LabSpec` fields (size, pe, attention, norm, bos, rope_base, rope_scaling,
rotary_fraction) or `TrainConfig` fields (steps, seq_len, batch_size, lr, …, and `task`: a `posleak.lab.tasks`
name, to train on that task's rows and score exact-match accuracy `acc_{m}x` instead of perplexity); the seed
comes from `seeds`.

Trials live under OUT/trials/<key> (see `posleak.lab.trial`), named by a hash of their configuration, so a
finished trial is never rerun — not by a second invocation, nor by a larger sweep that contains it. The
gathered rows go to OUT/sweep.parquet with a report. With the Ray backend every unfinished trial is a Ray
task needing one CPU, on a local cluster started for the sweep or on the cluster at `address`; OUT must
then be a folder every node can write (a shared file system).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from posleak.errors import PosleakError
from posleak.lab.plan import LabPlan
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial
from posleak.models.lab.config import LabSpec
from posleak.store.specfile import SpecFormat, grid_options

LAB_KEYS = frozenset(f.name for f in fields(LabSpec))
TRAIN_KEYS = frozenset(f.name for f in fields(TrainConfig)) - {"seed"}
SWEEP_FILE = SpecFormat(
    kind="sweep spec",
    short="sweep",
    owner="sweep spec",
    module="posleak.lab.sweep",
    sections=("name", "base", "grid", "seeds", "eval"),
    options=LAB_KEYS | TRAIN_KEYS,
    options_hint=(f"use lab options {sorted(LAB_KEYS)} or training options {sorted(TRAIN_KEYS)} (seeds go in 'seeds')"),
)


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file."""

    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: tuple[int, ...]
    eval: EvalConfig

    @classmethod
    def read(cls, path: str | Path) -> SweepSpec:
        return cls.from_dict(SWEEP_FILE.read(path), default_name=Path(path).stem)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], default_name: str = "sweep") -> SweepSpec:
        SWEEP_FILE.check_sections(raw)
        base, grid = SWEEP_FILE.base_and_grid(raw)
        seeds = raw.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
            raise PosleakError("sweep 'seeds' must be a non-empty list of integers")
        return cls(
            name=str(raw.get("name", default_name)),
            base=base,
            grid=grid,
            seeds=tuple(seeds),
            eval=EvalConfig.from_dict(dict(raw.get("eval") or {})),
        )

    def trials(self) -> list[Trial]:
        """Every grid point × seed, in grid order then seed order."""
        trials = []
        for point, options in grid_options(self.base, self.grid):
            name = ",".join(f"{key}={value}" for key, value in point.items()) or "base"
            spec = LabSpec(**{k: v for k, v in options.items() if k in LAB_KEYS})
            train_options = {k: v for k, v in options.items() if k in TRAIN_KEYS}
            for seed in self.seeds:
                trials.append(Trial(name, spec, TrainConfig.from_dict({**train_options, "seed": seed}), self.eval))
        return trials

    def plan(self) -> LabPlan:
        trials = self.trials()
        return LabPlan(
            trials,
            table_name="sweep",
            title=f"posleak sweep: {self.name}",
            intro=(
                f"{len(trials)} trials: {len(trials) // len(self.seeds)} configurations × {len(self.seeds)} seeds. "
                f"Grid: {', '.join(f'{k} ∈ {v}' for k, v in self.grid.items()) or 'none'}; base options: "
                f"{self.base or 'defaults'}."
            ),
            settings={"spec": {"name": self.name, "base": self.base, "grid": self.grid, "seeds": list(self.seeds)}},
        )
