"""What a GGUF file is, read from its header alone: architecture, quantization, trained
context, chat template.

gguf.GGUFReader parses every vocabulary entry into numpy objects (seconds for a 150K-token
vocabulary), and a list of Python objects for the tensors takes 11 times the header's size,
so the key-value section and the tensor list are walked in place (gguf_header.py); the
weights after them are never touched. The `gguf` package supplies the names of types.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli import gguf_header
from memagent_cli.errors import ModelError
from memagent_cli.files import check_gguf
from memagent_cli.text import json_count

_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
READER_KEY = gguf_header.READER_KEY  # the reader memagent converted a model for
_MAX_TYPES = 256  # tensor types counted: ggml has about 40, a hostile list could name millions


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
    reader: str | None = None  # READER_KEY: the reader memagent converted it for

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
            "reader": self.reader,
        }


def quant_tag(filename: str) -> str:
    """The quantization tag llama.cpp reads from a file name: `x.Q4_K_M.gguf` -> `Q4_K_M`."""
    stem = Path(filename).name.removesuffix(".gguf")
    if match := gguf_header.SPLIT_NAME.match(stem):
        stem = match[1]
    found = _TAG.search(stem)
    return found[1].upper() if found else ""


def read(path: Path) -> GGUFInfo:
    """The header facts of the GGUF file at `path`; ModelError if it is not one. Every count
    and length in the header is checked against the file's size before it is used, and the
    tensor list is walked, not kept, so a damaged or hostile file costs no more memory than
    its own size. Read once per version of the file (gguf_header.read), so a run that
    checks a model, then lists or loads it, parses its header once."""
    check_gguf(path)
    try:
        header = gguf_header.read(path)
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            elements = _check_tensors(path, gguf_header.walk(data, header), len(data))
    except OSError as exc:
        raise ModelError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    except (struct.error, ValueError, UnicodeDecodeError):
        raise ModelError(
            f"{path} is a damaged GGUF file: its header is cut short or malformed."
        ) from None
    fields = header.fields
    arch = _value(path, fields, "general.architecture", str) or ""
    index, count = gguf_header.split_parts(path)
    size = path.stat().st_size
    if count > 1 and index == 1:
        parts = gguf_header.part_paths(path)
        size = sum(p.stat().st_size for p in parts if p.is_file())
    template = _value(path, fields, "tokenizer.chat_template", str)
    return GGUFInfo(
        path=path,
        size=size,
        architecture=arch or "?",
        quantization=_quantization(_value(path, fields, "general.file_type", int), elements),
        context_length=_value(path, fields, f"{arch}.context_length", int),
        chat_template=template or None,
        name=_value(path, fields, "general.name", str) or "",
        size_label=_value(path, fields, "general.size_label", str) or "",
        layers=_value(path, fields, f"{arch}.block_count", int),
        vocabulary=_value(path, fields, "tokenizer.ggml.tokens", int),
        tensors=header.tensor_count,
        parts=max(count, _value(path, fields, "split.count", int) or 1),
        reader=_value(path, fields, READER_KEY, str),
    )


def _value(path: Path, fields: dict[str, Any], key: str, kind: type) -> Any:
    """The value of `key` (None when the header has none); ModelError if it is not `kind`
    (int: a count, never negative, a bool or a float; the token list: its length)."""
    value = fields.get(key)
    if value is None:
        return None
    if isinstance(value, str) if kind is str else json_count(value):
        return value
    what = "text" if kind is str else "a count" if key != "tokenizer.ggml.tokens" else "a list"
    raise ModelError(f"{path} is a damaged GGUF file: its {key} is not {what}.")


def _check_tensors(
    path: Path, tensors: Iterable[gguf_header.TensorInfo], size: int
) -> Counter[int]:
    """How many elements each tensor type holds, counting matrices only (1-D norms and
    biases stay F32 whatever the quantization). ModelError unless each tensor lies inside
    the file (a file cut short, or a hostile offset). A type newer than the gguf package is
    left to llama.cpp to judge."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    elements: Counter[int] = Counter()
    for tensor in tensors:
        count = 1
        for dim in tensor.shape:
            count *= dim
        if len(tensor.shape) > 1 and (tensor.type in elements or len(elements) < _MAX_TYPES):
            elements[tensor.type] += count
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(tensor.type)]
        except (ValueError, KeyError):
            continue
        end = tensor.offset + count // block * block_bytes
        if count % block or end > size:
            raise ModelError(
                f"{path} is a damaged GGUF file (cut short?): tensor {tensor.name} would end "
                f"at byte {end:,}, and the file has {size:,}."
            )
    return elements


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
