"""Files written byte by byte, so that a test sets every field: ZIPs (and the EPUBs in
them) with members that lie about their size, method or flags, and minimal PDFs."""

from __future__ import annotations

import bz2
import struct
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Member:
    """One ZIP member. `raw`, `crc` and `size` override what `data` would give, to write
    members whose stored bytes or declared size lie."""

    name: str
    data: bytes = b""
    method: int = zipfile.ZIP_DEFLATED
    flags: int = 0
    raw: bytes | None = None
    crc: int | None = None
    size: int | None = None

    def payload(self) -> tuple[bytes, int, int]:
        """(stored bytes, crc32, declared size)."""
        if self.raw is not None:
            return self.raw, self.crc or 0, self.size if self.size is not None else 0
        if self.method == zipfile.ZIP_DEFLATED:
            packer = zlib.compressobj(6, zlib.DEFLATED, -15)
            raw = packer.compress(self.data) + packer.flush()
        elif self.method == zipfile.ZIP_BZIP2:
            raw = bz2.compress(self.data)
        else:
            raw = self.data
        crc = zlib.crc32(self.data) if self.crc is None else self.crc
        return raw, crc, len(self.data) if self.size is None else self.size


def write_zip(path: Path, members: Sequence[Member]) -> Path:
    """A ZIP written by hand (local headers, central directory, end record), so that any
    field can be set to what a damaged or hostile file would have."""
    body, directory = bytearray(), bytearray()
    for member in members:
        raw, crc, size = member.payload()
        name = member.name.encode()
        offset = len(body)
        fields = (member.flags, member.method, 0, 0x21, crc, len(raw), size, len(name))
        body += _local_header(fields) + name + raw
        directory += _central_header(fields, offset) + name
    end = struct.pack(
        "<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(directory), len(body), 0
    )
    path.write_bytes(bytes(body + directory) + end)
    return path


def _local_header(fields: tuple[int, ...]) -> bytes:
    flags, method, time, date, crc, compressed, size, name_length = fields
    return struct.pack(
        "<IHHHHHIIIHH",
        0x04034B50,
        20,
        flags,
        method,
        time,
        date,
        crc,
        compressed,
        size,
        name_length,
        0,
    )


def _central_header(fields: tuple[int, ...], offset: int) -> bytes:
    flags, method, time, date, crc, compressed, size, name_length = fields
    return struct.pack(
        "<IHHHHHHIIIHHHHHII",
        0x02014B50,
        20,
        20,
        flags,
        method,
        time,
        date,
        crc,
        compressed,
        size,
        name_length,
        0,
        0,
        0,
        0,
        0,
        offset,
    )


def members_of(path: Path) -> list[Member]:
    """The members of an existing ZIP (an EPUB ebooklib wrote), to change and write again."""
    with zipfile.ZipFile(path) as archive:
        return [
            Member(info.filename, archive.read(info), info.compress_type)
            for info in archive.infolist()
        ]


def replace_member(path: Path, member: Member) -> Path:
    """Rewrite the ZIP at `path` with `member` in place of the one of the same name (or
    added at the end). The other members are copied as stored, never inflated, so a zip
    bomb already in the file costs nothing."""
    members = _stored_members(path)
    names = [m.name for m in members]
    if member.name in names:
        members[names.index(member.name)] = member
    else:
        members.append(member)
    return write_zip(path, members)


def _stored_members(path: Path) -> list[Member]:
    data = path.read_bytes()
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    members = []
    for info in infos:
        name_length, extra_length = struct.unpack_from("<HH", data, info.header_offset + 26)
        start = info.header_offset + 30 + name_length + extra_length
        raw = data[start : start + info.compress_size]
        members.append(
            Member(
                info.filename,
                method=info.compress_type,
                flags=info.flag_bits,
                raw=raw,
                crc=info.CRC,
                size=info.file_size,
            )
        )
    return members


