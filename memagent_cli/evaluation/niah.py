"""RULER-style needle-in-a-haystack cases built from any document.

As RULER's `niah.py` (NVIDIA, Apache-2.0, the version in the MemAgent repository): a needle
is "One of the special magic numbers for {key} is: {value}." with a word key and a 7-digit
value, inserted between sentences of the haystack; the question asks for the values of one
or more keys. Variants, as RULER's synthetic.yaml defines them on an essay haystack:

- single: one key, one value;
- multikey: four keys, one asked (three distractor needles);
- multivalue: one key with four values, all asked;
- multiquery: four keys, all asked.

Unlike RULER, which scatters needles at random depths, the needle asked for first sits at
the depth requested (a heatmap axis); the others go to seeded random depths. Each case's
document is exactly the requested number of tokens of the tokenizer given, and every case
is a pure function of (seed, variant, length, depth).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memagent_cli.errors import UserError
from memagent_cli.evaluation.data import Case

Tokenize = Callable[[str], Sequence[int]]

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
QUESTION = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize "
    "it. What are all the special magic {kind} for {query} mentioned in the provided text?"
)
KIND = "numbers"


@dataclass(frozen=True)
class Variant:
    keys: int  # needles with distinct keys
    values: int  # values per key
    queries: int  # keys asked for


VARIANTS = {
    "single": Variant(1, 1, 1),
    "multikey": Variant(4, 1, 1),
    "multivalue": Variant(1, 4, 1),
    "multiquery": Variant(4, 1, 4),
}
# RULER's depth grid, from which the other needles' depths are drawn.
_RANDOM_DEPTHS = [round(100 * i / 39) for i in range(40)]
_ADJECTIVES = [
    "amber",
    "brave",
    "calm",
    "dusty",
    "eager",
    "faint",
    "gentle",
    "hollow",
    "icy",
    "jolly",
    "keen",
    "lively",
    "misty",
    "noble",
    "odd",
    "pale",
    "quiet",
    "rapid",
    "rusty",
    "silent",
    "tame",
    "urban",
    "vivid",
    "wary",
    "young",
    "zesty",
    "bitter",
    "crisp",
    "dizzy",
    "early",
    "fancy",
    "grumpy",
    "humble",
    "lucky",
    "mellow",
    "narrow",
    "polite",
    "proud",
    "sturdy",
    "tidy",
]
_NOUNS = [
    "anchor",
    "badge",
    "candle",
    "dolphin",
    "engine",
    "falcon",
    "garden",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "lantern",
    "meadow",
    "needle",
    "orchard",
    "pepper",
    "quarry",
    "ribbon",
    "saddle",
    "tunnel",
    "umbrella",
    "violin",
    "walnut",
    "yacht",
    "zebra",
    "basket",
    "cactus",
    "drum",
    "feather",
    "glacier",
    "hammer",
    "ivy",
    "jungle",
    "kiwi",
    "ladder",
    "mirror",
]
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
_WHOLE = re.compile(r"[.!?][\"')\]]*$")


# Past these, building the cases alone took minutes and gigabytes (a billion depths, a
# haystack of 100M tokens): the paper's longest documents are 3.5M tokens.
MOST_TOKENS = 8 * 1024 * 1024
MOST_DEPTHS = 101


def parse_lengths(text: str) -> list[tuple[str, int]]:
    """`8K,32K,1M` as (label, tokens); K is 1024 tokens and M 1024K, as RULER's lengths."""
    lengths = []
    for part in text.split(","):
        label = part.strip().upper()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)([KM]?)", label)
        if not match:
            raise UserError(f"Cannot read the length {part.strip()!r}; write e.g. 8K,32K,1M.")
        scale = {"": 1, "K": 1024, "M": 1024 * 1024}[match.group(2)]
        tokens = int(float(match.group(1)) * scale)
        if tokens < 64:
            raise UserError(f"The length {label} is too short for a haystack; use 64 or more.")
        if tokens > MOST_TOKENS:
            raise UserError(
                f"The length {label} is past any haystack memagent builds; use at most 8M "
                f"({MOST_TOKENS:,} tokens)."
            )
        lengths.append((label, tokens))
    return lengths


def parse_depths(text: str) -> list[float]:
    """`5`: five depths spread from 0% to 100%; `0,50,100` or `50%`: these percents."""
    text = text.strip()
    try:
        if "," not in text and "%" not in text:
            count = int(text)
            if count < 1:
                raise ValueError
            if count > MOST_DEPTHS:
                raise UserError(f"Give at most {MOST_DEPTHS} depths (one a percent), not {count}.")
            return [0.0] if count == 1 else [round(100 * i / (count - 1), 2) for i in range(count)]
        depths = [float(part.strip().rstrip("%")) for part in text.split(",")]
    except ValueError:
        raise UserError(
            f"Cannot read the depths {text!r}; give a count (5) or percents (0,50,100)."
        ) from None
    if any(not 0 <= d <= 100 for d in depths):
        raise UserError("Depths are percents of the document, from 0 to 100.")
    return depths


