"""Interventions (docs/method.md §9), one module each behind one protocol (`base.Intervention`), registered by
name (`registry`): BOS replacement, position-0 patching, sink-value ablation, the path-specific key-0 patch,
RoPE scaling at load time and window overrides; `Interventions` holds one run's options of all of them."""

from posleak.interventions.spec import Interventions

__all__ = ["Interventions"]
