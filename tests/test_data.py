"""Tests of posleak.data: corpora, token sequences under each BOS policy, token files and nulls.

The tokenizers are real (Hugging Face `tokenizers` byte-level BPE wrapped in PreTrainedTokenizerFast),
trained here on a few stdlib docstrings, in the three shapes that matter for position 0: a BOS that
is prepended (like Gemma), a BOS that is not (like SmolLM2 and Qwen), and no BOS at all.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from cli import assert_one_line_error, run_main
from tiny import tiny_checkpoint, word_corpus
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from posleak.data.batches import (
    TokenBatch,
    iter_batches,
    load_token_file,
    make_sequences,
    part_documents,
    pos0_token,
)
from posleak.data.bos import tokenizer_prepends_bos
from posleak.data.corpus import MIN_DOCSTRING_CHARS, Corpus, fingerprint_documents, load_corpus, make_corpus
from posleak.data.nulls import make_null
from posleak.data.recipe import Recipe
from posleak.errors import PosleakError

SPECIALS = ["<pad>", "<bos>", "<eos>"]
BOS_ID, EOS_ID = 1, 2


@pytest.fixture(scope="module")
def stdlib() -> Corpus:
    return load_corpus("stdlib")


@pytest.fixture(scope="module")
def small(stdlib: Corpus) -> Corpus:
    return make_corpus("small", stdlib.documents[:40])


@pytest.fixture(scope="module")
def trained(stdlib: Corpus) -> str:
    """A byte-level BPE trained on stdlib docstrings, serialised so each variant gets its own copy."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib.documents[:40], trainer)
    return tokenizer.to_str()


def _wrap(serialised: str, prepend: bool, **special_tokens: str) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer.from_str(serialised)
    if prepend:
        tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special_tokens)


@pytest.fixture(scope="module")
def tokenizers(trained: str) -> dict[str, PreTrainedTokenizerFast]:
    return {
        "prepends": _wrap(trained, prepend=True, bos_token="<bos>", eos_token="<eos>"),  # like Gemma
        "silent": _wrap(trained, prepend=False, bos_token="<bos>", eos_token="<eos>"),  # like SmolLM2
        "none": _wrap(trained, prepend=False, eos_token="<eos>"),  # no BOS at all
        "bare": _wrap(trained, prepend=False),  # neither BOS nor EOS
    }


def _streams(corpus: Corpus, tokenizer: PreTrainedTokenizerFast) -> list[list[int]]:
    """Each document re-tokenised on its own, the reference the batches are checked against."""
    return [tokenizer.encode(doc, add_special_tokens=False, split_special_tokens=True) for doc in corpus.documents]


def _content(batch: TokenBatch) -> torch.Tensor:
    return batch.ids[:, 1:] if batch.bos_id is not None else batch.ids


# Corpora ------------------------------------------------------------------------------------------


def test_stdlib_corpus_is_long_prose_and_deterministic(stdlib: Corpus) -> None:
    assert 100 <= len(stdlib) <= 300  # one document per module
    assert min(len(doc) for doc in stdlib) >= 400
    assert stdlib.num_chars > 300_000
    assert len(set(stdlib.documents)) == len(stdlib)
    # each document titled by its module, in sorted order of the module names
    assert "json" in stdlib.titles and list(stdlib.titles) == sorted(stdlib.titles)
    assert stdlib.fingerprint == fingerprint_documents(stdlib.documents)
    assert load_corpus() is stdlib  # built once per process
    # A fresh interpreter, which has imported none of what pytest and transformers bring, agrees.
    code = "from posleak.data.corpus import load_corpus; print(load_corpus().fingerprint)"
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == stdlib.fingerprint


