"""Documents: text plus a map from character offsets to where they came from."""

from __future__ import annotations

import bisect
import hashlib
import os
import stat
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from memagent_cli.errors import DocumentError, UserError

# Called as progress(done, total) while pages or chapters are extracted.
Progress = Callable[[int, int], None]

SUPPORTED = "text, Markdown, PDF and EPUB"
FORMATS = ("text", "pdf", "epub")
# The most bytes one document may have (and an EPUB may inflate to), unless the
# environment variable says otherwise: reading never holds more than this.
MAX_DOCUMENT_BYTES = 2_000_000_000
_LIMIT_VARIABLE = "MEMAGENT_MAX_DOCUMENT_BYTES"
_READ_SIZE = 1024 * 1024
_SNIFF = 64 * 1024  # bytes of a stream looked at before reading the rest


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
    # What the reader should know about how the text was read (a missing spine, pages
    # that could not be decoded); the caller shows them, since documents/ prints nothing.
    notes: list[str] = field(default_factory=list)
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
    path: str,
    *,
    password: str | None = None,
    progress: Progress | None = None,
    format: str | None = None,
) -> Document:
    """Read the document at `path` (`-` is stdin), detecting its format from its content.

    `format` ("text", "pdf" or "epub") overrides the detection. PDF and EPUB text is
    cached per file content, so a second load skips extraction (`Document.from_cache`).
    `password` opens encrypted PDFs; `progress(done, total)` is called as pages or
    chapters are extracted. At most `max_document_bytes()` are read.
    """
    from memagent_cli.documents import cache, detect, epub, pdf, text

    if format is not None and format not in FORMATS:
        raise UserError(f"Unknown document format {format}; choose {', '.join(FORMATS)}.")
    limit = max_document_bytes()
    data, where = _read(path, limit, sniff=format is None)
    if not data or data.isspace():
        raise DocumentError(f"The document is empty: {where} has no text to read.")
    source = "<stdin>" if path == "-" else path
    kind = format or detect.detect_format(data, source, where)
    sha256 = hashlib.sha256(data).hexdigest()
    if kind == "text":
        document = text.parse(data, source)
        document.sha256 = sha256
    else:
        document = cache.load(sha256, source)
        if document is not None and document.encrypted:
            pdf.open_reader(data, where, password)  # the cache must not bypass the password
        if document is None:
            try:
                if kind == "pdf":
                    document = pdf.parse(data, source, where, password=password, progress=progress)
                else:
                    document = epub.parse(data, source, where, progress=progress, limit=limit)
            except DocumentError as exc:
                if kind == "pdf" and format is None and detect.is_text(data):
                    raise _text_not_pdf(data, where) from exc
                raise
            document.sha256 = sha256
            cache.store(document)
    if not document.text:
        raise DocumentError(f"The document is empty: {where} has no text to read.")
    return document


def _text_not_pdf(data: bytes, where: str) -> DocumentError:
    """The error for a PDF that pypdf refuses but whose bytes are text: say both."""
    if data[:1024].lstrip()[:5] == b"%PDF-":
        what = "starts with %PDF- but cannot be read as a PDF, so it looks like a damaged PDF"
    else:
        what = "is named like a PDF but is not one"
    return DocumentError(
        f"{where} {what}; its content decodes as text, which --format text reads as text."
    )


def max_document_bytes() -> int:
    """The most bytes a document may have: $MEMAGENT_MAX_DOCUMENT_BYTES, else 2 GB."""
    value = os.environ.get(_LIMIT_VARIABLE, "").strip()
    if not value:
        return MAX_DOCUMENT_BYTES
    try:
        limit = int(value.replace("_", ""))
    except ValueError:
        limit = 0
    if limit < 1:
        raise UserError(f"{_LIMIT_VARIABLE} must be a whole number of bytes, not {value!r}.")
    return limit


def _read(path: str, limit: int, *, sniff: bool) -> tuple[bytes, str]:
    """The raw bytes at `path` (at most `limit` of them) and how to name it in messages.

    Only regular files and stdin are read: a FIFO or a device would block or never end.
    """
    if path == "-":
        return _read_stream(sys.stdin.buffer, "stdin", limit, sniff=sniff), "stdin"
    try:
        status = os.stat(path)  # stat, unlike open, does not block on a FIFO
    except FileNotFoundError:
        raise DocumentError(f"Document not found: {path}") from None
    except OSError as exc:
        raise DocumentError(f"Cannot read {path}: {exc.strerror}.") from None
    if stat.S_ISDIR(status.st_mode):
        raise DocumentError(f"{path} is a directory; give the path of one document.")
    if not stat.S_ISREG(status.st_mode):
        raise DocumentError(
            f"{path} is {_kind(status.st_mode)}, not a regular file; give the path of a "
            "document file, or - to read stdin."
        )
    if status.st_size > limit:
        raise _too_large(path, limit)
    try:
        with open(path, "rb") as file:
            if status.st_size == 0:  # /proc and /sys files say 0 and still have content
                return _read_stream(file, path, limit, sniff=False), path
            data = file.read(status.st_size)  # a file that grows meanwhile is read as it was
    except OSError as exc:
        raise DocumentError(f"Cannot read {path}: {exc.strerror}.") from None
    return data, path


def _read_stream(stream: BinaryIO, where: str, limit: int, *, sniff: bool) -> bytes:
    """All of `stream`, read in pieces; DocumentError past `limit` bytes, or as soon as its
    first bytes show binary data that no reader takes (/dev/zero on stdin).

    The bytearray itself is returned: copying it to bytes would hold the document twice.
    """
    from memagent_cli.documents import detect

    buffer = bytearray()
    sniffed = not sniff
    while chunk := stream.read(_READ_SIZE):
        buffer += chunk
        if len(buffer) > limit:
            raise _too_large(where, limit)
        if not sniffed and len(buffer) >= _SNIFF:
            detect.refuse_binary(bytes(buffer[:_SNIFF]), where)
            sniffed = True
    return buffer  # type: ignore[return-value]


def _too_large(where: str, limit: int) -> DocumentError:
    return DocumentError(
        f"{where} is larger than the maximum document size of {limit:,} bytes; set "
        f"{_LIMIT_VARIABLE} to read larger documents."
    )


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "neither a file nor a directory"
