"""C6: attention sinks pass forward a deterministic fingerprint of the token at position 0: constant across inputs
with an auto-prepended BOS, varying with the token otherwise.

Measured here, not in an analysis run (docs/method.md §13). Position 0 is a closed system, so h_0 is constant with a
BOS and varies with the token without one by construction: that proves nothing and is only reported (the
`position0_SAMPLE` table). What the claim says is passed *forward* is tested instead, in each fingerprint model
without a BOS: whether later positions carry the identity of the token at position 0 (the identity probe of
posleak.measure.position0, K first tokens named before the data), and whether it goes when the sink heads no longer
read key 0 (`--remove-sink-reads`, docs/method.md §9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import PreTrainedModel

from posleak.capture import CaptureSession, QueryStats, ResidualCapture
from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.data.batches import TokenBatch, iter_batches, without_bos
from posleak.experiments.evidence import Estimate, sequence_mean
from posleak.experiments.paper.claim import ACROSS_CORPORA, BY_DOCUMENT, HOLM_RULE, REPLICATED, ClaimModule, quote
from posleak.experiments.paper.plan import FINGERPRINT_ROLES, SAMPLES, SHOWN, RoleName
from posleak.experiments.paper.reproduction import Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Judgement, Revision, fact, judge, row
from posleak.intervene import Interventions
from posleak.intervene.patching import source_token
from posleak.measure.bootstrap import resampling_units
from posleak.measure.position0 import fingerprint_constancy, identity_accuracy, variant_states
from posleak.models.load import LoadedModel
from posleak.report import figures
from posleak.report.html import TableBlock

# The K first tokens, named before the data: the eight most frequent English words, each one token in every built-in
# tokenizer (a model whose tokenizer splits one is refused by name). Fixed words, not the first tokens of other
# sequences, so that the K classes are distinct (chance is exactly 1/K) and the same in every model and sample.
FIRST_TOKENS = ("the", "of", "and", "to", "in", "is", "that", "for")
CHANCE = 100 / len(FIRST_TOKENS)  # % of the probe's guesses right by chance
MIN_EFFECT = 5.0  # % points: the least accuracy above chance, and the least lowering by the removal, that count
FINGERPRINT_SEQ_LEN = 32  # short: S·K variants of each sequence run twice (about 1 minute of --quick on 2 cores)
# every 8th position from 8 (none nearer position 0) and the last: 8, 16, 24, 31
PROBE_POSITIONS = (*range(8, FINGERPRINT_SEQ_LEN - 1, 8), FINGERPRINT_SEQ_LEN - 1)
IDENTITY_COLUMNS = ("accuracy", "accuracy_lo", "accuracy_hi", "removed", "removed_lo", "removed_hi")  # per layer

C6_CRITERION = (
    f"In every fingerprint model without a BOS at position 0 (the first token of each sequence replaced in turn by "
    f"each of K = {len(FIRST_TOKENS)} tokens named before the data: {', '.join(FIRST_TOKENS)}), a probe tells which "
    f"token stood at position 0 from the hidden states at positions {', '.join(map(str, PROBE_POSITIONS))} "
    "(nearest class mean after each sequence's mean over its variants is subtracted, held out by sequence), its "
    "accuracy averaged over the residual states after the first sink head (α₀ > "
    f"{SINK_THRESHOLD} on the same inputs): consistent if its 95% interval lies above chance ({CHANCE:g}%) + "
    f"{MIN_EFFECT:g} points and removing the sink heads' reads of key 0 lowers it by more than {MIN_EFFECT:g} points "
    f"(paired difference, interval below −{MIN_EFFECT:g}); not consistent if either interval lies wholly on the "
    "other side (the identity at chance, or not lowered by the removal); inconclusive otherwise, or where a model "
    "has no sink head. h_0's constancy with and without a BOS (closed by construction) is reported, not judged."
)


@dataclass
class IdentityProbe:
    """One model on one sample: the probe's accuracy (%) of each sequence per resid index, (L + 1, S), with the
    model as it is and with its sink heads' reads of key 0 removed (None: no sink head, so nothing to remove); the
    sink heads by layer; the resamples' count, seed and units (the sequences' documents, posleak.measure.bootstrap;
    the two accuracies draw the same resamples: they pair)."""

    accuracy: torch.Tensor
    removed: torch.Tensor | None
    sinks: dict[int, tuple[int, ...]]
    resamples: int
    seed: int
    units: tuple[int, ...] | None = None

    @property
    def later(self) -> list[int]:
        """The resid indices after the first sink head: its block's output and every later one."""
        first = min(layer for layer, heads in self.sinks.items() if heads)
        return list(range(first + 1, self.accuracy.shape[0]))

    def carried(self) -> Estimate:
        """The accuracy over the layers after the first sink head."""
        return self._mean(self.accuracy, self.later)

    def change(self) -> Estimate:
        """What removing the sink heads' reads of key 0 does to it (% points), paired by sequence."""
        if self.removed is None:
            raise ValueError("no sink head: nothing was removed")
        return self._mean(self.removed, self.later).minus(self.carried())

    def _mean(self, accuracy: torch.Tensor, layers: Sequence[int]) -> Estimate:
        return sequence_mean(accuracy[list(layers)].mean(0), self.resamples, self.seed, self.units)

    def table(self) -> pd.DataFrame:
        """`layer` and IDENTITY_COLUMNS: each layer's accuracy and interval, as it is and without the sink heads'
        reads (NaN without sink heads)."""
        nan = (float("nan"),) * 3
        records = []
        for layer in range(self.accuracy.shape[0]):
            values: tuple[float, ...] = ()
            for accuracy in (self.accuracy, self.removed):
                estimate = self._mean(accuracy, [layer]) if accuracy is not None else None
                values += (estimate.value, *estimate.interval) if estimate is not None else nan
            records.append(dict(zip(("layer", *IDENTITY_COLUMNS), (layer, *values), strict=True)))
        return pd.DataFrame(records)


