"""Format detection, plain text, and the Document's map from offsets to pages."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from support import builders

from memagent_cli.documents import Document, Section, assemble, cache, load_document
from memagent_cli.errors import DocumentError

UNSUPPORTED = r"; supported formats are text, Markdown, PDF and EPUB\.$"


pytestmark = pytest.mark.usefixtures("private_cache")


def test_a_pdf_without_an_extension_is_read_as_a_pdf(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "book.pdf", ["Hello from a PDF."])
    path = path.rename(tmp_path / "book")

    document = load_document(str(path))

    assert (document.format, document.text) == ("pdf", "Hello from a PDF.")


def test_a_pdf_after_leading_bytes_is_still_a_pdf(tmp_path: Path) -> None:
    path = builders.pdf(tmp_path / "download", ["Body."])
    path.write_bytes(b"HTTP/1.1 200 OK\r\n\r\n" + path.read_bytes())

    assert load_document(str(path)).format == "pdf"


def test_an_epub_named_zip_is_read_as_an_epub(tmp_path: Path) -> None:
    chapters = [("one.xhtml", "One", builders.xhtml(None, ["Only chapter."]))]
    path = builders.epub_book(tmp_path / "book.epub", chapters).rename(tmp_path / "book.zip")

    document = load_document(str(path))

    assert (document.format, document.text) == ("epub", "Only chapter.")


def test_markdown_that_mentions_a_pdf_header_stays_text(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n\nEvery PDF starts with `%PDF-1.7`.\n")

    document = load_document(str(path))

    assert (document.format, document.sections, document.span(0, 5)) == ("text", [], "")
    assert document.text.startswith("# Notes")


def test_text_is_decoded_leniently_and_never_cached(tmp_path: Path) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes("Caf\xe9 au lait.\n".encode("latin-1"))
    utf16 = tmp_path / "wide.txt"
    utf16.write_text("Grüße aus Köln.", encoding="utf-16")

    assert load_document(str(latin)).text == "Caf\ufffd au lait."
    assert load_document(str(utf16)).text == "Grüße aus Köln."
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("name", "make", "kind"),
    [
        ("photo.txt", builders.png, "a PNG image"),
        (
            "archive.zip",
            lambda p: _zip(p, {"readme.txt": b"hi"}),
            "a ZIP archive that is not an EPUB",
        ),
        ("report.docx", lambda p: _zip(p, {"word/document.xml": b"<w/>"}), "a Word document"),
        ("blob.bin", lambda p: p.write_bytes(bytes(range(256)) * 8), "binary data"),
    ],
)
def test_unsupported_files_name_the_supported_formats(
    tmp_path: Path, name: str, make, kind: str
) -> None:
    path = tmp_path / name
    make(path)

    with pytest.raises(
        DocumentError,
        match=rf"^{path} looks like {kind}, which memagent cannot "
        rf"read{UNSUPPORTED}",
    ):
        load_document(str(path))


@pytest.mark.parametrize("content", [b"", b"  \n\t\n"])
@pytest.mark.parametrize("name", ["empty.txt", "empty.pdf", "empty.epub"])
def test_an_empty_file_is_an_empty_document(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)

    with pytest.raises(DocumentError, match=r"^The document is empty: .* has no text to read\.$"):
        load_document(str(path))


def test_missing_paths_and_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match="^Document not found"):
        load_document(str(tmp_path / "nope.pdf"))
    with pytest.raises(DocumentError, match="is a directory"):
        load_document(str(tmp_path))


def test_assemble_maps_every_character_to_its_part() -> None:
    document = assemble(
        [("i", "  Roman one.\n"), ("ii", ""), ("1", "Arabic one."), ("2", "\n Two. ")],
        path="x.pdf",
        format="pdf",
        sha256="",
        unit="page",
    )

    assert document.text == "Roman one.\n\nArabic one.\n\nTwo."
    assert document.sections == [Section(0, "i"), Section(12, "1"), Section(25, "2")]
    owners = [document.section_at(offset).label for offset in range(len(document.text))]
    assert "".join(owners) == "i" * 12 + "1" * 13 + "2" * 4
    assert document.span(0, 1) == "p. i"
    assert document.span(11, 13) == "p. i–1"
    assert document.span(0, len(document.text)) == "p. i–2"
    assert document.span(5, 5) == ""


def test_chapter_spans_are_titles_joined_by_a_spaced_dash() -> None:
    document = Document(
        text="a" * 30,
        path="b.epub",
        format="epub",
        sha256="",
        unit="chapter",
        sections=[Section(0, "Chapter 1"), Section(10, "Chapter 2"), Section(20, "Chapter 3")],
    )

    assert document.span(0, 30) == "Chapter 1 – Chapter 3"
    assert document.span(10, 20) == "Chapter 2"
    assert document.span(19, 21) == "Chapter 2 – Chapter 3"


def test_a_cache_that_cannot_be_written_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    path = builders.pdf(tmp_path / "book.pdf", ["Readable."])

    assert load_document(str(path)).text == "Readable."
    assert not load_document(str(path)).from_cache
    assert cache.directory().parent.parent == blocker


def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
