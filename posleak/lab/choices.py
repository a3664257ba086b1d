"""`posleak lab --task NAME` / `--tasks all`: the lab variants trained on tasks that need position, and what the
measurements say about choosing among them (docs/method.md §12).

Every (task, variant, seed) is a trial (`posleak.lab.trial`), trained on the task's rows instead of the corpus and
scored by exact match at 1×, 2× and 4× the training length; the trials also measure the causal-mask and
residual-stream magnitudes and the position probe on rows of the task. Written into OUT:

- `lab.parquet`: one row per trial;
- `variants.parquet`: per task and variant, the mean over seeds of each measure with a 95% t-interval over seeds
  (`{measure}`, `{measure}_lo`, `{measure}_hi`), the number of seeds, the mean training time and steps, how many
  seeds stopped on each reason (`stops`, e.g. "target 2, plateau 1") and the `outcome` they add up to;
- `choices.parquet`: per task, length multiple and variant, the accuracy and its interval, the rank (1 = highest
  mean), the variants it beats and is beaten by *beyond the seed spread* (95% intervals over seeds that do not
  overlap), the analytic chance level where the task has one, and the variant's mask and residual-stream
  magnitudes and probe R² (means over seeds), its steps, stops and outcome;
- `components.parquet`: per task and length, Spearman's ρ over trials between accuracy and each measured
  component, with a 95% bootstrap interval over trials; `supported` where the interval excludes 0;
- the lab's tables, figures and report (`posleak.lab.results`) with a section on the choices.

Only differences the intervals support are stated as differences; with three seeds an interval is wide
(t = 4.30), so most pairs of close variants are reported as not distinguishable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import stats

from posleak.errors import BadInput
from posleak.lab.plan import LabPlan
from posleak.lab.tasks import TASKS, parse_tasks
from posleak.lab.train_config import TrainConfig, outcome
from posleak.lab.trial import EvalConfig
from posleak.lab.variants import LabRun, lab_table, variant_problems
from posleak.models.lab.config import TASK_SEEDS, TASK_VARIANTS
from posleak.report.html import FigureBlock, Section, TableBlock
from posleak.store import RunFolder, atomic_write
from posleak.validate import Problems, natural_number

# The default budget of a task run (docs/method.md §12): each trial trains until its validation exact match (200
# rows) reaches 99% or has not improved for 6 evaluations of every 50 steps, under a cap of 2000 steps (1000 until
# 2026-12-02: with the lab's torch initialisation learned positions took 850–1750 steps on index; docs/method.md §12).
TASK_TRAIN = TrainConfig(
    steps=2000,
    seq_len=32,
    batch_size=32,
    lr=3e-3,
    warmup_steps=50,
    eval_every=50,
    eval_seqs=200,
    target=0.99,
    patience=6,
)
TASK_EVAL = EvalConfig(probe_seqs=16, analyze_seqs=16, bootstrap=50, task_seqs=200)
COMPONENTS = ("mask_all", "resid_all", "probe_r2_best")
LEVEL = 0.95
RHO_RESAMPLES = 1000


@dataclass(frozen=True)
class TaskLab:
    """The tasks, the variants, the seeds and the shared budget of a task comparison."""

    tasks: tuple[str, ...]
    variants: tuple[str, ...] = TASK_VARIANTS
    seeds: tuple[int, ...] = TASK_SEEDS
    size: str = "tiny"
    bos: bool = True
    train: TrainConfig = TASK_TRAIN
    eval: EvalConfig = TASK_EVAL
    ntk_factor: float = 4.0

    def __post_init__(self) -> None:
        problems = [
            f"unknown task {task}; use all or some of {', '.join(TASKS)}" for task in self.tasks if task not in TASKS
        ]
        problems += variant_problems(self.variants)
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            problems.append(f"seeds {list(self.seeds)} must be distinct non-negative integers, at least one")
        if problems:
            raise BadInput(problems)

    @classmethod
    def from_options(
        cls,
        *,
        task: str | None = None,
        tasks: str | None = None,
        seeds: str | None = None,
        train_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> TaskLab:
        """The task run `posleak lab --task NAME | --tasks all|A,B [--seeds 0,1,2]` names, every problem refused at
        once: `tasks` is all or comma-separated names, `seeds` comma-separated, `train_options` change TASK_TRAIN
        (a `seed` among them is refused: each of `seeds` trains every variant), `options` are TaskLab fields."""
        train_options = dict(train_options or {})
        problems = Problems()
        if task is not None and tasks is not None:
            problems.add("--task and --tasks name the same thing; give one of them")
        if task is None and tasks is None:
            problems.add("--seeds is for task runs; add --task NAME or --tasks all")
        if train_options.get("seed") is not None:
            problems.add("--seed is for corpus runs; a task run trains every variant with each of --seeds")
        names: tuple[str, ...] = ()
        with problems.collecting():
            names = parse_tasks(tasks if tasks is not None else (task or ""))
            if task is not None and len(names) != 1:
                problems.add(f"--task takes one task name, got {task!r}; use --tasks for several")
        if seeds is not None:
            parsed = [natural_number(part.strip()) for part in seeds.split(",")]
            if any(seed is None for seed in parsed) or not parsed:
                problems.add(f"bad --seeds {seeds!r}; use comma-separated non-negative integers, e.g. 0,1,2")
            else:
                options["seeds"] = tuple(seed for seed in parsed if seed is not None)
        config = None
        with problems.collecting():
            config = cls(tasks=names, train=replace(TASK_TRAIN, **train_options), **options)
            config.labs()  # each task's lab checks its variants and its lengths
        problems.raise_any()
        assert config is not None
        return config

    def labs(self) -> list[LabRun]:
        """One lab comparison per task and seed (each validates its own options)."""
        return [
            LabRun(
                size=self.size,
                bos=self.bos,
                train=replace(self.train, task=task, seed=seed),
                eval=self.eval,
                variants=self.variants,
                ntk_factor=self.ntk_factor,
            )
            for task in self.tasks
            for seed in self.seeds
        ]

    def plan(self) -> LabPlan:
        """Every (task, variant, seed) as a trial, and the choices written beside the lab table."""
        multiples = self.eval.length_multiples
        return LabPlan(
            [trial for lab in self.labs() for trial in lab.trials()],
            table_name="lab",
            title="posleak lab: architecture choices on tasks that need position",
            intro=(
                f"Tasks {', '.join(self.tasks)}; variants {', '.join(self.variants)} of the {self.size} lab decoder, "
                f"seeds {', '.join(map(str, self.seeds))}; each trained on {self.train.batch_size} rows × "
                f"{self.train.seq_len} tokens of its task a step (loss on the answers only), {self.train.criterion()}, "
                f"then scored by exact match on {self.eval.task_seqs} fresh rows at "
                f"{', '.join(f'{m}×' for m in multiples)} the training length."
            ),
            settings={
                "tasks": list(self.tasks),
                "variants": list(self.variants),
                "seeds": list(self.seeds),
                "size": self.size,
                "bos": self.bos,
                "train": asdict(self.train),
                "eval": asdict(self.eval),
            },
            table=lab_table,
            extras=lambda run, table: choice_tables(run, table, multiples),
        )


def choice_tables(
    run: RunFolder, table: pd.DataFrame, multiples: tuple[int, ...]
) -> tuple[dict[str, pd.DataFrame], list[Section]]:
    """The variants, choices and components tables of the trials' `table`, and the report's section on them."""
    variants = variant_table(table, multiples)
    choices = choices_table(table, variants, multiples)
    components = components_table(table, multiples)
    tables = {"variants": variants, "choices": choices, "components": components}
    return tables, [choices_section(run, choices, components, variants, multiples)]


def seed_interval(
    values: np.ndarray, level: float = LEVEL, bounds: tuple[float, float] = (-np.inf, np.inf)
) -> tuple[float, float, float]:
    """Mean and t-interval over seeds, clipped to the `bounds` the measure cannot leave (an accuracy lies in
    [0, 1]); NaN bounds with one seed, and the mean itself where every seed agrees."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, float(max(mean - half, bounds[0])), float(min(mean + half, bounds[1]))


