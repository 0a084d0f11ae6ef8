"""The header of a GGUF file: its key-value pairs and its tensor list, read in place from a
memory map without decoding the vocabulary. Every count and length is checked against the
file's size before it is used, so a damaged or hostile file costs no more than its size."""

from __future__ import annotations

import functools
import mmap
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MAX_DIMS = 4  # GGML_MAX_DIMS
# Scalar value types by GGUF type id: struct format and size.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_KEPT_ARRAYS = {"tokenizer.ggml.tokens"}  # arrays whose length is reported
# The pairs memagent reads (models/gguf.py), and those named after the architecture.
# The reader a model was trained for, which memagent's converter records (readers/).
READER_KEY = "memagent.reader"
_KEPT = {
    READER_KEY,
    "general.architecture",
    "general.name",
    "general.size_label",
    "general.file_type",
    "general.alignment",
    "tokenizer.chat_template",
    "tokenizer.ggml.pre",
    "split.count",
    *_KEPT_ARRAYS,
}
_PER_ARCH = (".context_length", ".block_count")
_MAX_PER_ARCH = 64  # kept before general.architecture says which one counts
SPLIT_NAME = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)


def split_parts(path: Path) -> tuple[int, int]:
    """(index, count) of a split model's part from its name, `-00001-of-00003.gguf`; (1, 1)."""
    match = SPLIT_NAME.match(path.name.removesuffix(".gguf"))
    return (int(match[2]), int(match[3])) if match else (1, 1)


