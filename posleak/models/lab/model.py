"""The lab decoder: a transformers `PreTrainedModel` whose only position sources are the configured ones.

Each block is pre-norm: h + Attn(RMSNorm(h)), then h + MLP(RMSNorm(h)). Nothing mixes tokens except
attention (no token shift, convolution or smear), so order reaches the model through the position
encoding, the mask and the normalisation alone.

Attention goes through transformers' `AttentionInterface` (default: posleak's function), with the
real post-RoPE q and k. Two things are folded into q and k so that every logit the function sees
is the true logit and the decomposition's bilinear path holds unchanged:

- ALiBi: q' = [q, slope·√D, −slope·√D·i], k' = [k, j, 1], so scale·q'·k' = scale·q·k − slope·(i − j);
- the sigmoid logit bias b_h: q' = [q, b_h·√D], k' = [k, 1].

Values are zero-padded to the width of q' (torch's CPU flash kernel wants one head size) and the
padding is cut from the output. Absolute encodings (learned, sinusoidal) are added to the token
embeddings at the input of block 0; the embedding module itself stays a plain `nn.Embedding`, so
`ResidualCapture`'s resid[0] is the token embedding alone and absolute position first shows in resid[1].

Importing this module registers the model with `AutoConfig` / `AutoModelForCausalLM`, so
`AutoModelForCausalLM.from_pretrained(folder)` loads a lab checkpoint without remote code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging as hf_logging

from posleak.capture.attention import use_posleak_attention
from posleak.errors import PosleakError
from posleak.models.lab.config import NORMS, PE_KINDS, ROPE_SCALINGS, SIGMOID_BIAS_INIT, check_choice, parse_attention

# transformers' own implementations ignore posleak_norm, posleak_prefix and s_aux: a lab model under
# them would silently compute something else.
_BUILTIN_IMPLEMENTATIONS = frozenset({"eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"})


class LabConfig(PretrainedConfig):
    """A posleak lab decoder: pre-norm blocks (RMSNorm → attention, RMSNorm → GELU MLP), tied embeddings."""

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
    initializer_range: float = 0.02
    sigmoid_bias_init: float = SIGMOID_BIAS_INIT
    tie_word_embeddings: bool = True
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


def _refuse_eager(*args: object, **kwargs: object) -> None:
    raise PosleakError("lab models have no eager attention; call posleak.capture.use_posleak_attention(model)")


class LabRMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def alibi_slopes(heads: int) -> torch.Tensor:
    """Press et al.'s head slopes: 2^(−8h/H) for H a power of two, interleaved otherwise."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if heads & (heads - 1) == 0:
        return torch.tensor(power_of_two(heads))
    low = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(low) + power_of_two(2 * low)[0::2][: heads - low])


def rope_tables(config: LabConfig, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (B, 1, T, rotary_dim), rotate-half layout, for (B, T) position ids."""
    dim = config.rotary_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = (position_ids.double() * config.rope_position_scale)[..., None] * inv_freq.to(position_ids.device)
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rotary_dim dimensions of each head (rotate-half pairing); pass the rest."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated * sin, rest], dim=-1)


def sinusoidal_embedding(position_ids: torch.Tensor, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Vaswani et al.'s fixed encoding, (B, T, hidden): sin on even, cos on odd dimensions."""
    freq = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float64) * (-math.log(10000.0) / hidden))
    angles = position_ids.double()[..., None] * freq.to(position_ids.device)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :hidden].to(dtype)


