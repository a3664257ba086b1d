"""Whether every sample of the reproduction can be drawn, found before any work: on each corpus of the plan, for
each draw of sequences an analysis or measure makes (`SampleNeed`: a role's model at a T, N sequences on some
samples), the documents of each sample's part (posleak.experiments.paper.reproduction.PARTS) that hold a window of
T tokens with that model's tokenizer, against N (one window per document: `WINDOWS_PER_DOCUMENT`).

It reads only the tokenizers (`role_tokenizers`, parsed once for the word check too) and tokenizes each corpus once
per tokenizer: the stdlib docstrings in a fraction of a second, the World English Bible in about 2 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posleak.data.batches import part_documents, pos0_token, token_lengths
from posleak.data.corpus import load_corpus
from posleak.data.kinds import BosPolicy
from posleak.experiments.paper.c3_units import C3_ROLES
from posleak.experiments.paper.c6_probe import FINGERPRINT_SEQ_LEN, PROBE_ROLES
from posleak.experiments.paper.plan import ROLE_NAMES, SAMPLES, WINDOW_ROLES, Plan, RoleName
from posleak.experiments.paper.reproduction import PARTS, SELECTION, analysis_config, selection_seqs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class SampleNeed:
    """`num_seqs` sequences of `seq_len` tokens under `bos` for the model of `role`, on each of `samples`: `what`
    draws them, and `fix` is what a plan file lowers when a sample's part holds too few documents."""

    what: str
    role: RoleName
    seq_len: int
    num_seqs: int
    bos: BosPolicy
    samples: tuple[str, ...]
    fix: str
    corpus: str | None = None  # the corpus it draws from; None: each corpus of the plan


def sample_needs(plan: Plan) -> list[SampleNeed]:
    """Every draw of sequences the reproduction makes under `plan`, by what differs in what it needs: each role's
    analyses (its interventions and nulls take the same sequences), C3's baselines on the selection sample (and,
    where the plan runs C3 in both BOS settings, without a BOS: a window of T content tokens, the longer), C4's
    window line (both models at its T, on its corpus) where the plan measures it, and C6's probe and its choice of
    heads on the selection sample (without a BOS, again the longer)."""
    needs = []
    for role in ROLE_NAMES:
        seq_len, num_seqs = plan.size(role)
        fix = f"the {role} role's num_seqs or seq_len"
        needs.append(SampleNeed(f"the {role} role's analyses", role, seq_len, num_seqs, "auto", SAMPLES, fix))
        if role in C3_ROLES:
            selection, sink_t = selection_seqs(num_seqs), plan.sink_seq_len
            what = f"C3's and C6's selection of the {role} model's sink heads"
            needs.append(SampleNeed(what, role, sink_t, selection, "auto", (SELECTION,), fix))
            if plan.c3_both_bos:
                what = f"C3's {role} model without a BOS"
                needs.append(SampleNeed(what, role, seq_len, num_seqs, "off", SAMPLES, fix))
                needs.append(SampleNeed(what, role, sink_t, selection, "off", (SELECTION,), fix))
    if plan.window_seq_len is not None:
        seq_len, num_seqs, fix = plan.window_seq_len, plan.window_num_seqs, "window_num_seqs or window_seq_len"
        for role in WINDOW_ROLES:
            what = f"C4's window line ({role} model)"
            needs.append(SampleNeed(what, role, seq_len, num_seqs, "auto", SAMPLES, fix, plan.window_corpus))
    for role in PROBE_ROLES:  # any may be probed: whether its tokenizer prepends a BOS is known once it is loaded
        what = f"C6's probe of the {role} model"
        needs.append(
            SampleNeed(what, role, FINGERPRINT_SEQ_LEN, plan.fingerprint_seqs, "off", SAMPLES, "fingerprint_seqs")
        )
        if role not in C3_ROLES:  # C3's roles share their selection baseline with C6 (above)
            seq_len, num_seqs = plan.size(role)
            what, fix = f"C6's selection of the {role} model's sink heads", f"the {role} role's num_seqs"
            needs.append(SampleNeed(what, role, plan.sink_seq_len, selection_seqs(num_seqs), "auto", (SELECTION,), fix))
    return needs


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
