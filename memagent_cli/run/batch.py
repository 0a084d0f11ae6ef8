"""Every question about every document, results in input order: an in-process model reads
several questions of a document together in one pass (`together`); a server gets several
runs at once from threads (`parallel`).

Each document is read from disk before the model is opened for it, so a bad path fails
before any model file is touched or any download starts.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from memagent_cli import trace
from memagent_cli.documents.inputs import read_document
from memagent_cli.errors import DocumentError, Interrupted
from memagent_cli.run import ask as run
from memagent_cli.run import pool
from memagent_cli.run.engine import Engine
from memagent_cli.run.session import Session, open_session


@dataclass(frozen=True)
class Options:
    """How every question is run: each run's options, and the batch's own."""

    run: run.RunOptions = run.RunOptions()
    write_traces: bool = True  # False: --no-trace
    password: str | None = None
    ask_password: Callable[[str], str] | None = None  # an encrypted PDF without a password
    format: str | None = None  # --format: read every document as this format
    document_cache: bool = True  # False: --no-document-cache
    parallel: int = 1  # runs at once, each in its own thread (a server backend)
    together: int | None = 1  # questions read together in one pass; None: all that fit
    watch: int = 0  # whose memory the live view shows (question index)


@dataclass(frozen=True)
class Job:
    session: Session
    index: int  # the question's position
    question: str
    label: str


def ask_all(
    paths: list[str],
    questions: list[str],
    open_engine: Callable[[], Engine],
    options: Options,
    emit: Callable[[run.Result], None],
    stopped: Callable[[run.Stopped], None],
) -> int:
    """Answer each question about each document; the exit code (0 all answered, 1 some
    document or run failed, 130 interrupted by SIGINT, 143 by SIGTERM). `open_engine` is
    called once, after the first document was read."""
    outcome = {"code": 0}
    report = options.run.report
    groups = _groups(paths, questions, _once(open_engine), options, outcome)

    def run_group(
        group: list[Job], cancel: threading.Event | None
    ) -> list[run.Result | run.Stopped]:
        return _run(group, options, cancel)

    def finish(result: run.Result | run.Stopped) -> None:
        if isinstance(result, run.Stopped):
            stopped(result)
            outcome["code"] = max(outcome["code"], result.exit_code)
        else:
            emit(result)

    def stopping() -> None:
        report.note("stopping: the steps in flight finish first (Ctrl-C again to quit)")

    try:
        for _, results in pool.ordered(groups, run_group, options.parallel, on_stop=stopping):
            for result in results:
                finish(result)
            if outcome["code"] > 128 and options.parallel <= 1:
                break  # in this thread: read no further group (in flight ones all report)
    except KeyboardInterrupt:
        outcome["code"] = 130
    except Interrupted as exc:  # SIGTERM while runs were in flight in other threads
        outcome["code"] = exc.exit_code
    return outcome["code"]


def _once(open_engine: Callable[[], Engine]) -> Callable[[], Engine]:
    opened: list[Engine] = []

    def engine() -> Engine:
        if not opened:
            opened.append(open_engine())
        return opened[0]

    return engine


def _groups(
    paths: list[str],
    questions: list[str],
    engine: Callable[[], Engine],
    options: Options,
    outcome: dict[str, int],
) -> Iterator[list[Job]]:
    """The runs, in groups read together: questions of one document, in order."""
    several = len(paths) > 1
    report = options.run.report
    size: int | None = None  # questions read together, decided once the model is open
    for number, path in enumerate(paths, start=1):
        try:
            document = read_document(
                path,
                password=options.password,
                format=options.format,
                report=report,
                use_cache=options.document_cache,
                ask_password=options.ask_password,
            )
        except DocumentError as exc:
            if not several:
                raise
            report.error(f"{exc.message} Skipped; the other documents go on.")
            outcome["code"] = max(outcome["code"], 1)
            continue
        session = open_session(document, engine(), report)
        if size is None:
            size = session.engine.together(len(questions), options.together)
        labelled = options.parallel > 1 or size > 1
        jobs = []
        for index, question in enumerate(questions):
            label = ""
            if labelled:
                label = f"d{number} q{index + 1}" if several else f"q{index + 1}"
            jobs.append(Job(session, index, question, label))
        for start in range(0, len(jobs), size):
            yield jobs[start : start + size]


def _run(
    group: list[Job], options: Options, cancel: threading.Event | None
) -> list[run.Result | run.Stopped]:
    runs = []
    for job in group:
        trace_path = None
        if options.write_traces:
            default = trace.default_path(job.session.document.path, job.index)
            trace_path = options.run.trace or default
        runs.append(
            dataclasses.replace(
                options.run,
                trace=trace_path,
                label=job.label,
                cancel=cancel,
                plain=options.parallel > 1,
            )
        )
    indexes = [job.index for job in group]
    watch = indexes.index(options.watch) if options.watch in indexes else 0
    questions = [job.question for job in group]
    return run.ask_together(group[0].session, questions, runs, watch)
