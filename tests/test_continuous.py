"""Continuous batching in-process (scheduler.Scheduler, run.ask_runs): readings of any documents
and lengths share one context, a sequence each, and a slot freed by an answered reading
takes the next at once. With a stand-in backend whose reply depends only on the message,
every reading must give what it gives alone, each answered once, in input order, and
Ctrl-C must leave every trace valid. The real model is checked in
test_continuous_model.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support import asking
from support.scripted import EchoBackend as Echo
from test_together import SETTINGS, chunks_of, records

from memagent_cli import readers, trace
from memagent_cli.documents import Document
from memagent_cli.errors import UserError
from memagent_cli.reader import read
from memagent_cli.run import ask as run
from memagent_cli.run.engine import Engine
from memagent_cli.run.session import open_session
from memagent_cli.scheduler import Job, Scheduler
from memagent_cli.views import progress as display

# Documents of 1, 4, 2 and 3 chunks (SETTINGS: 40 tokens a chunk, one token per byte).
TEXTS = [
    "The bell rang twice.",
    "The miller counts sacks of flour every evening before the market opens. " * 2,
    "Rain fell on the bridge all night. The ferry waited.",
    "A fox crossed the frozen river at dawn. The hunters lost its trail. " * 1 + "x" * 30,
]
QUESTION = "What happened?"


class EchoBackend(Echo):
    """test_together's stand-in, keeping every call to see which ones start a reading."""

    def __init__(self, calls_left: int | None = None) -> None:
        super().__init__(calls_left)
        self.calls = []

    def next_replies(self, calls, *, sampling):
        self.calls += calls
        return super().next_replies(calls, sampling=sampling)


class StreamingBackend(EchoBackend):
    """The stand-in as an engine that decodes calls together: each `next_replies` completes
    only the oldest call in flight, the others stay in flight (as replies of different
    lengths end one at a time); Ctrl-C after `calls_left` replies, as the stand-in's."""

    def __init__(self, calls_left: int | None = None) -> None:
        super().__init__(calls_left)
        self.flight = []
        self.cancelled = 0

    def next_replies(self, calls, *, sampling):
        assert not {c.sequence for c in calls} & {c.sequence for c in self.flight}
        self.flight += calls
        if not self.flight:
            return []
        self.rounds.append(sorted(c.sequence for c in self.flight))  # in flight with it
        call = self.flight.pop(0)
        reply = self.generate(call.message, max_tokens=call.max_tokens, sampling=sampling)
        return [(call.sequence, reply)]

    def cancel(self):
        self.cancelled += 1
        self.flight = []


def test_slots_are_reused_lowest_first_and_every_reading_is_answered_once():
    backend = EchoBackend()
    slots = Scheduler(backend, SETTINGS, 2)
    waiting = [Job(QUESTION, chunks=chunks_of(text)) for text in TEXTS]
    lengths = [len(r.chunks) + 1 for r in waiting]  # calls: one per chunk, then the answer
    assert lengths == [2, 5, 3, 4]
    order, answered = [], []
    while waiting or slots.busy:
        while waiting and slots.free:
            order.append(slots.add(waiting.pop(0)))
        answered += [(slot, reading.chunks) for slot, reading, _ in slots.advance()]
    # Reading 0 (2 calls) leaves slot 0 after round 2: reading 2 takes it; reading 2 ends
    # after round 5, with reading 1 (5 calls): reading 3 takes slot 0, the lowest free, for
    # its 4 calls alone.
    assert order == [0, 1, 0, 0]
    assert backend.rounds == [[0, 1]] * 5 + [[0]] * 4
    assert [len(chunks) for _, chunks in answered] == [1, 2, 4, 3]  # each once, as it ended
    # A fresh slot is cleared for its new reading: the first call of each reading says so.
    fresh = [c for c in backend.calls if c.fresh]
    assert len(fresh) == 4


def engine_of(backend) -> Engine:
    return Engine(backend, SETTINGS, 4096)


def runs(engine: Engine, tmp_path, texts=TEXTS, **more) -> list[run.Run]:
    made = []
    for i, text in enumerate(texts):
        document = Document(text=text, path=f"/books/b{i}.txt", format="text", sha256=f"{i:064x}")
        how = run.RunOptions(trace=tmp_path / f"b{i}.jsonl", reuse=False, **more)
        made.append(run.Run(open_session(document, engine), QUESTION, how))
    return made


