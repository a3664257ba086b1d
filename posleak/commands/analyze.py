"""`posleak analyze`: one model, one set of sequences, the measurements of docs/method.md, one run folder.

A finished run folder is read back; otherwise every option is checked against the model and the output folder
(`posleak.pipeline.prepare`, all problems refused at once), the model is loaded with its load-time
interventions (loaded once), and the pipeline runs it (`posleak.pipeline.analyze_model`).
"""

from __future__ import annotations

from pathlib import Path

from posleak.pipeline import AnalysisResult, AnalyzeConfig, analyze_model, finished_here, prepare
from posleak.store import RunFolder


def analyze(
    spec: str,
    config: AnalyzeConfig,
    *,
    out: Path | str | None = None,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> AnalysisResult:
    """Load the model `spec` (built-in name, folder, hub id), make the sequences, and analyse.

    Every problem with the input is refused at once (BadInput) before anything runs or is written."""
    if out is not None and finished_here(RunFolder(Path(out)), spec, config):
        return AnalysisResult.read(RunFolder(Path(out)))  # finished before: skip loading the model
    return analyze_model(prepare(spec, config, out, trust_remote_code), out, progress=progress)
