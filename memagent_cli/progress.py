"""How long work tells a person about itself without knowing who watches: a note callback,
a progress callback, and the `Reporter` that the CLI's views implement. The library's
default is `SILENT`, so code that calls memagent from Python prints nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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


class ReadingView(Protocol):
    """What shows readings as they go: one listener per reading shown together."""

    def __enter__(self) -> ReadingView: ...

    def __exit__(self, *exc: Any) -> None: ...

    def listener(self, reading: int) -> Listener:
        """What shows the events of the reading at `reading` (0-based)."""
        ...


class Reporter(Protocol):
    """Where notes, warnings, progress bars and the reading view of a run go."""

    def note(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...

    def error(self, message: str) -> None: ...

    def progress(self, unit: str) -> contextlib.AbstractContextManager[Progress]:
        """A progress callback for work counted in `unit` ("bytes", "pages", "cases")."""
        ...

    def reading(
        self,
        span_of: SpanOf,
        total_tokens: int,
        title: str,
        labels: list[str],
        *,
        plain: bool = False,
        watch: int = 0,
    ) -> ReadingView:
        """The view of readings labelled `labels`, whose memory `watch` is shown."""
        ...


class _SilentView:
    def __enter__(self) -> _SilentView:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def listener(self, reading: int) -> Listener:
        return silent


class Silent:
    """A reporter that shows nothing: `--quiet`, and the Python API's default."""

    note = warn = error = staticmethod(silent)

    @contextlib.contextmanager
    def progress(self, unit: str) -> Iterator[Progress]:
        yield silent

    def reading(self, *args: Any, **kwargs: Any) -> ReadingView:
        return _SilentView()


SILENT: Reporter = Silent()
