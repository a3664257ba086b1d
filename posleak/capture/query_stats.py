"""The first streaming accumulator: per layer, head and query, log Z_i, a_{i,0} and row entropy.

Each is summed over sequences (float64) so the result is the mean over the N sequences; the sink
score of docs/method.md §7 is also kept per sequence, for bootstrap intervals over sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posleak.capture.session import AttentionCall

SINK_THRESHOLD = 0.3  # ε of Gu et al. (arXiv 2410.10781): a head is a sink head when α_0 > ε


@dataclass
class QueryStatsResult:
    """Means over sequences. Shapes: (L, H, T) for per-query fields, (L, H) for sink_score."""

    log_z: torch.Tensor
    attn_key0: torch.Tensor
    entropy: torch.Tensor | None  # NaN for sigmoid normalisation (not a distribution); None when not kept
    sink_score: torch.Tensor  # α_0 = mean over queries i ≥ 1 of a_{i,0}
    sink_score_per_seq: torch.Tensor  # (N, L, H), rows in input order
    num_seqs: int

    @property
    def sink_heads(self) -> torch.Tensor:
        return self.sink_score > SINK_THRESHOLD

    def sink_heads_by_layer(self) -> dict[int, tuple[int, ...]]:
        """The sink heads as an intervention's head list takes them: per layer, the heads with α_0 > ε."""
        heads = self.sink_heads
        return {layer: tuple(heads[layer].nonzero().flatten().tolist()) for layer in range(heads.shape[0])}

    @property
    def sink_rate(self) -> torch.Tensor:
        """Share of sink heads per layer, shape (L,)."""
        return self.sink_heads.double().mean(dim=-1)


class QueryStats:
    """Accumulates log Z_i, a_{i,0} and (unless `entropy=False`) the entropy of each attention row.

    The entropy needs Σ_j a_ij k_j, which doubles the flash call's work; `analyze` does not report it."""

    def __init__(self, entropy: bool = True) -> None:
        self.needs_attended_keys = entropy
        self._sums: dict[int, dict[str, torch.Tensor]] = {}
        self._per_seq: dict[int, dict[int, torch.Tensor]] = {}
        self._counts: dict[int, int] = {}

    def update(self, call: AttentionCall) -> None:
        # Summed in float64 on the CPU: MPS has no float64, and the sums are small.
        a0 = call.attention_on_key0().cpu()
        fields = {"log_z": call.log_z.cpu(), "attn_key0": a0}
        if self.needs_attended_keys:
            fields["entropy"] = row_entropy(call).cpu()
        sums = self._sums.setdefault(call.layer, {})
        for name, value in fields.items():
            total = value.double().sum(dim=0)
            sums[name] = sums[name] + total if name in sums else total
        self._counts[call.layer] = self._counts.get(call.layer, 0) + call.query.shape[0]
        per_seq = self._per_seq.setdefault(call.layer, {})
        for row, seq in enumerate(call.sequence_index.tolist()):
            per_seq[seq] = a0[row, :, 1:].double().mean(dim=-1)

    def state_dict(self) -> dict[str, object]:
        """Plain containers of tensors, for checkpointing a run between batches."""
        return {"sums": self._sums, "per_seq": self._per_seq, "counts": self._counts}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._sums, self._per_seq, self._counts = state["sums"], state["per_seq"], state["counts"]

    def result(self) -> QueryStatsResult:
        layers = sorted(self._sums)
        if not layers:
            raise ValueError("QueryStats saw no attention call; was the model switched to posleak attention?")
        n = self._counts[layers[0]]

        def stack(name: str) -> torch.Tensor:
            return torch.stack([self._sums[layer][name] / self._counts[layer] for layer in layers])

        attn_key0 = stack("attn_key0")
        seqs = sorted(self._per_seq[layers[0]])
        per_seq = torch.stack([torch.stack([self._per_seq[layer][s] for layer in layers]) for s in seqs])
        return QueryStatsResult(
            log_z=stack("log_z"),
            attn_key0=attn_key0,
            entropy=stack("entropy") if self.needs_attended_keys else None,
            sink_score=attn_key0[:, :, 1:].mean(dim=-1),
            sink_score_per_seq=per_seq,
            num_seqs=n,
        )


def row_entropy(call: AttentionCall) -> torch.Tensor:
    """H_i = log Z_i − Σ_j a_ij s_ij − a_sink·s_sink, shape (B, H, T).

    Without soft-capping the logits are bilinear, so Σ_j a_ij s_ij = scale · q_i · Σ_j a_ij k_j and
    the attention function's [v | k] flash call gives it without forming the T×T weights.
    """
    if call.norm != "softmax":
        return torch.full_like(call.log_z, float("nan"))
    if call.softcap is None and call.attended_keys is not None:
        expected_logit = call.scaling * (call.query.float() * call.attended_keys.float()).sum(-1)
    else:
        expected_logit = torch.cat(
            [_expected_logit_block(call, q0, min(call.seq_len, q0 + 256)) for q0 in range(0, call.seq_len, 256)],
            dim=-1,
        )
    entropy = call.log_z - expected_logit
    if call.sink is not None:
        sink = call.sink.to(call.log_z.dtype)[None, :, None]
        entropy = entropy - torch.exp(sink - call.log_z) * sink
    return entropy


def _expected_logit_block(call: AttentionCall, q0: int, q1: int) -> torch.Tensor:
    logits = call.logits(q0, q1)
    weights = torch.exp(logits - call.log_z[:, :, q0:q1, None])
    return torch.nan_to_num(weights * logits, nan=0.0).sum(-1)
