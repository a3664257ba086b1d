"""Run the `posleak` command line in a fresh interpreter, as a user would, and check its errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`posleak ARGS` in a fresh interpreter (POSLEAK_CACHE set to `cache` when given)."""
    env = {**os.environ, **({"POSLEAK_CACHE": str(cache)} if cache is not None else {})}
    return subprocess.run(
        [sys.executable, "-m", "posleak", *args], capture_output=True, text=True, env=env, timeout=600
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit status 2, exactly one line on stderr starting `posleak: error:`, no traceback."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posleak: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def file_stamps(*folders: Path) -> dict[Path, tuple[int, int]]:
    """(inode, mtime in ns) of every file under `folders`: a rerun that reads a file back leaves its stamp, one that
    writes it again (in place or by an atomic replace) changes it."""
    return {
        path: (path.stat().st_ino, path.stat().st_mtime_ns)
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
