"""A model ready to read (`Engine`) and one document cut into chunks for it (`Session`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memagent_cli import __version__, protocol
from memagent_cli.backends import Backend
from memagent_cli.backends.factory import BackendOptions, open_backend
from memagent_cli.chunking import Chunk, chunk_text
from memagent_cli.documents import Document
from memagent_cli.errors import BudgetError
from memagent_cli.reader import Settings, context_needed
from memagent_cli.trace import Header


class Engine:
    """A backend with the settings it reads by and the context one step needs."""

    def __init__(self, backend: Backend, settings: Settings, context: int) -> None:
        self.backend = backend
        self.settings = settings
        self.context = context
        self.description = backend.describe()
        self._sequences = 0  # questions the loaded context reads at once; 0: not loaded
        self._lock = threading.Lock()

    def prepare(self, sequences: int = 1) -> None:
        """Load the weights on first use (answers from traces never need them), with room
        for `sequences` questions read together, each with the context one step needs."""
        with self._lock:
            if self._sequences < sequences:
                self.backend.prepare(self.context, sequences)
                self._sequences = sequences

    def together(self, questions: int, asked: int | None) -> int:
        """How many of `questions` to read at once: `asked` (--parallel) when that many fit
        in memory, else (None) as many as fit. Fails with a sentence when `asked` does not."""
        fits = self.backend.sequences_that_fit(self.context)
        wanted = min(questions, fits if asked is None else asked)
        if wanted > fits:
            raise BudgetError(
                f"{wanted} questions read at once need {wanted} context caches of "
                f"{self.context} tokens, but only {fits} fit in the memory free now; "
                f"use --parallel {fits}."
            )
        return max(1, wanted)

    @property
    def model_record(self) -> dict[str, Any]:
        return self.description.model

    def settings_record(self) -> dict[str, Any]:
        sampling = self.settings.sampling
        return {
            "chunk_tokens": self.settings.chunk_tokens,
            "memory_tokens": self.settings.memory_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "context_tokens": self.context,
            **self.description.engine,
        }


def open_engine(
    options: BackendOptions,
    settings: Settings,
    questions: list[str],
    note: Callable[[str], None],
    progress: Callable[[str, int, int | None], None] | None = None,
) -> Engine:
    """The backend, with its context sized for the longest question; fails with a sentence
    when one step cannot fit. `note` and `progress` tell of a model being pulled."""
    backend = open_backend(options, note, progress)
    return Engine(backend, settings, context_needed(backend, questions, settings))


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
    }


@dataclass
class Session:
    """A document cut into chunks with the engine's tokenizer, and the engine that reads it."""

    document: Document
    tokens: list[int]
    chunks: list[Chunk]
    engine: Engine

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
            templates_sha256=protocol.templates_sha256(),
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            memagent=__version__,
        )


def open_session(document: Document, engine: Engine) -> Session:
    """`document` tokenized and chunked for `engine`."""
    tokens, chunks = chunk_text(document.text, engine.backend, engine.settings.chunk_tokens)
    return Session(document, tokens, chunks, engine)
