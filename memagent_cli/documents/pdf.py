"""PDF documents with pypdf: text page by page, each page labelled as it is printed."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import PurePath

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, PyPdfError

from memagent_cli.documents import cache
from memagent_cli.documents.document import Document, OcrRecord, assemble
from memagent_cli.documents.ocr import LOW_CONFIDENCE, OcrEngine, OcrMode, OcrOptions
from memagent_cli.documents.ocr import open_engine as open_ocr
from memagent_cli.documents.ocr import recognize as recognize_pages
from memagent_cli.errors import DocumentError
from memagent_cli.progress import Progress

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
    OverflowError,  # an offset past any file (a startxref of 20 digits)
    zlib.error,
    NotImplementedError,  # an unsupported filter or encryption algorithm
)


OCR_AUTO = OcrOptions()


def parse(
    data: bytes,
    source: str,
    where: str,
    *,
    password: str | None = None,
    progress: Progress | None = None,
    ocr: OcrOptions = OCR_AUTO,
    sha256: str | None = None,
    scanned_ok: bool = False,
) -> Document:
    """A page-labelled Document from the bytes of a PDF.

    Pages without a text layer (or an empty one) are read by OCR under `ocr` (every page
    with `--ocr always`); each recognized page is cached as it is done, under `sha256` when
    given, unless the PDF is encrypted. Pages left without text are counted in
    `pages_without_text`; a PDF with no text at all is refused, saying why, except one
    with `scanned_ok` whose pages have no text layer (not read by OCR, not damaged): that
    is an empty Document, whose OCR record counts them (what `inspect --ocr never` reports).
    """
    reader = open_reader(data, where, password)
    with _quiet() as logged:
        total = len(reader.pages)
        if total == 0:
            raise DocumentError(f"The document is empty: {where} has no pages.")
        labels = _labels(reader, total)
        texts: list[str] = []
        without_layer: list[int] = []
        failed: list[tuple[str, str]] = []  # (page label, why pypdf could not read it)
        damaged: set[int] = set()  # their indexes: reported as damaged, not read by OCR
        for index in range(total):
            logged.clear()
            try:
                text = reader.pages[index].extract_text()
            except _DAMAGED as exc:
                failed.append((labels[index], _reason(exc)))
                damaged.add(index)
                text = ""
            else:
                if logged and not text.strip():  # pypdf gave up on the content, said why
                    failed.append((labels[index], f"pypdf: {logged[0].strip().rstrip('.')}"))
                    damaged.add(index)
                elif not text.strip():
                    without_layer.append(index)
            texts.append(text)
            if progress is not None:
                progress(f"extracting {PurePath(where).name}", index + 1, total)
        title = _title(reader)
    notes: list[str] = []
    record = OcrRecord(needed=len(without_layer))
    every = [index for index in range(total) if index not in damaged]
    wanted = every if ocr.mode == OcrMode.always else without_layer
    if wanted and ocr.mode != OcrMode.never:
        try:
            engine = open_ocr(ocr, where)
        except DocumentError as exc:
            if ocr.mode == OcrMode.always or len(wanted) + len(failed) == total:
                raise
            notes.append(exc.message)  # the pages that have text are read all the same
            # Cached as asked for, so the next command finds it (documents/load.py).
            record.key, record.unavailable = f"{ocr.mode}:{ocr.key()}", True
        else:
            cache_key = None if reader.is_encrypted or sha256 is None else (sha256, ocr.key())
            record = _recognize(
                data, password, where, wanted, labels, texts, engine, cache_key, progress
            )
            record.key, record.needed = f"{ocr.mode}:{ocr.key()}", len(without_layer)
    empty = [index for index in range(total) if not texts[index].strip()]
    if len(empty) == total and not (scanned_ok and not failed and not record.engine):
        raise _no_text(where, total, failed, record, ocr)
    document = assemble(
        zip(labels, texts, strict=True),
        path=source,
        format="pdf",
        sha256="",
        unit="page",
        title=title,
        pages=total,
        pages_without_text=len(set(empty) - damaged),
        encrypted=reader.is_encrypted,
        ocr=record,
    )
    if failed:
        document.notes.append(
            f"{where} is damaged: pypdf could not decode the content of {_pages(failed)} "
            f"({failed[0][1]}); {'it was' if len(failed) == 1 else 'they were'} skipped."
        )
    if record.low_confidence:
        unsure = [(label, "") for label in record.low_confidence]
        document.notes.append(
            f"OCR is unsure of {_pages(unsure)} of {where} (confidence under "
            f"{LOW_CONFIDENCE}%): check {'it' if len(unsure) == 1 else 'them'} with "
            "`memagent inspect --text`."
        )
    blank = [(labels[i], "") for i in empty if i not in damaged]
    if record.engine and blank:
        document.notes.append(
            f"OCR found no text on {_pages(blank)} of {where} (blank, or pictures only): "
            f"{'it was' if len(blank) == 1 else 'they were'} skipped."
        )
    document.notes += notes
    return document


def _recognize(
    data: bytes,
    password: str | None,
    where: str,
    wanted: list[int],
    labels: list[str],
    texts: list[str],
    engine: OcrEngine,
    cache_key: tuple[str, str] | None,
    progress: Progress | None,
) -> OcrRecord:
    """Read the pages at `wanted` by OCR into `texts`: those cached under `cache_key` from
    there, the others by `engine`, each cached as it is done."""
    known = cache.load_pages(*cache_key) if cache_key else {}
    found = {index: known[index] for index in wanted if index in known}
    what = f"recognizing {PurePath(where).name}"
    if progress is not None:
        progress(what, len(found), len(wanted))
    todo = [index for index in wanted if index not in found]
    for page in recognize_pages(data, password, todo, engine, where):
        found[page.index] = (page.text, page.confidence)
        if cache_key:
            cache.store_page(*cache_key, page.index, page.text, page.confidence)
        if progress is not None:
            progress(what, len(found), len(wanted))
    record = OcrRecord(engine=engine.describe())
    for index in wanted:
        text, confidence = found[index]
        texts[index] = text
        if text.strip():
            record.pages.append(labels[index])
            if confidence < LOW_CONFIDENCE:
                record.low_confidence.append(labels[index])
    return record


def _no_text(
    where: str, total: int, failed: list[tuple[str, str]], record: OcrRecord, ocr: OcrOptions
) -> DocumentError:
    """Why a PDF has no text on any page: damage, OCR that found none, or no OCR."""
    if failed:
        which = f"any of its {total} pages" if len(failed) == total else _pages(failed)
        rest = "" if len(failed) == total else ", and its other pages have no text layer"
        return DocumentError(
            f"{where} is damaged: pypdf could not decode the content of {which} "
            f"({failed[0][1]}){rest}."
        )
    if record.engine:
        return DocumentError(
            f"{where} has no text on any of its {total} pages, and OCR ({record.engine}) "
            "found none either."
        )
    return DocumentError(
        f"{where} has no text layer on any of its {total} pages: it looks scanned, and "
        f"--ocr {OcrMode.auto} reads it (not --ocr {ocr.mode})."
    )


def _pages(failed: list[tuple[str, str]]) -> str:
    """ "p. 3", "p. 3, 7 and 9", "12 pages (p. 3, 7, 9, ...)"."""
    labels = [label for label, _ in failed]
    if len(labels) == 1:
        return f"p. {labels[0]}"
    if len(labels) <= 5:
        return f"p. {', '.join(labels[:-1])} and {labels[-1]}"
    return f"{len(labels)} pages (p. {', '.join(labels[:3])}, ...)"


class PasswordNeeded(DocumentError):
    """An encrypted PDF and no password: a terminal may ask for one."""


def open_reader(data: bytes, where: str, password: str | None) -> PdfReader:
    """A PdfReader with its pages readable (decrypted when needed); DocumentError if not."""
    with _quiet():
        try:
            reader = PdfReader(io.BytesIO(data))  # tries the empty user password itself
            if reader.is_encrypted:
                if password is None:
                    if reader.decrypt("") == PasswordType.NOT_DECRYPTED:
                        raise PasswordNeeded(
                            f"{where} is encrypted; pass --password, or set MEMAGENT_PDF_PASSWORD."
                        )
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
    """The printed label of each page ("xii", "217"), else its 1-based number. A label that
    numbering started again gives to more than one page (a front matter "1" and the body's)
    says which page of the file it is too, "1 (page 9 of 300)", so that a page read by OCR,
    a note and a citation each name one page."""
    try:
        labels = [str(label) for label in reader.page_labels]
    except _DAMAGED:
        labels = []
    if len(labels) != total:
        return [str(number) for number in range(1, total + 1)]
    labels = [label or str(number) for number, label in enumerate(labels, 1)]
    seen = Counter(labels)
    return [
        label if seen[label] == 1 else f"{label} (page {number} of {total})"
        for number, label in enumerate(labels, 1)
    ]


def _title(reader: PdfReader) -> str:
    try:
        metadata = reader.metadata
        return str(metadata.title or "").strip() if metadata is not None else ""
    except _DAMAGED:
        return ""


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().rstrip(".")
    return f"pypdf: {text}" if text else f"pypdf: {type(exc).__name__}"


class _Collect(logging.Handler):
    """Keeps what pypdf logs, so that a page it could not decode says why."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """Keep pypdf's warnings about the damage it repairs off stderr (stderr is for our
    messages); what it logs is collected in the list this yields."""
    logger = logging.getLogger("pypdf")
    saved = logger.level, logger.propagate, logger.handlers[:]
    collect = _Collect()
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.handlers = [collect]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield collect.messages
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]