def zeros_member(name: str, size: int) -> Member:
    """A member that inflates to `size` zero bytes from about size/1000 stored bytes.

    A raw deflate block of 1 MiB of zeros, ended by a full flush, is the same bytes every
    time, so the stream is that block repeated (no gigabyte is ever held or compressed)."""
    block_size = 1 << 20
    assert size % block_size == 0
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    zeros = bytes(block_size)
    block = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size // block_size):
        crc = zlib.crc32(zeros, crc)
    raw = block * (size // block_size) + packer.flush(zlib.Z_FINISH)
    return Member(name, raw=raw, crc=crc, size=size)


def package_epub(
    path: Path,
    files: dict[str, str],
    *,
    manifest: Sequence[tuple[str, str, str]],
    spine: Sequence[str] | None,
    title: str = "A Hand-made Book",
    nav_id: str = "",
    ncx_id: str = "",
) -> Path:
    """An EPUB whose package file is written here: `files` are (member name -> content)
    under OEBPS/, `manifest` is (id, href, media type) in order, `spine` the idrefs (None
    writes no <spine> at all)."""
    items = "".join(
        f'<item id="{i}" href="{href}" media-type="{media}"'
        + (' properties="nav"' if i == nav_id else "")
        + "/>"
        for i, href, media in manifest
    )
    toc = f' toc="{ncx_id}"' if ncx_id else ""
    refs = "".join(f'<itemref idref="{i}"/>' for i in spine or [])
    opf = (
        '<?xml version="1.0" encoding="utf-8"?>'
        '<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
        '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
        f'<dc:identifier id="id">hand-made</dc:identifier><dc:title>{title}</dc:title>'
        f"<dc:language>en</dc:language></metadata><manifest>{items}</manifest>"
        + (f"<spine{toc}>{refs}</spine>" if spine is not None else "")
        + "</package>"
    )
    container = (
        '<?xml version="1.0"?><container version="1.0" '
        'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
        '<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
        "</rootfiles></container>"
    )
    members = [
        Member("mimetype", b"application/epub+zip", zipfile.ZIP_STORED),
        Member("META-INF/container.xml", container.encode()),
        Member("OEBPS/content.opf", opf.encode()),
        *(Member(f"OEBPS/{name}", content.encode()) for name, content in files.items()),
    ]
    return write_zip(path, members)


def page(body: str, title: str = "page") -> str:
    """An XHTML file with `body`."""
    return (
        '<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml" '
        f'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>{title}</title></head>'
        f"<body>{body}</body></html>"
    )


def nav_document(entries: Sequence[tuple[str, str, Sequence]]) -> str:
    """An EPUB 3 nav document whose TOC nests `entries`: (title, href, children)."""

    def ol(items: Sequence[tuple[str, str, Sequence]]) -> str:
        return (
            "<ol>"
            + "".join(
                f'<li><a href="{href}">{title}</a>{ol(children) if children else ""}</li>'
                for title, href, children in items
            )
            + "</ol>"
        )

    return page(f'<nav epub:type="toc" id="toc"><h1>Table of Contents</h1>{ol(entries)}</nav>')


def ncx_document(entries: Sequence[tuple[str, str]]) -> str:
    """An EPUB 2 NCX with one navPoint per (title, src)."""
    points = "".join(
        f'<navPoint id="p{n}" playOrder="{n}"><navLabel><text>{title}</text></navLabel>'
        f'<content src="{src}"/></navPoint>'
        for n, (title, src) in enumerate(entries, 1)
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/"'
        f' version="2005-1"><head/><docTitle><text>t</text></docTitle><navMap>{points}</navMap>'
        "</ncx>"
    )


def pdf_of_streams(path: Path, streams: Sequence[bytes]) -> Path:
    """A minimal PDF written by hand: one page per content stream, each stored as given
    (zlib data, /FlateDecode), with a correct cross-reference table."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(streams)))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(streams)} >>".encode())
    font = "<< /Font << /F1 << /Type /Font /Subtype /Type1 /BaseFont /Helvetica >> >> >>"
    for i, raw in enumerate(streams):
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources {font} >>".encode()
        )
        head = f"<< /Length {len(raw)} /Filter /FlateDecode >>\nstream\n".encode()
        objects.append(head + raw + b"\nendstream")
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    path.write_bytes(bytes(out))
    return path


def page_stream(text: str) -> bytes:
    """A zlib-compressed content stream that shows `text` in Helvetica."""
    return zlib.compress(f"BT /F1 12 Tf 72 700 Td ({text}) Tj ET".encode())
