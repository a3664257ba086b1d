"""`posleak lab`: lab variants with and without absolute position, and the normalisation variants, at one budget.

Every variant is a trial (`posleak.lab.trial`) with the same size, data, steps and seed, differing in one
factor from the RoPE baseline:

| variant | position encoding | attention | normalisation |
|---|---|---|---|
| rope | RoPE θ = 10⁴ | causal | softmax |
| nope | none | causal | softmax |
| learned | learned absolute (4× the training length) | causal | softmax |
| sinusoidal | fixed sinusoidal absolute | causal | softmax |
| alibi | ALiBi | causal | softmax |
| rope-ntk | the rope model, NTK-scaled by K = 4 at evaluation | causal | softmax |
| window | RoPE | sliding window of T/4 | softmax |
| sink | RoPE | causal | softmax + learned sink logit |
| sigmoid | RoPE | causal | sigmoid |

NTK scaling is applied at evaluation to the weights of the `rope` variant (θ' = θ·K^(D/(D−2))), the way it is
used in practice — to stretch a trained model's context — and the way docs/method.md §9 applies it to
pretrained models; the factor K = 4 matches the longest evaluation length. Training with a larger base
instead is a `posleak train --rope-scaling ntk:K` (or `--rope-base`) run, which a sweep can compare.

Output in OUT: `lab.parquet` (variant, pe, attention, norm, ppl_1x, ppl_2x, ppl_4x, probe_r2_best, mask_all,
resid_all, then provenance columns) and the gathered tables, figures and report of `posleak.lab.results`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import pandas as pd

from posleak.errors import PosleakError
from posleak.lab.plan import LabPlan
from posleak.lab.trainer import TrainConfig
from posleak.lab.trial import EvalConfig, Trial
from posleak.models.lab.config import VARIANTS, LabSpec

LAB_COLUMNS = (
    "variant",
    "pe",
    "attention",
    "norm",
    "ppl_1x",
    "ppl_2x",
    "ppl_4x",
    "probe_r2_best",
    "mask_all",
    "resid_all",
)


@dataclass(frozen=True)
class LabRun:
    """The shared budget of a lab comparison and the variants it runs."""

    size: str = "tiny"
    bos: bool = True
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    variants: tuple[str, ...] = VARIANTS
    ntk_factor: float = 4.0

    def __post_init__(self) -> None:
        if problems := variant_problems(self.variants):
            raise PosleakError(problems[0])
        if "window" in self.variants and self.train.seq_len < 8:
            raise PosleakError(f"the lab's window variant needs seq_len ≥ 8 (T/4 ≥ 2); got {self.train.seq_len}")

    def trial(self, variant: str) -> Trial:
        base = LabSpec(size=self.size, bos=self.bos)
        overrides: tuple[tuple[str, Any], ...] = ()
        if variant in ("nope", "learned", "sinusoidal", "alibi"):
            spec = replace(base, pe=variant)
        elif variant == "rope-ntk":
            spec = base
            overrides = (("rope_scale_kind", "ntk"), ("rope_factor", self.ntk_factor))
        elif variant == "window":
            spec = replace(base, attention=f"window:{self.train.seq_len // 4}")
        elif variant in ("sink", "sigmoid"):
            spec = replace(base, norm=variant)
        else:
            spec = base
        # trials of several tasks share one output folder: each trial is named by its task too
        name = f"{self.train.task}/{variant}" if self.train.task is not None else variant
        return Trial(name, spec, self.train, self.eval, overrides)

    def trials(self) -> list[Trial]:
        return [self.trial(variant) for variant in self.variants]

    def plan(self) -> LabPlan:
        trials = self.trials()
        return LabPlan(
            trials,
            table_name="lab",
            title="posleak lab: position encodings, masks and normalisations at one budget",
            intro=(
                f"{len(trials)} variants of the {self.size} lab decoder, each trained for {self.train.steps} steps "
                f"of {self.train.batch_size} × {self.train.seq_len} tokens (seed {self.train.seed}, BOS "
                f"{'on' if self.bos else 'off'}). rope-ntk is the rope model with NTK scaling ×{self.ntk_factor:g} "
                "applied at evaluation."
            ),
            settings={"size": self.size, "bos": self.bos, "train": asdict(self.train), "eval": asdict(self.eval)},
            table=lab_table,
        )


def variant_problems(variants: tuple[str, ...]) -> list[str]:
    """The problem with a choice of lab variants: unknown names, or none."""
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        return [f"unknown lab variants {unknown or '(none given)'}; choose from {', '.join(VARIANTS)}"]
    return []


def lab_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows with `variant` first and the LAB_COLUMNS in order, then the rest."""
    table = pd.DataFrame(rows).rename(columns={"name": "variant"})
    ordered = [c for c in LAB_COLUMNS if c in table.columns]
    return table[ordered + [c for c in table.columns if c not in ordered]]
