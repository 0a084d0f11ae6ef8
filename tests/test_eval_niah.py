"""`eval niah` cases: exact token lengths, the needle at its depth, RULER's variants, seeds."""

from __future__ import annotations

import re

import pytest
from support.story import story

from memagent_cli.backends import tokenizers
from memagent_cli.errors import UserError
from memagent_cli.evaluation import niah


@pytest.fixture(scope="module")
def tokenize():
    # A real byte-level BPE tokenizer (offline tiktoken); the CLI passes the model's own.
    return tokenizers.encoding().encode


@pytest.fixture(scope="module")
def haystack() -> str:
    return story(600, fact=None)  # about 6.6K tokens of plain sentences


NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")


def build(haystack, tokenize, variant="single", lengths="1K,3000", depths="0,25,50,75,100", seed=0):
    return niah.build_cases(
        haystack,
        tokenize,
        lengths=niah.parse_lengths(lengths),
        depths=niah.parse_depths(depths),
        variant=variant,
        seed=seed,
    )


def test_every_document_has_exactly_the_tokens_asked_for(haystack, tokenize):
    cases = build(haystack, tokenize)
    assert [c.group for c in cases] == ["1K"] * 5 + ["3000"] * 5
    for case in cases:
        expected = 1024 if case.group == "1K" else 3000
        assert len(tokenize(case.context)) == expected
        assert case.context == case.context.strip()  # what `ask` reads after stripping


def test_the_needle_sits_at_its_depth_between_sentences(haystack, tokenize):
    for case in build(haystack, tokenize, lengths="3000"):
        (found,) = NEEDLE.finditer(case.context)
        assert found.group(2) == case.answers[0]
        assert found.group(1) in case.question
        at = len(tokenize(case.context[: found.start()])) / len(tokenize(case.context))
        # A sentence of the haystack is about 11 tokens: 1% of 3000 tokens is plenty.
        assert at == pytest.approx(case.depth / 100, abs=0.01)
        # Sentence boundaries: the needle starts the text or follows a full stop.
        before = case.context[: found.start()]
        assert before == "" or before.endswith(". ")


def test_a_haystack_shorter_than_the_length_repeats(haystack, tokenize):
    (case,) = build(haystack, tokenize, lengths="16K", depths="50%")
    assert len(tokenize(case.context)) == 16 * 1024
    assert len(NEEDLE.findall(case.context)) == 1


def test_cases_are_reproducible_from_the_seed(haystack, tokenize):
    first = build(haystack, tokenize, variant="multikey", lengths="1K", depths="3")
    again = build(haystack, tokenize, variant="multikey", lengths="1K", depths="3")
    other = build(haystack, tokenize, variant="multikey", lengths="1K", depths="3", seed=1)
    assert first == again
    assert [c.answers for c in first] != [c.answers for c in other]


def test_ruler_variants(haystack, tokenize):
    def one(variant):
        (case,) = build(haystack, tokenize, variant=variant, lengths="2K", depths="40%")
        return case, NEEDLE.findall(case.context)

    case, needles = one("single")
    assert len(needles) == 1 and case.answers == (needles[0][1],)
    assert case.question.startswith("A special magic number is hidden within the following")
    assert f"What is the special magic number for {needles[0][0]} mentioned" in case.question

    case, needles = one("multikey")  # three distractors with other keys, one asked
    assert len({key for key, _ in needles}) == 4 and len(case.answers) == 1
    asked = [key for key, _ in needles if key in case.question]
    assert len(asked) == 1 and dict(needles)[asked[0]] == case.answers[0]

    case, needles = one("multivalue")  # one key, four values, all asked
    assert len({key for key, _ in needles}) == 1 and len(needles) == 4
    assert sorted(case.answers) == sorted(value for _, value in needles)
    assert case.question.startswith("Some special magic numbers are hidden")

    case, needles = one("multiquery")  # four keys, all asked
    keys = [key for key, _ in needles]
    assert len(set(keys)) == 4 and all(key in case.question for key in keys)
    assert ", and " in case.question
    assert sorted(case.answers) == sorted(value for _, value in needles)
    for variant in niah.VARIANTS:
        assert len(tokenize(one(variant)[0].context)) == 2048


def test_depth_and_length_parsing():
    assert niah.parse_depths("5") == [0, 25, 50, 75, 100]
    assert niah.parse_depths("1") == [0.0]
    assert niah.parse_depths("10, 90%") == [10.0, 90.0]
    assert niah.parse_lengths("8K,32k,1M,5000") == [
        ("8K", 8192),
        ("32K", 32768),
        ("1M", 1048576),
        ("5000", 5000),
    ]
    for bad in ("0", "x", "120%", "-5,10"):
        with pytest.raises(UserError):
            niah.parse_depths(bad)
    for bad in ("8Q", "", "10"):
        with pytest.raises(UserError):
            niah.parse_lengths(bad)


def test_lengths_and_depths_past_any_run_are_one_sentence_at_once():
    """`--depths 1000000000` built a billion depths (minutes, gigabytes, no word);
    `--lengths 99999999999999999999K` ended in MemoryError, 100M in a haystack built for
    minutes."""
    assert niah.parse_lengths("8M")[0][1] == 8 * 1024 * 1024
    assert len(niah.parse_depths("101")) == 101
    with pytest.raises(UserError, match="at most 8M"):
        niah.parse_lengths("8K,100M")
    with pytest.raises(UserError, match="at most 8M"):
        niah.parse_lengths("99999999999999999999K")
    with pytest.raises(UserError, match="at most 101 depths"):
        niah.parse_depths("1000000000")


def test_unusable_requests_are_one_sentence(haystack, tokenize):
    with pytest.raises(UserError, match="Unknown needle variant"):
        build(haystack, tokenize, variant="haystack")
    with pytest.raises(UserError, match="no text"):
        build("   ", tokenize)
    with pytest.raises(UserError, match="no sentence ends"):
        build("words without an end " * 100, tokenize)
    with pytest.raises(UserError, match="needles alone"):
        build(haystack, tokenize, variant="multivalue", lengths="64")
