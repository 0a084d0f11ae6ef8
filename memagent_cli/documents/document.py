"""A document: its text and a map from character offsets to the pages or chapters they came
from. Every reader returns one; this module imports no reader."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from memagent_cli.provenance import Place

SUPPORTED = "text, Markdown, PDF and EPUB"


class DocumentFormat(StrEnum):
    """How a document's bytes are read (`--format`)."""

    text = "text"
    pdf = "pdf"
    epub = "epub"


FORMATS = tuple(DocumentFormat)


@dataclass(frozen=True)
class Section:
    """A page or chapter that starts at `start` (a character offset in the text)."""

    start: int
    label: str


@dataclass
class OcrRecord:
    """How a PDF's pages were read by OCR: `key` is "" where no OCR was asked for (or none
    was needed), else the mode and languages ("auto:eng"); `pages` and `low_confidence` are
    page labels."""

    key: str = ""
    engine: str = ""  # "Tesseract 5.5.4 (tesserocr 2.13.0), eng"
    needed: int = 0  # pages with no text layer, or an empty one: what --ocr auto reads
    # OCR was asked for but could not run (no OCR extra, no language data): a note says why.
    unavailable: bool = False
    pages: list[str] = field(default_factory=list)  # the pages whose text is OCR's
    low_confidence: list[str] = field(default_factory=list)


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
    pages_without_text: int = 0  # PDF pages left without text (scanned, images; not OCR'd)
    encrypted: bool = False
    # What the reader should know about how the text was read (a missing spine, pages
    # that could not be decoded); the caller shows them, since documents/ prints nothing.
    notes: list[str] = field(default_factory=list)
    ocr: OcrRecord = field(default_factory=OcrRecord)
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

    def place(self, start: int, end: int) -> Place:
        """The pages ("xii–3") or chapters ("Intro – Chapter 2") characters [start, end) are
        on; neither in a document without them."""
        if not self.sections or end <= start:
            return Place()
        first, last = self.section_at(start), self.section_at(end - 1)
        assert first is not None and last is not None
        if self.unit == "page":
            return Place(pages=first.label if first == last else f"{first.label}–{last.label}")
        return Place(chapters=first.label if first == last else f"{first.label} – {last.label}")

    def span(self, start: int, end: int) -> str:
        """A human label for characters [start, end): "p. xii–3", "Intro – Chapter 2", or ""."""
        place = self.place(start, end)
        return f"p. {place.pages}" if place.pages else place.chapters or ""


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
