"""A Hugging Face model folder (config.json, safetensors, tokenizer.json) made into a GGUF
file that llama.cpp runs, quantized by llama.cpp itself; no torch, no transformers.

Tensors stream one block at a time from the memory-mapped safetensors into the GGUF, so
memory stays flat whatever the model's size. Every file is written under a `.part` name and
renamed when complete: an interrupted conversion never leaves a file that looks finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from rich.filesize import decimal

from memagent_cli.errors import ModelError
from memagent_cli.models.conversion import architecture, quantize, vocabulary
from memagent_cli.models.conversion.safetensors import Tensor, read_tensors
from memagent_cli.models.hub import check_space
from memagent_cli.progress import Note, Progress, silent

DEFAULT_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class Source:
    """A model folder checked for conversion: its architecture and its tensors' GGUF names."""

    folder: Path
    arch: architecture.Architecture
    tensors: list[tuple[str, Tensor]]

    @property
    def parameters(self) -> int:
        return sum(t.elements for _, t in self.tensors)

    def unquantized_size(self, kind: str) -> int:
        """Bytes of the GGUF written as F16 (2-D weights) or F32 (everything)."""
        weights = sum(_padded(t.elements * _dtype(n, t, kind).itemsize) for n, t in self.tensors)
        # The tokens and merges in the GGUF take less room than tokenizer.json's JSON.
        return weights + (self.folder / "tokenizer.json").stat().st_size


def read_source(folder: Path) -> Source:
    """Check everything a conversion needs before anything is written; ModelError if not."""
    if not folder.is_dir():
        raise ModelError(f"{folder} is not a folder; give the Hugging Face model's folder.")
    arch = architecture.read(folder)
    if not (folder / "tokenizer.json").is_file():
        raise vocabulary.no_tokenizer(str(folder))
    mapped = [(arch.tensor_name(name), t) for name, t in read_tensors(folder).items()]
    tensors = [(name, t) for name, t in mapped if name is not None]
    if not any(name == "token_embd.weight" for name, _ in tensors):
        raise ModelError(f"The model in {folder} has no token embedding tensor.")
    return Source(folder, arch, tensors)


@dataclass(frozen=True)
class Plan:
    """What a conversion will write, and how big it will be."""

    source: Source
    dest: Path
    quant: str
    intermediate: Path | None  # the F16 file llama.cpp quantizes from; None for F16/F32
    reuse_intermediate: bool  # a complete F16 from an earlier run is there

    @property
    def intermediate_size(self) -> int:
        return self.source.unquantized_size("F16") if self.intermediate else 0

    @property
    def dest_size(self) -> int:
        if self.quant in quantize.UNQUANTIZED:
            return self.source.unquantized_size(self.quant)
        return quantize.estimated_size(self.source.parameters, self.quant)

    @property
    def needed(self) -> int:
        """Bytes of disk this conversion still has to write."""
        return (0 if self.reuse_intermediate else self.intermediate_size) + self.dest_size

    def describe(self) -> str:
        params = (
            f"{self.source.parameters / 1e9:.2f}B"
            if self.source.parameters > 1e8
            else f"{self.source.parameters:,}"
        )
        source = self.source
        text = f"converting {source.arch.hf_name} ({params} parameters) from {source.folder}: "
        if self.intermediate and not self.reuse_intermediate:
            text += f"F16 {decimal(self.intermediate_size)} (temporary), then "
        elif self.intermediate:
            text += f"reusing {self.intermediate.name}, then "
        return text + f"{self.quant} about {decimal(self.dest_size)} -> {self.dest}"


def plan(folder: Path, dest: Path, quant: str = DEFAULT_QUANT) -> Plan:
    quant = quantize.file_type(quant).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    source = read_source(folder)
    intermediate = None if quant in quantize.UNQUANTIZED else f16_path(dest, quant)
    newest = max(t.file.stat().st_mtime for _, t in source.tensors)
    reuse = bool(intermediate and intermediate.is_file() and intermediate.stat().st_mtime >= newest)
    return Plan(source, dest, quant, intermediate, reuse)


