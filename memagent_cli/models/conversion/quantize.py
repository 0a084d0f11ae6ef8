"""Quantization by llama.cpp's own quantizer (`llama_model_quantize` through
llama-cpp-python): any file type llama.cpp knows, by name."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import gguf

from memagent_cli.errors import ModelError

# Bits per weight of the bulk of a model's weights, to say the output's size before
# writing it; types not listed are assumed 8.5 bits (Q8_0), the largest common one.
_BITS = {
    "F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_K_M": 5.7, "Q5_K_S": 5.5,
    "Q5_1": 6.0, "Q5_0": 5.5, "Q4_K_M": 4.9, "Q4_K_S": 4.6, "Q4_1": 5.0, "Q4_0": 4.5,
    "Q3_K_L": 4.3, "Q3_K_M": 3.9, "Q3_K_S": 3.5, "Q2_K": 3.0,
}  # fmt: skip
UNQUANTIZED = ("F32", "F16")  # written by the converter itself


def file_types() -> list[str]:
    """The names llama.cpp's quantizer accepts (Q4_K_M, Q8_0, ...), as it prints them."""
    names = [t.name.removeprefix("MOSTLY_").removeprefix("ALL_") for t in gguf.LlamaFileType]
    return [n for n in names if n != "GUESSED"]


def file_type(name: str) -> gguf.LlamaFileType:
    """The llama.cpp file type called `name` (any case); ModelError naming the known ones."""
    wanted = name.upper()
    for kind in gguf.LlamaFileType:
        if kind.name.removeprefix("MOSTLY_").removeprefix("ALL_") == wanted and wanted != "GUESSED":
            return kind
    raise ModelError(
        f"{name} is not a llama.cpp quantization type; choose one of {', '.join(file_types())}."
    )


def estimated_size(parameters: int, name: str) -> int:
    """About how many bytes `parameters` weights take once quantized to `name`."""
    return int(parameters * _BITS.get(name.upper(), 8.5) / 8) + (4 << 20)


_silence = None  # ctypes keeps only a pointer: hold the callback here


def quantize(source: Path, dest: Path, name: str) -> None:
    """Quantize the GGUF `source` into `dest` as llama.cpp's llama-quantize does."""
    global _silence
    import llama_cpp

    @llama_cpp.llama_log_callback
    def quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        return None

    _silence = quiet
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(file_type(name))
    params.nthread = _threads()
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(dest).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise ModelError(f"llama.cpp could not quantize {source} to {name} (status {status}).")


def _threads() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
