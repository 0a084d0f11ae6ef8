"""What a GGUF file is, read from its header alone: architecture, quantization, trained
context, chat template.

gguf.GGUFReader parses every vocabulary entry into numpy objects (seconds for a 150K-token
vocabulary), so the key-value section and the tensor list are walked here directly; the
weights after them are never touched. The `gguf` package supplies the names of types.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli.errors import ModelError
from memagent_cli.files import check_gguf

_MAX_DIMS = 4  # GGML_MAX_DIMS
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
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
_KEPT_ARRAYS = {"tokenizer.ggml.tokens"}  # arrays whose length we report


@dataclass(frozen=True)
class GGUFInfo:
    """The facts a user needs to choose a model file."""

    path: Path
    size: int  # bytes, all parts of a split model together
    architecture: str
    quantization: str
    context_length: int | None
    chat_template: str | None
    name: str  # general.name, as the converter wrote it
    size_label: str  # general.size_label, e.g. "135M"
    layers: int | None
    vocabulary: int | None
    tensors: int
    parts: int  # files of a split model (1 when not split)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "size": self.size,
            "architecture": self.architecture,
            "quantization": self.quantization,
            "context_length": self.context_length,
            "has_chat_template": bool(self.chat_template),
            "general_name": self.name,
            "size_label": self.size_label,
            "layers": self.layers,
            "vocabulary": self.vocabulary,
            "tensors": self.tensors,
            "parts": self.parts,
        }


def split_parts(path: Path) -> tuple[int, int]:
    """(index, count) of a split model's part from its name, `-00001-of-00003.gguf`; (1, 1)."""
    match = _SPLIT.match(path.name.removesuffix(".gguf"))
    return (int(match[2]), int(match[3])) if match else (1, 1)


def quant_tag(filename: str) -> str:
    """The quantization tag llama.cpp reads from a file name: `x.Q4_K_M.gguf` -> `Q4_K_M`."""
    stem = Path(filename).name.removesuffix(".gguf")
    if match := _SPLIT.match(stem):
        stem = match[1]
    found = _TAG.search(stem)
    return found[1].upper() if found else ""


def read(path: Path) -> GGUFInfo:
    """The header facts of the GGUF file at `path`; ModelError if it is not one. Every count
    and length in the header is checked against the file's size before it is used, so a
    damaged or hostile file costs no more memory than its own size."""
    check_gguf(path)
    try:
        # mmap only maps: the pages of the header are the only ones read from disk.
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            fields, tensor_types = _parse(data)
    except OSError as exc:
        raise ModelError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    except (struct.error, ValueError, UnicodeDecodeError):
        raise ModelError(
            f"{path} is a damaged GGUF file: its header is cut short or malformed."
        ) from None
    arch = str(fields.get("general.architecture", ""))
    index, count = split_parts(path)
    size = path.stat().st_size
    if count > 1 and index == 1:
        parts = [_part(path, i, count) for i in range(1, count + 1)]
        size = sum(p.stat().st_size for p in parts if p.is_file())
    context = fields.get(f"{arch}.context_length")
    layers = fields.get(f"{arch}.block_count")
    template = fields.get("tokenizer.chat_template")
    return GGUFInfo(
        path=path,
        size=size,
        architecture=arch or "?",
        quantization=_quantization(fields.get("general.file_type"), tensor_types),
        context_length=int(context) if context is not None else None,
        chat_template=str(template) if template else None,
        name=str(fields.get("general.name", "")),
        size_label=str(fields.get("general.size_label", "")),
        layers=int(layers) if layers is not None else None,
        vocabulary=fields.get("tokenizer.ggml.tokens"),
        tensors=int(fields.get("GGUF.tensor_count", 0)),
        parts=max(count, int(fields.get("split.count", 1) or 1)),
    )


def _part(path: Path, index: int, count: int) -> Path:
    prefix = _SPLIT.match(path.name.removesuffix(".gguf"))[1]  # type: ignore[index]
    return path.with_name(f"{prefix}-{index:05d}-of-{count:05d}.gguf")


def _parse(data: mmap.mmap) -> tuple[dict[str, Any], Counter[int]]:
    """Key-value pairs (arrays: their length, for the few we report) and, from the tensor
    list, how many elements each tensor type holds."""
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

    def skip(kind: int, at: int, count: int) -> int:
        if kind in _SCALARS:
            return at + struct.calcsize(_SCALARS[kind]) * count
        if kind == _STRING:
            if count * 8 > len(data) - at:
                raise ValueError("array larger than the file")
            for _ in range(count):
                at += 8 + u64.unpack_from(data, at)[0]
            return at
        raise ValueError(f"unknown GGUF value type {kind}")

    fields: dict[str, Any] = {"GGUF.tensor_count": n_tensors}
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

    elements: Counter[int] = Counter()
    for _ in range(n_tensors):
        _, offset = string(offset)
        (n_dims,) = u32.unpack_from(data, offset)
        if n_dims > _MAX_DIMS:
            raise ValueError("too many dimensions")
        dims = struct.unpack_from(endian + "Q" * n_dims, data, offset + 4)
        offset += 4 + 8 * n_dims
        (kind,) = u32.unpack_from(data, offset)
        offset += 4 + 8  # type, then the data offset
        count = 1
        for dim in dims:
            count *= dim
        if n_dims > 1:  # 1-D norms and biases stay F32 whatever the quantization
            elements[kind] += count
    return fields, elements


def _quantization(file_type: Any, tensor_types: Counter[int]) -> str:
    """The file type the converter recorded, else the type holding most weights."""
    import gguf

    if file_type is not None:
        try:
            name = gguf.LlamaFileType(int(file_type) & ~gguf.LlamaFileType.GUESSED).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"file type {file_type}"
    if not tensor_types:
        return "?"
    kind = tensor_types.most_common(1)[0][0]
    try:
        return gguf.GGMLQuantizationType(kind).name
    except ValueError:
        return f"tensor type {kind}"
