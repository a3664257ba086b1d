"""Fixtures shared by every test file.

Ray: `ray_faults` starts a local cluster (2 CPUs) whose workers can be told to die (tests/ray_hooks.py).

`checkpoint`: a tiny Llama saved as a checkpoint folder, and a corpus of its words.

Built-in models: `zoo_model(name)` fetches a model into the default cache (idempotent: later
sessions only verify it) and loads it once per session; `smollm2` and `gemma3` are the two that
tests use. The loaded models are shared: leave their weights, config and attention as you found them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from tiny import tiny_model, tiny_tokenizer

from posleak.models.load import LoadedModel, load_model
from posleak.models.zoo import cache_root, fetch


@pytest.fixture(scope="session")
def zoo_model() -> Callable[[str], LoadedModel]:
    # Pinned when the session starts, so a test that points POSLEAK_CACHE elsewhere cannot redirect it.
    root = cache_root()
    loaded: dict[str, LoadedModel] = {}

    def get(name: str) -> LoadedModel:
        if name not in loaded:
            fetch(name, cache=root, progress=False)
            loaded[name] = load_model(name, cache=root)
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def smollm2(zoo_model: Callable[[str], LoadedModel]) -> LoadedModel:
    return zoo_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3(zoo_model: Callable[[str], LoadedModel]) -> LoadedModel:
    return zoo_model("gemma3-270m")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama checkpoint folder (tests/tiny.py; safetensors, word-level tokenizer with a BOS) and a corpus of
    its words."""
    root = tmp_path_factory.mktemp("intervene")
    folder = root / "tiny-llama"
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    corpus = root / "words.txt"
    corpus.write_text(" ".join(f"w{k}" for k in np.random.default_rng(0).integers(2, 96, 3000)))
    return folder, corpus


@pytest.fixture
def ray_faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local Ray cluster whose workers run tests/ray_hooks.py's fault injection; yields its plan folder."""
    ray = pytest.importorskip("ray")
    faults = tmp_path_factory.mktemp("faults")
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = {"POSLEAK_TEST_FAULTS": str(faults), "PYTHONPATH": path}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env, "worker_process_setup_hook": "ray_hooks.install"},
    )
    try:
        yield faults
    finally:
        ray.shutdown()
