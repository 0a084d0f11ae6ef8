"""Where an answer came from, as `memagent ask` says it for a real PDF (pages) and a real
EPUB (chapters): through the OpenAI-compatible stand-in server (tests/support/fake_openai.py), here
with a scripted model whose memory takes the password in where the document states it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import builders, fake_openai
from support.command import words
from support.fake_openai import served
from support.story import story

from memagent_cli.trace import read_trace

NEEDLE = "The keeper whispered that the password is PELICAN."
QUESTION = "What is the password for the vault?"
STEPS = ["--chunk-tokens", "100", "--memory-tokens", "64", "--temperature", "0"]
NO_SOURCE = "no source in the document: the final memory does not hold the answer's words"


def _part(message: str, tag: str) -> str | None:
    found = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", message, re.S)
    return None if found is None else found.group(1)


def keeper(answer: str | None):
    """A stand-in model: an update notes the password once its section says it and keeps it
    after; the final reply boxes what the memory noted, or `answer`, a word no memory held."""

    def reply(message: str) -> str:
        memory = _part(message, "memory") or ""
        section = _part(message, "section")
        if section is not None:
            told = "PELICAN" in section or "PELICAN" in memory
            return "The password is PELICAN." if told else "Nothing about the vault yet."
        return f"\\boxed{{{answer or 'PELICAN'}}}"

    return reply


def labelled_pdf(path: Path) -> Path:
    """Pages i, ii, 1, 2, 3, 4 of plain sentences; the password only on page 2."""
    pages = [story(12, fact=None, seed=n) for n in range(6)]
    pages[3] = story(6, fact=None, seed=9) + " " + NEEDLE + " " + story(6, fact=None, seed=10)
    return builders.pdf(path, pages, labels=[("r", None, 1), None, ("D", None, 1)])


def three_chapters(path: Path) -> Path:
    """Chapters "The Storm", "The Keeper" (which states the password), "Harbour"."""
    chapters = [
        ("storm.xhtml", "The Storm", builders.xhtml("The Storm", [story(25, fact=None)])),
        ("keeper.xhtml", "The Keeper",
         builders.xhtml("The Keeper", [story(10, fact=None, seed=2), NEEDLE,
                                       story(10, fact=None, seed=3)])),
        ("harbour.xhtml", "Harbour", builders.xhtml("Harbour", [story(25, fact=None, seed=4)])),
    ]  # fmt: skip
    return builders.epub_book(path, chapters)


BOOKS = {"pdf": (labelled_pdf, "pages"), "epub": (three_chapters, "chapters")}


def ask(memagent, server, monkeypatch, document: Path, answer: str | None = None):
    monkeypatch.setattr(fake_openai, "reply_to", keeper(answer))
    result = memagent("ask", str(document), QUESTION, *served(server, *STEPS, "--json"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), words(result.stderr)


def first_told(server) -> int:
    """The step (from 1) whose section was the first to hold the password, as the server saw
    the prompts: the step the answer came from, found without memagent's own bookkeeping."""
    updates = [m for m in server.messages if _part(m, "section") is not None]
    return next(n for n, m in enumerate(updates, start=1) if "PELICAN" in _part(m, "section"))


@pytest.mark.parametrize("kind", ["pdf", "epub"])
def test_ask_names_the_pages_or_chapters_the_answer_came_from(
    memagent, fake_server, monkeypatch, tmp_path, kind
):
    build, unit = BOOKS[kind]
    out, stderr = ask(memagent, fake_server, monkeypatch, build(tmp_path / f"book.{kind}"))
    assert out["answer"] == "PELICAN"
    total, step = len(out["steps"]), first_told(fake_server)
    assert 1 < step < total  # the password is in the middle of the book, not its first chunk
    [source] = out["evidence"]
    assert set(source) == {"step", "words", "tokens", "chars", unit}
    assert source["step"] == step and source["words"] == ["pelican"]
    place = source[unit]
    # The place is the span of the step that read the password: page 2, chapter "The Keeper".
    read = out["steps"][step - 1]
    assert source["tokens"] == read["tokens"] and source["chars"] == read["chars"]
    if kind == "pdf":
        assert read["span"] == f"p. {place}" and "2" in place.split("–")
        shown = f"{'pp.' if '–' in place else 'p.'} {place}"
    else:
        assert read["span"] == place and "The Keeper" in place.split(" – ")
        shown = place
    # On stderr under the answer, in the words of the issue: "from pp. 131-150, step 7 of 30".
    assert stderr.split("answering from the final memory")[-1].strip() == (
        f"from {shown}, step {step} of {total}"
    )


@pytest.mark.parametrize("kind", ["pdf", "epub"])
def test_an_answer_no_memory_held_is_said_to_have_no_source(
    memagent, fake_server, monkeypatch, tmp_path, kind
):
    build, _ = BOOKS[kind]
    book = build(tmp_path / f"book.{kind}")
    out, stderr = ask(memagent, fake_server, monkeypatch, book, "ALBATROSS")
    assert out["answer"] == "ALBATROSS"
    assert "PELICAN" in out["steps"][-1]["memory"]  # the memory held another answer
    assert out["evidence"] == []  # said, never invented
    # The one line under the answer says so, and names no page, chapter or step.
    assert stderr.split("answering from the final memory")[-1].strip() == NO_SOURCE


def test_scanned_pages_are_named_as_text_pages_are(memagent, fake_server, monkeypatch, tmp_path):
    """The same book scanned (every page an image, read by OCR): the answer comes from the
    page that states the password, named by its printed label, as for the text PDF."""
    text = labelled_pdf(tmp_path / "book.pdf").read_bytes()
    scan = builders.image_pdf(builders.scan(text, dpi=200, angle=0.5), 200)
    labels = [(0, "/r", "", 1), (2, "/D", "", 1)]
    scanned = tmp_path / "scanned.pdf"
    scanned.write_bytes(builders.mix_pdf([(scan, i) for i in range(6)], labels))

    out, stderr = ask(memagent, fake_server, monkeypatch, scanned)

    assert out["document"]["ocr"]["pages"] == ["i", "ii", "1", "2", "3", "4"]
    assert out["document"]["ocr"]["engine"].startswith("Tesseract")
    assert read_trace(Path(out["trace"])).header.document["ocr"] == out["document"]["ocr"]
    assert out["answer"] == "PELICAN"
    [source] = out["evidence"]
    assert "2" in source["pages"].split("–")
    shown = f"{'pp.' if '–' in source['pages'] else 'p.'} {source['pages']}"
    assert stderr.split("answering from the final memory")[-1].strip().startswith(f"from {shown}")
