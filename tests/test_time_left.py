"""A reading's time left (run/time_left.py), refined at every step from the steps so far:
made-up steps here; test_ask_model.py follows a real reading's."""

from __future__ import annotations

import pytest

from memagent_cli.backend import Generation
from memagent_cli.chunking import make_chunks
from memagent_cli.progress import Expected
from memagent_cli.reader import Answer, Answering, Finished, Step, StepFinished, StepStarted
from memagent_cli.run.time_left import TimeLeft, duration

CHUNK = 5000
TOTAL = 4 * CHUNK + 2000  # four whole chunks and a short one
CHUNKS = make_chunks(list(range(TOTAL)), CHUNK, lambda tokens: b"x" * len(tokens))


def step(index: int, memory: int = 500, overhead: int = 150, seconds: float = 1.0) -> Step:
    """A step whose prompt is its chunk, a template and the memory before it, read at 150
    tokens a second, and whose reply of `memory` tokens decodes at 25 a second."""
    chunk = CHUNKS[index]
    prompt = chunk.token_end - chunk.token_start + overhead + memory
    gen = Generation(
        "m", prompt, memory, seconds * prompt / 150, seconds * (prompt / 150 + memory / 25), "stop"
    )
    return Step(chunk, "m", gen)


def read(left: TimeLeft, steps: list[Step]) -> list[float]:
    """The time left after each step, and after the answering starts and ends."""
    told = []
    for s in steps:
        left.add(StepStarted(s.chunk, len(CHUNKS)))
        left.add(StepFinished(s, len(CHUNKS)))
        told.append(left.seconds())
    left.add(Answering("m"))
    told.append(left.seconds())
    left.add(Finished(Answer("q", None, "r", steps, steps[-1].generation)))
    told.append(left.seconds())
    return told


def test_the_time_left_falls_step_by_step_to_nothing():
    told = read(TimeLeft(TOTAL), [step(i) for i in range(len(CHUNKS))])
    assert told == sorted(told, reverse=True) and told[-1] == 0.0
    # After the first step: three whole chunks and the short one at its pace, then the answer.
    per_step = 5650 / 150 + 500 / 25
    short = (2000 + 650) / 150 + 500 / 25
    answer = 650 / 150 + 500 / 25
    assert told[0] == pytest.approx(3 * per_step + short + answer)
    assert told[-2] == pytest.approx(answer)  # answering: its call alone


def test_it_follows_the_speed_and_the_memory_the_steps_measured():
    """A slower machine, or a longer memory (a longer prompt and reply in every step left),
    show in the next figure."""
    quick = TimeLeft(TOTAL)
    slow = TimeLeft(TOTAL)
    long_memory = TimeLeft(TOTAL)
    for left, s in ((quick, step(0)), (slow, step(0, seconds=2.0)), (long_memory, step(0, 1000))):
        left.add(StepFinished(s, len(CHUNKS)))
    assert slow.seconds() == pytest.approx(2 * quick.seconds())
    assert long_memory.seconds() > 1.3 * quick.seconds()


def test_before_any_step_it_is_what_was_expected_if_anything():
    assert TimeLeft(TOTAL).seconds() is None
    left = TimeLeft(TOTAL, Expected(seconds=300.0, answer=12.0))
    assert left.seconds() == 300.0 and not left.measured
    left.add(StepFinished(step(0), len(CHUNKS)))  # then the reading's own speeds
    assert left.measured and left.seconds() != pytest.approx(300.0 - step(0).generation.seconds)
    left.add(Answering("m"))
    assert left.seconds() == 12.0  # the answer's call as expected


def test_durations_read_as_a_person_says_them():
    assert [duration(s) for s in (0.4, 45, 185, 7800)] == ["0s", "45s", "3m05s", "2h10m"]


class Notes:
    """A reporter's notes, kept."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, line: str) -> None:
        self.lines.append(line)


def test_a_long_reading_with_nothing_expected_says_what_is_left_after_its_first_step():
    """No speed kept for the model (a server, or no inspect yet): the first step's own
    speeds say the rest, once, and over an hour the faster routes; an evaluation's case says
    nothing (the evaluation tells its own time left)."""
    from types import SimpleNamespace

    from memagent_cli.progress import ReadingId
    from memagent_cli.reader import Settings
    from memagent_cli.run import expect

    session = SimpleNamespace(
        document=SimpleNamespace(path="/b/book.pdf"),
        engine=SimpleNamespace(backend=SimpleNamespace(local=False), settings=Settings()),
    )
    chunks = make_chunks(list(range(100 * CHUNK)), CHUNK, lambda tokens: b"x" * len(tokens))
    gen = Generation("m", 5650, 500, 40.0, 60.0, "stop")  # a minute a step

    def read(name: str) -> tuple[list[str], list[object]]:
        notes, shown = Notes(), []
        reading = ReadingId("/b/book.pdf", "m", "q", (0, 0), 100 * CHUNK, lambda a, b: "", name)
        listener = expect.noting(reading, session, shown.append, notes)  # type: ignore[arg-type]
        for chunk in chunks[:3]:
            listener(StepFinished(Step(chunk, "m", gen), len(chunks)))
        return notes.lines, shown

    (line,), shown = read("")
    assert len(shown) == 3  # every event still shown
    assert line.startswith("reading book.pdf: about 1h") and "after step 1 of 100" in line
    assert "more than an hour; faster: a smaller model" in line
    assert read("eval_50 c1")[0] == []
