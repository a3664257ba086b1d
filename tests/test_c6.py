"""C6 on constructed inputs with a known answer: the identity probe's controls, its verdicts, its tables and
sentence; the probe on a model built with one sink head, and smollm2-135m's heads at the probe's own T."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from constructed import RESAMPLES
from tiny import sink_model
from transformers import PreTrainedModel

from posleak.capture import QueryStats
from posleak.data.corpus import load_corpus
from posleak.experiments.paper import QUICK
from posleak.experiments.paper.claims.c6.claim import C6, MIN_EFFECT, claim_c6
from posleak.experiments.paper.claims.c6.probe import (
    CHANCE,
    FINGERPRINT_SEQ_LEN,
    FIRST_TOKENS,
    IDENTITY_COLUMNS,
    PROBE_POSITIONS,
    IdentityProbe,
    ProbeHeads,
    probe_controls,
    probe_identity,
)
from posleak.experiments.paper.reproduction import Reproduction
from posleak.interventions.patching import source_token
from posleak.measure.position0 import variant_states
from posleak.models.load import LoadedModel


def _probe_heads(sinks: dict[int, tuple[int, ...]], controls: bool) -> ProbeHeads:
    """2 layers of 2 heads, α₀ 0.9 in `sinks` and 0.1 elsewhere; with `controls`, their matched controls."""
    score = torch.full((2, 2), 0.1, dtype=torch.float64)
    for layer, heads in sinks.items():
        score[layer, list(heads)] = 0.9
    return ProbeHeads(sinks, probe_controls(score) if controls else None, score)


def _probe(
    accuracy: list[float], removed: list[float] | None, control: list[float] | None, heads: ProbeHeads
) -> IdentityProbe:
    """A probe of 3 layers (resid 0–2) whose sequences score `accuracy` (%) with the model as it is, `removed`
    without its sink heads' reads and `control` without its controls' (None: no such heads), in every layer but
    resid 0, which scores chance."""

    def per_layer(values: list[float] | None) -> torch.Tensor | None:
        if values is None:
            return None
        chance = torch.full((1, len(values)), CHANCE, dtype=torch.float64)
        return torch.cat([chance, torch.tensor([values, values], dtype=torch.float64)])

    carried = per_layer(accuracy)
    assert carried is not None
    return IdentityProbe(carried, per_layer(removed), per_layer(control), heads, RESAMPLES, 0)


SINK_0 = {0: (1,), 1: ()}  # a sink head in the first block: the layers after it are resid 1 and 2
MATCHED = _probe_heads(SINK_0, controls=True)
ACCURATE = [100, 90, 95, 100, 85, 100]
REMOVED = [20, 10, 15, 30, 12.5, 25]
CARRIED_AND_REMOVED = _probe(ACCURATE, REMOVED, ACCURATE, MATCHED)  # the controls' reads carry nothing
AT_CHANCE = _probe([12.5, 15.6, 9.4, 12.5, 12.5, 12.5], [12.5, 12.5, 12.5, 15.6, 9.4, 12.5], ACCURATE, MATCHED)
NOT_REMOVED = _probe(ACCURATE, [100, 90, 96.9, 100, 85, 100], ACCURATE, MATCHED)
WEAKLY_REMOVED = _probe(ACCURATE, [100, 60, 95, 100, 85, 100], ACCURATE, MATCHED)
# the sinks' removal lowers it by 50–60 points, the controls' by more (to chance): no more than any heads' reads
CONTROL_LOWERS_MORE = _probe(ACCURATE, [40, 35, 45, 50, 38, 42], [CHANCE] * 6, MATCHED)
TOO_FEW = _probe(ACCURATE, REMOVED, None, _probe_heads({0: (0, 1), 1: (0, 1)}, controls=False))  # 4 sinks, 0 others
NO_SINK = _probe(ACCURATE, None, None, _probe_heads({0: (), 1: ()}, controls=True))


def test_probe_controls_take_the_nearest_non_sinks_of_the_nearest_layer_once_each() -> None:
    """α₀ of 3 layers of 3 heads: layer 0's one sink takes its own layer's non-sink of nearest α₀ (0.25, not 0.05);
    layer 1's three sinks find no non-sink in layer 1 and take, at distance 1, layer 0's left (the lower layer
    first), then layer 2's of nearest α₀ (0.2 for 0.7, 0.15 for 0.6), each once; fewer non-sinks than sinks: None."""
    score = torch.tensor([[0.25, 0.9, 0.05], [0.8, 0.7, 0.6], [0.1, 0.2, 0.15]], dtype=torch.float64)
    assert probe_controls(score) == {0: (0, 2), 1: (), 2: (1, 2)}
    score[2, 0] = 0.5  # 5 sinks, 4 non-sinks
    assert probe_controls(score) is None


