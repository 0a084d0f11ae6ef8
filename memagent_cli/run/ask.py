"""Questions about documents, answered one way: each run answered from a finished trace
(cache), or read, continuing an interrupted run (resume), with its trace written step by
step. `ask_runs` reads every run through one scheduler (scheduler.py), a few at a time in
one context whatever their documents; run/batch.py's `outcomes` gives it the runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memagent_cli import trace
from memagent_cli.errors import STOPS, Interrupted, UserError, stop_code
from memagent_cli.progress import SILENT, Layout, Listener, ReadingId, ReadingView, Reporter
from memagent_cli.reader import Answer, Event, Step, StepFinished, StepStarted
from memagent_cli.run import expect
from memagent_cli.run.journal import Entry
from memagent_cli.run.pool import BACKLOG
from memagent_cli.run.session import Session
from memagent_cli.scheduler import Job, Scheduler, prompt_sha256


@dataclass(frozen=True)
class RunOptions:
    """How one question is run, apart from the model and the document."""

    trace: Path | None = None  # where a fresh run writes its trace; None writes none
    resume: Path | None = None  # continue this interrupted trace
    resume_latest: bool = False  # continue the newest unfinished trace of the same run
    reuse: bool = True  # answer an identical greedy run from its finished trace
    cancel: threading.Event | None = None  # set: stop before the next step
    # This reading's line in its batch's journal: the trace an earlier, stopped run of the
    # same batch wrote is continued, or answers; a fresh trace is recorded there.
    journal: Entry | None = None


@dataclass
class Result:
    """One answered question: the answer, every memory, and the records its trace holds,
    with everything `--json` reports. What `api.ask` and a batch give for each run."""

    answered: Answer  # the reading's outcome: its steps, its final reply
    session: Session
    seconds: float
    trace_path: Path | None
    cached: bool = False  # answered from a finished trace, without reading

    @property
    def text(self) -> str:
        """The answer (the last \\boxed{}), else the raw final reply, on one line."""
        if self.answered.answer is not None:
            return " ".join(self.answered.answer.split())
        return self.answered.reply.strip()

    @property
    def answer(self) -> str | None:
        """The content of the final reply's last \\boxed{}; None when it has none."""
        return self.answered.answer

    @property
    def memories(self) -> list[str]:
        """The memory after each step, in reading order."""
        return [step.memory for step in self.answered.steps]

    @property
    def chunks(self) -> int:
        """How many chunks the document was cut into."""
        return len(self.session.chunks)

    @property
    def evidence(self) -> list[trace.Source] | None:
        """The steps the answer's words came from (provenance.Source: step from 1, words,
        tokens, chars, pages or chapters); [] when the final memory does not hold them, None
        with no answer (trace.evidence_of). `to_json()["evidence"]` has them as JSON."""
        s = self.session
        return trace.evidence_of(self.answered, s.document.place, s.engine.settings.reader)

    def records(self) -> list[dict[str, Any]]:
        """The run as the records its trace holds: the header, one per step, the final."""
        header, steps, final = self._records()
        return [header.to_json(), *(step.to_json() for step in steps), final.to_json()]

    def _records(self) -> tuple[trace.Header, list[trace.StepRecord], trace.FinalRecord]:
        s, a = self.session, self.answered
        steps = [
            trace.StepRecord.of(step, _span(s, step), s.span_of, number)
            for number, step in enumerate(a.steps)
        ]
        final = trace.FinalRecord.of(a, s.document.place, s.engine.settings.reader)
        return s.header(a.question), steps, final

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
        s, a = self.session, self.answered
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
            # A reader that stops early reads fewer chunks than the document has.
            "chunks_read": len(a.steps),
            "stopped_early": a.stopped,
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


@dataclass(frozen=True)
class Run:
    """One question about one document, and how it is run. `place` is (document, question)
    in its batch, 0-based, for the views."""

    session: Session
    question: str
    options: RunOptions = RunOptions()
    place: tuple[int, int] = (0, 0)
    name: str = ""  # what its batch calls it, if anything (an evaluation's case)

    def reading_id(self) -> ReadingId:
        session = self.session
        return ReadingId(
            document=session.document.path,
            model=str(session.engine.model_record.get("name") or ""),
            question=self.question,
            place=self.place,
            total_tokens=len(session.tokens),
            span_of=session.span_of,
            name=self.name,
        )


@dataclass
class _Open:
    """A run being read: where it started, its trace writer, its steps finished so far."""

    number: int  # its place in the input order
    run: Run
    header: trace.Header
    done: list[Step]
    trace_path: Path | None
    resumed: bool  # continues an interrupted trace
    writer: trace.TraceWriter | None = None
    finished: int = 0  # steps
    reading: ReadingId | None = None  # once shown
    # Replies the interrupted run had that none of its steps held (scheduler.Job.answered).
    kept: tuple[trace.Reply, ...] = ()
    job: Job | None = None  # once read in the scheduler


