"""Every question about every document, one run or several at once, results in input order."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from memagent_cli import display
from memagent_cli.errors import DocumentError
from memagent_cli.session import Engine, Result, Session, Stopped, default_trace_path, open_session


@dataclass(frozen=True)
class Options:
    """How each question is run (the `ask` options that are not about the model)."""

    password: str | None = None
    trace: Path | None = None  # one named trace (one document, one question)
    write_traces: bool = True
    resume: Path | None = None
    resume_latest: bool = False
    use_cache: bool = True
    quiet: bool = False
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
    engine: Engine,
    options: Options,
    emit: Callable[[Result], None],
    stopped: Callable[[Stopped], None],
) -> int:
    """Answer each question about each document; the exit code (0 all answered, 1 some
    document or run failed, 130 interrupted)."""
    outcome = {"code": 0}
    jobs = _jobs(paths, questions, engine, options, outcome)

    def finish(result: Result | Stopped) -> None:
        if isinstance(result, Stopped):
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
    pending: deque[Future[Result | Stopped]] = deque()
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


def _jobs(
    paths: list[str], questions: list[str], engine: Engine, options: Options, outcome: dict
) -> Iterator[Job]:
    several = len(paths) > 1
    for number, path in enumerate(paths, start=1):
        try:
            session = open_session(path, engine, password=options.password, quiet=options.quiet)
        except DocumentError as exc:
            if not several:
                raise
            display.error(f"{exc.message} Skipped; the other documents go on.")
            outcome["code"] = max(outcome["code"], 1)
            continue
        for index, question in enumerate(questions):
            label = ""
            if options.parallel > 1:
                label = f"d{number} q{index + 1}" if several else f"q{index + 1}"
            yield Job(session, index, question, label)


def _run(job: Job, options: Options, cancel: threading.Event | None) -> Result | Stopped:
    if not options.write_traces:
        trace_path = None
    else:
        trace_path = options.trace or default_trace_path(job.session, job.index)
    try:
        return job.session.ask(
            job.question,
            trace_path=trace_path,
            quiet=options.quiet,
            resume=options.resume,
            latest=options.resume_latest,
            use_cache=options.use_cache,
            label=job.label,
            cancel=cancel,
        )
    except Stopped as stop:
        return stop
