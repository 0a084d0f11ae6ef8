"""Every question about every document, one run or several at once, results in input order.

Each document is read from disk before the model is opened for it, so a bad path fails
before any model file is touched or any download starts.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from memagent_cli import display, run, trace
from memagent_cli.errors import DocumentError
from memagent_cli.inputs import read_document
from memagent_cli.session import Engine, Session, open_session


@dataclass(frozen=True)
class Options:
    """How every question is run: each run's options, and the batch's own."""

    run: run.RunOptions = run.RunOptions()
    write_traces: bool = True  # False: --no-trace
    password: str | None = None
    format: str | None = None  # --format: read every document as this format
    parallel: int = 1


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
    document or run failed, 130 interrupted). `open_engine` is called once, after the first
    document was read."""
    outcome = {"code": 0}
    jobs = _jobs(paths, questions, _once(open_engine), options, outcome)

    def finish(result: run.Result | run.Stopped) -> None:
        if isinstance(result, run.Stopped):
            stopped(result)
            outcome["code"] = max(outcome["code"], result.exit_code)
        else:
            emit(result)

    if options.parallel <= 1:
        # In this thread, so that Ctrl-C reaches the model's loop at once.
        for job in jobs:
            finish(_run(job, options, None))
            if outcome["code"] == 130:
                break
        return outcome["code"]
    cancel = threading.Event()
    pending: deque[Future[run.Result | run.Stopped]] = deque()
    with ThreadPoolExecutor(options.parallel) as pool:
        try:
            for job in jobs:
                pending.append(pool.submit(_run, job, options, cancel))
                # A small backlog keeps every worker busy while results leave in order.
                while len(pending) > 4 * options.parallel:
                    finish(pending.popleft().result())
            while pending:
                finish(pending.popleft().result())
        except KeyboardInterrupt:
            cancel.set()
            display.note("stopping: the steps in flight finish first (Ctrl-C again to quit)")
            while pending:
                finish(pending.popleft().result())
            outcome["code"] = 130
    return outcome["code"]


def _once(open_engine: Callable[[], Engine]) -> Callable[[], Engine]:
    opened: list[Engine] = []

    def engine() -> Engine:
        if not opened:
            opened.append(open_engine())
        return opened[0]

    return engine


def _jobs(
    paths: list[str],
    questions: list[str],
    engine: Callable[[], Engine],
    options: Options,
    outcome: dict[str, int],
) -> Iterator[Job]:
    several = len(paths) > 1
    quiet = options.run.quiet
    for number, path in enumerate(paths, start=1):
        try:
            document = read_document(
                path, password=options.password, quiet=quiet, format=options.format
            )
        except DocumentError as exc:
            if not several:
                raise
            display.error(f"{exc.message} Skipped; the other documents go on.")
            outcome["code"] = max(outcome["code"], 1)
            continue
        session = open_session(document, engine())
        for index, question in enumerate(questions):
            label = ""
            if options.parallel > 1:
                label = f"d{number} q{index + 1}" if several else f"q{index + 1}"
            yield Job(session, index, question, label)


def _run(job: Job, options: Options, cancel: threading.Event | None) -> run.Result | run.Stopped:
    trace_path = None
    if options.write_traces:
        trace_path = options.run.trace or trace.default_path(job.session.document.path, job.index)
    job_options = dataclasses.replace(options.run, trace=trace_path, label=job.label, cancel=cancel)
    try:
        return run.ask(job.session, job.question, job_options)
    except run.Stopped as stop:
        return stop