def ask_runs(
    runs: Iterable[Run], at_once: int, report: Reporter = SILENT, batch: Layout | None = None
) -> Iterator[Result | Stopped]:
    """Answer every run, outcomes in input order: each from a finished trace when it can
    be, else read in one of `at_once` sequences of the engine's one context, together with
    the other readings in flight whatever their documents and lengths; an answered reading's
    slot takes the next run at once (continuous batching, scheduler.py). At most BACKLOG x
    `at_once` runs are taken ahead of the outcomes passed on, so documents are read as slots
    free up and memory stays bounded. Each reading writes its own trace. On Ctrl-C, SIGTERM
    or a backend failure every reading in a slot is Stopped, its trace valid up to its last
    finished step; the outcomes of every run taken are passed on, and no further run is
    taken. Every run's session must share one engine."""
    view = report.reading(batch or Layout(at_once=at_once))
    flight = _Flight(at_once, report, view)
    source = iter(runs)
    with view:
        try:
            more = True  # `runs` may hold more
            while more or flight.busy:
                more = more and flight.take(source)
                yield from flight.passed_on()
                if flight.busy:
                    flight.advance()
                    yield from flight.passed_on()
        except (*STOPS, UserError) as exc:
            flight.stop(exc)
        finally:
            flight.close()  # the caller stopped early: traces stay valid
    yield from flight.passed_on()
    if flight.failure is not None:
        raise flight.failure


class _Flight:
    """The runs of one `ask_runs` between `runs` and its outcomes: those read in the
    scheduler, and the outcomes not passed on yet (they go in input order)."""

    def __init__(self, at_once: int, report: Reporter, view: ReadingView) -> None:
        self.at_once, self.report, self.view = at_once, report, view
        self.start = time.perf_counter()
        self.scheduler: Scheduler | None = None  # made when the first run is read
        self.reading: dict[int, _Open] = {}  # id(the scheduler's Job) -> the run it reads
        self.ready: dict[int, Result | Stopped] = {}  # by run number
        self.taken = self.passed = 0
        # Raised once the outcomes before it are passed on: a failure of `runs` (a journal
        # that cannot be written, say), or one that came with no reading in flight to stop.
        self.failure: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self.scheduler is not None and self.scheduler.busy > 0

    def take(self, runs: Iterator[Run]) -> bool:
        """Take runs while a slot is free and few outcomes wait; False once `runs` has no
        more. A failure of `runs` ends it: the readings in flight finish first."""
        while self.scheduler is None or self.scheduler.free:
            if self.taken - self.passed >= BACKLOG * self.at_once:
                return True
            try:
                run = next(runs, None)
            except UserError as exc:
                self.failure, run = exc, None
            if run is None:
                return False
            self._take_one(run)
        return True

    def _take_one(self, run: Run) -> None:
        """`run` answered from its trace at once, or read in a slot of the scheduler."""
        number, self.taken = self.taken, self.taken + 1
        opened = _start(run, number, self.report, self.start)
        if not isinstance(opened, _Open):
            self.ready[number] = opened
            return
        engine = run.session.engine
        if not self.busy:
            # Between readings: the weights on first use, and the larger context a longer
            # document needs where the reader's calls grow with it (Engine.fit).
            with self.report.progress("bytes") as progress:
                engine.prepare(self.at_once, progress)
        if self.scheduler is None:
            self.scheduler = Scheduler(engine.backend, engine.settings, self.at_once)
        job = opened.job = _job(opened, self.view, self.report)
        self.reading[id(job)] = opened
        self.scheduler.add(job)

    def advance(self) -> None:
        """One round of the scheduler's calls; each reading it answered is a Result."""
        assert self.scheduler is not None
        for _, job, answer in self.scheduler.advance():
            opened = self.reading.pop(id(job))
            _close(opened, self.view)
            seconds = time.perf_counter() - self.start
            session = opened.run.session
            self.ready[opened.number] = Result(answer, session, seconds, opened.trace_path)

    def stop(self, exc: BaseException) -> None:
        """Every reading in flight Stopped by `exc`; with none to stop and tell it by, the
        caller hears of `exc` itself."""
        if not self.reading:
            self.failure = exc
        for opened in self.reading.values():
            assert self.scheduler is not None and opened.job is not None
            kept = self.scheduler.kept(opened.job)
            replies = [trace.Reply.of(prompt_sha256(prompt), reply) for prompt, reply in kept]
            self.ready[opened.number] = _stop(opened, exc, replies)
            _close(opened, self.view)
        self.reading.clear()

    def close(self) -> None:
        for opened in self.reading.values():
            _close(opened, self.view)

    def passed_on(self) -> Iterator[Result | Stopped]:
        """The outcomes ready, in input order; none under a live view's drawing."""
        while self.passed in self.ready and not self.view.showing:
            yield self.ready.pop(self.passed)
            self.passed += 1


