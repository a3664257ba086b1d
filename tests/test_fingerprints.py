"""Resume fingerprints: what a run's fingerprint covers of its options (`AnalyzeConfig.identity`, `Recipe.identity`,
`Interventions.to_dict`) is what the code before typed interventions wrote, so that run folders written by it still
resume; one rule leaves out the options added later while they are at their defaults (posleak.store.identity).

The expected values are literals written by that code (52ef8bd), and tests/fixtures/runs_before_typed_interventions
holds manifests of run folders it finished (smollm2-135m, T = 24, N = 2; their tables left out for size: a finished
folder is recognised, and read back, by its manifest)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli import file_stamps

from posleak.interventions import (
    AblateSinkValues,
    HoldSinkClock,
    Interventions,
    PatchKv0,
    PatchPos0,
    RemoveSinkReads,
    ReplaceBos,
    RopeScaling,
    Window,
)
from posleak.pipeline import AnalyzeConfig, finished_here
from posleak.store import COMPLETE, RunFolder, fingerprint
from posleak.store.identity import identity, left_out_at_default

FIXTURES = Path(__file__).parent / "fixtures" / "runs_before_typed_interventions"

# AnalyzeConfig().identity() as the code before typed interventions wrote it
DEFAULT_IDENTITY: dict[str, Any] = {
    "seq_len": 256,
    "num_seqs": 16,
    "bos": "auto",
    "corpus": "stdlib",
    "tokens": None,
    "cross_documents": False,
    "seed": 0,
    "grid": "coarse",
    "early": 32,
    "bootstrap": 200,
    "noise_correction": "pairs of sequences of distinct documents (docs/method.md §3)",
    "batch_size": 4,
    "device": "auto",
    "dtype": "float32",
    "device_map": None,
    "max_memory": None,
    "interventions": {},
}

# (config, what that code's identity had besides DEFAULT_IDENTITY's values): the options left out at their defaults
# (a null and its seed, a part, windows per document, beyond, scores), kept ones at their defaults (bos "auto", a
# null's seed 0) and every intervention's settings
IDENTITIES: dict[str, tuple[AnalyzeConfig, dict[str, Any]]] = {
    "default": (AnalyzeConfig(), {}),
    "null": (AnalyzeConfig(null="shuffle"), {"null": "shuffle", "null_seed": 0}),
    "null-seed": (AnalyzeConfig(null="shift", null_seed=9), {"null": "shift", "null_seed": 9}),
    "part": (AnalyzeConfig(part=(1, (2, 2, 1))), {"part": [1, [2, 2, 1]]}),
    "per-document-beyond-no-scores": (
        AnalyzeConfig(windows_per_document=1, beyond=64, scores=False, seed=4),
        {"seed": 4, "windows_per_document": 1, "beyond": 64, "scores": False},
    ),
    "bos-off-tokens-cross": (
        AnalyzeConfig(bos="off", tokens="ids.npy", cross_documents=True, corpus="bible-web"),
        {"bos": "off", "corpus": "bible-web", "tokens": "ids.npy", "cross_documents": True},
    ),
    "grid-early-batch": (
        AnalyzeConfig(grid="exact", early=8, bootstrap=0, batch_size=1, measure_budget="8GiB"),
        {"grid": "exact", "early": 8, "bootstrap": 0, "batch_size": 1},
    ),
    "placement": (AnalyzeConfig(device="cpu", dtype="bfloat16"), {"device": "cpu", "dtype": "bfloat16"}),
    "interventions-seed-only": (
        AnalyzeConfig(seed=5, interventions=Interventions.from_options(seed=5)),
        {"seed": 5, "interventions": {"seed": 5}},
    ),
    "replace-bos-mean": (
        AnalyzeConfig(interventions=Interventions(ReplaceBos("mean"))),
        {"interventions": {"replace_bos": "mean"}},
    ),
    "replace-bos-random": (
        AnalyzeConfig(seed=2, interventions=Interventions(ReplaceBos("random", seed=2))),
        {"seed": 2, "interventions": {"replace_bos": "random", "seed": 2}},
    ),
    "patch-pos0-layers": (
        AnalyzeConfig(interventions=Interventions(PatchPos0("id:42", layers="1..2"))),
        {"interventions": {"patch_pos0": "id:42", "patch_layers": "1..2"}},
    ),
    "patch-layers-alone": (
        AnalyzeConfig(interventions=Interventions.from_options(patch_layers="3")),
        {"interventions": {"patch_layers": "3"}},
    ),
    "ablate-mean": (
        AnalyzeConfig(interventions=Interventions(AblateSinkValues("auto", mode="mean"))),
        {"interventions": {"ablate_sink_values": "auto", "ablate_mode": "mean"}},
    ),
    "kv0": (
        AnalyzeConfig(interventions=Interventions(PatchKv0("id:5", heads="0.1"))),
        {"interventions": {"patch_kv0": "id:5", "kv0_heads": "0.1"}},
    ),
    "kv0-auto": (AnalyzeConfig(interventions=Interventions(PatchKv0("w3"))), {"interventions": {"patch_kv0": "w3"}}),
    "clock-reads-rope-window": (
        AnalyzeConfig(
            interventions=Interventions(
                Window("global"), RopeScaling("ntk:4"), RemoveSinkReads("1.2"), HoldSinkClock("auto")
            )
        ),
        {
            "interventions": {
                "hold_sink_clock": "auto",
                "remove_sink_reads": "1.2",
                "rope_scaling": "ntk:4",
                "window": "global",
            }
        },
    ),
}


def _as_json(value: Any) -> Any:
    """What a manifest records of `value` (tuples become lists)."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("name", list(IDENTITIES))
