"""Hostile, broken and odd documents (issue 10): each ends in one sentence or a right
reading, never a traceback, a hang or a blow-up. Files are built with real libraries and
zipfile-level writers; the command runs as a subprocess, with a memory limit where memory
is the point."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support import builders
from support.command import MEMAGENT, assert_clean_failure

from memagent_cli.documents import load_document
from memagent_cli.errors import DocumentError

GiB = 1 << 30
CHAPTER = "EPUB/storm.xhtml"
CHAPTERS = [
    ("intro.xhtml", "Introduction", builders.xhtml("Intro", ["Why we sail."])),
    ("storm.xhtml", "The Storm", builders.xhtml("Storm", ["Waves rose.", "The mast broke."])),
]


@pytest.fixture(autouse=True)
def no_document_limit(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMAGENT_MAX_DOCUMENT_BYTES", raising=False)


@pytest.fixture
def book(tmp_path: Path) -> Path:
    return builders.epub_book(tmp_path / "voyage.epub", CHAPTERS)


def changed(path: Path, name: str, **fields) -> Path:
    """The EPUB at `path` with member `name` rewritten with `fields` changed."""
    member = next(m for m in builders.members_of(path) if m.name == name)
    if "raw" in fields:  # stored bytes that are not what `data` compresses to
        fields.setdefault("crc", zipfile.crc32(member.data))
        fields.setdefault("size", len(member.data))
    return builders.replace_member(path, dataclasses.replace(member, **fields))


def in_manifest(path: Path, href: str) -> Path:
    """`path` with `href` (relative to EPUB/) listed in its manifest as a PNG image."""
    opf = next(m for m in builders.members_of(path) if m.name == "EPUB/content.opf")
    item = f'<item id="unused" href="{href}" media-type="image/png"/></manifest>'
    opf.data = opf.data.replace(b"</manifest>", item.encode())
    return builders.replace_member(path, opf)


def bomb(path: Path, name: str, size: int = GiB, *, declared: int | None = None) -> Path:
    """`path` with member `name` (replaced or added) inflating to `size` zero bytes, and
    saying it holds `declared` bytes when that is given."""
    zeros = builders.zeros_member(name, size)
    if declared is not None:
        zeros.size = declared
    return builders.replace_member(path, zeros)


# -- EPUB ZIP damage: what zipfile raises becomes one sentence ------------------------------

ZIP_DAMAGE = {
    "encrypted member": (dict(flags=0x1), "is encrypted (DRM)"),
    "strong encryption": (dict(flags=0x41), "is encrypted (DRM)"),
    "deflate64": (dict(method=9), "compressed with Deflate64, which EPUB does not allow"),
    "bzip2": (dict(method=zipfile.ZIP_BZIP2), "compressed with bzip2"),
    "unknown method": (dict(method=77), "compressed with method 77"),
    "corrupt deflate data": (dict(raw=b"\xff" * 64), "compressed data of EPUB/storm.xhtml"),
    "bad crc": (dict(crc=12345), "compressed data of EPUB/storm.xhtml in it is corrupt"),
    "patched data flag": (dict(flags=0x20), "compressed patched data"),
}


@pytest.mark.parametrize("case", ZIP_DAMAGE)
def test_zip_damage_in_a_chapter_is_one_sentence(book: Path, case: str) -> None:
    fields, phrase = ZIP_DAMAGE[case]
    changed(book, CHAPTER, **fields)

    with pytest.raises(DocumentError) as caught:
        load_document(str(book))

    message = caught.value.message
    assert phrase in message and "\n" not in message and message.endswith(".")


BOMBS = {
    # the member, the size it declares (None: the true one), what is said
    "chapter over the member limit": (CHAPTER, None, "inflates to more than"),
    "chapter with a lying size": (CHAPTER, 5000, "is corrupt"),
    "package file": ("EPUB/content.opf", None, "inflates to more than"),
}


@pytest.mark.parametrize("case", BOMBS)
def test_zip_bombs_in_needed_members_are_refused(book: Path, case: str) -> None:
    name, size, phrase = BOMBS[case]
    bomb(book, name, declared=size)

    with pytest.raises(DocumentError, match=phrase):
        load_document(str(book))


def test_a_bomb_under_the_member_limit_is_caught_by_its_ratio(book: Path) -> None:
    bomb(book, CHAPTER, 64 << 20)

    with pytest.raises(DocumentError, match="looks like a zip bomb: EPUB/storm.xhtml"):
        load_document(str(book))


def test_members_the_book_does_not_need_are_never_inflated(book: Path) -> None:
    in_manifest(book, "images/cover.png")  # listed, not in the spine
    bomb(book, "EPUB/images/cover.png")
    bomb(book, "mimetype")

    assert "The mast broke." in load_document(str(book)).text


def test_drm_listed_in_encryption_xml_is_said(book: Path) -> None:
    encryption = (
        b'<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
        b'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
        b'<enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
        b'<enc:CipherData><enc:CipherReference URI="EPUB/storm.xhtml"/></enc:CipherData>'
        b"</enc:EncryptedData></encryption>"
    )
    builders.replace_member(book, builders.Member("META-INF/encryption.xml", encryption))

    with pytest.raises(DocumentError, match="protected by DRM"):
        load_document(str(book))


# -- Through the command: inspect and ask, bounded memory and time --------------------------


def run(
    env: dict[str, str],
    *args: str,
    stdin=subprocess.DEVNULL,
    memory: int | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    """The real `memagent`, with its address space limited to `memory` bytes if given."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(
        [str(MEMAGENT), *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        preexec_fn=limit if memory else None,
    )


