"""EPUB documents: chapters in spine order, titled from the table of contents.

The ZIP is read member by member with limits (`archive`), and only the members the text
needs are read: the container, the package file, the table of contents and the chapters.
Images, fonts and anything else the manifest lists are never inflated.
"""

from __future__ import annotations

import posixpath
from pathlib import PurePath, PurePosixPath

from lxml import etree

from memagent_cli.documents import package, xhtml
from memagent_cli.documents.archive import Archive
from memagent_cli.documents.document import Document, assemble
from memagent_cli.errors import DocumentError
from memagent_cli.progress import Progress

_CONTAINER = "META-INF/container.xml"
_ENCRYPTION = "META-INF/encryption.xml"
# Font obfuscation (IDPF, Adobe) scrambles fonts only; any other algorithm is DRM.
_FONT_OBFUSCATION = ("http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC")
_SMALL = 16 * 1024 * 1024  # container, package file, TOC: never this large in a real book
_XHTML_SUFFIXES = (".xhtml", ".html", ".htm", ".xml")
_PARSE_ERRORS = (etree.LxmlError, ValueError, TypeError)


def parse(
    data: bytes,
    source: str,
    where: str,
    *,
    password: str | None = None,
    progress: Progress | None = None,
    limit: int,
) -> Document:
    """A chapter-titled Document from the bytes of an EPUB (`password` is not used).

    `limit` bounds the bytes inflated from the whole archive.
    """
    archive = Archive(data, where, total_limit=limit)
    opf = _package_path(archive, where)
    book = _read_package(archive, opf, where)
    notes: list[str] = []
    files = _reading_order(book, where, notes)
    _refuse_drm(archive, files, where)
    titles = _toc_titles(archive, book, where, notes)
    parts: list[tuple[str, str]] = []
    undecoded: list[str] = []  # chapters that declare an encoding memagent does not decode
    for done, name in enumerate(files, 1):
        member = archive.find(name)
        if member is None:
            raise DocumentError(f"{where} is damaged: {name}, listed in its manifest, is missing.")
        decoded, declared = xhtml.decode(archive.read(member))
        if declared:
            undecoded.append(f"{name} ({declared!r})")
        text, heading = xhtml.to_text(decoded)
        parts.append((titles.get(name) or heading or PurePosixPath(name).name, text))
        if progress is not None:
            progress(f"extracting {PurePath(where).name}", done, len(files))
    document = assemble(
        parts,
        path=source,
        format="epub",
        sha256="",
        unit="chapter",
        title=book.title,
        pages=len(files),
    )
    if undecoded:
        notes.append(_undecoded_note(where, undecoded))
    document.notes = notes
    return document


def _undecoded_note(where: str, chapters: list[str]) -> str:
    """One sentence on the chapters read as UTF-8 instead of the encoding they declare."""
    listed = ", ".join(chapters[:3]) + (
        f" and {len(chapters) - 3} more" if len(chapters) > 3 else ""
    )
    one = len(chapters) == 1
    return (
        f"In {where}, {listed} {'declares an encoding' if one else 'declare encodings'} that "
        f"memagent does not read as text, so {'it was' if one else 'they were'} read as UTF-8."
    )


def _package_path(archive: Archive, where: str) -> str:
    if _CONTAINER not in archive:
        raise DocumentError(
            f"{where} is damaged: {_CONTAINER}, which says where its contents are, is missing."
        )
    try:
        path = package.package_path(archive.read(_CONTAINER, limit=_SMALL))
    except _PARSE_ERRORS as exc:
        raise DocumentError(f"{where} is damaged: {_CONTAINER} cannot be parsed.") from exc
    if not path:
        raise DocumentError(f"{where} is damaged: {_CONTAINER} does not name its package file.")
    if path not in archive:
        raise DocumentError(f"{where} is damaged: its package file ({path}) is missing.")
    return path


def _read_package(archive: Archive, path: str, where: str) -> package.Package:
    try:
        return package.read_package(archive.read(path, limit=_SMALL), path)
    except _PARSE_ERRORS as exc:
        raise DocumentError(
            f"{where} is damaged: its package file ({path}) cannot be parsed."
        ) from exc


def _reading_order(book: package.Package, where: str, notes: list[str]) -> list[str]:
    """The chapter files in reading order: the spine's, else the manifest's (with a note).

    Manifest entries that only add a #fragment to a file already listed name that file,
    so each file is read once, where it first appears.
    """
    nav = book.nav
    by_id = {item.id: item for item in book.manifest}
    spine = [by_id[i] for i in book.spine if i in by_id]
    items = spine or book.manifest
    if not spine:
        notes.append(
            f"{where} has no spine (the reading order), so its chapters are read in the "
            "order its manifest lists them."
        )
    files: dict[str, None] = {}  # ordered, and a set: a hostile spine repeats a file often
    for item in items:
        is_text = item.media_type in package.XHTML_TYPES or (
            not item.media_type and item.name.lower().endswith(_XHTML_SUFFIXES)
        )
        if is_text and item.name != nav:
            files.setdefault(item.name)
    if not files:
        raise DocumentError(f"The document is empty: {where} lists no chapters to read.")
    return list(files)


def _toc_titles(
    archive: Archive, book: package.Package, where: str, notes: list[str]
) -> dict[str, str]:
    """Chapter file -> the title of the first TOC entry, at any depth, that points into it.

    The EPUB 3 nav document comes first, the EPUB 2 NCX second; a book with neither (or
    with a TOC that cannot be read) gets its titles from headings, and a note says so.
    """
    for name, entries in ((book.nav, package.nav_entries), (book.ncx, package.ncx_entries)):
        if not name or name not in archive:
            continue
        try:
            found = entries(archive.read(name, limit=_SMALL), name)
        except (DocumentError, *_PARSE_ERRORS):
            continue  # a damaged TOC costs the titles, not the book
        if found:
            titles: dict[str, str] = {}
            for file, title in found:
                titles.setdefault(file, title)
            return titles
    notes.append(
        f"{where} has no usable table of contents, so chapters are titled from their headings."
    )
    return {}


def _refuse_drm(archive: Archive, files: list[str], where: str) -> None:
    """DocumentError when META-INF/encryption.xml says chapters are encrypted."""
    if _ENCRYPTION not in archive:
        return
    try:
        root = package.parse_xml(archive.read(_ENCRYPTION, limit=_SMALL))
    except (DocumentError, *_PARSE_ERRORS):
        return
    encrypted = set()
    for data in root.iter("{*}EncryptedData"):
        method = data.find("{*}EncryptionMethod")
        algorithm = method.get("Algorithm", "") if method is not None else ""
        for reference in data.iter("{*}CipherReference"):
            if algorithm not in _FONT_OBFUSCATION:
                encrypted.add(posixpath.normpath(package.resolve("", reference.get("URI", ""))))
    if encrypted.intersection(files):
        raise DocumentError(
            f"{where} is protected by DRM (its chapters are encrypted); memagent reads only "
            "books without DRM."
        )
