"""The job plumbing of `posleak paper`: the analyses the claims share, run or resumed as `AnalysisJob`s into
OUT/runs on a backend, and their results per sample as one typed record.

Every analysis runs on each of two samples of sequences (A and B) that share no document: the corpus's documents
are dealt into three parts by the seed in the proportions 2:2:1 (`SHARES`, posleak.data.batches.part_documents), A's
sequences are windows of the first part's documents, B's of the second's, and C3 chooses its heads on the third
(`SELECTION`), which judges nothing and takes half of A's sequences. Each sequence is a window of a document of its
own (`WINDOWS_PER_DOCUMENT`), so a sample of N sequences is N documents, the units its intervals resample. The deal
does not depend on the model or on T, so no analysis of sample A shares a document with one of sample B, whatever
their models; which documents each sample's runs used is read from their manifests (`Reproduction.documents`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posleak.data.batches import TokenBatch
from posleak.data.kinds import NullKind, Part
from posleak.experiments.batch import AnalysisJob, ModelCache, draw_sequences, run_analyses
from posleak.experiments.paper.plan import SAMPLES, SHOWN, Plan, Role, RoleName
from posleak.interventions import Interventions, ReplaceBos, RopeScaling
from posleak.models.load import LoadedModel
from posleak.pipeline import AnalysisResult, AnalyzeConfig
from posleak.pipeline.config import MIN_SEQS
from posleak.store import RunFolder

BOS_KINDS = ("mean", "random", "zero")  # C5: what replaces the BOS's embedding
# C1, C2: each judged magnitude beside the same on these nulls of its sequences
NULL_KINDS: tuple[NullKind, ...] = ("shuffle", "shift")
BASELINE_ROLES: tuple[RoleName, ...] = ("standard", "large-base", "sliding")  # the models C1, C2 (and C4) judge
SELECTION = "selection"  # the sample C3's heads are chosen on, which judges nothing
# The proportions of A, B and SELECTION in the deal of the documents. The selection sample only picks C3's sink heads
# (α₀ > 0.3, a mean over every later query of its sequences), so half of A's sequences serve it, and the smaller
# share leaves A and B more of the documents long enough for a window: at T = 512 the stdlib docstrings hold 68–72
# such documents (by tokenizer) and the World English Bible 64, which equal thirds would cut to about 23 and 21 each.
SHARES = (2, 2, 1)
# Each sample's part of the corpus's documents (index, shares): the recipe's `part`.
PARTS: dict[str, Part] = {"A": (0, SHARES), "B": (1, SHARES), SELECTION: (2, SHARES)}
WINDOWS_PER_DOCUMENT = 1  # every sequence of a sample is a window of a document of its own


class Reproduction:
    """The analyses the claims need (each an `AnalysisJob` into OUT/runs), run or resumed on `backend`, with
    the loaded models cached between them."""

    def __init__(
        self,
        out: Path,
        plan: Plan,
        progress: bool,
        backend: str = "local",
        address: str | None = None,
        shared: Path | None = None,
    ) -> None:
        self.out = RunFolder(out)
        self.plan = plan
        # The folder of the evidence judged once, whatever the corpus (C4's lab trials in SHARED/lab, its window
        # line's analyses in SHARED/window): OUT, or the top folder of a plan of several corpora, which share it
        self.shared = out if shared is None else shared
        self.lab = self.shared / "lab"
        self.progress = progress
        self.backend = backend
        self.address = address
        self.models = ModelCache()
        self._used: dict[str, set[str]] = {}  # per sample, the documents of its runs' and measures' sequences

    def model(self, name: str) -> LoadedModel:
        return self.models.get(name, Interventions(), self.plan.placement)

    def config(self, role: RoleName, **changes: Any) -> AnalyzeConfig:
        """The analysis of one sample of the model of `role` (num_seqs per sample)."""
        return analysis_config(self.plan, role, **changes)

    def job(self, name: str, model: str, config: AnalyzeConfig, sample: str, root: Path | None = None) -> AnalysisJob:
        """Analysis `name` of `model` on sample A, B or SELECTION (`sample_config`), into ROOT/NAME-SAMPLE (by
        default OUT/runs), its tables without a report of its own."""
        folder = (self.out.path / "runs" if root is None else root) / f"{name}-{sample}"
        return AnalysisJob(f"{name}-{sample}", model, sample_config(config, sample), folder, report=False)

    def sample(self, model: str, config: AnalyzeConfig, sample: str) -> TokenBatch:
        """The sequences of `config` for `model` on sample A, B or SELECTION (for a measure outside an analysis)."""
        batch = draw_sequences(self.models, model, sample_config(config, sample))
        self._used.setdefault(sample, set()).update(batch.documents or ())
        return batch

    def documents(self, sample: str) -> list[str]:
        """The titles of the documents whose windows the runs and measures of sample A, B or SELECTION used, every
        model's (as their manifests name them), in alphabetical order."""
        return sorted(self._used.get(sample, ()))

    def run(self, jobs: list[AnalysisJob]) -> list[AnalysisResult]:
        """The result of every job, in order: finished ones read back, the others run on the backend."""
        results = run_analyses(
            jobs, backend=self.backend, address=self.address, models=self.models, progress=self.progress
        )
        for job, result in zip(jobs, results, strict=True):
            sample = _SAMPLE_OF.get(job.config.recipe.part)
            # a sample's documents are those of the plan's corpus (C4's window line reads its own corpus)
            if sample is not None and job.config.recipe.corpus == self.plan.corpus:
                self._used.setdefault(sample, set()).update(result.manifest["data"]["documents"] or ())
        return results


