"""Extracted PDF and EPUB text, kept per file content so a second question skips extraction.

One JSON file per document under the user cache directory, named by the sha256 of the
file's bytes. A missing, stale or unreadable entry is a miss; failing to write is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from platformdirs import user_cache_path

from memagent_cli.documents.document import Document, Section

VERSION = 2  # bump when extraction changes what it produces


def directory() -> Path:
    return user_cache_path("memagent") / "documents"


def load(sha256: str, source: str) -> Document | None:
    """The cached Document for this content, with `path` set to `source`, or None."""
    try:
        entry: Any = json.loads((directory() / f"{sha256}.json").read_text(encoding="utf-8"))
        if entry.get("version") != VERSION or entry.get("sha256") != sha256:
            return None
        return Document(
            text=entry["text"],
            path=source,
            format=entry["format"],
            sha256=sha256,
            unit=entry["unit"],
            sections=[Section(int(start), str(label)) for start, label in entry["sections"]],
            title=entry["title"],
            pages=entry["pages"],
            pages_without_text=entry["pages_without_text"],
            encrypted=entry["encrypted"],
            notes=[str(note) for note in entry["notes"]],
            from_cache=True,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(document: Document) -> None:
    """Write `document` to the cache atomically; private to the user (it may be decrypted)."""
    entry = {
        "version": VERSION,
        "sha256": document.sha256,
        "format": document.format,
        "unit": document.unit,
        "title": document.title,
        "pages": document.pages,
        "pages_without_text": document.pages_without_text,
        "encrypted": document.encrypted,
        "notes": document.notes,
        "sections": [[s.start, s.label] for s in document.sections],
        "text": document.text,
    }
    folder = directory()
    temp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(entry, file, ensure_ascii=False)
        os.replace(temp, folder / f"{document.sha256}.json")
    except (OSError, ValueError):  # ValueError: text that cannot be encoded
        if temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(temp)