def test_identities_are_those_the_code_before_typed_interventions_wrote(name: str) -> None:
    config, changes = IDENTITIES[name]
    assert _as_json(config.identity()) == DEFAULT_IDENTITY | changes
    assert fingerprint(config.identity()) == fingerprint(DEFAULT_IDENTITY | changes)


def test_identity_keeps_the_order_of_the_options() -> None:
    """The manifest's arguments list the options in the order the code before wrote them (the fingerprint itself
    sorts them)."""
    config, _ = IDENTITIES["per-document-beyond-no-scores"]
    assert list(config.identity()) == [
        *("seq_len", "num_seqs", "bos", "corpus", "tokens", "cross_documents", "seed", "windows_per_document"),
        *("grid", "early", "bootstrap", "beyond", "scores", "noise_correction", "batch_size"),
        *("device", "dtype", "device_map", "max_memory", "interventions"),
    ]
    analysis = IDENTITIES["null"][0].analysis.identity()
    assert list(analysis) == [
        *("grid", "early", "bootstrap", "seed", "noise_correction", "batch_size"),
        *("device", "dtype", "device_map", "max_memory", "interventions"),
    ]


# what the manifest recorded of the interventions (`describe`, with and without the heads an `auto` chose) and
# what told a model loaded with them from another (`at_load`), as the code before typed interventions wrote them
HEADS = {0: (1, 2), 1: (), 3: (0,)}
CHOSEN = {"0": [1, 2], "3": [0]}
DESCRIBED: dict[str, dict[str, Any]] = {
    "interventions-seed-only": {},
    "patch-layers-alone": {},
    "replace-bos-mean": {"replace_bos": "mean"},
    "replace-bos-random": {"replace_bos": "random", "seed": 2},
    "patch-pos0-layers": {"patch_pos0": "id:42", "patch_layers": "1..2"},
    "ablate-mean": {"ablate_sink_values": "auto", "ablate_mode": "mean"},
    "kv0": {"patch_kv0": "id:5", "kv0_heads": "0.1"},
    "kv0-auto": {"patch_kv0": "w3", "kv0_heads": "auto"},
    "clock-reads-rope-window": {
        "hold_sink_clock": "auto",
        "remove_sink_reads": "1.2",
        "rope_scaling": "ntk:4",
        "window": "global",
    },
}
DESCRIBED_WITH_HEADS = DESCRIBED | {
    "ablate-mean": {"ablate_sink_values": "auto", "ablate_mode": "mean", "sink_heads_ablated": CHOSEN},
    "kv0-auto": {"patch_kv0": "w3", "kv0_heads": "auto", "sink_heads_kv0_patched": CHOSEN},
    "clock-reads-rope-window": {
        "hold_sink_clock": "auto",
        "sink_heads_clock_held": CHOSEN,
        "remove_sink_reads": "1.2",
        "rope_scaling": "ntk:4",
        "window": "global",
    },
}


@pytest.mark.parametrize("name", list(DESCRIBED))
def test_manifest_entries_are_those_the_code_before_typed_interventions_wrote(name: str) -> None:
    interventions = IDENTITIES[name][0].interventions
    assert interventions.describe() == DESCRIBED[name]
    assert list(interventions.describe(HEADS).items()) == list(DESCRIBED_WITH_HEADS[name].items())
    at_load = (("rope_scaling", "ntk:4"),) if name == "clock-reads-rope-window" else ()
    assert interventions.at_load() == at_load


