"""C6: attention sinks pass forward a deterministic fingerprint of the token at position 0: constant across inputs
with an auto-prepended BOS, varying with the token otherwise.

Measured here, not in an analysis run (docs/method.md §13). Position 0 is a closed system, so h_0 is constant with a
BOS and varies with the token without one by construction: that proves nothing and is only reported (the
`position0_SAMPLE` table). What the claim says is passed *forward* is tested instead, in each fingerprint model (a
model of the plan's roles whose tokenizer does not prepend a BOS itself, so that position 0 can hold another token):
whether later positions carry the identity of the token at position 0 (the identity probe of
posleak.measure.position0, K first tokens named before the data), and whether it goes when the sink heads no longer
read key 0 (`--remove-sink-reads`, docs/method.md §9) by more than when as many matched non-sink heads no longer do
(issue 44: at T = 32 most heads are sinks, so removing their reads alone nearly cuts position 0 off). The heads are
chosen on the selection sample, which judges nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from transformers import PreTrainedModel

from posleak.capture import CaptureSession, ResidualCapture
from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.data.batches import TokenBatch, iter_batches, without_bos
from posleak.experiments.evidence import Estimate, sequence_mean
from posleak.experiments.paper.claim import ACROSS_CORPORA, BY_DOCUMENT, HOLM_RULE, REPLICATED, ClaimModule, quote
from posleak.experiments.paper.plan import FINGERPRINT_ROLES, ROLE_NAMES, SAMPLES, SHOWN, RoleName
from posleak.experiments.paper.reproduction import SELECTION, Reproduction, SampleRuns
from posleak.experiments.paper.verdict import Judgement, Revision, fact, judge, row
from posleak.intervene import Interventions
from posleak.intervene.patching import source_token
from posleak.measure.bootstrap import resampling_units
from posleak.measure.position0 import fingerprint_constancy, identity_accuracy, variant_states
from posleak.models.load import LoadedModel
from posleak.pipeline import AnalyzeConfig
from posleak.report import figures
from posleak.report.html import TableBlock

# The K first tokens, named before the data: the eight most frequent English words, each one token in every built-in
# tokenizer (a model whose tokenizer splits one is refused by name). Fixed words, not the first tokens of other
# sequences, so that the K classes are distinct (chance is exactly 1/K) and the same in every model and sample.
FIRST_TOKENS = ("the", "of", "and", "to", "in", "is", "that", "for")
CHANCE = 100 / len(FIRST_TOKENS)  # % of the probe's guesses right by chance
MIN_EFFECT = 5.0  # % points: the least accuracy above chance, and the least lowering by the removal, that count
FINGERPRINT_SEQ_LEN = 32  # short: S·K variants of each sequence run three times (with, without sink/control reads)
# every 8th position from 8 (none nearer position 0) and the last: 8, 16, 24, 31
PROBE_POSITIONS = (*range(8, FINGERPRINT_SEQ_LEN - 1, 8), FINGERPRINT_SEQ_LEN - 1)
# per layer: as it is, without the sink heads' reads of key 0, without the matched controls'
IDENTITY_COLUMNS = tuple(f"{what}{end}" for what in ("accuracy", "removed", "control") for end in ("", "_lo", "_hi"))
# the roles whose models may be probed: those whose tokenizer does not prepend a BOS (`fingerprint_models`)
PROBE_ROLES: tuple[RoleName, ...] = ROLE_NAMES
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


@dataclass(frozen=True)
class ProbeHeads:
    """The heads whose reads of key 0 one model's probe removes, chosen on its baseline on the selection sample at
    the plan's sink_seq_len (disjoint from the samples that judge; `select_heads`): its sink heads (α₀ > ε) and
    their matched non-sink controls (`probe_controls`; None where the non-sink heads are too few to match every
    sink head), by layer; α₀ of every head, (L, H)."""

    sinks: dict[int, tuple[int, ...]]
    controls: dict[int, tuple[int, ...]] | None
    sink_score: torch.Tensor

    @classmethod
    def of(cls, sink_score: torch.Tensor) -> ProbeHeads:
        """The sink heads of α₀ `sink_score` (L, H), the last layer included (the probe reads its output), and
        their controls."""
        sinks = {
            layer: tuple((row > SINK_THRESHOLD).nonzero().flatten().tolist()) for layer, row in enumerate(sink_score)
        }
        return cls(sinks, probe_controls(sink_score), sink_score)

    def untestable(self) -> str | None:
        """Why the model cannot test C6 (None: it can)."""
        count = sum(map(len, self.sinks.values()))
        if not count:
            return f"no sink head (α₀ > {SINK_THRESHOLD}) on the selection sample"
        if self.controls is None:
            others = self.sink_score.numel() - count
            return f"{count} sink heads (α₀ > {SINK_THRESHOLD}), only {others} non-sink heads to match them"
        return None


def probe_controls(sink_score: torch.Tensor) -> dict[int, tuple[int, ...]] | None:
    """One non-sink head (α₀ ≤ ε) per sink head of `sink_score` (α₀, (L, H)), each used once, by layer. First each
    layer's sink heads take its own non-sink heads; the sink heads left then take, in order of layer, those of the
    nearest layer with one left (the lower on a tie). Among a layer's, a sink head takes the one whose α₀ is nearest
    its own (the lower head on a tie): the control removes as many heads' reads of key 0 at as near a depth and
    weight on key 0 as the model allows. None where the non-sink heads are fewer than the sink heads."""
    sink = sink_score > SINK_THRESHOLD
    free = {tuple(head) for head in (~sink).nonzero().tolist()}
    if len(free) < int(sink.sum()):
        return None
    chosen: dict[int, list[int]] = {layer: [] for layer in range(sink_score.shape[0])}
    unmatched = [tuple(head) for head in sink.nonzero().tolist()]
    for own_layer in (True, False):
        left = []
        for layer, head in unmatched:
            options = [c for c in free if c[0] == layer or not own_layer]
            if not options:
                left.append((layer, head))
                continue
            score = float(sink_score[layer, head])
            pick = min(options, key=lambda c: (abs(c[0] - layer), c[0], abs(float(sink_score[c]) - score), c[1]))
            free.remove(pick)
            chosen[pick[0]].append(pick[1])
        unmatched = left
    return {layer: tuple(sorted(heads)) for layer, heads in chosen.items()}


@dataclass
class IdentityProbe:
    """One model on one sample: the probe's accuracy (%) of each sequence per resid index, (L + 1, S), with the
    model as it is, with its sink heads' reads of key 0 removed (`removed`; None: no sink head) and with its
    matched controls' reads removed (`control`; None: no controls); the heads; the resamples' count, seed and units
    (the sequences' documents, posleak.measure.bootstrap; every accuracy draws the same resamples: they pair)."""

    accuracy: torch.Tensor
    removed: torch.Tensor | None
    control: torch.Tensor | None
    heads: ProbeHeads
    resamples: int
    seed: int
    units: tuple[int, ...] | None = None

    @property
    def later(self) -> list[int]:
        """The resid indices after the first sink head: its block's output and every later one."""
        first = min(layer for layer, heads in self.heads.sinks.items() if heads)
        return list(range(first + 1, self.accuracy.shape[0]))

    def carried(self) -> Estimate:
        """The accuracy over the layers after the first sink head."""
        return self._mean(self.accuracy, self.later)

    def change(self, without: torch.Tensor | None) -> Estimate:
        """What removing some heads' reads of key 0 (`without`: `removed` or `control`) does to it (% points),
        paired by sequence."""
        if without is None:
            raise ValueError("no heads to remove: nothing was removed")
        return self._mean(without, self.later).minus(self.carried())

    def _mean(self, accuracy: torch.Tensor, layers: Sequence[int]) -> Estimate:
        return sequence_mean(accuracy[list(layers)].mean(0), self.resamples, self.seed, self.units)

    def table(self) -> pd.DataFrame:
        """`layer` and IDENTITY_COLUMNS: each layer's accuracy and interval, as it is, without the sink heads'
        reads and without the controls' (NaN where there are none)."""
        nan = (float("nan"),) * 3
        records = []
        for layer in range(self.accuracy.shape[0]):
            values: tuple[float, ...] = ()
            for accuracy in (self.accuracy, self.removed, self.control):
                estimate = self._mean(accuracy, [layer]) if accuracy is not None else None
                values += (estimate.value, *estimate.interval) if estimate is not None else nan
            records.append(dict(zip(("layer", *IDENTITY_COLUMNS), (layer, *values), strict=True)))
        return pd.DataFrame(records)


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
            untestable = fact(f"{label}: untestable: {why}", count, False, False, "≥ 1, 1 control each", "sink heads")
            rows.append({**untestable, "deciding": False})
        if probe.removed is None:
            continue
        deciding = why is None
        rows += [
            row(f"{label}: first-token accuracy", probe.carried(), CHANCE + MIN_EFFECT, "above", "%", deciding),
            row(f"{label}: {SINK_CHANGE}", probe.change(probe.removed), -MIN_EFFECT, "below", "% points", deciding),
        ]
        if probe.control is not None:
            sinks, control = probe.change(probe.removed), probe.change(probe.control)
            rows += [
                row(f"{label}: {SINK_CHANGE} − {CONTROL_CHANGE}", sinks.minus(control), 0.0, "below", "% points"),
                row(f"{label}: {CONTROL_CHANGE}", control, -MIN_EFFECT, "below", "% points", deciding=False),
            ]
    return judge(rows)


def probe_identity(
    model: PreTrainedModel,
    ids: torch.Tensor,
    candidates: Sequence[int],
    heads: ProbeHeads,
    batch_size: int,
    resamples: int,
    seed: int,
    units: tuple[int, ...] | None = None,
) -> IdentityProbe:
    """The identity probe of `model` on `ids` (S×T), each row's first token replaced by each of `candidates`: as it
    is, then without the reads of key 0 of `heads`' sink heads, then of its controls, where it has them."""

    def accuracy(removing: dict[int, tuple[int, ...]] | None = None) -> torch.Tensor:
        edits = None if removing is None else Interventions(remove_sink_reads="auto").attention_edits(removing)
        return 100 * identity_accuracy(variant_states(model, ids, candidates, PROBE_POSITIONS, batch_size, edits))

    removed = accuracy(heads.sinks) if any(heads.sinks.values()) else None
    control = accuracy(heads.controls) if removed is not None and heads.controls is not None else None
    return IdentityProbe(accuracy(), removed, control, heads, resamples, seed, units)


def fingerprint_models(repro: Reproduction) -> tuple[dict[str, RoleName], dict[str, str]]:
    """C6's fingerprint models, chosen from their facts: by name, the first role of each model of the plan whose
    tokenizer does not prepend a BOS itself (`auto_bos` False); and the others by name, with why none is probed."""
    probed: dict[str, RoleName] = {}
    left_out: dict[str, str] = {}
    for role in PROBE_ROLES:
        spec = repro.plan.roles[role]
        if spec.name in probed or spec.name in left_out:
            continue
        if repro.model(spec.model).facts.auto_bos:
            left_out[spec.name] = "its tokenizer prepends a BOS itself, so position 0 is always the BOS: not probed"
        else:
            probed[spec.name] = role
    return probed, left_out


def _probe_inputs(
    repro: Reproduction, role: RoleName, sample: str
) -> tuple[LoadedModel, TokenBatch, list[int], AnalyzeConfig]:
    """The model of `role`, `fingerprint_seqs` sequences of T = FINGERPRINT_SEQ_LEN of `sample` without a BOS, the
    first tokens' ids and the config that drew them."""
    model = repro.plan.roles[role].model
    loaded = repro.model(model)
    config = repro.config(role, seq_len=FINGERPRINT_SEQ_LEN, num_seqs=repro.plan.fingerprint_seqs, bos="off")
    vocab = loaded.facts.vocab_size
    candidates = [source_token(loaded.tokenizer, word, vocab, "C6's first token") for word in FIRST_TOKENS]
    return loaded, repro.sample(model, config, sample), candidates, config


def select_heads(repro: Reproduction, role: RoleName) -> ProbeHeads:
    """The sink heads and matched controls of the model of `role`, from its baseline on the selection sample at the
    plan's sink_seq_len, where every claim chooses its sink heads (for C3's roles the very run C3 chose its heads
    on: read back, not run again), which judges nothing."""
    spec = repro.plan.roles[role]
    config = repro.config(role, seq_len=repro.plan.sink_seq_len)
    (selection,) = repro.run([repro.job(spec.folder, spec.model, config, SELECTION)])
    scores = selection.per_head.pivot(index="layer", columns="head", values="sink_score")
    return ProbeHeads.of(torch.tensor(scores.to_numpy(), dtype=torch.float64))


def measure_probe(repro: Reproduction, role: RoleName, heads: ProbeHeads, sample: str) -> IdentityProbe:
    """The identity probe of the model of `role` on `fingerprint_seqs` sequences of one sample, without a BOS,
    removing the reads of key 0 of `heads`."""
    loaded, batch, candidates, config = _probe_inputs(repro, role, sample)
    measure, units = config.measure, resampling_units(batch.documents)
    return probe_identity(
        loaded.model, batch.ids, candidates, heads, repro.plan.batch_size, measure.bootstrap, measure.seed, units
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
    roles = PROBE_ROLES
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
        Revision(
            "2026-12-05",
            "judged in the models whose tokenizer does not prepend a BOS (from their facts), with heads chosen on "
            "the selection sample and a third deciding row: the sinks' removal lowers the accuracy more than that "
            "of as many matched non-sink heads; a model with no sink head, or fewer non-sink heads than sink heads, "
            "is untestable and decides nothing (before: gemma3-270m was probed with its BOS forced off and its "
            "'no sink head' row decided; at T = 32 most heads count as sinks, so the removal had no control); sink "
            "heads of every claim chosen at one T, the plan's sink_seq_len (256), not at each run's own (issue 44)",
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
                parts.append(
                    f"{model} {quote(judgement, f'{model}: first-token accuracy')}, changed by "
                    f"{quote(judgement, f'{model}: {SINK_CHANGE}')} without its sink heads' reads of key 0, "
                    f"{quote(judgement, f'{model}: {SINK_CHANGE} − {CONTROL_CHANGE}')} beyond the matched controls'"
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
