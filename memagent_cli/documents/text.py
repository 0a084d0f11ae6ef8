"""Plain text documents (UTF-8; undecodable bytes are replaced, not fatal)."""

from __future__ import annotations

from memagent_cli.documents import Document


def parse(data: bytes, source: str) -> Document:
    """A text Document from raw bytes, stripped as the protocol requires."""
    text = data.decode("utf-8-sig", errors="replace").strip()
    return Document(text=text, path=source, format="text", sha256="")
