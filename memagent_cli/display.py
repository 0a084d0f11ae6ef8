"""Everything shown on stderr: the live view, plain progress lines, notes and errors.

stdout is for results only, so every console here writes to stderr.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from memagent_cli.reader import Answering, Event, StepFinished, StepStarted

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


class _Rates:
    """Running prompt and generation speeds over the steps seen so far."""

    def __init__(self) -> None:
        self.prompt_tokens = self.generated = 0
        self.prompt_seconds = self.generation_seconds = 0.0

    def add(self, event: StepFinished) -> None:
        gen = event.step.generation
        self.prompt_tokens += gen.prompt_tokens
        self.generated += gen.completion_tokens
        self.prompt_seconds += gen.prompt_seconds
        self.generation_seconds += gen.generation_seconds

    def text(self) -> str:
        p = self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0
        g = self.generated / self.generation_seconds if self.generation_seconds else 0.0
        return f"prompt {p:,.0f} tok/s · gen {g:,.0f} tok/s"


class PlainProgress:
    """One line per step, for logs and pipes (stderr is not a terminal)."""

    def __init__(self, span_of: Callable[[int, int], str], label: str = "") -> None:
        self._span_of = span_of
        self._prefix = f"[{label}] " if label else ""
        self._rates = _Rates()
        self._start = time.perf_counter()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, event: Event) -> None:
        if isinstance(event, StepFinished):
            self._rates.add(event)
            chunk, gen = event.step.chunk, event.step.generation
            span = self._span_of(chunk.char_start, chunk.char_end)
            console.print(
                f"{self._prefix}step {chunk.index + 1}/{event.total}  tokens {chunk.token_start}-"
                f"{chunk.token_end}{'  ' + span if span else ''}  memory "
                f"{gen.completion_tokens} tokens  {gen.seconds:.1f}s  {self._rates.text()}  "
                f"elapsed {time.perf_counter() - self._start:.0f}s",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        elif isinstance(event, Answering):
            console.print(
                f"{self._prefix}answering from the final memory", highlight=False, markup=False
            )


class LiveView:
    """A progress row per question and the memory of one of them, redrawn after every step
    (stderr is a terminal)."""

    def __init__(
        self,
        span_of: Callable[[int, int], str],
        total_tokens: int,
        title: str,
        labels: list[str] | None = None,
        watch: int = 0,
    ) -> None:
        self._span_of = span_of
        self._rates = _Rates()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[tokens]}"),
            TextColumn("{task.fields[rates]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self._labels = [f"{label} " if label else "" for label in labels or [""]]
        self._tasks = [
            self._progress.add_task(label + "reading", total=None, tokens="", rates="")
            for label in self._labels
        ]
        self._total_tokens = total_tokens
        self._watch = min(max(watch, 0), len(self._labels) - 1)
        self._memory = Panel(Text("No previous memory", style="dim"), title=self._panel_title())
        self._title = title
        self._live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def _panel_title(self, detail: str = "") -> str:
        label = self._labels[self._watch].strip()
        return " ".join(part for part in ("memory", detail, f"({label})" if label else "") if part)

    def _render(self) -> Group:
        return Group(Text(self._title, style="bold cyan"), self._progress, self._memory)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    def __call__(self, event: Event) -> None:
        self.listener(0)(event)

    def listener(self, question: int) -> Callable[[Event], None]:
        """What shows the events of the question at `question` (0-based)."""
        task, label = self._tasks[question], self._labels[question]

        def show(event: Event) -> None:
            if isinstance(event, StepStarted):
                chunk = event.chunk
                span = self._span_of(chunk.char_start, chunk.char_end)
                self._progress.update(
                    task,
                    total=event.total,
                    description=f"{label}chunk {chunk.index + 1}/{event.total}"
                    + (f" ({escape(span)})" if span else ""),
                    tokens=f"{chunk.token_start:,}/{self._total_tokens:,} tokens",
                )
            elif isinstance(event, StepFinished):
                self._rates.add(event)
                step = event.step
                self._progress.update(
                    task,
                    advance=1,
                    rates=self._rates.text(),
                    tokens=f"{step.chunk.token_end:,}/{self._total_tokens:,} tokens",
                )
                if question == self._watch:
                    self._memory = Panel(
                        Text(step.memory.strip() or "(empty)"),
                        title=self._panel_title(f"after step {step.chunk.index + 1}"),
                        subtitle=f"{step.generation.completion_tokens} tokens",
                    )
            elif isinstance(event, Answering):
                self._progress.update(task, description=f"{label}answering")
            self._live.update(self._render())

        return show


class Silent:
    """--quiet: show nothing."""

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __call__(self, event: Event) -> None:
        return None

    def listener(self, question: int) -> Callable[[Event], None]:
        return self


class _PlainLines:
    """Plain progress lines for several questions read together, each line labelled."""

    def __init__(self, views: list[PlainProgress]) -> None:
        self._views = views

    def __enter__(self) -> _PlainLines:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def listener(self, question: int) -> Callable[[Event], None]:
        return self._views[question]


def progress_view(
    quiet: bool,
    span_of: Callable[[int, int], str],
    total_tokens: int,
    title: str,
    labels: list[str],
    *,
    plain: bool = False,
    watch: int = 0,
) -> LiveView | _PlainLines | Silent:
    """The right view for where stderr goes, with `listener(i)` for the run labelled
    `labels[i]`: plain lines for a log or a pipe, or when other runs share stderr at the
    same time (`plain`); else the live view, one row per run and one run's memory."""
    if quiet:
        return Silent()
    if console.is_terminal and not plain:
        return LiveView(span_of, total_tokens, title, labels, watch)
    return _PlainLines([PlainProgress(span_of, label) for label in labels])


class _ExtractionProgress:
    """Pages extracted so far, shown only once extraction has taken more than a moment."""

    _DELAY = 1.0  # seconds before anything is shown
    _PLAIN_EVERY = 5.0  # seconds between plain lines

    def __init__(self, name: str) -> None:
        self._name = name
        self._start = self._last = time.perf_counter()
        self._bar: Progress | None = None
        self._task = None

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self._start < self._DELAY:
            return
        if console.is_terminal:
            if self._bar is None:
                self._bar = Progress(
                    TextColumn(f"extracting {escape(self._name)}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                    transient=True,
                )
                self._bar.start()
                self._task = self._bar.add_task("extract", total=total)
            self._bar.update(self._task, completed=done)
        elif now - self._last >= self._PLAIN_EVERY or done == total:
            self._last = now
            console.print(f"extracting {self._name}: {done}/{total}", highlight=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextlib.contextmanager
def extraction_progress(quiet: bool, path: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress(done, total) callback for document extraction, or None with --quiet."""
    if quiet:
        yield None
        return
    progress = _ExtractionProgress(Path(path).name if path != "-" else "stdin")
    try:
        yield progress
    finally:
        progress.close()
