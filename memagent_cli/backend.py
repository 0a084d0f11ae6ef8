"""Backends: how tokens are produced. They know about chat messages, never documents."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memagent_cli.errors import UserError

# Called as progress(what, done, total) while pages are extracted, bytes move or weights
# load; `total` is None while unknown. Defined here, the lowest module that reports
# progress (Backend.prepare), so that progress.py, which sits above reader.py, can
# re-export it without an import cycle.
Progress = Callable[[str, int, int | None], None]


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked; temperature 0 is greedy and reproducible."""

    temperature: float = 0.7
    top_p: float = 0.95
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """One reply and what it cost."""

    text: str
    prompt_tokens: int  # tokens in the rendered chat prompt
    completion_tokens: int
    prompt_seconds: float  # time to read the prompt (first token out)
    seconds: float  # whole call
    finish_reason: str  # "stop" or "length"
    drafted: int = 0  # tokens proposed by speculative decoding
    accepted: int = 0  # of those, the ones the model itself would have produced

    @property
    def generation_seconds(self) -> float:
        return max(self.seconds - self.prompt_seconds, 0.0)


# A prompt a reader writes whole, chat markup included (readers/infmem.py): its pieces in
# order, each (text, markup). Only markup may hold control tokens; a document's words, a
# memory or a reply in a text piece stay plain text, whatever they spell.
Raw = tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class Call:
    """One message to reply to, in one of several sequences read together."""

    message: str
    max_tokens: int
    sequence: int = 0  # the slot whose cache holds this question's earlier prompt
    fresh: bool = False  # the first call of a reading in its slot: what the slot holds is
    # another reading's, and is cleared first (then each reading sees what it sees alone)
    raw: Raw | None = None  # the whole prompt as a reader wrote it, instead of `message`


@dataclass(frozen=True)
class Description:
    """What a backend says about itself in the trace header and in `--json`."""

    model: dict[str, Any]  # path, name, size: the weights (resuming needs the same)
    engine: dict[str, Any]  # how they run: backend kind, threads, offload


