"""Load any model posleak can analyse: a built-in name, a local checkpoint folder, or a hub id.

Every path ends the same way: an eval-mode transformers model in the placement's dtype on its device (or
spread over several by `--device-map auto`) switched to posleak's attention function, its tokenizer, the
hash of its weights, and its `ModelFacts`.
Weights load from safetensors or GGUF only, never from pickles, and a checkpoint's own Python code
runs only with `trust_remote_code=True`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from posleak.device import Placement
from posleak.errors import PosleakError
from posleak.models import zoo
from posleak.models.builtin import ZOO
from posleak.models.facts import ModelFacts
from posleak.models.lab.model import register_lab_model

_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a causal LM needs from a hub repository; never its pickles.
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


@dataclass
class LoadedModel:
    """A model ready for analysis, with what a result's provenance records about it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # the spec it was loaded from: a built-in name, a folder, or a hub id
    path: Path  # the folder holding its files
    file_hash: str  # SHA-256 of the weights file (of the sorted name/hash list when sharded)
    facts: ModelFacts
    source_hash: str | None = None  # SHA-256 of the GGUF the weights were converted from, if any
    overrides: dict[str, Any] = field(default_factory=dict)  # the config fields set as it loaded (RoPE scaling)


# Config fields to replace, or what computes them from the config as read (posleak's load-time interventions)
ConfigOverrides = dict[str, Any] | Callable[[Any], dict[str, Any]]


def load_model(
    spec: str,
    *,
    dtype: torch.dtype | None = None,
    trust_remote_code: bool = False,
    config_overrides: ConfigOverrides | None = None,
    cache: Path | str | None = None,
    placement: Placement | None = None,
) -> LoadedModel:
    """Load `spec`: a built-in name (already fetched), a local folder or .gguf file, or a hub id.

    `placement` says where and in what precision (default: float32 on the best device; its problems are
    the caller's to check, `Placement.problems`); `dtype`, where given, overrides its dtype. With
    `device_map="auto"` a model that does not fit the devices (and `max_memory`) is refused before any
    weight is read.

    `config_overrides` replaces config fields (whole values, no deep merge) before the model is
    built, e.g. {"rope_parameters": {...}} or {"sliding_window": 128}, or computes them from the (text) config
    as read (`Interventions.config_overrides`: the model loads once, with them); unknown fields are refused.
    `cache` is the zoo's cache root for built-in names (default: $POSLEAK_CACHE, ~/.cache/posleak).
    """
    source, gguf = model_files(spec, trust_remote_code, cache)
    folder = Path(source)
    if spec in ZOO:
        stamp = zoo.verify(spec, cache)  # hashes every file, so the stamp's hashes describe what loads
        file_hash, source_hash = stamp.weights_sha256, stamp.gguf_sha256
    else:
        file_hash = _weights_hash([folder / gguf] if gguf else sorted(folder.glob("*.safetensors")))
        source_hash = file_hash if gguf else None
    placement = placement or Placement()
    dtype = dtype or placement.torch_dtype()
    register_lab_model()  # so that the Auto classes read a lab checkpoint folder (model_type posleak_lab)
    model, tokenizer, overrides = _read(spec, folder, gguf, dtype, trust_remote_code, config_overrides, placement)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=spec,
        path=folder,
        file_hash=file_hash,
        facts=ModelFacts.read(model.config, tokenizer),
        source_hash=source_hash,
        overrides=overrides,
    )


def model_files(
    spec: str, trust_remote_code: bool, cache: Path | str | None = None, download: bool = True
) -> tuple[str, str | None]:
    """Where the files of `spec` are, as (source, the GGUF file's name or None): a built-in's cache folder, a
    local folder (or a .gguf file's), or a hub id's downloaded folder; with `download=False` a hub id that is no
    local path stays the hub id, from which transformers reads only the files it is asked for (a config)."""
    if spec in ZOO:
        return str(zoo.model_dir(spec, cache)), None
    if not download and HUB_ID.match(spec) and not Path(spec).expanduser().exists():
        return spec, None
    folder, gguf = resolve_folder(spec, trust_remote_code)
    return str(folder), gguf


def resolve_folder(spec: str, trust_remote_code: bool) -> tuple[Path, str | None]:
    """The folder holding a non-built-in model and, for GGUF, the file's name."""
    path = Path(spec).expanduser()
    if path.exists():
        return _locate(path)
    if HUB_ID.match(spec):
        return _locate(_download_hub(spec, trust_remote_code))
    raise PosleakError(
        f"no model {spec!r}: not a built-in name ({', '.join(ZOO)}), an existing folder, or a hub id (owner/name)"
    )


def _locate(path: Path) -> tuple[Path, str | None]:
    """The checkpoint folder and, for GGUF, the file's name; refuses pickles and ambiguous folders."""
    if path.is_file():
        if path.suffix != ".gguf":
            raise PosleakError(f"{path} is not a .gguf file; give a checkpoint folder (safetensors) or a .gguf file")
        return path.parent, path.name
    if any(path.glob("*.safetensors")):
        return path, None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0]
    if ggufs:
        raise PosleakError(f"{path} holds {len(ggufs)} .gguf files ({', '.join(ggufs)}); give the path of one of them")
    if any(p.suffix in _PICKLES for p in path.iterdir()):
        raise PosleakError(
            f"{path} holds only pickled weights, which can run arbitrary code; posleak loads safetensors or "
            "GGUF only: convert it with `model.save_pretrained(folder, safe_serialization=True)` in a trusted session"
        )
    raise PosleakError(f"{path} holds no model weights (*.safetensors or one *.gguf)")


