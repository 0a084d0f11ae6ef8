"""Extracted PDF and EPUB text, kept per file content so a second question skips extraction.

One JSON file per document in the cache folder's documents/, named by the sha256 of the
file's bytes. A missing, stale or unreadable entry is a miss; failing to write is ignored.
Pages read by OCR are kept as they are done, a JSON line each in
`<sha256>.ocr-<languages>.jsonl`, so an interrupted reading goes on from the next page. The
text of an encrypted document is never written: a password must not be a formality that a
copy in plain text sidesteps. The folder holds at most `max_bytes()`; past that the entries
used longest ago go first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli.documents.document import Document, OcrRecord, Section
from memagent_cli.errors import UserError
from memagent_cli.files import (
    drop_partial_line,
    lock,
    open_checked,
    open_private,
    private_folder,
    read_checked,
    replace_private,
)
from memagent_cli.folders import cache_dir

VERSION = 5  # bump when extraction changes what it produces; 4: pages read by OCR;
# 5: repeated page labels told apart, documents read where OCR could not run
MAX_BYTES = 1_000_000_000  # 1 GB of extracted text: hundreds of books
LIMIT_VARIABLE = "MEMAGENT_DOCUMENT_CACHE_BYTES"
_TEMP_PREFIX = ".tmp-"
STALE_SECONDS = 3600  # a write takes seconds; a temporary file this old was cut short
_SUFFIXES = (".json", ".jsonl")  # a document's text; pages read by OCR so far


def directory() -> Path:
    """Where extracted text is cached."""
    return cache_dir() / "documents"


def max_bytes() -> int:
    """The most bytes the cache may hold: $MEMAGENT_DOCUMENT_CACHE_BYTES (0 caches nothing),
    else 1 GB."""
    value = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not value:
        return MAX_BYTES
    try:
        limit = int(value.replace("_", ""))
    except ValueError:
        limit = -1
    if limit < 0:
        raise UserError(
            f"{LIMIT_VARIABLE} must be a whole number of bytes (0 turns the cache off), "
            f"not {value!r}."
        )
    return limit


def load(
    sha256: str, source: str, ocr_fits: Callable[[OcrRecord], bool] = lambda r: not r.key
) -> Document | None:
    """The cached Document for this content, with `path` set to `source`, or None. A stale
    entry is deleted; a hit counts as a use, so it is evicted last. `ocr_fits(how the entry
    was read by OCR)` says whether that is the OCR the caller asks for: if not, a miss."""
    path = directory() / f"{sha256}.json"
    if max_bytes() == 0:
        return None
    try:
        # A regular file within the cache's own limit only: a FIFO would block the read.
        entry: Any = json.loads(read_checked(path, max(max_bytes(), 1)).decode("utf-8"))
        if entry.get("version") != VERSION or entry.get("sha256") != sha256 or entry["encrypted"]:
            # An older version's entry, possibly the text of an encrypted document.
            path.unlink()
            return None
        ocr = OcrRecord(**entry["ocr"])
        if not ocr_fits(ocr):
            return None
        document = Document(
            text=entry["text"],
            path=source,
            format=entry["format"],
            sha256=sha256,
            unit=entry["unit"],
            sections=[Section(int(start), str(label)) for start, label in entry["sections"]],
            title=entry["title"],
            pages=entry["pages"],
            pages_without_text=entry["pages_without_text"],
            encrypted=False,
            notes=[str(note) for note in entry["notes"]],
            ocr=ocr,
            from_cache=True,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)
    return document


def store(document: Document) -> None:
    """Write `document` to the cache atomically and privately (mode 0600), then evict what
    no longer fits. An encrypted document is never written."""
    limit = max_bytes()
    if document.encrypted or limit == 0:
        evict(limit)  # a limit lowered since, or to 0, holds from the next read on
        return
    entry = {
        "version": VERSION,
        "sha256": document.sha256,
        "format": document.format,
        "unit": document.unit,
        "title": document.title,
        "pages": document.pages,
        "pages_without_text": document.pages_without_text,
        "encrypted": False,
        "notes": document.notes,
        "ocr": dataclasses.asdict(document.ocr),
        "sections": [[s.start, s.label] for s in document.sections],
        "text": document.text,
    }
    folder = directory()
    try:  # replace_private: a write cut short (Ctrl-C, SIGTERM) leaves no temporary file
        private_folder(folder)
        text = json.dumps(entry, ensure_ascii=False)
        replace_private(folder / f"{document.sha256}.json", text, _TEMP_PREFIX)
        evict(limit)
    except (OSError, ValueError):  # ValueError: text that cannot be encoded
        pass


def _pages_path(sha256: str, key: str) -> Path:
    return directory() / f"{sha256}.ocr-{key}.jsonl"


def load_pages(sha256: str, key: str) -> dict[int, tuple[str, float]]:
    """The pages of this content already read by OCR with `key` (the languages): index ->
    (text, confidence). A line cut short by an interruption is skipped (and cut off before
    the next page is added: store_page)."""
    pages: dict[int, tuple[str, float]] = {}
    if max_bytes() == 0:
        return pages
    try:
        checked = open_checked(_pages_path(sha256, key), max_bytes())
        with io.TextIOWrapper(checked, encoding="utf-8") as file:
            for line in file:
                try:
                    index, text, confidence = json.loads(line)
                    pages[int(index)] = (str(text), float(confidence))
                except (ValueError, TypeError):
                    continue
    except (OSError, ValueError):  # ValueError: bytes that are not UTF-8
        return pages
    return pages


def store_page(sha256: str, key: str, index: int, text: str, confidence: float) -> None:
    """Add one page read by OCR to this content's pages (a private file, mode 0600).
    Callers never pass an encrypted document's pages."""
    if max_bytes() == 0:
        return
    line = json.dumps([index, text, confidence], ensure_ascii=False) + "\n"
    path = _pages_path(sha256, key)
    with contextlib.suppress(OSError, ValueError):
        private_folder(path.parent)
        with open_private(path, "a") as file:
            # Another memagent reading the same PDF may be writing a line: leave the page
            # to it. A line a power loss cut goes first, or the new one would be lost with it.
            if lock(file):
                drop_partial_line(path)
                file.write(line)