def test_stdlib_corpus_ignores_stdlib_functions_replaced_by_a_library(stdlib: Corpus) -> None:
    """A process in which a library replaced a stdlib function (importing Ray replaces inspect.isgenerator, whose
    docstring is in the corpus) builds the same corpus: lab models trained on Ray workers see the same text."""
    code = (
        "import inspect; original = inspect.isgenerator; inspect.isgenerator = lambda obj: original(obj); "
        "from posleak.data.corpus import load_corpus; print(load_corpus().fingerprint)"
    )
    patched = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert patched.stdout.strip() == stdlib.fingerprint
    # so its absence would show; asked of a fresh interpreter: this one may have imported Ray (another test's
    # cluster), which replaces inspect.isgenerator here too
    doc = "import inspect; print(len(inspect.getdoc(inspect.isgenerator)))"
    length = subprocess.run([sys.executable, "-c", doc], capture_output=True, text=True, check=True).stdout
    assert int(length) >= MIN_DOCSTRING_CHARS


def test_stdlib_corpus_is_not_shadowed_by_files_named_like_stdlib_modules(stdlib: Corpus, tmp_path: Path) -> None:
    """A script whose folder holds `nntplib.py` (a stdlib module) and `nt.py` (a stdlib name of another platform)
    builds the same corpus, and neither file is imported: the stdlib is searched first and a stand-in is
    refused before it runs."""
    marker = tmp_path / "imported"
    for name in ("nntplib", "nt"):
        shadow = '"""' + "A module that is not the standard library's. " * 12 + '"""\n'
        (tmp_path / f"{name}.py").write_text(shadow + f"open({str(marker)!r}, 'a').write({name!r})\n")
    script = tmp_path / "build_corpus.py"  # its folder comes first on its path
    script.write_text("from posleak.data.corpus import load_corpus\nprint(load_corpus().fingerprint)\n")
    root = str(Path(__file__).resolve().parents[1])  # posleak, whether installed or not
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", ""), "PYTHONPATH": root}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True, env=env)
    assert run.stdout.strip() == stdlib.fingerprint
    assert not marker.exists()
    assert any("NNTP" in doc for doc in stdlib.documents)  # so the stand-in would have changed the corpus


def test_file_folder_and_jsonl_specs(tmp_path: Path) -> None:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "b.txt").write_text("second", encoding="utf-8")
    (tmp_path / "docs" / "a.md").write_text("first", encoding="utf-8")
    (tmp_path / "docs" / "sub" / "c.txt").write_text("third", encoding="utf-8")
    (tmp_path / "docs" / "skip.py").write_text("not text", encoding="utf-8")
    (tmp_path / "docs" / "blank.txt").write_text("  \n", encoding="utf-8")
    folder = load_corpus(str(tmp_path / "docs"))
    assert folder.documents == ("first", "second", "third")
    assert folder.titles == ("a.md", "b.txt", "sub/c.txt")  # each document titled by its path in the folder

    single = load_corpus(str(tmp_path / "docs" / "b.txt"))
    assert single.documents == ("second",)
    assert single.provenance()["corpus_fingerprint"] == single.fingerprint

    records = [{"text": "alpha", "body": "one"}, {"text": "beta", "body": "two"}]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    assert load_corpus(str(jsonl)).documents == ("alpha", "beta")
    assert load_corpus(str(jsonl)).titles == ("line 1", "line 2")
    by_field = load_corpus(f"{jsonl}:body")
    assert by_field.documents == ("one", "two")
    assert by_field.fingerprint != load_corpus(str(jsonl)).fingerprint
    # Same content, same fingerprint, whatever the source.
    assert make_corpus("x", ["one", "two"]).fingerprint == by_field.fingerprint
    # Boundaries count: one document "onetwo" is not two documents.
    assert make_corpus("y", ["onetwo"]).fingerprint != by_field.fingerprint


@pytest.mark.parametrize(
    ("name", "content", "suffix", "message"),
    [
        ("missing", None, "", "neither a known corpus nor an existing path"),
        ("empty.txt", "   ", "", "holds no non-empty documents"),
        ("data.csv", "a,b", "", "unsupported suffix"),
        ("bad.jsonl", '{"text": "ok"}\n{not json', "", "bad.jsonl:2 is not valid JSON"),
        ("nofield.jsonl", '{"body": "x"}', "", "has no field 'text'"),
        ("nofield.jsonl", '{"text": "x"}', ":body", "has no field 'body'"),
        ("number.jsonl", '{"text": 3}', "", "is not a string"),
        ("latin1.txt", b"caf\xe9", "", "is not UTF-8"),
        ("emptydir", "", "", "holds no .txt or .md files"),
    ],
)
def test_corpus_errors_are_one_line(
    tmp_path: Path, name: str, content: str | bytes | None, suffix: str, message: str
) -> None:
    path = tmp_path / name
    if name == "emptydir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(PosleakError, match=message) as err:
        load_corpus(f"{path}{suffix}")
    assert "\n" not in str(err.value)


