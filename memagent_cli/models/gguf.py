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

from memagent_cli import gguf_header
from memagent_cli.errors import ModelError
from memagent_cli.files import check_gguf

_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


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


def quant_tag(filename: str) -> str:
    """The quantization tag llama.cpp reads from a file name: `x.Q4_K_M.gguf` -> `Q4_K_M`."""
    stem = Path(filename).name.removesuffix(".gguf")
    if match := gguf_header.SPLIT_NAME.match(stem):
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
            fields, tensors = gguf_header.parse(data)
    except OSError as exc:
        raise ModelError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    except (struct.error, ValueError, UnicodeDecodeError):
        raise ModelError(
            f"{path} is a damaged GGUF file: its header is cut short or malformed."
        ) from None
    arch = str(fields.get("general.architecture", ""))
    index, count = gguf_header.split_parts(path)
    size = path.stat().st_size
    if count > 1 and index == 1:
        parts = gguf_header.part_paths(path)
        size = sum(p.stat().st_size for p in parts if p.is_file())
    context = fields.get(f"{arch}.context_length")
    layers = fields.get(f"{arch}.block_count")
    template = fields.get("tokenizer.chat_template")
    return GGUFInfo(
        path=path,
        size=size,
        architecture=arch or "?",
        quantization=_quantization(fields.get("general.file_type"), _elements(tensors)),
        context_length=int(context) if context is not None else None,
        chat_template=str(template) if template else None,
        name=str(fields.get("general.name", "")),
        size_label=str(fields.get("general.size_label", "")),
        layers=int(layers) if layers is not None else None,
        vocabulary=fields.get("tokenizer.ggml.tokens"),
        tensors=int(fields.get("GGUF.tensor_count", 0)),
        parts=max(count, int(fields.get("split.count", 1) or 1)),
    )


def _elements(tensors: list[gguf_header.TensorInfo]) -> Counter[int]:
    """How many elements each tensor type holds, counting matrices only: 1-D norms and
    biases stay F32 whatever the quantization."""
    elements: Counter[int] = Counter()
    for tensor in tensors:
        if len(tensor.shape) > 1:
            count = 1
            for dim in tensor.shape:
                count *= dim
            elements[tensor.type] += count
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
