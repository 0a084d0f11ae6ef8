"""Build real PDF and EPUB files with real libraries (fpdf2, ebooklib) for tests and benchmarks."""

from __future__ import annotations

import io
import re
import unicodedata
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ebooklib import epub
from fpdf import FPDF
from fpdf.enums import EncryptionMethod

# Written byte by byte, for structures ebooklib and fpdf2 will not write; used as builders.X.
from support.handmade import (  # noqa: F401
    Member,
    members_of,
    nav_document,
    ncx_document,
    package_epub,
    page,
    page_stream,
    pdf_of_streams,
    replace_member,
    write_zip,
    zeros_member,
)

# (label style, prefix, start) as fpdf2 takes them; None leaves the page unlabelled.
PageLabel = tuple[str, str, int] | None


def _png(width: int = 40, height: int = 40) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def pdf(
    path: Path,
    pages: Sequence[str | None],
    *,
    labels: Sequence[PageLabel] = (),
    password: str | None = None,
    encryption: str = "AES_256",
    title: str = "",
) -> Path:
    """A PDF with one page per entry of `pages`; None makes an image-only page (no text).

    `labels[i]`, when given, starts a page-label range at page i (fpdf2 `set_page_label`).
    """
    doc = FPDF(format="A4")
    doc.set_auto_page_break(False)
    doc.set_font("Helvetica", size=9)
    if title:
        doc.set_title(title)
    for index, text in enumerate(pages):
        doc.add_page()
        if index < len(labels) and labels[index] is not None:
            style, prefix, start = labels[index]
            doc.set_page_label(style, prefix or None, start)
        if text is None:
            doc.image(io.BytesIO(_png()), x=20, y=20, w=60)
        else:
            doc.set_xy(10, 10)
            doc.multi_cell(w=0, h=4, text=text)
    if password is not None:
        doc.set_encryption(
            owner_password="owner-" + password,
            user_password=password,
            encryption_method=EncryptionMethod[encryption],
        )
    path.write_bytes(bytes(doc.output()))
    return path


