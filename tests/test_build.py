"""Where llama.cpp may keep weights, decided from its system-info string: the rule is checked
here against the strings of machines with AMX, without, and of GPU builds, so it holds on
machines this suite never runs on. Then the real build: its AMX buffers crash, and memagent's
placement does not (on a CPU with AMX), and a native crash is named on stderr."""

from __future__ import annotations

import json
import platform
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memagent_cli.backends.build import (
    Tensor,
    gguf_tensors,
    has_amx,
    place_weights,
    system_features,
)
from memagent_cli.backends.llama_patches import Overrides

# llama.cpp 0.25.3's system info on an Intel Xeon with AMX (Sapphire Rapids, -march=native).
XEON_AMX = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
    "BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
    "AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
# An AMD EPYC with AVX2 and no AVX-512; a build with GGML_NATIVE=OFF on the same Xeon.
EPYC_AVX2 = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
XEON_PORTABLE = XEON_AMX.replace("AMX_INT8 = 1 | ", "")
# CUDA on an AMX host: the CPU backend still has AMX for the layers left on the CPU.
CUDA_ON_AMX = "CUDA : ARCHS = 900 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | " + XEON_AMX
METAL = (
    "Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | "
    "MATMUL_INT8 = 1 | ACCELERATE = 1 | REPACK = 1 | "
)


def model(kind: str, layers: int = 4, width: int = 2048, rows: int = 2048) -> list[Tensor]:
    """A dense model's weights: `kind` for the layers' matrices, as a GGUF lists them."""
    tensors = [Tensor("token_embd.weight", kind, (width, 32000))]
    for i in range(layers):
        tensors.append(Tensor(f"blk.{i}.attn_norm.weight", "F32", (width,)))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
            tensors.append(Tensor(f"blk.{i}.{name}.weight", kind, (width, rows)))
        tensors.append(Tensor(f"blk.{i}.ffn_down.weight", kind, (rows, width)))
    tensors.append(Tensor("output.weight", kind, (width, 32000)))
    return tensors


def matched(patterns: tuple[str, ...], tensors: list[Tensor]) -> set[str]:
    return {t.name for t in tensors if any(re.search(p, t.name) for p in patterns)}


def test_system_info_is_read_by_backend():
    features = system_features(CUDA_ON_AMX)
    assert features["CUDA"]["ARCHS"] == "900"
    assert features["CPU"]["AMX_INT8"] == "1" and features["CPU"]["REPACK"] == "1"
    assert "AMX_INT8" not in features["CUDA"]
    assert system_features(METAL)["Metal"] == {"EMBED_LIBRARY": "1"}


@pytest.mark.parametrize(
    "info, amx",
    [(XEON_AMX, True), (CUDA_ON_AMX, True), (EPYC_AVX2, False), (XEON_PORTABLE, False),
     (METAL, False), ("", False), ("CPU : AMX_INT8 = 0 | REPACK = 1 |", False)],
)  # fmt: skip
def test_amx_is_the_cpu_backends_amx_int8(info, amx):
    assert has_amx(info) is amx


@pytest.mark.parametrize("info", [EPYC_AVX2, XEON_PORTABLE, METAL])
def test_without_amx_llama_cpp_chooses(info):
    placement = place_weights(info, model("Q4_0"), repack=None, offload=False)
    assert placement.extra_buffers and not placement.repack


def test_with_amx_the_repackable_matrices_go_to_cpu_repack_and_nothing_else():
    tensors = model("Q4_0", layers=30)
    placement = place_weights(XEON_AMX, tensors, repack=None, offload=False)
    assert not placement.extra_buffers  # the AMX buffer type is never offered
    matrices = {t.name for t in tensors if t.type == "Q4_0"} - {"token_embd.weight"}
    assert matched(placement.repack, tensors) == matrices
    assert len(placement.repack) <= 2  # llama.cpp compiles each pattern once per tensor
    assert "211 tensors repacked" in placement.why


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q5_K", "Q6_K", "IQ4_XS", "F16"])
def test_with_amx_types_without_an_x86_repack_stay_in_plain_buffers(kind):
    placement = place_weights(XEON_AMX, model(kind), repack=None, offload=False)
    assert not placement.extra_buffers and placement.repack == ()


