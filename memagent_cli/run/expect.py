"""What a reading is expected to take, said on stderr before it starts: priced as `inspect`
prices it (run/inspect.py), at the speed kept for this model and engine here
(backends/speeds_store.py) and with what its past readings here teach (run/history.py).
Where no speed is kept yet (a server, or no `inspect` of this model here), the first step's
own speeds say it once that step is read (run/time_left.py). A reading of more than an hour
says so, with the faster routes."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from memagent_cli import protocol, readers
from memagent_cli.backends import speeds_store
from memagent_cli.backends.llama_cpp import LlamaCppBackend, can_offload
from memagent_cli.backends.speed import Speed
from memagent_cli.progress import Expected, ReadingId, Reporter
from memagent_cli.reader import Event, Listener, StepFinished
from memagent_cli.readers.spec import Templates
from memagent_cli.run import history, unpulled
from memagent_cli.run import inspect as inspection
from memagent_cli.run.engine import Engine
from memagent_cli.run.history import History
from memagent_cli.run.inspect import HOUR, Reading
from memagent_cli.run.session import Session
from memagent_cli.run.time_left import TimeLeft, duration

# A reading expected to take longer than this is announced; one over HOUR says so.
LONG = 60.0


@dataclass(frozen=True)
class _Known:
    """What every reading of one engine is priced with, found once per batch."""

    speed: Speed
    when: str  # when the speed was measured
    past: History
    templates: Templates
    first_memory: int


_known: weakref.WeakKeyDictionary[Engine, _Known | None] = weakref.WeakKeyDictionary()


def _of(engine: Engine, steps: int) -> _Known | None:
    """The kept speed, past readings and templates of `engine`'s model; None where it is
    not run in this process by llama.cpp, or no speed of it is kept here."""
    if not engine.backend.local:
        return None
    backend = cast(LlamaCppBackend, engine.backend)  # the model in this process
    if engine in _known:
        return _known[engine]
    kept = None
    if not backend.options.recalibrate:
        # Its own, else its stand-in's from an `inspect` before it was pulled.
        kept = speeds_store.load(speeds_store.backend_key(backend))
        kept = kept or unpulled.kept_stand_in(backend)
    found = None
    if kept is not None:
        described = backend.describe()
        reader = engine.settings.reader
        found = _Known(
            kept.speed,
            kept.measured,
            history.past_readings(described.model, described.engine, reader),
            readers.get(reader).call_templates(backend, steps),
            len(backend.tokenize(protocol.INITIAL_MEMORY)),
        )
    _known[engine] = found
    return found


def expected(session: Session, done: int = 0) -> tuple[Expected | None, str]:
    """What reading the session's chunks after the first `done` is expected to take, and
    the line that says it (empty for a short reading, or where nothing is known yet)."""
    engine = session.engine
    known = _of(engine, len(session.chunks))
    chunks = session.chunks[done:]
    if known is None or not chunks:
        return None, ""
    settings = engine.settings
    memory = settings.memory_tokens
    first = known.first_memory if not done else memory  # a resumed reading has a memory
    reading = Reading(settings.reader, [c.tokens for c in chunks], known.templates, memory, first)
    speculating = bool(engine.description.engine.get("speculate", False))
    priced = reading.priced(known.speed, known.past, speculating)
    found = Expected(priced.seconds, priced.answer)
    if priced.seconds < LONG:
        return found, ""
    if known.past.readings:
        readings = known.past.readings
        how = (
            f"at most {duration(priced.most)}; learned from {readings} reading"
            f"{'s' if readings != 1 else ''} of this model here"
        )
    else:
        low = duration(priced.least or priced.seconds)
        how = (
            f"{low} to {duration(priced.most)}, by how long the model's replies run: its "
            "first reading here tells"
        )
    line = (
        f"{_name(session)}: expect about {duration(priced.seconds)} on this machine ({how}; "
        f"an estimate at the speed measured here {known.when or 'before'}, every chunk read)"
    )
    if priced.seconds > HOUR:
        line += "; " + faster_routes(engine)
    return found, line


def _name(session: Session) -> str:
    path = session.document.path
    return "reading stdin" if path == "-" else f"reading {Path(path).name}"


def faster_routes(engine: Engine) -> str:
    """What reads faster than `engine`, in a sentence (run/inspect.py faster_routes)."""
    backend = engine.backend
    offloaded = backend.local and engine.description.engine.get("gpu_layers", 0) != 0
    return inspection.faster_routes(engine.settings.reader, offloaded and can_offload())


def announced(
    reading: ReadingId, session: Session, done: int, note: Callable[[str], None]
) -> ReadingId:
    """`reading` with what it is expected to take, said first through `note` where it is
    long (not for an evaluation's case: the evaluation tells its own time left)."""
    found, line = expected(session, done)
    if line and not reading.name:
        note(line)
    return replace(reading, expected=found)


def noting(reading: ReadingId, session: Session, show: Listener, report: Reporter) -> Listener:
    """`show`, and where nothing was expected before the reading, a line once its first
    step is read when the rest is long (and more than an hour: the faster routes)."""
    if reading.expected is not None or reading.name:
        return show
    left = TimeLeft(reading.total_tokens)
    said = False

    def listener(event: Event) -> None:
        nonlocal said
        left.add(event)
        if isinstance(event, StepFinished) and not said:
            said = True
            seconds = left.seconds() or 0.0
            if seconds >= LONG and event.position + 1 < event.total:
                line = (
                    f"{_name(session)}: about {duration(seconds)} left on this machine after "
                    f"step {event.position + 1} of {event.total}, at that step's "
                    "speeds (every chunk read)"
                )
                if seconds > HOUR:
                    line += "; " + faster_routes(session.engine)
                report.note(line)
        show(event)

    return listener
