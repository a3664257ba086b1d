"""Tiny models built in code (no download): randomly initialised ones of each supported family, and a lab
model whose sink heads are set by construction."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

WINDOW = 16  # tests run at lengths longer than this so that sliding windows act
_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def tiny_model(family: str, seed: int = 0, window: int = WINDOW) -> PreTrainedModel:
    """A float32, eval-mode model of `family` with random weights (seeded); `window` for the sliding layers."""
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**_COMMON))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**_COMMON))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**_COMMON, sliding_window=window))
    elif family == "gemma3":
        layer_types = ["sliding_attention", "sliding_attention", "full_attention"]
        model = Gemma3ForCausalLM(
            Gemma3TextConfig(**_COMMON, head_dim=32, sliding_window=window, layer_types=layer_types)
        )
    elif family == "gemma2":  # soft-capped logits
        model = Gemma2ForCausalLM(
            Gemma2Config(**_COMMON, head_dim=16, sliding_window=window, attn_logit_softcapping=5.0)
        )
    elif family == "gpt_oss":  # learned sink logits
        model = GptOssForCausalLM(
            GptOssConfig(
                **{**_COMMON, "num_local_experts": 2, "num_experts_per_tok": 1}, head_dim=16, sliding_window=window
            )
        )
    else:
        raise ValueError(family)
    return model.float().eval()


FAMILIES = ["llama", "qwen2", "mistral", "gemma3", "gemma2", "gpt_oss"]

# ------------------------------------------------------------------ any model type of transformers' causal-LM mapping

# Set where the model type's config has the attribute: small shapes, few experts, a window shorter than the
# family tests' length, and a pad id inside the small vocabulary (SmolLM3 and GLM default to one beyond it).
_ANY_TYPE = dict(
    _COMMON,
    head_dim=16,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    num_experts=4,
    num_local_experts=4,
    n_routed_experts=4,
    moe_intermediate_size=32,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=128,
)
FAMILY_WINDOW = _ANY_TYPE["sliding_window"]


def family_model(model_type: str, overrides: dict | None = None, seed: int = 0) -> PreTrainedModel:
    """A float32, eval-mode causal LM of any `model_type` of transformers' causal-LM mapping, built from its own
    config class at the tiny sizes above (those its config has) and `overrides` (the type's own attributes)."""
    config_class = CONFIG_MAPPING[model_type]
    defaults = config_class()
    defaults.allow_global_per_layer_attribute_access = True  # a per-layer attribute (Gemma 4's head_dim) exists too
    sizes = {name: value for name, value in _ANY_TYPE.items() if hasattr(defaults, name) and _settable(defaults, name)}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config_class(**{**sizes, **(overrides or {})}))
    return model.float().eval()


def _settable(config: object, name: str) -> bool:
    """Not a read-only property (Falcon derives `head_dim` from its width and heads)."""
    attribute = getattr(type(config), name, None)
    return not isinstance(attribute, property) or attribute.fset is not None


def tiny_tokenizer(vocab_size: int = _COMMON["vocab_size"], bos: bool = True) -> PreTrainedTokenizerFast:
    """A real word-level tokenizer: "<bos>" is 0 (a BOS token only if `bos`), "<unk>" 1, and the word
    "wK" is token K ≥ 2."""
    vocab = {"<bos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>" if bos else None, unk_token="<unk>")


# --------------------------------------------------------------------------- a model with sink heads by construction

SINK_T = 32  # sequence length the analytic sink scores below are computed for
_SINK_C = _SINK_RHO = 8.0  # every token embedding is c·u_0 + ρ·(a unit vector), so all have one norm


