"""Chunking: consecutive model-token windows of a document, each with its provenance."""

from __future__ import annotations

import bisect
import codecs
import functools
import re
import unicodedata
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Tokenizer(Protocol):
    """What chunking needs of a model: its own tokens, and their bytes back."""

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> bytes: ...


def token_pieces(tokenizer: Tokenizer) -> Callable[[str], list[bytes]]:
    """Each token's bytes of a text, by `tokenizer`: its own `pieces` where it has them (a
    server that gives its tokens' pieces: one request a text), else each distinct token
    detokenized once and kept (a vocabulary at most)."""
    own = getattr(tokenizer, "pieces", None)
    if own is not None:
        return own
    known: dict[int, bytes] = {}

    def pieces(text: str) -> list[bytes]:
        tokens = tokenizer.tokenize(text)
        for token in tokens:
            if token not in known:
                known[token] = tokenizer.detokenize([token])
        return [known[token] for token in tokens]

    return pieces


def detokenize_all(tokenizer: Tokenizer, windows: Sequence[Sequence[int]]) -> list[bytes]:
    """Each window's bytes, by `tokenizer`: its own `detokenize_many` where it has one (a
    server, which answers many windows in few requests), else a window at a time."""
    many = getattr(tokenizer, "detokenize_many", None)
    if many is not None:
        return many(windows)
    return [tokenizer.detokenize(window) for window in windows]


class Tokens(array):
    """A document's token ids, 4 bytes each: a list of ints takes about 36 bytes per token,
    70 MB more for a 2M-token book. Compares equal to any sequence of the same ids."""

    def __new__(cls, values: Iterable[int] = ()) -> Tokens:
        return super().__new__(cls, "i", values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, array):
            return array.__eq__(self, other)
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list


@dataclass(frozen=True, eq=False)
class Chunk:
    """One window of the document: its text and where it sits in tokens and characters.

    Where the window's text is exactly `document[char_start:char_end]` (nearly always),
    the chunk keeps a reference to the document instead of a copy, so a book's chunks do
    not hold its text twice."""

    index: int
    token_start: int
    token_end: int
    char_start: int
    char_end: int
    own_text: str | None = field(default=None, repr=False)  # None: a slice of `document`
    document: str = field(default="", repr=False)
    # Where the text was normalized before tokenizing (NFC for Qwen): the text read, and
    # where this chunk starts in it; the ranges above are the document's as extracted.
    normal: Normalized | None = field(default=None, repr=False)
    normal_start: int = 0

    @property
    def text(self) -> str:
        if self.own_text is not None:
            return self.own_text
        return self.document[self.char_start : self.char_end]

    def _ranges(self) -> tuple[int, ...]:
        return (self.index, self.token_start, self.token_end, self.char_start, self.char_end)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chunk):
            return NotImplemented
        return self._ranges() == other._ranges() and self.text == other.text

    def __hash__(self) -> int:
        return hash(self._ranges())

    @property
    def tokens(self) -> int:
        return self.token_end - self.token_start

    def at(self, offset: int) -> int:
        """Where character `offset` (0 to its length) of the chunk's text falls in the
        document as extracted."""
        if self.normal is None:
            return self.char_start + offset
        return self.normal.original(self.normal_start + offset)

    def where(self, span: str) -> dict[str, Any]:
        """Where the chunk sits, as traces, `--json` and `inspect` report it: numbered from 1,
        as people count (step n reads chunk n)."""
        return {
            "chunk": self.index + 1,
            "tokens": [self.token_start, self.token_end],
            "chars": [self.char_start, self.char_end],
            "span": span,
        }


Counted = Callable[[int, int], None]  # progress(done, total) of a long piece of work