def claim_c6(probes: Mapping[str, IdentityProbe]) -> Judgement:
    """Per model (by label): the accuracy above chance and its change without the sink heads' reads decide."""
    rows = []
    for label, probe in probes.items():
        if probe.removed is None:  # untestable: inconclusive
            rows.append(fact(f"{label}: sink heads (α₀ > {SINK_THRESHOLD})", 0, False, False, "> 0 to test"))
            continue
        rows += [
            row(f"{label}: first-token accuracy", probe.carried(), CHANCE + MIN_EFFECT, "above", "%"),
            row(f"{label}: change without sink reads", probe.change(), -MIN_EFFECT, "below", "% points"),
        ]
    return judge(rows)


def probe_identity(
    model: PreTrainedModel,
    ids: torch.Tensor,
    candidates: Sequence[int],
    batch_size: int,
    resamples: int,
    seed: int,
    units: tuple[int, ...] | None = None,
) -> IdentityProbe:
    """The identity probe of `model` on `ids` (S×T), each row's first token replaced by each of `candidates`: as it
    is, then with the reads of key 0 removed in its sink heads, those of α₀ > ε on the same variants (the
    `--remove-sink-reads auto` rule, the last layer included: the probe reads its output)."""
    stats = QueryStats(entropy=False)
    states = variant_states(model, ids, candidates, PROBE_POSITIONS, batch_size, accumulators=[stats])
    sinks = stats.result().sink_heads_by_layer()
    accuracy = 100 * identity_accuracy(states)
    removed = None
    if any(sinks.values()):
        edits = Interventions(remove_sink_reads="auto").attention_edits(sinks)
        removed = 100 * identity_accuracy(variant_states(model, ids, candidates, PROBE_POSITIONS, batch_size, edits))
    return IdentityProbe(accuracy, removed, sinks, resamples, seed, units)


