"""Trace files: JSON Lines, one header, one record per step, one final record.

The writer appends and flushes after every step, so a crash or Ctrl-C loses at most the
step in flight. The reader is tolerant: it reads as far as a damaged file goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import platformdirs

from memagent_cli.errors import UserError
from memagent_cli.reader import Answer, Event, Finished, StepFinished, evidence

FORMAT_VERSION = 1


class TraceError(UserError):
    """A file that cannot be read as a trace."""


def default_dir() -> Path:
    """Where traces go unless `--trace` says otherwise."""
    return platformdirs.user_data_path("memagent") / "traces"


def default_path(document_path: str, question_index: int = 0) -> Path:
    """A fresh, sortable trace file name for one question about one document."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(document_path).stem)[:40] or "stdin"
    return default_dir() / f"{stamp}-{stem}-q{question_index + 1}.jsonl"


class TraceWriter:
    """Appends one JSON line per event to a trace file and flushes it to disk."""

    def __init__(
        self,
        path: Path,
        header: dict[str, Any],
        span_of: Callable[[int, int], str] = lambda start, end: "",
        *,
        resume_from: int | None = None,
    ) -> None:
        """A new trace with `header`, or, with `resume_from`, the same trace continued after
        that many finished steps."""
        self.path = path
        self._span_of = span_of
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from is not None:
            _drop_partial_line(path)
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._steps_done = resume_from or 0
        if resume_from is None:
            self._write({"type": "header", "format": FORMAT_VERSION, **header})
        else:
            self._write({"type": "resumed", "steps_done": resume_from, "at": _now()})

    def __call__(self, event: Event) -> None:
        if isinstance(event, StepFinished):
            step = event.step
            chunk, gen = step.chunk, step.generation
            self._write(
                {
                    "type": "step",
                    "index": chunk.index,
                    "tokens": [chunk.token_start, chunk.token_end],
                    "chars": [chunk.char_start, chunk.char_end],
                    "span": self._span_of(chunk.char_start, chunk.char_end),
                    "chunk_sha256": hashlib.sha256(chunk.text.encode()).hexdigest(),
                    "memory": step.memory,
                    "prompt_tokens": gen.prompt_tokens,
                    "completion_tokens": gen.completion_tokens,
                    "finish_reason": gen.finish_reason,
                    "prompt_seconds": round(gen.prompt_seconds, 3),
                    "seconds": round(gen.seconds, 3),
                }
            )
            self._steps_done += 1
        elif isinstance(event, Finished):
            self._write(final_record(event.answer, self._span_of))

    def interrupted(self, reason: str) -> None:
        """Record where an interrupted run stopped, so a reader knows it is unfinished."""
        self._write({"type": "interrupted", "reason": reason, "steps_done": self._steps_done})

    def close(self) -> None:
        self._file.close()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _drop_partial_line(path: Path) -> None:
    """Cut a line left half-written by a crash, so appended records start on their own line."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as file:
            file.truncate(end)


def evidence_record(answer: Answer, span_of: Callable[[int, int], str]) -> dict[str, Any] | None:
    """Where the answer entered the memory: step index, span, token and character range."""
    step = evidence(answer)
    if step is None:
        return None
    chunk = step.chunk
    return {
        "step": chunk.index,
        "span": span_of(chunk.char_start, chunk.char_end),
        "tokens": [chunk.token_start, chunk.token_end],
        "chars": [chunk.char_start, chunk.char_end],
    }


def final_record(answer: Answer, span_of: Callable[[int, int], str]) -> dict[str, Any]:
    final = answer.final
    return {
        "type": "final",
        "reply": answer.reply,
        "answer": answer.answer,
        "evidence": evidence_record(answer, span_of),
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.completion_tokens,
        "finish_reason": final.finish_reason,
        "seconds": round(final.seconds, 3),
    }


@dataclass
class Trace:
    """What a trace file holds, as far as it could be read."""

    path: Path
    header: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    interrupted: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)  # what could not be read, in words

    @property
    def finished(self) -> bool:
        return self.final is not None


def read_trace(path: Path) -> Trace:
    """Read a trace as far as it goes; a file that is not a trace raises TraceError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"Trace not found: {path}") from None
    except OSError as exc:
        raise TraceError(f"Cannot read trace {path}: {exc.strerror}.") from None
    lines = raw.decode("utf-8", errors="replace").split("\n")
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or "type" not in record:
            is_last = all(not rest.strip() for rest in lines[number:])
            if not records:
                break
            problems.append(
                f"line {number} is cut short (the run was probably killed while writing it)"
                if is_last
                else f"line {number} is not a trace record and was skipped"
            )
            continue
        records.append(record)
    if not records or records[0].get("type") != "header":
        raise TraceError(f"{path} is not a memagent trace (it has no trace header).")
    header = records[0]
    version = header.get("format")
    if version != FORMAT_VERSION:
        problems.append(f"trace format {version} is not {FORMAT_VERSION}; read as far as it goes")
    trace = Trace(path=path, header=header, problems=problems)
    for record in records[1:]:
        kind = record.get("type")
        if kind == "step":
            trace.steps.append(record)
        elif kind == "final":
            trace.final = record
        elif kind == "interrupted":
            trace.interrupted = record
        elif kind == "resumed":
            trace.interrupted = None
    return trace


# What makes two runs the same run: resuming or reusing a trace needs all of these to match.
_IDENTITY = {
    "the document": ("document", "sha256"),
    "the question": ("question",),
    "the model": ("model", "path"),
    "the model file's size": ("model", "size"),
    "--chunk-tokens": ("settings", "chunk_tokens"),
    "--memory-tokens": ("settings", "memory_tokens"),
    "--temperature": ("settings", "temperature"),
    "--top-p": ("settings", "top_p"),
    "--seed": ("settings", "seed"),
    "the prompt templates": ("templates_sha256",),
}


def _field(header: dict[str, Any], keys: tuple[str, ...]) -> Any:
    value: Any = header
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between a trace's run and this one, in words ("--chunk-tokens: 2000 there,
    1000 here"); empty when they are the same run."""
    found = []
    for name, keys in _IDENTITY.items():
        there, here = _field(recorded, keys), _field(current, keys)
        if there != here:
            if keys == ("document", "sha256"):
                there = f"{_field(recorded, ('document', 'path'))} (sha256 {str(there)[:12]})"
                here = f"{_field(current, ('document', 'path'))} (sha256 {str(here)[:12]})"
            elif isinstance(there, (dict, type(None))) or isinstance(here, dict):
                there, here = "other", "these"
            found.append(f"{name} differs ({there} there, {here} here)")
    return found


def find_run(header: dict[str, Any], *, finished: bool) -> Trace | None:
    """The newest trace in the data folder of the same run as `header`, finished or not."""
    for path in recent_traces():
        try:
            with path.open("rb") as file:
                first = json.loads(file.readline())
        except (OSError, ValueError):
            continue
        if not isinstance(first, dict) or differences(first, header):
            continue
        try:
            trace = read_trace(path)
        except TraceError:
            continue
        if trace.finished == finished:
            return trace
    return None


def recent_traces(directory: Path | None = None) -> list[Path]:
    """The trace files in `directory` (default: `default_dir()`), newest first."""
    folder = directory or default_dir()
    if not folder.is_dir():
        return []
    stamped = []
    for path in folder.glob("*.jsonl"):
        try:
            stamped.append((path.stat().st_mtime, path.name, path))
        except OSError:  # removed while listing
            continue
    return [path for _, _, path in sorted(stamped, reverse=True)]