@pytest.mark.parametrize(
    "backend, rounds",
    [
        # In turn: each round answers every call; as in the test above.
        (EchoBackend, [[0, 1]] * 5 + [[0]] * 4),
        # One reply at a time, 14 in all (2 + 5 + 3 + 4 calls): both slots have a call in
        # flight until one reading is left (next_replies checks that no slot has two).
        (StreamingBackend, [[0, 1]] * 10 + [[0]] * 4),
    ],
)
def test_readings_of_many_documents_read_continuously_write_what_they_write_alone(
    tmp_path, backend, rounds
):
    alone_dir, together_dir = tmp_path / "alone", tmp_path / "together"
    alone_dir.mkdir(), together_dir.mkdir()
    for job in runs(engine_of(EchoBackend()), alone_dir):
        asking.ask(job.session, job.question, job.options)
    backend = backend()
    outcomes = list(run.ask_runs(runs(engine_of(backend), together_dir), 2))
    assert backend.sequences == 2  # one context, two sequences
    assert [o.session.document.path for o in outcomes] == [f"/books/b{i}.txt" for i in range(4)]
    for i, outcome in enumerate(outcomes):
        assert isinstance(outcome, run.Result)
        assert records(together_dir / f"b{i}.jsonl") == records(alone_dir / f"b{i}.jsonl")
        alone = read(EchoBackend(), QUESTION, outcome.session.chunks, SETTINGS)
        assert outcome.answer == alone.answer
    assert backend.rounds == rounds


def test_ctrl_c_keeps_every_trace_valid_and_the_same_jobs_resume_to_the_same_answers(tmp_path):
    whole = [o.answer for o in run.ask_runs(runs(engine_of(EchoBackend()), tmp_path), 2)]
    cut = tmp_path / "cut"
    cut.mkdir()
    # Ctrl-C in round 4: reading 0 was answered (round 2), readings 1 and 2 are in slots.
    outcomes = list(run.ask_runs(runs(engine_of(EchoBackend(calls_left=7)), cut), 2))
    assert len(outcomes) == 3  # reading 3 was never taken
    answered, *stopped = outcomes
    assert isinstance(answered, run.Result) and answered.answer == whole[0]
    assert [type(s) for s in stopped] == [run.Stopped, run.Stopped]
    assert [s.done for s in stopped] == [3, 1] and all(s.exit_code == 130 for s in stopped)
    assert trace.read_trace(cut / "b0.jsonl").finished
    for i, steps in ((1, 3), (2, 1)):
        kept = trace.read_trace(cut / f"b{i}.jsonl")
        assert len(kept.steps) == steps and kept.interruption.steps_done == steps
    assert not (cut / "b3.jsonl").exists()

    _, *rest = runs(engine_of(EchoBackend()), cut)
    for i in (0, 1):  # readings 1 and 2 continue their traces; reading 3 starts
        rest[i] = replace(rest[i], options=run.RunOptions(resume=rest[i].options.trace))
    again = list(run.ask_runs(rest, 2))
    assert [o.answer for o in again] == whole[1:]
    for i in (1, 2, 3):
        assert trace.read_trace(cut / f"b{i}.jsonl").finished


@pytest.mark.parametrize("slots", [1, 3])
def test_a_long_queue_is_taken_a_little_ahead_of_the_answers(tmp_path, slots):
    taken = []
    texts = TEXTS * 5

    def lazily():
        for job in runs(engine_of(EchoBackend()), tmp_path, texts):
            taken.append(job)
            yield job

    passed = 0
    for _ in run.ask_runs(lazily(), slots):
        passed += 1
        assert len(taken) - passed <= 2 * slots  # documents are read as slots free up
    assert passed == len(texts)


def test_a_queue_that_fails_lets_the_readings_in_flight_finish_first(tmp_path):
    def failing():
        yield from runs(engine_of(EchoBackend()), tmp_path, TEXTS[:2])
        raise UserError("The journal cannot be written.")

    passed = []
    with pytest.raises(UserError, match="journal cannot be written"):
        for outcome in run.ask_runs(failing(), 2):
            passed.append(outcome)
    assert [type(o) for o in passed] == [run.Result, run.Result]
    assert all(trace.read_trace(tmp_path / f"b{i}.jsonl").finished for i in (0, 1))


