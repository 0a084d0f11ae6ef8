"""Every question about every document, outcomes in input order (`Batch`), and the runs of
any batch read at once (`outcomes`, which `eval` reads its cases by too): an in-process
model reads several readings at once in one context, whatever their documents
(run/ask.py's `ask_runs`); a server gets several runs at once from threads. `--parallel`
(readings at once) is decided here, once, for both (`readings_at_once`).

Each document is read from disk before the model is opened for it, so a bad path fails
before any model file is touched or any download starts. An encrypted document's runs write
no trace unless one is named (--trace, --resume): its memories and answer may quote the
text word for word, and its password must not be a formality that a trace sidesteps.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from memagent_cli import readers, trace
from memagent_cli.documents import Document
from memagent_cli.documents.inputs import read_document
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.errors import STOPS, DocumentError, stop_code
from memagent_cli.progress import SILENT, Layout, Reporter
from memagent_cli.run import journal, pool
from memagent_cli.run.ask import Result, Run, RunOptions, Stopped, ask_runs
from memagent_cli.run.engine import Engine
from memagent_cli.run.session import open_session

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """How every question is run: each run's options, and the batch's own."""

    run: RunOptions = RunOptions()
    write_traces: bool = True  # False: --no-trace
    password: str | None = None
    ask_password: Callable[[str], str] | None = None  # an encrypted PDF without a password
    format: str | None = None  # --format: read every document as this format
    document_cache: bool = True  # False: --no-document-cache
    ocr: OcrOptions = OcrOptions()  # --ocr, --ocr-lang
    parallel: int | None = None  # --parallel: readings at once (None: readings_at_once's)
    watch: int = 0  # whose memory the live view shows (question index)
    report: Reporter = SILENT


class Batch:
    """The runs of every question about every document, read as `options` say. Iterate it
    for the outcomes, in input order; then `exit_code` says how it went (0 all answered,
    1 some document or run failed, 130 interrupted by SIGINT, 143 by SIGTERM).
    `open_engine` is called once, after the first document was read."""

    def __init__(
        self,
        paths: list[str],
        questions: list[str],
        open_engine: Callable[[], Engine],
        options: Options,
    ) -> None:
        self.paths, self.questions, self.options = paths, questions, options
        self._open_engine = open_engine
        self._engine: Engine | None = None
        self._journal: journal.Journal | None = None
        self.exit_code = 0

    def __iter__(self) -> Iterator[Result | Stopped]:
        ended = False  # every run was taken (some may have failed: exit_code says so)
        try:
            layout = Layout(len(self.paths), len(self.questions), watch=self.options.watch)
            found = outcomes(
                self._runs(),  # reads the first document, opens the model
                _itself,
                self.options.report,
                layout,
                readings=len(self.questions) * len(self.paths),
                parallel=self.options.parallel,
                what=self._readings(),
            )
            for _, outcome in found:
                yield self._seen(outcome)
            ended = True
        except STOPS as exc:  # SIGTERM too, while runs were in flight in other threads
            self._failed(stop_code(exc))
        finally:
            if self._journal is not None:  # kept unless every reading was answered
                self._journal.close(finished=ended and self.exit_code == 0)

    def _readings(self) -> str:
        """The readings of this batch in words, for a note: "the 3 documents"."""
        documents, questions = len(self.paths), len(self.questions)
        if questions == 1:
            return f"the {documents} documents"
        if documents == 1:
            return f"the {questions} questions"
        return f"{documents} documents x {questions} questions"

    def _seen(self, outcome: Result | Stopped) -> Result | Stopped:
        if isinstance(outcome, Stopped):
            self._failed(outcome.exit_code)
        return outcome

    def _failed(self, code: int) -> None:
        self.exit_code = max(self.exit_code, code)

    def _runs(self) -> Iterator[Run]:
        """Every run, document by document in order, each document read when its runs are
        wanted. The batch's journal (when its traces go to the data folder) is opened with
        the first document, once the model is open."""
        several = len(self.paths) > 1
        report = self.options.report
        for number, path in enumerate(self.paths):
            try:
                document = read_document(
                    path,
                    password=self.options.password,
                    format=self.options.format,
                    report=report,
                    use_cache=self.options.document_cache,
                    ask_password=self.options.ask_password,
                    ocr=self.options.ocr,
                )
            except DocumentError as exc:
                if not several:
                    raise
                report.error(f"{exc.message} Skipped; the other documents go on.")
                self._failed(1)
                continue
            if document.encrypted and self._traced_by_default():
                report.warn(
                    f"{Path(path).name} is encrypted, so no trace is written (its memories and "
                    "answer may quote it) and its run cannot be resumed; --trace PATH keeps one."
                )
            if self._engine is None:
                self._engine = self._open_engine()
                if self._traced_by_default():
                    self._journal = self._open_journal(self._engine)
            session = open_session(document, self._engine, report)
            for index, question in enumerate(self.questions):
                entry = self._journal and self._journal.entry(f"d{number + 1} q{index + 1}")
                how = self._run_options(session.document, index, entry)
                yield Run(session, question, how, (number, index))

    def _traced_by_default(self) -> bool:
        """Whether runs write a trace the user did not name, a new one in the data folder:
        then the batch keeps a journal of them."""
        how = self.options.run
        return (
            self.options.write_traces
            and how.trace is None
            and how.resume is None
            and not how.resume_latest
        )

    def _open_journal(self, engine: Engine) -> journal.Journal:
        """The journal of this batch: its documents and questions, read by this model so."""
        documents = [path if path == "-" else str(Path(path).resolve()) for path in self.paths]
        return journal.open_journal(
            {"command": "ask", "documents": documents, "questions": self.questions}
            | journal.run_identity(engine)
        )

    def _run_options(
        self, document: Document, index: int, entry: journal.Entry | None
    ) -> RunOptions:
        """How a run goes: its trace (none of an encrypted document unless named) and its
        journal line."""
        options = self.options
        trace_path = options.run.trace if options.write_traces else None
        if trace_path is None and options.write_traces and not document.encrypted:
            trace_path = trace.default_path(document.path, index)
        return dataclasses.replace(options.run, trace=trace_path, journal=entry)


def calls_at_once(run: Run) -> int:
    """The prompts a reading of `run`'s document asks at once (Spec.at_once; PI-Mem: a
    pass's chunks): as many calls may go together for it."""
    session = run.session
    return readers.get(session.engine.settings.reader).at_once(len(session.chunks))


