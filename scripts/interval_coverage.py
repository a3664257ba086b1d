"""How often posleak's 95% bootstrap intervals cover the truth, on planted layers (docs/method.md §6; measured: §15.3).

A planted layer (posleak.measure.planted) has a known estimand: 0 for the residual-stream component of a layer
with no absolute position; for a planted effect (a sink at key 0, a term in i·j) the value the estimator tends to
with many sequences, taken here as the mean over a few layers of `--truth-seqs` sequences. Each draw measures a
fresh layer of N sequences with `--bootstrap` resamples and asks whether the interval holds the truth.

Two layouts of the sequences: one window per document (what `posleak paper` draws), and two windows of each of
N/2 documents that share half their q and k (windows of one text share its topic and style), where the noise
correction's pairs and the bootstrap's draws go by document.

    python scripts/interval_coverage.py --num-seqs 4 8 16 32 --draws 200 --out docs/results/interval_coverage.csv

prints one line per (setting, N, magnitude) and writes the table, with a Markdown summary beside it (.md);
`--settings` runs some of the settings only; `--summary CSV` writes the summary of a table already written. With
fewer than four documents there is no interval (posleak.measure.bootstrap.MIN_BOOTSTRAP_UNITS), and the summary
says so.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from posleak.measure import Decomposition, Grid, MeasureSpec, measure_layer
from posleak.measure.bootstrap import MIN_BOOTSTRAP_UNITS
from posleak.measure.planted import Planted, planted_layer

SETTINGS = {
    "no position": Planted(sigma=2.0, token_scale=True),
    "sink at key 0 (4 nats)": Planted(sigma=2.0, sink=4.0),
    "term in i·j": Planted(sigma=2.0, product=1.0),
}
NAMES = ("resid_all", "resid_early", "mask_all")
# windows per document and the share of a window's q and k variance its document gives it
LAYOUTS = {"one window per document": (1, 0.0), "2 windows per document, half shared": (2, 0.5)}


def measured(planted: Planted, seed: int, resamples: int) -> Decomposition:
    spec = MeasureSpec(
        planted.seq_len, planted.num_seqs, Grid(planted.seq_len), resamples=resamples, seed=seed, units=planted.units
    )
    return Decomposition.of([measure_layer(planted_layer(planted, seed), spec)], spec)


def truth(planted: Planted, name: str, num_seqs: int, layers: int) -> float:
    """The estimand: 0 for the residual-stream component with nothing planted, else the mean estimate over
    `layers` planted layers of `num_seqs` sequences each (seeds apart from the draws')."""
    if name.startswith("resid") and planted.sink == 0 and planted.product == 0:
        return 0.0
    large = dataclasses.replace(planted, num_seqs=num_seqs)
    return float(np.mean([measured(large, 10_000 + k, 0).layer_means(name)[0] for k in range(layers)]))


def coverage(planted: Planted, truths: dict[str, float], draws: int, resamples: int) -> dict[str, float]:
    """The share of `draws` layers whose 95% interval of each magnitude holds its truth."""
    held = dict.fromkeys(truths, 0)
    for seed in range(draws):
        result = measured(planted, seed, resamples)
        for name, value in truths.items():
            lo, hi = result.layer_interval(name)
            held[name] += bool(lo[0] <= value <= hi[0])
    return {name: count / draws for name, count in held.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-seqs", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--truth-seqs", type=int, default=256)
    parser.add_argument("--truth-layers", type=int, default=4)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--summary", type=Path, help="write the Markdown summary of this CSV beside it and stop")
    args = parser.parse_args()
    if args.summary is not None:
        args.summary.with_suffix(".md").write_text(summary(pd.read_csv(args.summary)))
        return
    rows = []
    for setting in args.settings:
        planted = dataclasses.replace(SETTINGS[setting], seq_len=args.seq_len)
        truths = {name: truth(planted, name, args.truth_seqs, args.truth_layers) for name in NAMES}
        for layout, (windows, shared) in LAYOUTS.items():
            for n in args.num_seqs:
                documents = n // windows if windows > 1 else 0  # 0: each sequence its own document
                drawn = dataclasses.replace(planted, num_seqs=n, documents=documents, shared=shared)
                shares = coverage(drawn, truths, args.draws, args.bootstrap)
                for name, share in shares.items():
                    rows.append(
                        dict(
                            setting=setting,
                            layout=layout,
                            documents=documents or n,
                            num_seqs=n,
                            magnitude=name,
                            truth=truths[name],
                            coverage=share,
                        )
                    )
                    print(
                        f"{setting:24s} {layout:36s} N={n:3d} {name:12s} truth {truths[name]:.4f} coverage {share:.3f}",
                        flush=True,
                    )
    table = pd.DataFrame(rows).assign(seq_len=args.seq_len, draws=args.draws, bootstrap=args.bootstrap)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
        args.out.with_suffix(".md").write_text(summary(table))


def summary(table: pd.DataFrame) -> str:
    """Coverage by setting, layout and N (rows) and magnitude (columns); "-" where a magnitude was not measured."""
    keys = ["setting", "layout", "num_seqs", "documents"]
    cells = table.set_index([*keys, "magnitude"])["coverage"]

    def cell(documents: int, value: float) -> str:
        if documents < MIN_BOOTSTRAP_UNITS:
            return f"no interval (< {MIN_BOOTSTRAP_UNITS} documents)"
        return "-" if pd.isna(value) else f"{100 * value:.1f}%"

    wide = cells.unstack("magnitude").reindex(columns=list(NAMES))
    first = table.iloc[0]
    lines = [
        f"Coverage of 95% intervals on planted layers (T = {first.seq_len}, {first.draws} draws, "
        f"{first.bootstrap} resamples), scripts/interval_coverage.py",
        "",
        "| setting | layout | N | documents | " + " | ".join(NAMES) + " |",
        "|---|---|---|---|" + "---|" * len(NAMES),
    ]
    for (setting, layout, n, documents), row in wide.iterrows():
        values = " | ".join(cell(documents, row[name]) for name in NAMES)
        lines.append(f"| {setting} | {layout} | {n} | {documents} | {values} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
