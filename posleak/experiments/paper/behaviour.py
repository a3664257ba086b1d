"""Each intervention of the reproduction against its baseline: the effect on the model's next-token loss and
top-1 accuracy (posleak.measure.behaviour), so that each effect on the leakage comes with its effect on what the
model predicts."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from posleak.experiments.paper.claim import ClaimModule
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.measure.behaviour import behaviour_table
from posleak.report.html import TableBlock


def behaviour_tables(claims: Sequence[ClaimModule], runs: SampleRuns, sample: str, resamples: int) -> pd.DataFrame:
    """Every intervention the claims run against its baseline on one sample: the model's next-token loss and top-1
    accuracy by position bucket, with paired intervals, one block of rows per claim and intervention."""
    frames = [
        behaviour_table(base, new, resamples=resamples, units=base.units).assign(claim=claim.name, intervention=name)
        for claim in claims
        for name, (base, new) in claim.interventions(runs, sample).items()
    ]
    table = pd.concat(frames, ignore_index=True)
    return table[["claim", "intervention", *table.columns[:-2]]]


def behaviour_block(table: pd.DataFrame, claim: str, sample: str) -> TableBlock:
    """A claim's interventions' change of loss and accuracy, per bucket, for reading (3 significant digits)."""
    rows = []
    for (name, bucket), cell in table[table["claim"] == claim].groupby(["intervention", "bucket"], sort=False):
        loss, acc = cell.set_index("measure").loc["loss"], cell.set_index("measure").loc["accuracy"]
        rows.append(
            {
                "intervention": name,
                "queries": f"{bucket} ({int(loss.query_lo)}–{int(loss.query_hi) - 1})",
                "loss": f"{loss.baseline:.3g} → {loss.intervened:.3g}",
                "Δ loss (nats)": f"{loss.change:+.3g} ({loss.change_lo:+.3g} to {loss.change_hi:+.3g})",
                "Δ top-1 (points)": f"{100 * acc.change:+.3g} "
                f"({100 * acc.change_lo:+.3g} to {100 * acc.change_hi:+.3g})",
            }
        )
    return TableBlock(
        f"Effect on the model's next-token loss and top-1 accuracy (sample {sample})",
        pd.DataFrame(rows),
        caption="Intervened − baseline on the same sequences, 95% paired bootstrap intervals over documents.",
        max_rows=None,
        source=f"behaviour_{sample}.parquet",
    )
