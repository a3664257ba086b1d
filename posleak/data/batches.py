"""Token sequences for analysis: windows cut from a corpus under an explicit BOS policy, or a token file.

Documents are tokenised without special tokens and the BOS is added here, so that what sits at
position 0 is always a decision of the policy and never a side effect of the tokenizer:

- ``on``: every row is BOS + (T − 1) content tokens; an error when the tokenizer has no BOS.
- ``off``: every row is T content tokens, never a BOS.
- ``auto``: ``on`` when the tokenizer prepends its BOS by itself (Gemma does), else ``off``
  (SmolLM2 and Qwen have a BOS token but do not prepend it).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from posleak.data.bos import tokenizer_prepends_bos
from posleak.data.corpus import Corpus
from posleak.data.kinds import BOS_POLICIES, VERBATIM, BosPolicy, NullKind, Part, Verbatim
from posleak.errors import BadInput, PosleakError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class TokenBatch:
    """N sequences of T token ids, with what position 0 holds and where the tokens came from."""

    ids: torch.Tensor  # LongTensor N×T
    bos: BosPolicy | Verbatim  # the BOS policy as requested, or verbatim for a token file
    bos_id: int | None  # the BOS at position 0 of every row (put there, or found in a token file); else None
    pos0_token_ids: torch.Tensor  # LongTensor N: the token actually at position 0 of each row
    source: str  # corpus fingerprint or SHA-256 of the token file
    source_name: str  # corpus name or token file path
    seed: int | None  # the window-selection seed; None for a token file
    null: NullKind | None = None  # when this is a null of another batch
    null_seed: int | None = None
    source_origin: str | None = None  # a packaged corpus's package, version and file SHA-256 (Corpus.origin)
    # the title of each row's document (Corpus.titles); None where a row can span documents or none is known (a
    # token file): the bootstrap resamples documents where it knows them (posleak.measure.bootstrap)
    documents: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.ids.dim() != 2 or self.ids.dtype != torch.long:
            raise ValueError(f"TokenBatch.ids must be a 2-D LongTensor, got {self.ids.dtype} {tuple(self.ids.shape)}")
        if self.documents is not None and len(self.documents) != self.ids.shape[0]:
            raise ValueError(f"TokenBatch.documents names {len(self.documents)} documents for {self.ids.shape[0]} rows")

    @property
    def num_seqs(self) -> int:
        return self.ids.shape[0]

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1]

    def provenance(self) -> dict[str, Any]:
        distinct = torch.unique(self.pos0_token_ids)
        return {
            "bos": self.bos,
            "bos_id": self.bos_id,
            # One id when every row starts with the same token (a BOS), else how many differ.
            "pos0_token_id": int(distinct[0]) if len(distinct) == 1 else None,
            "pos0_distinct_tokens": len(distinct),
            "seq_len": self.seq_len,
            "num_seqs": self.num_seqs,
            "source": self.source,
            "source_name": self.source_name,
            "seed": self.seed,
            "null": self.null,
            "null_seed": self.null_seed,
            "source_origin": self.source_origin,
            "documents": None if self.documents is None else list(self.documents),
        }


def pos0_token(tokenizer: PreTrainedTokenizerBase, bos: BosPolicy) -> int | None:
    """The BOS id the BOS policy `bos` puts at position 0, or None when position 0 holds the first content token."""
    if bos not in BOS_POLICIES:
        raise PosleakError(f"unknown BOS policy '{bos}'; use one of {', '.join(BOS_POLICIES)}")
    bos_id = tokenizer.bos_token_id
    if bos == "on" and bos_id is None:
        raise PosleakError(
            f"BOS requested (bos=on) but tokenizer {type(tokenizer).__name__} has no BOS token; use bos=off or auto"
        )
    if bos == "on" or (bos == "auto" and tokenizer_prepends_bos(tokenizer)):
        return bos_id
    return None


def make_sequences(
    corpus: Corpus,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    num_seqs: int,
    bos: BosPolicy = "auto",
    seed: int = 0,
    cross_documents: bool = False,
    max_len: int | None = None,
    part: Part | None = None,
    windows_per_document: int | None = None,
) -> TokenBatch:
    """`num_seqs` rows of `seq_len` tokens: non-overlapping windows of the corpus, picked by `seed`.

    Each document gives as many windows as it holds whole (its tail is dropped), so no window
    crosses a document boundary unless `cross_documents`, where the documents form one stream
    joined by the tokenizer's EOS. A larger `num_seqs` with the same seed extends the smaller set.
    `part` (index, shares): the windows of the documents of that part only (`part_documents`), so that the
    parts of one corpus and seed share no document.
    `windows_per_document` K: at most K windows of each document, drawn in rounds (`_in_rounds`): one window of
    every document, the documents in an order drawn by `seed`, before any second one, so that with K = 1 the rows
    are windows of `num_seqs` distinct documents, each document as likely as another. None: the windows are drawn
    among all of them, a document as likely as the windows it holds (the draw before K existed, kept as it was).
    """
    _check_shape(seq_len, num_seqs, max_len)
    if cross_documents and windows_per_document is not None:
        raise PosleakError("windows per document need documents kept apart; drop cross_documents or the limit")
    bos_id = pos0_token(tokenizer, bos)
    content_len = seq_len - (bos_id is not None)
    kept = part_documents(corpus, part, seed)
    streams = _token_streams(corpus, kept, tokenizer, cross_documents)
    doc_index, starts = _windows(streams, content_len)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(starts), generator=generator).numpy()
    if windows_per_document is not None:
        order = _in_rounds(order, doc_index, len(streams), windows_per_document, generator)
    if len(order) < num_seqs:
        where = _whose(corpus, part)
        if windows_per_document is None:
            raise _too_short(where, streams, seq_len, len(order), cross_documents)
        raise _too_few_documents(where, seq_len, len(np.unique(doc_index)), len(order), windows_per_document)
    chosen = order[:num_seqs]
    documents = None if cross_documents else tuple(corpus.titles[kept[doc_index[k]]] for k in chosen)
    rows = [streams[doc_index[k]][starts[k] : starts[k] + content_len] for k in chosen]
    ids = torch.tensor(rows, dtype=torch.long).reshape(num_seqs, content_len)
    if bos_id is not None:
        ids = torch.cat([torch.full((num_seqs, 1), bos_id, dtype=torch.long), ids], dim=1)
    return TokenBatch(
        ids=ids,
        bos=bos,
        bos_id=bos_id,
        pos0_token_ids=ids[:, 0].clone(),
        source=corpus.fingerprint,
        source_name=corpus.name,
        seed=seed,
        source_origin=corpus.origin,
        documents=documents,
    )


def part_documents(corpus: Corpus, part: Part | None, seed: int) -> list[int]:
    """The indices, in corpus order, of the documents of part `index` of a deal in the proportions `shares` (all
    of them for None), so that the parts hold disjoint documents.

    The documents are ranked by length (characters; among equal lengths in an order drawn by `seed`) and dealt
    in blocks of sum(shares) neighbours in that ranking, each block's seats given to the parts by `seed`, each part
    as many seats as its share. Whatever the tokenizer and the window length T, the documents long enough for a
    window of T tokens are nearly a prefix of the ranking, so every part gets close to its share of them (not of
    the corpus's documents, most of which can be too short at a large T): the stdlib docstrings and the World
    English Bible with the built-in tokenizers at 256 ≤ T ≤ 768 and shares 2:2:1, within 2 documents of the exact
    share at 20 seeds (the deal does not depend on the tokenizer, so one deal serves every model)."""
    if part is None:
        return list(range(len(corpus)))
    index, shares = part
    seats = [k for k, share in enumerate(shares) for _ in range(share)]  # one block: each part's share
    if len(corpus) < len(seats):
        raise PosleakError(
            f"corpus '{corpus.name}' has {len(corpus)} documents, too few to deal into parts of shares "
            f"{_ratio(shares)}; use a corpus of at least {len(seats)} documents"
        )
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randperm(len(corpus), generator=generator).tolist()
    ranked = sorted(drawn, key=lambda k: -len(corpus.documents[k]))  # a stable sort: equal lengths stay drawn
    mine = []
    for start in range(0, len(ranked), len(seats)):
        block = ranked[start : start + len(seats)]
        dealt = torch.randperm(len(seats), generator=generator).tolist()
        mine += [doc for doc, seat in zip(block, dealt, strict=False) if seats[seat] == index]
    return sorted(mine)


def _ratio(shares: tuple[int, ...]) -> str:
    return ":".join(map(str, shares))


def token_lengths(corpus: Corpus, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The length in tokens of each document of `corpus`, as `make_sequences` tokenizes it (without crossing
    documents): a document holds a window of `seq_len` tokens when its length is at least the window's content."""
    return [len(stream) for stream in _token_streams(corpus, list(range(len(corpus))), tokenizer, False)]


def _check_shape(seq_len: int, num_seqs: int, max_len: int | None) -> None:
    problems = shape_problems(seq_len, num_seqs, max_len)
    if problems:
        raise BadInput(problems)


def shape_problems(seq_len: int, num_seqs: int | None, max_len: int | None) -> list[str]:
    """What is wrong with asking for `num_seqs` (None: not checked) rows of `seq_len` tokens."""
    problems = []
    # Position 0 alone says nothing about position; every measurement needs a query i ≥ 1.
    if seq_len < 2:
        problems.append(f"sequence length {seq_len} is too short; use a seq_len of at least 2")
    if num_seqs is not None and num_seqs < 1:
        problems.append(f"number of sequences {num_seqs} is below 1; ask for at least one sequence")
    if max_len is not None and seq_len > max_len:
        problems.append(
            f"sequence length {seq_len} is longer than the model allows ({max_len} positions); "
            f"lower seq_len to at most {max_len}"
        )
    return problems


def _token_streams(
    corpus: Corpus, kept: list[int], tokenizer: PreTrainedTokenizerBase, cross_documents: bool
) -> list[list[int]]:
    """The token ids of the documents `kept` (indices), or with `cross_documents` one stream of them all."""
    # split_special_tokens: text that spells a special token ("<bos>" in a document) stays text, so
    # a BOS id appears only where the policy puts one. verbose=False: a document longer than the
    # model's maximum is fine here, it is cut into windows.
    documents = [corpus.documents[k] for k in kept]
    encoded = tokenizer(documents, add_special_tokens=False, split_special_tokens=True, verbose=False)
    streams = encoded["input_ids"]
    if not cross_documents:
        return streams
    eos = tokenizer.eos_token_id
    if eos is None:
        raise PosleakError(
            f"cross_documents needs an EOS token between documents and tokenizer {type(tokenizer).__name__} "
            "has none; keep documents separate"
        )
    joined: list[int] = []
    for k, stream in enumerate(streams):
        joined.extend([eos] * (k > 0) + stream)
    return [joined]


def _windows(streams: list[list[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(document index, start) of every whole, non-overlapping window, in document order."""
    counts = np.array([len(stream) // length for stream in streams], dtype=np.int64)
    doc_index = np.repeat(np.arange(len(streams)), counts)
    first_of_doc = np.repeat(np.cumsum(counts) - counts, counts)
    starts = (np.arange(int(counts.sum())) - first_of_doc) * length
    return doc_index, starts


def _in_rounds(
    order: np.ndarray, doc_index: np.ndarray, documents: int, per_document: int, generator: torch.Generator
) -> np.ndarray:
    """The windows of `order` (every window, in a random order), at most `per_document` of each document, in
    rounds: round r holds the r-th window in `order` of each document that has one, the documents in an order drawn
    by `generator` and the same in every round."""
    place = np.empty_like(order)
    place[order] = np.arange(len(order))
    # `doc_index` is sorted: sorting by (document, place) keeps each document's windows where they were
    by_document = np.lexsort((place, doc_index))
    rounds = np.empty_like(order)
    rounds[by_document] = np.arange(len(order)) - np.searchsorted(doc_index, doc_index[by_document])
    rank = torch.randperm(documents, generator=generator).numpy()[doc_index]
    kept = np.flatnonzero(rounds < per_document)
    return kept[np.lexsort((rank[kept], rounds[kept]))]


def _whose(corpus: Corpus, part: Part | None) -> str:
    if part is None:
        return f"corpus '{corpus.name}'"
    index, shares = part
    return f"part {index + 1} of corpus '{corpus.name}' (its share {shares[index]} of {_ratio(shares)})"


def _too_short(
    whose: str, streams: list[list[int]], seq_len: int, available: int, cross_documents: bool
) -> PosleakError:
    longest = max((len(stream) for stream in streams), default=0)
    where, crossing = ("", "") if cross_documents else (" without crossing documents", ", cross documents")
    return PosleakError(
        f"{whose} holds only {available} sequences of {seq_len} tokens{where} "
        f"(its longest document has {longest} tokens); lower num_seqs to at most {available}, "
        f"lower seq_len{crossing} or use a larger corpus"
    )


def _too_few_documents(whose: str, seq_len: int, documents: int, available: int, per_document: int) -> PosleakError:
    each = "one window" if per_document == 1 else f"at most {per_document} windows"
    return PosleakError(
        f"{whose} has only {documents} documents that hold a window of {seq_len} tokens, {each} of each: "
        f"{available} sequences; lower num_seqs to at most {available}, lower seq_len, allow more windows per "
        "document or use a larger corpus"
    )


def load_token_file(
    path: str | Path, vocab_size: int | None = None, max_len: int | None = None, bos_id: int | None = None
) -> TokenBatch:
    """A `.npy` integer array N×T taken verbatim: no BOS added or removed, no windows chosen.

    When every row starts with `bos_id` (the tokenizer's BOS), the batch records it as a BOS at position 0,
    as if the BOS policy had put it there.
    """
    path = Path(path)
    if not path.is_file():
        raise PosleakError(f"token file '{path}' does not exist; pass a .npy file of token ids (N×T)")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PosleakError(
            f"token file '{path}' is not a readable .npy array ({reason}); save it with numpy.save"
        ) from err
    _check_token_array(path, array, vocab_size)
    _check_shape(array.shape[1], array.shape[0], max_len)
    ids = torch.from_numpy(array.astype(np.int64))
    found_bos = bos_id is not None and bool((ids[:, 0] == bos_id).all())
    return TokenBatch(
        ids=ids,
        bos=VERBATIM,
        bos_id=bos_id if found_bos else None,
        pos0_token_ids=ids[:, 0].clone(),
        source=hashlib.sha256(path.read_bytes()).hexdigest(),
        source_name=str(path),
        seed=None,
    )


def _check_token_array(path: Path, array: np.ndarray, vocab_size: int | None) -> None:
    if array.ndim != 2:
        raise PosleakError(f"token file '{path}' has shape {array.shape}; save a 2-D array N×T of token ids")
    if not np.issubdtype(array.dtype, np.integer):
        raise PosleakError(f"token file '{path}' has dtype {array.dtype}; save integer token ids (int32 or int64)")
    if array.size == 0:
        raise PosleakError(f"token file '{path}' is empty (shape {array.shape}); save at least one sequence")
    low, high = int(array.min()), int(array.max())
    limit = vocab_size if vocab_size is not None else np.iinfo(np.int64).max
    if low < 0 or high >= limit:
        raise PosleakError(
            f"token file '{path}' holds ids from {low} to {high}, outside [0, {limit}); "
            "save ids of this model's vocabulary"
        )


def iter_batches(batch: TokenBatch, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(sequence indices, ids) chunks in input order: the indices say which sequence each captured row is."""
    if batch_size < 1:
        raise PosleakError(f"batch size {batch_size} is below 1; use a batch size of at least 1")
    for start in range(0, batch.num_seqs, batch_size):
        stop = min(start + batch_size, batch.num_seqs)
        yield torch.arange(start, stop), batch.ids[start:stop]


def without_bos(batch: TokenBatch) -> TokenBatch:
    """The same rows with the BOS at position 0 removed (T − 1 tokens): `--bos off` as an intervention."""
    if batch.bos_id is None:
        raise PosleakError("--bos off as an intervention needs a tokenizer with a BOS token to remove")
    ids = batch.ids[:, 1:]
    return dataclasses.replace(batch, ids=ids, bos="off", bos_id=None, pos0_token_ids=ids[:, 0].clone())