def build_cases(
    haystack: str,
    tokenize: Tokenize,
    *,
    lengths: Sequence[tuple[str, int]],
    depths: Sequence[float],
    variant: str,
    seed: int = 0,
) -> list[Case]:
    """One case per (length, depth): a document of exactly that many tokens of `tokenize`
    with the needles in it, the question, and the values a correct answer names."""
    if variant not in VARIANTS:
        raise UserError(f"Unknown needle variant {variant}; choose {', '.join(VARIANTS)}.")
    sentences = split_sentences(haystack)
    if not sentences:
        raise UserError("The haystack document has no text to hide needles in.")
    if not any(_WHOLE.search(sentence) for sentence in sentences):
        raise UserError(
            "The haystack has no sentence ends (. ! ?) to hide needles between; give prose."
        )
    cases = []
    for label, tokens in lengths:
        for depth in depths:
            rng = random.Random(f"{seed}/{variant}/{tokens}/{depth}")
            question, answers, needles = _needles(VARIANTS[variant], rng)
            placed = [(depth, needles[0])] + [(rng.choice(_RANDOM_DEPTHS), n) for n in needles[1:]]
            context = _fit(sentences, placed, tokens, tokenize)
            cases.append(
                Case(
                    id=f"{variant}-{label}-d{depth:g}",
                    group=label,
                    question=question,
                    context=context,
                    answers=tuple(answers),
                    kind="needle",
                    depth=depth,
                )
            )
    return cases


def split_sentences(text: str) -> list[str]:
    """The text's sentences, whitespace collapsed (as RULER flattens its essays)."""
    flat = " ".join(text.split())
    return [s for s in _SENTENCE_END.split(flat) if s]


def _needles(variant: Variant, rng: random.Random) -> tuple[str, list[str], list[str]]:
    """(question, expected values, needles with the ones asked for first)."""
    words = rng.sample([f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS], variant.keys)
    values = [[str(rng.randint(10**6, 10**7 - 1)) for _ in range(variant.values)] for _ in words]
    asked = list(range(variant.queries))  # keys are random already: ask the first ones
    needles = [
        NEEDLE.format(kind=KIND, key=words[k], value=value)
        for k in asked + list(range(variant.queries, variant.keys))
        for value in values[k]
    ]
    queries = [words[k] for k in asked]
    query = queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]
    question, kind = QUESTION, KIND
    if variant.queries * variant.values == 1:  # RULER's singular wording
        question = question.replace("Some", "A").replace("are all", "is").replace("are", "is")
        kind = KIND[:-1]
    answers = [value for k in asked for value in values[k]]
    return question.format(kind=kind, query=query), answers, needles


def _fit(
    sentences: list[str], placed: list[tuple[float, str]], target: int, tokenize: Tokenize
) -> str:
    """The document of exactly `target` tokens: the longest prefix of the (repeated)
    haystack, cut at a character, that with the needles makes `target` tokens."""
    haystack = " ".join(sentences)
    sample = haystack[:20_000]
    chars_per_token = len(sample) / max(1, len(tokenize(sample)))
    repeats = int(target * chars_per_token * 1.3 / len(haystack)) + 1  # a short one repeats
    stream = " ".join([haystack] * repeats)
    count = lambda k: len(tokenize(_assemble(stream, k, placed)))  # noqa: E731
    low, high = 0, len(stream)  # count(low) <= target < count(high)
    if count(low) > target:
        raise UserError(f"The needles alone take more than {target} tokens; ask for more.")
    while (total := count(high)) <= target:
        if total == target:
            return _assemble(stream, high, placed)
        stream, high = stream + " " + haystack, high + 1 + len(haystack)
    # Tokenizing a long document costs: aim with the haystack's characters per token until
    # the crossing is bracketed tightly, then bisect.
    aim = int(target * chars_per_token)
    for _ in range(8):
        if high - low <= 64 or not low < aim < high:
            break
        total = count(aim)
        if total == target:
            return _assemble(stream, aim, placed)
        low, high = (aim, high) if total < target else (low, aim)
        aim += int((target - total) * chars_per_token)
    while high - low > 1:
        middle = (low + high) // 2
        if count(middle) <= target:
            low = middle
        else:
            high = middle
    # Tokens do not grow one per character: look around the crossing for an exact cut.
    for k in sorted(
        range(max(0, low - 256), min(len(stream), low + 256)), key=lambda k: abs(k - low)
    ):
        if count(k) == target:
            return _assemble(stream, k, placed)
    raise UserError(f"No cut of this haystack makes exactly {target} tokens; try another length.")


def _assemble(stream: str, chars: int, placed: list[tuple[float, str]]) -> str:
    """The first `chars` characters of the haystack as sentences with the needles between
    them; a sentence cut short stays last, after any needle at 100%."""
    sentences = split_sentences(stream[:chars])
    cut = sentences.pop() if sentences and not _WHOLE.search(sentences[-1]) else None
    slots: dict[int, list[str]] = {}
    for depth, needle in placed:
        slots.setdefault(int(len(sentences) * depth / 100), []).append(needle)
    parts = []
    for i in range(len(sentences) + 1):
        parts += slots.get(i, [])
        if i < len(sentences):
            parts.append(sentences[i])
    return " ".join(parts + ([cut] if cut else []))
