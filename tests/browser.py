"""Open a report in headless Chromium (Debian's package) as a reader would: no console errors, every
image loaded, a screenshot with content. Tests marked `needs_chromium` skip where Chromium is missing, saying so,
except under CI (`.ci/run` sets POSLEAK_REQUIRE_BROWSER=1), where they fail instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRED = os.environ.get("POSLEAK_REQUIRE_BROWSER") == "1"
SKIP_REASON = "Chromium is not installed (apt-get install chromium)"
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not REQUIRED, reason=SKIP_REASON)

# Injected into a copy of the report only (the report itself has no script): once the page has loaded,
# it writes each image's naturalWidth into the DOM, which --dump-dom then prints.
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify([...document.images].map((img) => img.complete ? img.naturalWidth : -1));
  document.body.appendChild(out);
});
</script>"""


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        pytest.fail(f"POSLEAK_REQUIRE_BROWSER=1 but {SKIP_REASON}")
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def check_in_chromium(report: Path, tmp_path: Path) -> int:
    """Screenshot `report` and load a probed copy; returns the number of images, all loaded."""
    screenshot = tmp_path / "report.png"
    shown = _chromium(tmp_path / "profile-a", f"--screenshot={screenshot}", "--window-size=1280,2000", report.as_uri())
    assert _console_errors(shown.stderr) == []
    with Image.open(screenshot) as image:
        assert image.size == (1280, 2000)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50

    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dumped = _chromium(tmp_path / "profile-b", "--dump-dom", "--virtual-time-budget=5000", probe.as_uri())
    assert _console_errors(dumped.stderr) == []
    widths = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dumped.stdout).group(1))
    assert widths and all(width > 0 for width in widths), widths
    return len(widths)


class _Sections(HTMLParser):
    """Counts, per <h2> of a dumped DOM, the <table> elements that follow it and have at least one data row."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, int] = {}
        self._heading: str | None = None
        self._in_h2 = False
        self._rows = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._in_h2, self._heading = True, ""
        elif tag == "table":
            self._rows = 0
        elif tag == "td" and self._heading is not None:
            self._rows += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False
            self.tables.setdefault(self._heading or "", 0)
        elif tag == "table" and self._heading is not None and self._rows:
            self.tables[self._heading] += 1

    def handle_data(self, data: str) -> None:
        if self._in_h2 and self._heading is not None:
            self._heading += data.strip() if not self._heading else " " + data.strip()


def section_tables(report: Path, tmp_path: Path) -> dict[str, int]:
    """Per section heading, the tables with data cells that Chromium built from `report` (its DOM, not the file)."""
    dumped = _chromium(tmp_path / "profile-tables", "--dump-dom", "--virtual-time-budget=5000", report.as_uri())
    parser = _Sections()
    parser.feed(dumped.stdout)
    return parser.tables


# Injected like PROBE: for each table, whether it fits its scrolling box, and for each cell marked to wrap, how
# many lines it takes.
LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = JSON.stringify([...document.querySelectorAll(".table-wrap")].map((box) => ({
    fits: box.scrollWidth <= box.clientWidth,
    lines: [...box.querySelectorAll("td.wrap")].map((td) =>
      Math.round(td.getBoundingClientRect().height / parseFloat(getComputedStyle(td).lineHeight || "16"))),
  })));
  document.body.appendChild(out);
});
</script>"""


def table_layout(report: Path, tmp_path: Path) -> list[dict]:
    """Per table of `report` as Chromium lays it out at 1280 px: `fits` (no horizontal scrolling) and the line
    count of each cell marked to wrap."""
    probe = tmp_path / "layout.html"
    probe.write_text(report.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    dumped = _chromium(tmp_path / "profile-layout", "--dump-dom", "--window-size=1280,2000", probe.as_uri())
    return json.loads(re.search(r'<pre id="layout">(.*?)</pre>', dumped.stdout).group(1))
