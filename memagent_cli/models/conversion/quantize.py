"""Quantization by llama.cpp's own quantizer (`llama_model_quantize` through
llama-cpp-python), run in a child process (_quantize_child.py) so that Ctrl-C stops it at
once and llama.cpp's log can be read: a bar per tensor while it works, its reason when it
fails.

Only the types llama.cpp makes without an importance matrix are offered (`QuantType`):
llama.cpp refuses the others after loading the whole model (tensor_requires_imatrix in its
src/llama-quant.cpp), and memagent does not compute one.
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
from enum import StrEnum
from pathlib import Path

import gguf
from rich.filesize import decimal

from memagent_cli import cpus
from memagent_cli.errors import STOPS, ModelError
from memagent_cli.progress import Note, Progress, silent


class QuantType(StrEnum):
    """The file types memagent makes, by llama.cpp's names (llama-quantize's list)."""

    F32 = "F32"
    F16 = "F16"
    BF16 = "BF16"
    Q8_0 = "Q8_0"
    Q6_K = "Q6_K"
    Q5_K_M = "Q5_K_M"
    Q5_K_S = "Q5_K_S"
    Q5_1 = "Q5_1"
    Q5_0 = "Q5_0"
    Q4_K_M = "Q4_K_M"
    Q4_K_S = "Q4_K_S"
    Q4_1 = "Q4_1"
    Q4_0 = "Q4_0"
    IQ4_NL = "IQ4_NL"
    IQ4_XS = "IQ4_XS"
    Q3_K_L = "Q3_K_L"
    Q3_K_M = "Q3_K_M"
    Q3_K_S = "Q3_K_S"
    IQ3_M = "IQ3_M"
    IQ3_S = "IQ3_S"
    Q2_K = "Q2_K"


# Types whose tensors llama.cpp will not quantize without an importance matrix: those
# written as IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S or IQ3_XXS (IQ3_XS puts attn_q/attn_k and
# the middle layers' FFN in IQ3_XXS), and Q2_K inside a Q2_K_S file.
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS",
                 "Q2_K_S")  # fmt: skip
# Types llama.cpp knows that fit no model memagent converts: ternary and FP4 weights are
# for models trained in them, MXFP4_MOE for mixture-of-experts models.
_NOT_FOR_THESE = ("TQ1_0", "TQ2_0", "MXFP4_MOE", "NVFP4", "Q1_0")

# Bits per weight of the bulk of a model's weights, to say the output's size before
# writing it; types not listed are assumed 8.5 bits (Q8_0), the largest common one.
_BITS = {
    "F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_K_M": 5.7, "Q5_K_S": 5.5,
    "Q5_1": 6.0, "Q5_0": 5.5, "Q4_K_M": 4.9, "Q4_K_S": 4.6, "Q4_1": 5.0, "Q4_0": 4.5,
    "IQ4_NL": 4.5, "IQ4_XS": 4.3, "Q3_K_L": 4.3, "Q3_K_M": 3.9, "Q3_K_S": 3.5, "IQ3_M": 3.7,
    "IQ3_S": 3.5, "Q2_K": 3.0,
}  # fmt: skip
UNQUANTIZED = ("F32", "F16", "BF16")  # written by the converter itself, not the quantizer
_BASE_MEMORY = 256 << 20  # Python, llama.cpp and the model's metadata, besides the buffers


def file_types() -> list[str]:
    """The names of the types memagent makes (Q4_K_M, Q8_0, ...), as llama.cpp prints them."""
    return [kind.value for kind in QuantType]


def quant_type(name: str) -> QuantType:
    """The type called `name` (any case); ModelError naming the types that work if memagent
    cannot make it, and why."""
    wanted = name.strip().upper()
    if wanted in QuantType.__members__:
        return QuantType(wanted)
    choose = f"choose one of {', '.join(file_types())}"
    if wanted in NEEDS_IMATRIX:
        raise ModelError(
            f"{name} needs an importance matrix, which llama.cpp refuses to quantize without "
            f"and memagent does not compute; {choose}."
        )
    if wanted in _NOT_FOR_THESE:
        raise ModelError(f"{name} is for models trained in that format, not these; {choose}.")
    raise ModelError(f"{name} is not a llama.cpp quantization type memagent makes; {choose}.")


def file_type(name: str) -> gguf.LlamaFileType:
    """The llama.cpp file type called `name` (any case); ModelError as `quant_type`."""
    kind = quant_type(name)
    prefix = "ALL_" if kind == QuantType.F32 else "MOSTLY_"
    return gguf.LlamaFileType[prefix + kind.value]


def estimated_size(parameters: int, name: str) -> int:
    """About how many bytes `parameters` weights take once quantized to `name`."""
    return int(parameters * _BITS.get(name.upper(), 8.5) / 8) + (4 << 20)


def memory_needed(largest: int, name: str) -> int:
    """Bytes of memory llama.cpp's quantizer needs to make `name` from a model whose largest
    tensor has `largest` values: it holds that tensor as float32 and its quantized copy
    (llama_model_quantize_impl's scratch buffers), reading the rest from the mapped file."""
    return largest * 4 + int(largest * _BITS.get(name.upper(), 8.5) / 8) + _BASE_MEMORY


def available_memory() -> int:
    """Bytes of memory a new process can have: the system's available memory, or less where
    a container's cgroup (v2) limit leaves less."""
    import psutil

    free = psutil.virtual_memory().available
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(free, 0)


# "[  12/ 291]      blk.0.attn_q.weight - [  896,   896,     1,     1], type =    f16, ..."
_TENSOR = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+-\s+\[([\d,\s]+)\],\s+type\s*=\s*(\w+)")
_FAILED = "failed to quantize: "  # llama_model_quantize's log line when it gives up
_STOP_SECONDS = 10.0  # a stopped quantizer that is still there after this is killed


def quantize(
    source: Path,
    dest: Path,
    name: str,
    *,
    note: Note = silent,
    progress: Progress | None = None,
) -> None:
    """Quantize the GGUF `source` into `dest` as llama.cpp's llama-quantize does, reporting
    the bytes of `source` quantized so far, a tensor at a time, through `progress`.

    On failure or Ctrl-C the child is stopped, `dest` removed and `source` kept: the error
    (or the note, on Ctrl-C) says so, and that the same command again starts from `source`.
    """
    kind = quant_type(name)
    child_script = Path(__file__).with_name("_quantize_child.py")
    command = [sys.executable, "-P", str(child_script), str(source), str(dest)]
    command += [str(int(file_type(kind))), str(_threads())]
    total = source.stat().st_size
    what = f"quantizing to {kind}"
    tail: collections.deque[str] = collections.deque(maxlen=40)
    child = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        assert child.stdout is not None
        done = 0
        for raw in child.stdout:  # a line once llama.cpp has finished it
            line = raw.decode("utf-8", errors="replace").rstrip()
            tail.append(line)
            if (match := _TENSOR.match(line)) and progress:
                done += _tensor_bytes(match[4], match[5])
                progress(what, min(done, total), total)
        code = child.wait()
    except BaseException as exc:
        _stop(child)
        dest.unlink(missing_ok=True)
        if isinstance(exc, STOPS):  # Ctrl-C, SIGTERM
            note(f"interrupted while quantizing; {_left(source, dest)}")
        raise
    finally:
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    if code != 0:
        dest.unlink(missing_ok=True)
        raise ModelError(
            f"llama.cpp could not quantize {source.name} to {kind}: "
            f"{_reason(list(tail), code, dest)}; {_left(source, dest)}"
        )
    if progress:
        progress(what, total, total)


def _tensor_bytes(shape: str, type_name: str) -> int:
    """Bytes of a tensor in the source file, from the shape and type llama.cpp logs."""
    elements = 1
    for dim in shape.split(","):
        elements *= int(dim)
    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name.upper()]]
    except KeyError:
        return 0
    return elements // block * size


