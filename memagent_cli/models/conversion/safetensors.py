"""Tensors of a Hugging Face model folder, memory-mapped from its safetensors files.

The header (8 bytes of length, then JSON) is parsed here and every tensor is a numpy view
of the mapped file: nothing is read from disk until a block of rows is converted, so a
conversion holds one block in memory whatever the model's size.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from memagent_cli.errors import ModelError
from memagent_cli.text import json_count

# safetensors dtype -> (numpy storage dtype, bytes per element); BF16 is read as uint16.
_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}
_MAX_HEADER = 100 << 20  # the format's own limit
_MAX_DIMS = 8  # no weight has more (ggml's tensors have 4)
_BLOCK = 1 << 22  # elements converted at a time: 16 MB of float32 at most


@dataclass(frozen=True)
class Tensor:
    """One tensor: where its bytes lie and how to read them."""

    name: str
    dtype: str  # safetensors' name: F32, F16, BF16
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offsets in `file`
    end: int

    @property
    def elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    def raw_blocks(self) -> Iterator[np.ndarray]:
        """The tensor's values as stored (bf16 as uint16 bits), a block of rows at a time.
        Each block is mapped on its own and unmapped after use, so that the pages of the
        file read so far do not pile up in this process's memory."""
        storage, width = _DTYPES[self.dtype]
        row = self.shape[-1] if self.shape else 1
        step = max(row, _BLOCK // row * row)
        for at in range(0, self.elements, step):
            count = min(step, self.elements - at)
            mapped = np.memmap(
                self.file, dtype=storage, mode="r", offset=self.start + at * width, shape=(count,)
            )
            block = np.array(mapped)  # a copy: the mapping closes with `mapped`
            del mapped
            yield block

    def blocks(self, out: type[np.floating]) -> Iterator[np.ndarray]:
        """The tensor's values as `out` (float16 or float32), a block of rows at a time."""
        for block in self.raw_blocks():
            if self.dtype == "BF16":  # bf16 is the top half of a float32
                block = (block.astype(np.uint32) << 16).view(np.float32)
            yield block.astype(out, copy=False)


def read_tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the model in `folder`, by its Hugging Face name."""
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            with index.open("rb") as handle:
                weight_map = json.loads(handle.read(_MAX_HEADER + 1))["weight_map"]
            names = set(weight_map.values())
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise ModelError(f"{index} is not a valid safetensors index.") from None
        if not all(isinstance(n, str) and _inside(n) for n in names):
            raise ModelError(f"{index} names a weights file outside {folder}.")
        files = sorted(folder / n for n in names)
    if not files:
        raise ModelError(f"There is no .safetensors file in {folder}.")
    tensors: dict[str, Tensor] = {}
    for file in files:
        if not file.is_file():
            raise ModelError(f"{file} is missing: the model's index lists it.")
        tensors.update(_read_header(file))
    return tensors


def _read_header(file: Path) -> dict[str, Tensor]:
    size = file.stat().st_size
    damaged = f"{file} is not a complete safetensors file"
    with file.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            raise ModelError(f"{damaged}: it has {size} bytes.")
        (length,) = struct.unpack("<Q", raw)
        if length > min(_MAX_HEADER, size - 8):
            raise ModelError(
                f"{damaged}: its header claims {length:,} bytes, the file has {size:,}."
            )
        try:
            header = json.loads(handle.read(length))
        except (ValueError, RecursionError):  # also bad UTF-8 and absurdly deep nesting
            raise ModelError(f"{damaged}: its header is not JSON.") from None
    if not isinstance(header, dict):
        raise ModelError(f"{damaged}: its header is not a table of tensors.")
    base = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = (
                entry["dtype"],
                tuple(entry["shape"]),
                entry["data_offsets"],
            )
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{damaged}: tensor {name} is described wrongly.") from None
        valid = isinstance(dtype, str) and len(shape) <= _MAX_DIMS
        if not (valid and all(map(json_count, (*shape, begin, end)))):
            raise ModelError(f"{damaged}: tensor {name} is described wrongly.")
        if 0 in shape:  # no weight has no values; a row of none would divide by zero
            raise ModelError(f"{damaged}: tensor {name} has a dimension of 0, so no values.")
        if dtype not in _DTYPES:
            kinds = ", ".join(_DTYPES)
            raise ModelError(f"Tensor {name} in {file} is {dtype}; memagent converts {kinds}.")
        tensor = Tensor(name, dtype, shape, file, base + begin, base + end)
        if tensor.end - tensor.start != tensor.elements * _DTYPES[dtype][1] or tensor.end > size:
            raise ModelError(
                f"{damaged} (cut short?): tensor {name} should end at byte {tensor.end:,}, "
                f"the file has {size:,}; download it again."
            )
        tensors[name] = tensor
    return tensors


def _inside(name: str) -> bool:
    """Whether a file name of an index stays in the model's folder."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    return bool(parts) and not name.startswith("/") and ".." not in parts