def sink_model(logits: dict[tuple[int, int], float], layers: int = 3, vocab_size: int = 32) -> PreTrainedModel:
    """A NoPE lab model (4 heads of 16 dims, width 64) in which head (l, h) of `logits` gives key 0 the logit
    L = logits[(l, h)] and every other key the logit 0, from every query; all other heads give every key 0.

    Construction: token 0 (the BOS) embeds as c·u_0 + ρ·u_1, token t ≥ 1 as c·u_0 + ρ·v_t with v_t a unit vector
    orthogonal to u_0 and u_1. Every attention output and MLP projection is zero, so the residual stream is the
    embedding in every layer. In head (l, h) the query's first dimension reads u_0 (the same for every token) and
    the key's first dimension reads u_1 (non-zero for the BOS only): s_{i,0} = L and s_{i,j} = 0 for j ≥ 1.
    So a_{i,0} = e^L / (e^L + i) exactly, and position 0 must hold token 0 and no other position may."""
    from posleak.models.lab.config import LabSpec
    from posleak.models.lab.hf_config import LabConfig
    from posleak.models.lab.model import build_lab_model

    config = LabConfig.from_spec(LabSpec(size="tiny", pe="nope"), vocab_size, 2 * SINK_T, bos_id=0, eos_id=None)
    config.num_hidden_layers = layers
    model = build_lab_model(config, seed=0).eval()
    hidden, heads, dim = config.hidden_size, config.num_attention_heads, config.head_dim
    rms = math.sqrt((_SINK_C**2 + _SINK_RHO**2) / hidden + config.rms_norm_eps)
    unit = _SINK_C * _SINK_RHO / rms**2 * dim**-0.5  # the logit of weights 1 on both sides, through RMSNorm
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        rest = torch.randn(vocab_size, hidden - 2, generator=generator)
        embedding = torch.cat([torch.zeros(vocab_size, 2), _SINK_RHO * rest / rest.norm(dim=1, keepdim=True)], dim=1)
        embedding[:, 0] = _SINK_C
        embedding[0, 1:] = 0.0
        embedding[0, 1] = _SINK_RHO
        model.model.embed_tokens.weight.copy_(embedding)
        for layer, block in enumerate(model.model.layers):
            block.input_layernorm.weight.fill_(1.0)
            block.self_attn.o_proj.weight.zero_()
            block.mlp.down_proj.weight.zero_()
            qkv = block.self_attn.qkv_proj.weight  # rows: (q | k | v) × head × dim
            qkv[: 2 * hidden].zero_()
            for head in range(heads):
                if (layer, head) in logits:
                    qkv[head * dim, 0] = logits[(layer, head)] / unit
                    qkv[hidden + head * dim, 1] = 1.0
    return model


def sink_scores(logits: dict[tuple[int, int], float], layers: int, heads: int = 4) -> torch.Tensor:
    """The analytic α_0 of `sink_model(logits, layers)` at length SINK_T: mean over 1 ≤ i < T of e^L / (e^L + i)."""
    i = torch.arange(1, SINK_T, dtype=torch.float64)
    scores = torch.empty(layers, heads, dtype=torch.float64)
    for layer in range(layers):
        for head in range(heads):
            weight = math.exp(logits.get((layer, head), 0.0))
            scores[layer, head] = (weight / (weight + i)).mean()
    return scores


def sink_ids(num_seqs: int = 4, vocab_size: int = 32, seed: int = 0) -> torch.Tensor:
    """Rows for `sink_model`: token 0 at position 0, tokens 1.. elsewhere."""
    ids = torch.randint(1, vocab_size, (num_seqs, SINK_T), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = 0
    return ids


def tiny_checkpoint(folder: Path, bos: bool = True) -> Path:
    """A tiny Llama and its word-level tokenizer saved as a real checkpoint folder (safetensors)."""
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer(bos=bos).save_pretrained(folder)
    return folder


def word_corpus(path: Path, words: int = 4000) -> Path:
    """A text file of `words` words of the tiny tokenizer's vocabulary (one token each, never the BOS)."""
    path.write_text(" ".join(f"w{k % 90 + 2}" for k in range(words)))
    return path
