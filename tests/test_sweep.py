"""`posleak sweep` on real tiny lab models: the spec, a sweep that reruns nothing (locally, in worker processes
and on Ray), one interrupted mid-trial that resumes without redoing finished trials, and Ray workers killed
mid-training or dying every time."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli import file_stamps, run_cli
from optimizer_steps import optimizer_steps
from ray_hooks import plan_fault

from posleak.errors import PosleakError
from posleak.lab.plan import run_plan
from posleak.lab.sweep import SweepSpec
from posleak.lab.trial import MARKER, Trial, trial_folder


def _sweep_spec() -> SweepSpec:
    return SweepSpec.from_dict(
        {
            "name": "test",
            "base": {"size": "tiny", "steps": 4, "seq_len": 32, "batch_size": 4, "eval_every": 2, "warmup_steps": 1},
            "grid": {"pe": ["rope", "nope"]},
            "seeds": [0, 1],
            "eval": {"length_multiples": [1], "probe_seqs": 8, "analyze_seqs": 4, "batch_size": 4, "bootstrap": 0},
        }
    )


def _markers(out: Path, spec: SweepSpec) -> dict[str, tuple[int, str]]:
    stamps = {}
    for trial in spec.trials():
        marker = trial_folder(out, trial) / MARKER
        stamps[trial.key] = (marker.stat().st_mtime_ns, json.loads(marker.read_text())["finished_utc"])
    return stamps


def test_sweep_spec_errors_name_the_problem() -> None:
    with pytest.raises(PosleakError, match="unknown options"):
        SweepSpec.from_dict({"grid": {"colour": ["red"]}})
    with pytest.raises(PosleakError, match="non-empty list"):
        SweepSpec.from_dict({"grid": {"pe": "rope"}})
    assert len(_sweep_spec().trials()) == 4
    assert len({trial.key for trial in _sweep_spec().trials()}) == 4


@pytest.mark.slow
def test_sweep_on_a_local_ray_cluster_reruns_nothing(tmp_path: Path) -> None:
    spec = _sweep_spec()
    table = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert len(table) == 4 and set(table["pe"]) == {"rope", "nope"} and set(table["seed"]) == {0, 1}
    first = _markers(tmp_path, spec)
    again = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert _markers(tmp_path, spec) == first, "a finished trial ran again"
    pd.testing.assert_frame_equal(again, table)
    assert (tmp_path / "sweep.parquet").is_file() and (tmp_path / "report.html").is_file()


RESUME_SWEEP = {
    "name": "resume",
    "base": {
        "size": "tiny",
        "steps": 6,
        "seq_len": 32,
        "batch_size": 4,
        "eval_every": 3,
        "eval_seqs": 8,
        "warmup_steps": 1,
        "checkpoint_every": 2,
    },
    "grid": {"pe": ["rope", "nope", "alibi"]},
    "seeds": [0],
    "eval": {"length_multiples": [1], "probe_seqs": 8, "analyze_seqs": 4, "batch_size": 4, "bootstrap": 0},
}
TIMINGS = ["train_s", "eval_s"]


@pytest.fixture(scope="module")
def reference_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    """RESUME_SWEEP run once, uninterrupted, one trial after the other in this process."""
    out = tmp_path_factory.mktemp("reference-sweep")
    return out, run_plan(SweepSpec.from_dict(RESUME_SWEEP).plan(), out, progress=False, jobs=1).table


def _assert_same_results(table: pd.DataFrame, reference: pd.DataFrame) -> None:
    """Every column but the timings equal, bit for bit: training and measuring are deterministic."""
    pd.testing.assert_frame_equal(table.drop(columns=TIMINGS), reference.drop(columns=TIMINGS), check_exact=True)


def test_sweep_interrupted_mid_trial_resumes_without_redoing_finished_trials(
    tmp_path: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """Interrupted in the second trial's training (step 3 done, checkpoint at 2), a rerun leaves the first trial's
    files alone, takes the second from its checkpoint and the third from scratch, and ends equal to the
    uninterrupted sweep."""
    spec = SweepSpec.from_dict(RESUME_SWEEP)
    first, second, _ = spec.trials()
    with optimizer_steps(interrupt_before=6 + 4), pytest.raises(KeyboardInterrupt):
        run_plan(spec.plan(), tmp_path, progress=False, jobs=1)
    assert (trial_folder(tmp_path, first) / MARKER).is_file()
    assert not (trial_folder(tmp_path, second) / MARKER).exists()
    assert (tmp_path / "models" / second.train_key / "checkpoints" / "latest").read_text().strip() == "step-000002"
    finished = file_stamps(trial_folder(tmp_path, first), tmp_path / "models" / first.train_key)

    with optimizer_steps() as steps:
        table = run_plan(spec.plan(), tmp_path, progress=False, jobs=1).table
    assert steps[0] == (6 - 2) + 6
    assert file_stamps(trial_folder(tmp_path, first), tmp_path / "models" / first.train_key) == finished
    _assert_same_results(table, reference_sweep[1])


def _run_interval(out: Path, trial: Trial) -> tuple[datetime, datetime]:
    record = json.loads((trial_folder(out, trial) / MARKER).read_text())
    return datetime.fromisoformat(record["started_utc"]), datetime.fromisoformat(record["finished_utc"])


@pytest.mark.slow
def test_cli_sweep_in_worker_processes_equals_the_serial_sweep(
    tmp_path: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """`posleak sweep SPEC --jobs 2` runs the trials two at a time in a process pool (two of them overlap in time)
    and writes the same table as the serial sweep."""
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(RESUME_SWEEP))
    out = tmp_path / "out"
    proc = run_cli("sweep", str(spec_file), "--out", str(out), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 trials" in proc.stdout
    _assert_same_results(pd.read_parquet(out / "sweep.parquet"), reference_sweep[1])
    first, second = SweepSpec.from_dict(RESUME_SWEEP).trials()[:2]
    (start_a, end_a), (start_b, end_b) = _run_interval(out, first), _run_interval(out, second)
    assert start_a < end_b and start_b < end_a, "the first two trials did not run side by side"
    assert (out / "report.html").is_file()


# ----------------------------------------------------------------------------------------- Ray, with faults


def _with_finished(out: Path, reference: Path, trials: list[Trial]) -> None:
    """Copy finished trials (measurements and trained model) of the reference sweep into `out`."""
    for trial in trials:
        shutil.copytree(trial_folder(reference, trial), trial_folder(out, trial))
        shutil.copytree(reference / "models" / trial.train_key, out / "models" / trial.train_key)


def _finished_stamps(out: Path, trials: list[Trial]) -> dict[Path, tuple[int, int]]:
    return file_stamps(*(trial_folder(out, trial) for trial in trials), *(out / "models" / t.train_key for t in trials))


@pytest.mark.slow
def test_ray_retries_a_worker_killed_mid_training_from_its_checkpoint(
    tmp_path: Path, ray_faults: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """Two of three trials finished before; on Ray the third's worker is killed (SIGKILL) right after its step-2
    checkpoint. Ray retries the task, the retry resumes from that checkpoint (the next checkpoints saved are 4 and
    6, not 2 again), the finished trials are not touched, and the table equals the uninterrupted sweep."""
    spec = SweepSpec.from_dict(RESUME_SWEEP)
    trials = spec.trials()
    _with_finished(tmp_path, reference_sweep[0], trials[:2])
    finished = _finished_stamps(tmp_path, trials[:2])
    plan_fault(ray_faults, "alibi", "checkpoint", times=1)
    table = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert (ray_faults / "deaths.log").read_text().splitlines() == ["alibi checkpoint"]
    assert (ray_faults / "checkpoints.log").read_text().split() == ["2", "4", "6"]
    assert _finished_stamps(tmp_path, trials[:2]) == finished
    _assert_same_results(table, reference_sweep[1])


@pytest.mark.slow
def test_ray_worker_that_keeps_dying_fails_the_sweep_and_a_rerun_finishes_it(
    tmp_path: Path, ray_faults: Path, reference_sweep: tuple[Path, pd.DataFrame]
) -> None:
    """The third trial's worker dies as its measurements start, every time, until Ray gives up: the sweep stops
    with a one-line error naming the trial. Once the fault is gone, a rerun with that trial left to do finishes it
    without retraining its model or touching the finished trials, and the table equals the uninterrupted sweep."""
    spec = SweepSpec.from_dict(RESUME_SWEEP)
    trials = spec.trials()
    _with_finished(tmp_path, reference_sweep[0], trials[:2])
    plan_fault(ray_faults, "alibi", "measure", times=100)
    with pytest.raises(PosleakError, match=r"Ray worker died running trial pe=alibi .* rerun the same command") as err:
        run_plan(spec.plan(), tmp_path, backend="ray", progress=False)
    assert "\n" not in str(err.value)
    assert not (trial_folder(tmp_path, trials[2]) / MARKER).exists()
    assert len((ray_faults / "deaths.log").read_text().splitlines()) > 1  # Ray retried before giving up
    kept = _finished_stamps(tmp_path, trials[:2]) | file_stamps(tmp_path / "models" / trials[2].train_key)

    (ray_faults / "plan.json").unlink()
    table = run_plan(spec.plan(), tmp_path, backend="ray", progress=False).table
    assert _finished_stamps(tmp_path, trials[:2]) | file_stamps(tmp_path / "models" / trials[2].train_key) == kept
    _assert_same_results(table, reference_sweep[1])
