"""Word diffs of the memories in a trace: what each step added and dropped. Pure functions
of strings and trace records (no Rich), shared by the terminal, Markdown and HTML views."""

from __future__ import annotations

import difflib
import re

from memagent_cli import protocol
from memagent_cli.trace import Trace

# Word pairs a diff may compare: a memory of 1,000 words against another takes 0.15 s at
# worst (few distinct words). difflib's matcher is quadratic or worse in the words, so a
# larger pair of memories (a hostile trace's) is shown as all of one replaced by the other.
DIFF_LIMIT = 1_000_000


def _opcodes(old: list[str], new: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes turning `old` into `new`, or one "replace" above DIFF_LIMIT."""
    if len(old) * len(new) > DIFF_LIMIT:
        return [("replace", 0, len(old), 0, len(new))]
    return difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()


def word_change(before: str, after: str) -> tuple[int, int]:
    """Words added and removed going from `before` to `after`."""
    added = removed = 0
    for op, i1, i2, j1, j2 in _opcodes(before.split(), after.split()):
        if op != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def changes(loaded: Trace) -> list[tuple[int, int]]:
    """Words added and removed by each step."""
    memories = [s.memory for s in loaded.steps]
    before = [protocol.INITIAL_MEMORY, *memories][: len(memories)]
    return [word_change(b, a) for b, a in zip(before, memories, strict=True)]


Piece = tuple[str, str]  # ("=", kept text), ("-", dropped words) or ("+", added words)


def word_diff(before: str, after: str) -> list[Piece]:
    """`after` against `before`, word by word, git --word-diff style: kept text with its own
    spacing and line breaks, and the words dropped and added, each run without its spacing."""
    old, new = re.findall(r"\S+\s*", before), re.findall(r"\S+\s*", after)
    pieces: list[Piece] = []
    for op, i1, i2, j1, j2 in _opcodes([w.strip() for w in old], [w.strip() for w in new]):
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
