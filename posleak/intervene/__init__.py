"""Interventions (docs/method.md §9): BOS replacement, position-0 patching, sink-value ablation,
RoPE scaling at load time, and window overrides, bundled in `Interventions`."""

from posleak.intervene.spec import Interventions

__all__ = ["Interventions"]