@pytest.mark.parametrize(
    ("probes", "verdict"),
    [
        ({"a": CARRIED_AND_REMOVED, "b": CARRIED_AND_REMOVED}, "consistent"),
        ({"a": CARRIED_AND_REMOVED, "b": AT_CHANCE}, "not consistent"),
        ({"a": NOT_REMOVED, "b": CARRIED_AND_REMOVED}, "not consistent"),
        ({"a": CONTROL_LOWERS_MORE, "b": CARRIED_AND_REMOVED}, "not consistent"),
        ({"a": WEAKLY_REMOVED, "b": CARRIED_AND_REMOVED}, "inconclusive"),
        ({"a": TOO_FEW, "b": CARRIED_AND_REMOVED}, "consistent"),
        ({"a": NO_SINK, "b": CARRIED_AND_REMOVED}, "consistent"),
        ({"a": TOO_FEW, "b": AT_CHANCE}, "not consistent"),
    ],
)
def test_claim_c6_verdicts(probes: dict[str, IdentityProbe], verdict: str) -> None:
    """Per testable model, the first token's identity above chance + 5 points after the first sink head, lowered by
    more than 5 points without the sink heads' reads and by more than without the matched controls' reads:
    consistent; at chance, not lowered, or lowered less than by the controls' removal: not consistent; one sequence
    of six lowered (an interval across −5 points): inconclusive. A model with too few non-sink heads, or with no
    sink head, is untestable: its rows decide nothing, and the other model decides alone. The rows are the mean over
    resid 1–2 of each sequence's accuracy, its paired changes and their paired difference."""
    judgement = claim_c6(probes)
    assert judgement.verdict == verdict
    rows = judgement.evidence.set_index("evidence")
    a = probes["a"]
    named = [name for name in rows.index if name.startswith("a: ")]
    if a.heads.untestable() is None:
        assert a.removed is not None and a.control is not None
        assert rows.loc["a: first-token accuracy", "value"] == pytest.approx(a.accuracy[1:].mean().item())
        change = (a.removed[1:] - a.accuracy[1:]).mean().item()
        assert rows.loc["a: change without sink reads", "value"] == pytest.approx(change)
        difference = rows.loc["a: change without sink reads − change without control reads"]
        assert difference["value"] == pytest.approx((a.removed[1:] - a.control[1:]).mean().item())
        assert difference["threshold"] == "< 0" and difference["deciding"]
        assert not rows.loc["a: change without control reads", "deciding"]
    else:
        assert sum("untestable" in name for name in named) == 1
        assert not rows.loc[named, "deciding"].any() and len(named) == (1 if a.removed is None else 3)
    assert rows.loc["b: first-token accuracy", "threshold"] == f"> {CHANCE + MIN_EFFECT:g}"


def test_a_sample_whose_every_model_is_untestable_has_no_deciding_row() -> None:
    """Two untestable models (4 sink heads and no non-sink head; no sink head): their rows, an untestable one each
    naming why, decide nothing, so the sample is decided by no row (verdict.judge: inconclusive)."""
    judgement = claim_c6({"a": TOO_FEW, "b": NO_SINK})
    rows = judgement.evidence.set_index("evidence")
    assert not rows["deciding"].any()
    assert list(rows.index[rows.index.str.contains("untestable")]) == [
        "a: untestable: 4 sink heads (α₀ > 0.3), only 0 non-sink heads to match them",
        "b: untestable: no sink head (α₀ > 0.3) on the selection sample",
    ]


