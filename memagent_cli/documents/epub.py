"""EPUB documents with ebooklib: chapters in spine order, titled from the table of contents.

XHTML is parsed with lxml's HTML parser: it is fast, tolerates the broken markup that
real books contain, knows HTML's named entities without reading a DTD, and never loads
external entities or anything over the network (`no_network=True`). ebooklib parses the
OPF and container with lxml too, with entity resolution off.
"""

from __future__ import annotations

import io
import posixpath
import re
import warnings
import zipfile
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote

import ebooklib
from ebooklib import epub
from lxml import etree, html

from memagent_cli.documents import Document, Progress, assemble
from memagent_cli.errors import DocumentError

_BLOCK_TAGS = (  # elements that end a paragraph
    "address article aside blockquote body caption center dd details dialog div dl dt "
    "fieldset figcaption figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr html legend "
    "li main nav ol p pre section summary table tbody tfoot thead tr ul"
)
_BLOCKS = frozenset(_BLOCK_TAGS.split())
_SKIP = frozenset(("head", "script", "style", "template", "noscript", "title"))
_CELLS = frozenset(("td", "th"))
_HEADINGS = frozenset(("h1", "h2", "h3"))
_BREAK = "\x00"  # stands for <br> until whitespace is collapsed
_SPACES = re.compile(r"[ \t\n\r\f\v]+")
_XML_DECLARATION = re.compile(rb"^\s*<\?xml[^>]*?encoding=[\"']([A-Za-z0-9._-]+)")
_MISSING_MEMBER = re.compile(r"no item named '([^']*)'")

# What ebooklib and lxml raise on a damaged book; only their calls sit inside the handler.
_DAMAGED = (
    epub.EpubException,
    KeyError,
    zipfile.BadZipFile,
    etree.LxmlError,
    ValueError,
    AttributeError,
    IndexError,
    TypeError,
    EOFError,
    OSError,
)


def parse(
    data: bytes,
    source: str,
    where: str,
    *,
    password: str | None = None,
    progress: Progress | None = None,
) -> Document:
    """A chapter-titled Document from the bytes of an EPUB (`password` is not used)."""
    book = _read_book(data, where)
    titles = _toc_titles(book.toc)
    items = [
        item
        for item in map(book.get_item_with_id, (i for i, _ in book.spine))
        if isinstance(item, epub.EpubHtml) and not _is_nav(item)
    ]
    parts: list[tuple[str, str]] = []
    for done, item in enumerate(items, 1):
        text, heading = xhtml_to_text(item.get_content())
        name = posixpath.normpath(item.file_name)
        parts.append((titles.get(name) or heading or PurePosixPath(name).name, text))
        if progress is not None:
            progress(done, len(items))
    return assemble(
        parts,
        path=source,
        format="epub",
        sha256="",
        unit="chapter",
        title=str(book.title or "").strip(),
        pages=len(items),
    )


def xhtml_to_text(content: bytes) -> tuple[str, str]:
    """The text of one XHTML file, blocks separated by blank lines, and its first h1-h3."""
    try:
        root = html.document_fromstring(
            _decode(content),
            parser=html.HTMLParser(no_network=True, remove_comments=True, remove_pis=True),
        )
    except (etree.ParserError, ValueError):  # no elements at all
        return "", ""
    paragraphs: list[str] = []
    current: list[str] = []
    pre = 0
    heading: Any = None
    heading_text = ""

    def flush() -> None:
        joined = "".join(current)
        current.clear()
        if pre:
            lines = joined.replace(_BREAK, "\n").strip("\n").split("\n")
            text = "\n".join(line.rstrip() for line in lines)
        else:
            lines = (line.strip() for line in _SPACES.sub(" ", joined).split(_BREAK))
            text = "\n".join(line for line in lines if line)
        if text.strip():
            paragraphs.append(text)

    walker = etree.iterwalk(root, events=("start", "end"))
    for event, element in walker:
        tag = element.tag.rpartition(":")[2].lower() if isinstance(element.tag, str) else ""
        if event == "start":
            if tag in _SKIP:
                walker.skip_subtree()
                continue
            if tag in _BLOCKS:
                flush()
            if tag == "pre":
                pre += 1
            elif tag == "br":
                current.append(_BREAK)
            elif tag in _CELLS:
                current.append(" ")
            if tag in _HEADINGS and heading is None:
                heading = element
            if element.text:
                current.append(element.text)
        else:
            if tag not in _SKIP:
                if tag in _BLOCKS:
                    flush()
                if tag == "pre":
                    pre -= 1
                if element is heading and not heading_text:
                    heading_text = _SPACES.sub(" ", element.text_content()).strip()
            if element.tail:
                current.append(element.tail)
    flush()
    return "\n\n".join(paragraphs), heading_text


