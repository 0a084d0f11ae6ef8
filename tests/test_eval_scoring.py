"""Scoring as the authors' ruler_hqa.py / ruler_general.py, against hand-computed cases."""

from __future__ import annotations

import pytest

from memagent_cli import protocol
from memagent_cli.evaluation.scoring import (
    Score,
    boxed_answer,
    f1_score,
    prediction_of,
    score_reply,
    sub_em,
)


def qa(reply: str, gold: str) -> Score:
    return score_reply(reply, [gold], "qa")


@pytest.mark.parametrize(
    ("reply", "gold", "sub_em", "em", "f1"),
    [
        # Articles, case and punctuation are normalized away on both sides.
        ("So: \\boxed{The Eiffel Tower}.", "eiffel tower", 1.0, 1.0, 1.0),
        ("\\boxed{a cat}", "the cat", 1.0, 1.0, 1.0),
        ("\\boxed{U.S.A.}", "USA", 1.0, 1.0, 1.0),
        ("\\boxed{PARIS!}", "paris", 1.0, 1.0, 1.0),
        # Gold inside the prediction: sub_em only; f1 = 2*(1/2)*(1/1)/(1/2+1) = 0.67.
        ("\\boxed{Barack Obama}", "Obama", 1.0, 0.0, 0.67),
        # Prediction inside the gold: precision 1, recall 1/3, f1 = 0.5.
        ("\\boxed{Wright}", "Frank Lloyd Wright", 1.0, 0.0, 0.5),
        # Shared words but neither contains the other: 2 of 3 words, f1 = 0.67.
        ("\\boxed{New York City}", "York City Hall", 0.0, 0.0, 0.67),
        ("\\boxed{London}", "Paris", 0.0, 0.0, 0.0),
        # yes/no answers must match exactly for f1, not for sub_em.
        ("\\boxed{yes it is}", "yes", 1.0, 0.0, 0.0),
        ("\\boxed{no}", "yes", 0.0, 0.0, 0.0),
    ],
)
def test_hand_computed_scores(reply, gold, sub_em, em, f1):
    assert qa(reply, gold) == Score(prediction_of(reply), sub_em, em, f1)


def test_the_last_of_several_boxes_is_the_prediction():
    score = qa("First \\boxed{London}, then on reflection \\boxed{Paris}.", "Paris")
    assert score.prediction == "Paris"
    assert (score.sub_em, score.em, score.f1) == (1.0, 1.0, 1.0)


def test_no_box_or_an_empty_box_scores_zero_even_when_the_reply_names_the_gold():
    # The authors score the boxed content only: a prose reply gets nothing.
    assert qa("The answer is Paris.", "Paris") == Score(None, 0.0, 0.0, 0.0)
    assert qa("\\boxed{}", "Paris") == Score("", 0.0, 0.0, 0.0)
    assert qa("", "Paris") == Score(None, 0.0, 0.0, 0.0)


def test_an_answer_that_normalizes_to_nothing_counts_as_contained_as_in_the_authors_code():
    # Their sub_exact_match_score has no guard: "" is in every string.
    score = qa("\\boxed{The.}", "Paris")
    assert (score.sub_em, score.em, score.f1) == (1.0, 0.0, 0.0)


def test_braces_inside_the_box_are_kept_and_normalized_as_text():
    score = qa("\\boxed{\\text{Paris}}", "Paris")
    assert score.prediction == "\\text{Paris}"
    # normalize: "\text{paris}" -> "textparis", which contains "paris"; one word each.
    assert (score.sub_em, score.em, score.f1) == (1.0, 0.0, 0.0)


def test_only_the_part_after_the_last_think_is_read():
    assert prediction_of("<think>\\boxed{London}</think>\n\\boxed{Paris}") == "Paris"
    # Nothing after </think>: the authors fall back to the whole response.
    assert prediction_of("<think>maybe \\boxed{Rome}</think>  ") == "Rome"


def test_the_authors_box_variants_and_where_ask_differs():
    assert boxed_answer("\\boxed Paris$ and more") == "Paris"
    # The last box unclosed: the authors find nothing, `ask` falls back to the earlier box.
    text = "\\boxed{Paris} and then \\boxed{Lon"
    assert boxed_answer(text) is None
    assert protocol.extract_boxed(text) == "Paris"
    # \fbox trips an assertion in the authors' extraction: it never scores.
    assert boxed_answer("\\fbox{Paris}") is None
    # Where both see a closed last box, they agree.
    for reply in ("\\boxed{a{b}c}", "x \\boxed{1} y \\boxed{2} z", "\\boxed{}", "no box"):
        assert boxed_answer(reply) == protocol.extract_boxed(reply)


def test_normalize_answer_is_the_authors():
    # lower -> drop punctuation -> drop articles -> collapse whitespace, in that order:
    # "The-An" loses its hyphen first and becomes one word, not two articles.
    assert protocol.normalize_answer("  The-An  APPLE, a day!  ") == "thean apple day"
    assert protocol.normalize_answer("theatre") == "theatre"


def test_f1_counts_repeated_words_once_per_match():
    # pred "paris paris" vs gold "paris": one common word, p = 1/2, r = 1, f1 = 2/3.
    assert f1_score("paris paris", "paris") == pytest.approx(2 / 3)


def test_needle_cases_score_the_fraction_of_values_found():
    values = ["1234567", "7654321", "5555555"]
    one = score_reply("\\boxed{1234567 and 9999999}", values, "needle")
    assert one == Score("1234567 and 9999999", 0.33, None, None)  # 1/3, rounded as theirs
    assert score_reply("\\boxed{7654321, 5555555, 1234567}", values, "needle").sub_em == 1.0
    # Values are matched ignoring case; no box scores nothing.
    assert score_reply("\\boxed{ABC-def}", ["abc-DEF"], "needle").sub_em == 1.0
    assert score_reply("1234567", values, "needle").sub_em == 0.0


def test_sub_em_normalizes_both_ways_and_an_empty_box_scores_zero():
    assert sub_em("The Eiffel Tower, in Paris.", "eiffel tower")
    assert sub_em("Paris", "paris france")
    assert not sub_em("London", "Paris")
    assert score_reply("\\boxed{}", ["Paris"], "qa").sub_em == 0.0
    assert score_reply("no box at all", ["Paris"], "qa").sub_em == 0.0
