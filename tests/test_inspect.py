"""`posleak inspect`: a built-in model's facts and its sink rate against attention weights from transformers' own
eager path, run as a user would (a fresh interpreter); a missing model is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli import assert_one_line_error, run_cli

from posleak.capture import use_posleak_attention
from posleak.data.batches import make_sequences
from posleak.data.corpus import load_corpus
from posleak.models.load import LoadedModel


@pytest.mark.slow
def test_inspect_reports_the_facts_and_the_sink_rate_of_eager_attention(smollm2: LoadedModel) -> None:
    """The facts of SmolLM2 as the NOTES record them, and per layer the share of heads with α_0 > 0.3 computed from
    the attention weights transformers' eager attention returns on the same sequences."""
    proc = run_cli("inspect", "smollm2-135m", "--json", "--seq-len", "32", "--num-seqs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout)
    facts = info["facts"]
    assert (facts["layers"], facts["heads"], facts["kv_heads"]) == (30, 9, 3)
    assert facts["rope_theta"] == [1e5] * 30
    assert info["position0"]["auto"] == "first content token"  # SmolLM2 does not prepend its BOS
    assert info["position0"]["on"] == {"id": 1, "text": "<|im_start|>"}

    ids = make_sequences(load_corpus("stdlib"), smollm2.tokenizer, 32, 2, bos="auto", seed=0).ids
    model = smollm2.model
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(ids, output_attentions=True).attentions  # L × (N, H, T, T)
    finally:
        use_posleak_attention(model)
    alpha0 = torch.stack([weights[:, :, 1:, 0].double().mean(dim=(0, 2)) for weights in attentions])  # (L, H)
    assert (alpha0 - 0.3).abs().min() > 1e-4  # no head so near ε that rounding could flip it
    rates = (alpha0 > 0.3).double().mean(dim=1)
    assert rates.max() > 0  # SmolLM2 has sink heads
    assert info["sink_rate"]["per_layer"] == pytest.approx(rates.tolist(), abs=1e-4)  # printed to 4 places


def test_inspect_missing_path_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("inspect", "/no/such/path"), "/no/such/path")
