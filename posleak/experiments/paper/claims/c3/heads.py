"""C3's heads: each unit's sink heads and the matched non-sink heads that control them, chosen on the unit's
baseline on the selection sample, and how a head list is written for an intervention and for a reader."""

from __future__ import annotations

import pandas as pd

from posleak.capture.query_stats import SINK_THRESHOLD


def sink_heads(per_head: pd.DataFrame) -> pd.DataFrame:
    """Every sink head (α₀ > ε) outside the model's last layer (a head there has no later layers to change),
    strongest first."""
    heads = per_head[(per_head["sink_score"] > SINK_THRESHOLD) & (per_head["layer"] < per_head["layer"].max())]
    return heads.sort_values("sink_score", ascending=False).reset_index(drop=True)


CLOCK = "resid_all_key0"  # a head's clock: what of its w the column of key 0 holds, which the clock removal takes away


def control_pool(per_head: pd.DataFrame) -> pd.DataFrame:
    """The heads a control may take: the non-sink heads (α₀ ≤ ε) outside the last layer, as `sink_heads`."""
    return per_head[(per_head["sink_score"] <= SINK_THRESHOLD) & (per_head["layer"] < per_head["layer"].max())]


def matched_controls(per_head: pd.DataFrame, sinks: pd.DataFrame, draw: int) -> pd.DataFrame:
    """For each sink head a non-sink head outside the last layer, matched on what the clock removal takes away:
    from the sink head's layer, the non-sink head whose clock (`CLOCK`, its key-0 column of w on the selection
    sample) is nearest the sink head's. Draw k takes its heads from those that draws 0..k−1 left, where the layer
    has some (so the draws differ and draw 0 is the best match); where a layer has too few, the rest come from the
    nearest layers with some left (ties by clock, then head). Sink heads are matched strongest clock first, so the
    largest clocks get the nearest match. Call it only where the pool holds at least as many heads as `sinks`
    (`Design.of`: a unit with fewer cannot test C3)."""
    pool = control_pool(per_head)
    earlier = {i for k in range(draw) for i in _matched(pool, sinks, set())}
    return pool.loc[_matched(pool, sinks, earlier)].sort_values(["layer", "head"]).reset_index(drop=True)


def _matched(pool: pd.DataFrame, sinks: pd.DataFrame, earlier: set[int]) -> list[int]:
    """The index in `pool` of each sink head's control (`matched_controls`), avoiding `earlier` where it can."""
    clock = pool[CLOCK].fillna(0.0)  # sigmoid attention has no key-0 split: then by layer and head alone
    chosen: list[int] = []
    for _, sink in sinks.sort_values(CLOCK, ascending=False, na_position="last").iterrows():
        left = pool.drop(chosen)
        if left.empty:
            break
        fresh = left.drop([i for i in earlier if i in left.index])
        left = fresh if (fresh["layer"] == sink["layer"]).any() else left
        order = pd.DataFrame(
            {
                "distance": (left["layer"] - sink["layer"]).abs(),
                "gap": (clock[left.index] - (0.0 if pd.isna(sink[CLOCK]) else sink[CLOCK])).abs(),
                "head": left["head"],
            }
        )
        chosen.append(order.sort_values(["distance", "gap", "head"]).index[0])
    return chosen


def head_list(heads: pd.DataFrame) -> str:
    """The `--ablate-sink-values` / `--kv0-heads` form of a table of heads: L.H,L.H,..."""
    return ",".join(f"{layer}.{head}" for layer, head in zip(heads["layer"], heads["head"], strict=True))


def heads_by_layer(heads: pd.DataFrame) -> str:
    """A table of heads for reading: `L3: 0 5 7; L4: 2`, layers in order (spaces let a report's cell wrap)."""
    if heads.empty:
        return "-"
    by_layer = heads.sort_values(["layer", "head"]).groupby("layer")["head"]
    return "; ".join(f"L{layer}: {' '.join(str(h) for h in group)}" for layer, group in by_layer)
