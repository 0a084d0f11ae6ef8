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
    """One question read along with others: its listener and the steps it has done."""

    question: str
    listener: Listener = lambda event: None
    done: Sequence[Step] = ()


def read_together(
    backend: Backend, readings: Sequence[Reading], chunks: Sequence[Chunk], settings: Settings
) -> list[Answer]:
    """Read the document for several questions at once: each round, every question not yet
    answered makes its next call (an update, or its answer once the chunks are read), and
    the backend replies to all of them together. Question i keeps sequence i, so each finds
    its own earlier prompt in the cache. Each memory and answer is what reading alone gives.
    """
    questions = [r.question.strip() for r in readings]
    steps = [list(r.done) for r in readings]
    answers: list[Answer | None] = [None] * len(readings)
    while pending := [i for i, answer in enumerate(answers) if answer is None]:
        calls = []
        for i in pending:
            memory = steps[i][-1].memory if steps[i] else protocol.INITIAL_MEMORY
            if len(steps[i]) < len(chunks):
                chunk = chunks[len(steps[i])]
                readings[i].listener(StepStarted(chunk, len(chunks)))
                message = protocol.render_update(questions[i], memory, chunk.text)
                calls.append(Call(message, settings.memory_tokens, i))
            else:
                readings[i].listener(Answering(memory))
                message = protocol.render_final(questions[i], memory)
                calls.append(Call(message, protocol.FINAL_MAX_TOKENS, i))
        replies = backend.generate_many(calls, sampling=settings.sampling)
        for i, generation in zip(pending, replies, strict=True):
            if len(steps[i]) < len(chunks):
                chunk = chunks[len(steps[i])]
                steps[i].append(Step(chunk, protocol.strip_think(generation.text), generation))
                readings[i].listener(StepFinished(steps[i][-1], len(chunks)))
            else:
                boxed = protocol.extract_boxed(generation.text)
                answer = Answer(questions[i], boxed, generation.text, steps[i], generation)
                answers[i] = answer
                readings[i].listener(Finished(answer))
    return [a for a in answers if a is not None]


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