def test_hf_corpus_without_datasets_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # what an environment without the package looks like
    assert importlib.util.find_spec("datasets") is None
    with pytest.raises(PosleakError, match="pip install datasets"):
        load_corpus("hf:wikitext:train:text")


@pytest.fixture
def local_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face dataset folder written with `datasets` itself: train and validation splits as Parquet,
    a `text` and a `body` column (one text missing); the library's cache kept inside tmp_path."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = tmp_path / "dataset"
    (folder / "data").mkdir(parents=True)
    train = {"text": ["First document.", None, "Third document."], "body": ["b1", "b2", "b3"], "n": [1, 2, 3]}
    datasets.Dataset.from_dict(train).to_parquet(folder / "data" / "train-00000-of-00001.parquet")
    validation = {"text": ["Held out."], "body": ["held body"], "n": [4]}
    datasets.Dataset.from_dict(validation).to_parquet(folder / "data" / "validation-00000-of-00001.parquet")
    return folder


def test_hf_corpus_from_a_local_dataset(local_dataset: Path) -> None:
    """hf:NAME[:split[:field]] loads through `datasets.load_dataset` (offline, a local dataset folder): the default
    split and field, another split, another field; missing texts are skipped."""
    corpus = load_corpus(f"hf:{local_dataset}")
    assert corpus.documents == ("First document.", "Third document.")
    assert corpus.name == f"hf:{local_dataset}" and corpus.provenance()["corpus_documents"] == 2
    assert load_corpus(f"hf:{local_dataset}:validation").documents == ("Held out.",)
    assert load_corpus(f"hf:{local_dataset}:train:body").documents == ("b1", "b2", "b3")


@pytest.mark.parametrize(
    ("suffix", "message"),
    [(":train:title", r"has no field 'title' \(fields: \['text', 'body', 'n'\]\)"), (":test", "split 'test'")],
)
def test_hf_corpus_errors_name_the_fix(local_dataset: Path, suffix: str, message: str) -> None:
    with pytest.raises(PosleakError, match=message) as err:
        load_corpus(f"hf:{local_dataset}{suffix}")
    assert "\n" not in str(err.value)


def test_malformed_hf_spec() -> None:
    with pytest.raises(PosleakError, match="hf:NAME"):
        load_corpus("hf:")


# Sequences ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "policy"), [("silent", "auto"), ("prepends", "auto"), ("silent", "on"), ("none", "off")]
)
def test_rows_are_whole_windows_of_one_document(
    small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast], kind: str, policy: str
) -> None:
    tokenizer = tokenizers[kind]
    batch = make_sequences(small, tokenizer, seq_len=33, num_seqs=40, bos=policy, seed=3)
    content = _content(batch)
    length = content.shape[1]
    windows = {
        tuple(stream[start : start + length]): (doc, start)
        for doc, stream in enumerate(_streams(small, tokenizer))
        for start in range(0, len(stream) - length + 1, length)
    }
    origins = [windows.get(tuple(row.tolist())) for row in content]
    assert None not in origins, "a row is not a whole, aligned window of one document"
    assert len(set(origins)) == len(origins), "a window was used twice"
    assert batch.source == small.fingerprint and batch.source_name == "small"
    assert batch.documents == tuple(small.titles[doc] for doc, _ in origins)  # type: ignore[misc]
    assert batch.provenance()["documents"] == list(batch.documents)


def _windows_of(
    corpus: Corpus, tokenizer: PreTrainedTokenizerFast, length: int, documents: list[int] | None = None
) -> dict[tuple[int, ...], str]:
    """Every whole, aligned window of `length` tokens of the `documents` (indices; default all), to its title."""
    streams = _streams(corpus, tokenizer)
    return {
        tuple(streams[doc][start : start + length]): corpus.titles[doc]
        for doc in (range(len(corpus)) if documents is None else documents)
        for start in range(0, len(streams[doc]) - length + 1, length)
    }