def make_chunks(
    tokens: Sequence[int],
    size: int,
    detokenize: Callable[[Sequence[int]], bytes],
    document: str | None = None,
    progress: Counted | None = None,
    inexact: Callable[[], None] | None = None,
) -> list[Chunk]:
    """Cut `tokens` into windows of `size` (no overlap, the last may be shorter).

    Each window is detokenized back to text for the prompt. Character offsets come from
    decoding the windows' bytes in sequence, so a character split across two windows is
    counted in the window where it ends. With the `document` the tokens came from, a chunk
    whose text is that document's slice refers to it rather than holding a copy.
    `progress(done, total)` counts chunks (a server detokenizes each in one call).
    Where the windows' texts do not add up to the document (a server that decodes a cut
    character as U+FFFD), they are placed by the document's bytes (placed_by_bytes); where
    no cut of its bytes decodes so, `inexact()` hears of it.
    """
    if size < 1:
        raise ValueError(f"chunk size must be at least 1 token, got {size}")
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chunks: list[Chunk] = []
    char_offset = 0
    for index, start in enumerate(range(0, len(tokens), size)):
        end = min(start + size, len(tokens))
        raw = detokenize(list(tokens[start:end]))
        chars = len(decoder.decode(raw, final=end >= len(tokens)))
        text = raw.decode("utf-8", errors="replace")
        char_end = char_offset + chars
        chunks.append(_chunk(index, start, end, char_offset, char_end, text, document))
        char_offset = char_end
        if progress is not None:
            progress(index + 1, -(-len(tokens) // size))
    if document is not None and chunks and char_offset != len(document):
        # A window's text without its bytes: a server that only detokenizes answers a
        # character a window cuts in two with U+FFFD on both sides (one more character
        # each side). Placed by the document's own bytes, where they decode so.
        ends = placed_by_bytes(document, [chunk.text for chunk in chunks])
        if ends is not None:
            starts = [0, *ends[:-1]]
            chunks = [
                _chunk(c.index, c.token_start, c.token_end, a, b, c.text, document)
                for c, a, b in zip(chunks, starts, ends, strict=True)
            ]
        elif inexact is not None:
            inexact()
    return chunks


def _chunk(
    index: int,
    start: int,
    end: int,
    char_start: int,
    char_end: int,
    text: str,
    document: str | None,
) -> Chunk:
    """A chunk of `text`: a reference to `document` where the text is its slice."""
    if document is not None and document[char_start:char_end] == text:
        return Chunk(index, start, end, char_start, char_end, None, document)
    return Chunk(index, start, end, char_start, char_end, text)


_CUT = "\ufffd"  # what a decoding of bytes answers a character cut in two with


def placed_by_bytes(document: str, texts: Sequence[str]) -> list[int] | None:
    """Where each of consecutive windows of `document`'s tokens ends in its characters, given
    each window's text as a server decodes its bytes (a character a window cuts in two
    counts in the window where it ends); None where no cut of the document's bytes decodes
    into `texts`.

    A decoding of bytes (Python's, Rust's from_utf8_lossy, which Hugging Face tokenizers
    use) gives a character cut at a window's end one U+FFFD, and each byte of it left at
    the next window's start one U+FFFD: the window's text says where it starts and ends
    in the document's bytes, up to where inside a cut character it ends, which the next
    window's text tells. Every cut still possible is carried from window to window (a few
    bytes apart: a character is at most 4), and the one that ends at the document's end is
    traced back. Only the document's own U+FFFD next to a cut can leave two places that
    give the same texts (a U+FFFD cut in two reads as a whole one): then the first found,
    a character or two from the other."""
    # A place in the document's bytes: (character, bytes into it); each window's ends
    # from each of the last window's places, with where they came from.
    layer: dict[tuple[int, int], tuple[int, int] | None] = {(0, 0): None}
    layers = []
    for text in texts:
        reached: dict[tuple[int, int], tuple[int, int] | None] = {}
        for place in layer:
            for end in _window_ends(document, place, text):
                reached.setdefault(end, place)
        if not reached:
            return None
        layers.append(reached)
        layer = reached
    place: tuple[int, int] | None = (len(document), 0)
    if place not in layer:
        return None
    ends = []
    for reached in reversed(layers):
        assert place is not None
        ends.append(place[0])  # a character cut at a window's end counts in the next
        place = reached[place]
    return ends[::-1]


def _window_ends(document: str, place: tuple[int, int], text: str) -> list[tuple[int, int]]:
    """Each place in `document`'s bytes where a window from `place` that decodes as `text`
    may end: (character, bytes into it)."""
    at, inside = place
    ends = []
    if inside:  # the window starts with the rest of a cut character: a U+FFFD a byte
        rest = len(document[at].encode()) - inside
        if len(text) < rest and text == _CUT * len(text):
            ends.append((at, inside + len(text)))  # it ends inside that character
        if text[:rest] != _CUT * rest:
            return ends
        text, at = text[rest:], at + 1
    if document.startswith(text, at):
        ends.append((at + len(text), 0))
    last = at + len(text) - 1
    if (
        text.endswith(_CUT)
        and last < len(document)
        and document.startswith(text[:-1], at)
        and len(document[last].encode()) > 1
    ):
        ends += [(last, cut) for cut in range(1, len(document[last].encode()))]
    return ends


_PIECES_FROM = 1 << 20  # characters: below this, one call is as cheap as any
_SAMPLE = "Call me Ishmael. Some years ago, never mind how long"


def _cuts_cleanly(tokenizer: Tokenizer) -> bool:
    """Whether this tokenizer gives the same tokens for a text cut before a space (true of
    byte-level BPE; a SentencePiece model that adds a prefix space to every call is not)."""
    words = _SAMPLE.split(" ")
    pieces = [words[0], *(" " + w for w in words[1:])]
    return tokenizer.tokenize(_SAMPLE) == [t for p in pieces for t in tokenizer.tokenize(p)]


def tokenize(text: str, tokenizer: Tokenizer, progress: Counted | None = None) -> Tokens:
    """The document's tokens. A long text is tokenized in pieces (same tokens, memory
    proportional to a piece, and `progress(done, total)` in characters as they go) when the
    tokenizer is one for which that is exact."""
    if len(text) > _PIECES_FROM and _cuts_cleanly(tokenizer):
        return tokenize_in_pieces(text, tokenizer.tokenize, progress=progress)
    return Tokens(tokenizer.tokenize(text))


def chunk_text(
    text: str,
    tokenizer: Tokenizer,
    size: int,
    tokenized: Counted | None = None,
    chunked: Counted | None = None,
) -> tuple[Tokens, list[Chunk]]:
    """The document's tokens and its chunks of `size` tokens, as the protocol cuts them:
    of the text as the tokenizer normalizes it (its `normalization`, NFC for Qwen, as the
    authors' Hugging Face tokenizer does), with the chunks' character ranges in `text` as
    it is. `tokenized` and `chunked` hear how the two stages go (progress(done, total))."""
    normal = normalized(text, getattr(tokenizer, "normalization", None))
    tokens = tokenize(normal.text, tokenizer, tokenized)
    inexact = getattr(tokenizer, "inexact_ranges", None)
    chunks = make_chunks(tokens, size, tokenizer.detokenize, normal.text, chunked, inexact)
    return tokens, normal.placed(chunks)


# --- normalization ------------------------------------------------------------------------

# The Unicode normalization the Hugging Face tokenizer of each of llama.cpp's pre-tokenizers
# (tokenizer.ggml.pre) applies before it splits, which llama.cpp does not: Qwen2's, Qwen2.5's
# and Qwen3's tokenizer.json say {"type": "NFC"} (models/conversion/vocabulary.py converts
# these alone). Text is tokenized so, as the authors' model read it.
NORMALIZATIONS = {"qwen2": "NFC"}


@functools.cache
def _unstable(form: str) -> tuple[re.Pattern[str], frozenset[str]]:
    """Runs of the characters around which `form` (NFC) may change a text (combining marks,
    characters that combine with the one before them, characters that change or decompose
    into such), and those of them before which a text may still be cut (a singleton such as
    the Ångström sign). Before any other character a text splits into pieces that normalize
    on their own (Unicode's stable boundaries, UAX #15)."""
    decomposing = []
    for code in range(0x30000):  # no canonical decomposition lies above
        decomposition = unicodedata.decomposition(chr(code))
        if decomposition and not decomposition.startswith("<"):
            decomposing.append((code, [int(part, 16) for part in decomposition.split()]))
    back = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V and T jamo
    for code, parts in decomposing:
        if len(parts) == 2 and unicodedata.normalize(form, chr(code)) == chr(code):
            back.add(parts[1])  # a primary composite: its second part combines backward
    marks = {code for code in range(0x110000) if unicodedata.combining(chr(code))}
    unstable, cut_before = back | marks, set()
    for code, parts in decomposing:
        if unicodedata.normalize(form, chr(code)) != chr(code) or parts[0] in back | marks:
            unstable.add(code)
            first = unicodedata.normalize("NFD", chr(code))[0]
            if code not in marks and ord(first) not in back | marks:
                cut_before.add(chr(code))
    codes = sorted(unstable)
    spans, first = [], codes[0]
    for previous, code in zip(codes, [*codes[1:], -1], strict=True):
        if code != previous + 1:
            last = f"-{re.escape(chr(previous))}" if previous > first else ""
            spans.append(re.escape(chr(first)) + last)
            first = code
    return re.compile(f"[{''.join(spans)}]+"), frozenset(cut_before)


class Normalized:
    """A text as a tokenizer normalizes it (`text`), and where each of its characters comes
    from in the text as it was: exact outside the pieces normalization changed; inside one,
    the piece's start (a composed character is where its first part was)."""

    def __init__(self, source: str, text: str, changed: list[tuple[int, int, int, int]]):
        self.source, self.text = source, text
        self._changed = changed  # each piece changed: (start, end) in `text`, in `source`
        self._starts = [piece[0] for piece in changed]

    def original(self, offset: int) -> int:
        """Where character `offset` (0 to len(text)) of `text` is in `source`."""
        index = bisect.bisect_right(self._starts, offset) - 1
        if index < 0:
            return offset
        start, end, source_start, source_end = self._changed[index]
        return source_start if offset < end else source_end + offset - end

    def placed(self, chunks: list[Chunk]) -> list[Chunk]:
        """`chunks` of `text`, with their character ranges in `source`."""
        if self.text is self.source:
            return chunks
        placed = []
        for chunk in chunks:
            start, end = self.original(chunk.char_start), self.original(chunk.char_end)
            own = None if self.source[start:end] == chunk.text else chunk.text
            placed.append(
                Chunk(
                    chunk.index,
                    chunk.token_start,
                    chunk.token_end,
                    start,
                    end,
                    own,
                    self.source,
                    self,
                    chunk.char_start,
                )
            )
        return placed


def normalized(text: str, form: str | None) -> Normalized:
    """`text` in Unicode normalization `form` (NFC, ...; None: as it is), with the way back
    to its offsets. Nearly every text is NFC already: then it is `text` itself, at once."""
    if form is None or unicodedata.is_normalized(form, text):
        return Normalized(text, text, [])
    pieces: list[str] = []
    changed: list[tuple[int, int, int, int]] = []
    at = length = 0  # in `text`, in the normalized text so far
    runs, cut_before = _unstable(form)
    for match in runs.finditer(text):
        start, end = match.start(), match.end()
        if text[start] not in cut_before:
            start = max(start - 1, at)  # from the starter they follow
        if start > at:
            pieces.append(text[at:start])
            length += start - at
        piece = unicodedata.normalize(form, text[start:end])
        if piece != text[start:end]:
            changed.append((length, length + len(piece), start, end))
        pieces.append(piece)
        length += len(piece)
        at = end
    pieces.append(text[at:])
    return Normalized(text, "".join(pieces), changed)


def tokenize_in_pieces(
    text: str,
    tokenize: Callable[[str], list[int]],
    *,
    piece_chars: int = 1 << 16,
    progress: Counted | None = None,
) -> Tokens:
    """The tokens of `text`, tokenized a piece of about `piece_chars` characters at a time.

    Byte-level BPE tokenizers (GPT-2, cl100k, Qwen2, Llama 3) first split text with a regex
    in which no pre-token runs from a non-space character into the space after it; so a
    cut just before such a space (" " after a non-whitespace character) is a boundary the
    whole text has too, and the pieces' tokens joined are the whole text's tokens. Memory
    is the tokenizer's working set for one piece, not for a 50 MB line. A text with no such
    space for a long stretch is cut at the next one found, however far. `progress(done,
    total)` counts characters.
    """
    if piece_chars < 1:
        raise ValueError(f"piece_chars must be at least 1, got {piece_chars}")
    tokens = Tokens()
    start, total = 0, len(text)
    while start < total:
        end = _safe_cut(text, start, start + piece_chars)
        tokens.extend(tokenize(text[start:end]))
        start = end
        if progress is not None:
            progress(start, total)
    return tokens


def _safe_cut(text: str, start: int, target: int) -> int:
    """The cut nearest before `target` (else the first after it) where text[cut] is a space
    and text[cut - 1] is not whitespace; len(text) when there is none."""
    if target >= len(text):
        return len(text)
    cut = text.rfind(" ", start + 1, target + 1)
    while cut > start:
        if not text[cut - 1].isspace():
            return cut
        cut = text.rfind(" ", start + 1, cut)
    cut = text.find(" ", target)
    while cut != -1:
        if not text[cut - 1].isspace():
            return cut
        cut = text.find(" ", cut + 1)
    return len(text)