def analysis_config(plan: Plan, role: RoleName, **changes: Any) -> AnalyzeConfig:
    """The analysis of one sample of the model of `role` under `plan` (num_seqs per sample)."""
    seq_len, num_seqs = plan.size(role)
    options = dict(
        seq_len=seq_len,
        num_seqs=num_seqs,
        batch_size=plan.batch_size,
        bootstrap=plan.bootstrap,
        corpus=plan.corpus,
        cross_documents=plan.cross_documents,
        # windows that run across documents have no document of their own to count
        windows_per_document=None if plan.cross_documents else WINDOWS_PER_DOCUMENT,
        **plan.placement.to_dict(),
    )
    return AnalyzeConfig(**(options | changes))  # `changes` wins (C6 takes its own T, N and BOS)


def sample_config(config: AnalyzeConfig, sample: str) -> AnalyzeConfig:
    """`config` on sample A, B or SELECTION: windows of its part of the documents (`PARTS`); on SELECTION, which
    has half of A's share, half of A's sequences (`selection_seqs`), and no next-token scores: it only chooses
    heads, and no intervention is compared with it."""
    if sample == SELECTION:
        return config.replace(part=PARTS[sample], num_seqs=selection_seqs(config.recipe.num_seqs), scores=False)
    return config.replace(part=PARTS[sample])