class Backend(Protocol):
    """The narrow interface the reading loop needs from a model."""

    name: str
    context_limit: int  # tokens the model was trained on
    # Whether readings at once are calls in flight from threads (a server, which replies to
    # each on its own), rather than sequences of one context decoded together.
    threaded: bool
    local: bool  # the model runs in this process: its speed here can be measured

    def tokenize(self, text: str) -> list[int]:
        """Model tokens of plain text, without BOS or special tokens."""
        ...

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes of `tokens` (a window may end inside a UTF-8 character)."""
        ...

    def chat_overhead(self) -> int:
        """Tokens the chat template adds around one user message, generation prompt included."""
        ...

    def describe(self) -> Description:
        """The model and engine, for the trace header and `--json`."""
        ...

    def sequences_that_fit(self, context_tokens: int) -> int:
        """How many sequences of `context_tokens` one prepare() can hold in the memory free
        now; 1 for a backend that replies to one call at a time."""
        ...

    def prepare(
        self,
        context_tokens: int,
        sequences: int = 1,
        progress: Progress | None = None,
    ) -> None:
        """Make ready to serve `sequences` prompts plus replies of up to `context_tokens`
        tokens each at once. Loading weights can take a while: `progress(what, done, total)`
        hears of the bytes loaded."""
        ...

    def generate(self, message: str, *, max_tokens: int, sampling: Sampling) -> Generation:
        """Reply to one user message sent through the model's chat template."""
        ...

    def complete(self, raw: Raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        """Reply to a prompt a reader wrote whole, chat markup included (Call.raw)."""
        ...

    def markup(self, text: str) -> str | None:
        """The first spelling in `text` of chat markup that this backend would send as
        markup, not as text, inside a prompt (a server's template: backends/openai/markup.py);
        None, as in this process, where a document's text is never markup."""
        ...

    def needs_measuring(self) -> bool:
        """Whether `pays_together` needs the weights loaded first (to measure, once)."""
        ...

    def pays_together(self, most: int) -> int:
        """How many of `most` readings pay to read together, by what was measured here."""
        ...

    def calibration_record(self) -> str | None:
        """What drafts may do here, in one plain value for the trace header; None."""
        ...

    def next_replies(
        self, calls: Sequence[Call], *, sampling: Sampling
    ) -> list[tuple[int, Generation]]:
        """Start `calls` (each in its own sequence, free until now), then work on them and
        on the calls still in flight until at least one reply is complete; returns the
        complete replies by sequence (none when nothing is in flight). An in-process model
        decodes every call in flight together, and calls started while others are in flight
        join them at once (continuous batching)."""
        ...

    def cancel(self) -> None:
        """Drop every call in flight (after Ctrl-C or a failure)."""
        ...


def reply(backend: Backend, call: Call, sampling: Sampling) -> Generation:
    """`backend`'s reply to one call: a chat message through `generate`, or a prompt a
    reader wrote whole through `complete`."""
    if call.raw is None:
        return backend.generate(call.message, max_tokens=call.max_tokens, sampling=sampling)
    return backend.complete(call.raw, max_tokens=call.max_tokens, sampling=sampling)


def _sequence(call: Call) -> int:
    return call.sequence


class InTurn:
    """`next_replies` and `cancel` for a backend that replies to one call at a time (`generate`):
    every call is answered before `next_replies` returns, in sequence order, and none is ever
    left in flight; a threaded one (a server) sends several calls at once, each from a thread
    of its own, and returns as soon as one is answered, the others left in flight (each
    calling thread has its own: threads may share the backend)."""

    name: str
    generate: Callable[..., Generation]  # the backend's own
    threaded = False
    local = False

    def markup(self, text: str) -> str | None:
        """No markup known to be read in text (a server's own may know its template's)."""
        return None

    def complete(self, raw: Raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        """A backend that only chats cannot send a prompt written whole (its own may)."""
        raise UserError(
            f"The {self.name} backend cannot send a prompt a reader writes whole; read with "
            "llama.cpp in this process or through a server."
        )

    def needs_measuring(self) -> bool:
        return False

    def pays_together(self, most: int) -> int:
        return most  # nothing measured: all that fit

    def calibration_record(self) -> str | None:
        return None

    def next_replies(
        self, calls: Sequence[Call], *, sampling: Sampling
    ) -> list[tuple[int, Generation]]:
        ordered = sorted(calls, key=_sequence)
        if not self.threaded:
            return [(c.sequence, reply(self, c, sampling)) for c in ordered]
        flight = _InFlight.of(self)
        if not flight.calls and len(ordered) == 1:  # alone: here, where Ctrl-C reaches it
            return [(ordered[0].sequence, reply(self, ordered[0], sampling))]
        for call in ordered:
            flight.send(self, call, sampling)
        return flight.answered()

    def cancel(self) -> None:
        _InFlight.drop(self)


class _InFlight:
    """A threaded backend's calls in flight from one calling thread, each in a thread of
    its own. The threads are daemons: Ctrl-C while they wait stops the command at once, and
    a call dropped (`drop`, after Ctrl-C or a failure) ends unheard."""

    _local = threading.local()  # this thread's, by backend

    def __init__(self) -> None:
        self.ended: queue.Queue[tuple[int, Generation | BaseException]] = queue.Queue()
        self.calls = 0

    @classmethod
    def of(cls, backend: object) -> _InFlight:
        flights = cls._local.__dict__.setdefault("flights", {})
        return flights.setdefault(id(backend), cls())

    @classmethod
    def drop(cls, backend: object) -> None:
        cls._local.__dict__.get("flights", {}).pop(id(backend), None)

    def send(self, backend: Backend, call: Call, sampling: Sampling) -> None:
        ended = self.ended

        def send() -> None:
            try:
                ended.put((call.sequence, reply(backend, call, sampling)))
            except BaseException as exc:  # said by the caller's thread
                ended.put((call.sequence, exc))

        threading.Thread(target=send, daemon=True).start()
        self.calls += 1

    def answered(self) -> list[tuple[int, Generation]]:
        """The replies come: at least one (none with no call in flight); a failure raised."""
        if not self.calls:
            return []
        got = [self.ended.get()]
        with contextlib.suppress(queue.Empty):
            while True:
                got.append(self.ended.get_nowait())
        self.calls -= len(got)
        replies = []
        for sequence, one in got:
            if isinstance(one, BaseException):
                raise one
            replies.append((sequence, one))
        return replies
