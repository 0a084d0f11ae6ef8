"""Trace files on disk: read record by record (tolerant of a damaged end, strict about
record fields), followed while a run writes them, and written one flushed line per step.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, BinaryIO

from memagent_cli import readers
from memagent_cli.files import (
    MAX_LINE_BYTES,
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
from memagent_cli.provenance import PlaceOf, place_of_label
from memagent_cli.reader import Event, Finished, StepFinished
from memagent_cli.readers.spec import StepField
from memagent_cli.text import json_text
from memagent_cli.trace.records import (
    FORMAT_VERSION,
    KINDS,
    FinalRecord,
    Header,
    Interruption,
    Record,
    Reply,
    Resumed,
    Skipped,
    SpanOf,
    StepRecord,
    TraceError,
)

MAX_TRACE_BYTES = 1 << 30  # a 3.5M-token run writes a few MB; anything near this is not ours
# Problems said one by one; past these, counted in one line: a file of a million bad lines
# took minutes to print, a warning each, and held each in memory.
MAX_PROBLEMS = 20
POLL_SECONDS = 0.2


def _parse(
    line: bytes, number: int, where: str, version: int, fields: Sequence[StepField] = ()
) -> Record | Skipped | None:
    """The record on a line of a trace of format `version`, typed and checked; a step's
    with what `fields` say its reader's steps carry (Spec.fields)."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # also absurdly deep nesting and huge numbers
        record = None
    kind = record.get("type") if isinstance(record, dict) else None
    if kind not in KINDS:
        return Skipped(number, "is not a trace record")
    if kind == "step":
        return StepRecord.parse(record, f"{where}, line {number}", version, fields)
    return KINDS[kind].parse(record, f"{where}, line {number}", version)


def records(
    path: Path, *, follow: bool = False, poll: float = POLL_SECONDS
) -> Iterator[Record | Skipped | None]:
    """Every record of the trace at `path` in order, typed; lines that are not records come
    as `Skipped`. With `follow`, waits for records still being written, yields None after
    each poll in which nothing arrived, and never ends."""
    with open_regular(path, "trace", limit=MAX_TRACE_BYTES, error=TraceError) as file:
        yield from read_records(file, str(path), follow=follow, poll=poll)


def read_records(
    file: BinaryIO, where: str, *, follow: bool = False, poll: float = POLL_SECONDS
) -> Iterator[Record | Skipped | None]:
    """The records of a trace's bytes in `file` (`records`), `where` naming it in errors."""
    number, version, fields = 0, FORMAT_VERSION, ()
    for item in lines(file, limit=MAX_LINE_BYTES, follow=follow, poll=poll):
        if item is None:
            yield None
            continue
        number += 1
        line, state = item
        if state == "cut":
            yield Skipped(number, "is cut short (the run was probably killed while writing it)")
        elif state == "long":
            yield Skipped(number, f"is longer than {MAX_LINE_BYTES:,} bytes")
        elif (parsed := _parse(line, number, where, version, fields)) is not None:
            if isinstance(parsed, Header) and number == 1:
                version = parsed.format  # the records after it are in its format
                fields = readers.fields_of(parsed.settings)  # and hold what its reader's do
            yield parsed


@dataclass(frozen=True)
class Status:
    """How far a run got: finished, interrupted after k of n steps, or neither."""

    state: str  # "finished", "interrupted", "unfinished" or "not started"
    done: int
    total: int
    reason: str | None = None  # why it was interrupted

    def __str__(self) -> str:
        if self.state == "finished":
            return "finished"
        of = f"{self.done} of {self.total} steps"
        if self.state == "interrupted":
            return f"interrupted ({self.reason}) after {of}"
        if self.state == "not started":
            return f"not started: 0 of {self.total} steps (still loading, or stopped before step 1)"
        return f"unfinished: {of} (still running, or the run was killed)"


