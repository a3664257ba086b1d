"""C6: attention sinks pass forward a deterministic fingerprint of the token at position 0: constant across inputs
with an auto-prepended BOS, varying with the token otherwise.

Measured here, not in an analysis run (docs/method.md §13). Position 0 is a closed system, so h_0 is constant with a
BOS and varies with the token without one by construction: that proves nothing and is only reported (the
`position0_SAMPLE` table). What the claim says is passed *forward* is tested instead, in each fingerprint model (a
model of the plan's roles whose tokenizer does not prepend a BOS itself, so that position 0 can hold another token):
whether later positions carry the identity of the token at position 0 (the identity probe of
posleak.measure.position0, K first tokens named before the data), and whether it goes when the sink heads no longer
read key 0 (`--remove-sink-reads`, docs/method.md §9) by more than when as many matched non-sink heads no longer do
(at T = 32 most heads are sinks, so removing their reads alone nearly cuts position 0 off). The heads are
chosen on the selection sample, which judges nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch

from posleak.capture import CaptureSession, ResidualCapture
from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.data.batches import TokenBatch, iter_batches, without_bos
from posleak.experiments.paper.claim import (
    ACROSS_CORPORA,
    BY_DOCUMENT,
    HOLM_RULE,
    REPLICATED,
    ClaimModule,
    evidence_text,
)
from posleak.experiments.paper.claims.c6.options import C6Options
from posleak.experiments.paper.claims.c6.probe import (
    CHANCE,
    FINGERPRINT_ROLES,
    FINGERPRINT_SEQ_LEN,
    FIRST_TOKENS,
    PROBE_POSITIONS,
    PROBE_ROLES,
    IdentityProbe,
    fingerprint_models,
    measure_probe,
    probe_needs,
    select_heads,
)
from posleak.experiments.paper.plan import SAMPLES, SHOWN, Plan, RoleName
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.requests import SampleNeed
from posleak.experiments.paper.verdict import Judgement, Revision, evidence_row, fact_row, judge
from posleak.measure.position0 import fingerprint_constancy
from posleak.models.load import LoadedModel
from posleak.report import figures
from posleak.report.html import TableBlock

MIN_EFFECT = 5.0  # % points: the least accuracy above chance, and the least lowering by the removal, that count
SINK_CHANGE = "change without sink reads"
CONTROL_CHANGE = "change without control reads"

C6_CRITERION = (
    "In every fingerprint model (a model of the roles whose tokenizer does not prepend a BOS itself, from its "
    "facts; one that does is not probed) without a BOS at position 0 (the first token of each sequence replaced in "
    f"turn by each of K = {len(FIRST_TOKENS)} tokens named before the data: {', '.join(FIRST_TOKENS)}), a probe tells "
    f"which token stood at position 0 from the hidden states at positions {', '.join(map(str, PROBE_POSITIONS))} "
    "(nearest class mean after each sequence's mean over its variants is subtracted, held out by sequence), its "
    "accuracy averaged over the residual states after the first sink head: consistent if its 95% interval lies "
    f"above chance ({CHANCE:g}%) + {MIN_EFFECT:g} points, removing the sink heads' reads of key 0 lowers it by more "
    f"than {MIN_EFFECT:g} points (paired difference, interval below −{MIN_EFFECT:g}), and by more than removing "
    "those of as many matched non-sink heads does (paired difference of the two changes, interval below 0; the "
    "controls' own change reported); not consistent if any interval lies wholly on the other side (Holm over the "
    "deciding rows); inconclusive otherwise. Sink heads (α₀ > "
    f"{SINK_THRESHOLD}) and controls are chosen on the model's baseline on the selection sample at the plan's "
    "sink_seq_len (T = 256 in both plans, as for every claim), disjoint from the samples that judge: for each sink "
    "head, in order of layer, the unused non-sink head of its layer, else of the nearest layer with one left, whose "
    "α₀ is nearest its own. A model with no sink head, or with fewer non-sink heads than sink heads, is "
    "untestable: reported, not deciding (no testable model: inconclusive). h_0's constancy with and without a BOS "
    "(closed by construction) is reported, not judged."
)


def claim_c6(probes: Mapping[str, IdentityProbe]) -> Judgement:
    """Per model (by label): the accuracy above chance, its change without the sink heads' reads and that change
    less the change without the matched controls' reads decide; the controls' own change is reported. A model that
    cannot test the claim (`ProbeHeads.untestable`) gets a row that says so and decides nothing, beside its
    accuracy and the sinks' change where it has sink heads, reported."""
    rows = []
    for label, probe in probes.items():
        why = probe.heads.untestable()
        if why is not None:
            count = sum(map(len, probe.heads.sinks.values()))
            name, threshold = f"{label}: untestable: {why}", "≥ 1, 1 control each"
            rows.append(fact_row(name, count, False, False, threshold, "sink heads", deciding=False))
        if probe.removed is None:
            continue
        deciding = why is None
        rows += [
            evidence_row(
                f"{label}: first-token accuracy", probe.carried(), CHANCE + MIN_EFFECT, "above", "%", deciding
            ),
            evidence_row(
                f"{label}: {SINK_CHANGE}", probe.change(probe.removed), -MIN_EFFECT, "below", "% points", deciding
            ),
        ]
        if probe.control is not None:
            sinks, control = probe.change(probe.removed), probe.change(probe.control)
            rows += [
                evidence_row(
                    f"{label}: {SINK_CHANGE} − {CONTROL_CHANGE}", sinks.minus(control), 0.0, "below", "% points"
                ),
                evidence_row(f"{label}: {CONTROL_CHANGE}", control, -MIN_EFFECT, "below", "% points", deciding=False),
            ]
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
    """`layer, fingerprint_cos_bos, fingerprint_cos_nobos` for the model of `role` and one sample (reported)."""
    model = repro.plan.roles[role].model
    loaded = repro.model(model)
    config = repro.config(
        role, seq_len=FINGERPRINT_SEQ_LEN, num_seqs=repro.plan.option(C6Options).fingerprint_seqs, bos="on"
    )
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
    roles = PROBE_ROLES
    bos_needed: ClassVar[Mapping[RoleName, str]] = {
        role: "C6 compares its h_0 with and without a BOS" for role in FINGERPRINT_ROLES
    }

    @classmethod
    def sample_needs(cls, plan: Plan) -> list[SampleNeed]:
        return probe_needs(plan)

    words = FIRST_TOKENS
    criterion = C6_CRITERION
    revisions = (
        REPLICATED,
        Revision(
            "2026-12-01",
            "not consistent where some model fails either check, inconclusive between the bands (before: not "
            "consistent only where a check failed in every model)",
        ),
        HOLM_RULE,
        Revision(
            "2026-12-04",
            "replaced by a probe of position 0's token identity in later positions of models without a BOS, above "
            "chance + 5 points and lowered by more than 5 points when the sink heads' reads of key 0 are removed; "
            "h_0's constancy with a BOS and its change without one hold by construction (position 0 is closed), "
            "so that check could not fail and is reported; written before the probe had run on a "
            "built-in model",
        ),
        BY_DOCUMENT,
        ACROSS_CORPORA,
        Revision(
            "2026-12-05",
            "judged in the models whose tokenizer does not prepend a BOS (from their facts), with heads chosen on "
            "the selection sample and a third deciding row: the sinks' removal lowers the accuracy more than that "
            "of as many matched non-sink heads; a model with no sink head, or fewer non-sink heads than sink heads, "
            "is untestable and decides nothing (before: gemma3-270m was probed with its BOS forced off and its "
            "'no sink head' row decided; at T = 32 most heads count as sinks, so the removal had no control); sink "
            "heads of every claim chosen at one T, the plan's sink_seq_len (256), not at each run's own",
        ),
    )
    method = (
        "Identity probe (docs/method.md §8, §13) in each model of the roles whose tokenizer does not prepend a BOS "
        "itself (from its facts; a model that does, gemma3-270m among the built-ins, always has the BOS at position "
        "0 and is not probed, claims.json's numbers name it under not_probed): each sequence run with each of K "
        "named first tokens, the hidden states at later positions classified by nearest class mean, held out by "
        "sequence; again with the sink heads' reads of key 0 removed (§9), and with those of as many matched "
        "non-sink heads (each of a sink head's layer or the nearest, with the nearest α₀), the heads chosen on the "
        "model's baseline on the selection sample at the plan's sink_seq_len. h_0's mean pairwise cosine across "
        "inputs, with and without a BOS, reported."
    )

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """The heads of each fingerprint model (on the selection sample), its identity probe per sample, and h_0's
        constancy of each model of FINGERPRINT_ROLES, by model name, per sample."""
        probed, self.not_probed = fingerprint_models(self.repro)
        heads = {name: select_heads(self.repro, role) for name, role in probed.items()}
        self.probes = {
            s: {name: measure_probe(self.repro, role, heads[name], s) for name, role in probed.items()} for s in SAMPLES
        }
        names = {role: self.repro.plan.roles[role].name for role in FINGERPRINT_ROLES}
        self.fingerprints = {
            s: {names[r]: fingerprint_table(self.repro, r, s) for r in FINGERPRINT_ROLES} for s in SAMPLES
        }

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        return claim_c6(self.probes[sample])

    def numbers(self, sample: str) -> dict[str, Any]:
        """The first tokens; per fingerprint model the sink heads and controls whose reads were removed (L.H), and
        why it cannot test the claim, where it cannot; the models not probed, and why."""
        probes = self.probes[sample]
        return {
            "first_tokens": list(FIRST_TOKENS),
            "sink_heads": {model: _head_names(probe.heads.sinks) for model, probe in probes.items()},
            "control_heads": {model: _head_names(probe.heads.controls or {}) for model, probe in probes.items()},
            "untestable": {model: why for model, probe in probes.items() if (why := probe.heads.untestable())},
            "not_probed": self.not_probed,
        }

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        """identity_SAMPLE (the probe per model and layer) and position0_SAMPLE (h_0's constancy), not shown."""
        identity = pd.concat([p.table().assign(model=m) for m, p in self.probes[sample].items()], ignore_index=True)
        self.repro.out.write_table(f"identity_{sample}", identity[["model", *identity.columns[:-1]]])
        position0 = pd.concat([t.assign(model=m) for m, t in self.fingerprints[sample].items()], ignore_index=True)
        columns = ["model", "layer", "fingerprint_cos_bos", "fingerprint_cos_nobos"]
        self.repro.out.write_table(f"position0_{sample}", position0[columns])
        return []

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        shown = set(judgement.evidence["evidence"])
        parts = []
        for model, probe in self.probes[SHOWN].items():
            if (why := probe.heads.untestable()) is not None:
                parts.append(f"{model} untestable ({why})")
            elif f"{model}: first-token accuracy" in shown:
                beyond = evidence_text(judgement, f"{model}: {SINK_CHANGE} − {CONTROL_CHANGE}")
                parts.append(
                    f"{model} {evidence_text(judgement, f'{model}: first-token accuracy')}, changed by "
                    f"{evidence_text(judgement, f'{model}: {SINK_CHANGE}')} without its sink heads' reads of key 0, "
                    f"{beyond} beyond the matched controls'"
                )
        found = "; ".join(parts) if parts else "no model without a BOS to probe"
        return (
            "The paper reports a fingerprint of the token at position 0 passed forward by the sinks; here the "
            f"later layers tell which of {len(FIRST_TOKENS)} first tokens stood there (chance {CHANCE:g}%): {found}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        lines: dict[str, pd.DataFrame] = {}
        for model, probe in self.probes[SHOWN].items():
            table = probe.table()
            lines[model] = table
            for column, what in (("removed", "sink reads"), ("control", "control reads")):
                if table[column].notna().any():
                    renamed = {f"{column}{end}": f"accuracy{end}" for end in ("", "_lo", "_hi")}
                    lines[f"{model} without {what}"] = table[["layer", *renamed]].rename(columns=renamed)
        depth = max((len(table) for table in lines.values()), default=1)
        lines[f"chance (1/{len(FIRST_TOKENS)})"] = pd.DataFrame({"layer": range(depth), "accuracy": CHANCE})
        path = self.repro.out.figure_path("c6_identity")
        title = f"Which first token stood at position 0, read from later positions (sample {SHOWN})"
        return [
            figures.lines_by_run(lines, "accuracy", path, title=title, ylabel="probe accuracy (%)", relative_depth=True)
        ]


def _head_names(heads: Mapping[int, Sequence[int]]) -> list[str]:
    """Heads by layer as L.H names, in order."""
    return [f"{layer}.{head}" for layer, found in heads.items() for head in found]
