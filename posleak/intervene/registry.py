"""The registered interventions by name, in the order they are checked, recorded and installed, and the
command-line options they declare. Adding an intervention: one module with an `Intervention` (see
posleak.intervene.base) and its line here; its options then reach the command line, `Interventions`, batch files
and the run's fingerprint."""

from __future__ import annotations

from typing import Any

from posleak.intervene.ablate_sinks import AblateSinkValues
from posleak.intervene.base import Intervention, Option
from posleak.intervene.hold_sink_clock import HoldSinkClock
from posleak.intervene.patch_kv0 import PatchKv0
from posleak.intervene.patch_pos0 import PatchPos0
from posleak.intervene.remove_sink_reads import RemoveSinkReads
from posleak.intervene.replace_bos import ReplaceBos
from posleak.intervene.rope_scaling import RopeScaling
from posleak.intervene.window import Window

REGISTRY: dict[str, Intervention] = {
    intervention.name: intervention
    for intervention in (
        ReplaceBos(),
        PatchPos0(),
        AblateSinkValues(),
        PatchKv0(),
        HoldSinkClock(),
        RemoveSinkReads(),
        RopeScaling(),
        Window(),
    )
}


def registered() -> list[Intervention]:
    return list(REGISTRY.values())


def registered_options() -> list[Option]:
    """Every registered intervention's options, in order."""
    return [option for intervention in registered() for option in intervention.options]


def option_defaults() -> dict[str, Any]:
    """Every registered option's default, by name."""
    return {option.name: option.default for option in registered_options()}
