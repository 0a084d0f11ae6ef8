"""Where an answer came from: the steps whose memory updates brought the answer's words into
the memory and kept them there to the end. A pure function of the answer, the question and
the memories, so a run, a cached run and a trace all say the same.

The rule, on words:

1. The answer is the final reply's last `\\boxed{}` content, else the whole reply (what
   `memagent ask` prints).
2. Words are what `protocol.normalize_answer` leaves (lowercase, no punctuation, no
   articles), split on whitespace.
3. The answer's content words are its distinct words that are in neither the question, the
   prompt templates nor `FUNCTION_WORDS`. When that leaves none: its words that are not
   function words; when that leaves none: all its words. No words at all: nothing to trace.
4. A memory holds a word when the word is one of the memory's words. The answer rests on
   the memory only when the final memory (the one it was answered from) holds at least
   half of its content words; otherwise it has no source, however often its words were
   in earlier memories.
5. A held word entered at the first step of the last unbroken run of steps whose memories
   hold it: the step whose update added it (in the word diff against the memory before)
   after which every memory keeps it.
6. The sources are those steps, earliest first, each with the words it brought in. The
   first is where the answer's content came into the memory; the last is the earliest step
   after which all of it is in the memory and stays there; any between changed it.
7. A step that was shown units a search found besides its chunk (readers/infmem.py): a word
   it brought in is the chunk's when the chunk's text holds it, else the first unit's (in
   the order shown) that holds it; a word neither holds stays the chunk's. Each unit that
   carried a word is a source of its own, placed where the unit is, after its step's chunk.

`trace_answer` applies the rule to memories alone; `sources` places its steps in the
document (its pages or chapters, a `Place`, from the document itself) as a `Source` each:
the evidence a trace records and every view shows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memagent_cli import protocol
from memagent_cli.chunking import Chunk

# Words that carry no content of their own in an English answer: a reply such as "It is
# PELICAN." rests on "pelican", not on "it" and "is".
FUNCTION_WORDS = frozenset(
    [
        "about", "above", "after", "again", "against", "all", "also", "am", "and", "any", "are",
        "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
        "by", "can", "could", "did", "do", "does", "doing", "done", "down", "during", "each",
        "else", "even", "ever", "few", "for", "from", "further", "had", "has", "have", "having",
        "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "however", "i",
        "if", "in", "into", "is", "it", "its", "itself", "just", "me", "might", "more", "most",
        "must", "my", "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only",
        "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should",
        "so", "some", "such", "than", "that", "their", "theirs", "them", "themselves", "then",
        "there", "these", "they", "this", "those", "through", "thus", "to", "too", "under",
        "until", "up", "upon", "us", "very", "was", "we", "were", "what", "when", "where",
        "which", "while", "who", "whom", "whose", "why", "will", "with", "would", "yet", "you",
        "your", "yours", "yourself", "yourselves",
    ]
)  # fmt: skip


def _template_words() -> frozenset[str]:
    """The words of the prompt templates ("memory", "section", "answer", ...): a reply that
    repeats them ("Based on the memory, the answer is ...") adds nothing from the document."""
    text = protocol.UPDATE_TEMPLATE + " " + protocol.FINAL_TEMPLATE
    return frozenset(words(re.sub(r"\{\w*\}", " ", text)))


def words(text: str) -> list[str]:
    """The words of `text` as the rule compares them (rule 2)."""
    return protocol.normalize_answer(text).split()


TEMPLATE_WORDS = _template_words()


@dataclass(frozen=True)
class Entered:
    """A step whose update brought words of the answer into the memory for good (rule 5)."""

    index: int  # the step, counted from 0 (people count from 1)
    words: tuple[str, ...]  # the answer's words it brought in, in the answer's order


@dataclass(frozen=True)
class Provenance:
    """The answer's content words and the steps they came from (none: no source)."""

    words: tuple[str, ...]  # the answer's content words, in the answer's order
    entered: tuple[Entered, ...]  # earliest first; empty when the memory does not hold them

    @property
    def held(self) -> tuple[str, ...]:
        """The content words the final memory holds, in the answer's order."""
        found = {w for step in self.entered for w in step.words}
        return tuple(w for w in self.words if w in found)


@dataclass(frozen=True)
class Place:
    """Where a range of a document is: its pages or its chapters, as the document labels
    them (documents/document.py, `Document.place`); neither in a plain text."""

    pages: str | None = None  # "3", or "3–5" (first–last)
    chapters: str | None = None  # "A", or "A – B"


PlaceOf = Callable[[int, int], Place]  # the Place of a document's characters [start, end)


