"""The ZIP container of an EPUB, read one member at a time and never more than needed.

ebooklib reads every member of a book into memory, images and fonts included; a small
file whose members inflate to gigabytes (a zip bomb) then takes all the memory there is.
Here a member is read only when the book needs it, only if it is stored or deflated (the
two methods EPUB allows, and the two whose output zipfile bounds as it inflates), and
only up to a limit checked three ways: the size the archive declares, the ratio of that
size to the compressed size, and the bytes actually inflated.
"""

from __future__ import annotations

import io
import lzma
import zipfile
import zlib

from memagent_cli.errors import DocumentError

MEMBER_LIMIT = 128 * 1024 * 1024  # inflated bytes of any one member: no chapter is this big
# Text deflates about 3 to 10 times; a large member a hundred times smaller compressed is
# padding made to inflate, not a chapter. Small members may compress as they like.
RATIO_LIMIT = 100
RATIO_FROM = 8 * 1024 * 1024
_READ = 1024 * 1024  # bytes inflated per read
_METHODS = {
    zipfile.ZIP_BZIP2: "bzip2",
    zipfile.ZIP_LZMA: "LZMA",
    9: "Deflate64",
    93: "Zstandard",
}
# What zipfile and the decompressors raise on a damaged or unusual member.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    RuntimeError,
    NotImplementedError,
    EOFError,
    OSError,
    ValueError,
)


class Archive:
    """The members of one EPUB's ZIP, by name; `read` checks limits before inflating."""

    def __init__(self, data: bytes, where: str, *, total_limit: int) -> None:
        self.where = where
        self._left = total_limit  # inflated bytes still allowed across all members
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
            self._members = {info.filename: info for info in self._zip.infolist()}
            self._folded: dict[str, str] | None = None  # case-folded name -> member, built once
        except _ZIP_ERRORS as exc:
            raise DocumentError(
                f"{where} is damaged or not an EPUB: it is not a valid ZIP archive."
            ) from exc

    def __contains__(self, name: str) -> bool:
        return name in self._members

    def find(self, name: str) -> str | None:
        """The member `name` names: itself, else one that differs only in case (books made
        on case-insensitive file systems link "Chapter1.xhtml" to "chapter1.xhtml")."""
        if name in self._members:
            return name
        if self._folded is None:  # once per book: a scan per link is quadratic in chapters
            self._folded = {}
            for member in self._members:
                self._folded.setdefault(member.casefold(), member)
        return self._folded.get(name.casefold())

    def read(self, name: str, *, limit: int = MEMBER_LIMIT) -> bytes:
        """The inflated bytes of member `name`; DocumentError (one sentence) if it cannot be
        read or is larger than `limit`."""
        info = self._members[name]
        self._check(info, limit)
        chunks: list[bytes] = []
        size = 0
        try:
            with self._zip.open(info) as member:
                while chunk := member.read(_READ):
                    size += len(chunk)
                    # zipfile stops at the declared size; counting keeps that a promise here.
                    if size > min(limit, info.file_size, self._left):
                        raise self._too_large(name, limit)
                    chunks.append(chunk)
        except DocumentError:
            raise
        except _ZIP_ERRORS as exc:
            raise self._unreadable(name, exc) from exc
        self._left -= size
        return b"".join(chunks)

    def head(self, name: str, size: int) -> bytes:
        """At most the first `size` inflated bytes of `name` (b"" when they cannot be read)."""
        info = self._members.get(name)
        if info is None or info.flag_bits & 0x1 or info.compress_type not in _ALLOWED:
            return b""
        try:
            with self._zip.open(info) as member:
                return member.read(size)
        except _ZIP_ERRORS:
            return b""

    def _check(self, info: zipfile.ZipInfo, limit: int) -> None:
        name = info.filename
        if info.flag_bits & 0x1:
            raise DocumentError(
                f"{self.where} cannot be read: {name} in it is encrypted (DRM), and memagent "
                "reads only books without DRM."
            )
        if info.compress_type not in _ALLOWED:
            method = _METHODS.get(info.compress_type, f"method {info.compress_type}")
            raise DocumentError(
                f"{self.where} is damaged: {name} in it is compressed with {method}, which "
                "EPUB does not allow (only stored or deflated members)."
            )
        if info.file_size > min(limit, self._left):
            raise self._too_large(name, limit)
        if info.file_size > RATIO_FROM and info.file_size > RATIO_LIMIT * max(
            info.compress_size, 1
        ):
            raise DocumentError(
                f"{self.where} looks like a zip bomb: {name} in it would inflate from "
                f"{info.compress_size:,} to {info.file_size:,} bytes, so it is not read."
            )

    def _too_large(self, name: str, limit: int) -> DocumentError:
        if self._left < limit:
            return DocumentError(
                f"{self.where} is too large: its members inflate to more than the "
                "maximum document size (MEMAGENT_MAX_DOCUMENT_BYTES)."
            )
        return DocumentError(
            f"{self.where} is too large or a zip bomb: {name} in it inflates to more than "
            f"{limit:,} bytes."
        )

    def _unreadable(self, name: str, exc: BaseException) -> DocumentError:
        if isinstance(exc, RuntimeError | NotImplementedError):
            detail = str(exc).strip().rstrip(".") or type(exc).__name__
            return DocumentError(f"{self.where} cannot be read: {name} in it: {detail}.")
        return DocumentError(
            f"{self.where} is damaged: the compressed data of {name} in it is corrupt."
        )


_ALLOWED = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