_PEAK = """
import atexit, sys
def peak(path=sys.argv[1]):
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmPeak"))
    with open(path, "w") as out:
        out.write(kb)
atexit.register(peak)
sys.argv = ["memagent", *sys.argv[2:]]
from memagent_cli.cli import main
main()
"""


@pytest.fixture(scope="module")
def memory_limit(tmp_path_factory: pytest.TempPathFactory) -> int:
    """1 GiB above the address space `memagent inspect` takes for a small EPUB."""
    folder = tmp_path_factory.mktemp("baseline")
    small = builders.epub_book(folder / "small.epub", CHAPTERS)
    env = {**os.environ, "XDG_CACHE_HOME": str(folder / "cache")}
    args = ["inspect", str(small), "--tokenizer", "tiktoken", "--json"]
    peak = folder / "peak"
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(peak), *args], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(peak.read_text()) * 1024 + GiB


INSPECT = ("--tokenizer", "tiktoken", "--json")


@pytest.mark.parametrize(
    "member", ["mimetype", "EPUB/images/cover.png", CHAPTER, "META-INF/container.xml"]
)
def test_a_one_megabyte_zip_bomb_stays_within_memory(env, book, memory_limit, member) -> None:
    bomb(in_manifest(book, "images/cover.png"), member)
    assert book.stat().st_size < 2 << 20

    result = run(env, "inspect", str(book), *INSPECT, memory=memory_limit, timeout=60)

    if member.endswith((".xhtml", ".xml")):  # needed: refused
        assert_clean_failure(result, 1, "inflates to more than")
    else:  # not needed: never inflated, the book reads
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["document"]["sections"] == 2


