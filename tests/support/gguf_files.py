"""GGUF files read for tests: metadata as plain values and tensors as memory-mapped raw
rows, in a fraction of a second. gguf.GGUFReader makes a numpy object per vocabulary entry
(seconds for a 150K-token vocabulary, for every file a test opens)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np


@dataclass(frozen=True)
class Tensor:
    """A tensor of a GGUF file: its type and its raw data, one row of blocks per row."""

    name: str
    shape: tuple[int, ...]  # as the GGUF lists it, innermost first
    kind: gguf.GGMLQuantizationType
    raw: np.ndarray  # uint8, (rows, bytes per row), memory-mapped

    def values(self) -> np.ndarray:
        """float32 values, shaped as Hugging Face shapes them (outermost first)."""
        from gguf.quants import dequantize

        return dequantize(self.raw, self.kind).reshape(tuple(reversed(self.shape)))


def read(path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A GGUF's metadata as plain values, and its tensors by name in the file's order."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buffer = memoryview(data)
    at = 0

    def take(fmt: str) -> Any:
        nonlocal at
        values = struct.unpack_from("<" + fmt, buffer, at)
        at += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string() -> str:
        nonlocal at
        size = take("Q")
        at += size
        return bytes(buffer[at - size : at]).decode("utf-8")

    def value(kind: int) -> Any:
        if kind == 8:
            return string()
        if kind == 9:
            item, count = take("IQ")
            return [value(item) for _ in range(count)]
        return take(_SCALARS[kind])

    magic, version, n_tensors, n_fields = take("4sIQQ")
    assert magic == b"GGUF" and version == 3, (magic, version)
    meta = {}
    for _ in range(n_fields):
        key = string()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = take("I")
        shape = tuple(take("Q") for _ in range(dims))
        kind, offset = take("IQ")
        infos.append((name, shape, gguf.GGMLQuantizationType(kind), offset))
    align = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    start = -(-at // align) * align
    tensors = {}
    for name, shape, kind, offset in infos:
        block, size = gguf.GGML_QUANT_SIZES[kind]
        row = shape[0] // block * size
        rows = int(np.prod(shape[1:], dtype=np.int64))
        raw = data[start + offset : start + offset + rows * row].reshape(rows, row)
        tensors[name] = Tensor(name, shape, kind, raw)
    return meta, tensors


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
