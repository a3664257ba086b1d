"""The lab decoder: a transformers `PreTrainedModel` whose only position sources are the configured ones.

Each block is pre-norm: h + Attn(RMSNorm(h)), then h + MLP(RMSNorm(h)). Nothing mixes tokens except
attention (no token shift, convolution or smear), so order reaches the model through the position
encoding, the mask and the normalisation alone. The attention and position parts are in
`posleak.models.lab.attention`. Absolute encodings (learned, sinusoidal) are added to the token
embeddings at the input of block 0; the embedding module itself stays a plain `nn.Embedding`, so
`ResidualCapture`'s resid[0] is the token embedding alone and absolute position first shows in resid[1].

`register_lab_model()` registers the model with `AutoConfig` / `AutoModelForCausalLM`, so that
`AutoModelForCausalLM.from_pretrained(folder)` loads a lab checkpoint without remote code.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging as hf_logging

from posleak.capture.attention import use_posleak_attention
from posleak.errors import PosleakError
from posleak.models.lab.attention import LabAttention, rope_tables, sinusoidal_embedding
from posleak.models.lab.hf_config import LabConfig


class LabRMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


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
        if self.config.initializer_range is None and isinstance(module, nn.Linear | nn.Embedding):
            _torch_default_init(module)
        else:
            super()._init_weights(module)
        if isinstance(module, LabAttention):
            if module.sink is not None:
                init.zeros_(module.sink)
            if module.logit_bias is not None:
                init.constant_(module.logit_bias, self.config.sigmoid_bias_init)


def _torch_default_init(module: nn.Linear | nn.Embedding) -> None:
    """torch's own initialisation of the module (hf_config.LabConfig says why the lab uses it): a linear layer's
    weight U(±1/√fan_in), an embedding N(0, 1). Through transformers' `init`, which leaves loaded weights alone."""
    if isinstance(module, nn.Embedding):
        init.normal_(module.weight, mean=0.0, std=1.0)
        return
    bound = 1.0 / math.sqrt(module.in_features)  # the lab's linear layers have no bias
    init.uniform_(module.weight, -bound, bound)


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
            # Scaled so that each dimension's rms equals the token embeddings' at initialisation (unscaled it is
            # 1/√2): 1 under torch's initialisation, initializer_range for a model made before it (0.02).
            scale = (self.config.initializer_range or 1.0) * math.sqrt(2.0)
            return scale * sinusoidal_embedding(position_ids, self.config.hidden_size, dtype)
        return 0.0


class LabForCausalLM(LabPreTrainedModel):
    """The lab decoder with its output layer (untied unless an older config ties it: hf_config.LabConfig).
    Loads with `AutoModelForCausalLM.from_pretrained`."""

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


def register_lab_model() -> None:
    """Make transformers' Auto classes know the lab model type (`posleak_lab`); calling it again changes nothing."""
    AutoConfig.register(LabConfig.model_type, LabConfig, exist_ok=True)
    AutoModelForCausalLM.register(LabConfig, LabForCausalLM, exist_ok=True)
