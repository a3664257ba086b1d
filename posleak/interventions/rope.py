"""RoPE scaling applied at load time (docs/method.md §9), as a new `rope_parameters` for the config.

Specs: `ntk:K` (NTK-aware base scaling θ' = θ·K^(D/(D−2)), D the rotary dimension; the kernel is
unchanged, only the base moves), `linear:K` (position interpolation), `dynamic:K` (dynamic NTK:
transformers rescales the base only for sequences longer than the original context, so it acts
only past `max_position_embeddings`), `yarn:K`. Models with one RoPE per layer type (Gemma 3) get
the scaling in every layer type.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from posleak.errors import PosleakError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ROPE_KINDS = ("ntk", "linear", "dynamic", "yarn")
# Far beyond any scaling in use (×4 to ×64); more extreme factors drive RoPE's angles to NaN in float32.
MAX_FACTOR = 1024


def parse_rope_scaling(spec: str) -> tuple[str, float]:
    kind, _, value = spec.partition(":")
    try:
        factor = float(value)
    except ValueError:
        factor = float("nan")
    if kind not in ROPE_KINDS or not 1 / MAX_FACTOR <= factor <= MAX_FACTOR:
        kinds = ", ".join(f"{k}:K" for k in ROPE_KINDS)
        raise PosleakError(f"bad --rope-scaling {spec!r}; use one of {kinds} with 1/{MAX_FACTOR} ≤ K ≤ {MAX_FACTOR}")
    return kind, factor


def rotary_dim(config: PretrainedConfig) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * getattr(config, "partial_rotary_factor", 1.0))


def scaled_rope_parameters(config: PretrainedConfig, spec: str) -> dict[str, Any]:
    """The config's `rope_parameters` with the scaling of `spec` applied (the config is not changed)."""
    kind, factor = parse_rope_scaling(spec)
    params = copy.deepcopy(config.rope_parameters)
    if not params:
        raise PosleakError(f"{config.model_type} has no RoPE to scale; drop --rope-scaling")
    per_type = params if "rope_theta" not in params else {None: params}
    for entry in per_type.values():
        _scale_entry(entry, kind, factor, rotary_dim(config), config.max_position_embeddings)
    return params


def _scale_entry(entry: dict[str, Any], kind: str, factor: float, dim: int, max_positions: int) -> None:
    if entry.get("rope_type", "default") != "default":
        raise PosleakError(f"the model already uses {entry['rope_type']} RoPE scaling; posleak scales only plain RoPE")
    if kind == "ntk":
        entry["rope_theta"] = float(entry["rope_theta"]) * factor ** (dim / (dim - 2))
        return
    entry["rope_type"] = kind
    entry["factor"] = factor
    if kind in ("dynamic", "yarn"):
        entry["original_max_position_embeddings"] = max_positions
