"""memagent beyond Linux, by simulation on Linux: a Python without SIGBUS or fcntl (Windows),
a cp1252 stdout, a file system that refuses chmod (WSL2 on /mnt/c), Windows' file locks and
unlinking, macOS's errno numbers and fsync, platformdirs' macOS and Windows folders, a macOS
backtrace, an ARM system-info line, and Metal's shared memory."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from support.command import MEMAGENT
from support.fake_openai import served
from support.story import FACT_QUESTION, story

from memagent_cli import crash, files, folders

WINDOWS_IMPORTS = (
    "import signal, sys\n"
    "del signal.SIGBUS\n"
    "for name in ('fcntl', 'resource', 'pty', 'termios'):\n"
    "    sys.modules[name] = None  # import fails, as on Windows\n"
)


@pytest.mark.parametrize("module", ["memagent_cli.cli", "memagent_cli.api"])
def test_memagent_imports_without_posix_only_names(module):
    result = subprocess.run(
        [sys.executable, "-c", WINDOWS_IMPORTS + f"import {module}\n"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_the_crash_reporter_installs_without_sigbus(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", WINDOWS_IMPORTS + "from memagent_cli import crash\ncrash.install()"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ a cp1252 stdout


def non_latin_trace(path: Path) -> Path:
    from test_trace_view import MEMORIES, write_trace

    memories = [f"{memory}\nПароль: ПЕЛИКАН 鹈鹕 🦩" for memory in MEMORIES]
    return write_trace(path, memories + ["Пароль — \\boxed{ПЕЛИКАН} 鹈鹕"])


@pytest.mark.parametrize("view", [[], ["--step", "2"], ["--markdown"], ["--json"]])
def test_trace_on_a_cp1252_stdout_replaces_what_it_cannot_encode(env, tmp_path, view):
    trace = non_latin_trace(tmp_path / "run.jsonl")
    out = tmp_path / "out.txt"
    with out.open("wb") as stdout:  # redirected: `memagent trace T > out`
        result = subprocess.run(
            [str(MEMAGENT), "trace", str(trace), *view],
            stdout=stdout,
            stderr=subprocess.PIPE,
            env={**env, "PYTHONIOENCODING": "cp1252"},
            timeout=120,
        )
    assert result.returncode == 0, result.stderr.decode("cp1252", "replace")
    shown = out.read_bytes().decode("cp1252")
    assert "??" in shown  # each character cp1252 lacks, as "?"
    assert "Traceback" not in result.stderr.decode("cp1252", "replace")


def test_ask_on_a_cp1252_stdout_prints_its_answer(env, tmp_path, fake_server):
    document = tmp_path / "story.txt"
    document.write_text("ПЕЛИКАН 鹈鹕 " * 300)  # the stand-in model answers with a word of it
    out = tmp_path / "answer.txt"
    with out.open("wb") as stdout:
        result = subprocess.run(
            [str(MEMAGENT), "ask", str(document), FACT_QUESTION + " 鹈鹕?", *served(fake_server)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            env={**env, "PYTHONIOENCODING": "cp1252"},
            timeout=300,
        )
    assert result.returncode == 0, result.stderr.decode("cp1252", "replace")
    answer = out.read_bytes().decode("cp1252")
    assert answer.strip() and set(answer.strip()) <= {"?"}


# ------------------------------------------------- chmod answering EPERM (WSL2, /mnt/c)


def refuse_chmod(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refused)
    monkeypatch.setattr(os, "fchmod", refused)


def test_files_are_written_where_chmod_is_refused(tmp_path, monkeypatch, capsys, caplog):
    """The library writes on and notes it (files.NOTES); it prints nothing itself."""
    refuse_chmod(monkeypatch)
    monkeypatch.setattr(files.NOTES, "handlers", [])  # a library user's: the command's view off
    folder = tmp_path / "made" / "here"
    with caplog.at_level(logging.INFO, logger="memagent"):
        files.private_folder(folder)
        with files.open_private(folder / "trace.jsonl") as file:
            file.write("kept\n")
    assert (folder / "trace.jsonl").read_text() == "kept\n"
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "could not restrict" in said and "permissions" in said
    assert capsys.readouterr().err == ""


def test_ask_writes_its_trace_where_chmod_is_refused(cli, tmp_path, monkeypatch, fake_server):
    refuse_chmod(monkeypatch)
    document = tmp_path / "story.txt"
    document.write_text(story(300))
    trace = tmp_path / "mnt-c" / "run.jsonl"
    result = cli("ask", str(document), FACT_QUESTION, "--trace", str(trace), *served(fake_server))
    assert result.returncode == 0, result.stderr
    assert trace.read_text().count('"type": "step"') >= 1
    assert "could not restrict" in result.stderr


# ------------------------------------------------------------ Windows: locks and unlink


class FakeMsvcrt(types.SimpleNamespace):
    """msvcrt.locking as Windows has it: a byte range locked from the file's position, one
    holder at a time (per open file, not per process), EDEADLOCK-style OSError when taken."""

    LK_NBLCK = 2
    LK_UNLCK = 0

    def __init__(self) -> None:
        super().__init__(held={})

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        info = os.fstat(fd)
        where = (info.st_dev, info.st_ino, os.lseek(fd, 0, os.SEEK_CUR), nbytes)
        if mode == self.LK_UNLCK:
            self.held.pop(where, None)
            return
        holder = self.held.get(where)
        if holder is not None and holder != fd:
            raise OSError(errno.EDEADLK, "Resource deadlock avoided")
        self.held[where] = fd


def test_without_fcntl_a_second_writer_is_still_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "fcntl", None)
    monkeypatch.setattr(files, "msvcrt", FakeMsvcrt(), raising=False)
    path = tmp_path / "trace.jsonl"
    with files.open_private(path, "a") as first, files.open_private(path, "a") as second:
        assert files.lock(first)
        assert not files.lock(second)
        first.write("the lock leaves the file readable and writable\n")
    assert path.read_text() == "the lock leaves the file readable and writable\n"


def test_an_open_file_that_windows_will_not_unlink_is_removed_after_closing(tmp_path, monkeypatch):
    opened: dict[str, object] = {}
    real_unlink = os.unlink

    def windows_unlink(path, *args, **kwargs):
        file = opened.get(str(path))
        if file is not None and not file.closed:
            raise PermissionError(errno.EACCES, "The process cannot access the file")
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", windows_unlink)
    path = tmp_path / "empty.jsonl"
    file = files.open_private(path, "a")
    opened[str(path)] = file
    files.close_and_remove(file, path)
    assert file.closed and not path.exists()


def test_a_finished_batch_s_journal_is_removed_where_an_open_file_cannot_be(tmp_path, monkeypatch):
    """The journal holds its file open and locked; on Windows it is closed, then removed."""
    from memagent_cli.run import journal

    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path / "home"))
    opened = journal.Journal(tmp_path / "batch.jsonl", {"command": "ask"})
    real_unlink = os.unlink

    def windows_unlink(path, *args, **kwargs):
        if str(path) == str(opened.path) and not opened._file.closed:
            raise PermissionError(errno.EACCES, "The process cannot access the file")
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", windows_unlink)
    opened.close(finished=True)
    assert not opened.path.exists()


# ----------------------------------------------------------- macOS: errno and fsync


def test_a_lock_refused_with_macos_enotsup_is_no_lock(tmp_path, monkeypatch):
    # macOS numbers: ENOTSUP is 45 and EOPNOTSUPP 102 (both 95 on Linux).
    macos = types.SimpleNamespace(**{**vars(errno), "ENOTSUP": 45, "EOPNOTSUPP": 102})
    monkeypatch.setattr(files, "errno", macos)

    def unsupported(fd, operation):
        raise OSError(45, "Operation not supported")

    monkeypatch.setattr(files.fcntl, "flock", unsupported)
    with files.open_private(tmp_path / "on-smbfs.jsonl", "a") as file:
        assert files.lock(file)


def test_traces_are_synced_with_f_fullfsync_where_there_is_one(tmp_path, monkeypatch):
    import fcntl

    calls: list[int] = []

    def recorded(fd, command, *args):
        calls.append(command)
        return 0

    darwin = types.SimpleNamespace(**{**vars(fcntl), "F_FULLFSYNC": 51, "fcntl": recorded})
    monkeypatch.setattr(files, "fcntl", darwin)
    non_latin_trace(tmp_path / "run.jsonl")
    assert calls and set(calls) == {51}


# ------------------------------------------- test isolation on macOS and Windows folders


@pytest.mark.parametrize("platform", ["macos", "windows"])
def test_the_suites_folders_stay_isolated_where_platformdirs_ignores_xdg(
    env, tmp_path, monkeypatch, platform
):
    import importlib

    import platformdirs

    module = importlib.import_module(f"platformdirs.{platform}")
    kind = {"macos": "MacOS", "windows": "Windows"}[platform]
    monkeypatch.setattr(platformdirs, "PlatformDirs", getattr(module, kind))
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("APPDATA", str(Path.home() / "AppData"))  # what Windows would say
    monkeypatch.setenv("LOCALAPPDATA", str(Path.home() / "AppData" / "Local"))
    assert folders.data_dir().is_relative_to(tmp_path)
    assert folders.cache_dir().is_relative_to(tmp_path)


# -------------------------------------------------------------------------- parsers

MACOS_BACKTRACE = [
    "0   _ctypes.cpython-311-darwin.so       0x0000000100a1c1f4 ffi_call_SYSV + 84",
    "1   libffi.dylib                        0x00000001a1b2c3d4 ffi_closure_SYSV_inner + 120",
    "2   libsystem_platform.dylib            0x000000018f0e3584 _sigtramp + 56",
    "3   libsystem_pthread.dylib             0x000000018f0b3c20 pthread_kill + 288",
    "4   libsystem_c.dylib                   0x000000018efc0a30 raise + 32",
    "5   Python                              0x0000000100f6b0cc faulthandler_fatal_error + 396",
    "6   libsystem_platform.dylib            0x000000018f0e3584 _sigtramp + 56",
    "7   libggml-cpu.dylib    0x0000000101234567 ggml_compute_forward_mul_mat + 1208",
    "8   libggml-cpu.dylib                   0x0000000101230000 ggml_graph_compute_thread + 812",
    "9   libllama.dylib                      0x0000000101100000 llama_decode + 64",
    "10  libffi.dylib                        0x00000001a1b2c000 ffi_call_SYSV + 80",
    *[f"{i:<4}Python    0x00000001000{i:05x} _PyEval_EvalFrameDefault + 1" for i in range(11, 48)],
]


def test_a_macos_backtrace_is_cut_to_the_frames_that_faulted():
    assert crash.fault_frames(MACOS_BACKTRACE) == [
        "libggml-cpu.dylib(ggml_compute_forward_mul_mat+0x4b8) [0x0000000101234567]",
        "libggml-cpu.dylib(ggml_graph_compute_thread+0x32c) [0x0000000101230000]",
        "libllama.dylib(llama_decode+0x40) [0x0000000101100000]",
    ]


def test_a_linux_backtrace_keeps_its_shape():
    linux = [
        "/usr/lib/python3.11/lib-dynload/_ctypes.so(+0x1234) [0x7f0000001234]",
        "/lib/x86_64-linux-gnu/libc.so.6(+0x42520) [0x7f0000042520]",
        "/lib/x86_64-linux-gnu/libc.so.6(gsignal+0x2c) [0x7f00000969fc]",
        "/usr/lib/libpython3.11.so(+0x2a1b2c) [0x7f00002a1b2c]",
        "/lib/x86_64-linux-gnu/libc.so.6(+0x42520) [0x7f0000042520]",
        "/venv/llama_cpp/lib/libllama.so(llama_decode+0x5e) [0x7f000011005e]",
        "/usr/lib/x86_64-linux-gnu/libffi.so.8(+0x7e2e) [0x7f0000007e2e]",
    ]
    assert crash.fault_frames(linux) == [
        "libc.so.6(+0x42520) [0x7f0000042520]",
        "llama_cpp/lib/libllama.so(llama_decode+0x5e) [0x7f000011005e]",
    ]


ARM_INFO = (
    "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | MATMUL_INT8 = 1 | SVE = 1 | DOTPROD = 1 | "
    "SVE_CNT = 32 | OPENMP = 1 | REPACK = 1 | "
)


def test_version_shows_arms_int8_features(cli, monkeypatch):
    import json

    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: ARM_INFO.encode())
    info = json.loads(cli("--version", "--json").stdout)
    assert {"NEON", "DOTPROD", "MATMUL_INT8", "SVE"} <= {
        name for name, on in info["cpu_features"].items() if on
    }
    line = next(x for x in cli("--version").stdout.splitlines() if x.startswith("CPU features"))
    assert all(name in line.split() for name in ("NEON", "DOTPROD", "MATMUL_INT8", "SVE"))


# ---------------------------------------------------- Metal: questions read together


def test_metal_reads_as_many_questions_together_as_fit_in_the_shared_memory(monkeypatch):
    import psutil

    from memagent_cli.backends import llama_cpp as backend_module

    backend = backend_module.LlamaCppBackend.__new__(backend_module.LlamaCppBackend)
    backend.batch_size, backend.gpu_layers = 2048, -1
    backend.path = Path(__file__)  # a file of a few KB stands for the weights
    monkeypatch.setattr(backend, "cache_bytes", lambda context: 1 << 30, raising=False)
    monkeypatch.setattr(backend_module, "can_offload", lambda: True)
    monkeypatch.setattr(backend_module.sys, "platform", "darwin")
    free = types.SimpleNamespace(available=backend_module._RESERVE + (3 << 30))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    assert backend.sequences_that_fit(8192) == 2  # 3 GiB free beside the weights, 1 GiB each


def test_a_backtrace_that_stops_short_of_the_fault_shows_nothing():
    # On llama.cpp's worker threads glibc's unwinder stops in libffi's closure.
    assert crash.fault_frames(["/usr/lib/x86_64-linux-gnu/libffi.so.8(+0x6f7a) [0x7f82af]"]) == []
