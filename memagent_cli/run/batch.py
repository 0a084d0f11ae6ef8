"""Every question about every document, results in input order: an in-process model reads
several readings at once in one context (`together`): the questions of one document in one
pass, or, when there are more readings than one pass holds, continuously, whatever their
documents (run/ask.py's ask_each); a server gets several runs at once from threads
(`parallel`).

Each document is read from disk before the model is opened for it, so a bad path fails
before any model file is touched or any download starts. An encrypted document's runs write
no trace unless one is named (--trace, --resume): its memories and answer may quote the
text word for word, and its password must not be a formality that a trace sidesteps.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from memagent_cli import trace
from memagent_cli.documents.inputs import read_document
from memagent_cli.documents.ocr import OcrOptions
from memagent_cli.errors import DocumentError, Interrupted
from memagent_cli.run import ask as run
from memagent_cli.run import journal, pool
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
    ocr: OcrOptions = OcrOptions()  # --ocr, --ocr-lang
    parallel: int = 1  # runs at once, each in its own thread (a server backend)
    together: int | None = 1  # questions read together in one pass; None: all that fit
    watch: int = 0  # whose memory the live view shows (question index)


@dataclass(frozen=True)
class Job:
    session: Session
    index: int  # the question's position
    question: str
    label: str
    journal: journal.Entry | None = None


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
    journals: list[journal.Journal] = []
    sizes: list[int] = []  # readings at once, decided with the first document
    groups = _groups(paths, questions, _once(open_engine), options, outcome, journals, sizes)

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

    ended = False  # every group was run (some may have failed: then outcome says so)
    try:
        first = next(groups, None)  # reads the first document, opens the model
        groups = itertools.chain([first] if first else [], groups)
        beyond_a_pass = len(paths) > 1 or (sizes and sizes[0] < len(questions))
        if options.parallel <= 1 and sizes and sizes[0] > 1 and beyond_a_pass:
            # In-process, more readings than one pass holds: read them continuously, a
            # slot freed by an answered reading taking the next at once, whatever its
            # document.
            jobs = (
                run.Job(job.session, job.question, _run_options(job, options, None, True))
                for group in groups
                for job in group
            )
            for result in run.ask_each(jobs, sizes[0]):
                finish(result)
        else:
            ordered = pool.ordered(groups, run_group, options.parallel, on_stop=stopping)
            for _, results in ordered:
                for result in results:
                    finish(result)
                if outcome["code"] > 128 and options.parallel <= 1:
                    break  # in this thread: read no further group (in flight ones all report)
        ended = True
    except KeyboardInterrupt:
        outcome["code"] = 130
    except Interrupted as exc:  # SIGTERM while runs were in flight in other threads
        outcome["code"] = exc.exit_code
    finally:
        for opened in journals:  # kept unless every reading was answered
            opened.close(finished=ended and outcome["code"] == 0)
    return outcome["code"]


def _journaled(options: Options) -> bool:
    """Whether the batch keeps a journal: each run writes a new trace in the data folder
    (not one named by --trace, nor a run continued by --resume or --resume-latest)."""
    how = options.run
    return (
        options.write_traces
        and how.trace is None
        and how.resume is None
        and not (how.resume_latest)
    )


def _traced_by_default(options: Options) -> bool:
    """Whether runs write a trace the user did not name: a new one in the data folder."""
    how = options.run
    return (
        options.write_traces and how.trace is None and how.resume is None and not how.resume_latest
    )


def _journal(paths: list[str], questions: list[str], engine: Engine) -> journal.Journal:
    """The journal of this batch: its documents and questions, read by this model so."""
    documents = [path if path == "-" else str(Path(path).resolve()) for path in paths]
    return journal.open_journal(
        {"command": "ask", "documents": documents, "questions": questions}
        | journal.run_identity(engine)
    )


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
    journals: list[journal.Journal],
    sizes: list[int],
) -> Iterator[list[Job]]:
    """The runs, in groups read together: questions of one document, in order. How many
    readings one pass holds (`sizes`) and the batch's journal (`journals`, when its traces
    go to the data folder) are decided with the first document, once the model is open."""
    several = len(paths) > 1
    report = options.run.report
    size: int | None = None  # questions read together, decided once the model is open
    entries: journal.Journal | None = None
    for number, path in enumerate(paths, start=1):
        try:
            document = read_document(
                path,
                password=options.password,
                format=options.format,
                report=report,
                use_cache=options.document_cache,
                ask_password=options.ask_password,
                ocr=options.ocr,
            )
        except DocumentError as exc:
            if not several:
                raise
            report.error(f"{exc.message} Skipped; the other documents go on.")
            outcome["code"] = max(outcome["code"], 1)
            continue
        if document.encrypted and _traced_by_default(options):
            report.warn(
                f"{Path(path).name} is encrypted, so no trace is written (its memories and "
                "answer may quote it) and its run cannot be resumed; --trace PATH keeps one."
            )
        session = open_session(document, engine(), report)
        if size is None:
            # A server's several runs are threads (--parallel), one reading each.
            readings = len(questions) * (len(paths) if options.parallel <= 1 else 1)
            size = session.engine.together(readings, options.together)
            sizes.append(size)
            if _journaled(options):
                entries = _journal(paths, questions, session.engine)
                journals.append(entries)
        labelled = options.parallel > 1 or size > 1
        jobs = []
        for index, question in enumerate(questions):
            label = ""
            if labelled:
                label = f"d{number} q{index + 1}" if several else f"q{index + 1}"
            key = f"d{number} q{index + 1}"
            jobs.append(Job(session, index, question, label, entries and entries.entry(key)))
        for start in range(0, len(jobs), size):
            yield jobs[start : start + size]


def _run_options(
    job: Job, options: Options, cancel: threading.Event | None, plain: bool
) -> run.RunOptions:
    """How `job` runs: its trace (none of an encrypted document unless named), label and
    journal line."""
    trace_path = options.run.trace if options.write_traces else None
    if trace_path is None and options.write_traces and not job.session.document.encrypted:
        trace_path = trace.default_path(job.session.document.path, job.index)
    return dataclasses.replace(
        options.run,
        trace=trace_path,
        label=job.label,
        cancel=cancel,
        plain=plain,
        journal=job.journal,
    )


def _run(
    group: list[Job], options: Options, cancel: threading.Event | None
) -> list[run.Result | run.Stopped]:
    runs = [_run_options(job, options, cancel, options.parallel > 1) for job in group]
    indexes = [job.index for job in group]
    watch = indexes.index(options.watch) if options.watch in indexes else 0
    questions = [job.question for job in group]
    return run.ask_together(group[0].session, questions, runs, watch)
