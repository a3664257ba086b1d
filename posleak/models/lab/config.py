"""The lab model's options: `LabSpec`, the options a user states, and the names they may take.

`LabConfig`, the transformers config a `LabSpec` becomes (`LabConfig.from_spec`), lives in
`posleak.models.lab.hf_config` (it subclasses transformers' `PretrainedConfig`); this module imports neither
transformers nor torch, nor that module, so that the command line can offer these choices instantly.

A lab model varies one factor at a time (docs/method.md §10):

- position encoding `pe`: ``rope`` (base `rope_base`, scaling ``none`` / ``ntk:K`` / ``linear:K``, the
  rotated share of each head `rotary_fraction`), ``nope``, ``alibi``, ``learned`` (absolute, a table of
  `max_position_embeddings` rows), ``sinusoidal`` (absolute, fixed);
- `attention`: ``causal``, ``window:W`` (query i sees keys with i − j < W) or ``prefix:P`` (the first P
  positions see each other bidirectionally);
- `norm`: ``softmax``, ``sink`` (softmax with a learned per-head sink logit, gpt-oss style) or
  ``sigmoid`` (each weight σ(s_ij), unnormalised, with a learned per-head logit bias);
- `bos`: whether position 0 of every training and evaluation row is the BOS token (a data-side policy,
  recorded here so that whoever analyses the model uses the policy it was trained under).

The output layer has weights of its own (untied from the token embedding), and the layers keep torch's
initialisation: with tied embeddings and transformers' N(0, 0.02) the tiny decoder did not learn the recall
task (posleak.models.lab.hf_config.LabConfig says what was measured). Neither changes where position enters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from posleak.errors import PosleakError
from posleak.validate import Problems, natural_number

PE_KINDS: tuple[str, ...] = ("rope", "nope", "alibi", "learned", "sinusoidal")
NORMS: tuple[str, ...] = ("softmax", "sink", "sigmoid")
ROPE_SCALINGS: tuple[str, ...] = ("none", "ntk", "linear")
# hidden size, blocks, heads, MLP width. tiny ≈ 0.2 M parameters with a 512-token vocabulary.
SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 3, 4, 256),
    "small": (128, 4, 4, 512),
    "base": (256, 6, 8, 1024),
    "deep": (64, 8, 4, 256),  # the tiny width at 8 blocks: depth trends (posleak paper, C4's lab line)
}
# The synthetic tasks of posleak.lab.tasks, and the default comparison of a task run (posleak.lab.choices):
# relative position, none, absolute. Here, so that the command line lists them without importing torch.
TASK_NAMES: tuple[str, ...] = ("index", "count", "copy", "recall", "reverse")
TASK_VARIANTS: tuple[str, ...] = ("rope", "nope", "learned")
TASK_SEEDS: tuple[int, ...] = (0, 1, 2)
# Sigmoid attention needs its logits centred well below 0 or every weight starts near 1/2 and the
# output grows with the number of keys: b = −log n (Ramapuram et al., arXiv 2409.04431), n = 128 here.
SIGMOID_BIAS_INIT = -math.log(128.0)
# The variants `posleak lab` compares (posleak.lab.variants turns each into a LabSpec); named here, beside
# the choices they vary, so that the command line lists them without importing the comparison.
VARIANTS: tuple[str, ...] = ("rope", "nope", "learned", "sinusoidal", "alibi", "rope-ntk", "window", "sink", "sigmoid")


def parse_attention(spec: str) -> tuple[int | None, int]:
    """``causal`` → (None, 0); ``window:W`` → (W, 0); ``prefix:P`` → (None, P)."""
    kind, _, value = spec.partition(":")
    if kind == "causal" and not value:
        return None, 0
    size = natural_number(value) if kind in ("window", "prefix") else None
    if size is not None and size >= 1:
        return (size, 0) if kind == "window" else (None, size)
    raise PosleakError(f"unknown attention '{spec}'; use causal, window:W or prefix:P (W, P positive integers)")


def parse_rope_scaling(spec: str) -> tuple[str, float]:
    """``none`` → ("none", 1); ``ntk:K`` / ``linear:K`` → (kind, K) with K ≥ 1."""
    kind, _, value = spec.partition(":")
    if kind == "none" and not value:
        return "none", 1.0
    if kind in ("ntk", "linear"):
        try:
            factor = float(value)
        except ValueError:
            factor = 0.0
        if factor >= 1.0:
            return kind, factor
    raise PosleakError(f"unknown RoPE scaling '{spec}'; use none, ntk:K or linear:K with a factor K ≥ 1")


def check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PosleakError(f"unknown {what} '{value}'; use one of {', '.join(choices)}")


@dataclass(frozen=True)
class LabSpec:
    """The options of one lab model, as a user states them (the `posleak train` flags, a sweep grid point)."""

    size: str = "tiny"
    pe: str = "rope"
    attention: str = "causal"
    norm: str = "softmax"
    bos: bool = True
    rope_base: float = 10000.0
    rope_scaling: str = "none"
    rotary_fraction: float = 1.0

    def __post_init__(self) -> None:
        problems = Problems()  # every bad option at once
        for check in (
            lambda: check_choice("size", self.size, tuple(SIZES)),
            lambda: check_choice("pe", self.pe, PE_KINDS),
            lambda: check_choice("norm", self.norm, NORMS),
            lambda: parse_attention(self.attention),
            lambda: parse_rope_scaling(self.rope_scaling),
        ):
            with problems.collecting():
                check()
        problems.raise_any()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