def _decode(content: bytes) -> str:
    """XHTML bytes as text, without the XML declaration (lxml refuses it in a str)."""
    if content.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        declared = _XML_DECLARATION.match(content)
        encoding = declared.group(1).decode("ascii") if declared else "utf-8-sig"
    try:
        text = content.decode(encoding, errors="replace")
    except LookupError:
        text = content.decode("utf-8-sig", errors="replace")
    return re.sub(r"^\s*<\?xml[^>]*\?>", "", text.lstrip("\ufeff"), count=1)


def _read_book(data: bytes, where: str) -> epub.EpubBook:
    """The parsed book; DocumentError with what is wrong when the EPUB is damaged."""
    package = ""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            if "META-INF/container.xml" not in names:
                raise DocumentError(
                    f"{where} is damaged: META-INF/container.xml, which says where its "
                    "contents are, is missing."
                )
            package = _package_path(archive.read("META-INF/container.xml"))
        if not package:
            raise DocumentError(
                f"{where} is damaged: META-INF/container.xml does not name its package file."
            )
        if package not in names:
            raise DocumentError(f"{where} is damaged: its package file ({package}) is missing.")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return epub.read_epub(io.BytesIO(data), options={"ignore_ncx": True})
            except IndexError:  # a nav document without a toc <nav>: use the NCX instead
                return epub.read_epub(io.BytesIO(data), options={"ignore_ncx": False})
    except zipfile.BadZipFile as exc:
        raise DocumentError(
            f"{where} is damaged or not an EPUB: it is not a valid ZIP archive."
        ) from exc
    except _DAMAGED as exc:
        missing = _MISSING_MEMBER.search(str(exc)) if isinstance(exc, KeyError) else None
        if missing is not None:
            raise DocumentError(
                f"{where} is damaged: {missing.group(1)}, listed in its manifest, is missing."
            ) from exc
        what = f"its package file ({package})" if package else "META-INF/container.xml"
        raise DocumentError(f"{where} is damaged: {what} cannot be parsed.") from exc


def _package_path(container: bytes) -> str:
    """Where container.xml says the OPF package file is ("" when it does not say)."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    root = etree.fromstring(container, parser=parser)
    for rootfile in root.iter("{*}rootfile"):
        if rootfile.get("media-type") == "application/oebps-package+xml":
            return posixpath.normpath(rootfile.get("full-path", ""))
    return ""


def _is_nav(item: epub.EpubItem) -> bool:
    return (
        isinstance(item, epub.EpubNav)
        or item.get_type() == ebooklib.ITEM_NAVIGATION
        or "nav" in (getattr(item, "properties", None) or [])
    )


def _toc_titles(toc: list[Any]) -> dict[str, str]:
    """File name -> title of the first table-of-contents entry that points into it."""
    titles: dict[str, str] = {}
    stack = list(reversed(toc))
    while stack:
        entry = stack.pop()
        if isinstance(entry, tuple | list):
            node, children = entry[0], entry[1] if len(entry) > 1 else []
            stack.extend(reversed(children))
        else:
            node = entry
        href, title = getattr(node, "href", "") or "", getattr(node, "title", "") or ""
        name = posixpath.normpath(unquote(href.partition("#")[0])) if href else ""
        title = _SPACES.sub(" ", str(title)).strip()
        if name and title:
            titles.setdefault(name, title)
    return titles