def f16_path(dest: Path, quant: str) -> Path:
    """Where the F16 intermediate of `dest` goes: NAME.F16.gguf beside NAME.QUANT.gguf."""
    stem = dest.name.removesuffix(".gguf")
    if stem.upper().endswith("." + quant.upper()):
        stem = stem[: -len(quant) - 1]
    return dest.with_name(f"{stem}.F16.gguf")


def convert(
    folder: Path,
    dest: Path,
    quant: str = DEFAULT_QUANT,
    *,
    keep_f16: bool = False,
    name: str = "",
    note: Note = silent,
    progress: Progress | None = None,
) -> Path:
    """Convert the model in `folder` into the GGUF `dest`, quantized to `quant`."""
    work = plan(folder, dest, quant)
    note(work.describe())
    check_space(dest.parent, work.needed, "the conversion")
    label = name or folder.name
    if work.intermediate is None:
        write_gguf(work.source, dest, work.quant, label, progress, note)
        return dest
    if work.reuse_intermediate:
        note(f"using {work.intermediate} from an earlier run")
    else:
        write_gguf(work.source, work.intermediate, "F16", label, progress, note)
    note(f"quantizing to {work.quant} with llama.cpp")
    part = _part(dest)
    try:
        quantize.quantize(work.intermediate, part, work.quant)
        part.replace(dest)
    finally:
        part.unlink(missing_ok=True)
    if not keep_f16:
        work.intermediate.unlink()
    return dest


def write_gguf(
    source: Source,
    dest: Path,
    kind: str,
    name: str,
    progress: Progress | None = None,
    note: Note = silent,
) -> None:
    """Write `source` as an unquantized GGUF (`kind` F16 or F32) at `dest`, via a .part file."""
    writer = gguf.GGUFWriter(None, source.arch.gguf_name)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    total_params, shared, expert, experts = source.parameters, source.parameters, 0, 0
    writer.add_size_label(gguf.size_label(total_params, shared, expert, experts))
    source.arch.write_parameters(writer)
    writer.add_file_type(quantize.file_type(kind))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocabulary.write(
        writer, source.folder, source.arch.arch, source.arch.config.get("vocab_size"), note
    )
    for tensor_name, tensor in source.tensors:
        dtype = _dtype(tensor_name, tensor, kind)
        writer.add_tensor_info(tensor_name, tensor.shape, dtype, tensor.elements * dtype.itemsize)
    total = sum(tensor.elements * _dtype(n, tensor, kind).itemsize for n, tensor in source.tensors)
    part = _part(dest)
    try:
        writer.write_header_to_file(path=part)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        out = writer.fout[0]
        writer.write_padding(out, out.tell())
        done = 0
        for tensor_name, tensor in source.tensors:
            dtype = _dtype(tensor_name, tensor, kind)
            for block in tensor.blocks(dtype.type):
                out.write(memoryview(np.ascontiguousarray(block)).cast("B"))
                done += block.nbytes
                if progress:
                    progress(f"writing {dest.name}", done, total)
            writer.write_padding(out, tensor.elements * dtype.itemsize)
        writer.close()
        part.replace(dest)
    except OSError as exc:
        raise ModelError(f"Cannot write {dest}: {exc.strerror or exc}.") from None
    finally:
        writer.close()
        part.unlink(missing_ok=True)


def _dtype(gguf_name: str, tensor: Tensor, kind: str) -> np.dtype:
    # As llama.cpp's converter: 1-D tensors and norms stay F32 in an F16 file.
    if kind == "F32" or len(tensor.shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return np.dtype(np.float32)
    return np.dtype(np.float16)


def _padded(size: int) -> int:
    return -(-size // gguf.GGUF_DEFAULT_ALIGNMENT) * gguf.GGUF_DEFAULT_ALIGNMENT


def _part(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")
