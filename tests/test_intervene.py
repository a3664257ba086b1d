"""`posleak intervene`: the effect table against the definition of DESIGN.md §3.4 on hand-built runs, `intervene()`
end to end, the model's own next-token scores beside it, and a newly registered intervention reaching the command
line, its checks, the manifest and the model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli import assert_one_line_error, file_stamps, run_main, strict_json_files
from intervening import T, tiny_ids, verbatim_batch
from tiny import FAMILIES, tiny_model
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from posleak.capture import AttentionEdits, use_posleak_attention
from posleak.commands.intervene import effect_table, intervene
from posleak.interventions import Interventions
from posleak.interventions.base import Intervention, setting
from posleak.interventions.heads import SinkHeads
from posleak.interventions.registry import REGISTRY
from posleak.measure import LAYER_MAGNITUDES, behaviour, measured_magnitudes
from posleak.measure.behaviour import behaviour_table
from posleak.measure.bootstrap import resample_weights
from posleak.models.load import LoadedModel, load_model
from posleak.pipeline import AnalysisResult, AnalyzeConfig, PreparedRun, analyze_model, prepared_model, sequences_for
from posleak.store.manifest import fingerprint

# ------------------------------------------------------------------------------------- effect tables

LAYERS, RESAMPLES = 4, 60
# Intervened/baseline ratio per layer and measure: the effect is 100·(ratio − 1) per layer.
RATIOS = {
    "mask_early": [0.5, 0.8, 1.0, 1.5],
    "mask_all": [1.2, 1.1, 0.9, 0.7],
    "resid_early": [0.6, 0.6, 0.3, 0.9],
    "resid_all": [2.0, 0.25, 1.0, 0.75],
    "mask_beyond": [1.0, 0.5, 1.25, 1.1],
    "resid_beyond": [0.9, 1.3, 0.4, 2.5],
}


def _hand_built_runs(seed: int = 0) -> tuple[AnalysisResult, AnalysisResult, dict[str, tuple[np.ndarray, ...]]]:
    """A baseline and an intervened run with known per-layer magnitudes and bootstrap tables, their rows
    shuffled (each run its own order); also the same numbers as arrays: (base, new, base_boot, new_boot) per
    measure, boot arrays indexed [resample, layer]. Resample k of the intervened run is resample k of the
    baseline times the ratio and a small factor, so only a correctly paired bootstrap gives a narrow interval."""
    rng = np.random.default_rng(seed)
    arrays = {}
    base_layer, new_layer = {"layer": np.arange(LAYERS)}, {"layer": np.arange(LAYERS)}
    resample, layer = np.repeat(np.arange(RESAMPLES), LAYERS), np.tile(np.arange(LAYERS), RESAMPLES)
    base_boot_table, new_boot_table = {"resample": resample, "layer": layer}, {"resample": resample, "layer": layer}
    for measure, ratio in RATIOS.items():
        base = rng.uniform(0.5, 2.0, LAYERS)
        new = base * np.array(ratio)
        base_boot = base * rng.uniform(0.5, 1.5, (RESAMPLES, LAYERS))
        new_boot = base_boot * np.array(ratio) * rng.uniform(0.97, 1.03, (RESAMPLES, LAYERS))
        arrays[measure] = (base, new, base_boot, new_boot)
        base_layer[measure], new_layer[measure] = base, new
        base_boot_table[measure], new_boot_table[measure] = base_boot.ravel(), new_boot.ravel()

    def run(per_layer: dict, bootstrap: dict) -> AnalysisResult:
        empty = pd.DataFrame()
        per_layer_rows = pd.DataFrame(per_layer).sample(frac=1.0, random_state=rng)
        bootstrap_rows = pd.DataFrame(bootstrap).sample(frac=1.0, random_state=rng)
        return AnalysisResult(empty, per_layer_rows, empty, empty, empty, bootstrap_rows, manifest={})

    return run(base_layer, base_boot_table), run(new_layer, new_boot_table), arrays


def test_effect_is_the_percent_change_per_layer_and_of_the_layer_means() -> None:
    """pct_change = 100·(intervened/baseline − 1) per layer; the overall row (layer −1) is the ratio of the means
    over layers, not the mean of the per-layer changes."""
    baseline, intervened, arrays = _hand_built_runs()
    effect = effect_table(baseline, intervened)
    assert sorted(effect["measure"].unique()) == sorted(RATIOS)  # the magnitudes both runs have
    for measure, ratio in RATIOS.items():
        base, new = arrays[measure][:2]
        rows = effect[effect["measure"] == measure].set_index("layer")
        assert sorted(rows.index) == [-1, 0, 1, 2, 3]
        np.testing.assert_allclose(rows.loc[[0, 1, 2, 3], "pct_change"], 100 * (np.array(ratio) - 1), atol=1e-9)
        np.testing.assert_allclose(rows.loc[[0, 1, 2, 3], "baseline"], base, rtol=1e-12)
        np.testing.assert_allclose(rows.loc[[0, 1, 2, 3], "intervened"], new, rtol=1e-12)
        overall = 100 * (new.mean() / base.mean() - 1)
        assert rows.loc[-1, "pct_change"] == pytest.approx(overall, abs=1e-9)
        assert overall != pytest.approx(100 * (np.mean(ratio) - 1), abs=1e-3)  # the two readings differ here


@pytest.mark.parametrize("level", [0.95, 0.8])
def test_effect_interval_is_the_paired_bootstrap_percentile_interval(level: float) -> None:
    """The interval of each effect is the percentile interval of the effect computed on resample k of both runs,
    for each k (per layer and for the ratio of the layer means)."""
    baseline, intervened, arrays = _hand_built_runs(seed=1)
    effect = effect_table(baseline, intervened, level=level)
    tail = 100 * (1 - level) / 2
    for measure, (_, _, base_boot, new_boot) in arrays.items():
        per_layer = 100 * (new_boot / base_boot - 1)
        overall = 100 * (new_boot.mean(axis=1) / base_boot.mean(axis=1) - 1)
        samples = np.column_stack([per_layer, overall])  # columns: layers 0..3, then overall
        lo, hi = np.percentile(samples, [tail, 100 - tail], axis=0)
        rows = effect[effect["measure"] == measure].set_index("layer").loc[[0, 1, 2, 3, -1]]
        np.testing.assert_allclose(rows["pct_lo"], lo, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(rows["pct_hi"], hi, rtol=1e-9, atol=1e-9)
        # Paired, every resample's ratio lies within ±3% of the true one; unpaired ones spread by a factor 3.
        ratio = np.array(RATIOS[measure])
        assert np.all(rows["pct_lo"].iloc[:LAYERS] >= 100 * (0.97 * ratio - 1))
        assert np.all(rows["pct_hi"].iloc[:LAYERS] <= 100 * (1.03 * ratio - 1))


def test_effect_without_a_bootstrap_has_no_interval() -> None:
    """A run that kept no resamples gives the point effect and NaN bounds (no interval is invented)."""
    baseline, intervened, _ = _hand_built_runs()
    intervened.bootstrap = pd.DataFrame(columns=["resample", "layer", *LAYER_MAGNITUDES])
    effect = effect_table(baseline, intervened)
    assert effect["pct_lo"].isna().all() and effect["pct_hi"].isna().all()
    rows = effect[effect["measure"] == "resid_all"].set_index("layer")
    np.testing.assert_allclose(rows.loc[[0, 1, 2, 3], "pct_change"], 100 * (np.array(RATIOS["resid_all"]) - 1))


# ------------------------------------------------------------------------------------ intervene() end to end


def _assert_effect_file_matches_the_runs(out: Path) -> None:
    """effect.parquet against 100·(intervened/baseline − 1) of the two runs' per_layer.parquet, per layer and for
    the ratio of the means over layers."""
    effect = pd.read_parquet(out / "effect.parquet")
    base = pd.read_parquet(out / "baseline" / "per_layer.parquet").set_index("layer").sort_index()
    new = pd.read_parquet(out / "intervened" / "per_layer.parquet").set_index("layer").sort_index()
    measured = measured_magnitudes(base, new)  # "beyond" only where the model has a window shorter than T
    assert sorted(effect["measure"].unique()) == sorted(measured)
    for measure in measured:
        rows = effect[effect["measure"] == measure].set_index("layer")
        b, n = base[measure].to_numpy(), new[measure].to_numpy()
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 where a noise-corrected magnitude is 0
            expected = 100 * (np.append(n / b, n.mean() / b.mean()) - 1)
        np.testing.assert_allclose(rows.loc[[*base.index, -1], "pct_change"], expected, rtol=1e-9)


def _numbers(table: pd.DataFrame) -> pd.DataFrame:
    return table.select_dtypes("number").reset_index(drop=True)


def test_intervene_bos_off_removes_the_bos_and_nothing_else(tmp_path: Path, checkpoint: tuple[Path, Path]) -> None:
    """`intervene --bos off`: the baseline runs with a BOS at position 0, the intervened run is the analysis of the
    same rows with that BOS cut off (T − 1 tokens), the effect is computed from the two, and a rerun reads both
    runs back without rewriting a file."""
    folder, corpus = checkpoint
    config = AnalyzeConfig(seq_len=24, num_seqs=6, batch_size=3, bos="off", corpus=str(corpus), bootstrap=30)
    run = intervene(str(folder), config, out=tmp_path / "run", progress=False)

    loaded = load_model(str(folder))
    with_bos = sequences_for(loaded, config.replace(bos="on").recipe)
    assert (with_bos.ids[:, 0] == 0).all() and run.baseline.manifest["bos"]["policy"] == "on"
    cut = with_bos.ids[:, 1:]
    reference = analyze_model(
        prepared_model(loaded.model, verbatim_batch(cut), config.analysis, "reference"), progress=False
    )
    pd.testing.assert_frame_equal(_numbers(run.intervened.per_layer), _numbers(reference.per_layer))
    pd.testing.assert_frame_equal(run.intervened.tokens, reference.tokens)
    assert run.intervened.manifest["data"]["seq_len"] == 23
    # predictions compared token by token: the BOS's own (baseline query 0) has no counterpart
    overall = run.behaviour[run.behaviour["bucket"] == "all"].set_index("measure")
    kept = run.baseline.tokens[run.baseline.tokens["pos"] >= 1]
    assert overall.loc["loss", "baseline"] == pytest.approx(kept["nll"].mean(), rel=1e-12)
    assert overall.loc["loss", "intervened"] == pytest.approx(reference.tokens["nll"].mean(), rel=1e-12)
    assert {t["id"] for t in run.intervened.manifest["bos"]["position0_tokens"]} == set(cut[:, 0].tolist())

    out = tmp_path / "run"
    _assert_effect_file_matches_the_runs(out)
    effect = pd.read_parquet(out / "effect.parquet")
    assert effect.loc[effect["measure"] == "mask_all", ["pct_lo", "pct_hi"]].notna().all().all()  # paired bootstrap
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["interventions"] == {"bos": "off"}
    assert (out / "report.html").stat().st_size > 10_000

    runs = {name: file_stamps(out / name) for name in ("baseline", "intervened")}
    intervene(str(folder), config, out=out, progress=False)
    assert {name: file_stamps(out / name) for name in runs} == runs, "a finished run was recomputed"


def test_intervene_ends_with_the_headline_effects_and_writes_strict_json(
    tmp_path: Path, checkpoint: tuple[Path, Path]
) -> None:
    """The last lines of `posleak intervene`: each magnitude's mean over layers, baseline → intervened, its percent
    change (from the two runs' per_layer.parquet) with the paired interval of effect.parquet, then the change of the
    next-token loss and accuracy over all queries as behaviour.parquet has them; every JSON of the folder (its
    manifest, the baseline's and the intervened run's) parses strictly."""
    folder, corpus = checkpoint
    out = tmp_path / "run"
    proc = run_main("intervene", str(folder), "--corpus", str(corpus), "--seq-len", "24", "--num-seqs", "6",
                    "--bootstrap", "30", "--bos", "on", "--replace-bos", "zero", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("headline: intervened against baseline"))
    base, new = (pd.read_parquet(out / name / "per_layer.parquet") for name in ("baseline", "intervened"))
    effect = pd.read_parquet(out / "effect.parquet").query("layer == -1").set_index("measure")
    measures = ["mask_early", "mask_all", "resid_early", "resid_all", "resid_early_key0", "resid_all_key0",
                "resid_early_rest", "resid_all_rest"]  # fmt: skip
    for line, measure in zip(lines[start + 1 : start + 9], measures, strict=True):
        b, n, e = base[measure].mean(), new[measure].mean(), effect.loc[measure]
        assert line.split(maxsplit=1) == [
            measure,
            f"{b:.4g} → {n:.4g} nats, {100 * (n / b - 1):+.3g}% ({e['pct_lo']:+.3g}% to {e['pct_hi']:+.3g}%)",
        ]
    scores = pd.read_parquet(out / "behaviour.parquet").query("bucket == 'all'").set_index("measure")
    loss, accuracy = scores.loc["loss"], scores.loc["accuracy"]
    assert lines[start + 9] == (
        f"  next-token loss, all queries: {loss['baseline']:.4g} → {loss['intervened']:.4g} nats, "
        f"{loss['change']:+.3g} ({loss['change_lo']:+.3g} to {loss['change_hi']:+.3g})"
    )
    assert lines[start + 10].startswith(f"  top-1 accuracy, all queries: {100 * accuracy['baseline']:.1f}% → ")
    assert len(lines) == start + 11
    files = strict_json_files(out)
    assert {out / "manifest.json", out / "baseline" / "manifest.json", out / "intervened" / "manifest.json"} <= set(
        files
    )


def test_intervene_rope_scaling_reloads_the_model_with_the_scaled_base(
    tmp_path: Path, checkpoint: tuple[Path, Path]
) -> None:
    """`intervene --rope-scaling ntk:4` reloads the checkpoint with θ' = θ·4^(D/(D−2)) in every layer and changes
    nothing else: the intervened run equals an analysis of a model built by hand with that base and the same
    weights, on the same sequences."""
    folder, corpus = checkpoint
    spec = Interventions.from_options(rope_scaling="ntk:4")
    config = AnalyzeConfig(seq_len=24, num_seqs=4, batch_size=2, corpus=str(corpus), bootstrap=0, interventions=spec)
    run = intervene(str(folder), config, out=tmp_path / "run", progress=False)

    saved = json.loads((folder / "config.json").read_text())
    theta, dim = saved["rope_parameters"]["rope_theta"], saved["hidden_size"] // saved["num_attention_heads"]
    scaled = theta * 4 ** (dim / (dim - 2))
    assert run.baseline.manifest["model"]["facts"]["rope_theta"] == [theta] * 3
    assert run.intervened.manifest["model"]["facts"]["rope_theta"] == pytest.approx([scaled] * 3, rel=1e-12)

    loaded = load_model(str(folder))
    twin = LlamaForCausalLM(LlamaConfig(**{**saved, "rope_parameters": {"rope_type": "default", "rope_theta": scaled}}))
    twin.load_state_dict(loaded.model.state_dict())
    twin = use_posleak_attention(twin.float().eval())
    batch = sequences_for(loaded, config.recipe)
    reference = analyze_model(
        prepared_model(twin, batch, config.replace(interventions=Interventions()).analysis, "twin"), progress=False
    )
    pd.testing.assert_frame_equal(_numbers(run.intervened.per_layer), _numbers(reference.per_layer))
    assert not np.allclose(run.intervened.per_layer["mask_all"], run.baseline.per_layer["mask_all"])
    _assert_effect_file_matches_the_runs(tmp_path / "run")


# ------------------------------------------------------------------- the model's own predictions (behaviour)


def _eager_scores(model: PreTrainedModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """transformers' own per-token cross-entropy and top-1 hits from eager attention, and its own `loss` for
    labels = ids; the model is switched back to posleak's attention afterwards."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        use_posleak_attention(model)
    logits = out.logits[:, :-1].float()
    # rows × vocabulary, as transformers' loss takes them: a (B, V, T) layout sums the exponentials in another
    # order, 1e-4 nats apart over a 49,152-word vocabulary in float32
    flat = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    return flat.view(ids.shape[0], -1), logits.argmax(-1) == ids[:, 1:], float(out.loss)


def _scores(tokens: pd.DataFrame, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    ordered = tokens.sort_values(["seq", "pos"])
    return ordered["nll"].to_numpy().reshape(shape), ordered["correct"].to_numpy().reshape(shape)


@pytest.mark.parametrize("family", FAMILIES)
def test_next_token_scores_equal_transformers_loss_with_eager_attention(family: str) -> None:
    """The loss and top-1 hits `analyze_model` keeps from its own forward are those of the model's causal-LM head
    (Gemma 2's final soft-cap included), against transformers' loss with eager attention on the same ids."""
    model = use_posleak_attention(tiny_model(family))
    ids = tiny_ids(model, batch=4)
    config = AnalyzeConfig(seq_len=T, num_seqs=4, batch_size=3, bootstrap=0)
    result = analyze_model(prepared_model(model, verbatim_batch(ids), config.analysis, family), progress=False)
    nll, hits, loss = _eager_scores(model, ids)
    got_nll, got_hits = _scores(result.tokens, (4, T - 1))
    assert result.tokens["nll"].mean() == pytest.approx(loss, abs=1e-5)
    np.testing.assert_allclose(got_nll, nll.numpy(), atol=1e-5)
    np.testing.assert_array_equal(got_hits, hits.numpy())
    np.testing.assert_array_equal(result.tokens.sort_values(["seq", "pos"])["target"], ids[:, 1:].flatten())


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_next_token_scores_over_slices_of_the_vocabulary_equal_transformers_loss(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logits formed in blocks of 7 rows × 9 words (running maximum, argmax and Σ exp across the slices) give
    transformers' per-token loss and top-1 hits, Gemma 2's final soft-cap included."""
    monkeypatch.setattr(behaviour, "_LOGIT_ROWS", 7)
    monkeypatch.setattr(behaviour, "_LOGIT_ELEMENTS", 7 * 9)
    model = use_posleak_attention(tiny_model(family))
    ids = tiny_ids(model, batch=2)
    with torch.no_grad():
        hidden = model.model(ids, use_cache=False).last_hidden_state
    nll, hits = behaviour.next_token_scores(model, hidden, ids)
    want_nll, want_hits, _ = _eager_scores(model, ids)
    assert model.config.vocab_size > 9 and ids.shape[1] > 7  # several slices of words and blocks of rows
    np.testing.assert_allclose(nll.numpy(), want_nll.numpy(), atol=1e-5)
    np.testing.assert_array_equal(hits.numpy(), want_hits.numpy())


@pytest.mark.slow
def test_real_model_next_token_scores_equal_transformers_loss(smollm2: LoadedModel) -> None:
    """The same on SmolLM2-135M (a 49,152-word output layer, formed a slice of the vocabulary at a time)."""
    batch = sequences_for(smollm2, AnalyzeConfig(seq_len=96, num_seqs=2).recipe)
    config = AnalyzeConfig(seq_len=96, num_seqs=2, batch_size=2, bootstrap=0)
    result = analyze_model(PreparedRun.of(smollm2, batch, config), progress=False)
    nll, hits, loss = _eager_scores(smollm2.model, batch.ids)
    got_nll, got_hits = _scores(result.tokens, (2, 95))
    # posleak's attention kernel and eager round differently in float32 through 30 layers: 1e-5-size differences
    # per token whose sign and size depend on the CPU's vector kernels (3.039154 against 3.039137 on CI's machine)
    assert result.tokens["nll"].mean() == pytest.approx(loss, abs=1e-4)
    np.testing.assert_allclose(got_nll, nll.numpy(), atol=1e-4)
    assert (got_hits == hits.numpy()).mean() > 0.99  # a near-tie may flip between attention kernels
    assert got_hits.mean() == pytest.approx(hits.double().mean().item(), abs=0.02)


def test_window_wider_than_the_sequences_changes_no_prediction(tmp_path: Path, checkpoint: tuple[Path, Path]) -> None:
    """`--window 1000` on 24-token rows admits every causal pair: the intervened run's losses and hits equal the
    baseline's bit for bit, every change and its interval is 0, and the baseline's loss over all queries is
    transformers' own loss (eager attention) on the same ids."""
    folder, corpus = checkpoint
    spec = Interventions.from_options(window="1000")
    config = AnalyzeConfig(seq_len=24, num_seqs=6, batch_size=4, corpus=str(corpus), bootstrap=40, interventions=spec)
    run = intervene(str(folder), config, out=tmp_path / "run", progress=False)
    pd.testing.assert_frame_equal(run.intervened.tokens, run.baseline.tokens, check_exact=True)
    assert (run.behaviour[["change", "change_lo", "change_hi"]].to_numpy() == 0).all()

    loaded = load_model(str(folder))
    _, hits, loss = _eager_scores(loaded.model, sequences_for(loaded, config.recipe).ids)
    overall = run.behaviour[run.behaviour["bucket"] == "all"].set_index("measure")
    assert overall.loc["loss", "baseline"] == pytest.approx(loss, abs=1e-5)
    assert overall.loc["accuracy", "baseline"] == pytest.approx(hits.double().mean().item(), abs=1e-12)
    assert overall.loc["loss", "tokens"] == 6 * 23
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "run" / "behaviour.parquet"), run.behaviour)
    assert "Effect on the model" in (tmp_path / "run" / "report.html").read_text()


def _token_frame(values: np.ndarray, hits: np.ndarray) -> pd.DataFrame:
    n, q = values.shape
    return pd.DataFrame(
        {
            "seq": np.repeat(np.arange(n), q),
            "pos": np.tile(np.arange(q), n),
            "target": np.arange(n * q) % 7,
            "nll": values.flatten(),
            "correct": hits.flatten(),
        }
    )


@pytest.mark.parametrize("shift", [0, 1])
def test_behaviour_intervals_are_the_paired_resamples_of_sequences(shift: int) -> None:
    """Each resample of `behaviour_table` against recomputing it from scratch on the resampled sequences (the
    rows drawn, repeated), both runs with the same draws; a run one token shorter at the front (`--bos off`)
    compared token by token: its query i against the baseline's query i + 1."""
    rng = np.random.default_rng(shift)
    n, seq_len, resamples, early = 7, 40, 50, 10
    base_nll, base_hit = rng.gamma(2.0, 1.0, (n, seq_len - 1)), rng.random((n, seq_len - 1)) < 0.4
    new_nll, new_hit = rng.gamma(2.5, 1.0, (n, seq_len - 1 - shift)), rng.random((n, seq_len - 1 - shift)) < 0.3
    empty = pd.DataFrame()
    baseline = AnalysisResult(empty, empty, empty, empty, empty, empty, {}, tokens=_token_frame(base_nll, base_hit))
    new_tokens = _token_frame(new_nll, new_hit)
    new_tokens["target"] = _token_frame(base_nll, base_hit)["target"].to_numpy().reshape(n, -1)[:, shift:].flatten()
    intervened = AnalysisResult(empty, empty, empty, empty, empty, empty, {}, tokens=new_tokens)
    table = behaviour_table(baseline, intervened, early=early, resamples=resamples, seed=5).set_index(
        ["bucket", "measure"]
    )
    assert list(dict.fromkeys(table.index.get_level_values(0))) == ["first", "early", "middle", "late", "all"]
    weights = resample_weights(n, resamples, 5).numpy().astype(int)
    spans = {"first": (0, 4), "early": (4, 10), "middle": (10, 20), "late": (20, 39), "all": (0, 39)}
    for bucket, (lo, hi) in spans.items():
        lo = max(lo, shift)  # the BOS's own prediction has no counterpart in the shorter run
        for measure, (b, v) in {"loss": (base_nll, new_nll), "accuracy": (base_hit, new_hit)}.items():
            b_cell, v_cell = b[:, lo:hi].astype(float), v[:, lo - shift : hi - shift].astype(float)
            draws = [np.repeat(np.arange(n), w) for w in weights]
            changes = [v_cell[rows].mean() - b_cell[rows].mean() for rows in draws]
            row = table.loc[(bucket, measure)]
            assert row["tokens"] == n * (hi - lo)
            assert row["baseline"] == pytest.approx(b_cell.mean(), rel=1e-12)
            assert row["change"] == pytest.approx(v_cell.mean() - b_cell.mean(), rel=1e-12, abs=1e-12)
            assert row["change_lo"] == pytest.approx(np.percentile(changes, 2.5), rel=1e-9, abs=1e-12)
            assert row["change_hi"] == pytest.approx(np.percentile(changes, 97.5), rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------------------- a new intervention, registered


@dataclass(frozen=True)
class ScaleOutputs(Intervention):
    """A toy intervention, whole in one class as a new module would hold it: every attention output scaled by K."""

    name = "scale_outputs"

    factor: str | None = setting("scale_outputs", metavar="K", help="multiply every attention output by K > 0")

    def problems(self, model: LoadedModel | None, bos_at_0: bool | None) -> list[str]:
        try:
            good = self.factor is None or float(self.factor) > 0
        except ValueError:
            good = False
        return [] if good else [f"bad --scale-outputs {self.factor!r}; use a factor K > 0"]

    def edit_attention(
        self,
        edits: AttentionEdits,
        sink_heads: SinkHeads | None,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
    ) -> None:
        assert self.factor is not None  # installed only where given
        factor = float(self.factor)
        edits.output_edits = (*edits.output_edits, lambda call: call.output * factor)


def test_a_registered_intervention_reaches_the_command_line_its_checks_the_manifest_and_the_model(
    tmp_path: Path, checkpoint: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding an intervention is one class registered by name: `posleak intervene` then offers its option, refuses
    its bad values like any other's, records it in the manifest and installs it, so that the model's predictions
    and the magnitudes change."""

    def identity() -> str:
        config = AnalyzeConfig(seq_len=24, interventions=Interventions.from_options(ablate_sink_values="auto"))
        return fingerprint({"config": config.identity()})

    unregistered = identity()
    monkeypatch.setitem(REGISTRY, ScaleOutputs.name, ScaleOutputs)
    assert identity() == unregistered  # registering it changes no fingerprint of a run without it: those resume
    folder, corpus = checkpoint
    args = ("intervene", str(folder), "--corpus", str(corpus), "--seq-len", "24", "--num-seqs", "4",
            "--bootstrap", "20")  # fmt: skip
    assert "--scale-outputs K" in run_main("intervene", "-h").stdout
    assert_one_line_error(run_main(*args, "--scale-outputs", "-1", "--out", str(tmp_path / "bad")), "--scale-outputs")
    assert not (tmp_path / "bad").exists()

    out = tmp_path / "run"
    proc = run_main(*args, "--scale-outputs", "0.5", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["interventions"] == {"scale_outputs": "0.5"}
    base, new = (pd.read_parquet(out / name / "tokens.parquet") for name in ("baseline", "intervened"))
    assert (base["nll"] - new["nll"]).abs().max() > 1e-3  # the model's own predictions changed
    _assert_effect_file_matches_the_runs(out)
    effect = pd.read_parquet(out / "effect.parquet").query("layer == -1").set_index("measure")
    assert effect.loc["resid_all", "pct_change"] != 0