def test_parts_share_no_document(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    """The documents dealt into parts of shares 2:2:1: each document in exactly one, the parts' sizes in those
    proportions within one block (5 documents), the deal drawn by the seed; every row of a part's sequences a whole
    window of one of its documents."""
    tokenizer, length, shares = tokenizers["silent"], 32, (2, 2, 1)
    parts = [part_documents(small, (index, shares), seed=5) for index in range(3)]
    assert sorted(k for part in parts for k in part) == list(range(len(small)))
    assert [len(part) for part in parts] == [16, 16, 8]  # 40 documents: 8 whole blocks
    assert sorted(len(part_documents(small, (k, (1, 1, 1)), seed=5)) for k in range(3)) == [13, 13, 14]
    assert part_documents(small, (0, shares), seed=6) != parts[0]
    assert part_documents(small, None, seed=5) == list(range(len(small)))
    for index, part in enumerate(parts):
        batch = make_sequences(small, tokenizer, seq_len=length, num_seqs=12, bos="off", seed=5, part=(index, shares))
        windows = _windows_of(small, tokenizer, length, part)
        assert batch.documents == tuple(windows[tuple(row.tolist())] for row in batch.ids)
    with pytest.raises(PosleakError, match="too few to deal into parts of shares 20:20:20"):
        make_sequences(small, tokenizer, seq_len=length, num_seqs=2, bos="off", part=(0, (20, 20, 20)))
    with pytest.raises(PosleakError, match=r"part 2 of corpus 'small' \(its share 2 of 2:2:1\) holds only"):
        make_sequences(small, tokenizer, seq_len=length, num_seqs=10**5, bos="off", part=(1, shares))


def test_parts_hold_their_share_of_the_documents_long_enough_for_a_window(
    stdlib: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]
) -> None:
    """Dealt by length, every part holds close to its share of the documents that hold a window of T tokens, at
    every T, though most documents are too short at a large T: counted with a real tokenizer on the stdlib
    docstrings at several seeds, within 2 documents of the share."""
    shares = (2, 2, 1)
    lengths = [len(stream) for stream in _streams(stdlib, tokenizers["silent"])]
    for seed in range(5):
        parts = [part_documents(stdlib, (index, shares), seed) for index in range(3)]
        for length in (512, 1024, 2048, 4096):
            holding = [sum(lengths[k] >= length for k in part) for part in parts]
            total = sum(lengths[k] >= length for k in range(len(stdlib)))
            assert 15 <= total < len(stdlib) and sum(holding) == total
            for share, count in zip(shares, holding, strict=True):
                assert abs(count - total * share / sum(shares)) <= 2, (seed, length, holding)


