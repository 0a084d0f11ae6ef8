"""Documents: text plus a map from character offsets to where they came from."""

from __future__ import annotations

import bisect
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from memagent_cli.errors import DocumentError


@dataclass(frozen=True)
class Section:
    """A page or chapter that starts at `start` (a character offset in the text)."""

    start: int
    label: str


@dataclass
class Document:
    """The text of one document, ready to chunk, and where each character came from."""

    text: str
    path: str
    format: str
    sha256: str
    unit: str = ""  # "page" or "chapter" when `sections` is filled
    sections: list[Section] = field(default_factory=list)

    def section_at(self, offset: int) -> Section | None:
        """The page or chapter that holds the character at `offset`."""
        if not self.sections:
            return None
        starts = [s.start for s in self.sections]
        index = max(bisect.bisect_right(starts, offset) - 1, 0)
        return self.sections[index]

    def span(self, start: int, end: int) -> str:
        """A human label for characters [start, end): "p. 3-7", "Chapter 2", or ""."""
        if not self.sections or end <= start:
            return ""
        first, last = self.section_at(start), self.section_at(end - 1)
        assert first is not None and last is not None
        prefix = "p. " if self.unit == "page" else ""
        if first == last:
            return f"{prefix}{first.label}"
        return f"{prefix}{first.label}–{last.label}"


def load_document(path: str) -> Document:
    """Read the document at `path` (`-` is stdin) and strip it, as the protocol asks."""
    from memagent_cli.documents import text

    if path == "-":
        data = sys.stdin.buffer.read()
        source = "<stdin>"
    else:
        file = Path(path)
        if not file.exists():
            raise DocumentError(f"Document not found: {path}")
        if file.is_dir():
            raise DocumentError(f"{path} is a directory; give the path of one document.")
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise DocumentError(f"Cannot read {path}: {exc.strerror}.") from exc
        source = str(file)
    document = text.parse(data, source)
    document.sha256 = hashlib.sha256(data).hexdigest()
    if not document.text:
        where = "stdin" if path == "-" else path
        raise DocumentError(f"The document is empty: {where} has no text to read.")
    return document
