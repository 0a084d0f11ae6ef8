"""Questions about documents: each answered from a finished trace (cache), or read,
continuing an interrupted run (resume), with its trace written step by step. The questions
of one document are read together in one pass (`ask_together`); many readings of any
documents are read continuously, a few at a time in one context (`ask_each`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli import trace
from memagent_cli.errors import Interrupted, UserError
from memagent_cli.progress import SILENT, Note, Reporter
from memagent_cli.reader import (
    Answer,
    Event,
    Finished,
    Reading,
    Slots,
    Step,
    StepFinished,
    StepStarted,
    read_together,
)
from memagent_cli.run.journal import Entry
from memagent_cli.run.pool import BACKLOG
from memagent_cli.run.session import Session


@dataclass(frozen=True)
class RunOptions:
    """How one question is run, apart from the model and the document."""

    trace: Path | None = None  # where a fresh run writes its trace; None writes none
    resume: Path | None = None  # continue this interrupted trace
    resume_latest: bool = False  # continue the newest unfinished trace of the same run
    reuse: bool = True  # answer an identical greedy run from its finished trace
    report: Reporter = SILENT  # where notes and the reading view go
    label: str = ""  # names the run in progress lines and rows when there are several
    plain: bool = False  # other runs share stderr at the same time: plain lines, no live view
    cancel: threading.Event | None = None  # set: stop before the next step
    # This reading's line in its batch's journal: the trace an earlier, stopped run of the
    # same batch wrote is continued, or answers; a fresh trace is recorded there.
    journal: Entry | None = None


@dataclass
class Result:
    """One answered question, with everything `--json` reports."""

    answer: Answer
    session: Session
    seconds: float
    trace_path: Path | None
    cached: bool = False  # answered from a finished trace, without reading

    def stdout_line(self) -> str:
        if self.answer.answer is not None:
            return " ".join(self.answer.answer.split())
        return self.answer.reply.strip()

    def records(self) -> list[dict[str, Any]]:
        """The run as the records its trace holds: the header, one per step, the final."""
        header, steps, final = self._records()
        return [header.to_json(), *(step.to_json() for step in steps), final.to_json()]

    def _records(self) -> tuple[trace.Header, list[trace.StepRecord], trace.FinalRecord]:
        s, a = self.session, self.answer
        steps = [trace.StepRecord.of(step, _span(s, step)) for step in a.steps]
        final = trace.FinalRecord.of(a, s.span_of, s.document.unit)
        return s.header(a.question), steps, final

    def evidence(self) -> list[dict[str, Any]] | None:
        """The steps the answer came from, as its trace records them (trace.evidence_of)."""
        return trace.evidence_of(self.answer, self.session.span_of, self.session.document.unit)

    def to_trace(self) -> trace.Trace:
        """The run as a trace: its trace file when it holds the finished run, else the
        records it would hold (--no-trace, or an encrypted document)."""
        if self.trace_path is not None and self.trace_path.is_file():
            written = trace.read_trace(self.trace_path)
            if written.finished:
                return written
        header, steps, final = self._records()
        why = "an encrypted document" if self.session.document.encrypted else "--no-trace"
        path = self.trace_path or Path(f"(none written: {why})")
        return trace.Trace(path, header, steps=steps, final=final)

    def to_json(self) -> dict[str, Any]:
        """The answer with the same records the trace holds, and the run's speeds."""
        s, a = self.session, self.answer
        calls = [step.generation for step in a.steps] + [a.final]
        prompt_seconds = sum(g.prompt_seconds for g in calls)
        generation_seconds = sum(g.generation_seconds for g in calls)
        _, *steps, final = self.records()
        return {
            "answer": a.answer,
            "reply": a.reply,
            "question": a.question,
            "document": s.document_record(),
            "model": s.engine.model_record,
            "settings": s.engine.settings_record(),
            "steps": [{k: v for k, v in step.items() if k != "type"} for step in steps],
            "final": {k: v for k, v in final.items() if k not in ("type", "reply", "answer")},
            "evidence": final["evidence"],
            "seconds": round(self.seconds, 3),
            "tokens_per_second": {
                "prompt": _rate(sum(g.prompt_tokens for g in calls), prompt_seconds),
                "generation": _rate(sum(g.completion_tokens for g in calls), generation_seconds),
            },
            "trace": str(self.trace_path) if self.trace_path else None,
            "cached": self.cached,
        }