def test_one_window_per_document(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    """With windows_per_document = 1 the rows are whole windows of distinct documents (checked against the tokens),
    as many as the documents that hold a window and no more; with 2, every document's first window comes before
    any second one and none gives three; more rows extend fewer; a limit is refused with documents joined."""
    tokenizer, length = tokenizers["prepends"], 400  # a BOS at position 0: windows of 399 content tokens
    windows = _windows_of(small, tokenizer, length - 1)
    per_document = Counter(windows.values())
    holding = len(per_document)
    assert 10 < holding < len(small) and max(per_document.values()) > 2  # some too short, some long
    batch = make_sequences(small, tokenizer, length, holding, seed=3, windows_per_document=1)
    assert batch.documents == tuple(windows[tuple(row.tolist())] for row in _content(batch))
    assert len(set(batch.documents)) == holding and (batch.ids[:, 0] == BOS_ID).all()
    fewer = make_sequences(small, tokenizer, length, 5, seed=3, windows_per_document=1)
    assert torch.equal(fewer.ids, batch.ids[:5])
    assert make_sequences(small, tokenizer, length, 5, seed=4, windows_per_document=1).documents != fewer.documents
    with pytest.raises(PosleakError, match=f"has only {holding} documents that hold a window of {length} tokens"):
        make_sequences(small, tokenizer, length, holding + 1, seed=3, windows_per_document=1)
    at_most_two = sum(min(2, count) for count in per_document.values())
    two = make_sequences(small, tokenizer, length, at_most_two, seed=3, windows_per_document=2)
    assert two.documents == tuple(windows[tuple(row.tolist())] for row in _content(two))
    assert set(two.documents[:holding]) == set(batch.documents) and max(map(two.documents.count, two.documents)) == 2
    assert len(set(map(tuple, two.ids.tolist()))) == at_most_two  # no window twice
    with pytest.raises(PosleakError, match=f"at most 2 windows of each: {at_most_two} sequences"):
        make_sequences(small, tokenizer, length, at_most_two + 1, seed=3, windows_per_document=2)
    with pytest.raises(PosleakError, match="documents kept apart"):
        make_sequences(small, tokenizer, length, 2, cross_documents=True, windows_per_document=1)


def test_windows_per_document_from_the_command_line(tmp_path: Path) -> None:
    """`posleak analyze --windows-per-document 1` on a folder of 5 documents: 4 sequences are windows of 4 distinct
    documents (the manifest's rows); 6 are refused in one line saying that 5 documents hold a window, as is K = 0."""
    model, corpus = tiny_checkpoint(tmp_path / "model"), tmp_path / "corpus"
    corpus.mkdir()
    for k in range(5):
        word_corpus(corpus / f"doc{k}.txt", words=60 + 40 * k)  # 2 to 6 windows of 24 tokens each
    options = ["--corpus", str(corpus), "--seq-len", "24", "--bootstrap", "10", "--windows-per-document"]
    proc = run_main("analyze", str(model), *options, "1", "--num-seqs", "4", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "run" / "manifest.json").read_text())["data"]["documents"]
    assert len(rows) == len(set(rows)) == 4 and set(rows) <= {f"doc{k}.txt" for k in range(5)}
    out = tmp_path / "refused"
    proc = run_main("analyze", str(model), *options, "1", "--num-seqs", "6", "--out", str(out))
    assert_one_line_error(proc, "has only 5 documents that hold a window of 24 tokens", "at most 5")
    assert_one_line_error(run_main("analyze", str(model), *options, "0", "--out", str(out)), "whole number ≥ 1")
    assert not out.exists()


def test_recipe_part_problems() -> None:
    problems = Recipe(part=(3, (1, 1, 1))).problems()
    assert problems == ["part (3, (1, 1, 1)) is not one of 3 parts; give an index from 0 to 2"]
    assert "is not (index, shares)" in Recipe(part=(0, 3)).problems()[0]  # type: ignore[arg-type]
    assert "token file is taken verbatim" in Recipe(part=(0, (1, 1)), tokens="ids.npy").problems()[0]
    assert "part" not in Recipe().identity() and Recipe(part=(1, (2, 1))).identity()["part"] == (1, (2, 1))
    assert "windows_per_document" not in Recipe().identity()
    assert Recipe(windows_per_document=1).identity()["windows_per_document"] == 1
    assert "not a whole number ≥ 1" in Recipe(windows_per_document=0).problems()[0]
    assert "--cross-documents joins them" in Recipe(windows_per_document=1, cross_documents=True).problems()[0]
    assert "token file is taken verbatim" in Recipe(windows_per_document=1, tokens="ids.npy").problems()[0]


