"""C6's identity probe (docs/method.md §8, §13): which models it probes (those whose tokenizer does not prepend a
BOS), the heads whose reads of key 0 it removes (sink heads and matched non-sink controls, chosen on the selection
sample at the plan's sink_seq_len), and the probe's accuracy as the model is and without each set's reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from transformers import PreTrainedModel

from posleak.capture.query_stats import SINK_THRESHOLD
from posleak.data.batches import TokenBatch
from posleak.experiments.evidence import Estimate, sequence_mean
from posleak.experiments.paper.claims.c6.options import C6Options
from posleak.experiments.paper.plan import ROLE_NAMES, SAMPLES, Plan, RoleName
from posleak.experiments.paper.reproduction import SELECTION, Reproduction, selection_seqs
from posleak.experiments.paper.requests import SampleNeed
from posleak.interventions import Interventions, RemoveSinkReads
from posleak.interventions.patching import source_token
from posleak.measure.bootstrap import resampling_units
from posleak.measure.position0 import identity_accuracy, variant_states
from posleak.models.load import LoadedModel
from posleak.pipeline import AnalyzeConfig

# The K first tokens, named before the data: the eight most frequent English words, each one token in every built-in
# tokenizer (a model whose tokenizer splits one is refused by name). Fixed words, not the first tokens of other
# sequences, so that the K classes are distinct (chance is exactly 1/K) and the same in every model and sample.
FIRST_TOKENS = ("the", "of", "and", "to", "in", "is", "that", "for")
CHANCE = 100 / len(FIRST_TOKENS)  # % of the probe's guesses right by chance
FINGERPRINT_SEQ_LEN = 32  # short: S·K variants of each sequence run three times (with, without sink/control reads)
# every 8th position from 8 (none nearer position 0) and the last: 8, 16, 24, 31
PROBE_POSITIONS = (*range(8, FINGERPRINT_SEQ_LEN - 1, 8), FINGERPRINT_SEQ_LEN - 1)
# per layer: as it is, without the sink heads' reads of key 0, without the matched controls'
IDENTITY_COLUMNS = tuple(f"{what}{end}" for what in ("accuracy", "removed", "control") for end in ("", "_lo", "_hi"))
# the roles whose models may be probed: those whose tokenizer does not prepend a BOS (`fingerprint_models`)
PROBE_ROLES: tuple[RoleName, ...] = ROLE_NAMES
FINGERPRINT_ROLES: tuple[RoleName, ...] = ("sliding", "standard")  # the models whose first token is probed


def probe_needs(plan: Plan) -> list[SampleNeed]:
    """The probe's draws: each role's model without a BOS (any may be probed: whether its tokenizer prepends a BOS
    is known once it is loaded), and its choice of heads on the selection sample (C3's roles share theirs with C3:
    the same draw, checked once)."""
    needs, probed = [], plan.option(C6Options).fingerprint_seqs
    for role in PROBE_ROLES:
        what = f"C6's probe of the {role} model"
        needs.append(SampleNeed(what, role, FINGERPRINT_SEQ_LEN, probed, "off", SAMPLES, "fingerprint_seqs"))
        num_seqs = plan.size(role)[1]
        what, fix = f"C6's selection of the {role} model's sink heads", f"the {role} role's num_seqs"
        needs.append(SampleNeed(what, role, plan.sink_seq_len, selection_seqs(num_seqs), "auto", (SELECTION,), fix))
    return needs


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
        edits = None if removing is None else Interventions(RemoveSinkReads("auto")).attention_edits(removing)
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
    config = repro.config(
        role, seq_len=FINGERPRINT_SEQ_LEN, num_seqs=repro.plan.option(C6Options).fingerprint_seqs, bos="off"
    )
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