def test_a_mixed_model_repacks_only_its_q4_k_matrices():
    tensors = model("Q4_K") + [Tensor("blk.0.ffn_down.weight", "Q6_K", (2048, 2048))]
    tensors = [t for t in tensors if not (t.name == "blk.0.ffn_down.weight" and t.type == "Q4_K")]
    placement = place_weights(XEON_AMX, tensors, repack=None, offload=False)
    assert "blk.0.ffn_down.weight" not in matched(placement.repack, tensors)
    assert "blk.1.ffn_down.weight" in matched(placement.repack, tensors)


def test_rows_not_a_multiple_of_8_and_q2_k_without_avx512_are_left_alone():
    odd = [Tensor("blk.0.attn_q.weight", "Q4_0", (2048, 2044))]
    assert place_weights(XEON_AMX, odd, repack=None, offload=False).repack == ()
    q2k = [Tensor("blk.0.attn_q.weight", "Q2_K", (2048, 2048))]
    assert place_weights(XEON_AMX, q2k, repack=None, offload=False).repack != ()
    avx2_amx = XEON_AMX.replace("AVX512 = 1 | ", "")  # no build has this; the rule still holds
    assert place_weights(avx2_amx, q2k, repack=None, offload=False).repack == ()


def test_experts_are_repacked_in_three_dimensions_only():
    experts = [
        Tensor("blk.0.ffn_up_exps.weight", "Q4_0", (2048, 768, 8)),
        Tensor("blk.0.ffn_up.weight", "Q4_0", (2048, 768, 8)),  # not a 2-D matrix: left alone
        Tensor("blk.0.ffn_gate_inp.weight", "Q4_0", (2048, 8)),  # a router: not in the rule
    ]
    placement = place_weights(XEON_AMX, experts, repack=None, offload=False)
    assert matched(placement.repack, experts) == {"blk.0.ffn_up_exps.weight"}


def test_with_gpu_offload_no_pattern_pulls_layers_back_to_the_cpu():
    placement = place_weights(CUDA_ON_AMX, model("Q4_0"), repack=None, offload=True)
    assert not placement.extra_buffers and placement.repack == ()
    assert "GPU" in placement.why


@pytest.mark.parametrize("info", [XEON_AMX, EPYC_AVX2])
def test_the_switch_overrides_the_rule(info):
    forced = place_weights(info, model("Q4_0"), repack=True, offload=False)
    assert forced.extra_buffers and forced.repack == ()
    off = place_weights(info, model("Q4_0"), repack=False, offload=False)
    assert not off.extra_buffers and off.repack == ()
    assert "--no-repack" in off.why


def test_tensors_are_read_only_where_the_rule_needs_them():
    def unreadable():
        raise AssertionError("read the GGUF's tensors")
        yield

    for info in (EPYC_AVX2, METAL):
        place_weights(info, unreadable(), repack=None, offload=False)
    place_weights(XEON_AMX, unreadable(), repack=False, offload=False)
    place_weights(CUDA_ON_AMX, unreadable(), repack=None, offload=True)