def _read(
    name: str,
    folder: Path,
    gguf: str | None,
    dtype: torch.dtype,
    trust_remote_code: bool,
    overrides: ConfigOverrides | None,
    placement: Placement,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """Build the model (eval mode, posleak's attention, on its device) and its tokenizer, with the config fields
    `overrides` set; load failures become one line."""
    from posleak.capture.attention import use_posleak_attention

    try:
        if gguf is not None and placement.device_map is not None:
            raise PosleakError(
                f"--device-map needs a safetensors checkpoint; {name} is a GGUF file: convert it "
                "(posleak fetch does for the built-in models) or drop --device-map"
            )
        if gguf is None:
            as_read = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        else:
            as_read = AutoConfig.from_pretrained(folder, gguf_file=gguf)
        config, fields = _configure(as_read, overrides)
        if gguf is None:
            model, tokenizer = _read_safetensors(name, folder, config, dtype, trust_remote_code, placement)
        else:
            model, tokenizer = zoo.read_gguf(folder / gguf, dtype, config)
    except (OSError, ValueError, SafetensorError) as err:
        raise load_error(name, err) from None
    if placement.device_map is None:
        model = model.to(placement.torch_device())
    use_posleak_attention(model.eval())
    return model, tokenizer, fields


def _read_safetensors(
    name: str,
    folder: Path,
    config: Any,
    dtype: torch.dtype,
    trust_remote_code: bool,
    placement: Placement,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    device_map = None
    if placement.device_map is not None:
        device_map = _device_map(name, config, dtype, placement, trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        config=config,
        dtype=dtype,
        use_safetensors=True,
        trust_remote_code=trust_remote_code,
        device_map=device_map,
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    return model, tokenizer


def _device_map(
    name: str, config: Any, dtype: torch.dtype, placement: Placement, trust_remote_code: bool
) -> dict[str, int | str]:
    """Where accelerate puts each layer within the devices' memory (`max_memory`, else what each device has),
    from a model built without weights; refuses a model that would spill to disk (posleak's captures and
    forwards would crawl, and a run would hold the disk twice)."""
    from accelerate import infer_auto_device_map, init_empty_weights
    from accelerate.utils import compute_module_sizes, get_max_memory

    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    empty.tie_weights()  # tied embeddings count once
    limits = get_max_memory(placement.memory_limits())
    mapping = infer_auto_device_map(
        empty, max_memory=limits, no_split_module_classes=empty._no_split_modules or [], dtype=dtype
    )
    if any(where == "disk" for where in mapping.values()):
        size = compute_module_sizes(empty, dtype=dtype)[""]
        room = ", ".join(f"{device}: {_gib(limit)}" for device, limit in limits.items())
        raise PosleakError(
            f"--device-map auto: {name} needs {_gib(size)} in {str(dtype).removeprefix('torch.')} but the devices "
            f"hold {room}; raise --max-memory, add devices, or use a smaller --dtype"
        )
    return mapping


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _configure(config: Any, overrides: ConfigOverrides | None) -> tuple[Any, dict[str, Any]]:
    """The config with `overrides` (given, or computed from the config as read) applied to it (to the text config
    of a multimodal one), and the fields set."""
    target = config.get_text_config(decoder=True)
    fields = overrides(target) if callable(overrides) else overrides or {}
    for key, value in fields.items():
        if not hasattr(target, key):
            raise PosleakError(f"config_overrides: {type(target).__name__} has no field {key!r}")
        setattr(target, key, value)
    return config, fields


def _download_hub(repo: str, trust_remote_code: bool) -> Path:
    """Snapshot the repository's configs, tokenizer and safetensors (and code only when trusted)."""
    from huggingface_hub import snapshot_download

    patterns = [*_HUB_FILES, "*.py"] if trust_remote_code else _HUB_FILES
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as err:  # the hub client raises many types (HTTP, offline, auth, not found)
        raise PosleakError(
            f"could not download {repo!r} from the Hugging Face hub ({_first_line(err)}); "
            "check the network or give a local folder"
        ) from None


def load_error(name: str, err: Exception) -> PosleakError:
    if "trust_remote_code" in str(err):
        return PosleakError(
            f"{name} needs its own Python code to build the model; posleak runs it only when asked "
            "(trust_remote_code=True, or --trust-remote-code)"
        )
    return PosleakError(f"could not load {name}: {_first_line(err)}")


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _weights_hash(files: list[Path]) -> str:
    """One file: its SHA-256. Shards: the SHA-256 of their 'name sha256' lines, sorted by name."""
    if len(files) == 1:
        return zoo.sha256_file(files[0])
    lines = "".join(f"{f.name} {zoo.sha256_file(f)}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()