class _FakeServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that serves one model and nothing else: enough for
    `ask` to get as far as reading the document."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.rstrip("/").endswith("/v1/models"):
            body = json.dumps({"data": [{"id": "fake", "max_model_len": 8192}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def ask(env: dict[str, str]):
    """`memagent ask DOCUMENT QUESTION` against a fake server on 127.0.0.1."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"

    def call(document: str, **kwargs) -> subprocess.CompletedProcess:
        return run(env, "ask", document, "q?", "--backend", "openai", "--base-url", url, **kwargs)

    yield call
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("case", ["encrypted member", "deflate64", "corrupt deflate data"])
def test_zip_damage_is_one_sentence_in_inspect_and_ask(env, ask, book, case) -> None:
    fields, phrase = ZIP_DAMAGE[case]
    changed(book, CHAPTER, **fields)

    assert_clean_failure(run(env, "inspect", str(book), *INSPECT), 1, phrase)
    assert_clean_failure(ask(str(book)), 1, phrase)


# -- Things that are not regular files, and documents without end ---------------------------


def test_a_fifo_is_refused_without_opening_it(env, ask, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)

    for result in (run(env, "inspect", str(fifo), *INSPECT, timeout=30), ask(str(fifo))):
        assert_clean_failure(result, 1, "is a FIFO (named pipe), not a regular file")


def test_a_device_is_refused(env) -> None:
    result = run(env, "inspect", "/dev/zero", *INSPECT, timeout=30)
    assert_clean_failure(result, 1, "/dev/zero is a character device, not a regular file")


def test_dev_zero_on_stdin_stops_at_its_first_bytes(env, memory_limit) -> None:
    with open("/dev/zero", "rb") as zeros:
        result = run(env, "inspect", "-", *INSPECT, stdin=zeros, memory=memory_limit, timeout=30)
    assert_clean_failure(result, 1, "stdin looks like binary data")


def test_endless_text_on_stdin_stops_at_the_maximum_size(env, memory_limit) -> None:
    env["MEMAGENT_MAX_DOCUMENT_BYTES"] = "1000000"
    endless = subprocess.Popen(["yes", "all work and no play"], stdout=subprocess.PIPE)
    try:
        result = run(
            env, "inspect", "-", *INSPECT, stdin=endless.stdout, memory=memory_limit, timeout=30
        )
    finally:
        endless.kill()
        endless.wait()
    assert_clean_failure(
        result,
        1,
        "stdin is larger than the maximum document size of 1,000,000 bytes",
        "MEMAGENT_MAX_DOCUMENT_BYTES",
    )


def test_a_file_over_the_maximum_size_is_refused_before_reading(env, tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text("word " * 1000)
    env["MEMAGENT_MAX_DOCUMENT_BYTES"] = "4096"

    result = run(env, "inspect", str(path), *INSPECT)

    assert_clean_failure(result, 1, "big.txt is larger than the maximum document size of 4,096")


@pytest.mark.parametrize("value", ["lots", "0", "-5"])
def test_a_bad_maximum_size_is_one_sentence(env, tmp_path: Path, value: str) -> None:
    path = tmp_path / "a.txt"
    path.write_text("hello")
    env["MEMAGENT_MAX_DOCUMENT_BYTES"] = value

    result = run(env, "inspect", str(path), *INSPECT)

    assert_clean_failure(result, 1, "MEMAGENT_MAX_DOCUMENT_BYTES must be a whole number")


# -- Hostile XML and package files: bounded work, one sentence at worst ---------------------

XHTML = "application/xhtml+xml"
LAUGHS = (
    '<!DOCTYPE html [<!ENTITY a "aaaaaaaaaa">'
    + "".join(f'<!ENTITY {chr(98 + i)} "{f"&{chr(97 + i)};" * 10}">' for i in range(9))
    + "]>"
)
HOSTILE_CHAPTERS = {
    "200,000-deep nesting": builders.page("<div>" * 200_000 + "deep" + "</div>" * 200_000),
    "billion laughs": f'<?xml version="1.0"?>{LAUGHS}<html><body><p>&j;</p></body></html>',
    "NUL bytes": builders.page("<p>a\x00b</p>"),
}


@pytest.mark.parametrize("case", HOSTILE_CHAPTERS)
def test_hostile_xhtml_is_read_or_refused_in_bounded_work(tmp_path: Path, case: str) -> None:
    files = {"a.xhtml": HOSTILE_CHAPTERS[case], "b.xhtml": builders.page("<p>Safe text.</p>")}
    manifest = [("a", "a.xhtml", XHTML), ("b", "b.xhtml", XHTML)]
    path = builders.package_epub(tmp_path / "h.epub", files, manifest=manifest, spine=["a", "b"])

    text = load_document(str(path)).text

    assert "Safe text." in text and "aaaaaaaaaa" not in text and len(text) < 1000


def test_entities_in_the_package_file_are_never_expanded(book: Path) -> None:
    opf = next(m for m in builders.members_of(book) if m.name == "EPUB/content.opf")
    opf.data = opf.data.replace(b"?>", b"?>" + LAUGHS.replace("html", "package").encode(), 1)
    opf.data = opf.data.replace(b"<dc:title>", b"<dc:title>&j;")
    builders.replace_member(book, opf)

    try:
        title = load_document(str(book)).title
    except DocumentError as refused:
        assert "cannot be parsed" in refused.message
    else:
        assert "aaaaaaaaaa" not in title


def test_a_spine_that_repeats_one_file_reads_it_once(tmp_path: Path) -> None:
    files = {"a.xhtml": builders.page("<p>Once.</p>")}
    manifest = [(f"a{n}", f"a.xhtml#f{n}", XHTML) for n in range(40_000)]
    spine = [f"a{n}" for n in range(40_000)]
    path = builders.package_epub(tmp_path / "r.epub", files, manifest=manifest, spine=spine)

    assert load_document(str(path)).text == "Once."


def test_hrefs_that_differ_from_member_names_in_case_or_escaping(tmp_path: Path) -> None:
    files = {"Chapter One.xhtml": builders.page("<p>First.</p>")}
    manifest = [("a", "chapter%20one.xhtml", XHTML)]
    path = builders.package_epub(tmp_path / "c.epub", files, manifest=manifest, spine=["a"])

    assert load_document(str(path)).text == "First."


def test_a_pdf_page_that_inflates_to_a_gigabyte_stays_within_memory(
    env, tmp_path: Path, memory_limit: int
) -> None:
    zeros = builders.zeros_member("page", GiB)
    bombed = b"\x78\x9c" + (zeros.raw or b"")  # a zlib header on the raw deflate stream
    path = builders.pdf_of_streams(
        tmp_path / "bomb.pdf", [builders.page_stream("Hello page"), bombed]
    )
    assert path.stat().st_size < 2 << 20

    result = run(env, "inspect", str(path), *INSPECT, memory=memory_limit)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["document"]["characters"] == len("Hello page")
    note = load_document(str(path)).notes[0]
    assert "could not decode the content of p. 2 (pypdf: Limit reached" in note


# -- Declared encodings and many links: bounded time ----------------------------------------

NOT_TEXT = {
    "punycode": "punycode",  # quadratic: 600 KB would take about a minute
    "idna": "idna",
    "unicode_escape": "unicode_escape",
    "utf-7": "utf-7",
    "base64": "base64",  # not a text encoding at all
    "unknown": "x-no-such-codec",
}


@pytest.mark.parametrize("case", NOT_TEXT)
def test_a_chapter_in_an_encoding_that_is_not_text_is_read_as_utf8(tmp_path: Path, case) -> None:
    # 500 KB of ASCII that punycode decodes in quadratic time: 16 s (8 MB: most of an hour).
    words = "ahoy " * 20_000 + "-" + "a" * 400_000
    chapter = builders.page(f"<p>Caf\u00e9 \\u0041.</p><p>{words}</p>")
    declared = chapter.replace('encoding="utf-8"', f'encoding="{NOT_TEXT[case]}"', 1)
    files = {"a.xhtml": declared, "b.xhtml": builders.page("<p>Safe text.</p>")}
    manifest = [("a", "a.xhtml", XHTML), ("b", "b.xhtml", XHTML)]
    path = builders.package_epub(tmp_path / "e.epub", files, manifest=manifest, spine=["a", "b"])

    started = time.monotonic()
    document = load_document(str(path))

    assert time.monotonic() - started < 5
    assert "Caf\u00e9 \\u0041." in document.text and "Safe text." in document.text
    assert document.notes[-1] == (
        f"In {path}, OEBPS/a.xhtml ({NOT_TEXT[case]!r}) declares an encoding that memagent does "
        "not read as text, so it was read as UTF-8."
    )


def test_a_chapter_in_a_text_encoding_is_decoded_with_it(tmp_path: Path) -> None:
    chapter = builders.page("<p>Caf\u00e9.</p>").replace("utf-8", "windows-1252", 1)
    path = builders.package_epub(
        tmp_path / "e.epub", {}, manifest=[("a", "a.xhtml", XHTML)], spine=["a"]
    )
    builders.replace_member(path, builders.Member("OEBPS/a.xhtml", chapter.encode("cp1252")))

    document = load_document(str(path))

    assert document.text == "Caf\u00e9." and "UTF-8" not in " ".join(document.notes)


def test_many_links_in_another_case_are_found_in_linear_time(tmp_path: Path) -> None:
    count = 8000  # and 40,000 other members: a scan of them all per link took 9 s
    files = {f"Chapter{n}.xhtml": builders.page(f"<p>{n}</p>") for n in range(count)}
    manifest = [(f"c{n}", f"chapter{n}.xhtml", XHTML) for n in range(count)]
    spine = [f"c{n}" for n in range(count)]
    path = builders.package_epub(tmp_path / "m.epub", {}, manifest=manifest, spine=spine)
    members = builders.members_of(path)
    members += [
        builders.Member(f"OEBPS/images/{n}.png", method=zipfile.ZIP_STORED) for n in range(20_000)
    ]
    members += [builders.Member(f"OEBPS/{name}", body.encode()) for name, body in files.items()]
    builders.write_zip(path, members)

    started = time.monotonic()
    text = load_document(str(path)).text

    assert time.monotonic() - started < 5
    assert text.split() == [str(n) for n in range(count)]