def _start(run: Run, number: int, report: Reporter, start: float) -> Result | Stopped | _Open:
    """`run` answered from a finished trace at once, or ready to read (from the start, or
    after the steps of the trace it continues); Stopped when its trace cannot be continued."""
    session, how = run.session, run.options
    header = session.header(run.question)
    try:
        earlier = _earlier_run(header, how)
        if earlier is not None and earlier.finished:
            if how.resume or how.resume_latest:
                report.note(f"{earlier.path} is already finished; its answer follows.")
            elif how.journal is not None and earlier.path == how.journal.earlier:
                report.note(
                    f"answered from {earlier.path}, finished before this command was stopped"
                )
            else:
                report.note(
                    f"answered from the finished trace {earlier.path} (--no-reuse reads again)"
                )
            return _result_from(session, earlier, start)
        done = _steps_of(session, earlier) if earlier else []
    except UserError as exc:  # it alone fails
        return Stopped(exc.message, exc.exit_code, 0, len(session.chunks), None)
    path = earlier.path if earlier else _unwritten_journaled(how) or how.trace
    kept = earlier.interruption.replies if earlier and earlier.interruption else ()
    return _Open(
        number, run, header, done, path, earlier is not None, finished=len(done), kept=kept
    )


def _job(opened: _Open, view: ReadingView, report: Reporter) -> Job:
    """The scheduler's job of an opened run: its trace started, its reading shown."""
    if not opened.resumed:
        # The settings as the loaded model reads by them: a model's first reading on this
        # machine measures its calibration when the weights load, after _start made the
        # header (a calibration is no part of which run a trace is: trace/folder.py).
        settings = opened.run.session.engine.settings_record()
        opened.header = replace(opened.header, settings=settings)
    _open_trace(opened, report)
    run = opened.run
    # What the reading is expected to take, said before it starts where it is long.
    opened.reading = expect.announced(run.reading_id(), run.session, len(opened.done), report.note)
    try:
        show = view.started(opened.reading)
    except BaseException:
        _close(opened, view)
        raise
    show = expect.noting(opened.reading, run.session, show, report)
    answered = [(reply.prompt_sha256, reply.generation()) for reply in opened.kept]
    return Job(
        run.question,
        run.session.chunks,
        _listener(opened, show),
        opened.done,
        run.session.reader,
        answered,
    )


def _open_trace(opened: _Open, report: Reporter) -> None:
    """Start (or continue) the run's trace, recorded in its batch's journal, and say where."""
    if opened.trace_path is None:
        return
    resume_from = len(opened.done) if opened.resumed else None
    journal = opened.run.options.journal
    if journal is not None:
        # The journal first: a kill between the two then leaves a trace the journal names
        # (empty or headless, which the next run writes afresh), never one it does not.
        journal.started(opened.trace_path)
    span_of = opened.run.session.span_of
    opened.writer = trace.TraceWriter(
        opened.trace_path,
        opened.header,
        span_of,
        place_of=opened.run.session.document.place,
        resume_from=resume_from,
    )
    kept = len(opened.kept)
    replies = f", with {kept} {'reply' if kept == 1 else 'replies'} it had kept" if kept else ""
    report.note(
        f"resuming {opened.trace_path} after step {len(opened.done)}{replies}"
        if opened.resumed
        else f"trace: {opened.trace_path}"
    )


def _close(opened: _Open, view: ReadingView) -> None:
    if opened.writer is not None:
        opened.writer.close()
        opened.writer = None
    if opened.reading is not None:
        view.ended(opened.reading)
        opened.reading = None


def _stop(opened: _Open, exc: BaseException, replies: list[trace.Reply]) -> Stopped:
    """The run stopped by `exc` (Ctrl-C, SIGTERM, a failing backend), its trace saying so
    and keeping the `replies` it had that no finished step holds."""
    reason = exc.message if isinstance(exc, UserError) else (str(exc) or "SIGINT")
    code = exc.exit_code if isinstance(exc, UserError) else stop_code(exc)
    if opened.writer is not None:
        opened.writer.interrupted(reason, replies)
    session = opened.run.session
    total, encrypted = len(session.chunks), session.document.encrypted
    return Stopped(reason, code, opened.finished, total, opened.trace_path, encrypted)


def _listener(opened: _Open, show: Listener) -> Listener:
    """Counts finished steps, writes the trace, shows progress; stops at a cancel request."""

    def listener(event: Event) -> None:
        cancel = opened.run.options.cancel
        if isinstance(event, StepStarted) and cancel is not None and cancel.is_set():
            raise Interrupted("SIGINT")
        if isinstance(event, StepFinished):
            opened.finished += 1
        if opened.writer is not None:
            opened.writer(event)
        show(event)

    return listener


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
        index = record.chunk_index
        chunk = session.chunks[index] if index < len(session.chunks) else None
        if chunk is None or record.chunk_sha256 != trace.chunk_sha256(chunk):
            raise UserError(
                f"Cannot resume {earlier.path}: its step {record.index + 1} did not read the chunk "
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
        stopped=final.stopped,
    )
    return Result(answer, session, time.perf_counter() - start, earlier.path, cached=True)


def _span(session: Session, step: Step) -> str:
    return session.span_of(step.chunk.char_start, step.chunk.char_end)


def _rate(tokens: int, seconds: float) -> float | None:
    return round(tokens / seconds, 1) if seconds else None