class Stopped(Exception):
    """A run ended before its answer: interrupted, or the backend failed. The trace keeps
    every finished step; `encrypted`: the run's document is encrypted (then it has a trace
    only when one was named)."""

    def __init__(
        self,
        reason: str,
        exit_code: int,
        done: int,
        total: int,
        trace_path: Path | None,
        encrypted: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason, self.exit_code = reason, exit_code
        self.done, self.total, self.trace_path = done, total, trace_path
        self.encrypted = encrypted

    @property
    def message(self) -> str:
        kept = f"; the trace {self.trace_path} keeps them" if self.trace_path else ""
        progress = f"after {self.done} of {self.total} steps{kept}."
        if self.exit_code > 128:  # 128 + a signal's number
            return f"Interrupted ({self.reason}) {progress}"
        return f"{self.reason.rstrip('.')}. Stopped {progress}"


def ask(session: Session, question: str, options: RunOptions) -> Result:
    """Answer `question` about the session's document; Stopped when the run ends early."""
    outcome = ask_together(session, [question], [options])[0]
    if isinstance(outcome, Stopped):
        raise outcome
    return outcome


@dataclass
class _Run:
    """One question of several read together: where it starts and what it writes."""

    index: int
    question: str
    options: RunOptions
    header: trace.Header
    done: list[Step]
    trace_path: Path | None
    resumed: bool  # continues an interrupted trace
    writer: trace.TraceWriter | None = None
    finished: int = 0  # steps
    answer: Answer | None = None  # once answered: a later stop of the others keeps it


def ask_together(
    session: Session, questions: list[str], options: list[RunOptions], watch: int = 0
) -> list[Result | Stopped]:
    """Answer several questions about the session's document in one pass: each is answered
    from a finished trace when it can be, or resumed, and the rest are read together, each
    writing its own trace. On Ctrl-C or a backend failure every unfinished run is Stopped
    with its trace valid up to its last finished step. `watch`: whose memory the live view
    shows."""
    start = time.perf_counter()
    outcomes: list[Result | Stopped | None] = [None] * len(questions)
    runs: list[_Run] = []
    for index, (question, how) in enumerate(zip(questions, options, strict=True)):
        ready = _start(session, index, question, how, start)
        if isinstance(ready, Result):
            outcomes[index] = ready
        else:
            runs.append(ready)
    if runs:
        for outcome, run in zip(_read(session, runs, watch, start), runs, strict=True):
            outcomes[run.index] = outcome
    return [outcome for outcome in outcomes if outcome is not None]


def _start(
    session: Session, index: int, question: str, how: RunOptions, start: float
) -> Result | _Run:
    """A run of `question`: answered from a finished trace at once, or ready to read (from
    the start, or after the steps of the trace it continues)."""
    note = _note(how)
    header = session.header(question)
    earlier = _earlier_run(header, how)
    if earlier is not None and earlier.finished:
        if how.resume or how.resume_latest:
            note(f"{earlier.path} is already finished; its answer follows.")
        elif how.journal is not None and earlier.path == how.journal.earlier:
            note(f"answered from {earlier.path}, finished before this command was stopped")
        else:
            note(f"answered from the finished trace {earlier.path} (--no-reuse reads again)")
        return _result_from(session, earlier, start)
    done = _steps_of(session, earlier) if earlier else []
    path = earlier.path if earlier else _unwritten_journaled(how) or how.trace
    return _Run(index, question, how, header, done, path, earlier is not None, finished=len(done))


def _open_trace(session: Session, run: _Run) -> None:
    """Start (or continue) the run's trace, recorded in its batch's journal, and say where."""
    if run.trace_path is None:
        return
    resume_from = len(run.done) if run.resumed else None
    if run.options.journal is not None:
        # The journal first: a kill between the two then leaves a trace the journal names
        # (empty or headless, which the next run writes afresh), never one it does not.
        run.options.journal.started(run.trace_path)
    run.writer = trace.TraceWriter(
        run.trace_path, run.header, session.span_of, resume_from=resume_from
    )
    _note(run.options)(
        f"resuming {run.trace_path} after step {len(run.done)}"
        if run.resumed
        else f"trace: {run.trace_path}"
    )


def _stop(run: _Run, exc: BaseException, session: Session) -> Stopped:
    """The run stopped by `exc` (Ctrl-C, SIGTERM, a failing backend), its trace saying so."""
    reason = exc.message if isinstance(exc, UserError) else (str(exc) or "SIGINT")
    code = 130 if isinstance(exc, KeyboardInterrupt) else exc.exit_code  # type: ignore[attr-defined]
    if run.writer is not None:
        run.writer.interrupted(reason)
    total, encrypted = len(session.chunks), session.document.encrypted
    return Stopped(reason, code, run.finished, total, run.trace_path, encrypted)


@dataclass(frozen=True)
class Job:
    """One question about one document, for `ask_each`."""

    session: Session
    question: str
    options: RunOptions


def ask_each(jobs: Iterable[Job], slots: int) -> Iterator[Result | Stopped]:
    """Answer every job, outcomes in input order: each from a finished trace when it can
    be, else read in one of `slots` sequences of the engine's one context, together with
    the other readings in flight whatever their documents and lengths; an answered reading's
    slot takes the next job at once (continuous batching, reader.Slots). At most BACKLOG x
    `slots` jobs are taken ahead of the outcomes passed on, so documents are read as slots
    free up and memory stays bounded. Each reading writes its own trace and shows its own
    progress lines. On Ctrl-C or a backend failure every reading in a slot is Stopped, its
    trace valid up to its last finished step; the outcomes of every job taken are passed
    on, and no further job is taken. Every job's session must share one engine."""
    start = time.perf_counter()
    source = iter(jobs)
    ready: dict[int, Result | Stopped] = {}  # outcomes not passed on yet, by job number
    reading: dict[int, tuple[_Run, Job, Any]] = {}  # id(Reading) -> run, job, its view
    taken = passed = 0
    batch: Slots | None = None
    exhausted = False
    held: UserError | None = None  # from `jobs` (a journal that cannot be written, say)

    def passing() -> Iterator[Result | Stopped]:
        nonlocal passed
        while passed in ready:
            yield ready.pop(passed)
            passed += 1

    def close(run: _Run, view: Any) -> None:
        if run.writer is not None:
            run.writer.close()
        view.__exit__(None, None, None)

    try:
        while True:
            while (
                not exhausted
                and (batch is None or batch.free)
                and taken - passed < (BACKLOG * slots)
            ):
                try:
                    job = next(source, None)
                except UserError as exc:  # the readings in flight finish first
                    held, job = exc, None
                if job is None:
                    exhausted = True
                    break
                number, taken = taken, taken + 1
                try:
                    run = _start(job.session, number, job.question, job.options, start)
                except UserError as exc:  # its trace cannot be continued: it alone fails
                    total = len(job.session.chunks)
                    ready[number] = Stopped(exc.message, exc.exit_code, 0, total, None)
                    continue
                if isinstance(run, Result):
                    ready[number] = run
                    continue
                engine = job.session.engine
                if batch is None:
                    with job.options.report.progress("bytes") as progress:
                        engine.prepare(slots, progress)
                    batch = Slots(engine.backend, engine.settings, slots)
                view = _view(job, slots)
                try:
                    _open_trace(job.session, run)
                    view.__enter__()
                except BaseException:
                    if run.writer is not None:
                        run.writer.close()
                    raise
                item = Reading(
                    run.question, _listener(run, view.listener(0)), run.done, job.session.chunks
                )
                reading[id(item)] = (run, job, view)
                batch.add(item)
            yield from passing()
            if batch is None or not batch.busy:
                if exhausted:
                    break
                continue
            for _, item, answer in batch.advance():
                run, job, view = reading.pop(id(item))
                close(run, view)
                seconds = time.perf_counter() - start
                ready[run.index] = Result(answer, job.session, seconds, run.trace_path)
            yield from passing()
    except (KeyboardInterrupt, Interrupted, UserError) as exc:
        for run, job, view in reading.values():
            ready[run.index] = _stop(run, exc, job.session)
            close(run, view)
        reading.clear()
        yield from passing()
    finally:
        for run, _, view in reading.values():  # the caller stopped early: traces stay valid
            close(run, view)
    if held is not None:
        raise held


def _view(job: Job, slots: int) -> Any:
    """The progress view of one reading: plain lines when others are read at once."""
    session, how = job.session, job.options
    title = f"{Path(session.document.path).name} · {session.engine.model_record['name']}"
    return how.report.reading(
        session.span_of,
        len(session.tokens),
        f"{title} · {job.question}",
        [how.label],
        plain=how.plain or slots > 1,
    )


def _read(session: Session, runs: list[_Run], watch: int, start: float) -> list[Result | Stopped]:
    """Read the runs' questions together, each writing its trace as its steps finish."""
    engine = session.engine
    first = runs[0]
    with first.options.report.progress("bytes") as progress:  # before the reading view
        engine.prepare(len(runs), progress)
    name = Path(session.document.path).name
    title = f"{name} · {engine.model_record['name']} · {first.question}"
    if len(runs) > 1:
        title = f"{name} · {engine.model_record['name']} · {len(runs)} questions"
    view = first.options.report.reading(
        session.span_of,
        len(session.tokens),
        title,
        [run.options.label for run in runs],
        plain=first.options.plain,
        watch=watch,
    )
    readings = []
    try:
        for position, run in enumerate(runs):
            _open_trace(session, run)
            readings.append(
                Reading(run.question, _listener(run, view.listener(position)), run.done)
            )
        with view:
            answers = read_together(engine.backend, readings, session.chunks, engine.settings)
    except (KeyboardInterrupt, Interrupted, UserError) as exc:
        seconds = time.perf_counter() - start
        outcomes: list[Result | Stopped] = []
        for run in runs:
            if run.answer is not None:
                outcomes.append(Result(run.answer, session, seconds, run.trace_path))
            else:
                outcomes.append(_stop(run, exc, session))
        return outcomes
    finally:
        for run in runs:
            if run.writer is not None:
                run.writer.close()
    seconds = time.perf_counter() - start
    return [
        Result(answer, session, seconds, run.trace_path)
        for answer, run in zip(answers, runs, strict=True)
    ]


def _listener(run: _Run, show: Callable[[Event], None]) -> Callable[[Event], None]:
    """Counts finished steps, writes the trace, shows progress; stops at a cancel request."""

    def listener(event: Event) -> None:
        cancel = run.options.cancel
        if isinstance(event, StepStarted) and cancel is not None and cancel.is_set():
            raise Interrupted("SIGINT")
        if isinstance(event, StepFinished):
            run.finished += 1
        elif isinstance(event, Finished):
            run.answer = event.answer
        if run.writer is not None:
            run.writer(event)
        show(event)

    return listener


def _note(options: RunOptions) -> Note:
    return options.report.note


def _earlier_run(header: trace.Header, options: RunOptions) -> trace.Trace | None:
    """The trace this run continues (--resume, or its batch's journal) or is answered from
    (the journal, or the cache), if any."""
    if options.journal is not None and (path := options.journal.earlier) is not None:
        # The batch was stopped before: its trace of this reading, when it is still the same
        # run (a document edited since, or a damaged trace, is read afresh).
        try:
            journaled = trace.read_trace(path)
        except trace.TraceError:
            journaled = None
        if journaled is not None and not trace.differences(journaled.header, header):
            return journaled
    if options.resume is not None:
        earlier = trace.read_trace(options.resume)
        if differences := trace.differences(earlier.header, header):
            raise UserError(f"Cannot resume {options.resume}: " + "; ".join(differences) + ".")
        return earlier
    if options.resume_latest:
        # With several questions, some may have finished before the others were stopped.
        found = trace.find_run(header, finished=False) or trace.find_run(header, finished=True)
        if found is None:
            raise UserError(
                "There is no unfinished trace of this document, question, model and "
                "settings to resume; name one with --resume TRACE."
            )
        return found
    if options.reuse and header.settings["temperature"] == 0:
        return trace.find_run(header, finished=True)
    return None


def _unwritten_journaled(options: RunOptions) -> Path | None:
    """The trace path a stopped run of this batch had taken for this reading but was killed
    before its header was whole: this run writes it afresh, so each reading keeps one trace."""
    path = options.journal.earlier if options.journal is not None else None
    if path is None or options.trace is None:
        return None
    try:
        if path.exists():
            with path.open("rb") as file:
                if b"\n" in file.read(_HEADLESS) or file.read(1):
                    return None  # a whole line, or too long to be a header: never overwritten
        path.unlink(missing_ok=True)
    except OSError:
        return None
    return path


_HEADLESS = 1 << 20  # longer than any trace header


def _steps_of(session: Session, earlier: trace.Trace) -> list[Step]:
    """The finished steps of a trace, checked against this session's chunks."""
    steps = []
    for record in earlier.steps:
        index = record.index
        chunk = session.chunks[index] if index < len(session.chunks) else None
        if chunk is None or record.chunk_sha256 != trace.chunk_sha256(chunk):
            raise UserError(
                f"Cannot resume {earlier.path}: its step {index + 1} did not read the chunk "
                "this run would read (a different tokenizer or build?)."
            )
        steps.append(record.to_step(chunk))
    return steps


def _result_from(session: Session, earlier: trace.Trace, start: float) -> Result:
    final = earlier.final
    assert final is not None
    answer = Answer(
        question=earlier.header.question,
        answer=final.answer,
        reply=final.reply,
        steps=_steps_of(session, earlier),
        final=final.generation(),
    )
    return Result(answer, session, time.perf_counter() - start, earlier.path, cached=True)


def _span(session: Session, step: Step) -> str:
    return session.span_of(step.chunk.char_start, step.chunk.char_end)


def _rate(tokens: int, seconds: float) -> float | None:
    return round(tokens / seconds, 1) if seconds else None
