"""Qwen's chat template (ChatML), written whole by the readers whose authors' servers built
the prompt themselves (readers/memreread.py, readers/infmem.py): one user message after an
optional system message, the generation prompt, and what follows it (Qwen3's empty thinking
block, where thinking is off)."""

from __future__ import annotations

from memagent_cli.backend import Raw

START, END = "<|im_start|>", "<|im_end|>"


def chat(user: str, system: str | None = None, after: str = "") -> str:
    """The prompt as text: `system`'s turn if any, `user`'s, the assistant's turn begun,
    then `after`."""
    head = "" if system is None else f"{START}system\n{system}{END}\n"
    return f"{head}{START}user\n{user}{END}\n{START}assistant\n{after}"


def raw_chat(user: str, system: str | None = None, after: str = "") -> Raw:
    """`chat` as a prompt written whole: the same text, in which only the turn markers and
    `after` are markup, so the words of a document, a memory or a question stay plain text."""
    start, end = (START, True), (END, True)
    head: Raw = () if system is None else (start, ("system\n" + system, False), end, ("\n", False))
    tail: Raw = ((after, True),) if after else ()
    return (
        *head,
        start,
        ("user\n" + user, False),
        end,
        ("\n", False),
        start,
        ("assistant\n", False),
        *tail,
    )
