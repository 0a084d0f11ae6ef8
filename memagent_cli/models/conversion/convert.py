"""A Hugging Face model folder (config.json, safetensors, tokenizer.json) made into a GGUF
file that llama.cpp runs, quantized by llama.cpp itself; no torch, no transformers.

Tensors stream one block at a time from the memory-mapped safetensors into the GGUF, so
memory stays flat whatever the model's size. Every file is written under a `.part` name and
renamed when complete: an interrupted conversion never leaves a file that looks finished.

A quantized model is quantized from an unquantized intermediate, as llama.cpp's converter
and quantizer do: BF16 when the weights are bf16 (F16 would turn values above 65504 into
inf), else F16, every block checked for range. The intermediate never shares a name with a
model file (it does not end in .gguf). It is removed once the model is quantized, whether
this run wrote it or an interrupted one did, unless `--keep-intermediate` marked it (a
NAME.intermediate.BF16.keep file beside it): that one stays for every later quantization.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
from rich.filesize import decimal

from memagent_cli import readers
from memagent_cli.errors import ModelError
from memagent_cli.models.conversion import architecture, quantize, vocabulary
from memagent_cli.models.conversion.safetensors import Tensor, read_tensors
from memagent_cli.models.disk import check_space, durable_rename
from memagent_cli.models.gguf import READER_KEY
from memagent_cli.progress import Note, Progress, silent
from memagent_cli.text import decoded

DEFAULT_QUANT = "Q4_K_M"
_F16_MAX = 65504.0  # the largest finite float16


@dataclass(frozen=True)
class Source:
    """A model folder checked for conversion: its architecture and its tensors' GGUF names."""

    folder: Path
    arch: architecture.Architecture
    tensors: list[tuple[str, Tensor]]
    pre: str  # llama.cpp's pre-tokenizer for the tokenizer (vocabulary.check)

    @property
    def parameters(self) -> int:
        return sum(t.elements for _, t in self.tensors)

    @property
    def intermediate_kind(self) -> str:
        """What to quantize from: BF16 when any weight is bf16 (exact, never inf), else F16."""
        return "BF16" if any(t.dtype == "BF16" for _, t in self.tensors) else "F16"

    def unquantized_size(self, kind: str) -> int:
        """Bytes of the GGUF written as F16 or BF16 (2-D weights) or F32 (everything)."""
        weights = sum(_padded(_nbytes(t, _out_type(n, t, kind))) for n, t in self.tensors)
        # The tokens and merges in the GGUF take less room than tokenizer.json's JSON.
        return weights + (self.folder / "tokenizer.json").stat().st_size


def read_source(folder: Path) -> Source:
    """Check everything a conversion needs before anything is written; ModelError if not."""
    if not folder.is_dir():
        raise ModelError(f"{folder} is not a folder; give the Hugging Face model's folder.")
    arch = architecture.read(folder)
    if not (folder / "tokenizer.json").is_file():
        raise vocabulary.no_tokenizer(str(folder))
    pre = vocabulary.check(folder, arch.config.get("vocab_size"))
    mapped = [(arch.tensor_name(name), t) for name, t in read_tensors(folder).items()]
    tensors = [(name, t) for name, t in mapped if name is not None]
    if not any(name == "token_embd.weight" for name, _ in tensors):
        raise ModelError(f"The model in {folder} has no token embedding tensor.")
    return Source(folder, arch, tensors, pre)


@dataclass(frozen=True)
class Plan:
    """What a conversion will write, and how big it will be."""

    source: Source
    dest: Path
    quant: str
    intermediate: Path | None  # the file llama.cpp quantizes from; None for F32/F16/BF16
    reuse_intermediate: bool  # a complete intermediate from an earlier run is there

    @property
    def intermediate_size(self) -> int:
        if self.intermediate is None:
            return 0
        return self.source.unquantized_size(self.source.intermediate_kind)

    @property
    def dest_size(self) -> int:
        if self.quant in quantize.UNQUANTIZED:
            return self.source.unquantized_size(self.quant)
        return quantize.estimated_size(self.source.parameters, self.quant)

    @property
    def needed(self) -> int:
        """Bytes of disk this conversion still has to write."""
        return (0 if self.reuse_intermediate else self.intermediate_size) + self.dest_size

    @property
    def needed_releasing_sources(self) -> int:
        """Bytes of disk needed when each source file is deleted once its tensors are
        written (a pull's --delete-shards): the files free room as the conversion goes."""
        if self.reuse_intermediate:  # no source file is read, so none is released
            return self.needed
        sizes = {t.file: t.file.stat().st_size for _, t in self.source.tensors}
        weights = sum(sizes.values())
        converted = self.intermediate_size if self.intermediate else self.dest_size
        return peak_releasing_sources(
            converted, self.needed, max(sizes.values(), default=0), weights, weights
        )

    def describe(self) -> str:
        params = (
            f"{self.source.parameters / 1e9:.2f}B"
            if self.source.parameters > 1e8
            else f"{self.source.parameters:,}"
        )
        source = self.source
        text = f"converting {source.arch.hf_name} ({params} parameters) from {source.folder}: "
        if self.intermediate and not self.reuse_intermediate:
            kind = source.intermediate_kind
            text += f"{kind} {decimal(self.intermediate_size)} (temporary), then "
        elif self.intermediate:
            text += f"reusing {self.intermediate.name}, then "
        return text + f"{self.quant} about {decimal(self.dest_size)} -> {self.dest}"