@dataclass
class Trace:
    """A run as far as its trace goes, built record by record (`add`)."""

    path: Path
    header: Header
    steps: list[StepRecord] = field(default_factory=list)
    final: FinalRecord | None = None
    interruption: Interruption | None = None
    problems: list[str] = field(default_factory=list)  # what could not be read, in words
    ended: bool = False  # a second run starts in the file; nothing after it is read
    unlisted: int = 0  # problems past MAX_PROBLEMS, counted in the last entry of `problems`

    @property
    def finished(self) -> bool:
        return self.final is not None

    @property
    def total_steps(self) -> int:
        """The steps of the reading as far as the trace tells: its chunks, or where the
        reader read them again (PI-Mem's passes, MemReread's rereads), those of the passes
        it began."""
        chunks, done = self.header.total_steps, len(self.steps)
        return max(chunks, -(-done // chunks) * chunks) if chunks else done

    @property
    def status(self) -> Status:
        done, total = len(self.steps), self.total_steps
        if self.final is not None:
            return Status("finished", done, total)
        if self.interruption is not None:
            return Status("interrupted", done, total, self.interruption.reason)
        return Status("not started" if done == 0 else "unfinished", done, total)

    def add(self, item: Record | Skipped) -> None:
        """Take the next record of the file into the run."""
        if self.ended:
            return
        if isinstance(item, Skipped):
            self._problem(f"line {item.line} {item.why} and was skipped")
        elif isinstance(item, Header):
            self._problem("a second run starts later in the file; only the first is read")
            self.ended = True
        elif isinstance(item, StepRecord):
            expected = len(self.steps)
            if item.index != expected:
                self._problem(
                    f"a record of step {item.index + 1} came where step {expected + 1} was due "
                    "and was skipped"
                )
                return
            self.steps.append(item)
            self.interruption = None
        elif isinstance(item, Resumed):
            if item.steps_done > len(self.steps):
                self._problem(
                    f"a resumed run claims {item.steps_done} finished steps, the file holds "
                    f"{len(self.steps)}"
                )
            del self.steps[item.steps_done :]
            self.interruption = None
        elif isinstance(item, Interruption):
            self.interruption = item
        elif isinstance(item, FinalRecord):
            self.final = item

    def _problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
            return
        self.unlisted += 1
        more = f"{self.unlisted:,} more problems like these are not listed"
        if self.unlisted == 1:
            self.problems.append(more)
        else:
            self.problems[-1] = more

    def to_json(self) -> dict[str, Any]:
        status = self.status
        return {
            "path": str(self.path),
            "status": status.state,
            "steps_done": status.done,
            "steps_total": status.total,
            # The records as this memagent writes them, whatever format the file has.
            "header": {**self.header.to_json(), "format": FORMAT_VERSION},
            "steps": [s.to_json() for s in self.steps],
            "final": self.final.to_json() if self.final else None,
            "interrupted": self.interruption.to_json() if self.interruption else None,
            "problems": self.problems,
        }


def start(path: Path, first: Record | Skipped | None) -> Trace:
    """A Trace from its first record; TraceError when the file does not start like one."""
    if not isinstance(first, Header):
        raise TraceError(f"{path} is not a memagent trace (it has no trace header).")
    return Trace(path, first)


def read_trace(path: Path) -> Trace:
    """The whole trace at `path`, as far as it goes; TraceError when it is not one."""
    items = records(path)
    trace = start(path, next(items, None))
    for item in items:
        if item is not None:
            trace.add(item)
    return trace


# ------------------------------------------------------------------------------ writing


def check_new(path: Path) -> None:
    """Fail with a sentence unless a fresh run can write its trace at `path`: it must not hold
    another run, and a file must be creatable there."""
    # os.path.exists, not Path.exists: in a folder this user cannot enter (another user's
    # home) the latter raises PermissionError; the probe below names the reason.
    if os.path.exists(path):
        if not path.is_file():  # a FIFO or a device: no run to resume there either
            raise TraceError(f"Trace {path} is not a regular file; give another --trace path.")
        if path.stat().st_size == 0:
            return
        raise TraceError(_exists(path))
    if os.path.islink(path):  # to nothing, or a loop: the probe's O_EXCL would say "exists"
        try:
            os.stat(path)
        except FileNotFoundError:
            why = "it is a link to a file that does not exist"
        except OSError as exc:  # a loop of links
            why = exc.strerror or type(exc).__name__
        else:  # its file was made meanwhile
            raise TraceError(_exists(path))
        raise TraceError(f"Cannot write the trace {path}: {why}.")
    try:  # the only sure test is to try: permissions, read-only mounts, /proc, a full disk
        private_folder(path.parent)
        with open_private(path, "x") as probe:
            # Locked while it goes: a run that opened it meanwhile sees it gone once it has
            # the lock (_open_fresh), and makes its trace again.
            lock(probe)
            close_and_remove(probe, path)
    except OSError as exc:
        raise TraceError(f"Cannot write the trace {path}: {cannot_write(path, exc)}.") from None


def _exists(path: Path) -> str:
    return (
        f"{path} already exists; continue its run with --resume {path}, or give another "
        "--trace path (a fresh run never writes into an old trace)."
    )


def _open_fresh(path: Path) -> IO[str]:
    """The new trace at `path`, open, locked and empty. It is opened without truncating and
    checked once open: a run started beside this one with the same path may hold it or have
    written it (truncating first would wipe that run's lines), and check_new's probe may
    unlink the file between this open and this lock (then it is made again). No probe of
    its own: the open is the test that the file can be written."""
    for _ in range(3):
        try:
            private_folder(path.parent)
            handle = open_private(path, "a")
        except OSError as exc:
            raise TraceError(f"Cannot write the trace {path}: {cannot_write(path, exc)}.") from None
        try:
            if os.fstat(handle.fileno()).st_size:  # another run's, finished or writing
                raise TraceError(_exists(path))
            if not lock(handle):
                raise TraceError(_busy(path))
            try:
                if os.path.samestat(os.fstat(handle.fileno()), path.stat()):
                    return handle
            except FileNotFoundError:
                pass
        except BaseException:
            handle.close()
            raise
        handle.close()
    raise TraceError(f"Cannot write the trace {path}: another process keeps removing it.")


def check_resumable(path: Path) -> None:
    """Fail with a sentence unless the trace at `path` can be continued now: it must be
    writable, and no other run may be writing it."""
    try:
        with open_private(path, "a") as file:
            if not lock(file):
                raise TraceError(_busy(path))
    except FileNotFoundError:
        raise TraceError(f"Trace not found: {path}") from None
    except OSError as exc:
        raise TraceError(f"Cannot write the trace {path}: {cannot_write(path, exc)}.") from None


def _busy(path: Path) -> str:
    return (
        f"{path} is being written by another memagent run; wait for it to end (or stop it), "
        "then resume."
    )


class TraceWriter:
    """Appends one JSON line per event to a trace file and flushes it to disk, holding the
    file's lock until closed, so that no other run resumes it meanwhile."""

    def __init__(
        self,
        path: Path,
        header: Header,
        span_of: SpanOf = lambda start, end: "",
        *,
        place_of: PlaceOf | None = None,
        resume_from: int | None = None,
    ) -> None:
        """A new trace with `header`, or, with `resume_from`, the same trace continued after
        that many finished steps. `span_of` labels a step's chunk; `place_of` gives the
        pages or chapters its evidence is on (`Document.place`), else read off those labels."""
        self.path = path
        self._span_of = span_of
        unit = str(header.document.get("unit") or "")  # pages or chapters in evidence
        self._place_of = place_of or (lambda start, end: place_of_label(span_of(start, end), unit))
        if resume_from is None:
            self._file: IO[str] = _open_fresh(path)
        else:
            try:
                self._file = open_private(path, "a")
            except OSError as exc:
                raise TraceError(
                    f"Cannot write the trace {path}: {cannot_write(path, exc)}."
                ) from None
            try:
                if not lock(self._file):
                    raise TraceError(_busy(path))
                drop_partial_line(path)  # a kill in the middle of a line (the lock is ours)
            except BaseException:
                self._file.close()
                raise
        self._steps_done = resume_from or 0
        self._reader = readers.named_in(header.settings)  # whose steps hold what (Spec.held)
        # A trace continues in the format it was started in (an older one, when resumed).
        self._version = header.format if resume_from is None else _format_of(path)
        if resume_from is None:
            self._write(header.to_json())
        else:
            self._write(Resumed(resume_from, _now()).to_json())

    def __call__(self, event: Event) -> None:
        if isinstance(event, StepFinished):
            chunk = event.step.chunk
            span = self._span_of(chunk.char_start, chunk.char_end)
            record = StepRecord.of(event.step, span, self._span_of, self._steps_done)
            with _signals_held():  # a Ctrl-C here would leave the record uncounted
                self._write(record.to_json(self._version))
                self._steps_done += 1
        elif isinstance(event, Finished):
            final = FinalRecord.of(event.answer, self._place_of, self._reader)
            with _signals_held():
                self._write(final.to_json(self._version))

    def interrupted(self, reason: str, replies: Sequence[Reply] = ()) -> None:
        """Record where an interrupted run stopped, so a reader knows it is unfinished, and
        the `replies` it had that no finished step holds, so a resumed run need not ask
        for them again. Replies that would take the record past a line's limit are left
        out, the last first: the record must stay readable, and a resumed run asks those."""
        kept, size = [], 0
        for reply in replies:
            size += len(json_text(asdict(reply)).encode()) + 1
            if size > MAX_LINE_BYTES // 2:  # room for the rest of the record, and escapes
                break
            kept.append(reply)
        self._write(Interruption(reason, self._steps_done, tuple(kept)).to_json())

    def close(self) -> None:
        self._file.close()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json_text(record) + "\n")
        sync(self._file)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until a record is whole on disk and counted: then the
    interruption record says exactly how many steps the file holds. (Python runs signal
    handlers in the main thread only; other threads' writes need no holding.)

    The handlers are set aside rather than the signals blocked: blocking masks only this
    thread, and llama.cpp's worker threads would take the signal and have Python raise it
    here mid-write all the same (seen in tests/test_ask_model.py). A signal that arrives
    meanwhile, or arrived just before, is handed to its own handler after the block."""
    held = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or any(
        signal.getsignal(signum) is None
        for signum in held  # set outside Python: keep it
    ):
        yield
        return
    arrived: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        arrived.append((signum, frame))

    handlers = {signum: signal.signal(signum, hold) for signum in held}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        if arrived:
            signum, frame = arrived[0]
            handler = handlers[signum]
            if callable(handler):
                handler(signum, frame)  # raises KeyboardInterrupt, or Interrupted for SIGTERM
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)


def _format_of(path: Path) -> int:
    """The format of the trace at `path`, from its header."""
    first = next(records(path), None)
    return first.format if isinstance(first, Header) else FORMAT_VERSION


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
