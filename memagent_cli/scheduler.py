"""Continuous batching: many readings at once in one model context, each in its own
sequence (its slot), whatever their documents and lengths.

reader.py's `read` runs one reading one call at a time; this runs many together and gives
each the same answer and memories (tests/test_together.py and tests/test_continuous.py hold
it to that). Every reading in a slot has one call in flight, and the backend works on all
of them together; as soon as a reply is complete, its reading makes its next call. The
prompts a reading asks at once (reader.Prompts: a PI-Mem pass) go out in its own slot and
in the slots no reading holds meanwhile, as many at once as are idle. A reading answered
leaves its slot, which the next reading added takes, its sequence's cache
cleared first (as serving engines do), so every reading sees what it would see alone.

A reading stopped (Ctrl-C, a failure) may have had replies that none of its steps holds yet
(`Scheduler.kept`): to prompts it asked at once, or to those of a step made of several
calls (InfMem's planner, then its update); its trace keeps them, and a resumed run is given
them back (`Job.answered`), each for the prompt it answered, instead of a call.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from memagent_cli.backend import Backend, Call, Generation
from memagent_cli.chunking import Chunk
from memagent_cli.reader import (
    Answer,
    Event,
    Listener,
    Prompt,
    Prompts,
    Reader,
    Reading,
    Replied,
    Settings,
    Step,
    StepFinished,
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
    # Replies that run had that none of its steps held yet (Scheduler.kept), by
    # prompt_sha256: each answers its prompt once instead of a call.
    answered: Sequence[tuple[str, Generation]] = ()


def prompt_sha256(prompt: Prompt) -> str:
    """What a prompt asks, as a reply kept for it names it: its text (or the whole prompt a
    reader wrote) and its reply's limit."""
    asked = [prompt.message, prompt.max_tokens, prompt.raw]
    return hashlib.sha256(json.dumps(asked).encode()).hexdigest()


@dataclass
class _Slot:
    """A job in its slot: its reading, the prompts it asked for last (one, or several at
    once: `at_once`), the replies to them come so far, and those not with the backend
    (to send; again after a failure)."""

    job: Job
    reading: Reading
    started: bool = False
    asked: tuple[Prompt, ...] = ()
    at_once: Prompts | None = None  # `asked`, where they were asked at once
    replies: dict[int, Generation] = field(default_factory=dict)
    unsent: list[int] = field(default_factory=list)  # places in `asked`, in order
    # Replies to prompts asked at once, given to the reading, that no finished step holds
    # yet (a PI-Mem pass's last chunk, whose step waits on the merge).
    given: list[tuple[Prompt, Generation]] = field(default_factory=list)
    # Replies to prompts asked one at a time since the last step finished (InfMem's planner,
    # then its update): the step to come is made of them.
    singles: list[tuple[Prompt, Generation]] = field(default_factory=list)
    replay: list[tuple[str, Generation]] = field(default_factory=list)  # Job.answered
    listener: Listener = lambda event: None  # the job's, which sees its steps go by

    def replied(self) -> None:
        """Tell the reading's listener how many of the prompts it asked at once have their
        replies (reader.Replied)."""
        asked = self.at_once
        if asked is not None:
            came, before = len(self.replies), asked.before
            answered, of = before + came, before + len(asked)
            self.listener(Replied(answered, of, asked.what, asked.unit, before))

    def kept_for(self, prompt: Prompt) -> Generation | None:
        """The reply kept for `prompt` (Job.answered), taken; None without one."""
        if not self.replay:
            return None
        key = prompt_sha256(prompt)
        for index, (sha256, reply) in enumerate(self.replay):
            if sha256 == key:
                del self.replay[index]
                return reply
        return None


