"""The self-contained HTML report of a run: one `report.html`, readable offline and mailable as one file.

Figures are embedded as base64 PNG data URIs, tables as HTML (long ones truncated with a note, optionally
folded into <details>), the manifest's provenance as a definition list. There is no external CSS, font or
script, and no JavaScript at all. Every piece of text is HTML-escaped before the few inline marks of the
"markdown-ish" section text (`code`, **bold**, *italic*, "- " bullet lists, blank-line paragraphs) are applied.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from posleak.store import RunFolder, atomic_write
from posleak.version import __version__

Verdict = Literal["consistent", "not consistent", "inconclusive"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# docs/method.md, shipped inside the package (posleak/method.md links to it in the source tree)
METHOD = Path(__file__).resolve().parent.parent / "method.md"
METHOD_FILE = "method.md"


@dataclass(frozen=True)
class FigureBlock:
    """A PNG on disk and the caption printed under it."""

    path: Path
    caption: str = ""


@dataclass(frozen=True)
class TableBlock:
    """A table with a title; rows beyond `max_rows` are left out with a note pointing to `source`."""

    title: str
    df: pd.DataFrame
    caption: str = ""
    max_rows: int | None = 40
    collapsed: bool = False  # fold into <details>, for tables a reader opens on purpose (per head, say)
    source: str = ""  # where the full table lives, e.g. "per_head.parquet"
    wrap: tuple[str, ...] = ()  # columns whose long cells wrap (lists of heads): others stay on one line


@dataclass
class Section:
    """One heading of the report; `verdict` is for claim sections (C1–C6)."""

    heading: str
    text: str = ""
    figures: Sequence[FigureBlock | Path] = field(default_factory=list)
    tables: Sequence[TableBlock] = field(default_factory=list)
    verdict: Verdict | None = None


CSS = """
:root { --ink: #1d2125; --muted: #5b636b; --rule: #dde1e5; --panel: #f6f7f8; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.55;
  font: 16px/1.55 "Charter", "Bitstream Charter", "Georgia", "DejaVu Serif", serif; }
main { max-width: 980px; margin: 0 auto; padding: 2.5rem 1.5rem 4rem; }
h1, h2, h3, nav, .meta, table, dl, figcaption, .verdict, summary, .note, footer {
  font-family: system-ui, -apple-system, "Segoe UI", "Helvetica Neue", "DejaVu Sans", Arial, sans-serif; }
h1 { font-size: 1.75rem; line-height: 1.25; margin: 0 0 .4rem; }
h2 { font-size: 1.3rem; margin: 2.6rem 0 .8rem; padding-bottom: .3rem; border-bottom: 1px solid var(--rule);
  display: flex; align-items: center; gap: .75rem; flex-wrap: wrap; }
h3 { font-size: 1rem; margin: 1.6rem 0 .5rem; }
.meta { color: var(--muted); font-size: .9rem; margin: 0; }
nav { background: var(--panel); border: 1px solid var(--rule); border-radius: 6px; padding: .8rem 1.2rem;
  margin: 1.8rem 0; font-size: .92rem; }
