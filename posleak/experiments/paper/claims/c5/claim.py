"""C5: replacing the BOS embedding removes about 40% of the residual-stream component at early queries.

The component's square splits over keys, resid_early² = key0² + rest² (per head, so per layer and in the mean over
layers of the squares, docs/method.md §3), while its root does not: a replacement that shrinks the key-0 column and
grows the other keys moves the root by less than either. So the effect is stated on the squared component, the % of
the baseline's resid_early² removed, and split into the part removed through the key-0 column and through the other
keys (the two add to the whole); beside it, each magnitude's change in nats and the replacement's cost in next-token
loss (posleak.measure.behaviour, the behaviour table's numbers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from posleak.experiments.evidence import Estimate, Says, layer_mean, share_removed
from posleak.experiments.paper.claim import (
    ACROSS_CORPORA,
    BY_DOCUMENT,
    HOLM_RULE,
    REPLICATED,
    ROWS_ESTIMAND,
    ClaimModule,
    evidence_text,
    rounded,
)
from posleak.experiments.paper.plan import SHOWN, Plan, RoleName
from posleak.experiments.paper.reproduction import SampleRuns
from posleak.experiments.paper.requests import Request
from posleak.experiments.paper.thresholds import BOS_BAND, BOS_TOLERANCE, PAPER_BOS_REMOVED
from posleak.experiments.paper.verdict import (
    EVIDENCE_COLUMNS,
    JUDGED,
    Judged,
    Judgement,
    Revision,
    evidence_row,
    exact_p,
    judge,
)
from posleak.interventions import Interventions, ReplaceBos
from posleak.measure.behaviour import behaviour_table
from posleak.pipeline import AnalysisResult
from posleak.report import figures
from posleak.report.html import TableBlock

BOS_KINDS = ("mean", "random", "zero")  # what replaces the BOS's embedding
# The one replacement that decides, named on 2026-12-03 (docs/method.md §13; all three had run since 2026-11-30,
# so its interval had been seen, and the criterion is dated as revised): the vocabulary mean takes away
# what the BOS token is while keeping an embedding of the scale and direction a token has; zeros (no input at all)
# and a random vector of the same norm (off the embeddings' manifold) change more than the token, so they are
# reported beside it. Deciding by whichever of three replacements lands in the band was a forking path.
DECIDING = "mean"
WHOLE = "resid_early"
# the whole and its two parts by keys, each a column of the runs (docs/method.md §3), with the words rows use
KEY_PARTS = {WHOLE: "all keys", f"{WHOLE}_key0": "the key-0 column", f"{WHOLE}_rest": "the other keys"}
LOSS_BUCKETS = ("early", "all")  # the behaviour table's queries 4–31 (nearest C5's 1–31) and every query

C5_CRITERION = (
    f"removed = the % of the early residual-stream component's square removed, 100·(1 − resid_early²(replaced) / "
    f"resid_early²(baseline)), squares the mean over layers of each layer's mean square over heads and pairs (so "
    f"that they add over key 0 and the other keys), for the BOS embedding replaced by the vocabulary {DECIDING} "
    f"(named on 2026-12-03; random and zero are reported, not judged). Consistent if its 95% interval lies "
    f"inside [{BOS_BAND[0]:g}%, {BOS_BAND[1]:g}%] (the paper's {PAPER_BOS_REMOVED:g}% ± {BOS_TOLERANCE:g}); not "
    "consistent if it lies wholly outside that band; else inconclusive. Reported beside it: the part removed through "
    "the key-0 column and through the other keys (% of the same resid_early², adding to it), each magnitude's "
    "change in nats, and the change of next-token loss."
)


@dataclass(frozen=True)
class Replacement:
    """One BOS replacement against its baseline on the same sequences (paired resamples), per part of the early
    residual-stream component (KEY_PARTS): its magnitude in each run (nats, the mean over layers) and the % of the
    baseline's resid_early² it removes through that part (`share_removed`; the parts' add to the whole's)."""

    baseline: dict[str, Estimate]
    replaced: dict[str, Estimate]
    removed: dict[str, Estimate]

    def change(self, part: str) -> Estimate:
        """Replaced − baseline magnitude, nats: roots, so the parts' do not add to the whole's."""
        return self.replaced[part].minus(self.baseline[part])


