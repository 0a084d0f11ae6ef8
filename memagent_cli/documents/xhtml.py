"""The text of one XHTML file of an EPUB: paragraphs, and the heading that titles it.

XHTML is parsed with lxml's HTML parser: it is fast, tolerates the broken markup that
real books contain, knows HTML's named entities without reading a DTD, and never loads
external entities or anything over the network (`no_network=True`).
"""

from __future__ import annotations

import codecs
import re
from typing import Any

from lxml import etree, html

_BLOCK_TAGS = (  # elements that end a paragraph
    "address article aside blockquote body caption center dd details dialog div dl dt "
    "fieldset figcaption figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr html legend "
    "li main ol p pre section summary table tbody tfoot thead tr ul"
)
_BLOCKS = frozenset(_BLOCK_TAGS.split())
# Not the book's text: code, metadata, and navigation bars (Sphinx starts every page with
# one whose heading is "Navigation").
_SKIP = frozenset(("head", "script", "style", "template", "noscript", "title", "nav"))
_CELLS = frozenset(("td", "th"))
_HEADINGS = frozenset(("h1", "h2", "h3"))
_BREAK = "\x00"  # stands for <br> until whitespace is collapsed
_SPACES = re.compile(r"[ \t\n\r\f\v]+")
_XML_DECLARATION = re.compile(rb"^\s*<\?xml[^>]*?encoding=[\"']([A-Za-z0-9._-]+)")
# Codecs Python counts as text encodings that are no character set a page is written in:
# punycode and idna spell domain names (punycode decodes in quadratic time: 80K characters
# take 0.3 s, 8 MB most of an hour), the escape codecs read Python string literals, UTF-7
# hides markup (HTML forbids it), and "undefined" always fails. Python itself refuses the
# codecs that are not text encodings at all (base64, zlib, rot13, ...).
_NOT_CHARSETS = frozenset(
    ("punycode", "idna", "unicode-escape", "raw-unicode-escape", "utf-7", "undefined")
)
_PARSER = html.HTMLParser(no_network=True, remove_comments=True, remove_pis=True)


def parse(content: bytes | str) -> Any:
    """The root element of an XHTML (or HTML) file, its bytes or its text as `decode` gives
    it, or None when it has no elements."""
    text = decode(content)[0] if isinstance(content, bytes) else content
    try:
        return html.document_fromstring(text, parser=_PARSER)
    except (etree.ParserError, ValueError):
        return None


def to_text(content: bytes | str) -> tuple[str, str]:
    """The text of one XHTML file (its bytes, or its text as `decode` gives it), blocks
    separated by blank lines, and its first h1-h3 outside navigation."""
    root = parse(content)
    if root is None:
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
        skip = tag in _SKIP or element.get("role") == "navigation"
        if event == "start":
            if skip:
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
            if not skip:
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


def encoding(content: bytes) -> tuple[str, str]:
    """The codec that decodes an XHTML file, and the encoding it declares when that is not
    a character set memagent decodes ("" when it is): such a file is read as UTF-8.

    Only the XML declaration and a byte order mark count: the text is decoded before lxml
    parses it, so a `<meta charset>` is never acted on.
    """
    if content.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16", ""
    declared = _XML_DECLARATION.match(content)
    if declared is None:
        return "utf-8-sig", ""
    name = declared.group(1).decode("ascii")
    try:
        codec = codecs.lookup(name)
    except LookupError:
        return "utf-8-sig", name
    if not codec._is_text_encoding or codec.name in _NOT_CHARSETS:
        return "utf-8-sig", name
    return codec.name, ""


def decode(content: bytes) -> tuple[str, str]:
    """XHTML bytes as text, without the XML declaration (lxml refuses it in a str), and the
    encoding it declares that memagent read as UTF-8 instead ("" when none: `encoding`)."""
    codec, undecoded = encoding(content)
    try:
        text = content.decode(codec, errors="replace")
    except UnicodeError:  # a codec that fails whatever `errors` says
        text = content.decode("utf-8-sig", errors="replace")
    return re.sub(r"^\s*<\?xml[^>]*\?>", "", text.lstrip("\ufeff"), count=1), undecoded
