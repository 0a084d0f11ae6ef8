"""What this llama.cpp build is, and where it may keep a model's weights on the CPU.

On a CPU with AMX, llama.cpp puts Q4_0, Q4_1, Q8_0 and K-quant weights in its AMX buffers,
and the first decode dies there with SIGSEGV (llama.cpp#20824, ollama#17006). memagent
keeps weights out of those buffers and keeps llama.cpp's repacked CPU layouts, which make
Q4_0, Q4_K and IQ4_NL faster on AVX2 and AVX-512. The rule reads llama.cpp's system-info
string, so it is tested on machines without AMX (tests/test_build.py).
"""

from __future__ import annotations

import ctypes
import functools
import re
import struct
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memagent_cli import gguf_header

# Weight types that llama.cpp's repack buffer rearranges on x86, with the CPU feature each
# needs, when the tensor's row count is a multiple of 8: ggml_repack_get_optimal_repack_type
# in ggml-cpu/repack.cpp of the llama.cpp that llama-cpp-python 0.3.36 vendors. A tensor
# sent to that buffer but not taken by that rule crashes, so this is kept to the subset
# (pyproject.toml pins the version; a new one is checked by tests/test_build_model.py).
REPACK_X86 = {"Q4_0": "AVX2", "Q4_K": "AVX2", "IQ4_NL": "AVX2", "MXFP4": "AVX2", "Q2_K": "AVX512"}
# Tensors that only ever meet a matrix multiplication (token_embd meets GET_ROWS too).
_MATMUL = re.compile(r"^(output|blk\.\d+\.(attn_(q|k|v|qkv|output)|ffn_(gate|up|down)))\.weight$")
_EXPERTS = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)_exps\.weight$")


def system_features(system_info: str) -> dict[str, dict[str, str]]:
    """llama.cpp's system info, by backend: "CUDA : ARCHS = 900 | CPU : AVX2 = 1 | ..." gives
    {"CUDA": {"ARCHS": "900"}, "CPU": {"AVX2": "1"}}."""
    found: dict[str, dict[str, str]] = {}
    backend = "CPU"
    for piece in system_info.split("|"):
        piece = piece.strip()
        if " : " in piece:
            backend, piece = (part.strip() for part in piece.split(" : ", 1))
        if " = " in piece:
            key, value = (part.strip() for part in piece.split(" = ", 1))
            found.setdefault(backend, {})[key] = value
    return found


def has_amx(system_info: str) -> bool:
    """Whether this build's CPU backend uses AMX, and so would put weights in AMX buffers."""
    return system_features(system_info).get("CPU", {}).get("AMX_INT8") == "1"


@dataclass(frozen=True)
class Tensor:
    """A weight as the GGUF file lists it: name, ggml type name, and ne (ne[0] first)."""

    name: str
    type: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """How llama.cpp is told to place the weights: its use_extra_bufts switch, and regex
    patterns of tensors sent to its CPU_REPACK buffer (only with the switch off)."""

    extra_buffers: bool
    repack: tuple[str, ...] = ()
    why: str = ""
    amx: bool = field(default=False, compare=False)


def place_weights(
    system_info: str, tensors: Iterable[Tensor], *, repack: bool | None, offload: bool
) -> Placement:
    """Where the weights go. `repack`: None for memagent's choice, True for llama.cpp's own
    (AMX buffers included), False for no extra buffers at all (llama.cpp's --no-repack)."""
    amx = has_amx(system_info)
    if repack is False:
        return Placement(False, why="weight repacking off (--no-repack)", amx=amx)
    if repack is True:
        why = "llama.cpp's own choice (--repack)" + (", AMX buffers included" if amx else "")
        return Placement(True, why=why, amx=amx)
    if not amx:
        return Placement(True, why="llama.cpp's own choice: this build has no AMX", amx=amx)
    cpu = system_features(system_info).get("CPU", {})
    if offload or cpu.get("REPACK") != "1":
        # With layers on a GPU, a pattern would pull the GPU's layers back to the CPU.
        why = "AMX buffers off" + (" with GPU offload" if offload else "") + ", no repacking"
        return Placement(False, why=why, amx=amx)
    chosen = [t.name for t in tensors if _repacked(t, cpu)]
    return Placement(
        False, _patterns(chosen), f"AMX buffers off, {len(chosen)} tensors repacked", amx=amx
    )


def _repacked(tensor: Tensor, cpu: dict[str, str]) -> bool:
    needs = REPACK_X86.get(tensor.type)
    if needs is None or cpu.get(needs) != "1" or len(tensor.shape) < 2:
        return False
    dims = 3 if _EXPERTS.match(tensor.name) else 2 if _MATMUL.match(tensor.name) else 0
    return len(tensor.shape) == dims and tensor.shape[1] % 8 == 0


def _patterns(names: Sequence[str]) -> tuple[str, ...]:
    """A few regexes that match exactly `names`: llama.cpp compiles every pattern for every
    tensor, so one per tensor would cost seconds on a large model."""
    layers: dict[str, set[str]] = defaultdict(set)
    patterns = []
    for name in names:
        if match := re.fullmatch(r"blk\.(\d+)\.(.+)", name):
            layers[match.group(2)].add(match.group(1))
        else:
            patterns.append(f"^{re.escape(name)}$")
    by_layers: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for rest, numbers in layers.items():
        by_layers[tuple(sorted(numbers, key=int))].append(re.escape(rest))
    for numbers, rests in by_layers.items():
        patterns.append(rf"^blk\.({'|'.join(numbers)})\.({'|'.join(sorted(rests))})$")
    return tuple(patterns)


