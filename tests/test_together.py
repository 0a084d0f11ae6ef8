"""Several questions read together (`read_together`, `support.asking.ask_together`, the batch's
groups) with a deterministic stand-in backend whose reply depends only on the message: so
reading together must give what reading alone gives, trace for trace. The same is checked
with the real model in test_together_model.py."""

from __future__ import annotations

import json

import pytest
from support import asking
from support.scripted import EchoBackend

from memagent_cli import trace
from memagent_cli.backend import Sampling
from memagent_cli.chunking import make_chunks
from memagent_cli.documents import Document
from memagent_cli.documents.inputs import read_document
from memagent_cli.errors import BudgetError
from memagent_cli.reader import Settings, read
from memagent_cli.run import ask as run
from memagent_cli.run import batch
from memagent_cli.run.engine import Engine
from memagent_cli.run.session import open_session
from memagent_cli.scheduler import Job, read_together

QUESTIONS = ["Who keeps the tower?", "What fell?", "When does the guard sleep?"]
SETTINGS = Settings(40, 16)


def chunks_of(text: str):
    return make_chunks(list(text.encode()), SETTINGS.chunk_tokens, bytes)


TEXT = "The guard sleeps at noon. The keeper left the village. The tower fell at dawn. " * 3


def test_questions_read_together_equal_questions_read_alone():
    chunks = chunks_of(TEXT)
    alone = [read(EchoBackend(), q, chunks, SETTINGS) for q in QUESTIONS]
    backend = EchoBackend()
    together = read_together(backend, [Job(q) for q in QUESTIONS], chunks, SETTINGS)
    assert [(a.answer, [s.memory for s in a.steps]) for a in together] == [
        (a.answer, [s.memory for s in a.steps]) for a in alone
    ]
    # One round per chunk and one for the answers, every question in each, on its own slot.
    assert backend.rounds == [[0, 1, 2]] * (len(chunks) + 1)


def test_questions_resumed_at_different_steps_finish_in_their_own_rounds():
    chunks = chunks_of(TEXT)
    alone = [read(EchoBackend(), q, chunks, SETTINGS) for q in QUESTIONS]
    readings = [Job(QUESTIONS[0], done=alone[0].steps[:3]), Job(QUESTIONS[1])]
    backend = EchoBackend()
    together = read_together(backend, readings, chunks, SETTINGS)
    assert [a.answer for a in together] == [alone[0].answer, alone[1].answer]
    # The first question answers three rounds before the second.
    rounds = len(chunks) + 1
    assert backend.rounds == [[0, 1]] * (rounds - 3) + [[1]] * 3


def session_of(backend, text: str = TEXT, path: str = "/books/tower.txt"):
    document = Document(text=text, path=path, format="text", sha256="ab" * 32)
    engine = Engine(backend, SETTINGS, 4096)
    return open_session(document, engine)


def options(tmp_path, count: int = len(QUESTIONS), **more) -> list[run.RunOptions]:
    return [
        run.RunOptions(trace=tmp_path / f"q{i + 1}.jsonl", reuse=False, **more)
        for i in range(count)
    ]


def records(path) -> list[dict]:
    """A trace's step and final records without the timings, which differ between runs."""
    timing = {"seconds", "prompt_seconds", "created"}
    lines = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    return [{k: v for k, v in line.items() if k not in timing} for line in lines]


def test_each_question_read_together_writes_the_trace_it_writes_alone(tmp_path):
    alone_dir, together_dir = tmp_path / "alone", tmp_path / "together"
    alone_dir.mkdir(), together_dir.mkdir()
    for i, question in enumerate(QUESTIONS):
        asking.ask(session_of(EchoBackend()), question, options(alone_dir)[i])
    backend = EchoBackend()
    results = asking.ask_together(session_of(backend), QUESTIONS, options(together_dir))
    assert backend.sequences == len(QUESTIONS)  # one context with a sequence per question
    for i, result in enumerate(results):
        assert isinstance(result, run.Result)
        name = f"q{i + 1}.jsonl"
        assert records(together_dir / name) == records(alone_dir / name)
        assert trace.read_trace(together_dir / name).finished