@dataclass(frozen=True)
class Source:
    """One step the answer came from, and what it read: a piece of an answer's evidence.

    Made here from a reading (`sources`) or read back from a trace (trace/records.py);
    shown as text only by the views, and as JSON only by the trace's records.
    """

    step: int  # counted from 1, as people count
    words: tuple[str, ...]  # the answer's words it brought in; () in traces of memagent 0.1
    tokens: tuple[int, int]  # the chunk it read: its first token and the one after its last
    chars: tuple[int, int]  # the same in characters of the document's text
    pages: str | None = None  # the page labels it read: "3", or "3–5" (first–last)
    chapters: str | None = None  # the chapter it read, or the first and last: "A – B"
    # A unit a search found and the step was shown (rule 7), not the chunk the step read.
    retrieved: bool = False

    @property
    def one_page(self) -> bool:
        """Whether it read a single page (`pages` is that page's label)."""
        return self.pages is not None and "–" not in self.pages


Range = tuple[int, int]
Shown = tuple[Range, Range]  # a unit a step was shown: its tokens and its characters


def sources(
    found: Provenance,
    chunks: Sequence[Chunk],
    place_of: PlaceOf,
    shown: Sequence[Sequence[Shown]] = (),
) -> list[Source]:
    """The steps of `found` placed in the document: `chunks[i]` is what step i read and
    `place_of` the pages or chapters of a character range. `shown[i]`: the units step i
    was shown besides its chunk, if any (rule 7)."""
    placed = []

    def place(step: int, words: tuple[str, ...], tokens: Range, chars: Range, unit: bool) -> None:
        where = place_of(*chars)
        placed.append(
            Source(step, words, tokens, chars, where.pages, where.chapters, retrieved=unit)
        )

    for step in found.entered:
        chunk = chunks[step.index]
        units = shown[step.index] if step.index < len(shown) else ()
        credited = _credited(step.words, chunk, [_text(chunks, chars) for _, chars in units])
        if credited[0] or not any(credited[1:]):
            tokens, chars = (chunk.token_start, chunk.token_end), (chunk.char_start, chunk.char_end)
            place(step.index + 1, credited[0] or step.words, tokens, chars, False)
        for (tokens, chars), words_ in zip(units, credited[1:], strict=True):
            if words_:
                place(step.index + 1, words_, tokens, chars, True)
    return placed


def _text(chunks: Sequence[Chunk], chars: Range) -> str:
    """The document's text in `chars`: a unit may lie in a chunk the reading never reached,
    so from the document the chunks are slices of, else from a chunk that holds it."""
    for chunk in chunks:
        if chunk.document:
            return chunk.document[chars[0] : chars[1]]
    for chunk in chunks:
        if chunk.char_start <= chars[0] and chars[1] <= chunk.char_end:
            return chunk.text[chars[0] - chunk.char_start : chars[1] - chunk.char_start]
    return ""


def _credited(
    brought: tuple[str, ...], chunk: Chunk, units: Sequence[str]
) -> list[tuple[str, ...]]:
    """Rule 7: the words `brought` in that the chunk carried, then those each unit carried."""
    holds = [set(words(chunk.text)), *(set(words(text)) for text in units)]
    owner = {w: next((i for i, held in enumerate(holds) if w in held), 0) for w in brought}
    return [tuple(w for w in brought if owner[w] == i) for i in range(len(holds))]


def place_of_label(span: str, unit: str = "") -> Place:
    """The Place a span label names, where only the label is known (the evidence of
    memagent 0.1, trace/records.py): "p. " and the pages (as `Document.span` writes them),
    else chapters; `unit` ("page", "chapter"), when known, says which."""
    if not span:
        return Place()
    if unit == "page" or (not unit and span.startswith("p. ")):
        return Place(pages=span.removeprefix("p. "))
    return Place(chapters=span)


def content_words(answer: str, question: str) -> tuple[str, ...]:
    """The answer's content words (rule 3), each once, in the answer's order."""
    distinct = tuple(dict.fromkeys(words(answer)))
    asked = set(words(question))
    for left_out in (asked | TEMPLATE_WORDS | FUNCTION_WORDS, FUNCTION_WORDS, frozenset()):
        kept = tuple(w for w in distinct if w not in left_out)
        if kept:
            return kept
    return ()


def trace_answer(answer: str, question: str, memories: Sequence[str]) -> Provenance | None:
    """Where `answer` came from among the memories after each step (rules 1-6); None when
    the answer has no words to trace."""
    wanted = content_words(answer, question)
    if not wanted:
        return None
    held_by = [set(words(memory)) for memory in memories]
    final = held_by[-1] if held_by else set()
    held = [w for w in wanted if w in final]
    if not held or 2 * len(held) < len(wanted):
        return Provenance(wanted, ())
    entered: dict[int, list[str]] = {}
    for word in held:
        step = len(held_by) - 1
        while step > 0 and word in held_by[step - 1]:
            step -= 1
        entered.setdefault(step, []).append(word)
    steps = tuple(Entered(step, tuple(entered[step])) for step in sorted(entered))
    return Provenance(wanted, steps)
