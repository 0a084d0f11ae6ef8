"""PDF documents with pypdf: text page by page, each page labelled as it is printed."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
import zlib
from collections.abc import Iterator

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, PyPdfError

from memagent_cli.documents import Document, Progress, assemble
from memagent_cli.errors import DocumentError

# What pypdf raises on damaged input besides its own errors. Only pypdf calls sit inside
# these handlers, so a bug of ours is not hidden by them.
_DAMAGED = (
    PyPdfError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    RecursionError,
    zlib.error,
)


def parse(
    data: bytes,
    source: str,
    where: str,
    *,
    password: str | None = None,
    progress: Progress | None = None,
) -> Document:
    """A page-labelled Document from the bytes of a PDF.

    Pages without a text layer (or whose text pypdf cannot decode) are counted in
    `pages_without_text`; a PDF with no text at all is refused with advice to OCR it.
    """
    reader = open_reader(data, where, password)
    with _quiet():
        total = len(reader.pages)
        if total == 0:
            raise DocumentError(f"The document is empty: {where} has no pages.")
        labels = _labels(reader, total)
        parts: list[tuple[str, str]] = []
        without_text = 0
        for index in range(total):
            try:
                text = reader.pages[index].extract_text()
            except _DAMAGED:
                text = ""
            if not text.strip():
                without_text += 1
            parts.append((labels[index], text))
            if progress is not None:
                progress(index + 1, total)
        title = _title(reader)
    if without_text == total:
        raise DocumentError(
            f"{where} has no text layer on any of its {total} pages: it looks scanned and "
            "needs OCR first (for example `ocrmypdf in.pdf out.pdf`)."
        )
    return assemble(
        parts,
        path=source,
        format="pdf",
        sha256="",
        unit="page",
        title=title,
        pages=total,
        pages_without_text=without_text,
        encrypted=reader.is_encrypted,
    )


def open_reader(data: bytes, where: str, password: str | None) -> PdfReader:
    """A PdfReader with its pages readable (decrypted when needed); DocumentError if not."""
    with _quiet():
        try:
            reader = PdfReader(io.BytesIO(data))  # tries the empty user password itself
            if reader.is_encrypted:
                if password is None:
                    if reader.decrypt("") == PasswordType.NOT_DECRYPTED:
                        raise DocumentError(f"{where} is encrypted; pass --password.")
                elif reader.decrypt(password) == PasswordType.NOT_DECRYPTED:
                    raise DocumentError(f"The password for {where} is wrong.")
            len(reader.pages)
        except DependencyError as exc:
            raise DocumentError(
                f"{where} is AES-encrypted, which needs the cryptography package "
                "(pip install cryptography)."
            ) from exc
        except _DAMAGED as exc:
            truncated = data.lstrip()[:5] == b"%PDF-" and b"%%EOF" not in data[-2048:]
            reason = "its end is missing, as if truncated" if truncated else _reason(exc)
            raise DocumentError(
                f"{where} is damaged or not a PDF, so it cannot be read ({reason})."
            ) from exc
    return reader


def _labels(reader: PdfReader, total: int) -> list[str]:
    """The printed label of each page ("xii", "217"), else its 1-based number."""
    try:
        labels = [str(label) for label in reader.page_labels]
    except _DAMAGED:
        labels = []
    if len(labels) != total:
        return [str(number) for number in range(1, total + 1)]
    return [label or str(number) for number, label in enumerate(labels, 1)]


def _title(reader: PdfReader) -> str:
    try:
        metadata = reader.metadata
        return str(metadata.title or "").strip() if metadata is not None else ""
    except _DAMAGED:
        return ""


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().rstrip(".")
    return f"pypdf: {text}" if text else f"pypdf: {type(exc).__name__}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence pypdf's warnings about the damage it repairs: stderr is for our messages."""
    logger = logging.getLogger("pypdf")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
