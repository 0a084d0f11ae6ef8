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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memagent_cli import protocol

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
class Source:
    """A step whose update brought words of the answer into the memory for good."""

    index: int  # the step, counted from 0 (people count from 1)
    words: tuple[str, ...]  # the answer's words it brought in, in the answer's order


@dataclass(frozen=True)
class Provenance:
    """The answer's content words and the steps they came from (none: no source)."""

    words: tuple[str, ...]  # the answer's content words, in the answer's order
    sources: tuple[Source, ...]  # earliest first; empty when the memory does not hold them

    @property
    def held(self) -> tuple[str, ...]:
        """The content words the final memory holds, in the answer's order."""
        found = {w for source in self.sources for w in source.words}
        return tuple(w for w in self.words if w in found)


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
    sources = tuple(Source(step, tuple(entered[step])) for step in sorted(entered))
    return Provenance(wanted, sources)
