"""The MemAgent loop: read a document chunk by chunk into a memory, then answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memagent_cli import protocol
from memagent_cli.backend import Backend, Call, Generation, Sampling
from memagent_cli.chunking import Chunk
from memagent_cli.errors import BudgetError
from memagent_cli.provenance import Provenance, trace_answer


@dataclass(frozen=True)
class Settings:
    """What shapes one reading: window sizes and sampling."""

    chunk_tokens: int = protocol.DEFAULT_CHUNK_TOKENS
    memory_tokens: int = protocol.DEFAULT_MEMORY_TOKENS
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(frozen=True)
class Step:
    """One memory update: the chunk read and the memory it left behind."""

    chunk: Chunk
    memory: str
    generation: Generation


@dataclass(frozen=True)
class Answer:
    """The outcome of reading a document for one question."""

    question: str
    answer: str | None  # content of the last \boxed{}; None when the reply has none
    reply: str  # the raw final reply
    steps: list[Step]
    final: Generation


@dataclass(frozen=True)
class StepStarted:
    chunk: Chunk
    total: int


@dataclass(frozen=True)
class StepFinished:
    step: Step
    total: int


@dataclass(frozen=True)
class Answering:
    memory: str


@dataclass(frozen=True)
class Finished:
    answer: Answer


Event = StepStarted | StepFinished | Answering | Finished
Listener = Callable[[Event], None]


def read(
    backend: Backend,
    question: str,
    chunks: Sequence[Chunk],
    settings: Settings,
    listener: Listener = lambda event: None,
    done: Sequence[Step] = (),
) -> Answer:
    """Fold every chunk into the memory (overwriting it), then answer from the last memory.

    `done` are steps already finished by an earlier, interrupted run: reading goes on after
    them, from the memory they left.
    """
    return read_together(backend, [Reading(question, listener, done)], chunks, settings)[0]


@dataclass
class Reading:
    """One question read along with others: its listener, the steps it has done, and the
    chunks of its document (None: the chunks every reading of `read_together` shares)."""

    question: str
    listener: Listener = lambda event: None
    done: Sequence[Step] = ()
    chunks: Sequence[Chunk] | None = None


def read_together(
    backend: Backend, readings: Sequence[Reading], chunks: Sequence[Chunk], settings: Settings
) -> list[Answer]:
    """Read the document for several questions at once, each in its own sequence (question
    i keeps sequence i, so each finds its own earlier prompt in the cache): Slots. Each
    memory and answer is what reading alone gives."""
    slots = Slots(backend, settings, len(readings))
    for reading in readings:
        slots.add(Reading(reading.question, reading.listener, reading.done, chunks))
    answers: dict[int, Answer] = {}
    while slots.busy:
        answers.update((slot, answer) for slot, _, answer in slots.advance())
    return [answers[slot] for slot in range(len(readings))]


@dataclass
class _Place:
    """A reading in a slot: its steps so far, whether its slot still holds another's, and
    whether it has made its first call (from then on each reply brings the next call)."""

    reading: Reading
    question: str
    chunks: Sequence[Chunk]
    steps: list[Step]
    fresh: bool = True
    asked: bool = False


class Slots:
    """Continuous batching: up to `count` readings at once, each in its own sequence (its
    slot), whatever their documents and lengths. Every reading in a slot has one call in
    flight, and the backend works on all of them together; as soon as a reply is complete,
    its reading makes its next call. A reading answered leaves its slot, which the next
    reading added takes, its sequence's cache cleared first (as serving engines do), so
    every reading sees what it would see alone."""

    def __init__(self, backend: Backend, settings: Settings, count: int) -> None:
        self.backend, self.settings = backend, settings
        self._places: list[_Place | None] = [None] * count
        self._next: list[Call] = []  # calls made, not yet sent to the backend

    @property
    def free(self) -> int:
        return self._places.count(None)

    @property
    def busy(self) -> int:
        return len(self._places) - self.free

    def readings(self) -> list[Reading]:
        """The readings in a slot, by slot."""
        return [place.reading for place in self._places if place is not None]

    def add(self, reading: Reading) -> int:
        """Put `reading` in the lowest free slot (its sequence); returns the slot."""
        slot = self._places.index(None)
        chunks = reading.chunks if reading.chunks is not None else ()
        question = reading.question.strip()
        self._places[slot] = _Place(reading, question, chunks, list(reading.done))
        return slot

    def advance(self) -> list[tuple[int, Reading, Answer]]:
        """Read until at least one reading is answered: readings added since the last
        advance make their first call, and each reply completed is followed by its
        reading's next call at once. Returns the readings answered (slot, reading, answer),
        whose slots are free now."""
        answered: list[tuple[int, Reading, Answer]] = []
        calls, self._next = self._next, []
        try:
            calls += [self._call(s, p) for s, p in enumerate(self._places) if p and not p.asked]
            while self.busy and not answered:
                replies = self.backend.next_replies(calls, sampling=self.settings.sampling)
                if not replies:
                    raise RuntimeError("readings are waiting and no call is in flight")
                calls = []
                for slot, generation in replies:
                    place = self._places[slot]
                    assert place is not None
                    answer = self._take(place, generation)
                    if answer is None:
                        calls.append(self._call(slot, place))
                    else:
                        self._places[slot] = None
                        answered.append((slot, place.reading, answer))
        except BaseException:
            self.backend.cancel()
            for place in self._places:  # each makes its call again if reading goes on
                if place is not None:
                    place.asked = False
            raise
        self._next = calls  # made along with an answer: they go first next time
        return answered

    def _call(self, slot: int, place: _Place) -> Call:
        """The next call of the reading in `slot`: its next update, or its answer."""
        steps, chunks = place.steps, place.chunks
        memory = steps[-1].memory if steps else protocol.INITIAL_MEMORY
        fresh, place.fresh, place.asked = place.fresh, False, True
        if len(steps) < len(chunks):
            place.reading.listener(StepStarted(chunks[len(steps)], len(chunks)))
            message = protocol.render_update(place.question, memory, chunks[len(steps)].text)
            return Call(message, self.settings.memory_tokens, slot, fresh)
        place.reading.listener(Answering(memory))
        message = protocol.render_final(place.question, memory)
        return Call(message, protocol.FINAL_MAX_TOKENS, slot, fresh)

    def _take(self, place: _Place, generation: Generation) -> Answer | None:
        """Record the reply to a reading's call: a step, or its answer (None for a step)."""
        steps, chunks = place.steps, place.chunks
        if len(steps) < len(chunks):
            memory = protocol.strip_think(generation.text)
            steps.append(Step(chunks[len(steps)], memory, generation))
            place.reading.listener(StepFinished(steps[-1], len(chunks)))
            return None
        boxed = protocol.extract_boxed(generation.text)
        answer = Answer(place.question, boxed, generation.text, steps, generation)
        place.reading.listener(Finished(answer))
        return answer


