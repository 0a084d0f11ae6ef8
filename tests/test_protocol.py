"""The MemAgent prompts and reply rules, checked against the spec's literal strings."""

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


def test_think_is_stripped_to_after_the_last_marker():
    assert protocol.strip_think("<think>a</think>b</think>memory") == "memory"
    assert protocol.strip_think("no thinking") == "no thinking"


def test_needle_recall():
    assert protocol.needle_recall("codes 123 and 456", ["123", "456", "789"]) == 2 / 3
