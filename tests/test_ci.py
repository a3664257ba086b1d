"""CI cannot pass without the browser tests: `.ci/run` stops when Chromium cannot be installed or cannot start, and
sets POSLEAK_REQUIRE_BROWSER=1, under which a browser test fails where it would otherwise skip.

`.ci/run` is run for real with a PATH of its own: the few system tools it uses, plus stand-ins for `apt-get`,
`chromium` and `make` (the real ones would install system packages or run this whole suite again)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("bash", "dirname", "mktemp", "rm", "timeout")


def _ci(tmp_path: Path, apt_get: str, chromium: str | None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run .ci/run with stand-ins whose bodies are the given shell lines; returns the process and make's log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    make_log = tmp_path / "make.log"
    stand_ins = {"apt-get": apt_get, "make": f'echo "$* POSLEAK_REQUIRE_BROWSER=$POSLEAK_REQUIRE_BROWSER" > {make_log}'}
    if chromium is not None:
        stand_ins["chromium"] = chromium
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    proc = subprocess.run(
        [str(ROOT / ".ci" / "run")], capture_output=True, text=True, env={"PATH": str(bin_dir)}, timeout=60
    )
    return proc, make_log


BODY = "echo '<html><head></head><body></body></html>'"


@pytest.mark.parametrize(
    ("apt_get", "chromium", "message"),
    [
        ("exit 100", None, "could not install Chromium"),
        ("exit 0", None, "could not install Chromium"),  # apt-get "succeeded" but no chromium came of it
        ("exit 1", "exit 1", "does not start headless"),
        ("exit 1", "echo 'no DOM here'", "does not start headless"),
    ],
)
def test_ci_stops_without_a_working_chromium(tmp_path: Path, apt_get: str, chromium: str | None, message: str) -> None:
    """No Chromium after apt-get, or one that does not print a DOM headless: exit non-zero before make."""
    proc, make_log = _ci(tmp_path, apt_get, chromium)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not make_log.exists(), "the tests ran without a browser"


def test_ci_runs_make_test_requiring_the_browser(tmp_path: Path) -> None:
    """With a working Chromium, .ci/run runs `make test` with POSLEAK_REQUIRE_BROWSER=1."""
    proc, make_log = _ci(tmp_path, "exit 1", BODY)
    assert proc.returncode == 0, proc.stderr
    assert make_log.read_text().split() == ["test", "POSLEAK_REQUIRE_BROWSER=1"]


@pytest.mark.parametrize(("required", "outcome"), [("1", "1 failed"), ("0", "1 skipped")])
def test_browser_test_without_chromium_fails_only_when_required(tmp_path: Path, required: str, outcome: str) -> None:
    """The report's browser test in a fresh pytest with no Chromium on PATH: skipped normally, failed under CI."""
    no_tools = tmp_path / "empty"
    no_tools.mkdir()
    env = {**os.environ, "PATH": str(no_tools), "POSLEAK_REQUIRE_BROWSER": required}
    test = "tests/test_report.py::test_report_in_headless_chromium"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert outcome in proc.stdout, proc.stdout[-3000:]
    if required == "1":
        assert "POSLEAK_REQUIRE_BROWSER=1 but Chromium is not installed" in proc.stdout
