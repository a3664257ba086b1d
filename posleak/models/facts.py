"""What posleak needs to know about a model, read from its config and tokenizer.

`ModelFacts` is the one place that interprets a transformers config: the per-layer attention type,
window and RoPE parameters (transformers 5 keeps these in `config.rope_parameters`, which Gemma 3
keys by layer type), and whether the tokenizer prepends BOS on its own (`posleak.data.bos`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from posleak.data.bos import tokenizer_prepends_bos

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"


@dataclass(frozen=True)
class ModelFacts:
    """Shapes, per-layer positional set-up and BOS behaviour of one model; per-layer tuples are by layer index."""

    architecture: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    vocab_size: int
    max_positions: int | None
    layer_types: tuple[str, ...]
    window: tuple[int | None, ...]  # None: the layer attends to every earlier key
    rope_theta: tuple[float | None, ...]  # None: the layer applies no RoPE
    rope_type: tuple[str | None, ...]  # "default", "linear", "dynamic", "yarn", ...
    rope_factor: tuple[float | None, ...]  # the scaling factor; None when unscaled
    rotary_dim: tuple[int | None, ...]  # dimensions of each head that RoPE rotates
    auto_bos: bool
    bos_token: str | None
    bos_token_id: int | None

    @classmethod
    def read(cls, config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase) -> ModelFacts:
        bos_id = tokenizer.bos_token_id
        return replace(
            cls.from_config(config),
            auto_bos=tokenizer_prepends_bos(tokenizer),
            bos_token=tokenizer.bos_token if bos_id is not None else None,
            bos_token_id=bos_id,
        )

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> ModelFacts:
        """The facts a config gives alone, without its tokenizer (the BOS facts stay unknown: no BOS)."""
        text = config.get_text_config(decoder=True)
        heads = text.num_attention_heads
        dims = head_dims(text)
        layer_types, window = _attention_layout(text)
        rope = [_rope_for(text, kind) for kind in layer_types]
        return cls(
            architecture=text.model_type,
            layers=text.num_hidden_layers,
            heads=heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=max(dims),
            hidden=text.hidden_size,
            vocab_size=text.vocab_size,
            max_positions=getattr(text, "max_position_embeddings", None),
            layer_types=layer_types,
            window=window,
            rope_theta=tuple(_float_or_none(p.get("rope_theta")) for p in rope),
            rope_type=tuple(p.get("rope_type", "default") if p else None for p in rope),
            rope_factor=tuple(_float_or_none(p.get("factor")) for p in rope),
            rotary_dim=tuple(
                int(dim * p.get("partial_rotary_factor", 1.0)) if p else None for dim, p in zip(dims, rope, strict=True)
            ),
            auto_bos=False,
            bos_token=None,
            bos_token_id=None,
        )

    @property
    def sliding_window(self) -> int | None:
        """The width of the sliding layers; None when every layer is global."""
        return _widest(self.window)

    def rope_theta_by_type(self) -> dict[str, float | None]:
        """RoPE base per layer type, e.g. {"sliding_attention": 1e4, "full_attention": 1e6}."""
        return dict(zip(self.layer_types, self.rope_theta, strict=True))

    def summary(self) -> dict[str, Any]:
        """The facts the zoo registry states for each built-in model (`ExpectedFacts.to_dict`)."""
        return {
            "architecture": self.architecture,
            "layers": self.layers,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "rope_theta": self.rope_theta_by_type(),
            "sliding_window": self.sliding_window,
            "auto_bos": self.auto_bos,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples become lists."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def head_dims(config: PretrainedConfig) -> tuple[int, ...]:
    """Each layer's head size (a text config's): read layer by layer where the config sets it per layer (Gemma 4's
    global layers have wider heads than its sliding ones, and transformers refuses to read one global value)."""
    if "head_dim" in (getattr(config, "per_layer_attributes", None) or ()):
        return tuple(config.per_layer_config[layer].head_dim for layer in range(config.num_hidden_layers))
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (dim,) * config.num_hidden_layers


def _widest(window: tuple[int | None, ...]) -> int | None:
    widths = {w for w in window if w is not None}
    return max(widths) if widths else None


def attention_chunk(config: PretrainedConfig) -> int | None:
    """The width of a chunked-attention layer's chunks (Llama 4: queries see only keys of their own chunk of
    `attention_chunk_size` positions); None when no layer is chunked."""
    text = config.get_text_config(decoder=True)
    if CHUNKED not in (getattr(text, "layer_types", None) or []):
        return None
    return getattr(text, "attention_chunk_size", None)


def _attention_layout(config: PretrainedConfig) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """Per-layer type and window.

    Configs with `layer_types` (Gemma, Qwen2, GPT-OSS) window only their sliding layers; configs
    without it (Mistral) apply `sliding_window` to every layer, and Llama has no window at all.
    """
    width = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        kind = SLIDING if width is not None else FULL
        types = [kind] * config.num_hidden_layers
    window = tuple(width if kind == SLIDING else None for kind in types)
    return tuple(types), window


def _rope_for(config: PretrainedConfig, layer_type: str) -> dict[str, Any]:
    """This layer type's RoPE parameters: a per-type entry when there is one, else the shared dict."""
    params = getattr(config, "rope_parameters", None) or {}
    per_type = params.get(layer_type)
    return per_type if isinstance(per_type, dict) else params


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
