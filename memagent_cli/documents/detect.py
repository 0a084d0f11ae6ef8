"""Which reader a document needs, from its content first and its file name second."""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from pathlib import PurePath

from memagent_cli.documents.document import SUPPORTED
from memagent_cli.errors import DocumentError

_PDF_HEADER = re.compile(rb"%PDF-\d\.\d")
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # the two EPUB allows
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
# Bytes that do not occur in text: C0 controls other than whitespace and ESC, and DEL.
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\f\v\x1b") + b"\x7f"
_BINARY_KINDS = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"\x1f\x8b": "a gzip archive",
    b"\xd0\xcf\x11\xe0": "an old Microsoft Office file",
}


def detect_format(data: bytes, name: str, where: str) -> str:
    """ "pdf", "epub" or "text" for the bytes of the file `name`; DocumentError otherwise."""
    suffix = PurePath(name).suffix.lower()
    if _is_pdf(data):
        return "pdf"
    if data.startswith(_ZIP_MAGIC):
        kind = _zip_kind(data)
        if kind == "epub" or (kind == "" and suffix == ".epub"):
            return "epub"  # a damaged EPUB gets its own message from the EPUB reader
        raise _unsupported(where, kind or "a ZIP archive")
    if suffix in (".pdf", ".epub"):
        return suffix[1:]  # damaged or mislabelled: the reader says what is wrong
    if data.startswith(_UTF16_BOMS):
        return "text"
    _refuse_binary_kinds(data[:8192], where)
    return "text"


def refuse_binary(head: bytes, where: str) -> None:
    """DocumentError when the first bytes of a document are neither text nor a format that
    a reader takes; lets a stream (/dev/zero on stdin) be refused before it is all read."""
    if head.startswith((*_ZIP_MAGIC, *_UTF16_BOMS)) or _PDF_HEADER.search(head[:1024]):
        return
    _refuse_binary_kinds(head, where)


def _refuse_binary_kinds(head: bytes, where: str) -> None:
    for magic, kind in _BINARY_KINDS.items():
        if head.startswith(magic):
            raise _unsupported(where, kind)
    if _looks_binary(head[:8192]):
        raise _unsupported(where, "binary data")


def is_text(data: bytes) -> bool:
    """Whether `data` decodes as UTF-8 and has no more control bytes than text has."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not _looks_binary(data[:65536])


def _looks_binary(sample: bytes) -> bool:
    controls = sum(sample.count(c) for c in _CONTROL)
    return b"\x00" in sample or controls > len(sample) // 20


def _is_pdf(data: bytes) -> bool:
    # Readers accept the header anywhere in the first 1024 bytes; past offset 0 we also
    # want the end marker, so that a text file that quotes "%PDF-1.7" stays text.
    if data.startswith(b"%PDF-"):
        return True
    return bool(_PDF_HEADER.search(data[:1024])) and b"%%EOF" in data[-2048:]


def _zip_kind(data: bytes) -> str:
    """ "epub", a description of another kind of zip, or "" when it cannot be opened."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            mimetype = _head(archive, "mimetype").strip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return ""
    if mimetype == b"application/epub+zip" or "META-INF/container.xml" in names:
        return "epub"
    if "word/document.xml" in names:
        return "a Word document"
    if any(n.startswith(("xl/", "ppt/")) for n in names):
        return "an Office document"
    if "content.xml" in names:
        return "an OpenDocument file"
    return "a ZIP archive that is not an EPUB"


def _head(archive: zipfile.ZipFile, name: str) -> bytes:
    """The first bytes of member `name`, never the whole: a mimetype can be a zip bomb."""
    try:
        info = archive.getinfo(name)
        if info.flag_bits & 0x1 or info.compress_type not in _ZIP_METHODS:
            return b""
        with archive.open(info) as member:
            return member.read(64)
    except (KeyError, zipfile.BadZipFile, zlib.error, RuntimeError, OSError, EOFError):
        return b""


def _unsupported(where: str, kind: str) -> DocumentError:
    return DocumentError(
        f"{where} looks like {kind}, which memagent cannot read; supported formats are {SUPPORTED}."
    )