def test_c6_writes_its_tables_figure_and_sentence(tmp_path: Path) -> None:
    """From built probes and h_0 tables: identity_A has every layer of each model (NaN without sink heads),
    position0_A the h_0 constancy, the figure is written, and the sentence quotes the testable model's rows and
    says why the other cannot test the claim; numbers name the heads and the untestable model."""
    module = C6(Reproduction(tmp_path / "paper", QUICK, progress=False))
    module.probes = {"A": {"a": CARRIED_AND_REMOVED, "b": NO_SINK}}
    module.not_probed = {"c": "prepends a BOS"}
    cos = pd.DataFrame({"layer": range(3), "fingerprint_cos_bos": 1.0, "fingerprint_cos_nobos": 0.5})
    module.fingerprints = {"A": {"a": cos, "b": cos}}
    runs: Any = None  # C6 reads its own measurements, not the shared runs
    assert module.tables(runs, "A") == []
    identity = pd.read_parquet(tmp_path / "paper" / "identity_A.parquet")
    assert list(identity.columns) == ["model", "layer", *IDENTITY_COLUMNS] and len(identity) == 6
    a, b = identity[identity["model"] == "a"], identity[identity["model"] == "b"]
    assert a["accuracy"].tolist() == pytest.approx([CHANCE, 95.0, 95.0]) and b["removed"].isna().all()
    assert a["control"].tolist() == pytest.approx([CHANCE, 95.0, 95.0]) and b["control"].isna().all()
    assert len(pd.read_parquet(tmp_path / "paper" / "position0_A.parquet")) == 6
    (figure,) = module.figures(runs)
    assert figure.is_file()
    sentence = module.against_paper(module.judge(runs, "A"), runs)
    assert "chance 12.5%): a 95 % (90 to 99.2), changed by -76.25 % points (" in sentence
    assert "b untestable (no sink head (α₀ > 0.3) on the selection sample)" in sentence
    numbers = module.numbers("A")
    assert numbers["sink_heads"] == {"a": ["0.1"], "b": []} and numbers["control_heads"] == {"a": ["0.0"], "b": []}
    assert list(numbers["untestable"]) == ["b"] and numbers["not_probed"] == {"c": "prepends a BOS"}


def _sink_reader(carry: bool) -> tuple[PreTrainedModel, list[int]]:
    """`sink_model` with one sink head (0.0) that also sinks on each of 8 first tokens (their embeddings take the
    BOS's direction u_1 beside their own), and, with `carry`, writes what it reads (its output projection random;
    every other head and MLP writes nothing): position 0's identity reaches later positions through that head's read
    of key 0 alone. Also the 8 first tokens (24–31; the sequences' other tokens are 1–23)."""
    model, candidates = sink_model({(0, 0): 8.0}, layers=2), list(range(24, 32))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        embedding = model.model.embed_tokens.weight
        embedding[candidates, 1:] = (embedding[candidates, 1:] + embedding[0, 1:]) / 2**0.5  # same norm, u_1 in it
        if carry:
            out = model.model.layers[0].self_attn.o_proj.weight
            out[:, : model.config.head_dim] = torch.randn(out.shape[0], model.config.head_dim, generator=generator)
    return model, candidates


def _chosen(model: PreTrainedModel, ids: torch.Tensor, candidates: list[int]) -> ProbeHeads:
    """The heads `ProbeHeads.of` chooses from α₀ measured on the probe's own setting: `ids` with each first token,
    T = 32 (`posleak paper` measures α₀ at the plan's sink_seq_len instead)."""
    stats = QueryStats(entropy=False)
    variant_states(model, ids, candidates, PROBE_POSITIONS[-1:], 2, accumulators=[stats])
    return ProbeHeads.of(stats.result().sink_score)


