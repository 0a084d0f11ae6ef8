"""Provenance: which steps the answer's words came from (memagent_cli/provenance.py), on
memories a scripted backend writes through the real reading loop, and as traces keep it."""

from __future__ import annotations

import json

import pytest
from support import builders
from support.scripted import ScriptedBackend

from memagent_cli.chunking import make_chunks
from memagent_cli.documents import assemble, load_document
from memagent_cli.provenance import Source, content_words, trace_answer
from memagent_cli.reader import Settings, evidence, read
from memagent_cli.trace import FinalRecord, TraceError, evidence_of
from memagent_cli.views.traces import evidence_line, source_place

QUESTION = "What is the password for the vault?"
PAGES = [("1", "a" * 40), ("2", "b" * 40), ("3", "c" * 40), ("4", "d" * 40)]


def run(memories: list[str], reply: str, question: str = QUESTION):
    """The real loop over four 40-character pages, one chunk each, with scripted memories."""
    book = assemble(PAGES, path="book.pdf", format="pdf", sha256="0" * 64, unit="page")
    chunks = make_chunks(list(book.text.encode()), 42, bytes)
    assert len(chunks) == len(memories)
    answer = read(ScriptedBackend([*memories, reply]), question, chunks, Settings(42, 64))
    return answer, book


def sources(memories: list[str], reply: str, question: str = QUESTION):
    found = evidence(run(memories, reply, question)[0])
    return None if found is None else [(s.index + 1, s.words) for s in found.entered]


def test_the_step_that_brought_the_answer_in_and_kept_it():
    memories = [
        "The vault is old.",
        "The password is PELICAN.",
        "PELICAN, says the keeper.",
        "Still pelican.",
    ]
    assert sources(memories, "\\boxed{Pelican}") == [(2, ("pelican",))]


def test_an_answer_dropped_and_read_again_comes_from_where_it_came_back():
    memories = ["Password: PELICAN.", "Nothing yet.", "The password is PELICAN.", "PELICAN."]
    assert sources(memories, "\\boxed{PELICAN}") == [(3, ("pelican",))]


def test_each_word_of_the_answer_names_the_step_that_brought_it():
    memories = [
        "Nothing.",
        "The password is PELICAN.",
        "The password is PELICAN.",
        "The password is PELICAN; the keeper is Ada.",
    ]
    # The answer's content is complete after step 4; step 2 brought its first word.
    assert sources(memories, "\\boxed{PELICAN, kept by Ada}") == [
        (2, ("pelican",)),
        (4, ("ada",)),
    ]


def test_a_later_step_that_rewrote_the_answers_words_is_a_source():
    # The rule: the earliest step after which the answer's content is in the memory
    # and stays there, and any later step that changed it. Step 3 changed "3" to "7".
    memories = [
        "The password is PELICAN 3.",
        "The password is PELICAN 3.",
        "The password is now PELICAN 7.",
        "PELICAN 7, says the keeper.",
    ]
    assert sources(memories, "\\boxed{PELICAN 7}") == [(1, ("pelican",)), (3, ("7",))]
    # Rewritten to another word and back: the answer's word came from where it came back.
    memories = [
        "The password is PELICAN.",
        "The password is HERON.",
        "The password is PELICAN after all.",
        "PELICAN.",
    ]
    assert sources(memories, "\\boxed{PELICAN}") == [(3, ("pelican",))]


def test_a_later_step_that_reworded_the_memory_around_the_answer_is_not_a_source():
    # After step 2 every memory holds the answer's one word: later steps changed the text
    # around it, not the answer's content, which the rule compares word by word.
    memories = [
        "Nothing.",
        "Maybe the password is PELICAN.",
        "The password is surely PELICAN; the keeper said so.",
        "PELICAN.",
    ]
    assert sources(memories, "\\boxed{PELICAN}") == [(2, ("pelican",))]


