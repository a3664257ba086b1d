"""How many analyses and lab models a plan runs, counted with the functions that make them, so that the docs and
the benchmarks that state these counts (docs/performance.md, benchmarks/bench_scale.py) take them from the code."""

from __future__ import annotations

from posleak.experiments.paper.claims.registry import CLAIMS
from posleak.experiments.paper.plan import SAMPLES, Plan
from posleak.experiments.paper.reproduction import shared_requests


def analysis_count(plan: Plan) -> int:
    """The analyses `reproduce` runs under `plan` on one corpus where every part of every claim can test it (the
    sliding model's T exceeding its window; C3's units: claims.c3.units.unit_analyses, an untestable unit runs none
    of its runs, the built-in models at T = 256: two of three since 2026-12-06): on each sample the shared
    analyses (reproduction.shared_requests), then each claim's own (`ClaimModule.own_analyses`). A plan whose count
    depends on the models (C3 in each model's other BOS setting) is refused: ValueError."""
    shared = sum(len(shared_requests(plan, CLAIMS, sample)) for sample in SAMPLES)
    return shared + sum(claim.own_analyses(plan) for claim in CLAIMS)


def lab_model_count(plan: Plan) -> int:
    """The lab models the claims train (`ClaimModule.lab_models`: C4's controlled line)."""
    return sum(claim.lab_models(plan) for claim in CLAIMS)