class LoadingBackend(EchoBackend):
    """The stand-in, telling its loading as llama.cpp's backend does."""

    def prepare(self, context_tokens: int, sequences: int = 1, progress=None) -> None:
        super().prepare(context_tokens, sequences)
        if progress is not None:
            progress("loading scripted", 1234, 1234)


def test_the_model_s_loading_is_told_as_for_one_reading(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(display.Bar, "_DELAY", 0.0)  # the stand-in loads at once
    list(run.ask_runs(runs(engine_of(LoadingBackend()), tmp_path), 2, display.Terminal()))
    assert "loading scripted: 1.2 kB of 1.2 kB" in capsys.readouterr().err.splitlines()


def test_ctrl_c_while_calls_are_in_flight_cancels_them_and_resumes_to_the_same_answers(
    tmp_path,
):
    whole = [o.answer for o in run.ask_runs(runs(engine_of(EchoBackend()), tmp_path), 2)]
    cut = tmp_path / "cut"
    cut.mkdir()
    backend = StreamingBackend(calls_left=6)
    outcomes = list(run.ask_runs(runs(engine_of(backend), cut), 2))
    assert backend.cancelled == 1 and backend.flight == []
    assert [type(o) for o in outcomes] == [run.Result, run.Stopped, run.Stopped]
    # Replies in order: A1, B1, A's answer, B2, C1, B3; Ctrl-C with C2 and B4 in flight.
    assert [s.done for s in outcomes[1:]] == [3, 1]
    _, *rest = runs(engine_of(EchoBackend()), cut)
    for i in (0, 1):  # readings 1 and 2 continue their traces; reading 3 starts
        rest[i] = replace(rest[i], options=run.RunOptions(resume=rest[i].options.trace))
    assert [o.answer for o in run.ask_runs(rest, 2)] == whole[1:]


class UnloadableBackend(EchoBackend):
    """The stand-in, as a model whose weights fail to load."""

    def prepare(self, context_tokens: int, sequences: int = 1, progress=None) -> None:
        raise UserError("llama.cpp could not load the weights.")


def test_a_failure_with_no_reading_in_flight_is_raised_not_swallowed(tmp_path):
    """Nothing to stop and nothing to say it on: the failure itself goes to the caller."""
    with pytest.raises(UserError, match="could not load the weights"):
        list(run.ask_runs(runs(engine_of(UnloadableBackend()), tmp_path), 2))

    def interrupted_before_the_first():
        raise KeyboardInterrupt
        yield  # a generator

    with pytest.raises(KeyboardInterrupt):
        list(run.ask_runs(interrupted_before_the_first(), 2))


class SizedBackend(EchoBackend):
    """The stand-in, keeping the context each prepare() loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts = []

    def prepare(self, context_tokens: int, sequences: int = 1, progress=None) -> None:
        super().prepare(context_tokens, sequences)
        self.contexts.append(context_tokens)


def test_a_longer_document_read_after_another_gets_the_larger_context_it_needs(tmp_path):
    """A reader whose calls grow with the document (Spec.grows): one at a time, each
    reading is read in a context that holds it, as `eval` reads its cases one by one."""
    memagent = readers.get("memagent")
    readers.register(
        replace(
            memagent,
            name="growing-test",
            implied=False,
            grows="this reader is shown every step so far",
            extra_tokens=lambda chunk_tokens, steps: 10 * steps,
        )
    )
    settings = replace(SETTINGS, reader="growing-test")
    backend = SizedBackend()
    engine = Engine.for_questions(backend, settings, [QUESTION])

    def lazily():  # each document cut when its run is taken, as a batch's are
        for i, text in enumerate(TEXTS[:2]):  # 1 chunk, then 4
            document = Document(text=text, path=f"/b{i}.txt", format="text", sha256=f"{i:064x}")
            how = run.RunOptions(trace=tmp_path / f"b{i}.jsonl", reuse=False)
            yield run.Run(open_session(document, engine), QUESTION, how)

    outcomes = list(run.ask_runs(lazily(), 1))
    assert [type(o) for o in outcomes] == [run.Result, run.Result]
    assert backend.contexts == [engine.context - 30, engine.context]  # 10 tokens a step more
