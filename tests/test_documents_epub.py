"""EPUB documents: real books built with ebooklib, read through `load_document`."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import builders

from memagent_cli.documents import load_document, xhtml
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


pytestmark = pytest.mark.usefixtures("private_cache")


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
    text, heading = xhtml.to_text(
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

    load_document(str(book), progress=lambda what, done, total: calls.append((done, total)))

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


# -- Structures of real books (Debian's live-manual, Sphinx), built member by member --------

XHTML = "application/xhtml+xml"
NCX = "application/x-dtbncx+xml"


def live_manual(path: Path) -> Path:
    """Debian's live-manual: each chapter listed once plainly, then several more times with
    #fragment hrefs that are not in the spine; titles in an NCX."""
    names = ["about-manual", "about-project", "installation"]
    files = {f"{n}.xhtml": builders.page(f"<h1>{n}</h1><p>Text of {n}.</p>") for n in names}
    files["toc.ncx"] = builders.ncx_document(
        [(f"{n.replace('-', ' ').title()}", f"{n}.xhtml") for n in names]
        + [(f"{names[0]} part {k}", f"{names[0]}.xhtml#o{k}") for k in (8, 9)]
    )
    manifest = [("ncx", "toc.ncx", NCX)]
    for n in names:
        manifest.append((n, f"{n}.xhtml", XHTML))
        manifest += [(f"{n}-o{k}", f"{n}.xhtml#o{k}", XHTML) for k in (8, 9, 12)]
    return builders.package_epub(path, files, manifest=manifest, spine=names, ncx_id="ncx")


def test_fragment_hrefs_outside_the_spine_never_stop_a_book(tmp_path: Path) -> None:
    document = load_document(str(live_manual(tmp_path / "live-manual.epub")))

    assert [s.label for s in document.sections] == [
        "About Manual",
        "About Project",
        "Installation",
    ]
    assert document.text.count("Text of about-manual.") == 1  # each file read once
    assert document.notes == []


SPHINX_BAR = (
    '<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation'
    '</h3><ul><li><a href="genindex.xhtml">index</a></li><li>next</li></ul></div>'
)


def sphinx_book(path: Path, *, toc: bool = True) -> Path:
    """A Sphinx-built EPUB: every page starts with a "Navigation" bar, and the nav
    document's TOC nests the chapters under the book's own entry."""
    chapters = [
        ("introduction", "1. Introduction", "Packaging is the craft of building debs."),
        ("getting-set-up", "2. Getting Set Up", "Install the tools first."),
        ("fixing-a-bug", "3. Fixing a bug", "Find the bug in Launchpad."),
    ]
    files = {"index.xhtml": builders.page(SPHINX_BAR + "<h1>Ubuntu Packaging Guide</h1>")}
    for name, title, text in chapters:
        files[f"{name}.xhtml"] = builders.page(
            f'{SPHINX_BAR}<div class="body"><section id="{name}"><h1>{title}</h1><p>{text}</p>'
            f'<section id="more"><h2>{title}.1 More</h2><p>{text}</p></section></section></div>'
        )
    entries = [
        (title, f"{name}.xhtml", [(f"{title}.1 More", f"{name}.xhtml#more", [])])
        for name, title, _ in chapters
    ]
    files["nav.xhtml"] = builders.nav_document(
        [("Ubuntu Packaging Guide", "index.xhtml", entries)] if toc else []
    )
    if not toc:
        files["nav.xhtml"] = builders.page("<nav epub:type='landmarks'><ol></ol></nav>")
    names = ["index"] + [name for name, _, _ in chapters]
    manifest = [("nav", "nav.xhtml", XHTML)] + [(n, f"{n}.xhtml", XHTML) for n in names]
    return builders.package_epub(path, files, manifest=manifest, spine=names, nav_id="nav")


def test_sphinx_chapters_are_titled_from_the_nested_toc(tmp_path: Path) -> None:
    document = load_document(str(sphinx_book(tmp_path / "guide.epub")))
    text = document.text

    assert [s.label for s in document.sections] == [
        "Ubuntu Packaging Guide",
        "1. Introduction",
        "2. Getting Set Up",
        "3. Fixing a bug",
    ]
    assert "Navigation" not in text and "index" not in text  # the bar is not the book's text
    start, end = text.index("Install the tools"), text.index("Find the bug")
    assert document.span(start, end + 1) == "2. Getting Set Up – 3. Fixing a bug"


def test_a_nav_document_without_a_toc_titles_from_headings_and_says_so(tmp_path: Path) -> None:
    document = load_document(str(sphinx_book(tmp_path / "guide.epub", toc=False)))

    assert [s.label for s in document.sections][1:] == [
        "1. Introduction",
        "2. Getting Set Up",
        "3. Fixing a bug",
    ]
    assert len(document.notes) == 1 and "no usable table of contents" in document.notes[0]


@pytest.mark.parametrize("spine", [None, [], ["no-such-id"]], ids=["absent", "empty", "unknown"])
def test_a_package_without_a_spine_is_read_in_manifest_order(tmp_path: Path, spine) -> None:
    files = {f"{n}.xhtml": builders.page(f"<h1>{n}</h1><p>{n} text</p>") for n in "abc"}
    manifest = [(n, f"{n}.xhtml", XHTML) for n in "cab"]
    path = builders.package_epub(tmp_path / "b.epub", files, manifest=manifest, spine=spine)

    document = load_document(str(path))

    assert [s.label for s in document.sections] == ["c", "a", "b"]
    assert any("no spine" in note and "manifest" in note for note in document.notes)


def test_the_notes_survive_the_cache(tmp_path: Path) -> None:
    files = {"a.xhtml": builders.page("<p>alpha</p>")}
    path = builders.package_epub(
        tmp_path / "b.epub", files, manifest=[("a", "a.xhtml", XHTML)], spine=None
    )
    first, second = load_document(str(path)), load_document(str(path))

    assert second.from_cache and second.notes == first.notes != []


def test_manifest_items_outside_the_spine_are_never_read(book: Path) -> None:
    # A missing image and a member that cannot be decompressed: neither is needed.
    builders.rewrite_zip(book, edit={})
    members = builders.members_of(book)
    opf = next(m for m in members if m.name == "EPUB/content.opf")
    opf.data = opf.data.replace(
        b"</manifest>",
        b'<item id="gone" href="images/gone.png" media-type="image/png"/>'
        b'<item id="bad" href="images/bad.png" media-type="image/png"/></manifest>',
    )
    members.append(builders.Member("EPUB/images/bad.png", raw=b"\xff" * 64, crc=1, size=64))
    builders.write_zip(book, members)

    assert "The mast broke." in load_document(str(book)).text


def test_each_chapter_is_decoded_once(book: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chapter's encoding is found once and the chapter decoded once: its declaration was
    read for the note on encodings memagent does not decode, then again to decode it."""
    looked: list[bytes] = []
    encoding = xhtml.encoding

    def counted(content: bytes) -> tuple[str, str]:
        looked.append(content)
        return encoding(content)

    monkeypatch.setattr(xhtml, "encoding", counted)
    load_document(str(book), use_cache=False)

    chapters = [content for content in looked if b"<body" in content and b"<nav" not in content]
    assert len(chapters) == len(CHAPTERS) and len(set(chapters)) == len(CHAPTERS)
