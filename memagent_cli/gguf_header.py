"""The header of a GGUF file: its key-value pairs and its tensor list, read in place from a
memory map without decoding the vocabulary. Every count and length is checked against the
file's size before it is used, so a damaged or hostile file costs no more than its size."""

from __future__ import annotations

import mmap
import re
import struct
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


def tensors(path: Path) -> list[TensorInfo]:
    """The tensor list of the model at `path`, every part of a split one included."""
    found = []
    for part in part_paths(path):
        with part.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found += parse(data)[1]
    return found


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header lists it: name, ggml type id, and ne (ne[0] first)."""

    name: str
    type: int
    shape: tuple[int, ...]
    offset: int = 0  # where its data starts in the file, as the header says


def parse(data: mmap.mmap) -> tuple[dict[str, Any], list[TensorInfo]]:
    """Key-value pairs (arrays: their length, for the few reported) and the tensor list.
    Raises ValueError, struct.error or UnicodeDecodeError on a malformed header."""
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

    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key, offset = string(offset)
        (kind,) = u32.unpack_from(data, offset)
        offset += 4
        if kind in _SCALARS:
            fmt = endian + _SCALARS[kind]
            fields[key] = struct.unpack_from(fmt, data, offset)[0]
            offset += struct.calcsize(fmt)
        elif kind == _STRING:
            fields[key], offset = string(offset)
        elif kind == _ARRAY:
            item_kind, length = struct.unpack_from(endian + "IQ", data, offset)
            offset = skip(item_kind, offset + 12, length)
            if key in _KEPT_ARRAYS:
                fields[key] = length
        else:
            raise ValueError(f"unknown GGUF value type {kind}")
        if offset > len(data):
            raise ValueError("metadata past the end of the file")
    fields["GGUF.tensor_count"] = n_tensors  # after the pairs: no key may stand for it
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise ValueError("an alignment that is not a power of two")

    tensors, found = [], []
    for _ in range(n_tensors):
        name, offset = string(offset)
        (n_dims,) = u32.unpack_from(data, offset)
        if n_dims > _MAX_DIMS:
            raise ValueError("too many dimensions")
        dims = struct.unpack_from(endian + "Q" * n_dims, data, offset + 4)
        offset += 4 + 8 * n_dims
        kind, at = struct.unpack_from(endian + "IQ", data, offset)
        offset += 4 + 8
        found.append((name, kind, tuple(int(n) for n in dims), at))
    start = -(-offset // alignment) * alignment  # the data follows the header, aligned
    for name, kind, dims, at in found:
        tensors.append(TensorInfo(name, kind, dims, start + at))
    return fields, tensors
