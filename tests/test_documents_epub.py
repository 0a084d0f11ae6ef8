"""EPUB documents: real books built with ebooklib, read through `load_document`."""

from __future__ import annotations

from pathlib import Path

import builders
import pytest

from memagent_cli.documents import load_document
from memagent_cli.documents.epub import xhtml_to_text
from memagent_cli.errors import DocumentError

CHAPTERS = [
    ("intro.xhtml", "Introduction", builders.xhtml("Intro", ["Why we sail."])),
    (
        "storm.xhtml",
        "The Storm",
        builders.xhtml(
            "Storm",
            ["Waves rose.", "The mast broke."],
            "<script>document.write('SCRIPTED')</script><style>p { color: STYLED }</style>",
        ),
    ),
    ("harbour.xhtml", "Harbour", builders.xhtml(None, ["Safe at last."])),
]
# The manifest lists intro, storm, harbour; readers must follow the spine instead.
SPINE = [1, 0, 2]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def book(tmp_path: Path) -> Path:
    return builders.epub_book(tmp_path / "voyage.epub", CHAPTERS, spine=SPINE, title="Voyage")


def test_chapters_follow_the_spine_not_the_manifest(book: Path) -> None:
    document = load_document(str(book))

    assert document.text == (
        "Storm\n\nWaves rose.\n\nThe mast broke.\n\nIntro\n\nWhy we sail.\n\nSafe at last."
    )
    assert (document.format, document.unit, document.title) == ("epub", "chapter", "Voyage")


def test_scripts_styles_and_the_navigation_document_are_left_out(book: Path) -> None:
    text = load_document(str(book)).text

    assert "SCRIPTED" not in text and "STYLED" not in text
    assert "Introduction" not in text  # the nav document lists it; the chapter does not


def test_chapters_are_titled_from_the_table_of_contents(book: Path) -> None:
    document = load_document(str(book))
    text = document.text

    assert [s.label for s in document.sections] == ["The Storm", "Introduction", "Harbour"]
    assert [s.start for s in document.sections] == [0, text.index("Intro"), text.index("Safe")]
    assert document.span(0, len(text)) == "The Storm – Harbour"
    assert document.span(text.index("Waves"), text.index("sail")) == "The Storm – Introduction"
    assert document.span(text.index("Safe"), len(text)) == "Harbour"


def test_without_a_table_of_contents_titles_come_from_headings(tmp_path: Path) -> None:
    path = builders.epub_book(tmp_path / "bare.epub", CHAPTERS, toc=False)

    labels = [s.label for s in load_document(str(path)).sections]

    # harbour.xhtml has no heading either, so its file name stands in
    assert labels == ["Intro", "Storm", "harbour.xhtml"]


def test_xhtml_blocks_become_paragraphs_and_inline_markup_disappears() -> None:
    text, heading = xhtml_to_text(
        b"<?xml version='1.0' encoding='utf-8'?>\n"
        b"<html xmlns='http://www.w3.org/1999/xhtml'><head><title>Not text</title></head><body>"
        b"<section><h2>Part <em>One</em></h2><p>First   <b>bold</b>\n  line<br/>second line</p>"
        b"<ul><li>apples</li><li>pears</li></ul>"
        b"<table><tr><td>a</td><td>b</td></tr></table>"
        b"<pre>  code\n    indented</pre>"
        b"<p>caf\xc3\xa9&#160;&amp; tea</p></section></body></html>"
    )

    assert heading == "Part One"
    assert text == (
        "Part One\n\nFirst bold line\nsecond line\n\napples\n\npears\n\na b\n\n"
        "  code\n    indented\n\ncafé\xa0& tea"
    )


def test_external_entities_are_never_loaded(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    hostile = (
        f'<?xml version="1.0" encoding="utf-8"?>\n'
        f'<!DOCTYPE html [<!ENTITY leak SYSTEM "file://{secret}">]>\n'
        f'<html xmlns="http://www.w3.org/1999/xhtml"><body><p>Before &leak; after</p>'
        f"</body></html>"
    ).encode()
    path = builders.epub_book(tmp_path / "hostile.epub", CHAPTERS)
    builders.rewrite_zip(path, edit={"EPUB/intro.xhtml": hostile})

    text = load_document(str(path)).text

    assert "TOP-SECRET" not in text
    assert "Before" in text and "after" in text


def test_progress_counts_chapters(book: Path) -> None:
    calls: list[tuple[int, int]] = []

    load_document(str(book), progress=lambda done, total: calls.append((done, total)))

    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_a_second_load_comes_from_the_cache(book: Path) -> None:
    first = load_document(str(book))
    second = load_document(str(book))

    assert not first.from_cache and second.from_cache and second == first


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(
            lambda p: builders.rewrite_zip(p, drop=["EPUB/content.opf"]),
            r"voyage\.epub is damaged: its package file \(EPUB/content\.opf\) is missing\.$",
            id="missing-opf",
        ),
        pytest.param(
            lambda p: builders.rewrite_zip(p, drop=["META-INF/container.xml"]),
            r"voyage\.epub is damaged: META-INF/container\.xml, which says where its contents "
            r"are, is missing\.$",
            id="missing-container",
        ),
        pytest.param(
            lambda p: builders.rewrite_zip(p, drop=["EPUB/storm.xhtml"]),
            r"voyage\.epub is damaged: EPUB/storm\.xhtml, listed in its manifest, is missing\.$",
            id="missing-spine-item",
        ),
        pytest.param(
            builders.truncate,
            r"voyage\.epub is damaged or not an EPUB: it is not a valid ZIP archive\.$",
            id="truncated",
        ),
        pytest.param(
            lambda p: p.write_bytes(bytes(range(256)) * 20),
            r"voyage\.epub is damaged or not an EPUB: it is not a valid ZIP archive\.$",
            id="random-bytes",
        ),
        pytest.param(
            lambda p: builders.rewrite_zip(p, edit={"EPUB/content.opf": b"<package>oops"}),
            r"voyage\.epub is damaged: its package file \(EPUB/content\.opf\) cannot be parsed\.$",
            id="garbage-opf",
        ),
        pytest.param(
            lambda p: builders.rewrite_zip(p, edit={"META-INF/container.xml": b"<container"}),
            r"voyage\.epub is damaged: META-INF/container\.xml cannot be parsed\.$",
            id="garbage-container",
        ),
    ],
)
def test_a_damaged_epub_is_one_clear_sentence(book: Path, damage, message: str) -> None:
    damage(book)

    with pytest.raises(DocumentError, match=message):
        load_document(str(book))


def test_ebooklib_stays_quiet(book: Path, capfd: pytest.CaptureFixture[str]) -> None:
    load_document(str(book))
    builders.rewrite_zip(book, drop=["EPUB/storm.xhtml"])
    with pytest.raises(DocumentError):
        load_document(str(book))

    assert capfd.readouterr() == ("", "")


def test_a_nav_document_without_a_toc_falls_back_to_the_ncx(book: Path) -> None:
    builders.rewrite_zip(book, edit={"EPUB/nav.xhtml": b"<html><body>no toc</body></html>"})

    document = load_document(str(book))

    assert [s.label for s in document.sections] == ["The Storm", "Introduction", "Harbour"]
