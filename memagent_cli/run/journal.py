"""A batch's journal: which trace each reading of a batch writes. It lives in the data
folder while the batch runs, so that the same command run again after a kill, a Ctrl-C or
a failing server takes every reading up where its trace ends (or answers it from its
finished trace) instead of reading it again; a batch whose every reading was answered
removes it, and the same command later is a new batch.

One line per reading started: {"reading": KEY, "trace": PATH}, appended and flushed before
the reading's first step, so a kill at any moment leaves every trace findable. A lock on the
file keeps two processes from running the same batch at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from memagent_cli import trace
from memagent_cli.errors import UserError
from memagent_cli.files import (
    MAX_LINE_BYTES,
    cannot_write,
    check_folder,
    close_and_remove,
    drop_partial_line,
    lock,
    open_private,
    private_folder,
    sync,
)
from memagent_cli.run.engine import Engine
from memagent_cli.text import json_text

# A line a reading, of a few hundred bytes: room for millions. Read whole when a batch
# starts, so a larger file is not one memagent wrote.
MAX_JOURNAL_BYTES = 1 << 30


def journal_dir() -> Path:
    """Where journals live: beside the traces in the data folder."""
    return trace.default_dir().parent / "batches"


def check_data_folder() -> None:
    """Fail with one sentence, before any model loads, when runs cannot keep their traces
    and journals in the data folder (read-only, another user's, a file in its place)."""
    check_folder(trace.default_dir(), "traces")
    check_folder(journal_dir(), "batch journals")


class Journal:
    """The traces of one batch's readings, by reading key; safe to share between threads."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._traces: dict[str, Path] = {}
        if os.path.exists(path) and not os.path.isfile(path):  # a FIFO, a device, a folder
            raise UserError(f"The batch journal {path} is not a regular file; move it away.")
        try:
            private_folder(path.parent)
            self._file: IO[str] = open_private(path, "a+")
        except OSError as exc:
            reason = cannot_write(path, exc)
            raise UserError(f"Cannot write the batch journal {path}: {reason}.") from None
        info = os.fstat(self._file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_JOURNAL_BYTES:
            self._file.close()  # a FIFO's read would wait for a writer forever
            what = "is not a regular file" if not stat.S_ISREG(info.st_mode) else "is too large"
            raise UserError(f"The batch journal {path} {what}; move it away.")
        if not lock(self._file):
            self._file.close()
            raise UserError(
                "The same command is running in another memagent process (its journal "
                f"{path} is locked); wait for it, or stop it and run this again."
            )
        drop_partial_line(path)  # a kill in the middle of a line (the lock is ours now)
        self._file.seek(0)
        for line in self._file:
            if len(line) > MAX_LINE_BYTES:
                continue
            with contextlib.suppress(ValueError, TypeError, KeyError):
                entry = json.loads(line)
                if "reading" in entry:
                    self._traces[str(entry["reading"])] = Path(entry["trace"])
        if self._file.tell() == 0:
            self._write({"batch": identity})

    @property
    def continued(self) -> int:
        """Readings an earlier run of this batch had started."""
        return len(self._traces)

    def entry(self, key: str) -> Entry:
        """The journal's line for the reading `key` (its document and question)."""
        return Entry(self, key)

    def trace_of(self, key: str) -> Path | None:
        with self._lock:
            return self._traces.get(key)

    def started(self, key: str, trace_path: Path) -> None:
        """Record, before its first step, the trace the reading `key` writes."""
        with self._lock:
            if self._traces.get(key) == trace_path:
                return
            self._traces[key] = trace_path
            self._write({"reading": key, "trace": str(trace_path)})

    def close(self, *, finished: bool) -> None:
        """Let the journal go: removed when every reading of the batch was answered or
        none wrote a trace (those of encrypted documents write none), else kept for the same
        command to continue."""
        with self._lock:
            if self._file.closed:
                return
            if finished or not self._traces:
                close_and_remove(self._file, self.path)  # closed first where it must be
            self._file.close()  # releases the lock

    def _write(self, line: dict[str, Any]) -> None:
        self._file.write(json_text(line) + "\n")
        sync(self._file)


@dataclass(frozen=True)
class Entry:
    """One reading's place in its batch's journal."""

    journal: Journal
    key: str

    @property
    def earlier(self) -> Path | None:
        """The trace an earlier, stopped run of the batch wrote for this reading, if any."""
        return self.journal.trace_of(self.key)

    def started(self, trace_path: Path) -> None:
        self.journal.started(self.key, trace_path)


def run_identity(engine: Engine) -> dict[str, Any]:
    """The model and the settings a batch reads with, as its journal is named by them: what
    makes two readings the same run (trace/folder.py), so that a batch's journal and the
    traces it names agree."""
    return trace.run_identity(engine.model_record, engine.settings_record())


def open_journal(identity: dict[str, Any]) -> Journal:
    """The journal of the batch that `identity` names (its command, inputs, model and
    settings, JSON-serializable): the one left by an earlier run of it, or a new one."""
    name = hashlib.sha256(json_text(identity, sort_keys=True).encode()).hexdigest()[:32]
    return Journal(journal_dir() / f"{name}.jsonl", identity)
