"""How long work tells a person about itself without knowing who watches: a note callback,
a progress callback, and the `Reporter` that the CLI's views implement. The library's
default is `SILENT`, so code that calls memagent from Python prints nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

# Defined beside what produces them (the Backend protocol's loading, the reading loop's
# events) and taken from here by everything that shows or forwards them.
from memagent_cli.backend import Progress
from memagent_cli.reader import Listener

Note = Callable[[str], None]  # one line for the user
SpanOf = Callable[[int, int], str]  # the document's text between two character offsets


def silent(*_: Any) -> None:
    """A note or progress callback that shows nothing."""
    return None


@dataclass(frozen=True)
class Expected:
    """What a reading was expected to take before it started (run/expect.py), in seconds:
    in all, and its answer's call."""

    seconds: float
    answer: float


@dataclass(frozen=True)
class ReadingId:
    """Which reading a view shows: its document and question, their places in the batch
    (0-based), and what a view needs to say where in the document a step is."""

    document: str  # its path, "-" for stdin, or an evaluation case's name
    model: str
    question: str
    place: tuple[int, int]  # (document, question)
    total_tokens: int
    span_of: SpanOf
    name: str = ""  # what its batch calls it, if anything (an evaluation's case)
    expected: Expected | None = None  # None: no speed of this model kept here yet


@dataclass(frozen=True)
class Layout:
    """What a reading view knows of its batch before any reading starts: how many documents
    and questions, how many readings at once, and whose memory to show."""

    documents: int = 1
    questions: int = 1
    at_once: int = 1
    watch: int = 0  # question index
    by_name: bool = False  # readings are told apart by their names (evaluation cases)


class ReadingView(Protocol):
    """What shows a batch's readings as they go: a listener for each reading as it starts.
    `showing` is True while the view draws on the terminal, when results wait."""

    showing: bool

    def __enter__(self) -> ReadingView: ...

    def __exit__(self, *exc: Any) -> None: ...

    def started(self, reading: ReadingId) -> Listener:
        """What shows the events of `reading`, which starts now."""
        ...

    def ended(self, reading: ReadingId) -> None:
        """`reading` was answered or stopped."""
        ...


class Reporter(Protocol):
    """Where notes, warnings, progress bars and the reading view of a run go."""

    def note(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...

    def error(self, message: str) -> None: ...

    def progress(self, unit: str) -> contextlib.AbstractContextManager[Progress]:
        """A progress callback for work counted in `unit` ("bytes", "pages", "cases")."""
        ...

    def reading(self, batch: Layout) -> ReadingView:
        """The view of a batch's readings."""
        ...


class _SilentView:
    showing = False

    def __enter__(self) -> _SilentView:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def started(self, reading: ReadingId) -> Listener:
        return silent

    def ended(self, reading: ReadingId) -> None:
        return None


class Silent:
    """A reporter that shows nothing: `--quiet`, and the Python API's default."""

    note = warn = error = staticmethod(silent)

    @contextlib.contextmanager
    def progress(self, unit: str) -> Iterator[Progress]:
        yield silent

    def reading(self, batch: Layout) -> ReadingView:
        return _SilentView()


SILENT: Reporter = Silent()
