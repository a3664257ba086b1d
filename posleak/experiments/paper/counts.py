"""How many analyses and lab models a plan runs, counted with the functions that make them, so that the docs and
the benchmarks that state these counts (docs/performance.md, benchmarks/bench_scale.py) take them from the code."""

from __future__ import annotations

import pandas as pd

from posleak.experiments.paper.c3_units import C3_ROLES, Design
from posleak.experiments.paper.c4_lab import lab_trials
from posleak.experiments.paper.plan import SAMPLES, WINDOW_ROLES, Plan
from posleak.experiments.paper.reproduction import shared_analyses


def analysis_count(plan: Plan) -> int:
    """The analyses `reproduce` runs under `plan` on one corpus where every C3 unit can test C3 (sink heads, and as
    many non-sink heads outside the last layer to match them: c3_units.Design.untestable) and the sliding model's T
    exceeds its window; an untestable unit runs none of its C3 runs (the built-in models at T = 256: two of three
    since 2026-12-06). On each sample the shared analyses
    (reproduction.shared_analyses), C4's window line's two models where the plan measures it (c4_window.window_runs)
    and each C3 unit's runs (c3_units.Design.interventions); each unit's baseline on the selection sample. A plan
    that also runs C3 in each
    model's other BOS setting (`c3_both_bos`) adds units as each model's tokenizer allows: it is refused here."""
    if plan.c3_both_bos:
        raise ValueError(f"plan {plan.name!r} runs C3 in the other BOS setting where a tokenizer allows: not counted")
    head = pd.DataFrame({"layer": [0], "head": [0]})
    design = Design(head, [head] * plan.control_draws, [0], pool=1)
    per_unit = len(design.interventions(plan.c3_reported))
    shared = sum(len(shared_analyses(plan, sample)) for sample in SAMPLES)
    window = 0 if plan.window_seq_len is None else len(WINDOW_ROLES)
    return shared + len(SAMPLES) * (window + len(C3_ROLES) * per_unit) + len(C3_ROLES)


def lab_model_count(plan: Plan) -> int:
    """The lab models C4's controlled line trains (c4_lab.lab_trials; the NTK trials reuse the RoPE ones' weights)."""
    return len({trial.train_key for trial in lab_trials(plan)})