@pytest.mark.parametrize(
    "memories",
    [
        ["The vault is old.", "The keeper left.", "Rain.", "The tower fell."],  # never there
        ["The password is PELICAN.", "PELICAN.", "PELICAN.", "The tower fell."],  # lost at the end
    ],
    ids=["in-no-memory", "not-in-the-final-memory"],
)
def test_an_answer_the_final_memory_does_not_hold_has_no_source(memories):
    answer, book = run(memories, "\\boxed{PELICAN}")
    found = evidence(answer)
    assert found is not None and found.words == ("pelican",) and found.entered == ()
    assert evidence_of(answer, book.place) == []  # said, never invented


def test_the_final_memory_must_hold_half_of_the_answers_content_words():
    memories = ["Nothing.", "Nothing.", "Nothing.", "The keeper is Ada."]
    assert sources(memories, "\\boxed{Ada Lovelace Byron}") == []  # one of three
    assert sources(memories, "\\boxed{Ada Lovelace}") == [(4, ("ada",))]  # one of two


def test_question_words_template_words_and_function_words_are_not_the_answers_content():
    assert content_words("The password for the vault is PELICAN.", QUESTION) == ("pelican",)
    reply = "Based on the memory provided, the answer is PELICAN."
    assert content_words(reply, QUESTION) == ("pelican",)
    # When nothing else is left, the words the question shares count; then any word at all.
    assert content_words("the vault", QUESTION) == ("vault",)
    assert content_words("It is.", QUESTION) == ("it", "is")
    assert content_words("?!", QUESTION) == ()


def test_without_a_box_the_raw_reply_is_traced_as_ask_prints_it():
    memories = ["Nothing.", "The vault is old.", "The password is PELICAN.", "PELICAN, PELICAN."]
    assert sources(memories, "The secret password for the vault is PELICAN.") == [(3, ("pelican",))]
    assert sources(memories, "I cannot tell.") == []  # "tell" is in no memory
    assert sources(memories, "...") is None  # nothing to trace


def test_trace_answer_with_no_memories_has_no_source():
    found = trace_answer("PELICAN", QUESTION, [])
    assert found is not None and found.entered == ()


def test_the_final_record_places_each_source_on_its_pages():
    memories = ["Nothing.", "The password is PELICAN.", "PELICAN.", "PELICAN, keeper Ada."]
    answer, book = run(memories, "\\boxed{PELICAN and Ada}")
    record = FinalRecord.of(answer, book.place).to_json()
    # Each 42-byte chunk is one 40-character page and the blank line after it.
    assert record["evidence"] == [
        {"step": 2, "words": ["pelican"], "tokens": [42, 84], "chars": [42, 84], "pages": "2"},
        {"step": 4, "words": ["ada"], "tokens": [126, 166], "chars": [126, 166], "pages": "4"},
    ]
    again = FinalRecord.parse(json.loads(json.dumps(record)), "t")
    assert again.to_json() == record
    assert again.evidence == [
        Source(2, ("pelican",), (42, 84), (42, 84), pages="2"),
        Source(4, ("ada",), (126, 166), (126, 166), pages="4"),
    ]


