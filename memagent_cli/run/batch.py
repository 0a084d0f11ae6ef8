"""Every question about every document, outcomes in input order (`Batch`). An in-process
model reads several readings at once in one context, whatever their documents
(run/ask.py's `ask_runs`); a server gets several runs at once from threads. `--parallel`
(readings at once) is decided here, once, for both.

Each document is read from disk before the model is opened for it, so a bad path fails
before any model file is touched or any download starts. An encrypted document's runs write
no trace unless one is named (--trace, --resume): its memories and answer may quote the
text word for word, and its password must not be a formality that a trace sidesteps.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from memagent_cli import trace
from memagent_cli.documents import Document
from memagent_cli.documents.inputs import read_document
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.errors import STOPS, DocumentError, stop_code
from memagent_cli.progress import SILENT, Layout, Reporter
from memagent_cli.run import ask as run
from memagent_cli.run import journal, pool
from memagent_cli.run.engine import Engine
from memagent_cli.run.session import open_session


@dataclass(frozen=True)
class Options:
    """How every question is run: each run's options, and the batch's own."""

    run: run.RunOptions = run.RunOptions()
    write_traces: bool = True  # False: --no-trace
    password: str | None = None
    ask_password: Callable[[str], str] | None = None  # an encrypted PDF without a password
    format: str | None = None  # --format: read every document as this format
    document_cache: bool = True  # False: --no-document-cache
    ocr: OcrOptions = OcrOptions()  # --ocr, --ocr-lang
    # --parallel: readings at once. In-process, read together in one context (None: all
    # that fit in memory, where the calibration says a batch pays); with a server, calls
    # in flight from threads (None: one).
    parallel: int | None = None
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

    def __iter__(self) -> Iterator[run.Result | run.Stopped]:
        ended = False  # every run was taken (some may have failed: exit_code says so)
        try:
            runs = self._runs()
            first = next(runs, None)  # reads the first document, opens the model
            if first is not None:
                yield from self._outcomes(first, runs, first.session.engine.threaded)
            ended = True
        except STOPS as exc:  # SIGTERM too, while runs were in flight in other threads
            self._failed(stop_code(exc))
        finally:
            if self._journal is not None:  # kept unless every reading was answered
                self._journal.close(finished=ended and self.exit_code == 0)

    def _outcomes(
        self, first: run.Run, runs: Iterator[run.Run], threads: bool
    ) -> Iterator[run.Result | run.Stopped]:
        """Every run's outcome: read together in one context, or each in a thread."""
        readings = len(self.questions) * len(self.paths)
        parallel = self.options.parallel
        layout = Layout(len(self.paths), len(self.questions), 1, self.options.watch)
        report = self.options.report

        def remaining() -> Iterator[run.Run]:
            yield first
            yield from runs

        if not threads:
            documents, questions = len(self.paths), len(self.questions)
            what = (
                f"the {documents} documents"
                if questions == 1
                else f"the {questions} questions"
                if documents == 1
                else f"{documents} documents x {questions} questions"
            )
            with report.progress("bytes") as progress:  # a first use measures: weights load
                at_once = first.session.engine.together(
                    readings, parallel, progress, report.note, what
                )
            outcomes = run.ask_runs(
                remaining(), at_once, report, dataclasses.replace(layout, at_once=at_once)
            )
            for outcome in outcomes:
                yield self._seen(outcome)
            return
        layout = dataclasses.replace(layout, at_once=parallel or 1)

        def one(item: run.Run, cancel: threading.Event | None) -> run.Result | run.Stopped:
            how = dataclasses.replace(item.options, cancel=cancel)
            item = dataclasses.replace(item, options=how)
            return list(run.ask_runs([item], 1, report, layout))[0]

        def stopping() -> None:
            report.note("stopping: the steps in flight finish first (Ctrl-C again to quit)")

        for _, outcome in pool.ordered(remaining(), one, parallel or 1, on_stop=stopping):
            yield self._seen(outcome)
            if self.exit_code > 128 and (parallel or 1) <= 1:
                break  # in this thread: read no further run (in flight ones all report)

    def _seen(self, outcome: run.Result | run.Stopped) -> run.Result | run.Stopped:
        if isinstance(outcome, run.Stopped):
            self._failed(outcome.exit_code)
        return outcome

    def _failed(self, code: int) -> None:
        self.exit_code = max(self.exit_code, code)

    def _runs(self) -> Iterator[run.Run]:
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
                yield run.Run(session, question, how, (number, index))

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
    ) -> run.RunOptions:
        """How a run goes: its trace (none of an encrypted document unless named) and its
        journal line."""
        options = self.options
        trace_path = options.run.trace if options.write_traces else None
        if trace_path is None and options.write_traces and not document.encrypted:
            trace_path = trace.default_path(document.path, index)
        return dataclasses.replace(options.run, trace=trace_path, journal=entry)
