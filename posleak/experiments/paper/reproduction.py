"""The job plumbing of `posleak paper`: the analyses the claims share, run or resumed as `AnalysisJob`s into
OUT/runs on a backend (each claim's `Request`s, merged: posleak.experiments.paper.requests), and their results per
sample by request (`SampleRuns`).

Every analysis runs on each of two samples of sequences (A and B) that share no document: the corpus's documents
are dealt into three parts by the seed in the proportions 2:2:1 (`SHARES`, posleak.data.batches.part_documents), A's
sequences are windows of the first part's documents, B's of the second's, and C3 chooses its heads on the third
(`SELECTION`), which judges nothing and takes half of A's sequences. Each sequence is a window of a document of its
own (`WINDOWS_PER_DOCUMENT`), so a sample of N sequences is N documents, the units its intervals resample. The deal
does not depend on the model or on T, so no analysis of sample A shares a document with one of sample B, whatever
their models; which documents each sample's runs used is read from their manifests (`Reproduction.documents`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from posleak.data.batches import TokenBatch
from posleak.data.kinds import Part
from posleak.experiments.batch import AnalysisJob, ModelCache, draw_sequences, run_analyses
from posleak.experiments.paper.plan import ROLE_NAMES, SAMPLES, Plan, Role, RoleName
from posleak.experiments.paper.requests import Request
from posleak.interventions import Interventions
from posleak.models.load import LoadedModel
from posleak.pipeline import AnalysisResult, AnalyzeConfig
from posleak.pipeline.config import MIN_SEQS
from posleak.store import RunFolder

SELECTION = "selection"  # the sample that chooses sink heads (C3's, C6's), which judges nothing
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


_SAMPLE_OF = {part: sample for sample, part in PARTS.items()}


def shared_requests(plan: Plan, claims: Iterable[type[ClaimRequests]], sample: str) -> list[Request]:
    """The analyses of `sample` that need nothing else, each once, in the order they run (`requests.merged`):
    every role's baseline, then each claim's requests (`ClaimModule.requests`)."""
    baselines = [Request(role.key, name, role.folder) for name, role in plan.roles.items()]
    return merged([*baselines, *(r for claim in claims for r in claim.requests(plan, sample))])


def merged(requests: Iterable[Request]) -> list[Request]:
    """Each analysis of `requests` once (by key), in the order they run (`_run_order`); two different analyses under
    one key are refused."""
    by_key: dict[str, Request] = {}
    for request in requests:
        known = by_key.setdefault(request.key, request)
        if known != request:
            raise ValueError(f"two analyses are requested as {request.key!r}: {known} and {request}")
    return sorted(by_key.values(), key=_run_order)


def _run_order(request: Request) -> tuple[bool, int, bool]:
    """Where a request runs among a sample's analyses: the nulls last, the others by role, each role's baseline
    before its intervened runs (else as asked)."""
    return request.null is not None, ROLE_NAMES.index(request.role), not request.interventions.is_empty


class ClaimRequests(Protocol):
    """What the plumbing asks of a claim's class: the shared analyses it reads (claim.ClaimModule.requests)."""

    @classmethod
    def requests(cls, plan: Plan, sample: str) -> list[Request]: ...


@dataclass(frozen=True)
class SampleRuns:
    """The shared analyses of one sample: each request's result, by the request's key."""

    requests: tuple[Request, ...]  # in the order they ran
    results: tuple[AnalysisResult, ...]  # of each request
    sample: str
    roles: Mapping[RoleName, Role]  # the model of each role (the plan's)

    def __getitem__(self, key: str) -> AnalysisResult:
        return self.results[[r.key for r in self.requests].index(key)]

    def get(self, key: str) -> AnalysisResult | None:
        """The result of the request `key`, or None where it did not run on this sample."""
        return self[key] if any(r.key == key for r in self.requests) else None

    def baseline(self, role: RoleName) -> AnalysisResult:
        """The baseline analysis of the model of `role`."""
        return self[self.roles[role].key]

    def all(self) -> list[AnalysisResult]:
        """Every shared analysis of the sample but those on a null, in the order they ran."""
        return [result for r, result in zip(self.requests, self.results, strict=True) if r.null is None]

    def by_role(self) -> dict[RoleName, AnalysisResult]:
        """The baseline analysis of each role's model."""
        return {role: self.baseline(role) for role in self.roles}

    def models(self) -> dict[RoleName, dict[str, str]]:
        """Per role, the model's spec and the SHA-256 of its weights as its baseline analysis recorded them."""
        return {
            role: {"spec": self.roles[role].model, "sha256": result.manifest["model"]["sha256"]}
            for role, result in self.by_role().items()
        }

    def corpus(self) -> dict[str, Any]:
        """The corpus the sequences came from as the standard baseline recorded it: its name, the SHA-256 of its
        documents and, for a packaged corpus, its package, version and file SHA-256 (Corpus.origin)."""
        data = self.baseline("standard").manifest["data"]
        return {"name": data["source_name"], "sha256": data["source"], "origin": data["source_origin"]}

    def named(self) -> Iterator[tuple[str, AnalysisResult]]:
        """Every shared analysis of the sample with its manifest key (the request's, with the sample)."""
        return zip([f"{r.key}-{self.sample}" for r in self.requests], self.results, strict=True)


def run_shared(
    repro: Reproduction, claims: Iterable[type[ClaimRequests]], compared: Collection[RoleName]
) -> dict[str, SampleRuns]:
    """Run (or read back) every shared analysis the `claims` request on both samples; sample A's first, then B's.
    Next-token scores are kept where an intervention is compared with the run: every intervened run, and the
    baselines of the roles `compared` (the claims' `compared_roles`); a null's and any other baseline's are compared
    with nothing (posleak.pipeline.config.MeasureOptions.scores), and leaving them out skips the model's output
    layer."""
    requests = {sample: shared_requests(repro.plan, claims, sample) for sample in SAMPLES}
    roles = repro.plan.roles

    def scored(r: Request) -> bool:
        return r.null is None and (not r.interventions.is_empty or r.role in compared)

    jobs = [
        repro.job(
            r.folder,
            roles[r.role].model,
            repro.config(r.role, interventions=r.interventions, null=r.null, scores=scored(r)),
            sample,
        )
        for sample in SAMPLES
        for r in requests[sample]
    ]
    results = iter(repro.run(jobs))
    return {
        sample: SampleRuns(tuple(requests[sample]), tuple(next(results) for _ in requests[sample]), sample, roles)
        for sample in SAMPLES
    }