def _variant_of(table: pd.DataFrame) -> pd.Series:
    return table["variant"].str.split("/", n=1).str[1]


def variant_table(table: pd.DataFrame, multiples: tuple[int, ...]) -> pd.DataFrame:
    """Per task and variant: mean and t-interval over seeds of accuracy at each length and of each component."""
    table = table.assign(arm=_variant_of(table))
    for column, old in (("stop", "cap"), ("steps_trained", np.nan)):  # rows of trials from before the criterion
        table[column] = table[column].fillna(old) if column in table else old
    measures = [f"acc_{m}x" for m in multiples] + list(COMPONENTS)
    rows = []
    for (task, arm), group in table.groupby(["task", "arm"], sort=False):
        row: dict[str, Any] = {"task": task, "variant": arm, "seeds": len(group), "train_s": group["train_s"].mean()}
        row["steps"] = group["steps_trained"].mean()
        row["stops"], row["outcome"] = outcome(group["stop"].tolist())
        for measure in measures:
            bounds = (0.0, 1.0) if measure.startswith("acc_") else (-np.inf, np.inf)
            row[measure], row[f"{measure}_lo"], row[f"{measure}_hi"] = seed_interval(
                group[measure].to_numpy(), bounds=bounds
            )
        for m in multiples:
            row[f"chance_{m}x"] = float(group[f"chance_{m}x"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def choices_table(table: pd.DataFrame, variants: pd.DataFrame, multiples: tuple[int, ...]) -> pd.DataFrame:
    """Per task, length and variant: accuracy, interval, rank, and which variants it beats or trails beyond the
    seed spread (their 95% intervals over seeds do not overlap)."""
    rows = []
    for task, group in variants.groupby("task", sort=False):
        for m in multiples:
            acc, lo, hi = group[f"acc_{m}x"], group[f"acc_{m}x_lo"], group[f"acc_{m}x_hi"]
            ranks = acc.rank(ascending=False, method="min")
            for k in group.index:
                beats = [group.at[j, "variant"] for j in group.index if j != k and lo[k] > hi[j]]
                trails = [group.at[j, "variant"] for j in group.index if j != k and hi[k] < lo[j]]
                rows.append(
                    {
                        "task": task,
                        "multiple": m,
                        "variant": group.at[k, "variant"],
                        "accuracy": acc[k],
                        "accuracy_lo": lo[k],
                        "accuracy_hi": hi[k],
                        "rank": int(ranks[k]),
                        "beats": ",".join(beats),
                        "trails": ",".join(trails),
                        "chance": group.at[k, f"chance_{m}x"],
                        **{component: group.at[k, component] for component in COMPONENTS},
                        "seeds": int(group.at[k, "seeds"]),
                        **{name: group.at[k, name] for name in ("steps", "stops", "outcome")},
                    }
                )
    return pd.DataFrame(rows).sort_values(["task", "multiple", "rank"], kind="stable", ignore_index=True)


def components_table(table: pd.DataFrame, multiples: tuple[int, ...], seed: int = 0) -> pd.DataFrame:
    """Per task and length: Spearman's ρ over trials (variants × seeds) between accuracy and each component, with a
    percentile interval over resamples of the trials; NaN where accuracy or the component does not vary."""
    rng = np.random.default_rng(seed)
    rows = []
    for task, group in table.groupby("task", sort=False):
        draws = rng.integers(0, len(group), (RHO_RESAMPLES, len(group)))
        for m in multiples:
            for component in COMPONENTS:
                pair = group[[f"acc_{m}x", component]].to_numpy(dtype=float)
                rho = _spearman(pair)
                boot = np.array([_spearman(pair[draw]) for draw in draws])
                # where many resamples leave ρ undefined (accuracy constant in them), the defined ones are a
                # biased selection: no interval then, and nothing is claimed
                defined = np.isfinite(boot).mean() >= LEVEL
                lo, hi = np.nanpercentile(boot, [2.5, 97.5]) if defined else (np.nan, np.nan)
                rows.append(
                    {
                        "task": task,
                        "multiple": m,
                        "component": component,
                        "rho": rho,
                        "rho_lo": float(lo),
                        "rho_hi": float(hi),
                        "trials": len(group),
                        "supported": bool(lo > 0 or hi < 0),
                    }
                )
    return pd.DataFrame(rows)


def _spearman(pair: np.ndarray) -> float:
    pair = pair[np.isfinite(pair).all(axis=1)]
    if len(pair) < 3 or np.ptp(pair[:, 0]) == 0 or np.ptp(pair[:, 1]) == 0:
        return float("nan")
    return float(stats.spearmanr(pair[:, 0], pair[:, 1]).statistic)


COMPONENT_NAMES = {"mask_all": "causal-mask", "resid_all": "residual-stream", "probe_r2_best": "probe R²"}


def choices_section(
    run: RunFolder,
    choices: pd.DataFrame,
    components: pd.DataFrame,
    variants: pd.DataFrame,
    multiples: tuple[int, ...],
) -> Section:
    """Per task: the ranking at each length with the differences the intervals support, and how accuracy goes
    with the measured components."""
    paragraphs = [
        _task_paragraph(task, choices, components, variants, multiples) for task in dict.fromkeys(choices["task"])
    ]
    path = _accuracy_figure(run, variants, multiples)
    return Section(
        "Architecture choices per task",
        "Exact-match accuracy (percent of rows whose every answer token is the model's top-1 prediction), mean over "
        "seeds with a 95% t-interval over seeds. A variant is said to beat another only where the two intervals do "
        "not overlap; ρ is Spearman's correlation over trials (variants × seeds) with a 95% bootstrap interval over "
        "trials (docs/method.md §12).\n\n" + "\n\n".join(paragraphs),
        figures=[
            FigureBlock(path, "Accuracy against evaluation length per task and variant; bars: 95% interval over seeds.")
        ],
        tables=[
            TableBlock("Choices", choices, source="choices.parquet", max_rows=200),
            TableBlock("Accuracy against components", components, collapsed=True, source="components.parquet"),
            TableBlock("Per variant", variants, collapsed=True, source="variants.parquet"),
        ],
    )


def _task_paragraph(
    task: str,
    choices: pd.DataFrame,
    components: pd.DataFrame,
    variants: pd.DataFrame,
    multiples: tuple[int, ...],
) -> str:
    """One task's part of the choices section (see `choices_section`)."""
    lines = [f"**{task}** (needs {TASKS[task].NEEDS} position):"]
    trained = variants[variants["task"] == task]
    lines.append(
        "- training: "
        + "; ".join(f"{r.variant} {r.outcome} ({r.stops}; {r.steps:.0f} steps)" for r in trained.itertuples())
        + "."
    )
    for m in multiples:
        cell = choices[(choices["task"] == task) & (choices["multiple"] == m)]
        ranking = ", ".join(
            f"{r.variant} {100 * r.accuracy:.0f}% ({100 * r.accuracy_lo:.0f}–{100 * r.accuracy_hi:.0f})"
            for r in cell.itertuples()
        )
        beyond = [f"{r.variant} > {name}" for r in cell.itertuples() for name in r.beats.split(",") if name]
        chance = cell["chance"].iloc[0]
        chance_note = f"; chance {100 * chance:.1f}%" if np.isfinite(chance) else ""
        verdict = "; ".join(beyond) if beyond else "no two variants differ beyond the seed spread"
        if not trained["outcome"].str.startswith("learned").any():
            verdict = "no variant learned the task, so these accuracies rank nothing"
        lines.append(f"- {m}×: {ranking}{chance_note}. {verdict}.")
    for m in multiples:
        rel = components[(components["task"] == task) & (components["multiple"] == m)]
        said = [
            f"{COMPONENT_NAMES[r.component]} ρ = {r.rho:+.2f} ({r.rho_lo:+.2f} to {r.rho_hi:+.2f})"
            + ("" if r.supported else ", not distinguishable from 0")
            for r in rel.itertuples()
            if np.isfinite(r.rho)
        ]
        lines.append(
            f"- accuracy at {m}× against the components over trials: "
            + ("; ".join(said) or "undefined (no spread)")
            + "."
        )
    per_variant = variants[variants["task"] == task]
    lines.append(
        "- components per variant (mean over seeds, 95% interval): "
        + "; ".join(
            f"{r.variant}: mask {r.mask_all:.3f} ({r.mask_all_lo:.3f}–{r.mask_all_hi:.3f}), "
            f"resid {r.resid_all:.3f} ({r.resid_all_lo:.3f}–{r.resid_all_hi:.3f})"
            for r in per_variant.itertuples()
        )
        + "."
    )
    return "\n".join(lines)


def _accuracy_figure(run: RunFolder, variants: pd.DataFrame, multiples: tuple[int, ...]) -> Path:
    tasks = list(dict.fromkeys(variants["task"]))
    fig = Figure(figsize=(3.2 * len(tasks) + 1, 3.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(tasks), sharey=True))
    x = np.array(multiples, dtype=float)
    for ax, task in zip(axes, tasks, strict=True):
        for r in variants[variants["task"] == task].itertuples():
            mean = np.array([getattr(r, f"acc_{m}x") for m in multiples])
            lo = np.array([getattr(r, f"acc_{m}x_lo") for m in multiples])
            hi = np.array([getattr(r, f"acc_{m}x_hi") for m in multiples])
            ax.errorbar(
                x, mean, yerr=np.nan_to_num(np.abs([mean - lo, hi - mean])), marker="o", capsize=3, label=r.variant
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, labels=[f"{m}×" for m in multiples])
        ax.set_title(task)
        ax.set_xlabel("length / training length")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("exact-match accuracy")
    axes[-1].legend(frameon=False)
    path = run.figure_path("task_accuracy")
    return atomic_write(path, lambda file: fig.savefig(file, format="png", dpi=150))