def test_tensors_are_read_from_the_header_as_gguf_reads_them(tmp_path):
    """The rule's tensor list, read in place from the header past keys of every kind,
    equals what gguf's own reader finds (which takes seconds on a 150K-token vocabulary)."""
    import gguf
    import numpy as np

    path = tmp_path / "model-00001-of-00001.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(4096)
    writer.add_token_list([f"token{i}" for i in range(1000)])
    writer.add_token_scores([float(i) for i in range(1000)])
    writer.add_token_types([1] * 1000)
    writer.add_bool("test.flag", True)
    writer.add_uint64("test.big", 2**40)
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_tensor("token_embd.weight", np.ones((40, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.ones((64, 64), dtype=np.float16))
    writer.add_tensor("blk.0.ffn_up_exps.weight", np.ones((4, 32, 64), dtype=np.float16))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    expected = [
        Tensor(t.name, t.tensor_type.name, tuple(int(n) for n in t.shape))
        for t in gguf.GGUFReader(path).tensors
    ]
    assert list(gguf_tensors(path)) == expected
    assert [t.shape for t in expected] == [(64, 40), (64, 64), (64, 32, 4), (64,)]


def test_overrides_are_a_null_terminated_c_array():
    overrides = Overrides((r"^output\.weight$", r"^blk\.(0|1)\.(attn_q\.weight)$"), 1234)
    assert [entry.pattern for entry in overrides.array] == [
        rb"^output\.weight$",
        rb"^blk\.(0|1)\.(attn_q\.weight)$",
        None,
    ]
    assert [entry.buft for entry in overrides.array][:2] == [1234, 1234]


def run_python(code: str, folder: Path) -> subprocess.CompletedProcess:
    """`code` as a script file, whose lines a traceback can quote."""
    script = folder / "script.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )


def test_a_native_crash_names_the_call_and_keeps_the_signal(tmp_path):
    result = run_python(
        "import ctypes\n"
        "from memagent_cli import crash\n"
        "crash.install()\n"
        "crash.note('weights', 'AMX buffers off')\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.strlen(None)\n",
        tmp_path,
    )
    assert result.returncode == -signal.SIGSEGV  # a shell reports 139
    assert "Fatal Python error: Segmentation fault" in result.stderr  # faulthandler's traceback
    sentence = result.stderr.strip().splitlines()[-1]
    assert sentence.startswith("memagent: native code crashed with SIGSEGV in strlen (called ")
    assert "script.py:6)" in sentence
    assert "Weights: AMX buffers off." in sentence and "--version --json" in sentence
    assert result.stdout == ""
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        # The native frames start where it faulted (strlen, in libc) and stop at ctypes.
        frames = result.stderr.split("Native frames (most recent call first):\n")[1]
        frames = frames.split("\n\n")[0].splitlines()
        assert frames[0].startswith("  libc.so"), frames
        assert not any("libffi" in frame or "libpython" in frame for frame in frames), frames


def test_a_crash_report_that_hangs_is_cut_off_in_bounded_time(tmp_path):
    # As after a fault inside malloc, where the report would wait on the heap's lock forever.
    started = time.monotonic()
    result = run_python(
        "import ctypes, time\n"
        "from memagent_cli import crash\n"
        "crash.install()\n"
        "crash.REPORT_SECONDS = 1\n"
        "crash.native_frames = lambda: time.sleep(60) or []\n"
        "ctypes.CDLL(None).strlen(None)\n",
        tmp_path,
    )
    assert time.monotonic() - started < 30
    assert result.returncode == -signal.SIGSEGV  # the fault's own signal: a shell reports 139
    assert "Fatal Python error: Segmentation fault" in result.stderr  # printed before it hung
    assert "the report could not finish" in result.stderr


def test_a_fatal_signal_sent_from_outside_is_fatal_too(tmp_path):
    result = run_python(
        "import os, signal\n"
        "from memagent_cli import crash\n"
        "crash.install()\n"
        "os.kill(os.getpid(), signal.SIGILL)\n"
        "print('survived')\n",
        tmp_path,
    )
    assert result.returncode == -signal.SIGILL and "survived" not in result.stdout
    assert "instructions this CPU lacks" in result.stderr


def test_version_shows_the_build(cli):
    result = cli("--version")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("memagent 0.")
    assert re.match(r"llama-cpp-python \d+\.\d+\.\d+, ggml \d+\.\d+\.\d+ \(", lines[1])
    assert any(line.startswith("CPU features: ") for line in lines)
    assert any(line.startswith("GPU offload: ") for line in lines)
    assert any(line.startswith("device CPU (CPU): ") and "GiB" in line for line in lines)
    assert result.stderr == ""


def test_version_json_is_the_same_build(cli):
    import llama_cpp

    info = json.loads(cli("--version", "--json").stdout)
    assert info["llama_cpp_python"] == llama_cpp.__version__
    assert info["system_info"] == llama_cpp.llama_print_system_info().decode().strip()
    assert info["amx"] == has_amx(info["system_info"])
    cpu = [d for d in info["devices"] if d["kind"] == "CPU"]
    assert len(cpu) == 1 and cpu[0]["total"] > 0
    assert info["gpu_offload"] == bool(llama_cpp.llama_supports_gpu_offload())
    if info["amx"]:
        assert "AMX" in info["extra_buffers"] and "AMX buffers off" in info["weights"]


def test_version_without_a_model_installed(cli, env, tmp_path):
    """The build is shown before any model is looked for."""
    env["MEMAGENT_MODEL"] = str(tmp_path / "missing.gguf")
    assert cli("--version").returncode == 0


AMX_HERE = has_amx(__import__("llama_cpp").llama_print_system_info().decode())


@pytest.fixture(scope="module")
def q4_0_model(tmp_path_factory, tiny_model) -> Path:
    """The tiny model requantized to Q4_0: the type llama.cpp both repacks and puts in AMX
    buffers."""
    import ctypes

    import llama_cpp

    path = tmp_path_factory.mktemp("q4_0") / "tiny.Q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, 1, 2
    source = str(tiny_model).encode()
    assert llama_cpp.llama_model_quantize(source, str(path).encode(), ctypes.byref(params)) == 0
    return path


@pytest.mark.model
@pytest.mark.skipif(not AMX_HERE, reason="this build of llama.cpp uses no AMX")
def test_on_amx_the_default_reads_repacked_and_llama_cpps_own_choice_crashes(
    memagent, tmp_path, q4_0_model
):
    from support.story import story

    document = tmp_path / "story.txt"
    document.write_text(story(400))
    common = ["-m", str(q4_0_model), "--memory-tokens", "64", "--no-reuse", "--verbose"]
    guarded = memagent("ask", str(document), "Who?", *common)
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    repacked_mib = re.search(r"CPU_REPACK model buffer size = +([0-9.]+) MiB", guarded.stderr)
    assert repacked_mib and float(repacked_mib.group(1)) > 0
    assert re.search(
        r"memagent: weights: AMX buffers off, [1-9]\d* tensors repacked", guarded.stderr
    )
    assert not re.search(r"AMX model buffer size", guarded.stderr)

    crashed = memagent("ask", str(document), "Who?", *common, "--repack")
    assert crashed.returncode == -signal.SIGSEGV
    amx_mib = re.search(r"AMX model buffer size = +([0-9.]+) MiB", crashed.stderr)
    assert amx_mib and float(amx_mib.group(1)) > 0  # llama.cpp's own choice: AMX
    # llama.cpp's threads can fault at once: faulthandler's lines and the sentence may
    # interleave, so the sentence is looked for on a line of its own.
    said = [
        line
        for line in crashed.stderr.splitlines()
        if line.startswith("memagent: native code crashed with SIGSEGV in llama_decode")
    ]
    assert said and "--no-repack" in said[0]


def test_the_guarded_server_refuses_a_missing_model_in_one_sentence(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "memagent_cli.backends.llama_server", "--model",
         str(tmp_path / "nope.gguf")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1 and result.stdout == ""
    assert (
        result.stderr.strip() == f"error: model not found: {tmp_path / 'nope.gguf'} is not a file."
    )


def test_the_cxx_runtime_is_global_before_llama_cpp_loads(tmp_path):
    # numpy loads libstdc++ privately; memagent's backends make it global (the global scope
    # is searched first), so a CUDA build's libggml-cuda cannot lend llama.cpp its copies.
    if not (sys.platform == "linux" and platform.libc_ver()[0] == "glibc"):
        pytest.skip("the dynamic linker's scopes are glibc's")
    result = run_python(
        "import ctypes, sys\n"
        "import numpy\n"
        "def global_(): return hasattr(ctypes.CDLL(None), '_ZNSo9_M_insertIlEERSoT_')\n"
        "before = global_()\n"
        "import memagent_cli.backends\n"
        "print(before, global_(), 'llama_cpp' in sys.modules)\n",
        tmp_path,
    )
    # Before: False where numpy loaded it privately (here); a Python linked with libstdc++
    # has it global already. After: global either way, and llama_cpp not loaded yet.
    assert result.stdout.split()[1:] == ["True", "False"], result.stderr
