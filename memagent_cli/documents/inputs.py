"""What a run was given to read: documents (a file, stdin, a folder, a list of paths) and
questions (arguments or a file), found and read with bounds, before any model is touched."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePath

from memagent_cli.documents.document import Document
from memagent_cli.documents.load import load_document
from memagent_cli.documents.ocr import OcrMode, OcrOptions
from memagent_cli.documents.pdf import OCR_AUTO
from memagent_cli.errors import DocumentError, UserError
from memagent_cli.files import open_regular
from memagent_cli.progress import SILENT, Reporter

SUPPORTED_SUFFIXES = {".txt", ".md", ".markdown", ".text", ".rst", ".pdf", ".epub"}
MAX_LIST_BYTES = 16 << 20  # a questions or documents file; far more than anyone types


def read_list(path: Path, what: str) -> list[str]:
    """The non-empty lines of a questions or documents file (`what` names it), refusing
    anything that is not a regular text file of a sane size."""
    name = f"{what} file"
    try:
        with open_regular(path, name, limit=MAX_LIST_BYTES) as file:
            data = file.read(MAX_LIST_BYTES)
    except OSError as exc:
        raise UserError(f"Cannot read {name} {path}: {exc.strerror}.") from None
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        # File names need not be UTF-8 (a Latin-1 name): a list of documents keeps their
        # bytes as Python keeps such names, as lone surrogates.
        text = data.decode("utf-8", "surrogateescape" if what == "documents" else "strict")
    except UnicodeDecodeError:
        raise UserError(
            f"{name.capitalize()} {path} is not UTF-8 text, so it holds no {what}."
        ) from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def document_paths(argument: str | None, listing: Path | None, pattern: str | None) -> list[str]:
    """The documents to read: DOCUMENT, or each path in `listing`. Each is a file, `-`, or a
    folder searched recursively for supported files, filtered by `pattern` inside it."""
    named = [argument] if argument else []
    if listing is not None:
        if not (listed := read_list(listing, "documents")):
            raise UserError(f"Documents file {listing} names no documents: give one path a line.")
        named += listed
    paths: list[str] = []
    for name in named:
        # os.path: False where it cannot look (another user's home); reading names why.
        if name != "-" and os.path.isdir(name):
            paths += _in_folder(Path(name), pattern)
        else:
            paths.append(name)
    return paths


def _in_folder(folder: Path, pattern: str | None) -> list[str]:
    if pattern is not None and (PurePath(pattern).is_absolute() or ".." in PurePath(pattern).parts):
        raise UserError(f"--glob {pattern} reaches outside {folder}; patterns match inside it.")
    root = folder.resolve()
    found = sorted(
        str(p)
        for p in folder.rglob(pattern or "*")
        if p.is_file()
        and (pattern or p.suffix.lower() in SUPPORTED_SUFFIXES)
        and p.resolve().is_relative_to(root)
    )
    if not found:
        matching = f" matching {pattern}" if pattern else ""
        raise DocumentError(f"{folder} holds no supported documents{matching}.")
    return found


def read_document(
    path: str,
    *,
    password: str | None,
    format: str | None = None,
    report: Reporter = SILENT,
    use_cache: bool = True,
    ask_password: Callable[[str], str] | None = None,
    ocr: OcrOptions = OCR_AUTO,
    scanned_ok: bool = False,
) -> Document:
    """Load a document (as `format`, when given, whatever its content looks like), telling
    `report` of extraction progress and of what the reader had to work around. `use_cache`,
    `ask_password`, `ocr` and `scanned_ok`: as `load_document` takes them."""
    with report.progress("pages") as progress:
        document = load_document(
            path,
            password=password,
            progress=progress,
            format=format,
            use_cache=use_cache,
            ask_password=ask_password,
            ocr=ocr,
            scanned_ok=scanned_ok,
        )
    for note in document.notes:
        report.warn(note)
    if document.pages_without_text and not document.ocr.engine:  # else a note names them
        hint = " (--ocr auto reads them)" if ocr.mode == OcrMode.never else ""
        report.note(
            f"{document.pages_without_text} of {document.pages} pages have no text layer "
            f"(scanned or images) and were skipped{hint}."
        )
    return document