def _bos_key(kind: str) -> str:
    return f"bos-{kind}"


def replaced_runs(runs: SampleRuns) -> dict[str, AnalysisResult]:
    """The BOS model under each replacement, by kind (BOS_KINDS)."""
    return {kind: runs[_bos_key(kind)] for kind in BOS_KINDS}


def replacement(baseline: AnalysisResult, replaced: AnalysisResult) -> Replacement:
    """The early residual-stream component and its parts, before and after one replacement."""
    return Replacement(
        baseline={part: layer_mean(baseline, part) for part in KEY_PARTS},
        replaced={part: layer_mean(replaced, part) for part in KEY_PARTS},
        removed={part: share_removed(baseline, replaced, part, WHOLE) for part in KEY_PARTS},
    )


def removed_name(kind: str, part: str = WHOLE) -> str:
    """The evidence row of the % of resid_early² that `kind` removes through `part`."""
    through = "" if part == WHOLE else f" through {KEY_PARTS[part]}"
    return f"{kind}: removed{through} (% of resid_early²)"


def change_name(kind: str, part: str) -> str:
    return f"{kind}: change of {part} (nats)"


def claim_c5(replacements: Mapping[str, Replacement]) -> Judgement:
    """Per replacement, the band row of the % of resid_early² removed (the DECIDING one decides), then its parts
    and the changes in nats, reported: each part's row supports removal (> 0%, a fall in nats) or contradicts it."""
    rows = []
    for kind, effect in replacements.items():
        rows.append(_band_row(removed_name(kind), effect.removed[WHOLE], deciding=kind == DECIDING))
        parts = [part for part in KEY_PARTS if part != WHOLE]
        rows += [
            evidence_row(removed_name(kind, part), effect.removed[part], 0.0, "above", "%", False) for part in parts
        ]
        rows += [
            evidence_row(change_name(kind, part), effect.change(part), 0.0, "below", "nats", False)
            for part in KEY_PARTS
        ]
    return judge(rows)


def _band_row(evidence: str, removed: Estimate, deciding: bool) -> dict[str, Any]:
    """A row judged against the band: supports inside it, contradicts wholly outside. A band has no one-sided
    p-value: the row is judged on its interval, and as the one deciding row Holm's rule leaves it as it is."""
    low, high = BOS_BAND
    lo, hi = removed.interval
    says: Says = "supports" if low <= lo and hi <= high else "contradicts" if hi < low or lo > high else "unclear"
    values = (evidence, removed.value, lo, hi, f"{low:g}–{high:g}", "%", says, deciding, exact_p(says))
    # the band as two bounds, for the samples' rows pooled (effects.py); they differ from the inclusive ends
    # above only where an end of the interval falls exactly on the band's
    return {
        **dict(zip(EVIDENCE_COLUMNS, values, strict=True)),
        JUDGED: Judged(removed, ((low, "above"), (high, "below"))),
    }


def removed_by_layer(baseline: AnalysisResult, replaced: AnalysisResult) -> pd.DataFrame:
    """`layer, removed, removed_lo, removed_hi`: the % of each layer's resid_early² removed, with its interval."""
    layers = baseline.per_layer["layer"].tolist()
    rows = [share_removed(baseline, replaced, WHOLE, WHOLE, [layer]) for layer in layers]
    return pd.DataFrame(
        {
            "layer": layers,
            "removed": [e.value for e in rows],
            "removed_lo": [e.interval[0] for e in rows],
            "removed_hi": [e.interval[1] for e in rows],
        }
    )


