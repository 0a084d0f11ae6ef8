"""The consoles: stderr for everything shown to a person, stdout for results only."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, highlight=False)


def results_console() -> Console:
    """A console for results on stdout. In a pipe it is wide, so that a table keeps one line
    per row however narrow the pipe claims to be."""
    return Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else 200)


def note(message: str) -> None:
    console.print(escape(message), style="dim", soft_wrap=True)


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
