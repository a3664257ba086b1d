"""Interventions (docs/method.md §9), one module each: a frozen dataclass of its settings behind one protocol
(`base.Intervention`), registered (`registry`): BOS replacement, position-0 patching, sink-value ablation, the
path-specific key-0 patch, the clock removal and sink-read removal, RoPE scaling at load time and window overrides;
`Interventions` holds one run's tuple of them."""

from posleak.interventions.ablate_sinks import AblateSinkValues
from posleak.interventions.hold_sink_clock import HoldSinkClock
from posleak.interventions.patch_kv0 import PatchKv0
from posleak.interventions.patch_pos0 import PatchPos0
from posleak.interventions.remove_sink_reads import RemoveSinkReads
from posleak.interventions.replace_bos import ReplaceBos
from posleak.interventions.rope_scaling import RopeScaling
from posleak.interventions.spec import Interventions
from posleak.interventions.window import Window

__all__ = [
    "AblateSinkValues",
    "HoldSinkClock",
    "Interventions",
    "PatchKv0",
    "PatchPos0",
    "RemoveSinkReads",
    "ReplaceBos",
    "RopeScaling",
    "Window",
]
