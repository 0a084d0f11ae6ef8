"""Documents: text, Markdown, PDF and EPUB read into one `Document` type (document.py), with
a map from character offsets to the pages or chapters they came from."""

from memagent_cli.documents.document import FORMATS, SUPPORTED, Document, Section, assemble
from memagent_cli.documents.load import load_document, max_document_bytes

__all__ = [
    "FORMATS",
    "SUPPORTED",
    "Document",
    "Section",
    "assemble",
    "load_document",
    "max_document_bytes",
]
