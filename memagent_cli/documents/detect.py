"""Which reader a document needs, from its content first and its file name second."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import PurePath

from memagent_cli.documents import SUPPORTED
from memagent_cli.errors import DocumentError

_PDF_HEADER = re.compile(rb"%PDF-\d\.\d")
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
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
    for magic, kind in _BINARY_KINDS.items():
        if data.startswith(magic):
            raise _unsupported(where, kind)
    sample = data[:8192]
    controls = sum(sample.count(c) for c in _CONTROL)
    if b"\x00" in sample or controls > len(sample) // 20:
        raise _unsupported(where, "binary data")
    return "text"


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
            mimetype = archive.read("mimetype").strip() if "mimetype" in names else b""
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


def _unsupported(where: str, kind: str) -> DocumentError:
    return DocumentError(
        f"{where} looks like {kind}, which memagent cannot read; supported formats are {SUPPORTED}."
    )
