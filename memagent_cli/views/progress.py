"""Progress on stderr: the reading view (a live view on a terminal, plain lines in a log or
a pipe), one throttled bar for extraction and transfers, and `Terminal`, the `Reporter`
that the commands hand to the library."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.filesize import decimal
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from memagent_cli import protocol
from memagent_cli.progress import SILENT, Layout, Listener, ReadingId, ReadingView, Reporter, SpanOf
from memagent_cli.progress import Progress as ProgressCallback
from memagent_cli.reader import Answering, Event, Replied, StepFinished, StepStarted
from memagent_cli.run.time_left import TimeLeft, duration
from memagent_cli.views import console as display
from memagent_cli.views.console import console


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
    """One line per step, for logs and pipes (stderr is not a terminal), with the time left
    as the steps so far say it (run/time_left.py)."""

    def __init__(
        self, span_of: Callable[[int, int], str], label: str = "", left: TimeLeft | None = None
    ) -> None:
        self._span_of = span_of
        self._prefix = f"[{label}] " if label else ""
        self._rates = _Rates()
        self._start = time.perf_counter()
        self._steps = self._total = 0  # steps read, of the chunks there are
        self._left = left

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _time_left(self) -> str:
        seconds = self._left.seconds() if self._left is not None else None
        return "" if seconds is None else f"  about {duration(seconds)} left"

    def __call__(self, event: Event) -> None:
        if self._left is not None:
            self._left.add(event)
        if isinstance(event, StepStarted):  # steps before this one are read
            self._steps, self._total = event.position, event.total
        if isinstance(event, StepFinished):
            self._rates.add(event)
            chunk, gen = event.step.chunk, event.step.generation
            span = self._span_of(chunk.char_start, chunk.char_end)
            console.print(
                f"{self._prefix}{_step(event)}  tokens {chunk.token_start}-"
                f"{chunk.token_end}{'  ' + span if span else ''}  memory "
                f"{gen.completion_tokens} tokens  {gen.seconds:.1f}s  {self._rates.text()}  "
                f"elapsed {time.perf_counter() - self._start:.0f}s{self._time_left()}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        elif isinstance(event, Replied):
            console.print(f"{self._prefix}{_replied(event)}", highlight=False, markup=False)
        elif isinstance(event, Answering):
            if event.stopped:
                read = f"stopped after step {self._steps} of {self._total}: {event.stopped}"
                console.print(f"{self._prefix}{read}", highlight=False, markup=False)
            console.print(
                f"{self._prefix}answering from the final memory", highlight=False, markup=False
            )


def _replied(event: Replied) -> str:
    """ "pass 2: 5 of 12 chunks answered": how far the prompts a reading asked at once are."""
    what = f"{event.what}: " if event.what else ""
    return f"{what}{event.answered} of {event.asked} {event.unit} answered"


def _step(event: StepStarted | StepFinished) -> str:
    """ "step 4/6", and the chunk where the step reads one again (a second pass, a reread)."""
    chunk = event.chunk if isinstance(event, StepStarted) else event.step.chunk
    again = f" (chunk {chunk.index + 1})" if event.position != chunk.index else ""
    return f"step {event.position + 1}/{event.total}{again}"


class _LeftColumn(ProgressColumn):
    """A reading's time left, counted down from what its latest event said (TimeLeft)."""

    def render(self, task: Task) -> Text:
        deadline = task.fields.get("deadline")
        if deadline is None:
            return Text("")
        left = max(deadline - time.monotonic(), 0.0)
        return Text(f"about {duration(left)} left", style="progress.remaining")


