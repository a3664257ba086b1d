"""The registered interventions, in the order they are checked, recorded and installed, and the options their
settings declare. Adding an intervention: one module with an `Intervention` dataclass (see
posleak.interventions.base) and its line here; its settings then reach the command line, `Interventions`, batch
files and the run's fingerprint."""

from __future__ import annotations

from typing import Any

from posleak.interventions.ablate_sinks import AblateSinkValues
from posleak.interventions.base import Intervention, Option
from posleak.interventions.hold_sink_clock import HoldSinkClock
from posleak.interventions.patch_kv0 import PatchKv0
from posleak.interventions.patch_pos0 import PatchPos0
from posleak.interventions.remove_sink_reads import RemoveSinkReads
from posleak.interventions.replace_bos import ReplaceBos
from posleak.interventions.rope_scaling import RopeScaling
from posleak.interventions.window import Window

REGISTRY: dict[str, type[Intervention]] = {
    intervention.name: intervention
    for intervention in (
        ReplaceBos,
        PatchPos0,
        AblateSinkValues,
        PatchKv0,
        HoldSinkClock,
        RemoveSinkReads,
        RopeScaling,
        Window,
    )
}


def registered() -> list[type[Intervention]]:
    return list(REGISTRY.values())


def registered_options() -> list[Option]:
    """Every registered intervention's options, in order."""
    return [option for intervention in registered() for option in intervention.options()]


def option_defaults() -> dict[str, Any]:
    """Every registered option's default, by name."""
    return {option.name: option.default for option in registered_options()}
