"""Run folders, figures and the HTML report, on synthetic tables with the real columns.

The numbers are made up (a rendering test); what is checked is the files: PNGs that open, a report that
needs nothing outside itself and escapes what it prints, writes that leave no half-file behind, resuming
that refuses a different run, and (where Chromium is installed) a browser that loads every figure.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import check_in_chromium, needs_chromium, table_layout
from PIL import Image

from posleak.errors import PosleakError
from posleak.experiments.paper.claims.c3.heads import heads_by_layer
from posleak.report import (
    FigureBlock,
    Section,
    TableBlock,
    component_magnitudes,
    lines_by_run,
    offset_map_figure,
    profiles_figure,
    render_report,
)
from posleak.report.html import inline, paragraphs
from posleak.store import RunFolder, TokenCount, provenance

LAYERS, HEADS, T, WINDOW = 12, 4, 512, 128
LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]  # Gemma 3's pattern, repeated
HOSTILE = '<script>alert("x")</script>'


def _bins(length: int, exact_until: int = 64, ratio: float = 1.25) -> list[tuple[int, int]]:
    """The default grid: one position per bin up to `exact_until`, geometric beyond."""
    bins = [(p, p) for p in range(min(exact_until, length))]
    lo = exact_until
    while lo < length:
        hi = min(length - 1, max(lo, int(lo * ratio) - 1))
        bins.append((lo, hi))
        lo = hi + 1
    return bins


def _layer_type(layer: int) -> str:
    return LAYER_TYPES[layer % len(LAYER_TYPES)]


def _valid_pairs(q: tuple[int, int], d: tuple[int, int], window: int | None) -> int:
    """Number of (i, d) with i in q, d in d, d ≤ i and, on a sliding layer, d < W."""
    i = np.arange(q[0], q[1] + 1)
    top = np.minimum(d[1], i if window is None else np.minimum(i, window - 1))
    return int(np.clip(top - d[0] + 1, 0, None).sum())


def _per_layer(rng: np.random.Generator) -> pd.DataFrame:
    layer = np.arange(LAYERS)
    types = [_layer_type(int(x)) for x in layer]
    frame = {
        "layer": layer,
        "layer_type": types,
        "window": [WINDOW if t.startswith("sliding") else None for t in types],
        "mask_early": 0.8 + 0.3 * np.sin(layer / 3) + 0.05 * rng.random(LAYERS),
        "mask_all": 1.1 + 0.3 * np.cos(layer / 4),
        "resid_early": 0.2 + 0.05 * layer,
        "resid_all": 0.1 + 0.04 * layer + 0.02 * rng.random(LAYERS),
    }
    df = pd.DataFrame(frame)
    for column in ("mask_early", "mask_all", "resid_early", "resid_all"):
        df[f"{column}_lo"] = df[column] * 0.9
        df[f"{column}_hi"] = df[column] * 1.1
    df["sink_rate"] = rng.random(LAYERS)
    return df


def _per_head(rng: np.random.Generator) -> pd.DataFrame:
    n = LAYERS * HEADS
    columns = ["sink_score", "mask_early", "mask_all", "resid_early", "resid_all", "resid_early_raw", "resid_all_raw"]
    df = pd.DataFrame({"layer": np.repeat(np.arange(LAYERS), HEADS), "head": np.tile(np.arange(HEADS), LAYERS)})
    for column in [*columns, "dr2_logit", "dr2_logattn"]:
        df[column] = rng.random(n)
    return df


def _grid_cells() -> pd.DataFrame:
    bins = _bins(T)
    rows = []
    for q in bins:
        for d in bins:
            if d[0] > q[1]:
                continue
            rows.append((*q, *d, _valid_pairs(q, d, None), _valid_pairs(q, d, WINDOW)))
    return pd.DataFrame(rows, columns=["q_lo", "q_hi", "d_lo", "d_hi", "cells_global", "cells_sliding"])


def _profiles(rng: np.random.Generator) -> pd.DataFrame:
    grid = _grid_cells()
    i = (grid["q_lo"] + grid["q_hi"]).to_numpy() / 2
    d = (grid["d_lo"] + grid["d_hi"]).to_numpy() / 2
    frames = []
    for layer in range(LAYERS):
        sliding = _layer_type(layer).startswith("sliding")
        cells = grid["cells_sliding" if sliding else "cells_global"]
        for head in range(HEADS):
            frames.append(
                pd.DataFrame(
                    {
                        "layer": layer,
                        "head": head,
                        **{c: grid[c] for c in ("q_lo", "q_hi", "d_lo", "d_hi")},
                        "cells": cells,
                        "g": -np.log1p(d) + 0.1 * rng.standard_normal(len(grid)),
                        "c": -(1.2 + 0.1 * head) * np.log1p(np.minimum(i, WINDOW if sliding else T)),
                        "m_count": -(1 + 0.1 * head) * np.log1p(np.minimum(i, WINDOW if sliding else T)),
                        "w": (0.05 * layer + 0.2) * np.exp(-d / 40) * np.cos(i / 60)
                        + 0.05 * rng.standard_normal(len(grid)),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def _offset_map(profiles: pd.DataFrame) -> pd.DataFrame:
    table = profiles[profiles["cells"] > 0].groupby(["layer", "q_lo", "q_hi", "d_lo", "d_hi"], as_index=False)["w"]
    return table.mean().rename(columns={"w": "value"})


def _manifest(model_id: str = "gemma3-270m") -> dict:
    return provenance(
        model_id=model_id,
        model_hash="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        dtype="float32",
        attention_path="posleak (SDPA with log-sum-exp)",
        data={"bos": "auto", "seq_len": T, "num_seqs": 64, "source_name": "stdlib-docstrings", "seed": 0},
        position0_tokens=[TokenCount(id=2, text="<bos>", sequences=64)],
        grid={"kind": "geometric", "exact_until": 64, "ratio": 1.25},
        interventions=[],
        timings={"load": 12.5, "capture": 80.25},
    )


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    profiles = _profiles(rng)
    return {
        "per_layer": _per_layer(rng),
        "per_head": _per_head(rng),
        "profiles": profiles,
        "offset_map": _offset_map(profiles),
    }


def _figures(run: RunFolder, tables: dict[str, pd.DataFrame]) -> list[Path]:
    per_layer = tables["per_layer"]
    other = per_layer.assign(layer=per_layer["layer"] * 2)
    for column in ("resid_all", "resid_all_lo", "resid_all_hi"):
        other[column] = per_layer[column] * 0.5
    return [
        component_magnitudes(per_layer, run.figure_path("magnitudes")),
        profiles_figure(tables["profiles"], per_layer, run.figure_path("profiles")),
        offset_map_figure(tables["offset_map"], run.figure_path("offset_map")),
        lines_by_run(
            {"gemma3-270m": per_layer, "deeper model": other},
            "resid_all",
            run.figure_path("compare"),
            title="Residual-stream magnitude by relative depth",
            ylabel="magnitude (nats)",
            relative_depth=True,
        ),
    ]


def _report(run: RunFolder, tables: dict[str, pd.DataFrame], figures: list[Path]) -> Path:
    sections = [
        Section(
            "Components by layer",
            "The causal-mask component m(i) and the residual-stream component r(i, d), "
            "as **RMS magnitudes** over `1 ≤ i < 32` and *all* queries.\n\n"
            "- grey bands: sliding-window layers\n- shaded: 95% bootstrap intervals",
            figures=[FigureBlock(figures[0], "Magnitudes by layer."), figures[1]],
            tables=[
                TableBlock("Per layer", tables["per_layer"], source="per_layer.parquet"),
                TableBlock("Per head", tables["per_head"], collapsed=True, max_rows=20, source="per_head.parquet"),
            ],
        ),
        Section("C4: architectures", "Residual accumulates with depth.", figures=figures[2:], verdict="consistent"),
        Section("C5: BOS replacement", "Too few sequences to tell.", verdict="inconclusive"),
        Section("C6: fingerprint", "Not constant across inputs.", verdict="not consistent"),
    ]
    return render_report(run, "posleak report: gemma3-270m", sections)


@pytest.fixture(scope="module")
def rendered(tables: dict[str, pd.DataFrame], tmp_path_factory: pytest.TempPathFactory) -> RunFolder:
    run = RunFolder(tmp_path_factory.mktemp("run"))
    run.begin({"model": "gemma3-270m", "seq_len": T})
    for name, df in tables.items():
        run.write_table(name, df)
    run.finish(_manifest())
    _report(run, tables, _figures(run, tables))
    return run


# --- figures -------------------------------------------------------------------------------------------------


def test_figures_are_valid_pngs(rendered: RunFolder) -> None:
    paths = sorted((rendered.path / "figures").glob("*.png"))
    assert [p.stem for p in paths] == ["compare", "magnitudes", "offset_map", "profiles"]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG"
            assert image.width > 400 and image.height > 300
            # Not blank: a drawn figure has many distinct colours.
            assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50


def test_figure_needs_its_columns(tables: dict[str, pd.DataFrame], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="resid_all"):
        component_magnitudes(tables["per_layer"].drop(columns="resid_all"), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- report --------------------------------------------------------------------------------------------------


def _images(html: str) -> list[str]:
    return re.findall(r"<img\b[^>]*>", html)


def test_report_is_self_contained(rendered: RunFolder) -> None:
    html = rendered.report_path.read_text()
    for external in ('src="http', "src='http", "<link", "<script", "url(", "@import"):
        assert external not in html
    images = _images(html)
    assert len(images) == 4
    for tag in images:
        match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', tag)
        assert match, tag[:80]
        assert base64.b64decode(match.group(1)).startswith(b"\x89PNG\r\n\x1a\n")


def test_report_links_the_method_copied_beside_it(rendered: RunFolder) -> None:
    """Every number a report shows is defined in docs/method.md; the report links to a copy in its folder."""
    assert '<a href="method.md">method.md</a>' in rendered.report_path.read_text()
    project = Path(__file__).resolve().parent.parent
    assert (rendered.path / "method.md").read_bytes() == (project / "docs" / "method.md").read_bytes()


def test_report_holds_tables_verdicts_and_provenance(rendered: RunFolder) -> None:
    html = rendered.report_path.read_text()
    assert html.count("<table") == 2
    assert "<details><summary>Per head (48 rows)</summary>" in html
    assert "Showing the first 20 of 48 rows; the full table is in <code>per_head.parquet</code>." in html
    assert "<th>resid_early_raw</th>" in html
    for verdict in ("consistent", "not-consistent", "inconclusive"):
        assert f'class="verdict {verdict}"' in html
    assert '<section id="provenance">' in html
    assert "<dt>transformers</dt>" in html and "<dt>seq_len</dt><dd>512</dd>" in html
    assert "&lt;bos&gt;" in html  # the token at position 0, escaped
    assert "<strong>RMS magnitudes</strong>" in html and "<code>1 ≤ i &lt; 32</code>" in html
    assert "<li>grey bands: sliding-window layers</li>" in html


def test_report_escapes_text(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    df = pd.DataFrame({HOSTILE: [HOSTILE], "x": [1.23456789]})
    section = Section(HOSTILE, f"text {HOSTILE} and `{HOSTILE}`", tables=[TableBlock(HOSTILE, df)])
    html = render_report(run, HOSTILE, [section], manifest=_manifest(model_id=HOSTILE)).read_text()
    assert "<script" not in html
    assert html.count("&lt;script&gt;") >= 7
    assert "<td>1.235</td>" in html


def test_inline_marks() -> None:
    assert inline("a `b*c*` **d** *e* f_g <h>") == "a <code>b*c*</code> <strong>d</strong> <em>e</em> f_g &lt;h&gt;"
    assert inline("odd ` tick") == "odd ` tick"
    assert inline("2 * 3 * 4") == "2 * 3 * 4"
    assert paragraphs("one\ntwo\n\n- x\n- y") == "<p>one two</p>\n<ul><li>x</li><li>y</li></ul>"


def test_report_rejects_a_non_png(tmp_path: Path) -> None:
    fake = tmp_path / "fake.png"
    fake.write_text("not an image")
    with pytest.raises(ValueError, match="not a PNG"):
        render_report(RunFolder(tmp_path / "run"), "t", [Section("s", figures=[fake])], manifest={})


# --- run folder ----------------------------------------------------------------------------------------------


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_tables_and_manifest_round_trip(rendered: RunFolder, tables: dict[str, pd.DataFrame]) -> None:
    for name, df in tables.items():
        pd.testing.assert_frame_equal(rendered.read_table(name), df)
    manifest = rendered.read_manifest()
    assert manifest["status"] == "complete" and rendered.is_complete
    assert manifest["bos"]["position0_tokens"] == [{"id": 2, "text": "<bos>", "sequences": 64}]
    assert set(manifest["versions"]) >= {"posleak", "torch", "transformers", "python", "platform"}
    assert manifest["versions"]["transformers"]
    assert not rendered.partial_dir.exists()
    assert _leftovers(rendered.path) == []


def test_interrupted_table_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunFolder(tmp_path)
    old = pd.DataFrame({"a": [1, 2, 3]})
    run.write_table("t", old)
    before = run.table_path("t").read_bytes()

    def half_written(self: pd.DataFrame, file, **kwargs) -> None:
        file.write(b"PAR1 half a table")
        raise KeyboardInterrupt  # Ctrl-C in the middle of the write

    monkeypatch.setattr(pd.DataFrame, "to_parquet", half_written)
    with pytest.raises(KeyboardInterrupt):
        run.write_table("t", pd.DataFrame({"a": [4]}))
    with pytest.raises(KeyboardInterrupt):
        run.write_table("new", pd.DataFrame({"a": [4]}))
    monkeypatch.undo()
    assert run.table_path("t").read_bytes() == before
    pd.testing.assert_frame_equal(run.read_table("t"), old)
    assert not run.table_path("new").exists()
    assert _leftovers(tmp_path) == []


def test_unserialisable_manifest_leaves_the_old_one(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    run.write_manifest({"status": "running"})
    with pytest.raises(TypeError):  # a key JSON has no form for (a NaN is written as null, an object as its str)
        run.write_manifest({"status": "complete", "timing": {(0, 1): 1.0}})
    assert run.read_manifest() == {"status": "running"}
    assert not run.is_complete
    assert _leftovers(tmp_path) == []


def test_missing_table_and_manifest_are_one_line_errors(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    with pytest.raises(PosleakError, match="no table 'per_layer'"):
        run.read_table("per_layer")
    with pytest.raises(PosleakError, match="not a posleak run folder"):
        run.read_manifest()
    with pytest.raises(ValueError, match="plain file names"):
        run.table_path("../escape")


def test_resume_keeps_partial_work_and_refuses_a_different_run(tmp_path: Path) -> None:
    args = {"model": "smollm2-135m", "seq_len": 256, "num_seqs": 8, "seed": 0}
    run = RunFolder(tmp_path / "run")
    assert run.begin(args) == "new"
    run.save_partial("layer_0", {"g": [1.0, 2.0]})
    assert run.load_partial("layer_1") is None

    again = RunFolder(tmp_path / "run")
    assert again.begin(dict(reversed(args.items()))) == "resume"  # key order does not matter
    assert again.load_partial("layer_0") == {"g": [1.0, 2.0]}
    with pytest.raises(PosleakError) as error:
        again.begin({**args, "seq_len": 512})
    message = str(error.value)
    assert "\n" not in message and "different run" in message and "--out" in message and "delete" in message

    again.finish({"note": "done"})
    assert again.is_complete and not again.partial_dir.exists()
    assert again.read_manifest()["note"] == "done"
    assert RunFolder(tmp_path / "run").begin(args) == "complete"
    with pytest.raises(PosleakError, match="different run"):
        RunFolder(tmp_path / "run").begin({**args, "seed": 1})
    assert _leftovers(tmp_path) == []


def test_begin_refuses_a_folder_of_other_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(PosleakError, match="not empty"):
        RunFolder(tmp_path).begin({"model": "x"})
    with pytest.raises(RuntimeError, match="never begun"):
        RunFolder(tmp_path).finish({})
    assert not RunFolder(tmp_path).manifest_path.exists()


def test_clear_partial(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    run.begin({"model": "x"})
    run.save_partial("piece", [1, 2])
    run.clear_partial()
    assert run.load_partial("piece") is None and not run.partial_dir.exists()


# --- a real browser ------------------------------------------------------------------------------------------


@needs_chromium
def test_report_in_headless_chromium(rendered: RunFolder, tmp_path: Path) -> None:
    assert check_in_chromium(rendered.report_path, tmp_path) == 4


@needs_chromium
def test_long_head_lists_wrap_inside_the_page(tmp_path: Path) -> None:
    """C3's table of ablated heads: 90 heads over 29 layers (smollm2-135m has about that many sink heads) as
    per-layer lists in a cell marked to wrap stay inside the page, over several lines; the same cell without the
    mark runs off it (what the report did with one unbroken comma list)."""
    heads = pd.DataFrame({"layer": np.arange(90) // 3 % 29, "head": np.arange(90) % 9})
    table = pd.DataFrame(
        {"unit": ["smollm2-135m (no BOS at 0)"], "run": ["kv0-sinks"], "heads": [heads_by_layer(heads)]}
    )
    table["head_count"], table["change_pct"] = 90, -3.21
    sections = [
        Section("wrapped", tables=[TableBlock("heads", table, wrap=("heads",))]),
        Section("unwrapped", tables=[TableBlock("heads", table)]),
    ]
    report = render_report(RunFolder(tmp_path / "run"), "t", sections, manifest={})
    wrapped, unwrapped = table_layout(report, tmp_path)
    assert wrapped["fits"] and wrapped["lines"][0] > 2, wrapped
    assert not unwrapped["fits"] and unwrapped["lines"] == [], unwrapped
