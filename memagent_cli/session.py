"""One `ask` session: a document, its chunks and a loaded model, asked one question at a time.

This is where the pure core (documents, chunking, protocol, reader) meets the edges
(model files, traces, the display).
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memagent_cli import __version__, display, models, protocol, trace
from memagent_cli.backends import Backend, Generation
from memagent_cli.backends.llama_cpp import LlamaCppBackend, can_offload, physical_cores
from memagent_cli.chunking import Chunk, make_chunks
from memagent_cli.documents import Document, load_document
from memagent_cli.errors import DocumentError, Interrupted, UserError
from memagent_cli.reader import (
    Answer,
    Settings,
    Step,
    StepFinished,
    StepStarted,
    context_needed,
    read,
)


def questions_from_file(path: Path, what: str = "questions") -> list[str]:
    """Non-empty lines of a questions (or documents) file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise DocumentError(f"{what.capitalize()} file not found: {path}") from None
    except OSError as exc:
        raise DocumentError(f"Cannot read {what} file {path}: {exc.strerror}.") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


@dataclass
class Result:
    """One answered question, with everything `--json` reports."""

    answer: Answer
    session: Session
    seconds: float
    trace_path: Path | None
    cached: bool = False  # answered from a finished trace, without reading

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
            "cached": self.cached,
        }


class Stopped(Exception):
    """A run ended before its answer: interrupted, or the backend failed. The trace keeps
    every finished step."""

    def __init__(
        self, reason: str, exit_code: int, done: int, total: int, trace_path: Path | None
    ) -> None:
        super().__init__(reason)
        self.reason, self.exit_code = reason, exit_code
        self.done, self.total, self.trace_path = done, total, trace_path

    @property
    def message(self) -> str:
        kept = f"; the trace {self.trace_path} keeps them" if self.trace_path else ""
        progress = f"after {self.done} of {self.total} steps{kept}."
        if self.exit_code == 130:
            return f"Interrupted ({self.reason}) {progress}"
        return f"{self.reason.rstrip('.')}. Stopped {progress}"


class Engine:
    """A model ready to read any document: its backend, name, settings and context size."""

    def __init__(
        self, backend: Backend, model_info: dict[str, Any], settings: Settings, context: int
    ) -> None:
        self.backend = backend
        self.model_info = model_info
        self.settings = settings
        self.context = context
        self._prepared = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Load the weights on first use: answers from traces never need them."""
        with self._lock:
            if not self._prepared:
                self.backend.prepare(self.context)
                self._prepared = True

    def settings_info(self) -> dict[str, Any]:
        return {
            "chunk_tokens": self.settings.chunk_tokens,
            "memory_tokens": self.settings.memory_tokens,
            **asdict(self.settings.sampling),
            "context_tokens": self.context,
            "threads": getattr(self.backend, "threads", 0),
            "gpu_layers": getattr(self.backend, "gpu_layers", 0),
        }


class Session:
    """A document cut into chunks, and the engine that reads it."""

    def __init__(
        self, document: Document, tokens: list[int], chunks: list[Chunk], engine: Engine
    ) -> None:
        self.document = document
        self.tokens = tokens
        self.chunks = chunks
        self.engine = engine
        self.settings = engine.settings

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
        return self.engine.model_info

    def settings_info(self) -> dict[str, Any]:
        return self.engine.settings_info()

    def ask(
        self,
        question: str,
        *,
        trace_path: Path | None,
        quiet: bool,
        resume: Path | None = None,
        latest: bool = False,
        use_cache: bool = True,
        label: str = "",
        cancel: threading.Event | None = None,
    ) -> Result:
        """Read the whole document for `question`, writing the trace as it goes.

        `resume` (a trace) or `latest` (the newest unfinished trace of this run) continues an
        interrupted run after its last finished step. An identical finished greedy run is
        answered from its trace unless `use_cache` is off. `label` prefixes progress lines
        (several runs at once); setting `cancel` stops the run before its next step.
        """
        header = self._trace_header(question)
        start = time.perf_counter()
        if use_cache and self.settings.sampling.temperature == 0 and resume is None:
            cached = trace.find_run(header, finished=True)
            if cached is not None:
                if not quiet:
                    display.note(
                        f"answered from the finished trace {cached.path} (--no-cache "
                        "reads the document again)"
                    )
                return self._result_from(cached, start, cached=True)
        done: list[Step] = []
        resuming = resume is not None or latest
        if resuming:
            earlier = self._trace_to_resume(header, resume)
            if earlier.finished:
                if not quiet:
                    display.note(f"{earlier.path} is already finished; its answer follows.")
                return self._result_from(earlier, start, cached=True)
            done = self._steps_of(earlier)
            trace_path = earlier.path
            if not quiet:
                display.note(f"resuming {trace_path} after step {len(done)} of {len(self.chunks)}")
        self.engine.prepare()
        writer = None
        if trace_path is not None:
            writer = trace.TraceWriter(
                trace_path, header, self.span_of, resume_from=len(done) if resuming else None
            )
            if not quiet and not resuming:
                display.note(f"trace: {trace_path}")
        finished = len(done)

        def listener(event: Any) -> None:
            nonlocal finished
            if isinstance(event, StepStarted) and cancel is not None and cancel.is_set():
                raise Interrupted("SIGINT")
            if isinstance(event, StepFinished):
                finished += 1
            if writer is not None:
                writer(event)
            view(event)

        title = f"{Path(self.document.path).name} · {self.model_info()['name']} · {question}"
        view = display.progress_view(quiet, self.span_of, len(self.tokens), title, label)
        try:
            with view:
                answer = read(
                    self.engine.backend, question, self.chunks, self.settings, listener, done=done
                )
        except (KeyboardInterrupt, Interrupted, UserError) as exc:
            reason = exc.message if isinstance(exc, UserError) else (str(exc) or "SIGINT")
            if writer is not None:
                writer.interrupted(reason)
            code = exc.exit_code if isinstance(exc, UserError) else 130
            raise Stopped(reason, code, finished, len(self.chunks), trace_path) from None
        finally:
            if writer is not None:
                writer.close()
        return Result(answer, self, time.perf_counter() - start, trace_path)

    def _trace_to_resume(self, header: dict[str, Any], path: Path | None) -> trace.Trace:
        if path is None:
            found = trace.find_run(header, finished=False)
            if found is None:
                raise UserError(
                    "There is no unfinished trace of this document, question, model and "
                    "settings to resume; name one with --resume TRACE."
                )
            return found
        earlier = trace.read_trace(path)
        if differences := trace.differences(earlier.header, header):
            raise UserError(f"Cannot resume {path}: " + "; ".join(differences) + ".")
        return earlier

    def _steps_of(self, earlier: trace.Trace) -> list[Step]:
        """The finished steps of a trace, checked against this session's chunks."""
        steps = []
        for index, record in enumerate(earlier.steps):
            chunk = self.chunks[index] if index < len(self.chunks) else None
            if (
                chunk is None
                or record.get("index") != index
                or record.get("chunk_sha256") != _sha256(chunk.text)
            ):
                raise UserError(
                    f"Cannot resume {earlier.path}: its step {index + 1} did not read the chunk "
                    "this run would read (a different tokenizer or build?)."
                )
            steps.append(Step(chunk, record["memory"], _generation(record)))
        return steps

    def _result_from(self, earlier: trace.Trace, start: float, *, cached: bool) -> Result:
        steps = self._steps_of(earlier)
        final = earlier.final or {}
        answer = Answer(
            question=earlier.header["question"],
            answer=final.get("answer"),
            reply=final.get("reply", ""),
            steps=steps,
            final=_generation(final),
        )
        return Result(answer, self, time.perf_counter() - start, earlier.path, cached=cached)

    def _trace_header(self, question: str) -> dict[str, Any]:
        return {
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "memagent": __version__,
            "question": question,
            "document": self.document_info(),
            "model": self.model_info(),
            "settings": self.settings_info(),
            "templates_sha256": protocol.templates_sha256(),
        }


