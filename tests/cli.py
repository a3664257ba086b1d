"""Run the `posleak` command line as a user would (a fresh interpreter) or in this process, and check its errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ERROR = "posleak: error: "


def run_cli(*args: str, cache: Path | None = None, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """`posleak ARGS` in a fresh interpreter (POSLEAK_CACHE set to `cache` when given)."""
    env = {**os.environ, **({"POSLEAK_CACHE": str(cache)} if cache is not None else {})}
    return subprocess.run(
        [sys.executable, "-m", "posleak", *args], capture_output=True, text=True, env=env, timeout=timeout_s
    )


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    """`posleak ARGS` through `posleak.cli.main` in this process: what `run_cli` runs once the interpreter has
    started, without the seconds that importing torch takes. An exception that escapes fails the test."""
    from posleak.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse
            code = exit_.code if isinstance(exit_.code, int) else 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit status 2, exactly one line on stderr starting `posleak: error:`, no traceback."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), proc.stderr
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


def assert_error_lines(proc: subprocess.CompletedProcess[str], *needles: str) -> list[str]:
    """Exit status 2, every line on stderr a `posleak: error:` line (one per problem), no traceback; each needle
    in some line. Returns the lines."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and all(line.startswith(ERROR) for line in lines), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert any(needle in line for line in lines), (needle, lines)
    return lines


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON (a missing number must be null)")


def strict_json_files(*folders: Path) -> dict[Path, object]:
    """Every .json file under `folders`, parsed strictly: a bare NaN, Infinity or -Infinity (which Python's json
    writes by default and jq or JavaScript's JSON.parse reject) fails, naming the file."""
    parsed = {}
    for path in sorted(p for folder in folders for p in folder.rglob("*.json")):
        try:
            parsed[path] = json.loads(path.read_text(), parse_constant=_no_constant)
        except ValueError as err:
            raise AssertionError(f"{path}: {err}") from None
    return parsed
