"""The reading loop with a scripted backend: overwrite, events, answer, context budget."""

from __future__ import annotations

import pytest
from support.scripted import ScriptedBackend

from memagent_cli import protocol
from memagent_cli.chunking import make_chunks
from memagent_cli.errors import BudgetError
from memagent_cli.reader import (
    Answering,
    Finished,
    Settings,
    StepFinished,
    StepStarted,
    context_needed,
    read,
)


def test_memory_is_overwritten_and_the_answer_comes_from_the_last_memory():
    chunks = make_chunks(list(b"first part|second part"), 11, bytes)
    backend = ScriptedBackend(["memory one", "<think>hmm</think>memory two", "It is \\boxed{42}."])
    settings = Settings(chunk_tokens=11, memory_tokens=64)
    answer = read(backend, "  What?  ", chunks, settings)

    sent = [m for m, _ in backend.messages]
    assert sent[0] == protocol.render_update("What?", "No previous memory", "first part|")
    assert sent[1] == protocol.render_update("What?", "memory one", "second part")
    assert sent[2] == protocol.render_final("What?", "memory two")
    assert [limit for _, limit in backend.messages] == [64, 64, protocol.FINAL_MAX_TOKENS]
    assert [s.memory for s in answer.steps] == ["memory one", "memory two"]
    assert answer.answer == "42"
    assert answer.reply == "It is \\boxed{42}."


def test_no_box_leaves_the_answer_empty_and_keeps_the_reply():
    chunks = make_chunks(list(b"text"), 10, bytes)
    answer = read(ScriptedBackend(["m", "just words"]), "q", chunks, Settings(10, 8))
    assert answer.answer is None
    assert answer.reply == "just words"


def test_events_come_in_order():
    chunks = make_chunks(list(b"abcdef"), 3, bytes)
    events = []
    read(ScriptedBackend(["m1", "m2", "\\boxed{x}"]), "q", chunks, Settings(3, 8), events.append)
    kinds = [type(e) for e in events]
    assert kinds == [StepStarted, StepFinished, StepStarted, StepFinished, Answering, Finished]
    assert events[1].total == 2 and events[1].step.memory == "m1"
    assert events[4].memory == "m2"


def test_context_is_sized_from_the_budget():
    backend = ScriptedBackend([], context_limit=100_000)
    settings = Settings(chunk_tokens=5000, memory_tokens=1024)
    needed = context_needed(backend, ["abc", "a longer question"], settings)
    template = len(protocol.render_update("", "", "").encode())
    # overhead + template + longest question + memory + chunk + reply, plus slack
    expected = 10 + template + len("a longer question") + 1024 + 5000 + 1024
    assert expected < needed <= expected + 64


def test_a_step_that_does_not_fit_names_what_to_lower():
    backend = ScriptedBackend([], context_limit=4096)
    with pytest.raises(BudgetError, match="lower --chunk-tokens or --memory-tokens"):
        context_needed(backend, ["q"], Settings(chunk_tokens=5000, memory_tokens=1024))


def test_a_question_too_long_says_so():
    backend = ScriptedBackend([], context_limit=4096)
    with pytest.raises(BudgetError, match="question is too long"):
        context_needed(backend, ["why " * 1000], Settings(chunk_tokens=100, memory_tokens=100))