def test_an_interrupted_pass_keeps_every_trace_and_resumes_to_the_same_answers(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    whole = asking.ask_together(session_of(EchoBackend()), QUESTIONS, options(first))
    # Ctrl-C in the middle of the fourth round: three steps of every question are kept.
    stopped = asking.ask_together(
        session_of(EchoBackend(calls_left=3 * len(QUESTIONS) + 1)), QUESTIONS, options(second)
    )
    assert all(isinstance(s, run.Stopped) and s.done == 3 for s in stopped)
    for i in range(len(QUESTIONS)):
        status = trace.read_trace(second / f"q{i + 1}.jsonl")
        assert len(status.steps) == 3 and status.interruption is not None
    resumed_options = [
        run.RunOptions(resume=second / f"q{i + 1}.jsonl", reuse=False)
        for i in range(len(QUESTIONS))
    ]
    resumed = asking.ask_together(session_of(EchoBackend()), QUESTIONS, resumed_options)
    assert [r.answer for r in resumed] == [r.answer for r in whole]
    for i in range(len(QUESTIONS)):
        name = f"q{i + 1}.jsonl"
        kept = [r for r in records(second / name) if r.get("type") in ("step", "final")]
        assert kept == [r for r in records(first / name) if r.get("type") in ("step", "final")]


def test_a_finished_question_is_answered_from_its_trace_and_only_the_rest_are_read(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    backend = EchoBackend()
    session = session_of(backend)
    session.engine.settings = Settings(40, 16, sampling=Sampling(temperature=0))
    folder = trace.default_dir()
    first = asking.ask(session, QUESTIONS[0], run.RunOptions(trace=folder / "a.jsonl"))
    calls = len(backend.messages)
    cached = run.RunOptions()  # no trace path: the cache finds a.jsonl
    fresh = run.RunOptions(trace=folder / "b.jsonl")
    results = asking.ask_together(session, QUESTIONS[:2], [cached, fresh])
    assert results[0].cached and results[0].answer == first.answer
    assert not results[1].cached
    assert len(backend.messages) - calls == len(session.chunks) + 1  # only the second read


def test_a_pass_holds_the_questions_that_fit_and_says_which_number_fits():
    backend = EchoBackend()
    backend.fits = 2
    engine = Engine(backend, SETTINGS, 4096)
    assert engine.together(5, None) == 2  # all that fit
    assert engine.together(1, None) == 1
    assert engine.together(5, 2) == 2
    assert engine.together(2, 500) == 2  # a cap above the questions asked is no request
    with pytest.raises(BudgetError, match="^3 questions read at once .* use --parallel 2"):
        engine.together(5, 3)


def test_a_batch_reads_the_questions_of_a_document_in_groups_in_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = tmp_path / "tower.txt"
    path.write_text(TEXT)
    backend = EchoBackend()
    backend.fits = 2
    engine = Engine(backend, SETTINGS, 4096)
    answers: list[str | None] = []
    how = batch.Options(run=run.RunOptions(reuse=False), parallel=None)
    asked = batch.Batch([str(path)], QUESTIONS, lambda: engine, how)
    for outcome in asked:
        assert isinstance(outcome, run.Result)
        answers.append(outcome.answer)
    assert asked.exit_code == 0
    alone = [
        read(
            EchoBackend(),
            q,
            open_session(read_document(str(path), password=None), engine).chunks,
            SETTINGS,
        )
        for q in QUESTIONS
    ]
    assert answers == [a.answer for a in alone]
    sizes = [len(r) for r in backend.rounds]
    assert max(sizes) == 2 and sizes[-1] == 1  # two questions, then the third alone


def test_a_question_answered_before_the_others_stop_keeps_its_answer(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    # The first question gets three steps ahead; Ctrl-C comes while the second still reads.
    asking.ask_together(session_of(EchoBackend(calls_left=3)), QUESTIONS[:1], options(first, 1))
    ahead = run.RunOptions(resume=first / "q1.jsonl", reuse=False)
    behind = run.RunOptions(trace=second / "q2.jsonl", reuse=False)
    rounds = len(session_of(EchoBackend()).chunks) + 1 - 3  # until the first has answered
    backend = EchoBackend(calls_left=2 * rounds + 1)  # and one more step of the second
    answered, stopped = asking.ask_together(session_of(backend), QUESTIONS[:2], [ahead, behind])
    assert isinstance(answered, run.Result) and answered.answer
    assert isinstance(stopped, run.Stopped) and stopped.done == rounds + 1
    kept = trace.read_trace(first / "q1.jsonl")
    assert kept.finished and kept.interruption is None
    assert trace.read_trace(second / "q2.jsonl").interruption is not None
