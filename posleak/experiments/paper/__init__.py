"""`posleak paper`: the reproduction of claims C1–C6 of arXiv 2606.06160 on the built-in models, or on any models
by role (`paper_plan`: `--models ROLE=MODEL,...`, `--plan PLAN.yaml`).

Every analysis is an ordinary `analyze` run folder under `OUT/runs/` and every lab model a lab trial under
`OUT/lab/`, so an interrupted reproduction resumes where it stopped. Each claim is judged by a criterion
written in its own package (claims/c1 … claims/c6), first before any data were seen and since revised after verdicts had
been seen, each revision dated with why in the module (`revisions`, claims.json), on two disjoint samples of
sequences (A and B) cut from disjoint documents, and every analysis, intervention and control runs on each sample
(C3 chooses its heads on a third sample, disjoint from both). A claim is consistent, or
not consistent, only where both samples say so. On several corpora (`--corpus NAME ...`; the full plan's stdlib
and bible-web) the whole reproduction runs on each and a claim is consistent, or not, only where every corpus
says so (corpora.py).

Models by default (plan.py, by role): smollm2-135m (standard RoPE, θ = 1e5), gemma3-270m (5 sliding layers of W = 512 to
one global; sequences longer than the window), qwen2.5-coder-0.5b (RoPE trained with θ = 1e6), smollm2-135m
with NTK-aware scaling at inference, and, for C4's controlled line (judged once, over its seeds), a lab decoder of 8
layers trained with full causal RoPE, a sliding window and a large base, the RoPE one also under NTK scaling at
inference.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posleak.experiments.paper.claims.plans import FULL, QUICK
    from posleak.experiments.paper.models import paper_plan
    from posleak.experiments.paper.plan import Plan
    from posleak.experiments.paper.run import reproduce

# name → the module that defines it, imported on first use: `posleak paper --help` states the plans' sizes from
# claims/plans.py without the reproduction's imports (torch, pandas: seconds)
_EXPORTS = {
    "FULL": "posleak.experiments.paper.claims.plans",
    "QUICK": "posleak.experiments.paper.claims.plans",
    "Plan": "posleak.experiments.paper.plan",
    "paper_plan": "posleak.experiments.paper.models",
    "reproduce": "posleak.experiments.paper.run",
}
__all__ = ["FULL", "QUICK", "Plan", "paper_plan", "reproduce"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
