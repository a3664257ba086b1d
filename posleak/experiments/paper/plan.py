"""The reproduction's models and sizes, in one place: the role → model table, and each plan's per-role T and N.

A role is what a model stands for in the claims (the standard RoPE model, the sliding-window one, the one
trained with a large base, the one whose BOS C5 replaces); the claims name roles, never models, so that
changing a model here changes it everywhere. `ROLES` is the built-in set, the default; a plan's `roles`
(`posleak paper --models`, `--plan`: posleak.experiments.paper.models) may name any model for each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, get_args

from posleak.data.corpus import DEFAULT_CORPUS
from posleak.device import Placement

SAMPLES = ("A", "B")
SHOWN = "A"  # the sample whose figures, tables and numbers the report's text shows
RoleName = Literal["standard", "large-base", "sliding", "bos"]
ROLE_NAMES: tuple[RoleName, ...] = get_args(RoleName)


@dataclass(frozen=True)
class Role:
    """One model of the reproduction: `folder` names its baseline run folder under OUT/runs/ (before the sample),
    `key` its entry in the manifest's runs, `label` how the claims' evidence names it."""

    model: str
    folder: str
    key: str
    label: str

    @property
    def name(self) -> str:
        """How the texts name the model: the last part of its spec (a folder's or a hub id's name), made safe for
        a folder name; a built-in's own name. Resolved first, so that `.` or `../ckpt/` name their folder."""
        from posleak.experiments.batch import safe_name  # here: batch imports pandas, which `paper --help` needs not

        return safe_name(Path(self.model).expanduser().resolve().name) or "model"


ROLES: dict[RoleName, Role] = {
    # standard RoPE (θ = 1e5); also the model of the NTK-scaled runs of C4
    "standard": Role("smollm2-135m", "smollm2-135m", "smollm2", "smollm2-135m"),
    # RoPE trained with θ = 1e6
    "large-base": Role("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b", "qwen", "qwen2.5-coder-0.5b"),
    # 5 sliding layers of W = 512 to one global; its sequences are longer than the window
    "sliding": Role("gemma3-270m", "gemma3-270m", "gemma", "gemma3-270m (T > window)"),
    # C5's BOS replacements and their baseline: early queries only, so no need for T > window
    "bos": Role("gemma3-270m", "gemma3-270m-bos", "gemma-bos", "gemma3-270m"),
}


def role_for(role: RoleName, model: str) -> Role:
    """The model `model` in `role`: the built-in entry where it is that role's built-in model (so that its run
    folders keep their names), else one named after the spec's last part (a folder's or a hub id's name), its
    manifest key the role's name."""
    if model == ROLES[role].model:
        return ROLES[role]
    name = Role(model, "", role, "").name
    folder = f"{name}-bos" if role == "bos" else name
    label = f"{name} (T > window)" if role == "sliding" else name
    return Role(model, folder, role, label)


@dataclass(frozen=True)
class LabBudget:
    """What the lab line (C4's controlled line, judged once over its seeds) may spend: training steps of each lab
    model, its T, its seeds and the sequences each analysis of a lab model reads."""

    steps: int
    seq_len: int
    seeds: tuple[int, ...]
    analyze_seqs: int
    file_keys: ClassVar[Mapping[str, str]] = {
        "lab_steps": "steps",
        "lab_seq_len": "seq_len",
        "lab_seeds": "seeds",
        "lab_analyze_seqs": "analyze_seqs",
    }


Options = TypeVar("Options")


@dataclass(frozen=True)
class Plan:
    """Sizes of one reproduction, per sample (two samples that share no document): per role, its model (`roles`)
    and its T and N (`sizes`), the corpora, the resamples, the lab's budget, where the analyses run, and one options
    object per claim that has options, each a dataclass of that claim's package (`options`, `option`). What each
    plan takes on 2 cores is measured in docs/performance.md.

    A plan file's `base` keys (posleak.experiments.paper.models) name this class's fields in `file_keys`, the lab
    budget's in `LabBudget.file_keys` and each claim's options' in its class's `file_keys`."""

    name: str
    # per role, T and N per sample; the bos role's follow the standard one's unless given (C5 reads early queries
    # only, so T need not exceed a window); the sliding role's T is longer than its model's window (gemma3-270m's
    # 512), so that the window acts
    sizes: Mapping[RoleName, tuple[int, int]]
    bootstrap: int
    lab: LabBudget
    # T at which every claim chooses sink heads (α₀ > 0.3), on the selection sample, whatever T the runs judge at:
    # α₀ is a mean over queries and falls as T grows (smollm2-135m: 219 of 270 heads at T = 32, 128–145 at 256),
    # so a threshold at each run's own T moved which heads, and which layers, count
    sink_seq_len: int
    options: tuple[Any, ...] = ()  # one per claim that has options, of its own class (its package's options.py)
    batch_size: int = 4
    cross_documents: bool = False
    provisional: bool = False  # small samples: the report says its verdicts are provisional
    placement: Placement = field(default_factory=Placement)  # device and dtype of every analysis (posleak.device)
    roles: Mapping[RoleName, Role] = field(default_factory=lambda: dict(ROLES))  # the model of each role
    # The corpora every claim is judged on (`posleak paper --corpus`): each runs the whole reproduction once, the
    # lab line aside (posleak.experiments.paper.corpora); one corpus keeps the layout of a plain run.
    corpora: tuple[str, ...] = (DEFAULT_CORPUS,)
    file_keys: ClassVar[Mapping[str, str]] = {
        key: key for key in ("name", "bootstrap", "sink_seq_len", "batch_size", "cross_documents", "corpora")
    }

    @property
    def corpus(self) -> str:
        """The corpus the analyses draw their sequences from: the first (a plan of several runs once on each,
        with that one alone)."""
        return self.corpora[0]

    def size(self, role: RoleName) -> tuple[int, int]:
        """T and N (per sample) of the analyses of `role`; the bos role's are the standard one's unless given."""
        return self.sizes[role] if role in self.sizes else self.sizes["standard"]

    def option(self, kind: type[Options]) -> Options:
        """The options of the claim whose options class is `kind`."""
        for options in self.options:
            if isinstance(options, kind):
                return options
        raise ValueError(f"plan {self.name!r} has no {kind.__name__}")

    def to_dict(self) -> dict[str, Any]:
        """The plan as a manifest records it: every field, each claim's options under its class's name."""
        recorded = dataclasses.asdict(self)
        recorded["options"] = {type(options).__name__: dataclasses.asdict(options) for options in self.options}
        return recorded

    def with_option(self, kind: type, **changes: Any) -> Plan:
        """This plan with its options of class `kind` changed by `changes` (field names of that class)."""
        options = tuple(dataclasses.replace(o, **changes) if isinstance(o, kind) else o for o in self.options)
        return dataclasses.replace(self, options=options)
