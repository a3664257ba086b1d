"""posleak: where does the absolute-position information in a decoder's attention come from?

The API a user reaches for is exported here (`posleak.analyze(...)`, `posleak.AnalyzeConfig(...)`); each name is
imported on first use, so that `import posleak` stays light (the command line imports only what a command needs).

The package is built in floors, each importing only its own and those below it (the layout table of
docs/architecture.md, which tests/test_layout.py reads, is the one place the order is written), bottom floor first:
base → store → runner → report → data → capture → models → measure → interventions → pipeline → commands → lab →
experiments → cli → api (this module: the front door).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from posleak.errors import BadInput, PosleakError
from posleak.version import __version__

if TYPE_CHECKING:
    from posleak.commands.analyze import analyze
    from posleak.commands.intervene import InterventionRun, intervene
    from posleak.experiments.paper import FULL, QUICK, Plan, paper_plan, reproduce
    from posleak.interventions import Interventions
    from posleak.measure import LayerResult, MeasureSpec, measure_layer
    from posleak.models.load import LoadedModel, load_model
    from posleak.pipeline import (
        AnalysisOptions,
        AnalysisResult,
        AnalyzeConfig,
        Execution,
        MeasureOptions,
        PreparedRun,
        analyze_model,
        prepare,
    )

# name → the module that defines it (the floors above the base: imported when the name is first asked for)
_EXPORTS = {
    "analyze": "posleak.commands.analyze",
    "intervene": "posleak.commands.intervene",
    "InterventionRun": "posleak.commands.intervene",
    "reproduce": "posleak.experiments.paper",
    "paper_plan": "posleak.experiments.paper",
    "Plan": "posleak.experiments.paper",
    "QUICK": "posleak.experiments.paper",
    "FULL": "posleak.experiments.paper",
    "AnalyzeConfig": "posleak.pipeline",
    "AnalysisOptions": "posleak.pipeline",
    "MeasureOptions": "posleak.pipeline",
    "Execution": "posleak.pipeline",
    "AnalysisResult": "posleak.pipeline",
    "PreparedRun": "posleak.pipeline",
    "analyze_model": "posleak.pipeline",
    "prepare": "posleak.pipeline",
    "Interventions": "posleak.interventions",
    "measure_layer": "posleak.measure",
    "MeasureSpec": "posleak.measure",
    "LayerResult": "posleak.measure",
    "load_model": "posleak.models.load",
    "LoadedModel": "posleak.models.load",
}

__all__ = [
    "FULL",
    "QUICK",
    "AnalysisOptions",
    "AnalysisResult",
    "AnalyzeConfig",
    "BadInput",
    "Execution",
    "InterventionRun",
    "Interventions",
    "LayerResult",
    "LoadedModel",
    "MeasureOptions",
    "MeasureSpec",
    "Plan",
    "PosleakError",
    "PreparedRun",
    "__version__",
    "analyze",
    "analyze_model",
    "intervene",
    "load_model",
    "measure_layer",
    "paper_plan",
    "prepare",
    "reproduce",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'posleak' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # asked once: a plain attribute from then on
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
