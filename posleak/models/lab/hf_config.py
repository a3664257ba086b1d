"""`LabConfig`, the transformers config a `LabSpec` (`posleak.models.lab.config`) becomes: the sizes, the position
encoding, the mask and the normalisation of one lab decoder, with the fields derived from them.

It subclasses transformers' `PretrainedConfig`, so it lives apart from the option names of
`posleak.models.lab.config`, which the command line reads without importing transformers or torch.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from posleak.errors import PosleakError
from posleak.models.lab.config import (
    NORMS,
    PE_KINDS,
    ROPE_SCALINGS,
    SIGMOID_BIAS_INIT,
    SIZES,
    LabSpec,
    check_choice,
    parse_attention,
    parse_rope_scaling,
)


class LabConfig(PretrainedConfig):
    """A posleak lab decoder: pre-norm blocks (RMSNorm → attention, RMSNorm → GELU MLP), an untied output layer.

    Initialisation: `initializer_range` None (the default) keeps torch's own initialisation of the linear layers
    (U(±1/√fan_in)) and embeddings (N(0, 1)), with an output layer of its own. A number is transformers' N(0, σ)
    everywhere (the lab's scheme before 2026-12-02, with tied embeddings; models saved then carry 0.02 and load
    as they were). Why the change: at the lab's widths (64–256) σ = 0.02 is 3–6 times below 1/√fan_in, and with
    it, or with tied embeddings, the tiny decoder never left the plateau of the recall task (answer loss at the
    log of the values in the row: it attends to every value alike) within 3000 steps; with both changed a
    learned-position model learns recall in 700–950 steps (docs/method.md §12).
    """

    model_type = "posleak_lab"

    vocab_size: int = 512
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    pe: str = "rope"
    rope_base: float = 10000.0
    rope_scale_kind: str = "none"
    rope_factor: float = 1.0
    rotary_fraction: float = 1.0
    attention: str = "causal"
    norm: str = "softmax"
    bos: bool = True
    size: str | None = None
    rms_norm_eps: float = 1e-6
    initializer_range: float | None = None  # None: torch's initialisation (docstring)
    sigmoid_bias_init: float = SIGMOID_BIAS_INIT
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    # Derived in __post_init__ (kept as fields so that tools reading a config.json see them).
    head_dim: int | None = None
    num_key_value_heads: int | None = None
    sliding_window: int | None = None
    prefix_length: int = 0

    def __post_init__(self, **kwargs: Any) -> None:
        check_choice("pe", self.pe, PE_KINDS)
        check_choice("norm", self.norm, NORMS)
        check_choice("rope scaling", self.rope_scale_kind, ROPE_SCALINGS)
        if self.hidden_size % self.num_attention_heads:
            raise PosleakError(
                f"hidden size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads; change either"
            )
        self.head_dim = self.hidden_size // self.num_attention_heads
        self.num_key_value_heads = self.num_attention_heads
        self.sliding_window, self.prefix_length = parse_attention(self.attention)
        if self.pe == "rope" and self.rotary_dim < 2:
            raise PosleakError(f"rotary fraction {self.rotary_fraction} rotates no dimension pair; use at least 2/D")
        super().__post_init__(**kwargs)

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that RoPE rotates (an even number)."""
        return 2 * int(self.head_dim * self.rotary_fraction / 2)

    @property
    def rope_theta(self) -> float:
        """The base RoPE actually uses: NTK-aware scaling raises it to θ·k^(D/(D−2)), D the rotary dimension."""
        if self.rope_scale_kind == "ntk":
            dim = self.rotary_dim
            return self.rope_base * self.rope_factor ** (dim / (dim - 2)) if dim > 2 else self.rope_base
        return self.rope_base

    @property
    def rope_position_scale(self) -> float:
        """Linear interpolation divides positions by the factor; other kinds leave them."""
        return 1.0 / self.rope_factor if self.rope_scale_kind == "linear" else 1.0

    @classmethod
    def from_spec(
        cls, spec: LabSpec, vocab_size: int, max_positions: int, bos_id: int | None, eos_id: int | None
    ) -> LabConfig:
        """The model config for a tokenizer (vocabulary, special ids) and the longest length it must take."""
        hidden, layers, heads, mlp = SIZES[spec.size]
        kind, factor = parse_rope_scaling(spec.rope_scaling)
        return cls(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=mlp,
            max_position_embeddings=max_positions,
            pe=spec.pe,
            rope_base=spec.rope_base,
            rope_scale_kind=kind,
            rope_factor=factor,
            rotary_fraction=spec.rotary_fraction,
            attention=spec.attention,
            norm=spec.norm,
            bos=spec.bos,
            size=spec.size,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
        )
