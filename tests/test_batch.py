"""Batch analyses (posleak.experiments.batch): a YAML list of models × settings run as analyses, here and on a
real local Ray cluster whose worker is killed midway, resumed without redoing what finished, and gathered into
one comparison."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli import assert_one_line_error, file_stamps, run_main
from ray_hooks import plan_fault
from tiny import tiny_checkpoint, word_corpus

from posleak.commands.analyze import analyze
from posleak.errors import PosleakError
from posleak.experiments import batch
from posleak.experiments.batch import AnalysisJob, BatchSpec, run_analyses, run_batch
from posleak.interventions import Interventions, RopeScaling
from posleak.pipeline import AnalyzeConfig
from posleak.store import RunFolder

TABLES = ("per_head", "per_layer", "profiles", "bootstrap")


@pytest.fixture(scope="module")
def model_and_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("batch")
    return tiny_checkpoint(root / "tiny-llama"), word_corpus(root / "words.txt")


def _spec(folder: Path, corpus: Path) -> dict:
    return {
        "name": "rope",
        "models": [str(folder)],
        "base": {"seq_len": 48, "num_seqs": 4, "batch_size": 2, "corpus": str(corpus), "bootstrap": 20},
        "grid": {"rope_scaling": [None, "ntk:4"]},
    }


def _alone(folder: Path, corpus: Path, rope_scaling: str | None, out: Path) -> RunFolder:
    """The same analysis run on its own by `analyze`: what each batch run must equal."""
    config = AnalyzeConfig(
        seq_len=48,
        num_seqs=4,
        batch_size=2,
        corpus=str(corpus),
        bootstrap=20,
        interventions=Interventions.from_options(rope_scaling=rope_scaling),
    )
    analyze(str(folder), config, out=out, progress=False)
    return RunFolder(out)


def _assert_same_tables(run: RunFolder, reference: RunFolder) -> None:
    for table in TABLES:
        pd.testing.assert_frame_equal(run.read_table(table), reference.read_table(table))


def test_batch_runs_every_model_and_setting_as_analyze_would_and_compares_them(
    tmp_path: Path, model_and_corpus: tuple[Path, Path]
) -> None:
    """Two settings of one model: each run folder holds exactly what `analyze` alone writes for that setting
    (and the NTK run differs from the plain one, so the setting was applied); the comparison has one row per run
    whose slope is the one `compare` computes from that run; a rerun reads everything back."""
    folder, corpus = model_and_corpus
    spec_file = tmp_path / "batch.yaml"
    spec_file.write_text(yaml.safe_dump(_spec(folder, corpus)))
    out = tmp_path / "out"
    proc = run_main("batch", str(spec_file), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    names = ["tiny-llama-rope_scaling=None", "tiny-llama-rope_scaling=ntk:4"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(names)
    for name, scaling in zip(names, (None, "ntk:4"), strict=True):
        _assert_same_tables(RunFolder(out / "runs" / name), _alone(folder, corpus, scaling, tmp_path / name))
    plain, ntk = (RunFolder(out / "runs" / n).read_table("per_layer") for n in names)
    assert not plain["resid_all"].equals(ntk["resid_all"])
    comparison = pd.read_parquet(out / "comparison" / "comparison.parquet")
    assert comparison["run"].tolist() == names
    assert (out / "comparison" / "report.html").is_file()

    finished = file_stamps(out / "runs")
    again = run_main("batch", str(spec_file), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert file_stamps(out / "runs") == finished


def test_local_analyses_load_each_model_once_and_come_back_in_the_order_asked(
    tmp_path: Path, model_and_corpus: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs that alternate between two checkpoints and a RoPE scaling, as a paper's come by sample and claim: run
    here with a cache of two models, each model is loaded once (one after another they took five loads), and
    every result is its own job's, in the order the jobs were given."""
    folder, corpus = model_and_corpus
    other = tiny_checkpoint(tmp_path / "other")
    loads: list[tuple[str, str | None]] = []

    def counted(spec: str, interventions: Interventions, **kwargs: object) -> object:
        loads.append((spec, _rope_scaling(interventions)))
        return real_load(spec, interventions, **kwargs)

    real_load = batch.load_for
    monkeypatch.setattr(batch, "load_for", counted)
    base = AnalyzeConfig(seq_len=48, num_seqs=4, batch_size=2, corpus=str(corpus), bootstrap=20)
    asked = [
        (folder, base),
        (other, base),
        (folder, base.replace(interventions=Interventions.from_options(rope_scaling="ntk:4"))),
        (other, base.replace(seed=1)),
        (folder, base.replace(seed=1)),
    ]
    jobs = [AnalysisJob(f"job{k}", str(model), config, tmp_path / f"job{k}") for k, (model, config) in enumerate(asked)]
    results = run_analyses(jobs, progress=False)
    assert loads == [(str(folder), None), (str(folder), "ntk:4"), (str(other), None)]
    assert [result.run.path for result in results] == [job.out for job in jobs]
    for result, (model, config) in zip(results, asked, strict=True):
        args = result.run.read_manifest()["args"]
        assert args["model"] == str(model)
        assert (args["config"]["seed"], args["config"]["interventions"].get("rope_scaling")) == (
            config.recipe.seed,
            _rope_scaling(config.interventions),
        )