def measure_probe(repro: Reproduction, role: RoleName, sample: str) -> IdentityProbe:
    """The identity probe of the model of `role` on `fingerprint_seqs` sequences of one sample, without a BOS."""
    model = repro.plan.roles[role].model
    loaded = repro.model(model)
    config = repro.config(role, seq_len=FINGERPRINT_SEQ_LEN, num_seqs=repro.plan.fingerprint_seqs, bos="off")
    batch = repro.sample(model, config, sample)
    vocab = loaded.facts.vocab_size
    candidates = [source_token(loaded.tokenizer, word, vocab, "C6's first token") for word in FIRST_TOKENS]
    measure, units = config.measure, resampling_units(batch.documents)
    return probe_identity(
        loaded.model, batch.ids, candidates, repro.plan.batch_size, measure.bootstrap, measure.seed, units
    )


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
            "so that check could not fail and is reported (issue 34); written before the probe had run on a "
            "built-in model",
        ),
        BY_DOCUMENT,
        ACROSS_CORPORA,
    )
    method = (
        "Identity probe (docs/method.md §8, §13): each sequence run with each of K named first tokens, the hidden "
        "states at later positions classified by nearest class mean, held out by sequence; again with the sink "
        "heads' reads of key 0 removed (§9). h_0's mean pairwise cosine across inputs, with and without a BOS, "
        "reported."
    )

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """The identity probe and h_0's constancy of each model, by model name, per sample."""
        names = {role: self.repro.plan.roles[role].name for role in FINGERPRINT_ROLES}
        self.probes = {s: {names[r]: measure_probe(self.repro, r, s) for r in FINGERPRINT_ROLES} for s in SAMPLES}
        self.fingerprints = {
            s: {names[r]: fingerprint_table(self.repro, r, s) for r in FINGERPRINT_ROLES} for s in SAMPLES
        }

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        return claim_c6(self.probes[sample])

    def numbers(self, sample: str) -> dict[str, Any]:
        """The first tokens, and each model's sink heads whose reads were removed (L.H)."""
        heads = {
            model: [f"{layer}.{head}" for layer, found in probe.sinks.items() for head in found]
            for model, probe in self.probes[sample].items()
        }
        return {"first_tokens": list(FIRST_TOKENS), "sink_heads": heads}

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
        parts = [
            f"{model} {quote(judgement, f'{model}: first-token accuracy')}, changed by "
            f"{quote(judgement, f'{model}: change without sink reads')} without its sink heads' reads of key 0"
            for model in self.probes[SHOWN]
            if f"{model}: first-token accuracy" in shown
        ]
        found = "; ".join(parts) if parts else "no model has a sink head to test"
        return (
            "The paper reports a fingerprint of the token at position 0 passed forward by the sinks; here the "
            f"later layers tell which of {len(FIRST_TOKENS)} first tokens stood there (chance {CHANCE:g}%): {found}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        lines: dict[str, pd.DataFrame] = {}
        for model, probe in self.probes[SHOWN].items():
            table = probe.table()
            lines[model] = table
            if probe.removed is not None:
                removed = {f"removed{end}": f"accuracy{end}" for end in ("", "_lo", "_hi")}
                lines[f"{model} without sink reads"] = table.drop(columns=list(removed.values())).rename(
                    columns=removed
                )
        depth = max(len(table) for table in lines.values())
        lines[f"chance (1/{len(FIRST_TOKENS)})"] = pd.DataFrame({"layer": range(depth), "accuracy": CHANCE})
        path = self.repro.out.figure_path("c6_identity")
        title = f"Which first token stood at position 0, read from later positions (sample {SHOWN})"
        return [
            figures.lines_by_run(lines, "accuracy", path, title=title, ylabel="probe accuracy (%)", relative_depth=True)
        ]