class LabAttention(nn.Module):
    """Multi-head attention; q and k carry every position term, so the attention function sees true logits."""

    def __init__(self, config: LabConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = True
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        heads = config.num_attention_heads
        self.sink = nn.Parameter(torch.zeros(heads)) if config.norm == "sink" else None
        sigmoid = config.norm == "sigmoid"
        self.logit_bias = nn.Parameter(torch.full((heads,), config.sigmoid_bias_init)) if sigmoid else None

    def forward(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        batch, seq_len, _ = hidden.shape
        qkv = self.qkv_proj(hidden).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
        if rope is not None:
            query, key = apply_rope(query, rope[0], rope[1]), apply_rope(key, rope[0], rope[1])
        query, key = self._fold_logit_terms(query, key, position_ids)
        if query.shape[-1] > self.head_dim:
            value = F.pad(value, (0, query.shape[-1] - self.head_dim))
        attend = self._attention_function()
        out, _ = attend(self, query, key, value, None, dropout=0.0, scaling=self.scaling, **self._mask_kwargs())
        out = out[..., : self.head_dim].reshape(batch, seq_len, -1)
        return self.o_proj(out)

    def _attention_function(self) -> Callable:
        implementation = self.config._attn_implementation
        if implementation in _BUILTIN_IMPLEMENTATIONS:
            raise PosleakError(
                f"lab models do not run under '{implementation}' attention (it ignores their mask and "
                "normalisation); call posleak.capture.use_posleak_attention(model)"
            )
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, _refuse_eager)

    def _mask_kwargs(self) -> dict[str, object]:
        config = self.config
        kwargs: dict[str, object] = {"posleak_norm": "sigmoid" if config.norm == "sigmoid" else "softmax"}
        if config.sliding_window is not None:
            kwargs["sliding_window"] = config.sliding_window
        if config.prefix_length:
            kwargs["posleak_prefix"] = config.prefix_length
        if self.sink is not None:
            kwargs["s_aux"] = self.sink
        return kwargs

    def _fold_logit_terms(
        self, query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the ALiBi and sigmoid-bias columns (module docstring); a no-op for other variants."""
        q_cols: list[torch.Tensor] = []
        k_cols: list[torch.Tensor] = []
        batch, heads, seq_len, _ = query.shape
        root = 1.0 / self.scaling
        if self.config.pe == "alibi":
            slope = alibi_slopes(heads).to(query)[None, :, None] * root  # (1, H, 1)
            pos = position_ids.to(query.dtype)[:, None, :]  # (B, 1, T)
            q_cols += [slope.expand(batch, heads, seq_len), -slope * pos]
            k_cols += [pos.expand(batch, heads, seq_len), torch.ones_like(pos).expand(batch, heads, seq_len)]
        if self.logit_bias is not None:
            q_cols.append((self.logit_bias.to(query) * root)[None, :, None].expand(batch, heads, seq_len))
            k_cols.append(query.new_ones(batch, heads, seq_len))
        if not q_cols:
            return query, key
        return torch.cat([query, torch.stack(q_cols, -1)], -1), torch.cat([key, torch.stack(k_cols, -1)], -1)


class LabMLP(nn.Module):
    def __init__(self, config: LabConfig) -> None:
        super().__init__()
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class LabBlock(nn.Module):
    def __init__(self, config: LabConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = LabRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LabAttention(config, layer_idx)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LabMLP(config)

    def forward(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), position_ids, rope)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LabPreTrainedModel(PreTrainedModel):
    config_class = LabConfig
    config: LabConfig
    base_model_prefix = "model"
    _no_split_modules: ClassVar[list[str]] = ["LabBlock"]
    _supports_attention_backend = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, LabAttention):
            if module.sink is not None:
                init.zeros_(module.sink)
            if module.logit_bias is not None:
                init.constant_(module.logit_bias, self.config.sigmoid_bias_init)


class LabModel(LabPreTrainedModel):
    """Embeddings, blocks and the final norm; `layers` is what posleak's residual hooks attach to."""

    def __init__(self, config: LabConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size) if config.pe == "learned" else None
        )
        self.layers = nn.ModuleList(LabBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = LabRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: object,
    ) -> BaseModelOutputWithPast:
        """h^(0) = token embedding (+ absolute PE); hidden_states, when asked, are the block inputs and
        the last block's output, before the final norm."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise PosleakError("lab models take unpadded sequences; pass no attention_mask (or one of all ones)")
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        batch, seq_len = hidden.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=hidden.device).expand(batch, seq_len)
        position_ids = position_ids.expand(batch, seq_len)
        hidden = hidden + self._absolute_positions(position_ids, hidden.dtype)
        rope = rope_tables(self.config, position_ids, hidden.dtype) if self.config.pe == "rope" else None
        states = [hidden] if output_hidden_states else None
        for block in self.layers:
            hidden = block(hidden, position_ids, rope)
            if states is not None:
                states.append(hidden)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden), hidden_states=tuple(states) if states is not None else None
        )

    def _absolute_positions(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | float:
        if self.config.pe == "learned":
            limit = self.config.max_position_embeddings
            if int(position_ids.max()) >= limit:
                raise PosleakError(
                    f"position {int(position_ids.max())} is beyond this learned-position model's {limit} positions; "
                    f"use sequences of at most {limit} tokens"
                )
            return self.embed_positions(position_ids)
        if self.config.pe == "sinusoidal":
            # Scaled so that each dimension's rms equals the token embeddings' at initialisation:
            # unscaled (rms 1/√2) it would drown the 0.02-sized token vectors under the first RMSNorm.
            scale = self.config.initializer_range * math.sqrt(2.0)
            return scale * sinusoidal_embedding(position_ids, self.config.hidden_size, dtype)
        return 0.0


class LabForCausalLM(LabPreTrainedModel):
    """The lab decoder with its (tied) output layer. Loads with `AutoModelForCausalLM.from_pretrained`."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: LabConfig) -> None:
        super().__init__(config)
        self.model = LabModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: object,
    ) -> CausalLMOutputWithPast:
        """`labels` (−100 to ignore) give the mean next-token cross-entropy as `loss`."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


def build_lab_model(config: LabConfig, seed: int | None = None) -> LabForCausalLM:
    """A freshly initialised lab model (seeded when `seed` is given) running posleak's attention."""
    if seed is not None:
        torch.manual_seed(seed)
    return use_posleak_attention(LabForCausalLM(config))


def load_lab_model(folder: str, **overrides: object) -> LabForCausalLM:
    """A saved lab model; `overrides` replace config fields first (e.g. rope_scale_kind="ntk", rope_factor=4)."""
    saved = LabConfig.from_pretrained(folder)
    # Rebuild rather than set attributes, so that derived fields (the window of `attention`) follow.
    config = LabConfig.from_dict({**saved.to_dict(), **overrides}) if overrides else saved
    with quiet_transformers():
        model = LabForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32)
    return use_posleak_attention(model).eval()


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No transformers progress bars inside (a lab loads and saves small models many times)."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


AutoConfig.register(LabConfig.model_type, LabConfig)
AutoModelForCausalLM.register(LabConfig, LabForCausalLM)