def selection_seqs(num_seqs: int) -> int:
    """The sequences of the selection sample when A and B have `num_seqs` each: in proportion to its share, at
    least the fewest an analysis takes."""
    return max(MIN_SEQS, num_seqs * SHARES[2] // SHARES[0])


@dataclass(frozen=True)
class Analysis:
    """One shared analysis: the model of `role` under `interventions`, into OUT/runs/FOLDER-SAMPLE; `key` names
    it in the manifest's runs (with the sample); `null`: on that null of the role's sequences (NULL_KINDS)."""

    key: str
    role: RoleName
    folder: str
    interventions: Interventions = dataclasses.field(default_factory=Interventions)
    null: NullKind | None = None


_SAMPLE_OF = {part: sample for sample, part in PARTS.items()}


def shared_analyses(plan: Plan, sample: str = SHOWN) -> list[Analysis]:
    """The analyses of `sample` that need nothing else, in the order they run: every baseline, the standard model
    under each NTK factor (C4), the BOS baseline and its replacements (C5), then each null of the models C1 and C2
    judge, at their own T and N, where the plan runs the nulls on `sample` (`Plan.nulls_both_samples`)."""
    roles = plan.roles
    standard, bos = roles["standard"], roles["bos"]
    ntk = [
        Analysis(_ntk_key(k), "standard", f"{standard.folder}-ntk{k:g}", Interventions(RopeScaling(f"ntk:{k:g}")))
        for k in plan.ntk_factors
    ]
    replaced = [
        Analysis(_bos_key(kind), "bos", f"{bos.folder}-{kind}", Interventions(ReplaceBos(kind))) for kind in BOS_KINDS
    ]
    plain = {role: Analysis(roles[role].key, role, roles[role].folder) for role in roles}
    nulls = [
        Analysis(_null_key(roles[role].key, kind), role, f"{roles[role].folder}-{kind}", null=kind)
        for role in BASELINE_ROLES
        for kind in NULL_KINDS
        if plan.nulls_both_samples or sample == SHOWN
    ]
    return [plain["standard"], *ntk, plain["large-base"], plain["sliding"], plain["bos"], *replaced, *nulls]


def _ntk_key(factor: float) -> str:
    return f"ntk{factor:g}"


def _bos_key(kind: str) -> str:
    return f"bos-{kind}"


def _null_key(role_key: str, kind: str) -> str:
    return f"{role_key}-{kind}"


@dataclass(frozen=True)
class SampleRuns:
    """The shared analyses of one sample, each by what it is."""

    standard: AnalysisResult
    ntk: dict[float, AnalysisResult]  # the standard model under each NTK factor, by factor
    large_base: AnalysisResult
    sliding: AnalysisResult
    bos_baseline: AnalysisResult
    bos: dict[str, AnalysisResult]  # the BOS replacements, by kind
    # per role of BASELINE_ROLES, its baseline on each null (none where the plan runs no nulls on the sample)
    nulls: dict[RoleName, dict[str, AnalysisResult]]
    keys: tuple[str, ...]  # the manifest key of every run of `named()`, in its order
    roles: Mapping[RoleName, Role]  # the model of each role (the plan's)

    def all(self) -> list[AnalysisResult]:
        """Every shared analysis of the sample, in the order they ran."""
        ntk, bos = list(self.ntk.values()), list(self.bos.values())
        return [self.standard, *ntk, self.large_base, self.sliding, self.bos_baseline, *bos]

    def by_role(self) -> dict[RoleName, AnalysisResult]:
        """The baseline analysis of each role's model."""
        return {
            "standard": self.standard,
            "large-base": self.large_base,
            "sliding": self.sliding,
            "bos": self.bos_baseline,
        }

    def models(self) -> dict[RoleName, dict[str, str]]:
        """Per role, the model's spec and the SHA-256 of its weights as its baseline analysis recorded them."""
        return {
            role: {"spec": self.roles[role].model, "sha256": result.manifest["model"]["sha256"]}
            for role, result in self.by_role().items()
        }

    def corpus(self) -> dict[str, Any]:
        """The corpus the sequences came from as the standard baseline recorded it: its name, the SHA-256 of its
        documents and, for a packaged corpus, its package, version and file SHA-256 (Corpus.origin)."""
        data = self.standard.manifest["data"]
        return {"name": data["source_name"], "sha256": data["source"], "origin": data["source_origin"]}

    def named(self) -> Iterator[tuple[str, AnalysisResult]]:
        """Every shared analysis of the sample with its manifest key: `all()`, then the nulls."""
        nulls = [result for by_kind in self.nulls.values() for result in by_kind.values()]
        return zip(self.keys, [*self.all(), *nulls], strict=True)

    def baselines(self) -> dict[str, AnalysisResult]:
        """The three pretrained models, by the label the evidence gives them (C1, C2, C4)."""
        return {self.roles[role].label: self.by_role()[role] for role in BASELINE_ROLES}

    def baseline_nulls(self) -> dict[str, dict[str, AnalysisResult]]:
        """Per label of `baselines()`, its model's analysis on each null of the same sequences (NULL_KINDS)."""
        return {self.roles[role].label: self.nulls[role] for role in BASELINE_ROLES}

    def ntk_variants(self) -> dict[str, AnalysisResult]:
        """The standard model under each NTK factor, labelled `MODEL ntk:K`."""
        return {f"{self.roles['standard'].label} ntk:{k:g}": result for k, result in self.ntk.items()}

    @property
    def largest_ntk(self) -> AnalysisResult:
        return self.ntk[max(self.ntk)]


def run_shared(repro: Reproduction, compared: Collection[RoleName]) -> dict[str, SampleRuns]:
    """Run (or read back) every shared analysis on both samples; sample A's first, then B's. Next-token scores
    are kept where an intervention is compared with the run: every intervened run, and the baselines of the roles
    `compared` (the claims' `compared_roles`); a null's and any other baseline's are compared with nothing
    (posleak.pipeline.config.MeasureOptions.scores), and leaving them out skips the model's output layer."""
    analyses = {sample: shared_analyses(repro.plan, sample) for sample in SAMPLES}
    roles = repro.plan.roles

    def scored(a: Analysis) -> bool:
        return a.null is None and (not a.interventions.is_empty or a.role in compared)

    jobs = [
        repro.job(
            a.folder,
            roles[a.role].model,
            repro.config(a.role, interventions=a.interventions, null=a.null, scores=scored(a)),
            sample,
        )
        for sample in SAMPLES
        for a in analyses[sample]
    ]
    results = iter(repro.run(jobs))
    runs = {}
    for sample in SAMPLES:
        by_key = {a.key: next(results) for a in analyses[sample]}
        runs[sample] = SampleRuns(
            standard=by_key[roles["standard"].key],
            ntk={k: by_key[_ntk_key(k)] for k in repro.plan.ntk_factors},
            large_base=by_key[roles["large-base"].key],
            sliding=by_key[roles["sliding"].key],
            bos_baseline=by_key[roles["bos"].key],
            bos={kind: by_key[_bos_key(kind)] for kind in BOS_KINDS},
            nulls={
                role: {k: by_key[key] for k in NULL_KINDS if (key := _null_key(roles[role].key, k)) in by_key}
                for role in BASELINE_ROLES
            },
            keys=tuple(f"{a.key}-{sample}" for a in analyses[sample]),
            roles=roles,
        )
    return runs
