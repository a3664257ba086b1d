"""Tiny randomly initialised models of each supported family, built in code (no download)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
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


def tiny_tokenizer(vocab_size: int = _COMMON["vocab_size"], bos: bool = True) -> PreTrainedTokenizerFast:
    """A real word-level tokenizer: "<bos>" is 0 (a BOS token only if `bos`), "<unk>" 1, and the word
    "wK" is token K ≥ 2."""
    vocab = {"<bos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>" if bos else None, unk_token="<unk>")


def tiny_checkpoint(folder: Path, bos: bool = True) -> Path:
    """A tiny Llama and its word-level tokenizer saved as a real checkpoint folder (safetensors)."""
    tiny_model("llama").save_pretrained(folder)
    tiny_tokenizer(bos=bos).save_pretrained(folder)
    return folder


def word_corpus(path: Path, words: int = 4000) -> Path:
    """A text file of `words` words of the tiny tokenizer's vocabulary (one token each, never the BOS)."""
    path.write_text(" ".join(f"w{k % 90 + 2}" for k in range(words)))
    return path
