"""The data folder of traces: where a new trace goes, which traces are there, and which of
them is the same run as this one (to resume it, or to answer from it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from memagent_cli import readers
from memagent_cli.folders import data_dir
from memagent_cli.trace.file import Trace, read_trace, records
from memagent_cli.trace.records import Header, TraceError


def default_dir() -> Path:
    """Where traces go unless `--trace` says otherwise."""
    return data_dir() / "traces"


def default_path(document_path: str, question_index: int = 0) -> Path:
    """A fresh, sortable trace file name for one question about one document."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(document_path).stem)[:40] or "stdin"
    return default_dir() / f"{stamp}-{stem}-q{question_index + 1}.jsonl"


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


# What makes two readings of one document and question the same run, by the flag that sets
# each: resuming or reusing a trace, continuing a batch's journal or an eval's results file
# needs these to match. The reading's own settings first...
READING_SETTINGS = {
    "chunk_tokens": "--chunk-tokens",
    "memory_tokens": "--memory-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "seed": "--seed",
    "reader": "--reader",
}
# ...then the engine's that change llama.cpp's arithmetic, and so greedy near-tie tokens.
ENGINE_SETTINGS = {
    "flash_attn": "--flash-attn",
    "cache_type_k": "--cache-type-k",
    "cache_type_v": "--cache-type-v",
    "exact": "--exact",
    "speculate": "--speculate",
}


def speculation(settings: dict[str, Any]) -> bool | None:
    """Whether a run verified drafts, where that can change its output, else None: without
    --exact a verified draft is decoded on batched kernels, and a near-tie token may come
    out otherwise than on the single-row path. A header without the key speculated (the
    default then as now)."""
    if settings.get("exact"):
        return None  # byte-identical either way
    return bool(settings.get("speculate", True))


def run_identity(model: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The model file and the settings that make a reading the same run as another, from
    the model and settings records of a trace header or an engine (run/engine.py
    Engine.model_record and settings_record()). Speculation is named only where it was off
    and that can change the output (see speculation()): traces and journals written before
    the key said nothing of it; nor did they of the reader, which was MemAgent's, and is
    named only where it is another."""
    same = {key: settings.get(key) for key in READING_SETTINGS if key != "reader"}
    same |= readers.recorded(readers.named_in(settings))
    same |= {key: settings.get(key) for key in ENGINE_SETTINGS if key != "speculate"}
    if speculation(settings) is False:
        same["speculate"] = False
    return {"model": {"path": model.get("path"), "size": model.get("size")}, "settings": same}


def differences(recorded: Header, current: Header) -> list[str]:
    """What differs between a trace's run and this one, in words ("--chunk-tokens differs
    (2000 there, 1000 here)"); empty when they are the same run."""
    there, here = _identity(recorded), _identity(current)
    found = []
    for (name, was), (_, now) in zip(there, here, strict=True):
        if was == now:
            continue
        if name == "the document":
            was = f"{recorded.document['path']} (sha256 {str(was)[:12]})"
            now = f"{current.document['path']} (sha256 {str(now)[:12]})"
        elif name == "the question":
            was, now = "another", "this one"
        elif name == ENGINE_SETTINGS["speculate"] and None in (was, now):
            continue  # one run was --exact: that difference is said already
        found.append(f"{name} differs ({_said(was)} there, {_said(now)} here)")
    return found


def _said(value: Any) -> str:
    """A setting's value as a user gives it: on and off, "not set" where a run had none."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _identity(header: Header) -> list[tuple[str, Any]]:
    """What names the run of `header`, in the order differences() tells it: the document,
    the question, run_identity(), and the prompt templates."""
    same = run_identity(header.model, header.settings)
    settings = same["settings"] | {"reader": readers.named_in(header.settings)}
    if not settings.get("exact"):  # run_identity() names only a run that did not speculate
        settings["speculate"] = settings.get("speculate", True)
    return [
        ("the document", header.document.get("sha256")),
        ("the question", header.question),
        ("the model", same["model"]["path"]),
        ("the model file's size", same["model"]["size"]),
        *((flag, settings.get(key)) for key, flag in READING_SETTINGS.items()),
        ("the prompt templates", header.templates_sha256),
        *((flag, settings.get(key)) for key, flag in ENGINE_SETTINGS.items()),
    ]


def find_run(header: Header, *, finished: bool) -> Trace | None:
    """The newest trace in the data folder of the same run as `header`, finished or not.
    Traces that cannot be read are passed over."""
    for path in _index.same_run(header):
        try:
            trace = read_trace(path)
        except TraceError:
            continue
        if trace.finished == finished and not differences(trace.header, header):
            return trace
    return None


def _identity_key(header: Header) -> str:
    return json.dumps(_identity(header), default=str)


class _Headers:
    """The identity of each trace in the data folder, from its header, read once per file:
    a batch of thousands of readings looks each one up (the cache, the journal's checks)
    without reading every trace again each time. Safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folder: Path | None = None
        self._known: dict[str, str] = {}  # file name -> identity of its run

    def same_run(self, header: Header) -> list[Path]:
        """The traces whose header names the same run as `header`, newest first."""
        folder = default_dir()
        try:
            names = os.listdir(folder)
        except OSError:
            return []
        wanted = _identity_key(header)
        found = []
        with self._lock:
            if folder != self._folder:  # another data folder (tests change XDG_DATA_HOME)
                self._folder, self._known = folder, {}
            for name in set(self._known).difference(names):
                del self._known[name]  # deleted since
            for name in names:
                if not name.endswith(".jsonl"):
                    continue
                path = folder / name
                identity = self._known.get(name)
                if identity is None:
                    identity = _read_identity(path)
                    if identity is None:
                        continue  # not (yet) a trace: a header being written, or damage
                    self._known[name] = identity
                if identity == wanted:  # read_trace and differences() have the last word
                    found.append(path)
        stamped = []
        for path in found:
            with contextlib.suppress(OSError):
                stamped.append((path.stat().st_mtime, path.name, path))
        return [path for _, _, path in sorted(stamped, reverse=True)]


def _read_identity(path: Path) -> str | None:
    try:
        first = next(records(path), None)
    except TraceError:
        return None
    return _identity_key(first) if isinstance(first, Header) else None


_index = _Headers()


def locate(name: Path | None) -> Path:
    """The trace to show: the one named, one of that name in the data folder, or the newest."""
    if name is None:
        found = recent_traces()
        if not found:
            raise TraceError(
                f"There are no traces in {default_dir()} yet; `memagent ask` writes one "
                "for every question."
            )
        return found[0]
    folder = default_dir()
    # os.path.exists: False where it cannot look (a folder it cannot enter, as another
    # user's home), and reading the trace then names why.
    if not os.path.exists(name) and len(name.parts) == 1 and os.path.exists(folder / name):
        return folder / name
    return name


def listing() -> list[dict[str, Any]]:
    """One row per trace in the data folder, newest first. A trace that cannot be read is a
    row saying so (and why), so one bad file never hides the others."""
    rows = []
    for path in recent_traces():
        try:
            loaded = read_trace(path)
        except TraceError as exc:
            rows.append({"path": str(path), "status": "unreadable", "error": exc.message})
            continue
        header, status = loaded.header, loaded.status
        rows.append(
            {
                "path": str(path),
                "created": header.created,
                "document": header.document["path"],
                "question": header.question,
                "model": header.model["name"],
                "steps_done": status.done,
                "steps_total": status.total,
                "status": status.state,
                "interrupted": status.reason,
                "answer": loaded.final.answer if loaded.final else None,
            }
        )
    return rows