def evidence(answer: Answer) -> Provenance | None:
    """The steps whose updates brought the answer's words into the memory for good
    (provenance.py has the rule); None when there is no answer to trace."""
    said = answer.answer if answer.answer is not None else answer.reply
    return trace_answer(said, answer.question, [step.memory for step in answer.steps])


# Detokenized windows can re-tokenize a little longer inside the prompt.
_RETOKENIZE_SLACK = 32


def context_needed(backend: Backend, questions: Sequence[str], settings: Settings) -> int:
    """Context tokens one call needs; fails with a sentence when the model cannot hold it."""
    overhead = backend.chat_overhead()
    update_template = len(backend.tokenize(protocol.render_update("", "", "")))
    final_template = len(backend.tokenize(protocol.render_final("", "")))
    question_tokens = max(len(backend.tokenize(q.strip())) for q in questions)
    memory = settings.memory_tokens
    update = overhead + update_template + question_tokens + memory + settings.chunk_tokens + memory
    final = overhead + final_template + question_tokens + memory + protocol.FINAL_MAX_TOKENS
    needed = max(update, final) + _RETOKENIZE_SLACK
    limit = backend.context_limit
    if needed > limit:
        if question_tokens + overhead + update_template > limit // 2:
            raise BudgetError(
                f"The question is too long: it takes {question_tokens} tokens and one step "
                f"would need {needed} tokens, more than the model's context of {limit}; "
                "shorten the question."
            )
        fixed = overhead + update_template + question_tokens
        raise BudgetError(
            f"One step needs {needed} tokens (chunk {settings.chunk_tokens}, memory {memory}, "
            f"reply {memory}, question and template {fixed}) but the model's context holds "
            f"{limit}; lower --chunk-tokens or --memory-tokens."
        )
    return needed
