"""Word diffs of the memories in a trace: what each step added and dropped. Pure functions
of strings and trace records (no Rich), shared by the terminal, Markdown and HTML views."""

from __future__ import annotations

import difflib
import re

from memagent_cli import protocol
from memagent_cli.trace import Trace

# Work a diff may do, counted as difflib's matcher does it: each word of one memory, and
# each place where that word stands in the other, at every search for the longest match.
# Memories of 1,000 words of docs/*.md, edited, cost up to 150,000 (0.02 s); 1,000 words
# of few distinct ones cost up to 200 million (13 s for one pair: the matcher, autojunk
# off, is cubic at worst). Past the limit (0.1 s or so) the memories are compared line by
# line, and past it again shown as one replaced by the other (docs/reliability.md).
DIFF_LIMIT = 1_000_000
_WORDS = re.compile(r"\S+\s*")  # a word and the spacing after it
_LINES = re.compile(r"[^\n]*\n|[^\n]+")

Opcode = tuple[str, int, int, int, int]


class _TooMuch(Exception):
    """A diff that would pass DIFF_LIMIT."""


class _Matcher(difflib.SequenceMatcher):
    """difflib's matcher, autojunk off (common words are what memories share), that stops
    once its work passes `limit`."""

    def __init__(self, a: list[str], b: list[str], limit: int) -> None:
        self.work, self.limit = 0, limit
        super().__init__(None, a, b, autojunk=False)

    def find_longest_match(
        self, alo: int = 0, ahi: int | None = None, blo: int = 0, bhi: int | None = None
    ) -> difflib.Match:
        ahi = len(self.a) if ahi is None else ahi
        bhi = len(self.b) if bhi is None else bhi
        # An upper bound of the loop below: each word, and each of its places in b.
        b2j, a = self.b2j, self.a
        self.work += ahi - alo + sum(len(b2j.get(a[i], ())) for i in range(alo, ahi))
        if self.work > self.limit:
            raise _TooMuch
        return super().find_longest_match(alo, ahi, blo, bhi)


def _aligned(before: str, after: str) -> tuple[list[str], list[str], list[Opcode]]:
    """The pieces of `before` and `after` (words with their spacing, else lines, else each
    text whole) and the opcodes turning one into the other, within DIFF_LIMIT."""
    for unit in (_WORDS, _LINES):
        old, new = unit.findall(before), unit.findall(after)
        try:
            keys = [" ".join(u.split()) for u in old], [" ".join(u.split()) for u in new]
            return old, new, _Matcher(*keys, DIFF_LIMIT).get_opcodes()
        except _TooMuch:
            continue
    return [before], [after], [("equal" if before == after else "replace", 0, 1, 0, 1)]


def word_change(before: str, after: str) -> tuple[int, int]:
    """Words added and removed going from `before` to `after`."""
    added = removed = 0
    old, new, opcodes = _aligned(before, after)
    for op, i1, i2, j1, j2 in opcodes:
        if op != "equal":
            removed += sum(len(u.split()) for u in old[i1:i2])
            added += sum(len(u.split()) for u in new[j1:j2])
    return added, removed


def changes(loaded: Trace) -> list[tuple[int, int]]:
    """Words added and removed by each step."""
    memories = [s.memory for s in loaded.steps]
    before = [protocol.INITIAL_MEMORY, *memories][: len(memories)]
    return [word_change(b, a) for b, a in zip(before, memories, strict=True)]


Piece = tuple[str, str]  # ("=", kept text), ("-", dropped words) or ("+", added words)


def word_diff(before: str, after: str) -> list[Piece]:
    """`after` against `before`, word by word, git --word-diff style: kept text with its own
    spacing and line breaks, and the words dropped and added, each run without its spacing.
    Memories too alike in their words to compare within DIFF_LIMIT are compared line by
    line."""
    old, new, opcodes = _aligned(before, after)
    pieces: list[Piece] = []
    for op, i1, i2, j1, j2 in opcodes:
        if op == "equal":
            pieces.append(("=", "".join(new[j1:j2])))
            continue
        gone, came = "".join(old[i1:i2]), "".join(new[j1:j2])
        if gone.strip():
            pieces.append(("-", gone.rstrip()))
        if came.strip():
            pieces.append(("+", came.rstrip()))
        spacing = came or gone  # keep the line breaks of the text that is left
        pieces.append(("=", spacing[len(spacing.rstrip()) :]))
    return pieces
