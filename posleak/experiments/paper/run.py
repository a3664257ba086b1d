"""`reproduce`: the shared analyses, then each claim module's own measures, judgements, tables and figures."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from posleak.errors import BadInput
from posleak.experiments.paper.behaviour import behaviour_block, behaviour_tables
from posleak.experiments.paper.claim import ClaimModule
from posleak.experiments.paper.claims.plans import QUICK
from posleak.experiments.paper.claims.registry import CLAIMS
from posleak.experiments.paper.corpora import corpus_folder, corpus_problems, side_by_side
from posleak.experiments.paper.effects import add_effects
from posleak.experiments.paper.models import role_problems, role_tokenizers, word_problems
from posleak.experiments.paper.plan import SAMPLES, SHOWN, Plan, RoleName
from posleak.experiments.paper.report import write_outputs, write_top
from posleak.experiments.paper.reproduction import SELECTION, Reproduction, SampleRuns, run_shared
from posleak.experiments.paper.samples import document_problems
from posleak.experiments.paper.verdict import Claim
from posleak.report.html import TableBlock
from posleak.runner import backend_problems
from posleak.store import RunFolder
from posleak.validate import out_folder_problems


def reproduce(
    out: Path | str,
    plan: Plan = QUICK,
    progress: bool = True,
    backend: str = "local",
    address: str | None = None,
    claims: Sequence[type[ClaimModule]] = CLAIMS,
) -> list[Claim]:
    """Run every analysis, judge every claim (`claims`: the registry's, posleak.experiments.paper.claims), write
    `claims.json`, tables and `report.html` into `out`.

    `backend`: "local" runs the analyses here one after another, in the same waves as Ray's (each wave takes
    each model's analyses together, so that it loads once), and the lab trials side by side, one process per core;
    "ray" runs each as a Ray task (posleak.experiments.batch), on a local cluster or the one at `address`, in
    waves: C3's baselines on its selection sample (which choose its heads, and so which shared baselines it compares
    with), then every analysis that needs nothing else, then C3's baselines in the other BOS setting, then C3's
    clock removals, patches and ablations.

    On several corpora (`plan.corpora`), the whole reproduction runs on each, into OUT/corpora/NAME, and OUT's
    claims.json and report.html hold every claim with the corpora side by side (posleak.experiments.paper.corpora)."""
    if problems := reproduction_problems(out, plan, backend):
        raise BadInput(problems)
    out = Path(out)
    if len(plan.corpora) == 1:
        return _reproduce_on(Reproduction(out, plan, progress, backend, address), claims)
    # the whole reproduction on each corpus in its own folder, the lab line once; then the claims side by side
    per_corpus = {}
    for corpus in plan.corpora:
        alone = dataclasses.replace(plan, corpora=(corpus,))
        repro = Reproduction(corpus_folder(out, corpus), alone, progress, backend, address, shared=out)
        per_corpus[corpus] = _reproduce_on(repro, claims)
    claims = side_by_side(per_corpus)
    add_effects(claims)  # pooled within each corpus, from the joined claim's samples
    write_top(RunFolder(out), plan, claims, {"corpus_folders": {c: str(corpus_folder(out, c)) for c in plan.corpora}})
    return claims


def _reproduce_on(repro: Reproduction, claims: Sequence[type[ClaimModule]]) -> list[Claim]:
    """The reproduction on the plan's one corpus, into its folder: the claims judged, their outputs written."""
    modules = [claim(repro) for claim in claims]
    for module in modules:
        module.before_shared()
    runs = run_shared(repro, claims, frozenset().union(*(module.compared_roles() for module in modules)))
    for module in modules:
        module.measure(runs)
    claims = judged_claims(repro, modules, runs)
    add_effects(claims)
    write_outputs(repro, claims, runs)
    return claims


def reproduction_problems(out: Path | str, plan: Plan, backend: str = "local", found: Sequence[str] = ()) -> list[str]:
    """Every problem that stops `reproduce`, found before any work: the output folder, the placement, the
    backend, the corpora (posleak.experiments.paper.corpora), the models in their roles (from their configs and
    tokenizers, posleak.experiments.paper.models) and the documents each sample's part holds for its sequences
    (posleak.experiments.paper.samples), after `found` (the plan's own problems, which the caller has)."""
    problems = [*found, *out_folder_problems(out), *plan.placement.problems(), *backend_problems(backend)]
    problems += corpus_problems(plan) + role_problems(plan)
    if problems:
        return problems
    # the tokenizers are parsed (seconds of CPU each, Gemma's the most) and the corpora tokenized only for a plan
    # that passes every other check: a run already refused is not kept waiting for one more line
    tokenizers = role_tokenizers(plan)
    return word_problems(plan, claim_words(), tokenizers) + document_problems(plan, tokenizers)


def claim_words() -> dict[RoleName, list[str]]:
    """Per role, the words the claims that read it put into its model's inputs as one token each."""
    words: dict[RoleName, list[str]] = {}
    for claim in CLAIMS:
        for role in claim.roles:
            words.setdefault(role, []).extend(claim.words)
    return words


def judged_claims(repro: Reproduction, modules: Sequence[ClaimModule], runs: Mapping[str, SampleRuns]) -> list[Claim]:
    """Every claim judged on each sample, with its tables (written per sample, shown for sample A), its effect on
    the loss, the sentence against the paper and its figures."""
    claims = [
        Claim(m.name, m.statement, m.criterion, {}, m.method, m.family_wise, revisions=list(m.revisions))
        for m in modules
    ]
    shown: dict[str, list[TableBlock]] = {}
    for sample in SAMPLES:
        for module, claim in zip(modules, claims, strict=True):
            claim.samples[sample] = module.judge(runs[sample], sample)
            numbers = module.numbers(sample)
            if numbers:
                claim.numbers[sample] = numbers
            blocks = module.tables(runs[sample], sample)
            if sample == SHOWN:
                shown[module.name] = blocks
        behaviour = behaviour_tables(modules, runs[sample], sample, repro.plan.bootstrap)
        repro.out.write_table(f"behaviour_{sample}", behaviour)
        if sample == SHOWN:
            for module in modules:
                if module.name in set(behaviour["claim"]):
                    shown[module.name].append(behaviour_block(behaviour, module.name, sample))
    models = runs[SHOWN].models()
    documents = {sample: repro.documents(sample) for sample in [*SAMPLES, SELECTION]}
    corpus = {repro.plan.corpus: {**runs[SHOWN].corpus(), "samples": list(SAMPLES), "documents": documents}}
    for module, claim in zip(modules, claims, strict=True):
        claim.once = module.once()  # judged once, not per sample (C4's lab and window line)
        claim.required = module.required_once
        claim.numbers |= {name: numbers for name in claim.once if (numbers := module.numbers(name))}
        claim.models = {role: models[role] for role in module.roles}
        claim.corpora = dict(corpus)
        claim.tables = shown[module.name]
        claim.paper = module.against_paper(claim.samples[SHOWN], runs[SHOWN])
        claim.figures = module.figures(runs[SHOWN])
    return claims
