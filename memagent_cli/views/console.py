"""The consoles: stderr for everything shown to a person, stdout for results only. Whatever
goes through them is printable (memagent_cli/text.py): a document, a memory, a server's
error or a file name reaches the terminal as text, never as an escape sequence."""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.segment import Segment

from memagent_cli.errors import UserError
from memagent_cli.text import json_text, printable


class Screen(Console):
    """A Rich console whose every segment of text is printable: Rich's own control codes
    (colours, the live view's cursor moves) still work, but none from the text it shows.
    Document text given to it still goes in a `Text` or through `escape`, so that "[bold]"
    in a document prints as written."""

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and segment.text:
                shown = printable(segment.text)
                if shown is not segment.text:
                    segment = Segment(shown, segment.style)
            yield segment


def tolerant(stream: Any) -> Any:
    """`stream`, set to write "?" for what its encoding cannot hold: a stdout redirected to a
    file on Windows is cp1252 and strict, and an answer in Cyrillic would otherwise raise
    UnicodeEncodeError after the whole reading. UTF-8 streams are left as they are."""
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    if (
        getattr(stream, "errors", None) == "strict"
        and not encoding.startswith("utf")
        and hasattr(stream, "reconfigure")
    ):
        stream.reconfigure(errors="replace")
    return stream


tolerant(sys.stdout)
tolerant(sys.stderr)
console = Screen(stderr=True, highlight=False)


class _Results:
    """stdout for results: a write it refuses (a full disk under `> answers.txt`) is one
    sentence, not a traceback. A closed pipe (`| head`) stays BrokenPipeError, which Click
    ends quietly with exit 1."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        with _refused(self._stream):
            return self._stream.write(text)

    def flush(self) -> None:
        with _refused(self._stream):
            self._stream.flush()


@contextlib.contextmanager
def _refused(stream: Any) -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        # What stays buffered would fail again, and be printed, when Python flushes at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        raise UserError(f"Cannot write the results: {exc.strerror or exc}.") from None


class _Closed(io.TextIOBase):
    """stdout when memagent was started with it closed (`>&-`): Python makes it None, and
    print() to None drops the results without a word."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def results() -> Any:
    """stdout, to print results to (see _Results)."""
    return _Results(tolerant(sys.stdout) if sys.stdout is not None else _Closed())


def results_console() -> Console:
    """A console for results on stdout. In a pipe it is wide, so that a table keeps one line
    per row however narrow the pipe claims to be."""
    out = results()
    return Screen(file=out, highlight=False, width=None if out.isatty() else 200)


def result(text: str, end: str = "\n") -> None:
    """A plain result on stdout (an answer, a Markdown report), printable."""
    print(printable(text), end=end, flush=True, file=results())


def result_json(value: Any, indent: int | None = None) -> None:
    """A result on stdout as JSON: every text exactly as it is, its control characters
    escaped (memagent_cli/text.py)."""
    print(json_text(value, indent=indent), flush=True, file=results())


def note(message: str) -> None:
    console.print(escape(message), style="dim", soft_wrap=True)


class _Notes(logging.Handler):
    """The library's notes (files.NOTES, files.ENGINE_NOTES), each one line on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        from memagent_cli.files import ENGINE_NOTES

        said = "memagent:" if record.name == ENGINE_NOTES.name else "memagent: note:"
        note(f"{said} {record.getMessage()}")


def show_notes() -> None:
    """Print what the library notes as it goes: the command's view of it."""
    from memagent_cli.files import NOTES

    if not any(isinstance(h, _Notes) for h in NOTES.handlers):
        NOTES.addHandler(_Notes())
    NOTES.setLevel(logging.INFO)


def warn(message: str) -> None:
    console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def error(message: str) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def home_relative(path: object) -> str:
    """`path` with the home folder as ~: shorter in a table, and a report shared with
    someone else does not carry its author's home folder (their user name)."""
    from pathlib import Path

    text, home = str(path), str(Path.home())
    return "~" + text[len(home) :] if text.startswith(home + "/") else text