def test_a_reading_of_a_real_pdf_gives_sources_on_its_labelled_pages(tmp_path):
    """A PDF whose pages are labelled i, ii, 1, 2, read in 33-byte chunks (i; ii; ii to 2;
    2) through the real loop: the answer's two words entered at the last two steps."""
    pages = [
        "Alpha bravo charlie delta echo.",
        "Foxtrot golf hotel india juliet.",
        "The password is PELICAN.",
        "The keeper is Ada.",
    ]
    labels = [("r", None, 1), None, ("D", None, 1)]
    path = builders.pdf(tmp_path / "book.pdf", pages, labels=labels)
    book = load_document(str(path), use_cache=False)
    chunks = make_chunks(list(book.text.encode()), 33, bytes)
    memories = ["Nothing.", "Nothing.", "The password is PELICAN.", "PELICAN; the keeper is Ada."]
    backend = ScriptedBackend([*memories, "\\boxed{PELICAN, kept by Ada}"])
    answer = read(backend, QUESTION, chunks, Settings(33, 64))
    found = trace_answer(answer.answer or "", QUESTION, [s.memory for s in answer.steps])
    assert found is not None and [(e.index, e.words) for e in found.entered] == [
        (2, ("pelican",)),
        (3, ("ada",)),
    ]
    sources = evidence_of(answer, book.place)
    assert sources == [
        Source(3, ("pelican",), (66, 99), (66, 99), pages="ii–2"),
        Source(4, ("ada",), (99, 111), (99, 111), pages="2"),
    ]
    assert [s.one_page for s in sources] == [False, True]
    assert [source_place(s) for s in sources] == ["pp. ii–2", "p. 2"]
    assert evidence_line(sources, len(chunks)) == (
        "from pp. ii–2, step 3 of 4 (pelican); p. 2, step 4 of 4 (ada)"
    )
    record = FinalRecord.of(answer, book.place).to_json()
    assert record["evidence"] == [
        {"step": 3, "words": ["pelican"], "tokens": [66, 99], "chars": [66, 99], "pages": "ii–2"},
        {"step": 4, "words": ["ada"], "tokens": [99, 111], "chars": [99, 111], "pages": "2"},
    ]
    assert FinalRecord.parse(json.loads(json.dumps(record)), "t").evidence == sources


def test_an_old_single_evidence_record_still_reads():
    old = {
        "type": "final", "reply": "\\boxed{PELICAN}", "answer": "PELICAN",
        "evidence": {"step": 1, "span": "p. i–1", "tokens": [60, 120], "chars": [60, 120]},
        "prompt_tokens": 9, "completion_tokens": 3, "finish_reason": "stop", "seconds": 1.0,
    }  # fmt: skip
    assert FinalRecord.parse(old, "t").evidence == [
        Source(2, (), (60, 120), (60, 120), pages="i–1")
    ]
    assert FinalRecord.parse(old, "t").to_json()["evidence"] == [
        {"step": 2, "words": [], "tokens": [60, 120], "chars": [60, 120], "pages": "i–1"}
    ]
    chapters = old | {"evidence": old["evidence"] | {"span": "Intro – Chapter 2"}}
    assert FinalRecord.parse(chapters, "t").evidence[0].chapters == "Intro – Chapter 2"
    # memagent 0.1 wrote None when the answer's text was in no memory.
    assert FinalRecord.parse(old | {"evidence": None}, "t").evidence == []
    assert FinalRecord.parse(old | {"evidence": None, "answer": None}, "t").evidence is None


@pytest.mark.parametrize(
    "evidence",
    [["step 2"], [{"step": "2", "tokens": [0, 1], "chars": [0, 1]}], [{"step": 2}]],
    ids=["not-an-object", "mistyped-step", "no-tokens"],
)
def test_a_damaged_evidence_list_is_one_sentence(evidence):
    record = {
        "reply": "r", "answer": "a", "evidence": evidence,
        "prompt_tokens": 1, "completion_tokens": 1, "finish_reason": "stop", "seconds": 1.0,
    }  # fmt: skip
    with pytest.raises(TraceError, match="line 9"):
        FinalRecord.parse(record, "t.jsonl, line 9")


def test_a_source_is_placed_by_the_document_not_by_its_label():
    """A chapter whose title reads like a page label ("p. 5 ...") is a chapter: the place
    comes from the document's sections (Document.place), not from the span's text."""
    parts = [("p. 5 Reflections", "a" * 40), ("Coda", "b" * 40)]
    book = assemble(parts, path="b.epub", format="epub", sha256="0" * 64, unit="chapter")
    chunks = make_chunks(list(book.text.encode()), 42, bytes)
    memories = ["The password is PELICAN.", "PELICAN."]
    answer = read(
        ScriptedBackend([*memories, "\\boxed{PELICAN}"]), QUESTION, chunks, Settings(42, 64)
    )
    assert book.span(0, 42) == "p. 5 Reflections"
    assert evidence_of(answer, book.place) == [
        Source(1, ("pelican",), (0, 42), (0, 42), chapters="p. 5 Reflections")
    ]
