"""The MemAgent loop: read a document chunk by chunk into a memory, then answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memagent_cli import protocol
from memagent_cli.backends import Backend, Generation, Sampling
from memagent_cli.chunking import Chunk
from memagent_cli.errors import BudgetError


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
    question = question.strip()
    steps = list(done)
    memory = steps[-1].memory if steps else protocol.INITIAL_MEMORY
    for chunk in chunks[len(steps) :]:
        listener(StepStarted(chunk, len(chunks)))
        message = protocol.render_update(question, memory, chunk.text)
        generation = backend.generate(
            message, max_tokens=settings.memory_tokens, sampling=settings.sampling
        )
        memory = protocol.strip_think(generation.text)
        steps.append(Step(chunk, memory, generation))
        listener(StepFinished(steps[-1], len(chunks)))
    listener(Answering(memory))
    final = backend.generate(
        protocol.render_final(question, memory),
        max_tokens=protocol.FINAL_MAX_TOKENS,
        sampling=settings.sampling,
    )
    answer = Answer(question, protocol.extract_boxed(final.text), final.text, steps, final)
    listener(Finished(answer))
    return answer


def evidence(answer: Answer) -> Step | None:
    """The step whose update first brought the answer's text into memory, if any."""
    target = protocol.normalize_answer(answer.answer or "")
    if not target:
        return None
    return next((s for s in answer.steps if target in protocol.normalize_answer(s.memory)), None)


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
