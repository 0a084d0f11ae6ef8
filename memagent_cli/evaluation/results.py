"""Results files: JSON Lines, one record per finished case, appended as each case finishes.

A run stopped by Ctrl-C or a crash loses at most the cases in flight; `eval` run again
with the same output skips the cases already there. The reader skips a line a crash left
half-written and says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memagent_cli.errors import UserError
from memagent_cli.files import (
    cannot_write,
    close_and_remove,
    drop_partial_line,
    lines,
    lock,
    open_private,
    open_regular,
    private_folder,
    sync,
)
from memagent_cli.folders import data_dir
from memagent_cli.text import json_number, json_text

MAX_RESULTS_BYTES = 1 << 30  # a record is a few KB without the document; this is not ours
# Fields every record carries; the report needs these.
REQUIRED = ("id", "group", "sub_em", "seconds", "tokens")
# What the report computes with, as memagent writes it: labels, and numbers it divides.
_LABELS = ("id", "group")
_NUMBERS = ("sub_em", "seconds", "tokens")
_OPTIONAL_NUMBERS = ("em", "f1", "depth")


class ResultsError(UserError):
    """A results file that cannot be read or written."""


@dataclass
class Results:
    """The records of one results file, read back."""

    path: Path
    records: list[dict[str, Any]]
    skipped: int = 0  # lines that were damaged or not records

    @property
    def finished(self) -> set[tuple[str, str]]:
        """(group, id) of every case already run."""
        return {(str(r["group"]), str(r["id"])) for r in self.records}

    @property
    def label(self) -> str:
        """The run's name in a plot legend or a comparison: its file name."""
        return self.path.stem


def default_dir() -> Path:
    """Where results files go unless `--output` says otherwise."""
    return data_dir() / "evals"


def default_path(first_data: Path, now: datetime | None = None) -> Path:
    """A new results file in the data folder, named after the time and the data."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", first_data.stem)[:40] or "data"
    return default_dir() / f"{stamp}-{name}.jsonl"


def read(path: Path, *, missing_ok: bool = False) -> Results:
    """The records of `path`; a missing file is an empty run when `missing_ok`."""
    if missing_ok and not path.exists():
        return Results(path, [])
    records, skipped = [], 0
    # Read through the handle that was checked: a path opened again could be another file.
    with open_regular(path, "results file", limit=MAX_RESULTS_BYTES, error=ResultsError) as file:
        try:
            for number, (line, state) in enumerate(_whole(lines(file)), 1):
                record = _record(line) if state != "long" else None
                if record is None:
                    skipped += line.strip() != b""
                    continue
                if wrong := _wrong_field(record):
                    raise ResultsError(
                        f"{path}, line {number} has a {wrong!r} field of the wrong type or "
                        "out of range."
                    )
                records.append(record)
        except OSError as exc:
            raise ResultsError(f"Cannot read results file {path}: {exc.strerror}.") from None
    if skipped and not records:
        raise ResultsError(f"{path} holds no eval results (JSON Lines from `memagent eval`).")
    return Results(path, records, skipped)


def _whole(items: Iterator[tuple[bytes, str] | None]) -> Iterator[tuple[bytes, str]]:
    """files.lines without its polls (it is not following)."""
    return (item for item in items if item is not None)


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # also bad UTF-8, deep nesting and huge numbers
        return None
    if not isinstance(record, dict) or any(name not in record for name in REQUIRED):
        return None
    return record


def _wrong_field(record: dict[str, Any]) -> str:
    """The first field of a result the report cannot use as it is ("" when all can be)."""
    for name in _LABELS:
        if isinstance(record[name], bool) or not isinstance(record[name], str | int):
            return name
    for name in (*_NUMBERS, *_OPTIONAL_NUMBERS):
        value = record.get(name)
        if value is None and name in _OPTIONAL_NUMBERS:
            continue
        if not json_number(value):
            return name
    return ""


class Writer:
    """Appends one record per finished case, each flushed to disk before the next case,
    holding the file's lock until closed: a second eval on the same file is refused, never
    interleaved. Opened before any model loads, so that both fail in seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._created = not path.exists()
        try:
            private_folder(path.parent)
            self._file = open_private(path, "a")
        except OSError as exc:
            reason = cannot_write(path, exc)
            raise ResultsError(f"Cannot write results to {path}: {reason}.") from None
        try:
            if not lock(self._file):
                raise ResultsError(
                    f"Another memagent eval is writing {path}; wait for it to end (or stop "
                    "it), then run this again to continue the file."
                )
            drop_partial_line(path)  # a kill in the middle of a line (the lock is ours now)
        except BaseException:
            self._file.close()
            raise

    def add(self, record: dict[str, Any]) -> None:
        self._file.write(json_text(record) + "\n")
        sync(self._file)

    def close(self) -> None:
        """Let the file go; one this writer made and wrote nothing to is removed (a run that
        failed before its first case leaves no empty results file)."""
        if self._file.closed:
            return
        if self._created and self._file.tell() == 0:
            close_and_remove(self._file, self.path)  # Windows: not while it is open
        self._file.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
