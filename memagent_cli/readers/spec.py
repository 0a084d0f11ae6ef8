"""What a reader is to the rest of memagent: one `Spec`, defined by the reader's module and
kept by name in the registry (readers/__init__.py). Whatever the code needs to know of a
reader (its loop, its prompts and their hashes, its authors' sampling and reply limits,
what a step costs and what a backend must do for it) it asks the spec, never the name."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memagent_cli import protocol
from memagent_cli.backend import Backend, Sampling
from memagent_cli.chunking import Tokenizer
from memagent_cli.errors import BudgetError
from memagent_cli.reader import Reader, Settings, Step, context_needed

# A question of a usual length, for the prompts priced before any question is asked.
USUAL_QUESTION = "What is this document about?"


@dataclass(frozen=True)
class CallSize:
    """One call of a reading as an estimate prices it: its prompt and reply in tokens."""

    prompt: int
    reply: int


@dataclass(frozen=True)
class Templates:
    """Prompt tokens of a reader's calls before any memory, chunk or units are put in: chat
    markup, template and question. `planner`: a call before each update (InfMem's) or each
    reread (MemReread's); `merge`: a call that folds what was found into the memory
    (PI-Mem's merge, MemReread's integration)."""

    update: int
    final: int
    planner: int = 0
    merge: int = 0


@dataclass(frozen=True)
class Replies:
    """The most tokens one memory update's reply and the answer's may take."""

    update: int
    answer: int


def _itself(value: Any) -> tuple[str, ...]:
    return (str(value),)


@dataclass(frozen=True)
class StepField:
    """Something a reader's steps carry besides the chunk read and the memory left: one key
    of `Step.extra`, and of the step's record in a trace, where the reading finds it again
    to resume. `trace`, its Markdown and its HTML show it as "<label>: <text>", a line for
    each text `shown` makes of it. A step whose value is `empty` leaves the key out."""

    name: str  # its key in Step.extra and in a trace's step record
    kind: type | str  # str, int, or "pairs" (a list of [text, text], a tuple of pairs here)
    label: str  # what `trace` calls it
    shown: Callable[[Any], Sequence[str]] = _itself
    empty: Any = None

    def parse(self, value: Any) -> Any | None:
        """The value a trace's record holds, as a step holds it; None when it is not one
        of its kind (`kind`)."""
        if self.kind == "pairs":
            pairs = isinstance(value, list) and all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
                for p in value
            )
            return tuple(tuple(p) for p in value) if pairs else None
        assert isinstance(self.kind, type)
        if isinstance(value, bool) and self.kind is not bool:
            return None
        return value if isinstance(value, self.kind) else None

    def to_json(self, value: Any) -> Any:
        """The value as a trace's record holds it."""
        return [list(p) for p in value] if self.kind == "pairs" else value


def _nothing(chunk_tokens: int, steps: int) -> int:
    return 0


def _one(chunks: int) -> int:
    return 1


@dataclass(frozen=True)
class Spec:
    """One reader: how it reads, and everything else memagent asks of it."""

    name: str
    summary: str  # what it does, in a few words (--reader's help, `models list`)
    # The loop over one document of `tokens` (the model's), with the model's tokenizer for
    # a reader that looks at the text again (InfMem's search units, ReMemR1's TF-IDF).
    loop: Callable[[Tokenizer, Sequence[int]], Reader]
    # Its templates as its authors wrote them, by name ("update", "final", ...): their
    # hashes go in each trace header, to catch prompt drift.
    templates: Mapping[str, str]
    bare: tuple[str, str]  # the same prompts with nothing filled in: what a call adds
    sampling: Sampling = field(default_factory=Sampling)  # as its authors sampled
    # The most tokens its authors let a memory update's reply and the answer's take: a
    # reading that says nothing of --memory-tokens takes the first.
    memory_tokens: int = protocol.DEFAULT_MEMORY_TOKENS
    answer_tokens: int = protocol.FINAL_MAX_TOKENS
    thinking_tokens: int = 0  # a thinking stage before each reply, each call (InfMem)
    memories: int = 1  # memories a call shows: the last, and a recalled one (ReMemR1)
    step_calls: int = 1  # model calls one step makes (InfMem: its planner and its update)
    # The most prompts a reading of a document of this many chunks asks at once
    # (reader.Prompts; PI-Mem: a pass's chunks): the calls a batch may hold for it.
    at_once: Callable[[int], int] = _one
    # Tokens a call holds beyond MemAgent's parts, for chunks of `chunk_tokens` and a
    # document of `steps` chunks (0: not known yet).
    extra_tokens: Callable[[int, int], int] = _nothing
    # The memory the reading holds after each of its steps, where a step's own memory is not
    # it (PI-Mem's is a chunk's finding, a MemReread reread's its own): what evidence reads
    # (reader.evidence); None: each step's memory.
    held: Callable[[Sequence[Step]], list[str]] | None = None
    # Why a document of many steps needs more context, where it does (InfMem's history).
    grows: str | None = None
    stops_early: str | None = None  # why it may answer before the last chunk
    # Its prompts are written whole, chat markup and all (Call.raw): a server would read a
    # document's spelling of the model's markup as markup, so such a document is refused.
    writes_whole: bool = False
    # The trace header and the journal name the reader only where it is not this one: runs
    # from before the readers were MemAgent's, and are the same runs.
    implied: bool = False
    # What an estimate prices: every call of reading chunks of these sizes (run/inspect.py);
    # None: one update call a step, as `steps_in_turn` prices them.
    price: Callable[[Spec, Sequence[int], Templates, Replies, int, int], list[CallSize]] | None = (
        None
    )
    # The tokens of its calls with nothing filled in; None: each template through the chat
    # template, as `templates_through_chat` counts them.
    template_tokens: Callable[[Spec, Backend, int], Templates] | None = None
    # What its steps carry besides the chunk and the memory (Step.extra), in the order the
    # trace records and shows them.
    fields: tuple[StepField, ...] = ()

    def actions(self, extra: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
        """What a step did besides its update, as `trace` shows it: (label, text) for each
        of its fields (`fields`) that the step has."""
        for step_field in self.fields:
            value = extra.get(step_field.name, step_field.empty)
            if value != step_field.empty:
                yield from ((step_field.label, text) for text in step_field.shown(value))

    def replies(self, memory_tokens: int) -> Replies:
        """The reply limits of a reading whose memory may take `memory_tokens`; a thinking
        stage comes before each."""
        answer = memory_tokens if self.thinking_tokens else self.answer_tokens
        return Replies(self.thinking_tokens + memory_tokens, self.thinking_tokens + answer)

    @property
    def stages(self) -> int:
        """Stages of each call: a thinking one first, where it thinks, then the reply."""
        return 2 if self.thinking_tokens else 1

    def templates_sha256(self) -> dict[str, str]:
        """Fingerprints of its templates, recorded in each trace header."""
        return {
            name: hashlib.sha256(text.encode()).hexdigest() for name, text in self.templates.items()
        }

    def context_needed(
        self, backend: Backend, questions: Sequence[str], settings: Settings, steps: int = 0
    ) -> int:
        """Context tokens one call of this reader needs over a document of `steps` chunks
        (0: before the document is known) (reader.context_needed); fails with a sentence
        when the model cannot hold it."""
        replies = self.replies(settings.memory_tokens)

        def needed(steps: int) -> int:
            return context_needed(
                backend,
                questions,
                settings,
                templates=self.bare,
                memories=self.memories,
                extra=self.extra_tokens(settings.chunk_tokens, steps),
                answer=replies.answer - self.thinking_tokens,  # the thinking is in `extra`
            )

        if not steps or self.grows is None:
            return needed(steps)
        base = needed(0)  # a sentence of its own where even that does not fit
        try:
            return max(needed(steps), base)
        except BudgetError:
            raise BudgetError(
                f"{self.grows}: a document of {steps:,} chunks needs about "
                f"{context_needed_estimate(self, backend, questions, settings, steps):,} tokens "
                f"of context, more than the model's {backend.context_limit:,}; read it in "
                "parts, with larger --chunk-tokens, or with another --reader."
            ) from None

    def calls(
        self,
        chunks: Sequence[int],
        templates: Templates,
        replies: Replies,
        memory: int,
        first_memory: int,
    ) -> list[CallSize]:
        """Every call of a reading of chunks of `chunks` tokens, each reply as long as
        `replies`, every memory after the first (`first_memory` tokens) `memory` long."""
        price = self.price or steps_in_turn
        return price(self, chunks, templates, replies, memory, first_memory)

    def call_templates(self, backend: Backend, steps: int) -> Templates:
        """The tokens of its calls with nothing filled in, with a usual question."""
        count = self.template_tokens or templates_through_chat
        return count(self, backend, steps)


def steps_in_turn(
    spec: Spec,
    chunks: Sequence[int],
    templates: Templates,
    replies: Replies,
    memory: int,
    first_memory: int,
) -> list[CallSize]:
    """One update call a chunk, showing the last memory and, once there are earlier ones,
    the recalled ones (Spec.memories), then the answer."""
    calls, shown, recalled = [], first_memory, 0
    for tokens in chunks:
        calls.append(CallSize(templates.update + shown + recalled + tokens, replies.update))
        shown, recalled = memory, memory * (spec.memories - 1)
    return [*calls, CallSize(templates.final + shown + recalled, replies.answer)]


def templates_through_chat(spec: Spec, backend: Backend, steps: int) -> Templates:
    """Each template as one user message through the model's chat template."""
    overhead = backend.chat_overhead() + len(backend.tokenize(USUAL_QUESTION))
    update, final = spec.bare
    return Templates(
        update=overhead + len(backend.tokenize(update)),
        final=overhead + len(backend.tokenize(final)),
    )


def context_needed_estimate(
    spec: Spec, backend: Backend, questions: Sequence[str], settings: Settings, steps: int
) -> int:
    """What `spec.context_needed` would ask for `steps`, past the model's context."""
    unbounded = _Unbounded(backend)
    return spec.context_needed(unbounded, questions, settings, steps)


class _Unbounded:
    """`backend` with no context limit: to say how much a reading would need."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.context_limit = 1 << 62

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)
