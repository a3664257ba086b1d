"""Bad input is refused before any work, and a run folder survives being killed, shared or filled (issue 10).

Refusals: exit status 2, one `posleak: error:` line per problem, no traceback, nothing written (an
intervention's baseline included). Crashes: a run killed with SIGKILL at any stage, or stopped by a full
disk, resumes with the same command to the same tables, bit for bit; a second process writing the same
folder is refused with the first one named. Most runs use a tiny Llama saved as a real checkpoint folder,
through `posleak.cli.main` in this process (`run_main`); the cases that need a process of their own
(SIGKILL, two writers, a sample of each kind of refusal) start a fresh interpreter (`run_cli`).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from cli import ERROR, assert_error_lines, assert_one_line_error, run_cli, run_main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tiny import tiny_checkpoint, tiny_tokenizer, word_corpus

from posleak.data.batches import load_token_file, make_sequences
from posleak.data.corpus import load_corpus
from posleak.data.kinds import BOS_POLICIES
from posleak.errors import PosleakError
from posleak.pipeline import AnalysisResult
from posleak.store import LOCK, RunFolder

# Small enough that a whole analysis takes a second or two; the corpus holds 4000 one-token words.
SMALL = ("--seq-len", "24", "--num-seqs", "4", "--batch-size", "2", "--bootstrap", "10")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def no_bos_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny-no-bos", bos=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return word_corpus(tmp_path_factory.mktemp("corpus") / "words.txt")


def analyze_args(model: Path, corpus: Path, out: Path, *options: str) -> list[str]:
    return ["analyze", str(model), "--corpus", str(corpus), *SMALL, *options, "--out", str(out)]


def intervene_args(model: Path, corpus: Path, out: Path, *options: str) -> list[str]:
    return ["intervene", str(model), "--corpus", str(corpus), *SMALL, *options, "--out", str(out)]


def assert_same_tables(run: Path, reference: Path) -> None:
    """Every table of `run` equals the one of `reference` bit for bit; both folders are complete, alike."""
    assert RunFolder(run).is_complete and RunFolder(reference).is_complete
    for name in AnalysisResult.TABLES:
        pd.testing.assert_frame_equal(
            pd.read_parquet(run / f"{name}.parquet"), pd.read_parquet(reference / f"{name}.parquet"), check_exact=True
        )
    assert _listing(run) == _listing(reference)


def _listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


# ----------------------------------------------------------------------------------- the cases


@pytest.mark.slow
def test_one_sequence_is_refused_saying_what_it_would_lose(model: Path, corpus: Path, tmp_path: Path) -> None:
    """`--num-seqs 1` ended in a 34-line traceback after writing seven tables and no manifest."""
    out = tmp_path / "run"
    proc = run_cli(*analyze_args(model, corpus, out, "--num-seqs", "1"))
    assert_one_line_error(proc, "1 sequence(s) are too few", "pairs sequences of distinct documents", "--num-seqs 2")
    assert not out.exists()


@pytest.mark.slow
def test_output_path_that_is_a_file_is_refused(model: Path, corpus: Path, tmp_path: Path) -> None:
    """`--out FILE` ended in a FileExistsError traceback."""
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    assert_one_line_error(run_cli(*analyze_args(model, corpus, out)), f"--out {out} is a file")
    assert out.read_text() == "mine"
    inside = out / "run"  # a folder under a file cannot be created either
    assert_one_line_error(run_main(*analyze_args(model, corpus, inside)), f"{out} is a file")


@pytest.mark.slow
def test_ablating_heads_that_do_not_exist_is_refused(tmp_path: Path) -> None:
    """On smollm2-135m (30 layers of 9 heads) `--ablate-sink-values 99.99` exited 0 with the effect of an
    ablation that touched nothing."""
    out = tmp_path / "run"
    proc = run_cli("intervene", "smollm2-135m", "--seq-len", "64", "--num-seqs", "4", "--ablate-sink-values", "99.99",
                   "--out", str(out))  # fmt: skip
    assert_one_line_error(proc, "99.99", "layers 0..29", "heads 0..8")
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "needle", "bos"),
    [
        (("--rope-scaling", "ntk:0"), "--rope-scaling 'ntk:0'", True),
        (("--replace-bos", "purple"), "--replace-bos 'purple'", True),
        (("--replace-bos", "mean"), "tokenizer has no BOS token", False),
        (("--replace-bos", "mean"), "add --bos on", True),  # smollm2's case: a BOS token, but auto puts none
        (("--patch-pos0", "w5 w6"), "encodes to 2 tokens", True),
        (("--patch-layers", "7", "--patch-pos0", "w5"), "resid indices [7]", True),
        (("--ablate-sink-values", "3.0,0.4"), "3.0, 0.4", True),
        (("--patch-kv0", "w5 w6"), "--patch-kv0 'w5 w6' encodes to 2 tokens", True),
        (("--patch-kv0", "w5", "--kv0-heads", "3.0,0.4"), "--kv0-heads '3.0,0.4' names heads", True),
        (("--patch-kv0", "w5", "--kv0-heads", "a.b"), "bad --kv0-heads 'a.b'", True),
        (("--hold-sink-clock", "3.0,0.4"), "--hold-sink-clock '3.0,0.4' names heads", True),
        (("--remove-sink-reads", "a.b"), "bad --remove-sink-reads 'a.b'", True),
        (("--window", "0"), "--window '0'", True),
    ],
)
def test_bad_interventions_are_refused_before_the_baseline(
    model: Path, no_bos_model: Path, corpus: Path, tmp_path: Path, options: tuple[str, ...], needle: str, bos: bool
) -> None:
    """These failed minutes later, after a finished `baseline/` had been written."""
    out = tmp_path / "run"
    assert_one_line_error(run_main(*intervene_args(model if bos else no_bos_model, corpus, out, *options)), needle)
    assert not out.exists()


@pytest.mark.slow
def test_an_intervention_refused_in_a_fresh_interpreter(model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert_one_line_error(run_cli(*intervene_args(model, corpus, out, "--rope-scaling", "ntk:0")), "ntk:0")
    assert not out.exists()


def _token_file(path: Path, first_column: int | None, rows: int = 4, length: int = 24) -> Path:
    ids = np.random.default_rng(0).integers(2, 96, size=(rows, length))
    if first_column is not None:
        ids[:, 0] = first_column
    np.save(path, ids)
    return path


@pytest.mark.parametrize("bos", [[], ["--bos", "on"]])
def test_replace_bos_runs_on_a_token_file_that_starts_with_the_bos(model: Path, tmp_path: Path, bos: list[str]) -> None:
    """`--tokens FILE --replace-bos mean` was refused although every row of FILE starts with the BOS id, and
    `--bos on` did not help: a token file whose first column is the tokenizer's BOS id has a BOS at position 0."""
    tokens = _token_file(tmp_path / "tokens.npy", first_column=0)  # "<bos>" is id 0 of the tiny tokenizer
    out = tmp_path / "run"
    proc = run_main("intervene", str(model), "--tokens", str(tokens), "--replace-bos", "mean", "--bootstrap", "10",
                    *bos, "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert RunFolder(out).is_complete and not (out / LOCK).exists()
    for run in ("baseline", "intervened"):
        manifest = json.loads((out / run / "manifest.json").read_text())
        assert manifest["data"]["bos"] == "verbatim" and manifest["data"]["bos_id"] == 0
        assert manifest["bos"]["position0_tokens"] == [{"id": 0, "text": "<bos>", "sequences": 4}]


def test_token_file_without_a_bos_column_is_refused_for_bos_options(model: Path, tmp_path: Path) -> None:
    tokens = _token_file(tmp_path / "tokens.npy", first_column=None)
    out = tmp_path / "run"
    base = ["intervene", str(model), "--tokens", str(tokens), "--out", str(out)]
    assert_one_line_error(run_main(*base, "--replace-bos", "mean"), "--replace-bos", "first column")
    assert_one_line_error(run_main(*base, "--bos", "on", "--window", "4"), "--bos on with --tokens")
    assert_one_line_error(run_main(*base, "--bos", "off"), "--bos off as an intervention", "first column")
    assert not out.exists()


def test_every_problem_is_reported_at_once(model: Path, corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    proc = run_main(
        *intervene_args(model, corpus, out),
        "--num-seqs=1", "--seq-len=300", "--grid=exact", "--early=1", "--bootstrap=-1", "--batch-size=0",
        "--ablate-sink-values=9.9", "--rope-scaling=ntk:0", "--replace-bos=purple", "--window=wide",
        "--patch-pos0=w5 w6", "--patch-layers=9",
    )  # fmt: skip
    lines = assert_error_lines(
        proc, "is a file", "too few", "--batch-size 0", "--early 1", "--bootstrap -1 is out of range", "--grid exact",
        "9.9", "ntk:0", "purple", "--window 'wide'", "2 tokens", "[9]",
    )  # fmt: skip
    assert len(lines) == 12
    assert out.read_text() == "mine"


def test_a_bad_load_time_intervention_hides_no_other_problem(model: Path, corpus: Path, tmp_path: Path) -> None:
    """`analyze` loads its model once, with its RoPE scaling; where that scaling cannot apply (here: its syntax),
    the model as it is still answers the checks that need it (heads it does not have), all at once."""
    proc = run_main(*analyze_args(model, corpus, tmp_path / "run", "--rope-scaling=ntk:x", "--kv0-heads=99.1",
                                  "--patch-kv0=the"))  # fmt: skip
    lines = assert_error_lines(proc, "ntk:x", "99.1")
    assert len(lines) == 2 and not (tmp_path / "run").exists()


def test_other_commands_check_their_output_folder_first(model: Path, tmp_path: Path) -> None:
    """train, lab, sweep, compare and paper refuse an --out they could not write, before any work."""
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    spec = tmp_path / "sweep.yaml"
    spec.write_text("grid: {pe: [rope, nope]}\n")
    commands = [
        ["train", "--steps", "2", "--seq-len", "16"],
        ["lab", "--steps", "2", "--seq-len", "16"],
        ["sweep", str(spec)],
        ["paper"],
    ]
    for command in commands:
        assert_one_line_error(run_main(*command, "--out", str(blocker)), f"--out {blocker} is a file")
    missing = tmp_path / "no-such-run"
    lines = assert_error_lines(run_main("compare", str(missing), "--labels", "a", "b", "--out", str(blocker)))
    assert len(lines) == 3  # the run, the labels, the output folder
    assert not missing.exists()  # reading a run never creates its folder


def test_train_reports_every_bad_option_at_once(tmp_path: Path) -> None:
    proc = run_main("train", "--steps", "0", "--lr", "-1", "--attention", "window:x", "--rope-scaling", "ntk:0",
                    "--out", str(tmp_path / "run"))  # fmt: skip
    lines = assert_error_lines(proc, "steps must be at least 1", "lr -1.0", "unknown attention", "'ntk:0'")
    assert len(lines) == 4 and not (tmp_path / "run").exists()


def test_sweep_spec_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(": : :\n")
    assert_one_line_error(run_main("sweep", str(spec), "--out", str(tmp_path / "run")), "is not valid YAML")


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc, where nothing can be created")
def test_output_folder_the_system_will_not_create(model: Path, corpus: Path) -> None:
    """/proc looks writable to root, yet refuses new folders: the first write says so in one line."""
    assert_one_line_error(run_main(*analyze_args(model, corpus, Path("/proc/posleak-run"))), "/proc/posleak-run")


# ----------------------------------------------------------------------------------- partial folders and the lock


def test_unfinished_run_is_marked_and_refused_by_compare(tmp_path: Path) -> None:
    RunFolder(tmp_path / "run").begin({"model": "x"})
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "partial" and "rerun" in manifest["note"]
    proc = run_main("compare", str(tmp_path / "run"), "--out", str(tmp_path / "cmp"))
    assert_one_line_error(proc, "is an unfinished run")
    assert not (tmp_path / "cmp").exists()


def test_lock_names_its_holder_and_is_gone_after(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run")
    with folder.lock():
        holder = json.loads((folder.path / LOCK).read_text())
        assert holder["pid"] == os.getpid()
        held = f"another posleak process \\(pid {os.getpid()} on "
        with pytest.raises(PosleakError, match=held), folder.lock():
            pass
        with pytest.raises(PosleakError, match=held):  # the check before a run says so too, writing nothing
            folder.state({"model": "x"})
    assert not (folder.path / LOCK).exists()
    with folder.lock():  # and it can be taken again
        pass


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float = 300) -> None:
    """Poll `condition` every millisecond while `proc` runs."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.001)


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "posleak", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _holder(out: Path) -> dict[str, object] | None:
    try:
        return json.loads((out / LOCK).read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_second_writer_is_refused_naming_the_first(model: Path, corpus: Path, tmp_path: Path) -> None:
    """Two `posleak analyze` into one folder at once: the first, held still (SIGSTOP) while it holds the folder
    so that the two surely overlap, completes; the second refuses with one line naming it and writes nothing."""
    out = tmp_path / "run"
    args = analyze_args(model, corpus, out)
    first = _start(args)
    try:
        _wait_for(lambda: _holder(out) is not None, first, "the first run held the folder")
        first.send_signal(signal.SIGSTOP)
        before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
        second = run_cli(*args)
        assert_one_line_error(second, f"{out} is being written by another posleak process (pid {first.pid} on ")
        assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr.decode()
    assert RunFolder(out).is_complete and not (out / LOCK).exists()


# ----------------------------------------------------------------------------------- SIGKILL


def _any(folder: Path, pattern: str) -> Callable[[], bool]:
    return lambda: folder.exists() and any(folder.glob(pattern))


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_tables(model: Path, corpus: Path, tmp_path: Path) -> None:
    """SIGKILL mid-forward (after the first batch's captures), mid-measurement (after the first layer) and
    mid-write of the tables (while a table's temp file exists, or between tables), each on the rerun of the
    last: the last rerun ends with every table equal, bit for bit, to an uninterrupted run's."""
    options = ("--num-seqs", "12")  # six batches of two: the forward is still running after the first
    reference = tmp_path / "reference"
    assert subprocess.run([sys.executable, "-m", "posleak", *analyze_args(model, corpus, reference, *options)],
                          capture_output=True).returncode == 0  # fmt: skip
    out = tmp_path / "run"
    captures, partial = out / ".partial" / "captures", out / ".partial"
    stages = [
        ("mid-forward", _any(captures, "batch?????.safetensors")),
        ("mid-measurement", _any(partial, "layer*.pt")),
        ("mid-write of a table", lambda: _any(out, ".*.parquet.*.tmp")() or _any(out, "*.parquet")()),
    ]
    for stage, reached in stages:
        proc = _start(analyze_args(model, corpus, out, *options))
        _wait_for(reached, proc, stage)
        proc.kill()
        proc.wait()
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "partial", f"killed {stage}, the folder must say it is unfinished"
        assert (out / LOCK).exists()  # left behind by the dead process; the rerun takes it over
    assert len(list(captures.glob("batch?????.safetensors"))) == 6  # the forwards of the second run finished them
    assert run_cli(*analyze_args(model, corpus, out, *options)).returncode == 0
    assert_same_tables(out, reference)
    assert not (out / LOCK).exists() and not partial.exists()
    assert not [path for path in out.rglob("*") if path.name.endswith(".tmp")]


# ----------------------------------------------------------------------------------- a full disk


def _full_at(call: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.fsync fails with ENOSPC on its `call`-th call: every write of a run folder syncs once before its rename."""
    calls = {"n": 0}
    real = os.fsync

    def fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == call:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.fixture(scope="module")
def reference_run(model: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    assert run_main(*analyze_args(model, corpus, out)).returncode == 0
    return out


def _assert_disk_full_error(proc: subprocess.CompletedProcess[str], what: str) -> None:
    errors = [line for line in proc.stderr.splitlines() if line.startswith(ERROR)]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    assert "disk full while writing" in errors[0] and what in errors[0] and "rerun the same command" in errors[0]


@pytest.mark.parametrize(("call", "what"), [(3, "batch00001.safetensors"), (8, "per_layer.parquet")])
def test_simulated_full_disk_is_one_line_and_resumes(
    model: Path, corpus: Path, reference_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: int,
    what: str,
) -> None:  # fmt: skip
    """ENOSPC at the writer of a capture (the 3rd sync: the manifest, batch 0's closing file, batch 1's; layer
    files are not synced) or of a table (the 8th: then 3 measured layers, per_head, per_layer): one error line,
    then a rerun with space completes."""
    out = tmp_path / "run"
    _full_at(call, monkeypatch)
    _assert_disk_full_error(run_main(*analyze_args(model, corpus, out)), what)
    monkeypatch.undo()
    assert RunFolder(out).read_manifest()["status"] == "partial"
    assert run_main(*analyze_args(model, corpus, out)).returncode == 0
    assert_same_tables(out, reference_run)


@contextmanager
def _small_disk(folder: Path, size: str) -> Iterator[Callable[[str], None]]:
    """A tmpfs of `size` mounted on `folder` for the block (skips the test where mounting is not allowed; root
    in a container may); yields a function that grows it to a new size."""
    folder.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
        )
    except FileNotFoundError:
        mounted = None
    if mounted is None or mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the simulated ENOSPC test covers the writers")

    def grow(new_size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(folder)], check=True)

    try:
        yield grow
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize(("size", "what"), [("64k", ".partial/captures/batch"), ("512k", "")])
def test_full_file_system_is_one_line_and_resumes(
    model: Path, corpus: Path, reference_run: Path, tmp_path: Path, size: str, what: str
) -> None:
    """A real, small file system: it fills up while the captures are written (64 KiB) or the tables and
    figures (512 KiB); once it is grown, the same command resumes to the same tables."""
    with _small_disk(tmp_path / "disk", size) as grow:
        out = tmp_path / "disk" / "run"
        proc = run_main(*analyze_args(model, corpus, out))
        _assert_disk_full_error(proc, what)
        assert (".partial" in proc.stderr) == bool(what)  # the captures, or what is written after them
        assert not (out / LOCK).exists()
        grow("8m")
        assert run_main(*analyze_args(model, corpus, out)).returncode == 0
        assert_same_tables(out, reference_run)


def test_full_file_system_while_training_is_one_line(tmp_path: Path) -> None:
    """The lab trainer's checkpoint (safetensors, which wraps the OS error in its own type) on a full disk."""
    with _small_disk(tmp_path / "disk", "64k") as grow:
        args = ("train", "--steps", "2", "--seq-len", "16", "--out", str(tmp_path / "disk" / "model"))
        proc = run_main(*args)
        errors = [line for line in proc.stderr.splitlines() if line.startswith(ERROR)]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(errors) == 1 and "disk full" in errors[0] and "rerun the same command" in errors[0]
        grow("64m")
        assert run_main(*args).returncode == 0


# ----------------------------------------------------------------------------------- property-based

QUICK = settings(
    max_examples=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _texts(*examples: str) -> st.SearchStrategy[str]:
    """The listed values, and short arbitrary strings (no NUL: a command line cannot hold one)."""
    return st.one_of(st.sampled_from(examples), st.text(st.characters(exclude_characters="\x00"), max_size=8))


OPTIONS: dict[str, st.SearchStrategy[object]] = {
    "--seq-len": st.one_of(st.integers(2, 40), st.sampled_from([-1, 0, 1, 257, 513, 10**6])),
    "--num-seqs": st.one_of(st.integers(2, 5), st.integers(-1, 1), st.just(10**4)),
    "--batch-size": st.integers(-1, 5),
    "--bootstrap": st.one_of(st.integers(-2, 30), st.just(10**9)),
    "--early": st.integers(-1, 50),
    "--seed": st.one_of(st.integers(0, 9), st.sampled_from([-1, 2**32, 2**70])),
    "--grid": st.sampled_from(["coarse", "exact", "fine"]),
    "--bos": st.sampled_from(["auto", "on", "off", "maybe"]),
    "--replace-bos": _texts("mean", "zero", "random", "token:w7", "token:w7 w8", "purple"),
    "--patch-pos0": _texts("w9", "id:5", "id:95", "id:96", "id:-1", "id:x", "w9 w10"),
    "--patch-layers": _texts("all", "0..3", "1", "4", "2..1", "1,3"),
    "--ablate-sink-values": _texts("auto", "0.1", "2.3", "3.0", "0.4", "99.99", "-1.0", "0.1,2.2", "a.b"),
    "--ablate-mode": st.sampled_from(["zero", "mean", "max"]),
    "--patch-kv0": _texts("w9", "id:5", "id:96", "w9 w10"),
    "--kv0-heads": _texts("auto", "0.1", "2.3,1.0", "3.0", "a.b"),
    "--hold-sink-clock": _texts("auto", "0.1", "2.3,1.0", "3.0", "a.b"),
    "--remove-sink-reads": _texts("auto", "0.1", "2.3,1.0", "3.0", "a.b"),
    "--rope-scaling": _texts("ntk:2", "ntk:0", "linear:1.5", "dynamic:2", "yarn:2", "foo:2", "ntk:inf", "ntk:1e300"),
    "--window": _texts("global", "1", "4", "0", "-2", "wide", "99999999999999999999"),
}

INTERVENTIONS = [
    "--replace-bos",
    "--patch-pos0",
    "--ablate-sink-values",
    "--patch-kv0",
    "--hold-sink-clock",
    "--remove-sink-reads",
    "--rope-scaling",
    "--window",
]


@st.composite
def command_lines(draw: st.DrawFn, models: tuple[Path, Path], corpus: Path, out: Path) -> list[str]:
    """`analyze` or `intervene` on one of the tiny models with a few options drawn from OPTIONS."""
    command = draw(st.sampled_from(["analyze", "intervene"]))
    args = [command, str(draw(st.sampled_from(models))), "--corpus", str(corpus), "--out", str(out)]
    names = draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=4, unique=True))
    if command == "intervene":  # one intervention at least, or every line is the same refusal
        names = list(dict.fromkeys([draw(st.sampled_from(INTERVENTIONS)), *names]))
    for name in names:
        args.append(f"{name}={draw(OPTIONS[name])}")
    for name, default in (("--seq-len", "24"), ("--num-seqs", "3"), ("--bootstrap", "5")):
        if not any(arg.startswith(f"{name}=") for arg in args):
            args += [name, default]  # small, so that the lines that run take a second
    return args


def _runs_or_refuses(proc: subprocess.CompletedProcess[str], out: Path) -> None:
    """Either a complete run folder, or exit 2 with only `posleak: error:` lines and nothing written."""
    if proc.returncode == 0:
        assert RunFolder(out).is_complete and not (out / LOCK).exists(), proc.stderr
    else:
        assert_error_lines(proc)
        assert not out.exists(), proc.stderr


def test_command_lines_run_or_refuse(model: Path, no_bos_model: Path, corpus: Path, tmp_path: Path) -> None:
    """Generated option values, in this process: each command line runs to a complete folder, or ends in exit 2
    with one `posleak: error:` line per problem, no traceback and no file."""

    @QUICK
    @given(st.data())
    def check(data: st.DataObject) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
            out = Path(scratch) / "run"
            _runs_or_refuses(run_main(*data.draw(command_lines((model, no_bos_model), corpus, out))), out)

    check()


@pytest.mark.slow
def test_command_lines_run_or_refuse_in_a_fresh_interpreter(model: Path, corpus: Path, tmp_path: Path) -> None:
    """The same property through `python -m posleak`, for a few generated command lines."""

    @settings(QUICK, max_examples=4)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
            out = Path(scratch) / "run"
            _runs_or_refuses(run_cli(*data.draw(command_lines((model, model), corpus, out))), out)

    check()


TOKEN_ARRAYS = st.one_of(
    hnp.arrays(
        st.sampled_from([np.int64, np.int32, np.int16]),
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=30),
        elements=st.integers(-2, 100),
    ),
    hnp.arrays(st.sampled_from([np.int64, np.float32, np.bool_, np.uint64]), hnp.array_shapes(min_dims=0, max_dims=3)),
)


@QUICK
@given(array=TOKEN_ARRAYS, bos_column=st.booleans())
def test_token_files_load_or_refuse(array: np.ndarray, bos_column: bool) -> None:
    """Any array saved with numpy: a TokenBatch of exactly its ids, or a PosleakError of one line per problem."""
    if bos_column and array.ndim == 2 and array.size and np.issubdtype(array.dtype, np.integer):
        array[:, 0] = 0
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tokens.npy"
        np.save(path, array)
        try:
            batch = load_token_file(path, vocab_size=96, max_len=512, bos_id=0)
        except PosleakError as err:
            assert all(problem and "\n" not in problem for problem in err.problems)
            return
    assert np.array_equal(batch.ids.numpy(), array)
    assert (batch.bos_id == 0) == bool((array[:, 0] == 0).all())


@QUICK
@given(content=st.binary(max_size=200))
def test_token_files_of_any_bytes_load_or_refuse(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "tokens.npy"
        path.write_bytes(content)
        with pytest.raises(PosleakError):  # no .npy header, or none that names an N×T integer array in the vocabulary
            load_token_file(path, vocab_size=96)


def test_token_files_through_the_command_line(model: Path, tmp_path: Path) -> None:
    """`analyze --tokens FILE` on generated arrays: runs, or exit 2 with error lines only and nothing written."""

    shapes = hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=24)
    in_vocabulary = hnp.arrays(np.int64, shapes, elements=st.integers(0, 95))

    @settings(QUICK, max_examples=10)
    @given(st.one_of(in_vocabulary, hnp.arrays(np.int64, shapes, elements=st.integers(-1, 97))))
    def check(array: np.ndarray) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
            tokens, out = Path(scratch) / "tokens.npy", Path(scratch) / "run"
            np.save(tokens, array)
            proc = run_main("analyze", str(model), "--tokens", str(tokens), "--bootstrap", "5", "--out", str(out))
            _runs_or_refuses(proc, out)

    check()


CORPUS_FILES = st.one_of(
    st.tuples(st.just("corpus.txt"), st.text(max_size=300).map(str.encode)),
    st.tuples(st.just("corpus.txt"), st.binary(max_size=100)),
    st.tuples(
        st.just("corpus.jsonl"),
        st.lists(
            st.one_of(
                st.fixed_dictionaries({"text": st.text(max_size=80)}).map(json.dumps),
                st.fixed_dictionaries({"body": st.text(max_size=20)}).map(json.dumps),
                st.just('{"text": 3}'),
                st.text(max_size=20),
            ),
            max_size=6,
        ).map(lambda lines: "\n".join(lines).encode()),
    ),
)


@QUICK
@given(file=CORPUS_FILES, seq_len=st.integers(-1, 12), num_seqs=st.integers(-1, 4), bos=st.sampled_from(BOS_POLICIES))
def test_corpus_files_load_or_refuse(file: tuple[str, bytes], seq_len: int, num_seqs: int, bos: str) -> None:
    """Any text or JSON-lines file: sequences of exactly the asked shape, or a PosleakError of one line per problem."""
    name, content = file
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / name
        path.write_bytes(content)
        try:
            batch = make_sequences(load_corpus(str(path)), tiny_tokenizer(), seq_len, num_seqs, bos=bos)
        except PosleakError as err:
            assert all(problem and "\n" not in problem for problem in err.problems)
            return
    assert tuple(batch.ids.shape) == (num_seqs, seq_len)
    assert (batch.bos_id == 0) == (bos == "on")


# ------------------------------------------------------------------ devices, precision, device maps (posleak.device)

NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: --device cuda is not an error here"
)


@NO_CUDA
@pytest.mark.parametrize("command", ["analyze", "intervene", "inspect", "paper"])
def test_device_cuda_without_cuda_is_one_line_and_writes_nothing(
    command: str, model: Path, corpus: Path, tmp_path: Path
) -> None:
    """Each command that runs a model refuses --device cuda on a machine without CUDA, in one line naming the
    device and the fix, before loading anything; the output folder is not created."""
    out = tmp_path / "run"
    args = {
        "analyze": analyze_args(model, corpus, out, "--device", "cuda"),
        "intervene": intervene_args(model, corpus, out, "--replace-bos", "zero", "--device", "cuda"),
        "inspect": ["inspect", str(model), "--device", "cuda"],
        "paper": ["paper", "--out", str(out), "--device", "cuda", "--dtype", "float16"],
    }[command]
    assert_one_line_error(run_main(*args), "--device cuda", "no CUDA device", "--device cpu")
    assert not out.exists()


def test_device_map_with_a_model_that_does_not_fit_is_one_line(model: Path, corpus: Path, tmp_path: Path) -> None:
    """--device-map auto with less memory than the model needs: one line with the model's size and the room there
    is, before any weight is read or the folder is made; with room enough the same run completes on that map."""
    out = tmp_path / "run"
    proc = run_main(*analyze_args(model, corpus, out, "--device-map", "auto", "--max-memory", "cpu=20KB"))
    assert_one_line_error(proc, "--device-map auto", "needs", "cpu: 0.00 GiB", "--max-memory")
    assert not out.exists()
    proc = run_main(*analyze_args(model, corpus, out, "--device-map", "auto", "--max-memory", "cpu=1GiB"))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["placement"]["requested"]["device_map"] == "auto"


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        (("--max-memory", "cpu=1GiB"), ("--max-memory", "add --device-map auto")),
        (("--device-map", "auto", "--max-memory", "cpu:1G"), ("is not DEVICE=SIZE",)),
        (("--device-map", "auto", "--device", "cpu"), ("drop --device cpu",)),
    ],
)
def test_placement_options_that_contradict_each_other_are_refused(
    options: tuple[str, ...], needles: tuple[str, ...], model: Path, corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert_error_lines(run_main(*analyze_args(model, corpus, out, *options)), *needles)
    assert not out.exists()
