"""An EPUB's package: where its package file is, its manifest, spine and table of contents.

Every href is resolved to the name of a ZIP member: relative to the file that holds it,
percent-decoded, and without its `#fragment`, so `about-manual.xhtml#o8` names the file
`about-manual.xhtml`. XML is parsed with entity resolution, DTDs and the network off.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from lxml import etree

from memagent_cli.documents import xhtml

_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
_SPACES = re.compile(r"\s+")
XHTML_TYPES = frozenset(("application/xhtml+xml", "text/html", "application/xml"))
_NCX_TYPE = "application/x-dtbncx+xml"


@dataclass(frozen=True)
class Item:
    """One manifest entry: the ZIP member it names, its media type and properties."""

    id: str
    name: str
    media_type: str
    properties: frozenset[str] = frozenset()


@dataclass
class Package:
    """What the package file says: title, manifest (in its order), spine and TOC files."""

    title: str = ""
    manifest: list[Item] = field(default_factory=list)
    spine: list[str] = field(default_factory=list)  # manifest ids, in reading order
    ncx: str = ""  # ZIP member of the EPUB 2 table of contents, if any

    def item(self, item_id: str) -> Item | None:
        return next((i for i in self.manifest if i.id == item_id), None)

    @property
    def nav(self) -> str:
        """The ZIP member of the EPUB 3 navigation document, if any."""
        return next((i.name for i in self.manifest if "nav" in i.properties), "")


def parse_xml(data: bytes) -> etree._Element:
    """An XML root; lxml's errors (and ValueError for odd input) propagate to the caller."""
    return etree.fromstring(data, parser=_XML)


def package_path(container: bytes) -> str:
    """Where META-INF/container.xml says the package file is ("" when it does not say)."""
    for rootfile in parse_xml(container).iter("{*}rootfile"):
        media_type = rootfile.get("media-type")
        if media_type in (None, "application/oebps-package+xml") and rootfile.get("full-path"):
            return resolve("", rootfile.get("full-path", ""))
    return ""


def read_package(data: bytes, path: str) -> Package:
    """The package file at ZIP member `path`, its hrefs resolved to member names."""
    root = parse_xml(data)
    package = Package()
    title = root.find(".//{*}metadata/{*}title")
    if title is not None:
        package.title = _SPACES.sub(" ", "".join(title.itertext())).strip()
    seen: set[str] = set()
    for node in root.iterfind(".//{*}manifest/{*}item"):
        item_id, href = node.get("id") or "", node.get("href") or ""
        name = resolve(path, href)
        if not item_id or not name or item_id in seen:
            continue
        seen.add(item_id)
        properties = frozenset((node.get("properties") or "").split())
        package.manifest.append(Item(item_id, name, node.get("media-type") or "", properties))
    spine = root.find(".//{*}spine")
    if spine is not None:
        # Non-linear items (linear="no": notes, answers) are the book's text too.
        package.spine = [ref.get("idref") or "" for ref in spine.iterfind("{*}itemref")]
        toc = package.item(spine.get("toc") or "")
        package.ncx = toc.name if toc is not None else ""
    if not package.ncx:
        package.ncx = next((i.name for i in package.manifest if i.media_type == _NCX_TYPE), "")
    return package


def resolve(base: str, href: str) -> str:
    """The ZIP member that `href`, found in member `base`, names ("" for external links)."""
    parts = urlsplit(href.strip())
    if parts.scheme or parts.netloc or not parts.path:
        return ""
    joined = posixpath.join(posixpath.dirname(base), unquote(parts.path))
    name = posixpath.normpath(joined)
    return "" if name.startswith("../") or name == ".." else name.lstrip("/")


def nav_entries(data: bytes, path: str) -> list[tuple[str, str]]:
    """(member, title) of each link in an EPUB 3 nav document's table of contents, at any
    depth, in document order; [] when it has no table of contents."""
    root = xhtml.parse(data)
    if root is None:
        return []
    navs = list(root.iter("nav"))
    toc = next((n for n in navs if "toc" in _types(n)), None)
    if toc is None:
        return []
    return _entries((resolve(path, a.get("href") or ""), a.text_content()) for a in toc.iter("a"))


def ncx_entries(data: bytes, path: str) -> list[tuple[str, str]]:
    """(member, title) of each navPoint of an EPUB 2 NCX, at any depth, in document order."""
    root = parse_xml(data)
    found = []
    for point in root.iter("{*}navPoint"):
        label = point.find("{*}navLabel/{*}text")
        content = point.find("{*}content")
        src = content.get("src") or "" if content is not None else ""
        found.append((resolve(path, src), "".join(label.itertext()) if label is not None else ""))
    return _entries(found)


def _types(element: etree._Element) -> set[str]:
    # The HTML parser keeps "epub:type" as a plain attribute name; role is the ARIA spelling.
    values = [v for k, v in element.attrib.items() if k.rpartition(":")[2] in ("type", "role")]
    return {word.removeprefix("doc-") for value in values for word in value.split()}


def _entries(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    cleaned = ((name, _SPACES.sub(" ", title).strip()) for name, title in pairs)
    return [(name, title) for name, title in cleaned if name and title]