@pytest.mark.parametrize("name", [name for name, (config, _) in IDENTITIES.items() if config.interventions.items])
def test_options_by_name_make_the_same_interventions_as_their_settings(name: str) -> None:
    """`from_options` reads the options by name as the command line and batch files give them: the interventions
    it makes equal the typed ones, hash alike, and give back the options they were made from."""
    interventions = IDENTITIES[name][0].interventions
    again = Interventions.from_options(**interventions.to_dict())
    assert again == interventions and hash(again) == hash(interventions)
    assert again.to_dict() == interventions.to_dict()


def test_interventions_are_held_in_the_registrys_order_once_each() -> None:
    given = Interventions(Window("8"), ReplaceBos("zero"))
    assert given.items == (ReplaceBos("zero"), Window("8"))
    assert given == Interventions(ReplaceBos("zero"), Window("8"))
    assert given.get(Window) == Window("8") and given.get(RopeScaling) is None
    assert Interventions(PatchPos0()) == Interventions()  # every setting at its default: nothing given
    with pytest.raises(TypeError, match="given twice"):
        Interventions(Window("8"), Window("16"))
    with pytest.raises(TypeError, match=r"unknown intervention option\(s\) \['windows'\]"):
        Interventions.from_options(windows="8")
    assert not hasattr(Interventions, "__getattr__")


# the size of those runs: smollm2-135m, T = 24, N = 2, no bootstrap
SMALL: dict[str, Any] = {"seq_len": 24, "num_seqs": 2, "batch_size": 2, "bootstrap": 0}

# (case, the config it was written with): the run folders' manifests in tests/fixtures
OLD_RUNS: dict[str, AnalyzeConfig] = {
    "null-part-ablate": AnalyzeConfig(
        **SMALL,
        null="shuffle",
        part=(0, (1, 1)),
        interventions=Interventions(AblateSinkValues("auto", mode="mean")),
    ),
    "replace-bos-random": AnalyzeConfig(
        **SMALL,
        seed=3,
        bos="on",
        interventions=Interventions(ReplaceBos("random", seed=3)),
    ),
    "rope-window": AnalyzeConfig(
        **SMALL,
        windows_per_document=1,
        beyond=8,
        scores=False,
        interventions=Interventions(RopeScaling("ntk:4"), Window("16")),
    ),
    "kv0-clock-seed": AnalyzeConfig(
        **SMALL,
        seed=5,
        bos="on",
        null="shift",
        null_seed=7,
        interventions=Interventions.from_options(patch_kv0="id:5", kv0_heads="0.1,2.3", hold_sink_clock="auto", seed=5),
    ),
}


@pytest.mark.parametrize("name", list(OLD_RUNS))
def test_a_run_folder_written_before_typed_interventions_resumes_as_finished(name: str, tmp_path: Path) -> None:
    """The folder is finished for the same config given now: `analyze` reads it back without loading the model
    (`finished_here`), and its stored fingerprint is the one the run's arguments now make, so the run folder
    claims it as complete (nothing is recomputed, nothing written)."""
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    before = file_stamps(folder)
    config = OLD_RUNS[name]
    run = RunFolder(folder)
    assert finished_here(run, "smollm2-135m", config)
    args = run.read_manifest()["args"]
    assert args["config"] == _as_json(config.identity())
    now = {**args, "config": config.identity()}
    assert run.read_manifest()["fingerprint"] == fingerprint(now)
    assert run.state(now) == COMPLETE
    assert file_stamps(folder) == before


@dataclasses.dataclass(frozen=True)
class _Options:
    """Options as a run's config holds them: one from the start, two added later (left out at their defaults)."""

    size: int = 4
    kind: str | None = left_out_at_default(None)
    kind_seed: int = left_out_at_default(0, follows="kind")


def test_options_added_later_are_left_out_at_their_defaults() -> None:
    assert identity(_Options()) == {"size": 4}  # what it was before the two existed
    assert identity(_Options(kind_seed=3)) == {"size": 4}  # a seed means nothing without its kind
    assert identity(_Options(kind="a")) == {"size": 4, "kind": "a", "kind_seed": 0}  # the seed kept beside its kind
    assert identity(_Options(size=5, kind="a", kind_seed=2)) == {"size": 5, "kind": "a", "kind_seed": 2}
