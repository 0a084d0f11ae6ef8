"""PDF and EPUB through the command line: inspect, provenance in ask, and bad books."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import builders
from support.command import assert_clean_failure
from support.story import FACT, FACT_QUESTION, story

from memagent_cli.trace import read_trace

TIKTOKEN = ["--tokenizer", "tiktoken"]  # pages and spans need no model file


def labelled_pdf(path: Path) -> Path:
    """Two front-matter pages (i, ii) and four numbered pages (1-4) of plain sentences."""
    pages = [FACT + " " + story(25, fact=None, seed=n) for n in range(6)]
    return builders.pdf(path, pages, labels=[("r", None, 1), None, ("D", None, 1)])


def test_inspect_pdf_shows_pages_and_chunk_spans(memagent, tmp_path):
    path = labelled_pdf(tmp_path / "manual.pdf")
    result = memagent("inspect", str(path), "--chunk-tokens", "400", *TIKTOKEN, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["document"]["format"] == "pdf" and report["document"]["pages"] == 6
    assert report["tokenizer"]["exact"] is False  # tiktoken: no model file needed
    chunks = report["chunks"]
    assert len(chunks) == -(-report["tokens"] // 400) > 1
    assert chunks[0]["span"].startswith("p. i")
    assert chunks[-1]["span"].endswith("4")
    assert report["estimate"] is None


def test_inspect_table_names_the_pages(memagent, tmp_path):
    path = labelled_pdf(tmp_path / "manual.pdf")
    result = memagent("inspect", str(path), "--chunk-tokens", "400", *TIKTOKEN)
    assert result.returncode == 0, result.stderr
    assert "pages" in result.stdout and "p. i" in result.stdout


def test_inspect_epub_with_tiktoken_offline(memagent, tmp_path):
    chapters = [
        ("one.xhtml", "The Storm", builders.xhtml("The Storm", [story(20, fact=None)])),
        ("two.xhtml", "Harbour", builders.xhtml("Harbour", [story(20, fact=None, seed=2)])),
    ]
    path = builders.epub_book(tmp_path / "book.epub", chapters, spine=[1, 0])
    result = memagent(
        "inspect", str(path), "--tokenizer", "tiktoken", "--chunk-tokens", "100", "--json"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokenizer"] == {"kind": "tiktoken", "encoding": "cl100k_base", "exact": False}
    assert report["document"]["format"] == "epub" and report["document"]["sections"] == 2
    assert report["chunks"][0]["span"].startswith("Harbour")  # spine order, not manifest
    assert report["chunks"][-1]["span"].endswith("The Storm")


def test_inspect_unknown_tiktoken_encoding(memagent, tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello")
    result = memagent("inspect", str(path), "--tokenizer", "tiktoken", "--encoding", "nope")
    assert_clean_failure(result, 1, "Unknown tiktoken encoding nope")


def bad_books(tmp_path: Path) -> dict[str, tuple[Path, list[str], str]]:
    labelled_pdf(tmp_path / "good.pdf")
    locked = builders.pdf(tmp_path / "locked.pdf", ["secret text"], password="pw")
    epub = builders.epub_book(
        tmp_path / "b.epub", [("c.xhtml", "C", builders.xhtml("C", ["text"]))]
    )
    random_pdf = tmp_path / "random.pdf"
    random_pdf.write_bytes(bytes(range(256)) * 20)
    return {
        "truncated": (builders.truncate(tmp_path / "good.pdf"), [], "damaged"),
        "random bytes": (random_pdf, [], "cannot be read"),
        "no password": (locked, [], "is encrypted; pass --password"),
        "wrong password": (locked, ["--password", "nope"], "password"),
        "epub without opf": (builders.rewrite_zip(epub, drop=["EPUB/content.opf"]), [], "EPUB"),
    }


@pytest.mark.parametrize(
    "case",
    ["truncated", "random bytes", "no password", "wrong password", "epub without opf"],
)
def test_bad_books_get_one_sentence(memagent, tmp_path, case):
    path, extra, phrase = bad_books(tmp_path)[case]
    result = memagent("inspect", str(path), *TIKTOKEN, *extra)
    assert_clean_failure(result, 1, phrase)
    assert len(result.stderr.strip().splitlines()) <= 2


def test_a_scan_with_ocr_never_is_counted_by_inspect_and_refused_by_ask(memagent, tmp_path):
    """docs/ocr.md: `inspect --ocr never` gives the count (and the estimate) of a scan; `ask`
    has nothing to read in it and says which --ocr reads it."""
    path = builders.pdf(tmp_path / "scan.pdf", [None, None])
    counted = memagent("inspect", str(path), *TIKTOKEN, "--ocr", "never", "--json")
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)["document"]["pages_needing_ocr"] == 2
    asked = memagent("ask", str(path), "Who?", "-m", "nope.gguf", "--ocr", "never")
    assert_clean_failure(asked, 1, "--ocr auto")


def test_the_right_password_opens_an_encrypted_pdf(memagent, tmp_path):
    path = builders.pdf(tmp_path / "locked.pdf", ["secret text"], password="pw")
    result = memagent("inspect", str(path), *TIKTOKEN, "--password", "pw", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["document"]["characters"] == len("secret text")


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_ask_a_pdf_records_page_spans(memagent, tmp_path):
    path = labelled_pdf(tmp_path / "manual.pdf")
    trace_path = tmp_path / "t.jsonl"
    result = memagent(
        "ask",
        str(path),
        FACT_QUESTION,
        "--chunk-tokens",
        "700",
        "--memory-tokens",
        "64",
        "--temperature",
        "0",
        "--json",
        "--trace",
        str(trace_path),
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    spans = [s["span"] for s in answer["steps"]]
    assert spans[0].startswith("p. i") and spans[-1].endswith("4")
    assert [s.span for s in read_trace(trace_path).steps] == spans
    for source in answer["evidence"] or []:  # the steps the answer came from, if any
        assert "p. " + source["pages"] == spans[source["step"] - 1]
    assert "p. i" in result.stderr  # the progress lines name the pages being read


def test_an_encoding_not_available_offline_is_one_sentence(memagent, env, tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello")
    # No package ships o200k_base; a proxy that refuses keeps tiktoken's download attempt
    # on this machine.
    env["HTTPS_PROXY"] = env["HTTP_PROXY"] = "http://127.0.0.1:9"
    result = memagent("inspect", str(path), "--tokenizer", "tiktoken", "--encoding", "o200k_base")
    assert_clean_failure(result, 1, "o200k_base is not available offline")


INSPECT = ("--tokenizer", "tiktoken", "--json")


# -- PDFs that are not what they say ----------------------------------------------------------


def test_text_that_starts_like_a_pdf_offers_format_text(memagent, tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("%PDF-1.7 is the first line of every PDF; these are notes about it.\n")

    result = memagent("inspect", str(path), *INSPECT)

    assert_clean_failure(result, 1, "looks like a damaged PDF", "--format text")


def test_binary_that_starts_like_a_pdf_is_only_damaged(memagent, tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"%PDF-1.7\n" + bytes(range(128, 256)) * 30)

    result = memagent("inspect", str(path), *INSPECT)

    assert_clean_failure(result, 1, "is damaged or not a PDF")
    assert "--format" not in result.stderr


def test_a_pdf_whose_pages_all_fail_to_decompress_is_damaged_not_scanned(
    memagent, tmp_path
) -> None:
    path = builders.pdf(tmp_path / "a.pdf", ["Page one text.", "Page two text."])
    builders.corrupt_page_streams(path, [0, 1], builders.scramble)

    result = memagent("inspect", str(path), *INSPECT)

    assert_clean_failure(result, 1, "a.pdf is damaged: pypdf could not decode the content")
    assert "OCR" not in result.stderr


# -- Rich markup in text that comes from the user's files -------------------------------------

MARKUP = "[/bold][red]x[/]"


def test_markup_in_a_file_name_is_printed_as_text(memagent, tmp_path: Path) -> None:
    (tmp_path / "[red]x[").mkdir()  # a "/" in markup is a folder in a path
    path = tmp_path / "[red]x[" / "bold].txt"
    path.write_text("A short story about the sea.")

    result = memagent("inspect", str(path), "--tokenizer", "tiktoken")

    assert result.returncode == 0, result.stderr
    assert "[red]x[/bold].txt" in result.stdout


def test_markup_in_a_pdf_title_is_printed_as_text(memagent, tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "a.pdf", ["Some text."], title=MARKUP)

    result = memagent("inspect", str(path), "--tokenizer", "tiktoken")

    assert result.returncode == 0, result.stderr
    assert MARKUP in result.stdout


def test_markup_in_a_chapter_title_is_printed_as_text(memagent, tmp_path: Path) -> None:
    chapters = [("a.xhtml", MARKUP, builders.xhtml(None, ["Some text."]))]
    path = builders.epub_book(tmp_path / "b.epub", chapters, title=MARKUP)

    result = memagent("inspect", str(path), "--tokenizer", "tiktoken")

    assert result.returncode == 0, result.stderr
    assert result.stdout.count(MARKUP) == 2  # the book's title and the chunk's span
