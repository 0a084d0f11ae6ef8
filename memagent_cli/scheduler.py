"""Continuous batching: many readings at once in one model context, each in its own
sequence (its slot), whatever their documents and lengths.

reader.py's `read` runs one reading one call at a time; this runs many together and gives
each the same answer and memories (tests/test_together.py and tests/test_continuous.py hold
it to that). Every reading in a slot has one call in flight, and the backend works on all
of them together; as soon as a reply is complete, its reading makes its next call. A
reading answered leaves its slot, which the next reading added takes, its sequence's cache
cleared first (as serving engines do), so every reading sees what it would see alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memagent_cli.backend import Backend, Call, Generation
from memagent_cli.chunking import Chunk
from memagent_cli.reader import (
    Answer,
    Listener,
    Prompt,
    Reader,
    Reading,
    Settings,
    Step,
    memagent,
)


@dataclass
class Job:
    """One question to read over one document's chunks: what the scheduler is given."""

    question: str
    chunks: Sequence[Chunk] = ()
    listener: Listener = lambda event: None
    done: Sequence[Step] = ()  # steps an earlier, interrupted run finished
    reader: Reader = memagent


@dataclass
class _Slot:
    """A job in its slot: its reading, the prompt it waits on, and whether that prompt is
    with the backend (False: to send, again after a failure) or the slot's first (fresh)."""

    job: Job
    reading: Reading
    prompt: Prompt | None = None  # None: the reading has not started
    sent: bool = False
    fresh: bool = True


class Scheduler:
    """Up to `slots` jobs read at once by `backend`, each in its own sequence."""

    def __init__(self, backend: Backend, settings: Settings, slots: int) -> None:
        self.backend, self.settings = backend, settings
        self._slots: list[_Slot | None] = [None] * slots
        self._next: list[int] = []  # slots whose next prompt came with an answer: sent first

    @property
    def free(self) -> int:
        return self._slots.count(None)

    @property
    def busy(self) -> int:
        return len(self._slots) - self.free

    def add(self, job: Job) -> int:
        """Put `job` in the lowest free slot (its sequence); returns the slot. Its reading
        starts (makes its first call) at the next `advance`."""
        number = self._slots.index(None)
        question = job.question.strip()
        reading = job.reader(question, job.chunks, self.settings, job.listener, job.done)
        self._slots[number] = _Slot(job, reading)
        return number

    def advance(self) -> list[tuple[int, Job, Answer]]:
        """Read until at least one job is answered: jobs added since the last advance make
        their first call, and each reply completed is followed by its reading's next call
        at once. Returns the jobs answered (slot, job, answer), whose slots are free now."""
        answered: list[tuple[int, Job, Answer]] = []
        waiting, self._next = self._next, []
        try:
            for number, slot in enumerate(self._slots):
                if slot is not None and slot.prompt is None:  # a reading starts
                    self._go_on(number, None, waiting, answered)
            waiting += [
                n for n, s in enumerate(self._slots) if s and not s.sent and n not in waiting
            ]
            while self.busy and not answered:
                calls = [self._call(number) for number in waiting]
                replies = self.backend.next_replies(calls, sampling=self.settings.sampling)
                if not replies:
                    raise RuntimeError("readings are waiting and no call is in flight")
                waiting = []
                for number, reply in replies:
                    self._go_on(number, reply, waiting, answered)
        except BaseException:
            self.backend.cancel()
            for slot in self._slots:  # each sends its prompt again if reading goes on
                if slot is not None:
                    slot.sent = False
            raise
        self._next = waiting  # made along with an answer: they go first next time
        return answered

    def _go_on(
        self,
        number: int,
        reply: Generation | None,
        waiting: list[int],
        answered: list[tuple[int, Job, Answer]],
    ) -> None:
        """Give the reading in slot `number` its reply (None: start it): its next prompt
        waits to be sent, or its answer frees the slot."""
        slot = self._slots[number]
        assert slot is not None
        try:
            slot.prompt = next(slot.reading) if reply is None else slot.reading.send(reply)
        except StopIteration as end:
            self._slots[number] = None
            answered.append((number, slot.job, end.value))
            return
        slot.sent = False
        waiting.append(number)

    def _call(self, number: int) -> Call:
        slot = self._slots[number]
        assert slot is not None and slot.prompt is not None
        fresh, slot.fresh, slot.sent = slot.fresh, False, True
        prompt = slot.prompt
        return Call(prompt.message, prompt.max_tokens, number, fresh, prompt.raw)


def read_together(
    backend: Backend, jobs: Sequence[Job], chunks: Sequence[Chunk], settings: Settings
) -> list[Answer]:
    """Read one document's `chunks` for several questions at once, each in its own sequence
    (question i keeps sequence i, so each finds its own earlier prompt in the cache). Each
    memory and answer is what reading alone gives."""
    scheduler = Scheduler(backend, settings, len(jobs))
    for job in jobs:
        scheduler.add(Job(job.question, chunks, job.listener, job.done, job.reader))
    answers: dict[int, Answer] = {}
    while scheduler.busy:
        answers.update((number, answer) for number, _, answer in scheduler.advance())
    return [answers[number] for number in range(len(jobs))]