def loss_change(baseline: AnalysisResult, replaced: AnalysisResult, resamples: int) -> pd.DataFrame:
    """The change of mean next-token loss (nats) in LOSS_BUCKETS, indexed by bucket: the behaviour table's rows,
    computed as `posleak paper` computes them for every intervention (same resamples and documents)."""
    table = behaviour_table(baseline, replaced, resamples=resamples, units=baseline.units)
    loss = table[(table["measure"] == "loss") & table["bucket"].isin(LOSS_BUCKETS)]
    return loss.set_index("bucket")[["change", "change_lo", "change_hi"]]


def effect_table(replacements: Mapping[str, Replacement], losses: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per replacement and part (KEY_PARTS): its magnitude before and after (nats), their difference with its
    interval, the % of resid_early² removed through it, and the replacement's change of loss beside. Not the % of
    the part's own square: the other keys' can be near 0 in the baseline (gemma3-270m's, 0.02–0.06 nats²), and a
    ratio to it has no bound."""
    rows = []
    for kind, effect in replacements.items():
        loss = {
            f"loss_change_{bucket}_{end}": losses[kind].at[bucket, column]
            for bucket in LOSS_BUCKETS
            for end, column in (("nats", "change"), ("lo", "change_lo"), ("hi", "change_hi"))
        }
        for part in KEY_PARTS:
            rows.append(
                {
                    "replacement": kind,
                    "part": part,
                    "baseline_nats": effect.baseline[part].value,
                    "replaced_nats": effect.replaced[part].value,
                    **_estimate("change_nats", effect.change(part)),
                    **_estimate("removed_pct_of_resid_early_sq", effect.removed[part]),
                    **loss,
                }
            )
    return pd.DataFrame(rows)


def _estimate(name: str, estimate: Estimate) -> dict[str, float]:
    lo, hi = estimate.interval
    return {name: estimate.value, f"{name}_lo": lo, f"{name}_hi": hi}


class C5(ClaimModule):
    name = "C5"
    statement = (
        f"Replacing the BOS embedding removes about {PAPER_BOS_REMOVED:g}% of the residual-stream component at "
        "early queries."
    )
    roles = ("bos",)
    bos_needed: ClassVar[Mapping[RoleName, str]] = {"bos": "C5 replaces its BOS"}
    criterion = C5_CRITERION
    revisions = (
        REPLICATED,
        ROWS_ESTIMAND,
        HOLM_RULE,
        Revision(
            "2026-12-03",
            "decided by one replacement, the vocabulary mean, its interval inside 20–60%, random and zero reported "
            "(before: consistent where any of the three replacements' intervals met the band, a forking path across "
            "three tries); all three had run since 2026-11-30, so the mean's interval had been seen",
        ),
        BY_DOCUMENT,
        ACROSS_CORPORA,
        Revision(
            "2026-12-05",
            "removed is the % of the early component's square (resid_early², the mean over layers) that the "
            "replacement takes away, not the % change of its root: the root of a sum mixed a falling key-0 column "
            "with rising other keys; squares add over key 0 and the rest, which are reported beside it with each "
            "change in nats and the loss cost of each replacement; the band 20–60% and the deciding replacement "
            "unchanged",
        ),
    )

    @property
    def method(self) -> str:  # the plan's BOS model, so not a class constant
        return (
            f"The embedding output at position 0 of {self.repro.plan.roles['bos'].name} replaced by the vocabulary "
            "mean, a random vector of the same norm, or zeros, before the forward pass; same sequences as the "
            "baseline (docs/method.md §9)."
        )

    @classmethod
    def requests(cls, plan: Plan, sample: str) -> list[Request]:
        """The BOS model with its BOS's embedding replaced by each of BOS_KINDS."""
        folder = plan.roles["bos"].folder
        return [
            Request(_bos_key(kind), "bos", f"{folder}-{kind}", Interventions(ReplaceBos(kind))) for kind in BOS_KINDS
        ]

    def compared_roles(self) -> frozenset[RoleName]:
        return frozenset({"bos"})  # the BOS replacements against the BOS baseline

    def measure(self, runs: Mapping[str, SampleRuns]) -> None:
        """Each replacement's effect on the component and on the loss, by sample and replacement (no analysis)."""
        resamples = self.repro.plan.bootstrap
        self.replacements = {
            sample: {kind: replacement(r.baseline("bos"), new) for kind, new in replaced_runs(r).items()}
            for sample, r in runs.items()
        }
        self.losses = {
            sample: {kind: loss_change(r.baseline("bos"), new, resamples) for kind, new in replaced_runs(r).items()}
            for sample, r in runs.items()
        }

    def judge(self, runs: SampleRuns, sample: str) -> Judgement:
        return claim_c5(self.replacements[sample])

    def numbers(self, sample: str) -> dict[str, Any]:
        """The table's numbers (`effect_table`) by replacement and part, for claims.json."""
        table = effect_table(self.replacements[sample], self.losses[sample]).set_index(["replacement", "part"])
        by_kind: dict[str, dict[str, Any]] = {}
        for (kind, part), values in table.iterrows():
            by_kind.setdefault(str(kind), {})[str(part)] = values.to_dict()
        return {"replacements": by_kind}

    def tables(self, runs: SampleRuns, sample: str) -> list[TableBlock]:
        table = effect_table(self.replacements[sample], self.losses[sample])
        self.repro.out.write_table(f"c5_{sample}", table)
        return [
            TableBlock(
                f"BOS replacements: the early residual-stream component and its parts (sample {sample})",
                rounded(table),
                caption=(
                    "Magnitudes are means over layers (nats); their changes are roots and do not add over the "
                    "parts. removed_pct_of_resid_early_sq is the % of the baseline's resid_early² removed through "
                    "the part (the key-0 column's and the other keys' add to the whole's). loss_change_*: replaced "
                    "− baseline next-token loss (nats), queries 4–31 (early) and all. 95% paired bootstrap "
                    "intervals over documents."
                ),
                max_rows=None,
                source=f"c5_{sample}.parquet",
            )
        ]

    def interventions(self, runs: SampleRuns, sample: str) -> dict[str, tuple[AnalysisResult, AnalysisResult]]:
        return {f"replace-bos {kind}": (runs.baseline("bos"), new) for kind, new in replaced_runs(runs).items()}

    def against_paper(self, judgement: Judgement, runs: SampleRuns) -> str:
        def said(kind: str) -> str:
            loss = self.losses[SHOWN][kind].loc["all"]
            key0, rest = (evidence_text(judgement, removed_name(kind, f"{WHOLE}_{part}")) for part in ("key0", "rest"))
            return (
                f"{evidence_text(judgement, removed_name(kind))}: {key0} "
                f"through the key-0 column and {rest} through the "
                f"other keys, at {loss.change:+.3g} nats of next-token loss ({loss.change_lo:+.3g} to "
                f"{loss.change_hi:+.3g})"
            )

        named = {"mean": "the vocabulary mean", "random": "a random vector", "zero": "zeros"}
        found = "; ".join(f"{named.get(kind, kind)} {said(kind)}" for kind in self.replacements[SHOWN])
        return (
            f"The paper removes about {PAPER_BOS_REMOVED:g}% of the component; here, of the early component's "
            f"square: {found}."
        )

    def figures(self, runs: SampleRuns) -> list[Path]:
        removed = {kind: removed_by_layer(runs.baseline("bos"), new) for kind, new in replaced_runs(runs).items()}
        title = f"resid_early² removed by BOS replacement ({runs.roles['bos'].name}, sample {SHOWN})"
        path = self.repro.out.figure_path("c5_removed")
        return [figures.lines_by_run(removed, "removed", path, title=title, ylabel="removed (% of resid_early²)")]