def truncate(path: Path, keep: float = 0.6) -> Path:
    """Cut the file at `keep` of its length, as an interrupted download would."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def break_xref(path: Path) -> Path:
    """Overwrite the cross-reference table with junk, keeping `startxref` pointing at it."""
    data = path.read_bytes()
    xref = data.rindex(b"\nxref") + 1
    end = data.index(b"trailer", xref)
    path.write_bytes(data[:xref] + b"x" * (end - xref) + data[end:])
    return path


def misplace_startxref(path: Path) -> Path:
    """Point `startxref` at a wrong offset; the objects themselves are intact."""
    data = path.read_bytes()
    path.write_bytes(re.sub(rb"startxref\s+\d+", b"startxref\n17", data))
    return path


def xhtml(title: str | None, paragraphs: Sequence[str], extra: str = "") -> str:
    """The body of a chapter: an optional <h1>, then one <p> per paragraph, then `extra`."""
    head = f"<h1>{title}</h1>" if title else ""
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return f"{head}{body}{extra}"


def epub_book(
    path: Path,
    chapters: Sequence[tuple[str, str, str]],
    *,
    spine: Sequence[int] | None = None,
    toc: bool = True,
    title: str = "A Test Book",
) -> Path:
    """An EPUB 3 with a nav document; `chapters` are (file name, toc title, xhtml body).

    The manifest lists chapters in the given order; `spine` gives the reading order as
    indexes into `chapters` (default: the same order). With `toc=False` the table of
    contents is empty, so titles must come from the chapters themselves.
    """
    book = epub.EpubBook()
    book.set_identifier("memagent-test-" + path.stem)
    book.set_title(title)
    book.set_language("en")
    items = []
    for file_name, chapter_title, body in chapters:
        item = epub.EpubHtml(title=chapter_title, file_name=file_name, lang="en")
        item.content = body
        book.add_item(item)
        items.append(item)
    order = [items[i] for i in spine] if spine is not None else items
    book.toc = [epub.Link(i.file_name, i.title, i.id) for i in order] if toc else []
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *order]
    epub.write_epub(str(path), book)
    return path


def rewrite_zip(
    path: Path, *, drop: Sequence[str] = (), edit: dict[str, bytes] | None = None
) -> Path:
    """Copy the zip at `path` without the members in `drop`, replacing those in `edit`."""
    with zipfile.ZipFile(path) as source:
        members = [(i, source.read(i.filename)) for i in source.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as target:
        for info, data in members:
            if info.filename in drop:
                continue
            target.writestr(info, (edit or {}).get(info.filename, data))
    return path


def png(path: Path) -> Path:
    path.write_bytes(_png())
    return path


def corrupt_page_streams(path: Path, pages: list[int], damage: Callable[[bytes], bytes]) -> Path:
    """Replace the content streams of `pages` (0-based) in an fpdf2 PDF by `damage(stream)`,
    keeping every length, so only decompression fails."""
    data = bytearray(path.read_bytes())
    streams = []
    start = 0
    while (found := data.find(b"/FlateDecode", start)) != -1:
        begin = data.index(b"stream\n", found) + len(b"stream\n")
        length = int(data[data.index(b"/Length", found) + 8 : data.index(b"\n", found + 13)])
        streams.append((begin, length))
        start = begin + length
    for index in pages:
        begin, length = streams[index]
        data[begin : begin + length] = damage(bytes(data[begin : begin + length]))
    path.write_bytes(bytes(data))
    return path


def scramble(stream: bytes) -> bytes:
    return stream[:2] + bytes(b ^ 0x5A for b in stream[2:])


def scan(
    source: bytes,
    pages: Sequence[int] | None = None,
    *,
    dpi: int = 300,
    angle: float = 0.0,
    noise: float = 0.0,
    seed: int = 7,
) -> list[Any]:
    """Pages of a born-digital PDF as a scanner would see them: each page rendered (pypdfium2)
    to a grayscale image at `dpi`, turned by `angle` degrees, with gaussian noise of standard
    deviation `noise` (0-255). PIL images, one per page of `pages` (default: every page)."""
    import numpy as np
    import pypdfium2
    from PIL import Image

    rng = np.random.default_rng(seed)
    document = pypdfium2.PdfDocument(source)
    images = []
    try:
        for index in range(len(document)) if pages is None else pages:
            page = document[index]
            image = page.render(scale=dpi / 72, grayscale=True).to_pil().convert("L")
            page.close()
            if angle:
                image = image.rotate(angle, resample=Image.BICUBIC, fillcolor=255)
            if noise:
                pixels = np.asarray(image, dtype=np.float32)
                pixels = pixels + rng.normal(0.0, noise, pixels.shape)
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            image.info["dpi"] = (dpi, dpi)
            images.append(image)
    finally:
        document.close()
    return images


def image_pdf(images: Sequence[Any], dpi: int = 300) -> bytes:
    """An image-only PDF (no text layer), one page per image, as a scanner writes one."""
    buffer = io.BytesIO()
    images[0].save(
        buffer, "PDF", save_all=True, append_images=list(images[1:]), resolution=float(dpi)
    )
    return buffer.getvalue()


def mix_pdf(
    parts: Sequence[tuple[bytes, int]], labels: Sequence[tuple[int, str, str, int]] = ()
) -> bytes:
    """A PDF of the pages (pdf bytes, 0-based page index) in `parts`, in order, with page
    labels (first page, style such as "/r" or "/D", prefix, start) set by pypdf."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    readers: dict[int, PdfReader] = {}
    for data, index in parts:
        reader = readers.setdefault(id(data), PdfReader(io.BytesIO(data)))
        writer.add_page(reader.pages[index])
    labels = [label for label in labels if label[0] < len(parts)]
    for start, style, prefix, first in labels:
        ends = [s for s, *_ in labels if s > start]
        end = (min(ends) if ends else len(parts)) - 1
        writer.set_page_label(start, end, style=style, prefix=prefix or None, start=first)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def character_error_rate(truth: str, read: str) -> float:
    """How far OCR's `read` is from the original text `truth`: the edit distance over the
    original's length, each run of whitespace counted as one space (NFKC-normalized)."""
    truth, read = (" ".join(unicodedata.normalize("NFKC", t).split()) for t in (truth, read))
    return _distance(truth, read) / max(len(truth), 1)


def _distance(a: str, b: str) -> int:
    """Levenshtein distance, bit-parallel (Myers 1999, in Hyyrö's form for whole strings)."""
    if not a or not b:
        return len(a) + len(b)
    full, last = (1 << len(a)) - 1, 1 << (len(a) - 1)
    peq: dict[str, int] = {}
    for i, c in enumerate(a):
        peq[c] = peq.get(c, 0) | (1 << i)
    pv, mv, score = full, 0, len(a)
    for c in b:
        eq = peq.get(c, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | ~(xh | pv)
        mh = pv & xh
        if ph & last:
            score += 1
        elif mh & last:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = (mh | ~(xv | ph)) & full
        mv = ph & xv
    return score