@dataclass(frozen=True)
class Usage:
    """What the cache holds."""

    path: Path
    entries: int
    bytes: int
    limit: int


def _entries() -> list[tuple[float, str, int, Path]]:
    """(last use, name, size, path) of each entry, least recently used first. A temporary
    file that a killed write left behind (older than STALE_SECONDS) counts too, as used
    longest ago; one younger is another memagent's write in flight."""
    found = []
    folder = directory()
    if not folder.is_dir():
        return []
    now = time.time()
    for path in folder.glob("*.json*"):
        if path.suffix not in _SUFFIXES:
            continue
        try:
            info = path.stat()
        except OSError:  # removed meanwhile by another memagent, or a loop of links
            continue
        if not stat.S_ISREG(info.st_mode):  # a folder would stop eviction (unlink fails)
            continue
        last = info.st_mtime
        if path.name.startswith(_TEMP_PREFIX):
            if now - info.st_mtime < STALE_SECONDS:
                continue
            last = 0.0
        found.append((last, path.name, info.st_size, path))
    return sorted(found)


def evict(limit: int) -> None:
    """Delete what a killed write left behind, then the entries used longest ago until the
    cache holds at most `limit` bytes."""
    with contextlib.suppress(OSError):
        _evict(limit)


def _evict(limit: int) -> None:
    entries = _entries()
    total = sum(size for _, _, size, _ in entries)
    for last, name, size, path in entries:
        if total <= limit and not (last == 0.0 and name.startswith(_TEMP_PREFIX)):
            break
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        total -= size


def usage() -> Usage:
    """How many entries and bytes the cache holds, and its limit."""
    entries = _entries()
    documents = sum(
        name.endswith(".json") and not name.startswith(_TEMP_PREFIX) for _, name, _, _ in entries
    )
    return Usage(directory(), documents, sum(e[2] for e in entries), max_bytes())


def clear() -> Usage:
    """Delete every entry (and any file a crash left half-written); what was deleted."""
    before = usage()
    folder = directory()
    if folder.is_dir():
        for path in folder.iterdir():
            if path.is_file() and path.suffix in _SUFFIXES:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    return before
