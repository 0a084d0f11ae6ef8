"""Trace files: JSON Lines, one header, one record per step, one final record.

The writer appends and flushes after every step, so a crash or Ctrl-C loses at most the
step in flight. The reader is tolerant: it reads as far as a damaged file goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
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
    ) -> None:
        self.path = path
        self._span_of = span_of
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._steps_done = 0
        self._write({"type": "header", "format": FORMAT_VERSION, **header})

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


def evidence_record(
    answer: Answer, span_of: Callable[[int, int], str]
) -> dict[str, Any] | None:
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
    return trace


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


def follow(path: Path, poll_seconds: float = 0.2) -> Iterator[dict[str, Any]]:
    """Every record of a trace as its line lands on disk, waiting for more; never ends.

    A line still being written waits for the rest; a line that is not a record is skipped.
    """
    pending = b""
    with path.open("rb") as file:
        while True:
            data = file.read()
            if not data:
                time.sleep(poll_seconds)
                continue
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "type" in record:
                    yield record