def default_trace_path(session: Session, question_index: int) -> Path:
    return trace.default_path(session.document.path, question_index)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _generation(record: dict[str, Any]) -> Generation:
    """A step's or the final reply's cost, as a trace recorded it."""
    return Generation(
        text=record.get("memory", record.get("reply", "")),
        prompt_tokens=record.get("prompt_tokens", 0),
        completion_tokens=record.get("completion_tokens", 0),
        prompt_seconds=record.get("prompt_seconds", 0.0),
        seconds=record.get("seconds", 0.0),
        finish_reason=record.get("finish_reason", "stop"),
    )


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


def open_engine(
    *,
    backend: str,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    served_model: str | None,
    encoding: str,
    settings: Settings,
    threads: int | None,
    gpu_layers: int | None,
    verbose: bool,
    quiet: bool,
    questions: list[str],
) -> Engine:
    """The model that will read, with its context sized for one step; fails before reading."""
    if backend == "openai":
        from memagent_cli.backends.openai import OpenAIBackend

        if not base_url:
            raise UserError("--backend openai needs --base-url (or $MEMAGENT_BASE_URL).")
        server = OpenAIBackend(
            base_url,
            api_key=api_key,
            served_model=served_model,
            encoding=encoding,
            note=(lambda message: None) if quiet else display.note,
        )
        info = {"path": server.base_url, "name": server.served_model, "size": None}
        return Engine(server, info, settings, context_needed(server, questions, settings))
    found, local = open_backend(model, threads=threads, gpu_layers=gpu_layers, verbose=verbose)
    path = found.path.resolve()
    info = {"path": str(path), "name": found.name, "size": path.stat().st_size}
    return Engine(local, info, settings, context_needed(local, questions, settings))


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


def open_session(path: str, engine: Engine, *, password: str | None, quiet: bool) -> Session:
    """Load and chunk one document for `engine`."""
    document = read_document(path, password=password, quiet=quiet)
    tokens = engine.backend.tokenize(document.text)
    chunks = make_chunks(tokens, engine.settings.chunk_tokens, engine.backend.detokenize)
    return Session(document, tokens, chunks, engine)


_SUPPORTED_SUFFIXES = {".txt", ".md", ".markdown", ".text", ".rst", ".pdf", ".epub"}


def document_paths(argument: str, listing: Path | None, pattern: str | None) -> list[str]:
    """The documents to read: DOCUMENT (a file, `-`, or a folder searched recursively for
    supported files, filtered by `pattern`) plus the paths listed in `listing`."""
    paths: list[str] = []
    if argument:
        folder = Path(argument)
        if argument != "-" and folder.is_dir():
            found = sorted(
                str(p)
                for p in folder.rglob(pattern or "*")
                if p.is_file() and (pattern or p.suffix.lower() in _SUPPORTED_SUFFIXES)
            )
            if not found:
                raise DocumentError(
                    f"{argument} holds no supported documents"
                    + (f" matching {pattern}." if pattern else ".")
                )
            paths += found
        else:
            paths.append(argument)
    if listing is not None:
        paths += questions_from_file(listing, what="documents")
    return paths
