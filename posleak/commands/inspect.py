"""`posleak inspect`: a model's position facts, and its per-layer sink rate on the default corpus.

Facts: architecture, RoPE base and scaling per layer, window per layer, the token at position 0
under each BOS policy. Measured: the share of sink heads (α_0 > 0.3) per layer on a few sequences
of the default corpus, through posleak's attention path.
"""

from __future__ import annotations

from typing import Any

from posleak.data.batches import pos0_token
from posleak.data.corpus import DEFAULT_CORPUS
from posleak.data.kinds import BOS_POLICIES
from posleak.data.recipe import Recipe
from posleak.device import Placement
from posleak.errors import BadInput, PosleakError
from posleak.models.load import load_model
from posleak.pipeline import attention_stats, sequences_for


def inspect_model(
    spec: str,
    *,
    seq_len: int = 128,
    num_seqs: int = 8,
    batch_size: int = 4,
    trust_remote_code: bool = False,
    progress: bool = True,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The facts and the sink rate of `spec` as one JSON-ready dict, on the device and in the dtype of
    `placement` (refused, BadInput, where this machine cannot run them)."""
    placement = placement or Placement()
    if problems := placement.problems():
        raise BadInput(problems)
    loaded = load_model(spec, trust_remote_code=trust_remote_code, placement=placement)
    tokenizer = loaded.tokenizer
    position0: dict[str, Any] = {}
    for bos in BOS_POLICIES:
        try:
            token = pos0_token(tokenizer, bos)
        except PosleakError as err:  # `on` for a tokenizer without BOS
            position0[bos] = {"error": str(err)}
            continue
        position0[bos] = (
            {"id": token, "text": tokenizer.decode([token])} if token is not None else "first content token"
        )
    sampling = Recipe(seq_len=seq_len, num_seqs=num_seqs, bos="auto", corpus=DEFAULT_CORPUS, seed=0)
    batch = sequences_for(loaded, sampling)
    result = attention_stats(loaded.model, batch, batch_size, desc=f"sink rate {spec}", progress=progress)
    return {
        "model": spec,
        "sha256": loaded.file_hash,
        "facts": loaded.facts.to_dict(),
        "position0": position0,
        "sink_rate": {
            "corpus": DEFAULT_CORPUS,
            "seq_len": seq_len,
            "num_seqs": num_seqs,
            "bos": "auto",
            "per_layer": [round(float(x), 4) for x in result.sink_rate],
        },
    }