class LiveView:
    """A progress row per reading and the memory of one of them, redrawn after every step
    (stderr is a terminal). Rows are added as readings start (`row`)."""

    def __init__(self, title: str, total_tokens: int) -> None:
        self._rates = _Rates()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[tokens]}"),
            TextColumn("{task.fields[rates]}"),
            TimeElapsedColumn(),
            _LeftColumn(),
            console=console,
        )
        self._total_tokens = total_tokens
        self._labels: list[str] = []  # a row's label, by row
        self._watched = 0  # the row whose memory is shown
        self._memory = Panel(Text(protocol.INITIAL_MEMORY, style="dim"), title="memory")
        self._title = title
        self._live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

    def _panel_title(self, detail: str = "") -> str:
        label = self._labels[self._watched] if self._labels else ""
        return " ".join(part for part in ("memory", detail, f"({label})" if label else "") if part)

    def _render(self) -> Group:
        return Group(Text(self._title, style="bold cyan"), self._progress, self._memory)

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    @property
    def rows(self) -> int:
        return len(self._labels)

    def watch(self, row: int) -> None:
        """Show the memory of the reading in `row` from its next step on."""
        self._watched = row
        self._memory = Panel(Text(protocol.INITIAL_MEMORY, style="dim"), title=self._panel_title())

    def row(
        self, label: str, span_of: SpanOf, left: TimeLeft | None = None
    ) -> Callable[[Event], None]:
        """A row for a reading labelled `label` (may be empty), and what shows its events;
        `left` tells its time left."""
        prefix = f"{label} " if label else ""
        task = self._progress.add_task(
            prefix + "reading", total=None, tokens="", rates="", deadline=None
        )
        number = len(self._labels)
        self._labels.append(label)

        def counted(event: Event | None) -> None:
            if left is None:
                return
            if event is not None:
                left.add(event)
            seconds = left.seconds()  # counted down from now until the next event refines it
            deadline = None if seconds is None else time.monotonic() + seconds
            self._progress.update(task, deadline=deadline)

        counted(None)  # before any step: what was expected, if anything

        started: list[int] = []  # the steps started since one finished: asked at once

        def show(event: Event) -> None:
            counted(event)
            if isinstance(event, Replied):  # the bar counts the steps whose replies are in
                first = (started[0] if started else 0) - event.before
                self._progress.update(
                    task,
                    description=f"{prefix}{escape(_replied(event))}",
                    completed=first + event.answered,
                )
            elif isinstance(event, StepStarted):
                if started and started[-1] != event.position - 1:
                    started.clear()
                started.append(event.position)
                chunk = event.chunk
                span = span_of(chunk.char_start, chunk.char_end)
                where = (
                    f"chunk {chunk.index + 1}/{event.total}"
                    if event.position == chunk.index
                    else _step(event)
                )
                self._progress.update(
                    task,
                    total=event.total,
                    description=f"{prefix}{where}" + (f" ({escape(span)})" if span else ""),
                    tokens=f"{chunk.token_start:,}/{self._total_tokens:,} tokens",
                )
            elif isinstance(event, StepFinished):
                started.clear()
                self._rates.add(event)
                step = event.step
                self._progress.update(
                    task,
                    completed=event.position + 1,
                    total=event.total,
                    rates=self._rates.text(),
                    tokens=f"{step.chunk.token_end:,}/{self._total_tokens:,} tokens",
                )
                if number == self._watched:
                    self._memory = Panel(
                        Text(step.memory.strip() or "(empty)"),
                        title=self._panel_title(f"after step {step.chunk.index + 1}"),
                        subtitle=f"{step.generation.completion_tokens} tokens",
                    )
            elif isinstance(event, Answering):
                stopped = f" (stopped early: {escape(event.stopped)})" if event.stopped else ""
                self._progress.update(task, description=f"{prefix}answering{stopped}")
            self._live.update(self._render())

        return show


class _Readings:
    """The reading view of a batch on stderr. On a terminal, one reading at a time, or the
    questions of one document read in one pass, get a live view (a row each, one memory);
    readings of several documents at once, or stderr in a log or a pipe, get plain lines,
    labelled when several go at once."""

    def __init__(self, batch: Layout) -> None:
        self._batch = batch
        one_pass = batch.documents == 1 and batch.questions <= batch.at_once
        self._plain = not console.is_terminal or (batch.at_once > 1 and not one_pass)
        self._live: LiveView | None = None
        self._live_readings: set[tuple[int, int]] = set()

    @property
    def showing(self) -> bool:
        return self._live is not None

    def __enter__(self) -> _Readings:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_live()

    def _label(self, reading: ReadingId) -> str:
        batch = self._batch
        if batch.at_once <= 1 or batch.documents * batch.questions <= 1:
            return ""
        if batch.by_name:
            return reading.name or reading.document
        document, question = reading.place
        return f"d{document + 1} q{question + 1}" if batch.documents > 1 else f"q{question + 1}"

    def started(self, reading: ReadingId) -> Listener:
        label = self._label(reading)
        left = TimeLeft(reading.total_tokens, reading.expected)
        if self._plain:
            return PlainProgress(reading.span_of, label, left)
        if self._live is None:
            name = Path(reading.document).name
            asked = reading.question
            if self._batch.at_once > 1 and self._batch.questions > 1:
                asked = f"{self._batch.questions} questions"
            self._live = LiveView(f"{name} · {reading.model} · {asked}", reading.total_tokens)
            self._live.__enter__()
        self._live_readings.add(reading.place)
        show = self._live.row(label, reading.span_of, left)
        if reading.place[1] == self._batch.watch:  # else the first row's memory shows
            self._live.watch(self._live.rows - 1)
        return show

    def ended(self, reading: ReadingId) -> None:
        self._live_readings.discard(reading.place)
        if not self._live_readings:
            self._stop_live()

    def _stop_live(self) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.__exit__(None, None, None)