def _reason(lines: list[str], code: int, dest: Path) -> str:
    """llama.cpp's own reason for giving up, from the end of its log."""
    if code < 0:
        signal_name = signal.Signals(-code).name
        if -code == signal.SIGKILL:
            return f"its process was killed ({signal_name}), most likely for lack of memory"
        found = [line for line in lines if line.strip()]
        last = f" after: {found[-1].strip()}" if found else ""
        return f"its process ended with {signal_name}{last}"
    reason = next((ln.split(_FAILED, 1)[1] for ln in reversed(lines) if _FAILED in ln), "")
    if not reason:
        reason = next((ln.strip() for ln in reversed(lines) if ln.strip()), f"status {code}")
    reason = reason.strip().rstrip(".")[:500]
    if shutil.disk_usage(dest.parent).free < (64 << 20):
        reason += f" (the disk holding {dest.parent} is full)"
    return reason


def _left(source: Path, dest: Path) -> str:
    """What an unfinished quantization leaves on disk, and how to go on."""
    size = decimal(source.stat().st_size) if source.is_file() else "?"
    # The converter quantizes into NAME.gguf.part: the user knows the model by NAME.gguf.
    return (
        f"nothing of {dest.name.removesuffix('.part')} was kept, and {source} ({size}) is "
        "still there: the same command again quantizes from it without converting again."
    )


def _stop(child: subprocess.Popen[bytes]) -> None:
    """End the quantizer now: SIGTERM ends it even inside llama.cpp's ctypes call."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _threads() -> int:
    return cpus.usable()
