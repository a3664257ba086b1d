"""Whether every sample of the reproduction can be drawn, found before any work: on each corpus of the plan, for
each draw of sequences an analysis or measure makes (`SampleNeed`: a role's model at a T, N sequences on some
samples), the documents of each sample's part (posleak.experiments.paper.reproduction.PARTS) that hold a window of
T tokens with that model's tokenizer, against N (one window per document: `WINDOWS_PER_DOCUMENT`).

It reads only the tokenizers (`role_tokenizers`, parsed once for the word check too) and tokenizes each corpus once
per tokenizer: the stdlib docstrings in a fraction of a second, the World English Bible in about 2 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from posleak.data.batches import part_documents, pos0_token, token_lengths
from posleak.data.corpus import load_corpus
from posleak.experiments.paper.claims.registry import CLAIMS
from posleak.experiments.paper.plan import ROLE_NAMES, SAMPLES, Plan
from posleak.experiments.paper.reproduction import PARTS, analysis_config
from posleak.experiments.paper.requests import SampleNeed

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def sample_needs(plan: Plan) -> list[SampleNeed]:
    """Every draw of sequences the reproduction makes under `plan`, by what differs in what it needs: each role's
    analyses (its interventions and nulls take the same sequences), then each claim's own draws (`ClaimModule.
    sample_needs`), a draw that two claims make counted once, under the first's words."""
    needs = []
    for role in ROLE_NAMES:
        seq_len, num_seqs = plan.size(role)
        fix = f"the {role} role's num_seqs or seq_len"
        needs.append(SampleNeed(f"the {role} role's analyses", role, seq_len, num_seqs, "auto", SAMPLES, fix))
    once: dict[tuple[object, ...], SampleNeed] = {}
    for need in [*needs, *(need for claim in CLAIMS for need in claim.sample_needs(plan))]:
        once.setdefault(need.draw, need)
    return list(once.values())


def document_problems(plan: Plan, tokenizers: Mapping[str, PreTrainedTokenizerBase]) -> list[str]:
    """One line per sample of a corpus whose part holds fewer documents with a window than a draw of `sample_needs`
    takes sequences (`tokenizers`: each role's model's, by spec). None for windows that cross documents."""
    if plan.cross_documents:
        return []
    seed = analysis_config(plan, "standard").recipe.seed
    problems = []
    by_corpus: dict[str, list[SampleNeed]] = {}
    for need in sample_needs(plan):
        for name in (need.corpus,) if need.corpus else plan.corpora:
            by_corpus.setdefault(name, []).append(need)
    for name, needs in by_corpus.items():
        corpus = load_corpus(name)
        parts = {sample: part_documents(corpus, part, seed) for sample, part in PARTS.items()}
        lengths: dict[str, list[int]] = {}
        for need in needs:
            spec = plan.roles[need.role].model
            tokenizer = tokenizers[spec]
            if spec not in lengths:
                lengths[spec] = token_lengths(corpus, tokenizer)
            content = need.seq_len - (pos0_token(tokenizer, need.bos) is not None)
            for sample in need.samples:
                holding = sum(lengths[spec][k] >= content for k in parts[sample])
                if holding < need.num_seqs:
                    problems.append(
                        f"corpus {name!r}, sample {sample}: only {holding} of its documents hold a window of "
                        f"{need.seq_len} tokens of {spec} for {need.what}, which takes {need.num_seqs} (one window "
                        f"per document); lower {need.fix} in a plan file to fit, or use a larger corpus"
                    )
    return list(dict.fromkeys(problems))