class Bar:
    """Work counted in `unit` ("bytes", "pages", "cases", "%", ...) as progress(what, done,
    total): a bar per `what` on a terminal once the work has taken more than a moment, else a
    plain line every few seconds and at the end; either with the time left, from the pace
    since this bar first heard of `what`."""

    _DELAY = 1.0  # seconds before a bar appears: quick work shows nothing
    _PLAIN_EVERY = 10.0  # seconds between plain lines

    def __init__(self, unit: str) -> None:
        self._unit = unit
        self._start = time.monotonic()
        self._first: dict[str, tuple[float, int]] = {}  # when `what` was first heard of, done
        self._last: dict[str, float] = {}
        self._bar: Progress | None = None
        self._tasks: dict[str, TaskID] = {}

    def _amount(self, done: int, total: int | None) -> str:
        if self._unit == "bytes":
            return decimal(done) + (f" of {decimal(total)}" if total else "")
        if self._unit == "%":
            return f"{done}%"
        return f"{done:,}" + (f"/{total:,}" if total else "") + f" {self._unit}"

    def _left(self, what: str, done: int, total: int | None, now: float) -> str:
        """ "40%, about 3m05s left" at the pace since `what` was first heard of; "" at the end
        or before there is a pace."""
        since, first = self._first[what]
        if not total or done <= first or done >= total or now <= since:
            return ""
        left = round((total - done) * (now - since) / (done - first))
        minutes, seconds = divmod(left, 60)
        hours, minutes = divmod(minutes, 60)
        when = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
        if not hours and not minutes:
            when = f"{seconds}s"
        return f"{done * 100 // total}%, about {when} left"

    def __call__(self, what: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        self._first.setdefault(what, (now, done))
        if now - self._start < self._DELAY:
            return
        left = self._left(what, done, total, now)
        if console.is_terminal:
            if self._bar is None:
                counts = (
                    [DownloadColumn(), TransferSpeedColumn()]
                    if self._unit == "bytes"
                    else [MofNCompleteColumn()]
                )
                self._bar = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    *counts,
                    TimeElapsedColumn(),
                    TextColumn("{task.fields[left]}"),
                    console=console,
                    transient=True,
                )
                self._bar.start()
            if what not in self._tasks:
                self._tasks[what] = self._bar.add_task(escape(what), total=total, left="")
            self._bar.update(self._tasks[what], completed=done, total=total, left=left)
        elif now - self._last.get(what, self._start) >= self._PLAIN_EVERY or done == total:
            self._last[what] = now
            line = f"{what}: {self._amount(done, total)}" + (f", {left}" if left else "")
            console.print(line, highlight=False, markup=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class Terminal:
    """The `Reporter` for stderr: notes, warnings, bars, and the reading view that suits
    where stderr goes."""

    note = staticmethod(display.note)
    warn = staticmethod(display.warn)
    error = staticmethod(display.error)

    @contextlib.contextmanager
    def progress(self, unit: str) -> Iterator[ProgressCallback]:
        bar = Bar(unit)
        try:
            yield bar
        finally:
            bar.close()

    def reading(self, batch: Layout) -> ReadingView:
        return _Readings(batch)


def reporter(quiet: bool) -> Reporter:
    """What a command reports through: stderr, or nothing with --quiet."""
    return SILENT if quiet else Terminal()