@pytest.mark.parametrize("carry", [True, False])
def test_the_identity_probe_finds_a_first_token_that_only_the_sink_head_carries(carry: bool) -> None:
    """On a model whose one sink head (α₀ > 0.3, found on other sequences' variants) is the only path from position
    0: its control is a non-sink head of its layer; where the sink head writes what it reads, the first token is
    told at every later layer (100%, chance 12.5%), removing its reads of key 0 takes that to exactly chance (a
    change of −87.5 points) and removing the control's changes nothing: consistent; where it writes nothing, the
    probe scores exactly chance in all three: not consistent."""
    model, candidates = _sink_reader(carry)
    generator = torch.Generator().manual_seed(0)
    chosen_on, ids = (torch.randint(1, 24, (n, FINGERPRINT_SEQ_LEN), generator=generator) for n in (3, 6))
    heads = _chosen(model, chosen_on, candidates)
    assert heads.sinks == {0: (0,), 1: ()} and heads.untestable() is None
    assert heads.controls is not None and len(heads.controls[0]) == 1 and not heads.controls[1]
    assert heads.sink_score[0, heads.controls[0][0]] <= 0.3
    probe = probe_identity(model, ids, candidates, heads, batch_size=2, resamples=RESAMPLES, seed=0)
    assert probe.later == [1, 2] and probe.removed is not None and probe.control is not None
    torch.testing.assert_close(probe.accuracy[0], torch.full((6,), CHANCE, dtype=torch.float64))  # the embedding
    torch.testing.assert_close(probe.removed, torch.full_like(probe.removed, CHANCE))
    torch.testing.assert_close(probe.control, probe.accuracy)  # the other heads write nothing
    expected = 100.0 if carry else CHANCE
    torch.testing.assert_close(probe.accuracy[1:], torch.full_like(probe.accuracy[1:], expected))
    assert probe.change(probe.removed).value == pytest.approx(CHANCE - expected)
    assert probe.change(probe.control).value == pytest.approx(0.0)
    assert claim_c6({"m": probe}).verdict == ("consistent" if carry else "not consistent")


def test_smollm2_at_t32_has_too_few_non_sink_heads_to_match_its_sinks(smollm2: LoadedModel) -> None:
    """smollm2-135m without a BOS at T = 32, 2 sequences × the 8 first tokens: its α₀ > 0.3 in most heads (issue 44
    counted 219 of 270), more than the non-sink heads, so heads chosen at the probe's own T could not test C6 (why
    `posleak paper` chooses them at the plan's sink_seq_len) and no control is chosen; on its first 4
    layers alone (fewer sinks than others) every sink head gets a control, each a distinct non-sink head, and the
    sink heads of a layer with enough non-sinks its own highest-α₀ non-sinks."""
    text = " ".join(load_corpus("stdlib").documents[:4])
    ids = torch.tensor(smollm2.tokenizer.encode(text, add_special_tokens=False)[: 2 * FINGERPRINT_SEQ_LEN])
    vocab = smollm2.facts.vocab_size
    candidates = [source_token(smollm2.tokenizer, word, vocab, "C6's first token") for word in FIRST_TOKENS]
    heads = _chosen(smollm2.model, ids.view(2, FINGERPRINT_SEQ_LEN), candidates)
    sinks, others = int((heads.sink_score > 0.3).sum()), int((heads.sink_score <= 0.3).sum())
    assert heads.controls is None and sinks > others and sinks + others == 270
    assert heads.untestable() == f"{sinks} sink heads (α₀ > 0.3), only {others} non-sink heads to match them"
    early = heads.sink_score[:4]
    controls = probe_controls(early)
    assert controls is not None
    chosen = [(layer, head) for layer, found in controls.items() for head in found]
    assert len(set(chosen)) == int((early > 0.3).sum()) and all(early[c] <= 0.3 for c in chosen)
    for layer in range(4):
        count, pool = int((early[layer] > 0.3).sum()), early[layer] <= 0.3
        if 0 < count <= int(pool.sum()):
            best = early[layer].where(pool, torch.tensor(-1.0, dtype=early.dtype)).topk(count).indices
            assert set(best.tolist()) <= set(controls[layer]), layer  # beside those other layers borrow