class Scheduler:
    """Up to `slots` jobs read at once by `backend`, each in its own sequence. The prompts a
    reading asks at once (reader.Prompts) go in its own sequence one after another, and
    together in the sequences no reading holds meanwhile."""

    def __init__(self, backend: Backend, settings: Settings, slots: int) -> None:
        self.backend, self.settings = backend, settings
        self._slots: list[_Slot | None] = [None] * slots
        self._calls: dict[int, tuple[int, int]] = {}  # sequence -> (slot, place) in flight
        # The reading whose prompt each sequence's cache holds: another's is cleared first.
        self._holders: list[_Slot | None] = [None] * slots

    def _idle(self, number: int) -> bool:
        return self._slots[number] is None and number not in self._calls

    @property
    def free(self) -> int:
        return sum(map(self._idle, range(len(self._slots))))

    @property
    def busy(self) -> int:
        return len(self._slots) - self._slots.count(None)

    def add(self, job: Job) -> int:
        """Put `job` in the lowest free slot (its sequence); returns the slot. Its reading
        starts (makes its first call) at the next `advance`."""
        number = next(n for n in range(len(self._slots)) if self._idle(n))
        question = job.question.strip()
        slot = _Slot(job, iter(()), replay=list(job.answered))

        def listener(event: Event) -> None:
            if isinstance(event, StepFinished):  # its replies are in the step now
                slot.given = [(p, g) for p, g in slot.given if g is not event.step.generation]
                slot.singles = []
            job.listener(event)

        slot.listener = listener
        slot.reading = job.reader(question, job.chunks, self.settings, listener, job.done)
        self._slots[number] = slot
        return number

    def kept(self, job: Job) -> list[tuple[Prompt, Generation]]:
        """The replies `job`'s reading had that none of its finished steps holds: to
        prompts asked at once, and to those asked one at a time since its last step. What
        a stop would lose, and a resumed run need not ask again (Job.answered)."""
        for slot in self._slots:
            if slot is not None and slot.job is job:
                came = [(slot.asked[i], reply) for i, reply in sorted(slot.replies.items())]
                at_once = came if slot.at_once is not None else []
                return [*slot.singles, *slot.given, *at_once]
        return []

    def advance(self) -> list[tuple[int, Job, Answer]]:
        """Read until at least one job is answered: jobs added since the last advance make
        their first call, and each reply completed is followed by its reading's next call
        at once. Returns the jobs answered (slot, job, answer), whose slots are free now."""
        answered: list[tuple[int, Job, Answer]] = []
        try:
            for number, slot in enumerate(self._slots):
                if slot is not None and not slot.started:  # a reading starts
                    self._go_on(number, None, answered)
            while self.busy and not answered:
                calls = self._calls_to_send()
                replies = self.backend.next_replies(calls, sampling=self.settings.sampling)
                if not replies:
                    raise RuntimeError("readings are waiting and no call is in flight")
                for sequence, reply in replies:
                    number, place = self._calls.pop(sequence)
                    slot = self._slots[number]
                    assert slot is not None
                    slot.replies[place] = reply
                    slot.replied()
                    if len(slot.replies) == len(slot.asked):
                        got = tuple(slot.replies[i] for i in range(len(slot.asked)))
                        self._go_on(number, got if slot.at_once is not None else got[0], answered)
        except BaseException:
            self.backend.cancel()
            for number, place in self._calls.values():  # sent again if reading goes on
                slot = self._slots[number]
                if slot is not None:
                    slot.unsent = sorted([*slot.unsent, place])
            self._calls.clear()
            raise
        return answered

    def _go_on(
        self,
        number: int,
        reply: Generation | tuple[Generation, ...] | None,
        answered: list[tuple[int, Job, Answer]],
    ) -> None:
        """Give the reading in slot `number` its reply (None: start it): its next prompts
        wait to be sent, or its answer frees the slot. A prompt with a reply kept for it
        (Job.answered) is answered by that at once."""
        slot = self._slots[number]
        assert slot is not None
        if slot.at_once is not None and reply is not None:
            slot.given = list(zip(slot.asked, reply, strict=True))
        elif reply is not None:  # one prompt's, asked alone
            assert not isinstance(reply, tuple)
            slot.singles.append((slot.asked[0], reply))
        try:
            asked = next(slot.reading) if reply is None else slot.reading.send(reply)
            while True:
                several = isinstance(asked, Prompts)
                prompts = tuple(asked) if isinstance(asked, Prompts) else (asked,)
                kept = {place: r for place, p in enumerate(prompts) if (r := slot.kept_for(p))}
                if len(kept) < len(prompts):
                    break
                got = tuple(kept[place] for place in range(len(prompts)))
                if several:
                    slot.given = list(zip(prompts, got, strict=True))
                else:
                    slot.singles.append((prompts[0], got[0]))
                asked = slot.reading.send(got if several else got[0])
        except StopIteration as end:
            self._slots[number] = None
            answered.append((number, slot.job, end.value))
            return
        slot.started, slot.asked = True, prompts
        slot.at_once = asked if isinstance(asked, Prompts) else None
        if several:  # what an earlier batch gave is in its steps, or never will be
            slot.given = []
        slot.replies = kept
        slot.unsent = [place for place in range(len(prompts)) if place not in kept]
        slot.replied()

    def _calls_to_send(self) -> list[Call]:
        """Each reading's next prompt in its own sequence when that is idle; then the
        prompts left, in the sequences no reading holds, one that held the same reading's
        last prompt first (its prefix may be reused)."""
        calls = []
        for number, slot in enumerate(self._slots):
            if slot is not None and slot.unsent and number not in self._calls:
                calls.append(self._send(number, number, slot))
        spare = [n for n in range(len(self._slots)) if self._idle(n)]
        for number, slot in enumerate(self._slots):
            while slot is not None and slot.unsent and spare:
                spare.sort(key=lambda n, slot=slot: self._holders[n] is not slot)
                calls.append(self._send(spare.pop(0), number, slot))
        return calls

    def _send(self, sequence: int, number: int, slot: _Slot) -> Call:
        """The call of `slot`'s next unsent prompt in `sequence`, cleared first where it
        held another reading's prompt."""
        place = slot.unsent.pop(0)
        prompt = slot.asked[place]
        fresh = self._holders[sequence] is not slot
        self._holders[sequence] = slot
        self._calls[sequence] = (number, place)
        return Call(prompt.message, prompt.max_tokens, sequence, fresh, prompt.raw)


def read_together(
    backend: Backend,
    jobs: Sequence[Job],
    chunks: Sequence[Chunk],
    settings: Settings,
    slots: int = 0,
) -> list[Answer]:
    """Read one document's `chunks` for several questions at once, each in its own sequence
    (question i keeps sequence i, so each finds its own earlier prompt in the cache), in
    `slots` sequences (at least one a question; the others for prompts asked at once).
    Each memory and answer is what reading alone gives."""
    scheduler = Scheduler(backend, settings, max(slots, len(jobs)))
    for job in jobs:
        scheduler.add(Job(job.question, chunks, job.listener, job.done, job.reader))
    answers: dict[int, Answer] = {}
    while scheduler.busy:
        answers.update((number, answer) for number, _, answer in scheduler.advance())
    return [answers[number] for number in range(len(jobs))]