nav ol { margin: .3rem 0 0; padding-left: 1.3rem; }
nav li { margin: .15rem 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
p { margin: .7rem 0; }
code { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .86em; background: var(--panel);
  padding: .05em .3em; border-radius: 3px; overflow-wrap: anywhere; }
figure { margin: 1.4rem 0; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { color: var(--muted); font-size: .88rem; margin-top: .5rem; }
.table-wrap { overflow-x: auto; margin: .4rem 0; }
table { border-collapse: collapse; font-size: .82rem; font-variant-numeric: tabular-nums; }
th, td { padding: .28rem .65rem; text-align: right; white-space: nowrap; }
thead th { border-bottom: 2px solid var(--ink); }
tbody tr:nth-child(even) { background: var(--panel); }
tbody tr:last-child td { border-bottom: 1px solid var(--rule); }
.note { color: var(--muted); font-size: .85rem; margin: .3rem 0 1rem; }
details { margin: 1rem 0; }
summary { cursor: pointer; font-weight: 600; font-size: .95rem; }
.verdict { font-size: .78rem; font-weight: 600; letter-spacing: .02em; padding: .15rem .6rem;
  border-radius: 999px; border: 1px solid; white-space: nowrap; }
.verdict.consistent { color: #11652b; background: #e7f5ec; border-color: #9fd3b1; }
.verdict.not-consistent { color: #a3211a; background: #fdecea; border-color: #f1aaa4; }
.verdict.inconclusive { color: #7a5a00; background: #fdf6e0; border-color: #e6cf86; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1.2rem; font-size: .88rem; margin: .4rem 0; }
dt { color: var(--muted); }
dd { margin: 0; overflow-wrap: anywhere; }
dd dl { margin: 0 0 .3rem; }
footer { margin-top: 3rem; padding-top: .8rem; border-top: 1px solid var(--rule); color: var(--muted);
  font-size: .82rem; }
td.wrap, th.wrap { white-space: normal; min-width: 6rem; max-width: 30rem; }
"""


def _emphasis(escaped: str) -> str:
    escaped = re.sub(r"\*\*(\S(?:.*?\S)?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"\*(\S(?:.*?\S)?)\*", r"<em>\1</em>", escaped)


def inline(text: str) -> str:
    """Escape `text`, then mark up `code` spans (left literal) and **bold** / *italic* outside them."""
    parts = escape(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick is literal text, not the start of a code span
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return "".join(f"<code>{part}</code>" if index % 2 else _emphasis(part) for index, part in enumerate(parts))


def paragraphs(text: str) -> str:
    """Blank-line separated blocks: a block whose every line starts with "- " is a list, others a paragraph."""
    html = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        if all(line.startswith("- ") for line in lines):
            html.append("<ul>" + "".join(f"<li>{inline(line[2:])}</li>" for line in lines) + "</ul>")
        else:
            html.append(f"<p>{inline(' '.join(lines))}</p>")
    return "\n".join(html)


def _float(value: float) -> str:
    return f"{value:.4g}"


def _figure(item: FigureBlock | Path) -> str:
    block = item if isinstance(item, FigureBlock) else FigureBlock(Path(item))
    data = Path(block.path).read_bytes()
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError(f"{block.path} is not a PNG; the report embeds PNG figures only")
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    alt = escape(block.caption or Path(block.path).stem, quote=True)
    caption = f"<figcaption>{inline(block.caption)}</figcaption>" if block.caption else ""
    return f'<figure><img src="{uri}" alt="{alt}">{caption}</figure>'


def _table(block: TableBlock) -> str:
    df, rows = block.df, len(block.df)
    shown = df if block.max_rows is None or rows <= block.max_rows else df.head(block.max_rows)
    body = _wrapped(
        shown.to_html(index=False, border=0, float_format=_float, na_rep="—", escape=True), shown, block.wrap
    )
    notes = [inline(block.caption)] if block.caption else []
    if len(shown) < rows:
        where = f"in <code>{escape(block.source)}</code>" if block.source else "in the run folder"
        notes.append(f"Showing the first {len(shown)} of {rows} rows; the full table is {where}.")
    note = "".join(f'<p class="note">{note}</p>' for note in notes)
    table = f'<div class="table-wrap">{body}</div>{note}'
    if block.collapsed:
        return f"<details><summary>{escape(block.title)} ({rows} rows)</summary>{table}</details>"
    return f"<h3>{escape(block.title)}</h3>{table}"


def _wrapped(body: str, df: pd.DataFrame, columns: tuple[str, ...]) -> str:
    """The table's cells and headers of `columns` marked `class="wrap"`: the one place a cell may break across
    lines (cell text is escaped, so every `<td>` or `<th>` opens a cell)."""
    wrap = {i for i, name in enumerate(df.columns) if name in columns}

    def row(html: str) -> str:
        for tag in ("td", "th"):
            first, *cells = html.split(f"<{tag}>")
            html = first + "".join(
                (f'<{tag} class="wrap">' if i in wrap else f"<{tag}>") + cell for i, cell in enumerate(cells)
            )
        return html

    return "<tr>".join(row(html) for html in body.split("<tr>")) if wrap else body


def _badge(verdict: Verdict) -> str:
    css = verdict.replace(" ", "-")
    return f'<span class="verdict {css}" title="verdict on the paper\'s claim">{escape(verdict)}</span>'


def _section(index: int, section: Section) -> str:
    badge = _badge(section.verdict) if section.verdict else ""
    parts = [f'<section id="section-{index}"><h2>{escape(section.heading)}{badge}</h2>', paragraphs(section.text)]
    parts += [_figure(item) for item in section.figures]
    parts += [_table(block) for block in section.tables]
    return "\n".join(parts) + "</section>"


def _value(value: Any) -> str:
    """A manifest value: mappings nest as definition lists, lists of scalars join, long tokens go in <code>."""
    if isinstance(value, Mapping):
        return _definitions(value) if value else "—"
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        if all(not isinstance(item, Mapping | list | tuple) for item in value):
            return ", ".join(_value(item) for item in value)
        return "<ol>" + "".join(f"<li>{_value(item)}</li>" for item in value) + "</ol>"
    if value is None:
        return "—"
    text = str(value)
    return f"<code>{escape(text)}</code>" if len(text) > 24 and " " not in text else escape(text)


def _definitions(mapping: Mapping[str, Any]) -> str:
    items = "".join(f"<dt>{escape(str(key))}</dt><dd>{_value(value)}</dd>" for key, value in mapping.items())
    return f"<dl>{items}</dl>"


def _meta_line(manifest: Mapping[str, Any]) -> str:
    model = manifest.get("model")
    facts = [f"model {model['id']}"] if isinstance(model, Mapping) and "id" in model else []
    facts.append(f"run status: {manifest.get('status', 'unfinished')}")
    if "created_utc" in manifest:
        facts.append(f"created {manifest['created_utc']}")
    return " · ".join(escape(str(fact)) for fact in facts)


def render_report(
    run: RunFolder,
    title: str,
    sections: Sequence[Section],
    *,
    manifest: Mapping[str, Any] | None = None,
) -> Path:
    """Write `run`'s `report.html` from `sections`, ending with the provenance of `manifest`.

    `manifest` defaults to the run's own `manifest.json`; pass it when the report is rendered before the
    run is finished (the manifest is written last, so that a complete manifest means a complete folder).
    """
    manifest = run.read_manifest() if manifest is None else manifest
    toc = "".join(
        f'<li><a href="#section-{index}">{escape(section.heading)}</a>'
        + (f" {_badge(section.verdict)}" if section.verdict else "")
        + "</li>"
        for index, section in enumerate(sections, 1)
    )
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    html = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<main>
<header><h1>{escape(title)}</h1><p class="meta">{_meta_line(manifest)}</p>
<p class="meta">Every number is defined in <a href="{METHOD_FILE}">{METHOD_FILE}</a>, posleak's method, copied
beside this report.</p></header>
<nav><strong>Contents</strong><ol>{toc}<li><a href="#provenance">Provenance</a></li></ol></nav>
{"".join(_section(index, section) for index, section in enumerate(sections, 1))}
<section id="provenance"><h2>Provenance</h2>
<p>Everything this run depended on, as recorded in <code>manifest.json</code>.</p>
{_definitions(manifest)}
</section>
<footer>Generated by posleak {escape(__version__)} on {generated}. Figures are embedded in this file;
the tables are in the run folder as Parquet.</footer>
</main>
</body>
</html>
"""
    method = METHOD.read_bytes()
    atomic_write(run.path / METHOD_FILE, lambda file: file.write(method))
    return atomic_write(run.report_path, lambda file: file.write(html.encode("utf-8")))
