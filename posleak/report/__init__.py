"""Report: run folders (Parquet tables, manifest, partial state), figures, and the self-contained HTML report."""

from posleak.report.figures import component_magnitudes, lines_by_run, offset_map_figure, profiles_figure
from posleak.report.html import FigureBlock, Section, TableBlock, Verdict, render_report
from posleak.report.runfolder import RunFolder, RunState, TokenCount, atomic_write, fingerprint, provenance, versions

__all__ = [
    "FigureBlock",
    "RunFolder",
    "RunState",
    "Section",
    "TableBlock",
    "TokenCount",
    "Verdict",
    "atomic_write",
    "component_magnitudes",
    "fingerprint",
    "lines_by_run",
    "offset_map_figure",
    "profiles_figure",
    "provenance",
    "render_report",
    "versions",
]