def _rope_scaling(interventions: Interventions) -> str | None:
    """The RoPE scaling the interventions give, if any."""
    rope = interventions.get(RopeScaling)
    return None if rope is None else rope.scaling


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"grid": {"seq_lenn": [8]}}, "unknown options ['seq_lenn']"),
        ({"models": []}, "'models' must be a non-empty list"),
        ({"base": {"num_seqs": 1}}, "1 sequence(s) are too few"),
        ({"grid": {"rope_scaling": ["ntk:x"]}}, "rope"),
    ],
)
def test_batch_refuses_bad_input_in_one_line_before_any_run(
    tmp_path: Path, model_and_corpus: tuple[Path, Path], change: dict, needle: str
) -> None:
    folder, corpus = model_and_corpus
    spec = _spec(folder, corpus)
    for section, value in change.items():
        spec[section] = {**spec[section], **value} if isinstance(value, dict) else value
    spec_file = tmp_path / "batch.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    proc = run_main("batch", str(spec_file), "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_batch_on_ray_survives_a_killed_worker_and_the_rerun_redoes_nothing_finished(
    tmp_path: Path, ray_faults: Path, model_and_corpus: tuple[Path, Path]
) -> None:
    """Two analyses as Ray tasks on a local cluster; the second's worker is killed (SIGKILL) once its forwards
    are captured, every time Ray retries it, until Ray gives up: the batch stops with a one-line error naming it,
    the first analysis finished. Once the fault is gone, the rerun leaves the finished analysis untouched,
    completes the other from its captures, and both equal `analyze` run alone."""
    folder, corpus = model_and_corpus
    spec = BatchSpec.from_dict(_spec(folder, corpus))
    out = tmp_path / "out"
    first, second = spec.jobs(out.resolve())
    plan_fault(ray_faults, second.name, "measure", times=100)
    with pytest.raises(PosleakError, match=rf"Ray worker died running analysis {second.name} .* rerun") as err:
        run_batch(spec, out, backend="ray", progress=False)
    assert "\n" not in str(err.value)
    assert len((ray_faults / "deaths.log").read_text().splitlines()) > 1  # Ray retried before giving up
    assert RunFolder(first.out).is_complete and not RunFolder(second.out).is_complete
    captured = file_stamps(second.out / ".partial" / "captures")
    assert captured, "the killed analysis died before its forwards were captured"
    finished = file_stamps(first.out)

    (ray_faults / "plan.json").unlink()
    run_batch(spec, out, backend="ray", progress=False)
    assert file_stamps(first.out) == finished
    assert RunFolder(second.out).is_complete
    for job, scaling in zip((first, second), (None, "ntk:4"), strict=True):
        _assert_same_tables(RunFolder(job.out), _alone(folder, corpus, scaling, tmp_path / job.name))
