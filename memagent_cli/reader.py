"""The MemAgent loop: read a document chunk by chunk into a memory, then answer."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from memagent_cli import protocol
from memagent_cli.backend import Backend, Call, Generation, Raw, Sampling
from memagent_cli.backend import reply as backend_reply
from memagent_cli.chunking import Chunk
from memagent_cli.errors import BudgetError
from memagent_cli.provenance import Provenance, trace_answer


@dataclass(frozen=True)
class Settings:
    """What shapes one reading: window sizes and sampling."""

    chunk_tokens: int = protocol.DEFAULT_CHUNK_TOKENS
    memory_tokens: int = protocol.DEFAULT_MEMORY_TOKENS
    sampling: Sampling = field(default_factory=Sampling)
    reader: str = protocol.READER  # the registry's name of how chunks are read (readers/)


@dataclass(frozen=True)
class Step:
    """One memory update: the chunk read and the memory it left behind."""

    chunk: Chunk
    memory: str
    generation: Generation
    # What the reader's steps carry besides, by name, as its spec declares them
    # (readers/spec.py, Spec.fields): ReMemR1's recall, InfMem's searches, ...
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Units of the document the update was shown besides its chunk (a reader that searches,
    # readers/infmem.py): their token and character ranges, in the order shown.
    found: tuple[tuple[int, int], ...] = ()
    found_chars: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Answer:
    """The outcome of reading a document for one question."""

    question: str
    answer: str | None  # content of the last \boxed{}; None when the reply has none
    reply: str  # the raw final reply
    steps: list[Step]
    final: Generation
    stopped: str | None = None  # why the reader answered before the last chunk, if it did


@dataclass(frozen=True)
class StepStarted:
    """A step begins, reading `chunk`. `total`: the steps of the reading as far as it knows
    now (its chunks; a reader that reads them again adds a pass's steps as it begins one);
    `index`: the step's place in the reading, from 0 (None: its chunk's)."""

    chunk: Chunk
    total: int
    index: int | None = None

    @property
    def position(self) -> int:
        """The steps before this one."""
        return self.chunk.index if self.index is None else self.index


@dataclass(frozen=True)
class StepFinished:
    """A step is done (`total` and `index` as StepStarted's)."""

    step: Step
    total: int
    index: int | None = None

    @property
    def position(self) -> int:
        """The steps before this one."""
        return self.step.chunk.index if self.index is None else self.index


@dataclass(frozen=True)
class Replied:
    """Replies came to `answered` of the `asked` prompts a reading asked at once (Prompts,
    whose `what` and `unit` say what they are: "pass 2", "chunks"), counting the `before`
    answered before them (Prompts.before), whose steps came before the prompts' first
    StepStarted."""

    answered: int
    asked: int
    what: str = ""
    unit: str = "prompts"
    before: int = 0


@dataclass(frozen=True)
class Answering:
    memory: str
    stopped: str | None = None  # why the reader answers before the last chunk, if it does


@dataclass(frozen=True)
class Finished:
    answer: Answer


Event = StepStarted | StepFinished | Replied | Answering | Finished
Listener = Callable[[Event], None]


@dataclass(frozen=True)
class Prompt:
    """One message for the model, through its chat template, and the most tokens its reply
    may take; or, `raw`, a whole prompt a reader writes itself, chat markup included."""

    message: str
    max_tokens: int
    raw: Raw | None = None


class Prompts(tuple[Prompt, ...]):
    """Several prompts asked at once, none waiting on another's reply (PI-Mem's chunk calls
    of one pass): the reading is sent their replies, a tuple in the same order. For the
    views (Replied): `what` they are asked for ("pass 2"), `unit` what each is ("chunks"),
    and `before` how many of the same were answered before them (a pass resumed)."""

    what: str
    unit: str
    before: int

    def __new__(
        cls, prompts: Iterable[Prompt] = (), what: str = "", unit: str = "prompts", before: int = 0
    ) -> Prompts:
        made = super().__new__(cls, prompts)
        made.what, made.unit, made.before = what, unit, before
        return made


# A reading in progress: it yields each prompt (or several at once, `Prompts`), is sent the
# model's reply (a tuple of them), and returns the answer. `read` below runs one with a
# model one call at a time; scheduler.py runs many together, whatever their documents and
# lengths, and the prompts a reading asks at once together too.
Reading = Generator[Prompt | Prompts, Generation | tuple[Generation, ...], Answer]


class Reader(Protocol):
    """How a question is read over a document's chunks: MemAgent's loop (`memagent`), or a
    reader that came after it. `done` are the steps an earlier, interrupted run finished:
    reading goes on after them."""

    def __call__(
        self,
        question: str,
        chunks: Sequence[Chunk],
        settings: Settings,
        listener: Listener,
        done: Sequence[Step] = (),
    ) -> Reading: ...


def memagent(
    question: str,
    chunks: Sequence[Chunk],
    settings: Settings,
    listener: Listener = lambda event: None,
    done: Sequence[Step] = (),
) -> Reading:
    """MemAgent: fold every chunk into the memory (overwriting it), then answer from the
    last memory (../shared/spec/memagent-protocol.md; protocol.py holds its templates)."""
    steps = list(done)
    memory = steps[-1].memory if steps else protocol.INITIAL_MEMORY
    for chunk in chunks[len(steps) :]:
        listener(StepStarted(chunk, len(chunks)))
        reply = yield Prompt(
            protocol.render_update(question, memory, chunk.text), settings.memory_tokens
        )
        memory = protocol.strip_think(reply.text)
        steps.append(Step(chunk, memory, reply))
        listener(StepFinished(steps[-1], len(chunks)))
    listener(Answering(memory))
    reply = yield Prompt(protocol.render_final(question, memory), protocol.FINAL_MAX_TOKENS)
    answer = Answer(question, protocol.extract_boxed(reply.text), reply.text, steps, reply)
    listener(Finished(answer))
    return answer


def joined(*calls: Generation) -> Generation:
    """Several calls recorded as one step: the last one's text, everyone's tokens and
    seconds."""
    return Generation(
        calls[-1].text,
        sum(c.prompt_tokens for c in calls),
        sum(c.completion_tokens for c in calls),
        sum(c.prompt_seconds for c in calls),
        sum(c.seconds for c in calls),
        calls[-1].finish_reason,
        sum(c.drafted for c in calls),
        sum(c.accepted for c in calls),
    )


def read(
    backend: Backend,
    question: str,
    chunks: Sequence[Chunk],
    settings: Settings,
    listener: Listener = lambda event: None,
    done: Sequence[Step] = (),
    reader: Reader = memagent,
) -> Answer:
    """Read `chunks` for `question` with `reader`, one call at a time, and answer. This is
    the reference: scheduler.py, which reads many questions at once, gives the same."""
    reading = reader(question.strip(), chunks, settings, listener, done)

    def reply(prompt: Prompt) -> Generation:
        call = Call(prompt.message, prompt.max_tokens, raw=prompt.raw)
        return backend_reply(backend, call, settings.sampling)

    asked = next(reading)
    while True:
        replies = tuple(map(reply, asked)) if isinstance(asked, Prompts) else reply(asked)
        try:
            asked = reading.send(replies)
        except StopIteration as end:
            return end.value


def evidence(answer: Answer, held: Sequence[str] | None = None) -> Provenance | None:
    """The steps whose updates brought the answer's words into the memory for good
    (provenance.py has the rule); None when there is no answer to trace. `held`: the
    memory the reading held after each step, where that is not the step's own memory
    (Spec.held)."""
    said = answer.answer if answer.answer is not None else answer.reply
    memories = [step.memory for step in answer.steps] if held is None else held
    return trace_answer(said, answer.question, memories)


# Detokenized windows can re-tokenize a little longer inside the prompt.
_RETOKENIZE_SLACK = 32


def context_needed(
    backend: Backend,
    questions: Sequence[str],
    settings: Settings,
    *,
    templates: tuple[str, str] = protocol.BARE_TEMPLATES,
    memories: int = 1,
    extra: int = 0,
    answer: int = protocol.FINAL_MAX_TOKENS,
) -> int:
    """Context tokens one call needs; fails with a sentence when the model cannot hold it.
    `templates`: a reader's update and final prompts with nothing filled in; `memories`:
    how many memories each shows (a recalled one besides the last, for ReMemR1); `extra`:
    what else a reader's call holds (InfMem's units found and thinking); `answer`: the
    answer's reply."""
    overhead = backend.chat_overhead()
    update_template = len(backend.tokenize(templates[0]))
    final_template = len(backend.tokenize(templates[1]))
    question_tokens = max(len(backend.tokenize(q.strip())) for q in questions)
    memory = settings.memory_tokens
    shown = memory * memories
    update = overhead + update_template + question_tokens + shown + settings.chunk_tokens + memory
    final = overhead + final_template + question_tokens + shown + answer
    update, final = update + extra, final + extra
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