def gguf_tensors(path: Path) -> Iterator[Tensor]:
    """The weights of a GGUF file (every part of a split one), one at a time from its
    header, where gguf's GGUFReader takes seconds to decode a 150K-token vocabulary."""
    from gguf import GGMLQuantizationType

    def type_name(kind: int) -> str:
        try:
            return GGMLQuantizationType(kind).name
        except ValueError:
            return str(kind)

    try:
        for t in gguf_header.tensors(path):
            yield Tensor(t.name, type_name(t.type), t.shape)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        # Missing or damaged: llama.cpp says so when it loads; AMX stays out.
        return


def offloads() -> bool:
    """Whether this build can put layers on a GPU (CUDA, Metal, ...)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


# ggml's C API for devices and buffer types, which llama-cpp-python does not wrap.
_DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}


@functools.cache
def _ggml() -> ctypes.CDLL:
    from llama_cpp._ggml import libggml  # the library llama_cpp itself loaded

    for name, result, args in (
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_dev_by_type", ctypes.c_void_p, [ctypes.c_int]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
        ("ggml_backend_dev_backend_reg", ctypes.c_void_p, [ctypes.c_void_p]),
        ("ggml_backend_reg_get_proc_address", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        ("ggml_backend_buft_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_version", ctypes.c_char_p, []),
        ("ggml_commit", ctypes.c_char_p, []),
    ):
        function = getattr(libggml, name)
        function.restype, function.argtypes = result, args
    size = ctypes.POINTER(ctypes.c_size_t)
    libggml.ggml_backend_dev_memory.restype = None
    libggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, size, size]
    return libggml


def extra_buffers() -> dict[str, int]:
    """The CPU backend's extra buffer types in llama.cpp's order, by name ("AMX",
    "CPU_REPACK", ...): those that use_extra_bufts lets llama.cpp choose from."""
    ggml = _ggml()
    cpu = ggml.ggml_backend_dev_by_type(0)
    if not cpu:
        return {}
    reg = ggml.ggml_backend_dev_backend_reg(cpu)
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return {}
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)
    array, found, i = get(cpu), {}, 0
    while array and array[i]:
        found[ggml.ggml_backend_buft_name(array[i]).decode()] = array[i]
        i += 1
    return found


@dataclass(frozen=True)
class Device:
    """A device llama.cpp sees, with its memory in bytes."""

    name: str
    description: str
    kind: str
    free: int
    total: int


def devices() -> list[Device]:
    """Every device this build of llama.cpp sees: the CPU, and GPUs when built for them."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    ggml = _ggml()
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        found.append(
            Device(
                ggml.ggml_backend_dev_name(device).decode(errors="replace"),
                ggml.ggml_backend_dev_description(device).decode(errors="replace"),
                _DEVICE_KINDS.get(ggml.ggml_backend_dev_type(device), "?"),
                free.value,
                total.value,
            )
        )
    return found


def describe() -> dict[str, object]:
    """This build for `memagent --version --json`: versions, CPU features, devices, and
    where weights go; {"llama_cpp": "cannot load: why"} where its library cannot load (a
    CUDA build without the driver), since --version is what a bug report starts with."""
    try:
        import llama_cpp

        ggml = _ggml()
    except (OSError, RuntimeError, ImportError) as exc:  # llama_cpp wraps OSError in RuntimeError
        why = " ".join(str(exc).split()) or type(exc).__name__
        return {"llama_cpp": f"cannot load: {why}"}
    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    features = system_features(info)
    cpu = features.get("CPU", {})
    # ARM's int8 kernels (DOTPROD, MATMUL_INT8: i8mm, SVE) decide which decoding paths exist.
    wanted = ("AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8", "NEON")
    wanted += ("DOTPROD", "MATMUL_INT8", "SVE")
    amx = has_amx(info)
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "ggml": ggml.ggml_version().decode(),
        "ggml_commit": ggml.ggml_commit().decode(),
        "system_info": info,
        "cpu_features": {name: cpu.get(name) == "1" for name in wanted if name in cpu},
        "repack": cpu.get("REPACK") == "1",
        "amx": amx,
        "extra_buffers": list(extra_buffers()),
        "weights": "AMX buffers off, repacked layouts kept (--repack for llama.cpp's own choice)"
        if amx
        else "llama.cpp's own choice",
        "gpu_offload": offloads(),
        "devices": [vars(d) for d in devices()],
    }


def placement_for(
    model: Path | None, *, repack: bool | None = None, offload: bool = False
) -> Placement:
    """Where this build keeps `model`'s weights, as memagent's loader decides it, for
    llama-cpp-python's own `Llama` (backends/llama_patches.py `placed_weights`). Without a
    model path (a server's config file), AMX is kept out and nothing repacked."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace")
    tensors = gguf_tensors(model) if model is not None and has_amx(info) else []
    return place_weights(info, tensors, repack=repack, offload=offload)
