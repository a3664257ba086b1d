"""The reproduction on several corpora (`posleak paper --corpus NAME ...`; the full plan's stdlib and bible-web).

Each corpus runs the whole reproduction with that corpus alone, into OUT/corpora/NAME/ (its own claims.json, report.html
and run folders), except C4's lab line, which trains on its own data whatever the corpus and runs once, into OUT/lab,
shared, and is judged once (`Claim.once`, taken from the first corpus). OUT's claims.json then holds every claim once,
with each corpus's samples side by side (`side_by_side`: samples "stdlib A", "stdlib B", "bible-web A", ...; `corpora`
names each corpus's samples and provenance), and its verdict over the corpora by `verdict.across_corpora`
(docs/method.md §13). A plan of one corpus keeps the layout of a plain run (everything in OUT, samples "A" and "B").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from posleak.data.corpus import load_corpus
from posleak.experiments.batch import safe_name
from posleak.experiments.paper.plan import Plan
from posleak.experiments.paper.verdict import Claim
from posleak.report.html import FigureBlock
from posleak.validate import Problems

CORPORA = "corpora"  # OUT's folder of the per-corpus reproductions


def corpus_folder(out: Path, corpus: str) -> Path:
    """Where the reproduction on `corpus` runs when the plan has several: OUT/corpora/NAME (the spec made safe)."""
    return out / CORPORA / (safe_name(corpus) or "corpus")


def corpus_problems(plan: Plan) -> list[str]:
    """Every problem of the plan's corpora, before any work: a corpus named twice, two whose folders would be one,
    and each corpus's own, found by reading it (an unknown name, a missing file, a package not installed or not
    the pinned one): seconds, and each is read again, from the cache, by the analyses that draw from it."""
    problems = Problems()
    folders: dict[Path, str] = {}
    for corpus in plan.corpora:
        folder = corpus_folder(Path(), corpus)
        if corpus in folders.values():
            problems.add(f"--corpus {corpus!r} is named twice; name each corpus once")
            continue
        if folder in folders:
            problems.add(
                f"corpora {folders[folder]!r} and {corpus!r} would share the folder {folder}; rename one of them"
            )
        folders.setdefault(folder, corpus)
        with problems.collecting():
            load_corpus(corpus)
    return problems.found


def side_by_side(claims: Mapping[str, Sequence[Claim]]) -> list[Claim]:
    """Each claim once, from its judgement on each corpus (`claims`, per corpus in claim order): every corpus's
    samples, numbers, tables and figures, named after the corpus, in the corpora's order."""
    by_claim = zip(*claims.values(), strict=True)
    return [_joined(dict(zip(claims, same, strict=True))) for same in by_claim]


def _joined(claims: Mapping[str, Claim]) -> Claim:
    """One claim judged on each corpus, as one claim whose verdict is `across_corpora` of theirs."""
    first = next(iter(claims.values()))
    joined = Claim(
        first.claim, first.statement, first.criterion, {}, first.method, first.family_wise, revisions=first.revisions
    )
    joined.models = first.models  # the same models read every corpus
    # the parts judged once (C4's lab) do not depend on the corpus: its models train on their own data, once
    joined.once, joined.required = first.once, first.required
    joined.numbers = {name: first.numbers[name] for name in first.once if name in first.numbers}
    papers = []
    for corpus, claim in claims.items():
        names = {sample: f"{corpus} {sample}" for sample in claim.samples}
        joined.samples |= {names[s]: judgement for s, judgement in claim.samples.items()}
        joined.numbers |= {names[s]: numbers for s, numbers in claim.numbers.items() if s in names}
        documents = {f"{corpus} {s}": titles for s, titles in claim.corpora[corpus].get("documents", {}).items()}
        joined.corpora[corpus] = {**claim.corpora[corpus], "samples": list(names.values()), "documents": documents}
        joined.tables += [dataclasses.replace(t, title=f"{corpus}: {t.title}") for t in claim.tables]
        joined.figures += [FigureBlock(_path(f), f"corpus {corpus}") for f in claim.figures]
        papers.append(f"On {corpus}: {claim.paper}")
    joined.paper = " ".join(papers)
    return joined


def _path(figure: Path | FigureBlock) -> Path:
    return figure.path if isinstance(figure, FigureBlock) else figure
