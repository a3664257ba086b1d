"""Report: figures and the self-contained HTML report. It renders only; run folders live in posleak.store."""

from posleak.report.figures import component_magnitudes, lines_by_run, offset_map_figure, profiles_figure
from posleak.report.html import FigureBlock, Section, TableBlock, Verdict, render_report

__all__ = [
    "FigureBlock",
    "Section",
    "TableBlock",
    "Verdict",
    "component_magnitudes",
    "lines_by_run",
    "offset_map_figure",
    "profiles_figure",
    "render_report",
]
