"""One document cut into chunks for an engine (`Session`), and what it says of itself."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memagent_cli import __version__, readers
from memagent_cli.chunking import Chunk, Tokenizer, Tokens, make_chunks, normalized, tokenize
from memagent_cli.documents import Document
from memagent_cli.errors import UserError
from memagent_cli.progress import SILENT, Reporter
from memagent_cli.reader import Reader
from memagent_cli.run.engine import Engine
from memagent_cli.trace import Header


def describe_document(document: Document) -> dict[str, Any]:
    """What a document is, as `inspect`, the trace header and `--json` report it."""
    return {
        "path": document.path,
        "sha256": document.sha256,
        "format": document.format,
        "title": document.title,
        "unit": document.unit,
        "pages": document.pages,
        "pages_without_text": document.pages_without_text,
        "sections": len(document.sections),
        "characters": len(document.text),
        # Pages with no text layer (what --ocr auto reads), and those OCR read, by label.
        "pages_needing_ocr": document.ocr.needed,
        "ocr": {
            "engine": document.ocr.engine,
            "pages": document.ocr.pages,
            "low_confidence": document.ocr.low_confidence,
        }
        if document.ocr.engine
        else None,
    }


@dataclass
class Session:
    """A document cut into chunks with the engine's tokenizer, and the engine that reads it."""

    document: Document
    tokens: list[int]
    chunks: list[Chunk]
    engine: Engine

    @functools.cached_property
    def reader(self) -> Reader:
        """How the engine's settings say to read this document (one for every question:
        InfMem's search index is built once)."""
        engine = self.engine
        return readers.get(engine.settings.reader).loop(engine.backend, self.tokens)

    def span_of(self, start: int, end: int) -> str:
        return self.document.span(start, end)

    def document_record(self) -> dict[str, Any]:
        return {
            **describe_document(self.document),
            "tokens": len(self.tokens),
            "chunks": len(self.chunks),
        }

    def header(self, question: str) -> Header:
        """The trace header of a run of `question` over this document."""
        return Header(
            question=question,
            document=self.document_record(),
            model=self.engine.model_record,
            settings=self.engine.settings_record(),
            templates_sha256=readers.get(self.engine.settings.reader).templates_sha256(),
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            memagent=__version__,
        )


def cut(
    document: Document, tokenizer: Tokenizer, chunk_tokens: int, report: Reporter = SILENT
) -> tuple[Tokens, list[Chunk]]:
    """`document`'s tokens and chunks, telling `report` how tokenizing a long document goes
    (a server's tokenizer is a call per piece and per chunk)."""
    name = Path(document.path).name
    # The text as the model's tokenizer normalizes it (chunking.chunk_text): NFC for Qwen.
    normal = normalized(document.text, getattr(tokenizer, "normalization", None))
    with report.progress("characters") as progress:
        tokens = tokenize(
            normal.text,
            tokenizer,
            lambda done, total: progress(f"tokenizing {name}", done, total),
        )
    with report.progress("chunks") as progress:
        chunks = make_chunks(
            tokens,
            chunk_tokens,
            tokenizer.detokenize,
            normal.text,
            lambda done, total: progress(f"cutting {name} into chunks", done, total),
            getattr(tokenizer, "inexact_ranges", None),  # a server's: said once
        )
    return tokens, normal.placed(chunks)


def check_markup(document: Document, engine: Engine, report: Reporter = SILENT) -> None:
    """Before the first call: a document that spells the model's chat markup where the
    backend would send it as markup (a server: backends/openai/markup.py) is refused for a
    reader that writes its prompts whole, and said in one sentence for one that chats."""
    spelled = engine.backend.markup(document.text)
    if spelled is None:
        return
    name, spec = Path(document.path).name, readers.get(engine.settings.reader)
    if spec.writes_whole:
        raise UserError(
            f"{name} spells the chat markup {spelled}, which the server would take as markup "
            f"in the prompts {spec.name} writes whole; read it with llama.cpp in this process."
        )
    report.warn(
        f"{name} spells the chat markup {spelled}, and the server reads it as markup, not "
        "text (it may end a turn); read it with llama.cpp in this process to keep it text."
    )


def open_session(document: Document, engine: Engine, report: Reporter = SILENT) -> Session:
    """`document` tokenized and chunked for `engine`, the work told to `report`."""
    check_markup(document, engine, report)
    tokens, chunks = cut(document, engine.backend, engine.settings.chunk_tokens, report)
    engine.fit(len(chunks))
    return Session(document, tokens, chunks, engine)
