"""Loading a document from a path or stdin: bounded reads, format detection, the cache."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

from memagent_cli.documents import cache, detect, epub, pdf, text
from memagent_cli.documents.document import FORMATS, Document, OcrRecord
from memagent_cli.documents.ocr import OcrMode, OcrOptions
from memagent_cli.documents.ocr import open_engine as open_ocr
from memagent_cli.documents.pdf import OCR_AUTO
from memagent_cli.errors import DocumentError, UserError
from memagent_cli.progress import Progress

# The most bytes one document may have (and an EPUB may inflate to), unless the
# environment variable says otherwise: reading never holds more than this.
MAX_DOCUMENT_BYTES = 2_000_000_000
_LIMIT_VARIABLE = "MEMAGENT_MAX_DOCUMENT_BYTES"
_READ_SIZE = 1024 * 1024
_SNIFF = 64 * 1024  # bytes of a stream looked at before reading the rest


def load_document(
    path: str,
    *,
    password: str | None = None,
    progress: Progress | None = None,
    format: str | None = None,
    use_cache: bool = True,
    ask_password: Callable[[str], str] | None = None,
    ocr: OcrOptions = OCR_AUTO,
    scanned_ok: bool = False,
) -> Document:
    """Read the document at `path` (`-` is stdin), detecting its format from its content.

    `format` ("text", "pdf" or "epub") overrides the detection. PDF and EPUB text is
    cached per file content unless `use_cache` is off, so a second load skips extraction
    (`Document.from_cache`); an encrypted document's text never is. `password` opens
    encrypted PDFs; without one, `ask_password(where)` is asked for it when given. `ocr`
    says which PDF pages are read by OCR, in which languages; with `scanned_ok`, a PDF whose
    pages have no text layer and were not read by OCR is an empty Document (pdf.parse).
    `progress(what, done, total)` is called as pages or chapters are extracted. At most
    `max_document_bytes()` are read.
    """
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
        fits = _ocr_fits(ocr, where) if kind == "pdf" else _no_ocr
        document = cache.load(sha256, source, fits) if use_cache else None
        if document is None:
            try:
                if kind == "pdf":
                    pages = {
                        "ocr": ocr,
                        "sha256": sha256 if use_cache else None,
                        "scanned_ok": scanned_ok,
                    }
                    document = _pdf(data, source, where, password, progress, ask_password, pages)
                else:
                    document = epub.parse(data, source, where, progress=progress, limit=limit)
            except DocumentError as exc:
                if kind == "pdf" and format is None and detect.is_text(data):
                    raise _text_not_pdf(data, where) from exc
                raise
            document.sha256 = sha256
            if use_cache and document.text:  # an empty scan is refused, not cached, for `ask`
                cache.store(document)
    if not document.text and not (scanned_ok and document.pages_without_text):
        raise DocumentError(f"The document is empty: {where} has no text to read.")
    return document


def _pdf(
    data: bytes,
    source: str,
    where: str,
    password: str | None,
    progress: Progress | None,
    ask_password: Callable[[str], str] | None,
    pages: dict[str, Any],
) -> Document:
    """A PDF's Document; for an encrypted one without `password`, `ask_password` is asked.
    `pages`: how pages without text are read (pdf.parse's `ocr` and `sha256`)."""
    try:
        return pdf.parse(data, source, where, password=password, progress=progress, **pages)
    except pdf.PasswordNeeded:
        if ask_password is None:
            raise
    password = ask_password(where)
    return pdf.parse(data, source, where, password=password, progress=progress, **pages)


def _ocr_fits(ocr: OcrOptions, where: str) -> Callable[[OcrRecord], bool]:
    """Whether a PDF read as `record` says was read with `ocr`: the same mode and languages
    where it had pages without a text layer. One read where OCR could not run fits while it
    still cannot (checked only then: it imports Tesseract)."""

    def fits(record: OcrRecord) -> bool:
        if ocr.mode == OcrMode.never or (ocr.mode == OcrMode.auto and not record.needed):
            wanted = ""
        else:
            wanted = f"{ocr.mode}:{ocr.key()}"
        if record.key != wanted:
            return False
        if record.unavailable:
            try:
                open_ocr(ocr, where)
            except DocumentError:
                return True
            return False
        return True

    return fits


def _no_ocr(record: OcrRecord) -> bool:
    return not record.key


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