def plan(folder: Path, dest: Path, quant: str = DEFAULT_QUANT) -> Plan:
    quant = quantize.file_type(quant).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    source = read_source(folder)
    intermediate = None
    if quant not in quantize.UNQUANTIZED:
        intermediate = intermediate_path(dest, quant, source.intermediate_kind)
    newest = max(t.file.stat().st_mtime for _, t in source.tensors)
    reuse = bool(intermediate and intermediate.is_file() and intermediate.stat().st_mtime >= newest)
    return Plan(source, dest, quant, intermediate, reuse)


def peak_releasing_sources(
    converted: int, written: int, largest: int, weights: int, here: int, to_download: int = 0
) -> int:
    """The disk peak, above what is used now, of downloading `to_download` bytes of source
    files, then converting them (`converted` bytes; `written` with the quantized model)
    while deleting each source file once its tensors are written: every source file plus
    the converted bytes of the largest one, or, once they are gone, what remains written
    less the `here` bytes of source files already on disk (they count as used now)."""
    return max(to_download + largest * converted // max(weights, 1), written - here)


def intermediate_path(dest: Path, quant: str, kind: str) -> Path:
    """Where the unquantized intermediate of `dest` goes: NAME.intermediate.BF16 beside
    NAME.QUANT.gguf. Not a .gguf name, so never the path of a pulled or converted model
    (NAME.BF16.gguf is one), and every quantization of NAME finds it."""
    stem = dest.name.removesuffix(".gguf")
    if stem.upper().endswith("." + quant.upper()):
        stem = stem[: -len(quant) - 1]
    return dest.with_name(f"{stem}.intermediate.{kind}")


def convert(
    folder: Path,
    dest: Path,
    quant: str = DEFAULT_QUANT,
    *,
    keep_intermediate: bool = False,
    name: str = "",
    reader: str = readers.DEFAULT,
    note: Note = silent,
    progress: Progress | None = None,
    release: Callable[[Path], None] | None = None,
) -> Path:
    """Convert the model in `folder` into the GGUF `dest`, quantized to `quant`, recording
    `reader`, the reader the model was trained for, in its metadata.

    `release(file)` is called with each source .safetensors file once all its tensors are
    written (a pull may delete it there, to lower its disk peak)."""
    work = plan(folder, dest, quant)
    note(work.describe())
    needed = work.needed if release is None else work.needed_releasing_sources
    check_space(dest.parent, needed, "the conversion")
    label = name or folder.name
    if work.intermediate is None:
        write_gguf(work.source, dest, work.quant, name, progress, note, release, reader)
        return dest
    if work.reuse_intermediate:
        note(f"using {work.intermediate} from an earlier run")
    else:
        kind = work.source.intermediate_kind
        write_gguf(work.source, work.intermediate, kind, name, progress, note, release, reader)
    quantize_intermediate(
        work.intermediate,
        dest,
        work.quant,
        keep=keep_intermediate,
        label=label,
        note=note,
        progress=progress,
    )
    return dest


def quantize_intermediate(
    intermediate: Path,
    dest: Path,
    quant: str,
    *,
    keep: bool = False,
    label: str = "",
    note: Note = silent,
    progress: Progress | None = None,
) -> None:
    """Quantize the complete `intermediate` into `dest` with llama.cpp, then delete it
    unless the user asks to keep it, now (`keep`) or with an earlier --keep-intermediate."""
    note(f"quantizing to {quant} with llama.cpp")
    part = _part(dest)
    try:
        quantize.quantize(intermediate, part, quant, note=note, progress=progress)
        durable_rename(part, dest)
    finally:
        part.unlink(missing_ok=True)
    # Only the user's ask keeps it: one a failed or interrupted run left (tens of GB for
    # a real model) goes once it has served.
    mark = _keep_mark(intermediate)
    if keep:
        mark.touch()
    if mark.is_file():
        note(f"kept {intermediate}: quantizing {label or dest.name} to another type starts from it")
    else:
        intermediate.unlink()


def _keep_mark(intermediate: Path) -> Path:
    """The empty file that says `intermediate` is kept at the user's ask."""
    return intermediate.with_name(intermediate.name + ".keep")


def write_gguf(
    source: Source,
    dest: Path,
    kind: str,
    name: str,
    progress: Progress | None = None,
    note: Note = silent,
    release: Callable[[Path], None] | None = None,
    reader: str = readers.DEFAULT,
) -> None:
    """Write `source` as an unquantized GGUF (`kind` F32, F16 or BF16) at `dest`, via a
    .part file, named `name` (else as llama.cpp names it, from the folder). F16 made from
    wider values is checked block by block: a value beyond F16's range is refused with a
    sentence, never written as inf."""
    writer = gguf.GGUFWriter(None, source.arch.gguf_name)
    writer.add_type(gguf.GGUFType.MODEL)
    # As llama.cpp's converter: name, basename, finetune, size label and sampling defaults
    # from the folder's name, model card and generation_config.json, unless `name` is given.
    meta = gguf.Metadata.load(None, source.folder, name or None, source.parameters)
    meta.name = meta.name or source.folder.name
    for field, value in vars(meta).items():  # from a folder name that may not be UTF-8
        if isinstance(value, str):
            setattr(meta, field, decoded(value))
    if meta.size_label is None:
        meta.size_label = gguf.size_label(source.parameters, source.parameters, 0, 0)
    meta.set_gguf_meta_model(writer)
    source.arch.write_parameters(writer)
    writer.add_file_type(quantize.file_type(kind))
    # The quantizer copies every key: a file made from this one reads with the same reader.
    writer.add_string(READER_KEY, reader)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocabulary.write(writer, source.folder, source.pre, source.arch.config.get("vocab_size"))
    for tensor_name, tensor in source.tensors:
        out = _out_type(tensor_name, tensor, kind)
        writer.add_tensor_info(
            tensor_name,
            tensor.shape,
            np.dtype(np.float32 if out == "F32" else np.float16),
            _nbytes(tensor, out),
            raw_dtype=gguf.GGMLQuantizationType[out],
        )
    total = sum(_nbytes(t, _out_type(n, t, kind)) for n, t in source.tensors)
    left: dict[Path, int] = {}  # source file -> its tensors not written yet
    for _, tensor in source.tensors:
        left[tensor.file] = left.get(tensor.file, 0) + 1
    part = _part(dest)
    try:
        writer.write_header_to_file(path=part)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        out_file = writer.fout[0]
        writer.write_padding(out_file, out_file.tell())
        done = 0
        for tensor_name, tensor in source.tensors:
            out = _out_type(tensor_name, tensor, kind)
            for block in _blocks(tensor_name, tensor, out):
                out_file.write(block)
                done += block.nbytes
                if progress:
                    progress(f"writing {dest.name}", done, total)
            writer.write_padding(out_file, _nbytes(tensor, out))
            left[tensor.file] -= 1
            if release is not None and left[tensor.file] == 0:
                release(tensor.file)
        writer.close()
        durable_rename(part, dest)
    except OSError as exc:
        raise ModelError(f"Cannot write {dest}: {exc.strerror or exc}.") from None
    finally:
        writer.close()
        part.unlink(missing_ok=True)


def _out_type(gguf_name: str, tensor: Tensor, kind: str) -> str:
    # As llama.cpp's converter: 1-D tensors and norms stay F32 in an F16 or BF16 file.
    if kind == "F32" or len(tensor.shape) <= 1 or gguf_name.endswith("_norm.weight"):
        return "F32"
    return kind


def _nbytes(tensor: Tensor, out: str) -> int:
    return tensor.elements * (4 if out == "F32" else 2)


def _blocks(gguf_name: str, tensor: Tensor, out: str) -> Iterator[memoryview]:
    """The tensor's bytes as `out`, a block of rows at a time."""
    if out == "BF16" and tensor.dtype == "BF16":
        for raw in tensor.raw_blocks():  # bf16 to bf16: the bits as they are
            yield memoryview(np.ascontiguousarray(raw)).cast("B")
        return
    for block in tensor.blocks(np.float32):
        if out == "F32":
            data = block
        elif out == "BF16":
            data = gguf.quants.quantize(block, gguf.GGMLQuantizationType.BF16)
        else:
            finite = block[np.isfinite(block)]
            if finite.size and float(np.abs(finite).max()) > _F16_MAX:
                # Only bf16 weights are quantized from a BF16 intermediate (intermediate_kind).
                via = (
                    ", or to a quantized type (quantized from a BF16 intermediate)"
                    if tensor.dtype == "BF16"
                    else " (a quantized type is made from an F16 intermediate here, as "
                    "llama.cpp's converter makes it from float32 weights)"
                )
                raise ModelError(
                    f"Tensor {gguf_name} holds values beyond F16's range (±65504), which F16 "
                    f"would store as inf; convert to BF16 or F32{via}."
                )
            data = block.astype(np.float16)
        yield memoryview(np.ascontiguousarray(data)).cast("B")


def _padded(size: int) -> int:
    return -(-size // gguf.GGUF_DEFAULT_ALIGNMENT) * gguf.GGUF_DEFAULT_ALIGNMENT


def _part(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")
