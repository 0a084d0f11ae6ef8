"""The MemAgent prompts and reply rules, checked against the spec's literal strings."""

import random

import pytest
from support.deadline import deadline

from memagent_cli import protocol

# Copied by hand from the authors' templates (the project's protocol spec), not from the code
# under test.
SPEC_UPDATE = "You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\n<section>\n{chunk}\n</section>\n\nUpdated memory:\n"  # noqa: E501
SPEC_FINAL = "You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.\n\n<problem> \n{prompt}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"  # noqa: E501


def test_templates_are_byte_exact():
    assert protocol.UPDATE_TEMPLATE == SPEC_UPDATE
    assert protocol.FINAL_TEMPLATE == SPEC_FINAL
    assert protocol.INITIAL_MEMORY == "No previous memory"


def test_rendered_update_prompt():
    rendered = protocol.render_update("Who?", "No previous memory", "Alice met Bob.")
    assert rendered == (
        "You are presented with a problem, a section of an article that may contain the "
        "answer to the problem, and a previous memory. Please read the provided section "
        "carefully and update the memory with the new information that helps to answer the "
        "problem. Be sure to retain all relevant details from the previous memory while "
        "adding any new, useful information.\n\n<problem> \nWho?\n</problem>\n\n<memory>\n"
        "No previous memory\n</memory>\n\n<section>\nAlice met Bob.\n</section>\n\n"
        "Updated memory:\n"
    )


def test_rendered_final_prompt_asks_for_boxed():
    rendered = protocol.render_final("Who?", "Bob did it.")
    assert rendered == (
        "You are presented with a problem and a previous memory. Please answer the problem "
        "based on the previous memory and put the answer in \\boxed{}.\n\n<problem> \nWho?\n"
        "</problem>\n\n<memory>\nBob did it.\n</memory>\n\nYour answer:\n"
    )


def test_text_with_braces_is_not_reinterpreted():
    rendered = protocol.render_update("{q}", "{memory}", "a {chunk} b")
    assert "<problem> \n{q}\n" in rendered
    assert "<section>\na {chunk} b\n" in rendered


def test_boxed_takes_the_last_box():
    assert protocol.extract_boxed("\\boxed{one} and then \\boxed{two}") == "two"


def test_boxed_matches_nested_braces():
    assert protocol.extract_boxed("so \\boxed{\\frac{1}{2} {x}} done") == "\\frac{1}{2} {x}"


def test_boxed_absent_or_unclosed():
    assert protocol.extract_boxed("no box here") is None
    assert protocol.extract_boxed("\\boxed{open") is None
    assert protocol.extract_boxed("\\boxed{ok} then \\boxed{cut") == "ok"
    assert protocol.extract_boxed("\\boxed{}") == ""


def boxed_by_rescanning(reply: str) -> str | None:
    """The rule scanned from each box in turn, last first: quadratic, for short replies."""
    marker = "\\boxed{"
    start = reply.rfind(marker)
    while start >= 0:
        depth = 0
        for i in range(start + len(marker) - 1, len(reply)):
            depth += {"{": 1, "}": -1}.get(reply[i], 0)
            if reply[i] == "}" and depth == 0:
                return reply[start + len(marker) : i]
        start = reply.rfind(marker, 0, start)
    return None


def test_boxed_agrees_with_the_rule_scanned_box_by_box():
    rng = random.Random(47)
    pieces = ["\\boxed{", "\\boxed", "{", "}", "a", " ", "\\fbox{"]
    for _ in range(20_000):
        reply = "".join(rng.choices(pieces, k=rng.randint(0, 12)))
        assert protocol.extract_boxed(reply) == boxed_by_rescanning(reply), repr(reply)


@pytest.mark.parametrize(
    "unit", ["\\boxed{", "\\boxed{}}", "\\boxed{{"], ids=["open", "closed", "nested"]
)
def test_boxed_of_a_hostile_reply_takes_linear_time(unit):
    reply = unit * (int(1.25 * 2**20) // len(unit))
    with deadline(1.0):
        protocol.extract_boxed(reply)


def test_think_is_stripped_to_after_the_last_marker():
    assert protocol.strip_think("<think>a</think>b</think>memory") == "memory"
    assert protocol.strip_think("no thinking") == "no thinking"


def test_needle_recall():
    assert protocol.needle_recall("codes 123 and 456", ["123", "456", "789"]) == 2 / 3