def test_cross_documents_joins_with_eos(tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    tokenizer = tokenizers["silent"]
    corpus = make_corpus("short", [f"Document number {k} says little." for k in range(30)])
    with pytest.raises(PosleakError, match="holds only 0 sequences of 32 tokens without crossing documents"):
        make_sequences(corpus, tokenizer, seq_len=32, num_seqs=2, bos="off")
    batch = make_sequences(corpus, tokenizer, seq_len=32, num_seqs=4, bos="off", cross_documents=True)
    joined: list[int] = []
    for k, stream in enumerate(_streams(corpus, tokenizer)):
        joined += [EOS_ID] * (k > 0) + stream
    starts = {tuple(joined[s : s + 32]) for s in range(0, len(joined) - 31, 32)}
    assert all(tuple(row.tolist()) in starts for row in batch.ids)
    assert (batch.ids == EOS_ID).any()
    with pytest.raises(PosleakError, match="needs an EOS token"):
        make_sequences(corpus, tokenizers["bare"], seq_len=32, num_seqs=4, bos="off", cross_documents=True)


@pytest.mark.parametrize(
    ("kind", "policy", "expected_bos"),
    [
        ("prepends", "auto", BOS_ID),
        ("prepends", "on", BOS_ID),
        ("prepends", "off", None),
        ("silent", "auto", None),
        ("silent", "on", BOS_ID),
        ("silent", "off", None),
        ("none", "auto", None),
        ("none", "off", None),
    ],
)
def test_position_zero_under_each_bos_policy(
    small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast], kind: str, policy: str, expected_bos: int | None
) -> None:
    tokenizer = tokenizers[kind]
    assert pos0_token(tokenizer, policy) == expected_bos
    batch = make_sequences(small, tokenizer, seq_len=16, num_seqs=20, bos=policy)
    assert batch.bos_id == expected_bos and batch.bos == policy
    assert torch.equal(batch.pos0_token_ids, batch.ids[:, 0])
    if expected_bos is None:
        assert not (batch.ids == BOS_ID).any()  # no BOS anywhere, not only at position 0
        assert batch.provenance()["pos0_token_id"] is None
    else:
        assert (batch.ids[:, 0] == BOS_ID).all() and not (batch.ids[:, 1:] == BOS_ID).any()
        assert batch.provenance()["pos0_token_id"] == BOS_ID


