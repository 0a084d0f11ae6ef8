"""Plain text documents (UTF-8, or UTF-16 with a BOM; undecodable bytes are replaced)."""

from __future__ import annotations

from memagent_cli.documents.document import Document


def parse(data: bytes, source: str) -> Document:
    """A text Document from raw bytes, stripped as the protocol requires."""
    encoding = "utf-16" if data.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8-sig"
    text = data.decode(encoding, errors="replace").strip()
    return Document(text=text, path=source, format="text", sha256="")
