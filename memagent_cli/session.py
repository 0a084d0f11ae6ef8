"""One `ask` session: a document, its chunks and a loaded model, asked one question at a time.

This is where the pure core (documents, chunking, protocol, reader) meets the edges
(model files, traces, the display).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memagent_cli import __version__, display, models, protocol, trace
from memagent_cli.backends.llama_cpp import LlamaCppBackend, can_offload, physical_cores
from memagent_cli.chunking import Chunk, make_chunks
from memagent_cli.documents import Document, load_document
from memagent_cli.errors import DocumentError, Interrupted
from memagent_cli.reader import Answer, Settings, StepFinished, context_needed, read


def questions_from_file(path: Path) -> list[str]:
    """Non-empty lines of a questions file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise DocumentError(f"Questions file not found: {path}") from None
    except OSError as exc:
        raise DocumentError(f"Cannot read questions file {path}: {exc.strerror}.") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


@dataclass
class Result:
    """One answered question, with everything `--json` reports."""

    answer: Answer
    session: Session
    seconds: float
    trace_path: Path | None

    def stdout_line(self) -> str:
        if self.answer.answer is not None:
            return " ".join(self.answer.answer.split())
        return self.answer.reply.strip()

    def to_json(self) -> dict[str, Any]:
        s, a = self.session, self.answer
        calls = [step.generation for step in a.steps] + [a.final]
        prompt_tokens = sum(g.prompt_tokens for g in calls)
        generated = sum(g.completion_tokens for g in calls)
        prompt_seconds = sum(g.prompt_seconds for g in calls)
        generation_seconds = sum(g.generation_seconds for g in calls)
        return {
            "answer": a.answer,
            "reply": a.reply,
            "question": a.question,
            "document": s.document_info(),
            "model": s.model_info(),
            "settings": s.settings_info(),
            "steps": [
                {
                    "index": step.chunk.index,
                    "tokens": [step.chunk.token_start, step.chunk.token_end],
                    "chars": [step.chunk.char_start, step.chunk.char_end],
                    "span": s.span_of(step.chunk.char_start, step.chunk.char_end),
                    "memory_tokens": step.generation.completion_tokens,
                    "prompt_tokens": step.generation.prompt_tokens,
                    "finish_reason": step.generation.finish_reason,
                    "seconds": round(step.generation.seconds, 3),
                }
                for step in a.steps
            ],
            "evidence": trace.evidence_record(a, s.span_of),
            "seconds": round(self.seconds, 3),
            "tokens_per_second": {
                "prompt": round(prompt_tokens / prompt_seconds, 1) if prompt_seconds else None,
                "generation": round(generated / generation_seconds, 1)
                if generation_seconds
                else None,
            },
            "trace": str(self.trace_path) if self.trace_path else None,
        }


class Session:
    """A document cut into chunks and a model ready to read them."""

    def __init__(
        self,
        document: Document,
        tokens: list[int],
        chunks: list[Chunk],
        model: models.Model,
        backend: LlamaCppBackend,
        settings: Settings,
        context: int,
    ) -> None:
        self.document = document
        self.tokens = tokens
        self.chunks = chunks
        self.model = model
        self.backend = backend
        self.settings = settings
        self.context = context
        self._progress: tuple[int, Path | None] = (0, None)

    def span_of(self, start: int, end: int) -> str:
        return self.document.span(start, end)

    def document_info(self) -> dict[str, Any]:
        d = self.document
        return {
            "path": d.path,
            "sha256": d.sha256,
            "format": d.format,
            "characters": len(d.text),
            "tokens": len(self.tokens),
            "chunks": len(self.chunks),
        }

    def model_info(self) -> dict[str, Any]:
        path = self.model.path.resolve()
        return {"path": str(path), "name": self.model.name, "size": path.stat().st_size}

    def settings_info(self) -> dict[str, Any]:
        return {
            "chunk_tokens": self.settings.chunk_tokens,
            "memory_tokens": self.settings.memory_tokens,
            **asdict(self.settings.sampling),
            "context_tokens": self.context,
            "threads": self.backend.threads,
            "gpu_layers": self.backend.gpu_layers,
        }

    def ask(self, question: str, *, trace_path: Path | None, quiet: bool) -> Result:
        """Read the whole document for `question`, writing the trace as it goes."""
        writer = None
        if trace_path is not None:
            writer = trace.TraceWriter(trace_path, self._trace_header(question), self.span_of)
            if not quiet:
                display.note(f"trace: {trace_path}")
        self._progress = (0, trace_path)

        def listener(event: Any) -> None:
            if isinstance(event, StepFinished):
                self._progress = (self._progress[0] + 1, trace_path)
            if writer is not None:
                writer(event)
            view(event)

        title = f"{Path(self.document.path).name} · {self.model.name} · {question}"
        view = display.progress_view(quiet, self.span_of, len(self.tokens), title)
        start = time.perf_counter()
        try:
            with view:
                answer = read(self.backend, question, self.chunks, self.settings, listener)
        except (KeyboardInterrupt, Interrupted) as exc:
            if writer is not None:
                writer.interrupted(str(exc) or "SIGINT")
            raise
        finally:
            if writer is not None:
                writer.close()
        return Result(answer, self, time.perf_counter() - start, trace_path)

    def interrupted_message(self, reason: str) -> str:
        done, path = self._progress
        kept = f"; the trace {path} keeps them" if path else ""
        return f"Interrupted ({reason}) after {done} of {len(self.chunks)} steps{kept}."

    def _trace_header(self, question: str) -> dict[str, Any]:
        return {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "memagent": __version__,
            "question": question,
            "document": self.document_info(),
            "model": self.model_info(),
            "settings": self.settings_info(),
            "templates_sha256": protocol.templates_sha256(),
        }


def default_trace_path(session: Session, question_index: int) -> Path:
    return trace.default_path(session.document.path, question_index)


def read_document(path: str, *, password: str | None, quiet: bool) -> Document:
    """Load a document, showing extraction progress on stderr when it takes a while."""
    with display.extraction_progress(quiet, path) as progress:
        document = load_document(path, password=password, progress=progress)
    if document.pages_without_text and not quiet:
        display.note(
            f"{document.pages_without_text} of {document.pages} pages have no text layer "
            "(scanned or images) and were skipped."
        )
    return document


def open_backend(
    model: str | None, *, threads: int | None, gpu_layers: int | None, verbose: bool
) -> tuple[models.Model, LlamaCppBackend]:
    """Find the model and open its vocabulary; weights load later, in `prepare`."""
    found = models.resolve(model)
    threads = threads or physical_cores()
    if gpu_layers is None:
        gpu_layers = -1 if can_offload() else 0
    backend = LlamaCppBackend(found.path, threads=threads, gpu_layers=gpu_layers, verbose=verbose)
    return found, backend


def open_session(
    document_path: str,
    *,
    password: str | None,
    model: str | None,
    settings: Settings,
    gpu_layers: int | None,
    threads: int | None,
    verbose: bool,
    quiet: bool,
    questions: list[str],
) -> Session:
    """Load the document and the model, chunk, and size the context; fails before reading."""
    document = read_document(document_path, password=password, quiet=quiet)
    found, backend = open_backend(model, threads=threads, gpu_layers=gpu_layers, verbose=verbose)
    context = context_needed(backend, questions, settings)
    tokens = backend.tokenize(document.text)
    chunks = make_chunks(tokens, settings.chunk_tokens, backend.detokenize)
    backend.prepare(context)
    return Session(document, tokens, chunks, found, backend, settings, context)