def test_special_token_text_stays_text(tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    corpus = make_corpus("spelled", ["A document that spells <bos> and <eos> in its text, " * 8])
    batch = make_sequences(corpus, tokenizers["silent"], seq_len=16, num_seqs=4, bos="off")
    assert not torch.isin(batch.ids, torch.tensor([BOS_ID, EOS_ID])).any()


def test_tokenizer_bos_detection(tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    assert tokenizer_prepends_bos(tokenizers["prepends"])
    assert not tokenizer_prepends_bos(tokenizers["silent"])
    assert not tokenizer_prepends_bos(tokenizers["none"])


def test_bos_on_without_a_bos_token(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    with pytest.raises(PosleakError, match="has no BOS token; use bos=off or auto"):
        make_sequences(small, tokenizers["none"], seq_len=16, num_seqs=4, bos="on")
    with pytest.raises(PosleakError, match="unknown BOS policy 'yes'"):
        pos0_token(tokenizers["none"], "yes")


def test_request_errors(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    tokenizer = tokenizers["silent"]
    available = sum(len(s) // 64 for s in _streams(small, tokenizer))
    with pytest.raises(PosleakError, match=f"holds only {available} sequences of 64 tokens.*at most {available}"):
        make_sequences(small, tokenizer, seq_len=64, num_seqs=available + 1, bos="off")
    assert make_sequences(small, tokenizer, seq_len=64, num_seqs=available, bos="off").num_seqs == available
    with pytest.raises(PosleakError, match=r"longer than the model allows \(128 positions\)"):
        make_sequences(small, tokenizer, seq_len=256, num_seqs=1, max_len=128)
    with pytest.raises(PosleakError, match="at least 2"):
        make_sequences(small, tokenizer, seq_len=1, num_seqs=1)
    with pytest.raises(PosleakError, match="at least one sequence"):
        make_sequences(small, tokenizer, seq_len=8, num_seqs=0)


def test_seed_determines_the_windows(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    tokenizer = tokenizers["prepends"]
    first = make_sequences(small, tokenizer, seq_len=24, num_seqs=16, seed=5)
    again = make_sequences(small, tokenizer, seq_len=24, num_seqs=16, seed=5)
    other = make_sequences(small, tokenizer, seq_len=24, num_seqs=16, seed=6)
    more = make_sequences(small, tokenizer, seq_len=24, num_seqs=32, seed=5)
    assert torch.equal(first.ids, again.ids)
    assert not torch.equal(first.ids, other.ids)
    assert torch.equal(more.ids[:16], first.ids)  # asking for more extends, never reshuffles
    assert first.seed == 5


def test_iter_batches_keeps_input_order(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    batch = make_sequences(small, tokenizers["silent"], seq_len=16, num_seqs=10)
    chunks = list(iter_batches(batch, 4))
    assert [len(index) for index, _ in chunks] == [4, 4, 2]
    assert torch.equal(torch.cat([index for index, _ in chunks]), torch.arange(10))
    assert torch.equal(torch.cat([ids for _, ids in chunks]), batch.ids)
    with pytest.raises(PosleakError, match="batch size 0"):
        next(iter_batches(batch, 0))


# Token files --------------------------------------------------------------------------------------


def test_token_file_is_taken_verbatim(tmp_path: Path) -> None:
    array = np.arange(24, dtype=np.int32).reshape(3, 8)
    path = tmp_path / "tokens.npy"
    np.save(path, array)
    batch = load_token_file(path, vocab_size=24, max_len=8)
    assert torch.equal(batch.ids, torch.from_numpy(array).long())
    assert batch.ids.dtype == torch.long
    assert batch.bos == "verbatim" and batch.bos_id is None and batch.seed is None
    assert torch.equal(batch.pos0_token_ids, torch.tensor([0, 8, 16]))
    assert batch.source == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("array", "kwargs", "message"),
    [
        (np.zeros((2, 3, 4), dtype=np.int64), {}, "has shape"),
        (np.zeros((2, 8), dtype=np.float32), {}, "has dtype float32"),
        (np.zeros((0, 8), dtype=np.int64), {}, "is empty"),
        (np.full((2, 8), -1, dtype=np.int64), {}, "outside"),
        (np.full((2, 8), 50, dtype=np.int64), {"vocab_size": 50}, r"outside \[0, 50\)"),
        (np.zeros((2, 8), dtype=np.int64), {"max_len": 4}, "longer than the model allows"),
    ],
)
def test_bad_token_files(tmp_path: Path, array: np.ndarray, kwargs: dict[str, int], message: str) -> None:
    path = tmp_path / "tokens.npy"
    np.save(path, array)
    with pytest.raises(PosleakError, match=message):
        load_token_file(path, **kwargs)


def test_unreadable_token_files(tmp_path: Path) -> None:
    with pytest.raises(PosleakError, match="does not exist"):
        load_token_file(tmp_path / "absent.npy")
    text = tmp_path / "tokens.npy"
    text.write_text("1 2 3", encoding="utf-8")
    with pytest.raises(PosleakError, match=r"not a readable \.npy"):
        load_token_file(text)


# Nulls --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["shift", "shuffle"])
@pytest.mark.parametrize("policy", ["on", "off"])
def test_nulls_keep_tokens_and_bos(
    small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast], kind: str, policy: str
) -> None:
    batch = make_sequences(small, tokenizers["silent"], seq_len=32, num_seqs=12, bos=policy)
    null = make_null(batch, kind, seed=1)
    assert null.null == kind and null.null_seed == 1 and null.source == batch.source
    assert torch.equal(null.ids.sort(dim=1).values, batch.ids.sort(dim=1).values)
    assert torch.equal(null.pos0_token_ids, null.ids[:, 0])
    if policy == "on":
        assert (null.ids[:, 0] == BOS_ID).all()
    before, after = _content(batch), _content(null)
    assert not torch.equal(before, after)
    if kind == "shift":
        length = before.shape[1]
        for row, moved in zip(before, after, strict=True):
            assert any(torch.equal(torch.roll(row, k), moved) for k in range(1, length))
    assert torch.equal(make_null(batch, kind, seed=1).ids, null.ids)
    assert not torch.equal(make_null(batch, kind, seed=2).ids, null.ids)


def test_null_errors(small: Corpus, tokenizers: dict[str, PreTrainedTokenizerFast]) -> None:
    batch = make_sequences(small, tokenizers["silent"], seq_len=16, num_seqs=4)
    with pytest.raises(PosleakError, match="unknown null 'reverse'"):
        make_null(batch, "reverse")
    with pytest.raises(PosleakError, match="already the 'shift' null"):
        make_null(make_null(batch, "shift"), "shuffle")
