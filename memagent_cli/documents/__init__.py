"""Documents: text plus a map from character offsets to where they came from."""

from __future__ import annotations

import bisect
import hashlib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from memagent_cli.errors import DocumentError

# Called as progress(done, total) while pages or chapters are extracted.
Progress = Callable[[int, int], None]

SUPPORTED = "text, Markdown, PDF and EPUB"


@dataclass(frozen=True)
class Section:
    """A page or chapter that starts at `start` (a character offset in the text)."""

    start: int
    label: str


@dataclass
class Document:
    """The text of one document, ready to chunk, and where each character came from.

    `sections` are sorted by `start` and fixed once the Document is built.
    """

    text: str
    path: str
    format: str  # "text", "pdf" or "epub"
    sha256: str
    unit: str = ""  # "page" or "chapter" when `sections` is filled
    sections: list[Section] = field(default_factory=list)
    title: str = ""
    pages: int = 0  # pages in the PDF, or items in the EPUB's spine
    pages_without_text: int = 0  # PDF pages with no text layer (scanned, images)
    encrypted: bool = False
    from_cache: bool = field(default=False, compare=False)
    _starts: list[int] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._starts = [s.start for s in self.sections]

    def section_at(self, offset: int) -> Section | None:
        """The page or chapter that holds the character at `offset`."""
        if not self.sections:
            return None
        if len(self._starts) != len(self.sections):  # sections were replaced after init
            self._starts = [s.start for s in self.sections]
        index = max(bisect.bisect_right(self._starts, offset) - 1, 0)
        return self.sections[index]

    def span(self, start: int, end: int) -> str:
        """A human label for characters [start, end): "p. xii–3", "Intro – Chapter 2", or ""."""
        if not self.sections or end <= start:
            return ""
        first, last = self.section_at(start), self.section_at(end - 1)
        assert first is not None and last is not None
        if self.unit == "page":
            return f"p. {first.label}" if first == last else f"p. {first.label}–{last.label}"
        return first.label if first == last else f"{first.label} – {last.label}"


def assemble(parts: Iterable[tuple[str, str]], **fields: object) -> Document:
    """A Document from (label, text) parts in reading order, one section per non-empty part.

    Parts are stripped and joined with blank lines, so every section starts exactly where
    its text does; parts with no text get no section. `fields` go to the Document.
    """
    texts: list[str] = []
    sections: list[Section] = []
    offset = 0
    for label, text in parts:
        text = _encodable(text.strip())
        if not text:
            continue
        if texts:
            offset += 2  # the "\n\n" between parts
        sections.append(Section(offset, label))
        texts.append(text)
        offset += len(text)
    return Document(text="\n\n".join(texts), sections=sections, **fields)  # type: ignore[arg-type]


def _encodable(text: str) -> str:
    """`text` with lone surrogates (from broken PDF font maps) replaced, so it encodes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def load_document(
    path: str, *, password: str | None = None, progress: Progress | None = None
) -> Document:
    """Read the document at `path` (`-` is stdin), detecting its format from its content.

    PDF and EPUB text is cached per file content, so a second load skips extraction
    (`Document.from_cache`). `password` opens encrypted PDFs; `progress(done, total)` is
    called as pages or chapters are extracted.
    """
    from memagent_cli.documents import cache, detect, epub, pdf, text

    data, where = _read(path)
    if not data.strip():
        raise DocumentError(f"The document is empty: {where} has no text to read.")
    source = "<stdin>" if path == "-" else path
    kind = detect.detect_format(data, source, where)
    sha256 = hashlib.sha256(data).hexdigest()
    if kind == "text":
        document = text.parse(data, source)
        document.sha256 = sha256
    else:
        document = cache.load(sha256, source)
        if document is not None and document.encrypted:
            pdf.open_reader(data, where, password)  # the cache must not bypass the password
        if document is None:
            parse = pdf.parse if kind == "pdf" else epub.parse
            document = parse(data, source, where, password=password, progress=progress)
            document.sha256 = sha256
            cache.store(document)
    if not document.text:
        raise DocumentError(f"The document is empty: {where} has no text to read.")
    return document


def _read(path: str) -> tuple[bytes, str]:
    """The raw bytes at `path` and how to name it in messages."""
    if path == "-":
        return sys.stdin.buffer.read(), "stdin"
    file = Path(path)
    if not file.exists():
        raise DocumentError(f"Document not found: {path}")
    if file.is_dir():
        raise DocumentError(f"{path} is a directory; give the path of one document.")
    try:
        return file.read_bytes(), path
    except OSError as exc:
        raise DocumentError(f"Cannot read {path}: {exc.strerror}.") from exc
