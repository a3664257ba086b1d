"""C6: attention sinks pass forward a deterministic fingerprint of the token at position 0: constant across inputs
with an auto-prepended BOS, varying with the token otherwise.

Measured here, not in an analysis run: h_0 of a few short sequences of each fingerprint model, with its BOS and
without.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch

from posleak.capture import CaptureSession, ResidualCapture
from posleak.data.batches import TokenBatch, iter_batches, without_bos
from posleak.experiments.paper.claim import ClaimModule, quote
from posleak.experiments.paper.plan import FINGERPRINT_ROLES, SAMPLES, SHOWN, RoleName
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Judgement, fact, judge
from posleak.measure.position0 import fingerprint_constancy
from posleak.models.load import LoadedModel
from posleak.report import figures
from posleak.report.html import TableBlock

COS_CONSTANT, COS_VARIES = 0.9999, 0.99  # constant with a BOS, varying without
COS_FAILS = 0.999  # below it with a BOS the fingerprint is not constant; at or above it without, it does not vary
FINGERPRINT_SEQ_LEN = 32  # position 0 is closed: a short sequence shows all of h_0

C6_CRITERION = (
    f"In every model, the mean pairwise cosine of h_0 across inputs is ≥ {COS_CONSTANT} in every layer with a BOS at "
    f"position 0 and below {COS_VARIES} in at least one layer without it. Not consistent if in some model it falls "
    f"below {COS_FAILS} with a BOS, or stays at or above {COS_FAILS} in every layer without it; between those bands, "
    "inconclusive."
)


def claim_c6(fingerprints: Mapping[str, pd.DataFrame]) -> Judgement:
    rows = []
    for label, table in fingerprints.items():
        with_bos, without = float(table["fingerprint_cos_bos"].min()), float(table["fingerprint_cos_nobos"].min())
        rows.append(
            fact(
                f"{label}: least cosine with BOS",
                with_bos,
                with_bos >= COS_CONSTANT,
                with_bos < COS_FAILS,
                f"≥ {COS_CONSTANT}",
            )
        )
        rows.append(
            fact(
                f"{label}: least cosine without BOS",
                without,
                without < COS_VARIES,
                without >= COS_FAILS,
                f"< {COS_VARIES}",
            )
        )
    return judge(rows)


@torch.no_grad()
def position0_states(loaded: LoadedModel, batch: TokenBatch, batch_size: int) -> torch.Tensor:
    """h_0^(l) of every row, (L + 1, N, d): position 0 is closed, so two tokens per row suffice."""
    with ResidualCapture(loaded.model, positions=[0]) as capture:
        session = CaptureSession()
        for seq_index, ids in iter_batches(batch, batch_size):
            session.forward(loaded.model, ids[:, :2], seq_index)
    return capture.states()[:, :, 0]


def fingerprint_table(repro: Reproduction, role: RoleName, sample: str) -> pd.DataFrame:
    """`layer, fingerprint_cos_bos, fingerprint_cos_nobos` for the model of `role` and one sample."""
    model = repro.plan.roles[role].model
    loaded = repro.model(model)
    config = repro.config(role, seq_len=FINGERPRINT_SEQ_LEN, num_seqs=repro.plan.fingerprint_seqs, bos="on")
    with_bos = repro.sample(model, config, sample)
    states_bos = position0_states(loaded, with_bos, repro.plan.batch_size)
    states_nobos = position0_states(loaded, without_bos(with_bos), repro.plan.batch_size)
    return pd.DataFrame(
        {
            "layer": range(states_bos.shape[0]),
            "fingerprint_cos_bos": fingerprint_constancy(states_bos).numpy(),
            "fingerprint_cos_nobos": fingerprint_constancy(states_nobos).numpy(),
        }
    )


class C6(ClaimModule):
    name = "C6"
    statement = (
        "Attention sinks pass forward a deterministic fingerprint of the token at position 0: constant across "
        "inputs with an auto-prepended BOS, varying with the token otherwise."
    )
    roles = FINGERPRINT_ROLES
    criterion = C6_CRITERION
    method = "Mean pairwise cosine similarity of h_0^(l) across inputs, per residual index l (docs/method.md §8)."

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """The fingerprint of each model, by model name, per sample."""
        roles = self.repro.plan.roles
        self.fingerprints = {
            s: {roles[role].name: fingerprint_table(self.repro, role, s) for role in FINGERPRINT_ROLES} for s in SAMPLES
        }

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        return claim_c6(self.fingerprints[sample])

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        """position0_SAMPLE: every model's fingerprint, one row per model and layer (not shown in the report)."""
        tables = self.fingerprints[sample]
        position0 = pd.concat([t.assign(model=m) for m, t in tables.items()], ignore_index=True)
        columns = ["model", "layer", "fingerprint_cos_bos", "fingerprint_cos_nobos"]
        self.repro.out.write_table(f"position0_{sample}", position0[columns])
        return []

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        model = runs.roles["sliding"].name
        return (
            "The paper reports a fingerprint constant with a BOS and varying without; here the least cosine in "
            f"{model} is {quote(judgement, f'{model}: least cosine with BOS')} with a BOS and "
            f"{quote(judgement, f'{model}: least cosine without BOS')} without."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        cos = {
            f"{model} {kind}": table.rename(columns={f"fingerprint_cos_{kind}": "cos"})
            for model, table in self.fingerprints[SHOWN].items()
            for kind in ("bos", "nobos")
        }
        path = self.repro.out.figure_path("c6_fingerprint")
        title = f"Fingerprint constancy of h_0 across inputs (sample {SHOWN})"
        return [figures.lines_by_run(cos, "cos", path, title=title, ylabel="mean pairwise cosine")]
