"""PDF documents: real files built with fpdf2, read through `load_document`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import builders

from memagent_cli.documents import cache, load_document
from memagent_cli.errors import DocumentError

PAGES = ["Preface on page i.", "Thanks on page ii.", "Chapter one starts.", "Second page.", "End."]
ROMAN_THEN_ARABIC = [("r", "", 1), None, ("D", "", 1)]


pytestmark = pytest.mark.usefixtures("private_cache")


@pytest.fixture
def book(tmp_path: Path) -> Path:
    return builders.pdf(tmp_path / "book.pdf", PAGES, labels=ROMAN_THEN_ARABIC, title="Manual")


def test_pages_are_read_in_order_with_their_printed_labels(book: Path) -> None:
    document = load_document(str(book))

    assert document.text == "\n\n".join(PAGES)
    assert (document.format, document.unit, document.pages) == ("pdf", "page", 5)
    assert [s.label for s in document.sections] == ["i", "ii", "1", "2", "3"]
    for section, page in zip(document.sections, PAGES, strict=True):
        assert document.text[section.start : section.start + len(page)] == page
    assert document.title == "Manual"
    assert document.pages_without_text == 0


def test_spans_name_the_first_and_last_page(book: Path) -> None:
    document = load_document(str(book))
    text = document.text
    chapter = text.index("Chapter one")

    assert document.span(0, len(text)) == "p. i–3"
    assert document.span(0, 5) == "p. i"
    assert document.span(text.index("Thanks"), chapter + 3) == "p. ii–1"
    assert document.span(chapter, chapter + len(PAGES[2])) == "p. 1"
    # the blank line after a page still belongs to it
    assert document.span(chapter + len(PAGES[2]), chapter + len(PAGES[2]) + 2) == "p. 1"


def test_pages_are_numbered_when_the_pdf_has_no_labels(tmp_path: Path) -> None:
    document = load_document(str(builders.pdf(tmp_path / "plain.pdf", ["One.", "Two."])))

    assert [s.label for s in document.sections] == ["1", "2"]
    assert document.span(0, len(document.text)) == "p. 1–2"


def test_pages_without_text_are_counted_and_skipped(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "figures.pdf", ["Before the figure.", None, "After it."])

    document = load_document(str(path))

    assert document.text == "Before the figure.\n\nAfter it."
    assert (document.pages, document.pages_without_text) == (3, 1)
    assert [s.label for s in document.sections] == ["1", "3"]


def test_a_pdf_without_any_text_says_ocr_found_none(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "scan.pdf", [None, None])  # a red square on each page

    with pytest.raises(DocumentError, match=r"no text on any of its 2 pages, and OCR \(Tess"):
        load_document(str(path))


@pytest.mark.parametrize("encryption", ["AES_256", "RC4"])
def test_encrypted_pdfs_open_with_the_right_password_only(tmp_path: Path, encryption: str) -> None:
    path = builders.pdf(
        tmp_path / "secret.pdf", ["Launch codes."], password="s3cret", encryption=encryption
    )

    with pytest.raises(DocumentError, match=r"secret\.pdf is encrypted; pass --password, or set "):
        load_document(str(path))
    with pytest.raises(DocumentError, match=r"^The password for .*secret\.pdf is wrong\.$"):
        load_document(str(path), password="guess")
    document = load_document(str(path), password="s3cret")
    assert document.text == "Launch codes." and document.encrypted


def test_an_encrypted_pdf_is_never_cached(tmp_path: Path, private_cache: Path) -> None:
    path = builders.pdf(tmp_path / "secret.pdf", ["Launch codes."], password="s3cret")
    load_document(str(path), password="s3cret")

    with pytest.raises(DocumentError, match="is encrypted"):
        load_document(str(path))
    with pytest.raises(DocumentError, match="is wrong"):
        load_document(str(path), password="guess")
    assert not load_document(str(path), password="s3cret").from_cache
    assert not list(private_cache.rglob("*.json"))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(builders.break_xref, id="broken-xref"),
        pytest.param(lambda p: p.write_bytes(bytes(range(256)) * 40), id="random-bytes"),
        pytest.param(
            lambda p: p.write_bytes(b"%PDF-1.7\n" + b"\x93" * 4000 + b"\n%%EOF\n"),
            id="garbage-body",
        ),
        pytest.param(  # pypdf raised OverflowError, a traceback
            lambda p: p.write_bytes(
                re.sub(rb"startxref\s+\d+", b"startxref\n" + b"9" * 20, p.read_bytes())
            ),
            id="startxref-past-any-offset",
        ),
    ],
)
def test_a_damaged_pdf_is_one_clear_sentence(book: Path, damage) -> None:
    damage(book)

    with pytest.raises(
        DocumentError,
        match=r"book\.pdf is damaged or not a PDF, so it cannot "
        r"be read \(pypdf: [^\n]+\)\.$",
    ):
        load_document(str(book))


def test_a_truncated_pdf_says_so(book: Path) -> None:
    builders.truncate(book)

    with pytest.raises(
        DocumentError,
        match=r"book\.pdf is damaged or not a PDF, so it cannot "
        r"be read \(its end is missing, as if truncated\)\.$",
    ):
        load_document(str(book))


def test_a_wrong_startxref_is_repaired(book: Path) -> None:
    builders.misplace_startxref(book)

    assert load_document(str(book)).text == "\n\n".join(PAGES)


def test_pypdf_repairs_stay_off_stderr(book: Path, capfd: pytest.CaptureFixture[str]) -> None:
    builders.misplace_startxref(book)
    load_document(str(book))
    builders.truncate(book)
    with pytest.raises(DocumentError):
        load_document(str(book))

    assert capfd.readouterr() == ("", "")


def test_progress_counts_pages(book: Path) -> None:
    calls: list[tuple[int, int]] = []

    load_document(str(book), progress=lambda what, done, total: calls.append((done, total)))

    assert calls == [(n, 5) for n in range(1, 6)]


def test_a_second_load_comes_from_the_cache(book: Path, private_cache: Path) -> None:
    first = load_document(str(book))
    calls: list[tuple[int, int]] = []
    second = load_document(
        str(book), progress=lambda what, done, total: calls.append((done, total))
    )

    assert not first.from_cache and second.from_cache and calls == []
    assert second == first
    assert (private_cache / "memagent" / "documents" / f"{first.sha256}.json").is_file()


def test_the_cache_follows_the_content_not_the_name(book: Path, tmp_path: Path) -> None:
    first = load_document(str(book))
    copy = tmp_path / "copy.pdf"
    copy.write_bytes(book.read_bytes())

    second = load_document(str(copy))

    assert second.from_cache and second.path == str(copy) and second.text == first.text


@pytest.mark.parametrize("garbage", ["{not json", '{"version": 0}', "[]", '{"version": 1}'])
def test_a_bad_cache_entry_is_ignored_and_rewritten(book: Path, garbage: str) -> None:
    document = load_document(str(book))
    entry = cache.directory() / f"{document.sha256}.json"
    entry.write_text(garbage)

    again = load_document(str(book))

    assert not again.from_cache and again == document
    assert json.loads(entry.read_text())["version"] == cache.VERSION
    assert load_document(str(book)).from_cache


def test_a_pdf_can_come_from_stdin(book: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with book.open("rb") as file:
        monkeypatch.setattr("sys.stdin", type("Stdin", (), {"buffer": file})())
        document = load_document("-")

    assert document.format == "pdf" and document.path == "<stdin>"
    assert document.span(0, len(document.text)) == "p. i–3"


def test_text_that_starts_like_a_pdf_reads_with_the_format_given(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("%PDF-1.7 is the first line of every PDF; these are notes about it.\n")

    with pytest.raises(DocumentError, match="looks like a damaged PDF.*--format text"):
        load_document(str(path))
    assert load_document(str(path), format="text").text.startswith("%PDF-1.7 is the first")


def test_text_named_like_a_pdf_offers_format_text(book: Path) -> None:
    book.write_text("just some notes\n")

    with pytest.raises(
        DocumentError, match=r"book\.pdf is named like a PDF but is not one; .*--format text"
    ):
        load_document(str(book))


def test_a_page_pypdf_cannot_decompress_is_said_as_such(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "a.pdf", ["Page one text.", "Page two text.", "Three."])
    builders.corrupt_page_streams(path, [1], builders.scramble)

    document = load_document(str(path))

    assert "Page one text." in document.text and "Three." in document.text
    assert document.pages_without_text == 0  # the page is damaged, not scanned
    assert len(document.notes) == 1
    assert "could not decode the content of p. 2 (pypdf: Error -3" in document.notes[0]


def test_an_unsupported_filter_is_said(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "a.pdf", ["Page one text.", "Page two text."])
    data = path.read_bytes().replace(b"/FlateDecode", b"/FooDecode\n  ", 1)
    path.write_bytes(data)

    document = load_document(str(path))

    assert "Unsupported filter /FooDecode" in document.notes[0]
