"""Chunking: consecutive model-token windows of a document, each with its provenance."""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """One window of the document: its text and where it sits in tokens and characters."""

    index: int
    token_start: int
    token_end: int
    char_start: int
    char_end: int
    text: str

    @property
    def tokens(self) -> int:
        return self.token_end - self.token_start


def make_chunks(
    tokens: Sequence[int],
    size: int,
    detokenize: Callable[[Sequence[int]], bytes],
) -> list[Chunk]:
    """Cut `tokens` into windows of `size` (no overlap, the last may be shorter).

    Each window is detokenized back to text for the prompt. Character offsets come from
    decoding the windows' bytes in sequence, so a character split across two windows is
    counted in the window where it ends.
    """
    if size < 1:
        raise ValueError(f"chunk size must be at least 1 token, got {size}")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chunks: list[Chunk] = []
    char_offset = 0
    for index, start in enumerate(range(0, len(tokens), size)):
        window = tokens[start : start + size]
        raw = detokenize(window)
        chars = len(decoder.decode(raw, final=start + size >= len(tokens)))
        chunks.append(
            Chunk(
                index=index,
                token_start=start,
                token_end=start + len(window),
                char_start=char_offset,
                char_end=char_offset + chars,
                text=raw.decode("utf-8", errors="replace"),
            )
        )
        char_offset += chars
    return chunks
