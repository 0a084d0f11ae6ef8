"""A backend that replies from a script: the loop and the run tested with no model."""

from __future__ import annotations

import hashlib

from memagent_cli.backend import Description, Generation, InTurn


class ScriptedBackend(InTurn):
    """A backend that replies from a script, one token per byte: for unit tests of the loop
    and the run, with no model. `replies` run out: KeyboardInterrupt, as Ctrl-C would."""

    name = "scripted"

    def __init__(self, replies: list[str], context_limit: int = 8192) -> None:
        self.replies = list(replies)
        self.messages: list[tuple[str, int]] = []
        self.context_limit = context_limit
        self.prepared = 0
        self.sequences = 1
        self.fits = 8  # sequences one prepare() could hold
        self.rounds: list[list[int]] = []  # the sequences of each next_replies() call

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens) -> bytes:
        return bytes(tokens)

    def chat_overhead(self) -> int:
        return 10

    def describe(self) -> Description:
        model = {"path": "/models/scripted.gguf", "name": "scripted", "size": 1234}
        return Description(model=model, engine={"backend": "scripted"})

    def sequences_that_fit(self, context_tokens: int) -> int:
        return self.fits

    def prepare(self, context_tokens: int, sequences: int = 1, progress=None) -> None:
        self.prepared += 1
        self.sequences = sequences

    def generate(self, message: str, *, max_tokens: int, sampling) -> Generation:
        if not self.replies:
            raise KeyboardInterrupt
        self.messages.append((message, max_tokens))
        text = self.replies.pop(0)
        return Generation(text, len(message), len(text.split()) + 2, 0.1, 0.2, "stop")

    def next_replies(self, calls, *, sampling):
        self.rounds.append(sorted(call.sequence for call in calls))
        return super().next_replies(calls, sampling=sampling)


class EchoBackend(ScriptedBackend):
    """Replies with a digest of the message, so a reply depends on nothing else; stops
    (Ctrl-C) after `calls_left` calls when given."""

    def __init__(self, calls_left: int | None = None) -> None:
        super().__init__([])
        self.calls_left = calls_left

    def generate(self, message: str, *, max_tokens: int, sampling) -> Generation:
        if self.calls_left is not None:
            if self.calls_left == 0:
                raise KeyboardInterrupt
            self.calls_left -= 1
        self.messages.append((message, max_tokens))
        digest = hashlib.sha256(message.encode()).hexdigest()[:12]
        text = f"\\boxed{{{digest}}}" if "Your answer:" in message else f"kept {digest}"
        return Generation(text, len(message), 3, 0.1, 0.2, "stop")