def readings_at_once(
    engine: Engine,
    readings: int,
    parallel: int | None,
    report: Reporter = SILENT,
    what: str = "readings",
    calls: int = 1,
) -> int:
    """How many of `readings` go at once, as --parallel says (`parallel`). Given, that many:
    in-process read together in one context where they fit in memory (else a sentence), on a
    server calls in flight from threads. Not given: in-process as many as fit and pay by
    this model's calibration here (Engine.together, which says so in a note naming `what`
    where that is fewer than fit); on a server one. `calls`: the prompts each reading asks
    at once (calls_at_once); in-process the number is then of sequences, each reading's
    prompts in those no reading holds."""
    if engine.threaded:
        return parallel or 1
    with report.progress("bytes") as progress:  # a first use measures: weights load
        return engine.together(readings, parallel, progress, report.note, what, calls)


def outcomes(
    items: Iterable[T],
    run_of: Callable[[T], Run],
    report: Reporter,
    layout: Layout,
    *,
    readings: int,
    parallel: int | None,
    what: str = "readings",
    stop_on_first: bool = False,
) -> Iterator[tuple[T, Result | Stopped]]:
    """(item, the outcome of run_of(item)) for each item, in input order: the one way any
    batch of runs is read. Every run's session shares one engine. How many go at once is
    decided with the first run, once: of `readings` in all, as `parallel` (--parallel) says
    (readings_at_once, `what` naming them in a note), counting the prompts a reading of the
    first run's document asks at once (calls_at_once), so that no caller can leave a PI-Mem
    pass to go one call at a time. In-process they are read together in the engine's one
    context (run/ask.py's ask_runs); on a server each reading in a thread of its own, where
    run_of is called too (run/pool.py), with up to that many calls in flight in all: a
    reading gets up to that many threads of its own, and as many readings go at once as
    leave room. At most BACKLOG x the readings at once are taken ahead of the outcomes
    passed on. Ctrl-C or SIGTERM stops the runs in flight, their traces valid, and no
    further run is taken (from several threads, it is raised once their outcomes are passed
    on). `layout` tells the readings' view how they go.

    `stop_on_first`: a Stopped is raised, not passed on, once the outcomes of the runs that
    finish anyway are passed on; on a server the first run that stops asks those in flight
    to stop."""
    items = iter(items)
    try:
        first = next(items)
    except StopIteration:
        return
    run = run_of(first)
    engine, calls = run.session.engine, calls_at_once(run)
    at_once = readings_at_once(engine, readings, parallel, report, what, calls)
    layout = dataclasses.replace(layout, at_once=at_once)
    taken = [run]  # the first run is made once

    def made(item: T) -> Run:
        return taken.pop() if taken and item is first else run_of(item)

    everything = itertools.chain([first], items)
    if engine.threaded:
        each = min(calls, at_once)
        yield from _on_threads(
            everything, made, max(1, at_once // each), report, layout, stop_on_first, each
        )
    else:
        yield from _in_one_context(everything, made, at_once, report, layout, stop_on_first)


def _itself(item: Run) -> Run:
    return item


def _in_one_context(
    items: Iterable[T],
    run_of: Callable[[T], Run],
    at_once: int,
    report: Reporter,
    layout: Layout,
    stop_on_first: bool,
) -> Iterator[tuple[T, Result | Stopped]]:
    taken: deque[T] = deque()  # the items of the runs ask_runs took, not passed on yet

    def runs() -> Iterator[Run]:
        for item in items:
            taken.append(item)
            yield run_of(item)

    first_stop: Stopped | None = None
    for outcome in ask_runs(runs(), at_once, report, layout):
        item = taken.popleft()
        if stop_on_first and isinstance(outcome, Stopped):
            first_stop = first_stop or outcome
        else:
            yield item, outcome
    if first_stop is not None:
        raise first_stop


def _on_threads(
    items: Iterable[T],
    run_of: Callable[[T], Run],
    at_once: int,
    report: Reporter,
    layout: Layout,
    stop_on_first: bool,
    each: int = 1,
) -> Iterator[tuple[T, Result | Stopped]]:
    def one(item: T, cancel: threading.Event | None) -> Result | Stopped:
        reading = run_of(item)
        how = dataclasses.replace(reading.options, cancel=cancel)
        # `each` slots: the reading's own, and those its prompts asked at once go out in.
        (outcome,) = ask_runs([dataclasses.replace(reading, options=how)], each, report, layout)
        if stop_on_first and isinstance(outcome, Stopped):
            raise outcome  # the pool asks the runs in flight to stop
        return outcome

    def stopping() -> None:
        report.note("stopping: the steps in flight finish first (Ctrl-C again to quit)")

    for item, outcome in pool.ordered(items, one, at_once, on_stop=stopping):
        yield item, outcome
        if at_once <= 1 and isinstance(outcome, Stopped) and outcome.exit_code > 128:
            return  # interrupted in this thread: no further run is read