def part_paths(path: Path) -> list[Path]:
    """Every part of the model whose first (or only) file is `path`."""
    match = SPLIT_NAME.match(path.name.removesuffix(".gguf"))
    if match is None:
        return [path]
    count = int(match[3])
    return [path.with_name(f"{match[1]}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header lists it: name, ggml type id, and ne (ne[0] first)."""

    name: str
    type: int
    shape: tuple[int, ...]
    offset: int = 0  # where its data starts in the file, as the header says


@dataclass(frozen=True)
class Header:
    """A GGUF header as far as memagent needs it: the few key-value pairs read (arrays: their
    length), the tensor count, and where the tensor list and the tensor data start. The
    tensor list stays in the file: `tensors` walks it one entry at a time."""

    fields: dict[str, Any]
    tensor_count: int
    tensor_list: int  # byte offset of the first tensor's description
    data_start: int  # byte offset of the tensor data, which follows the header, aligned
    endian: str


def read(path: Path) -> Header:
    """The header of the GGUF file at `path`, parsed once per version of the file (its
    device, inode, size and mtime). Raises OSError, or ValueError, struct.error or
    UnicodeDecodeError on a malformed header."""
    stat = path.stat()
    return _read(path.resolve(), (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=16)  # small: a header holds a few strings, never the tensors
def _read(path: Path, version: tuple[int, ...]) -> Header:
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return parse(data)


def tensors(path: Path) -> Iterator[TensorInfo]:
    """The tensor list of the model at `path`, every part of a split one included, one
    entry at a time: a list of Python objects would take 11 times the header's size."""
    for part in part_paths(path):
        header = read(part)
        with part.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield from walk(data, header)


def walk(data: mmap.mmap, header: Header) -> Iterator[TensorInfo]:
    """Each tensor `parse` found in `data`, with where its data starts in the file."""
    u64 = struct.Struct(header.endian + "Q")
    u32 = struct.Struct(header.endian + "I")
    at = header.tensor_list
    for _ in range(header.tensor_count):
        (length,) = u64.unpack_from(data, at)
        name = data[at + 8 : at + 8 + length].decode("utf-8")
        at += 8 + length
        (n_dims,) = u32.unpack_from(data, at)
        if n_dims > _MAX_DIMS:  # `data` is not the file `header` was read from
            raise ValueError("too many dimensions")
        dims = struct.unpack_from(header.endian + "Q" * n_dims, data, at + 4)
        at += 4 + 8 * n_dims
        kind, offset = struct.unpack_from(header.endian + "IQ", data, at)
        at += 12
        yield TensorInfo(name, kind, tuple(dims), header.data_start + offset)


def parse(data: mmap.mmap) -> Header:
    """The header in `data`, its tensor list checked but not kept. Raises ValueError,
    struct.error or UnicodeDecodeError on a malformed header."""
    version = struct.unpack_from("<I", data, 4)[0]
    endian = "<"
    if version & 0xFFFF == 0:  # written on a big-endian machine
        endian, version = ">", struct.unpack_from(">I", data, 4)[0]
    if version < 2:
        raise ValueError("GGUF version 1 is not supported")
    n_tensors, n_kv = struct.unpack_from(endian + "QQ", data, 8)
    # A key-value pair takes at least 12 bytes, a tensor's description at least 24.
    if n_kv * 12 > len(data) or n_tensors * 24 > len(data):
        raise ValueError("counts larger than the file")
    offset = 24
    u64 = struct.Struct(endian + "Q")
    u32 = struct.Struct(endian + "I")

    def string(at: int) -> tuple[str, int]:
        (length,) = u64.unpack_from(data, at)
        at += 8
        if at + length > len(data):
            raise ValueError("string past the end of the file")
        return data[at : at + length].decode("utf-8"), at + length

    def skip(kind: int, at: int, count: int, depth: int = 0) -> int:
        if kind in _SCALARS:
            return at + struct.calcsize(_SCALARS[kind]) * count
        if kind == _STRING:
            if count * 8 > len(data) - at:
                raise ValueError("array larger than the file")
            for _ in range(count):
                at += 8 + u64.unpack_from(data, at)[0]
            return at
        if kind == _ARRAY and depth < 8:  # arrays of arrays: each its own kind and length
            if count * 12 > len(data) - at:
                raise ValueError("array larger than the file")
            for _ in range(count):
                inner, length = struct.unpack_from(endian + "IQ", data, at)
                at = skip(inner, at + 12, length, depth + 1)
            return at
        raise ValueError(f"unknown GGUF value type {kind}")

    # Only the pairs memagent reads are kept: a header of a million one-byte pairs would
    # otherwise be a dict of a million entries.
    fields: dict[str, Any] = {}
    per_arch: dict[str, Any] = {}  # `ARCH.context_length` and the like, ARCH not known yet
    for _ in range(n_kv):
        key, offset = string(offset)
        (kind,) = u32.unpack_from(data, offset)
        offset += 4
        value: Any = None
        if kind in _SCALARS:
            fmt = endian + _SCALARS[kind]
            value = struct.unpack_from(fmt, data, offset)[0]
            offset += struct.calcsize(fmt)
        elif kind == _STRING:
            value, offset = string(offset)
        elif kind == _ARRAY:
            item_kind, length = struct.unpack_from(endian + "IQ", data, offset)
            offset = skip(item_kind, offset + 12, length)
            value = length if key in _KEPT_ARRAYS else None
        else:
            raise ValueError(f"unknown GGUF value type {kind}")
        if offset > len(data):
            raise ValueError("metadata past the end of the file")
        if key in _KEPT:
            fields[key] = value
        elif key.endswith(_PER_ARCH) and len(per_arch) < _MAX_PER_ARCH:
            per_arch[key] = value
    arch = fields.get("general.architecture")
    fields.update({k: v for k, v in per_arch.items() if k.rsplit(".", 1)[0] == arch})
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise ValueError("an alignment that is not a power of two")

    tensor_list = offset
    for _ in range(n_tensors):  # walked to find where the data starts; nothing kept
        (length,) = u64.unpack_from(data, offset)
        offset += 8 + length
        (n_dims,) = u32.unpack_from(data, offset)
        if n_dims > _MAX_DIMS:
            raise ValueError("too many dimensions")
        offset += 4 + 8 * n_dims + 4 + 8
        if offset > len(data):
            raise ValueError("tensor list past the end of the file")
    start = -(-offset // alignment) * alignment  # the data follows the header, aligned
    return Header(fields, n_tensors, tensor_list, start, endian)
