"""The crash reporter on real native faults, from a small C library built here: a fault on
the main thread, on a native worker thread, and inside malloc on a worker thread (heap
corruption, the usual cause), where the report itself cannot run. Each ends at once or in
bounded time, with the signal's exit code."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "data" / "faults.c"
COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(
    COMPILER is None or os.name != "posix", reason="needs a C compiler and POSIX signals"
)
GLIBC = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/faults.c built as a shared library."""
    library = tmp_path_factory.mktemp("faults") / "libfaults.so"
    subprocess.run(
        [COMPILER, "-shared", "-fPIC", "-pthread", "-O0", "-o", str(library), str(SOURCE)],
        check=True,
        timeout=120,
    )
    return library


def crash(folder: Path, faults: Path, body: str, env: dict[str, str] | None = None):
    """A script that installs the crash reporter, loads the library as `lib` and runs `body`;
    returns the finished process and the seconds it took."""
    script = folder / "script.py"
    script.write_text(
        "import ctypes, time\n"
        "from memagent_cli import crash\n"
        "crash.install()\n"
        f"lib = ctypes.CDLL({str(faults)!r})\n" + body
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **(env or {})},
    )
    return result, time.monotonic() - started


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_a_fault_on_the_main_thread_is_reported_and_keeps_its_signal(tmp_path, faults):
    result, _ = crash(tmp_path, faults, "lib.fault_here()\n")
    assert result.returncode == -signal.SIGSEGV, result.stderr
    assert "Fatal Python error: Segmentation fault" in result.stderr
    assert last_line(result).startswith("memagent: native code crashed with SIGSEGV in fault_here")
    assert "script.py:5)" in last_line(result)


@pytest.mark.skipif(not GLIBC, reason="the heap corruption is glibc's malloc's")
def test_a_fault_inside_malloc_on_a_worker_thread_ends_in_bounded_time(tmp_path, faults):
    # The report's own first step (a Python thread state for the faulting thread) waits on
    # the heap's lock that the fault left taken: only a watcher outside it can end the run.
    result, seconds = crash(tmp_path, faults, "crash.REPORT_SECONDS = 2\nlib.fault_in_worker(1)\n")
    assert result.returncode == -signal.SIGSEGV, result.stderr  # a shell reports 139
    assert seconds < 30
    assert "Fatal Python error: Segmentation fault" in result.stderr  # faulthandler's
    assert "could not finish" in result.stderr


def test_a_worker_threads_fault_is_not_blamed_on_the_main_thread(tmp_path, faults):
    result, _ = crash(tmp_path, faults, "lib.start_faulting_worker()\ntime.sleep(60)\n")
    assert result.returncode == -signal.SIGSEGV, result.stderr
    sentence = last_line(result)
    assert sentence.startswith("memagent: native code crashed with SIGSEGV in a native thread")
    assert " in sleep" not in sentence
    assert "--no-repack" not in sentence  # no model was loaded: nothing to say about weights


def test_a_worker_that_the_main_thread_waits_for_is_named_as_the_faulting_thread(tmp_path, faults):
    # As llama.cpp's main thread waits at its barrier for the worker that faulted.
    result, _ = crash(tmp_path, faults, "lib.fault_in_worker(0)\n")
    assert result.returncode == -signal.SIGSEGV, result.stderr
    assert last_line(result).startswith(
        "memagent: native code crashed with SIGSEGV in a native thread"
    )
    assert "in fault_in_worker" not in last_line(result)
    assert 'script.py", line 5 in <module>' in result.stderr  # where Python's thread was


def test_pythonfaulthandler_keeps_its_traceback(tmp_path, faults):
    # With PYTHONFAULTHANDLER=1 faulthandler is on before install(); it must stay first.
    result, _ = crash(tmp_path, faults, "lib.fault_here()\n", env={"PYTHONFAULTHANDLER": "1"})
    assert result.returncode == -signal.SIGSEGV, result.stderr
    assert "Fatal Python error: Segmentation fault" in result.stderr
    assert "memagent: native code crashed with SIGSEGV in fault_here" in result.stderr


def test_with_a_model_loaded_a_workers_fault_names_the_call_it_computed_for(tmp_path, faults):
    # As llama.cpp's workers compute the graph of the llama_decode the main thread waits in.
    result, _ = crash(
        tmp_path, faults, "crash.note('weights', 'AMX buffers off')\nlib.fault_in_worker(0)\n"
    )
    assert result.returncode == -signal.SIGSEGV, result.stderr
    sentence = last_line(result)
    assert sentence.startswith(
        "memagent: native code crashed with SIGSEGV in fault_in_worker (called from script.py:6)"
        ", on one of its native threads."
    )
    assert "--no-repack" in sentence


def test_a_crash_in_a_forked_child_ends_the_child_only(tmp_path, faults):
    # The API's users may fork (multiprocessing's default on Linux): the child's crash is
    # reported and ends the child; the parent, healthy, goes on past the watcher's deadline.
    body = (
        "import os, sys\n"
        "crash.REPORT_SECONDS = 1\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    lib.fault_here()\n"
        "_, status = os.waitpid(child, 0)\n"
        "time.sleep(4)\n"  # the watcher's deadline and then some
        "print('parent alive', os.waitstatus_to_exitcode(status), flush=True)\n"
    )
    result, _ = crash(tmp_path, faults, body)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"parent alive {-signal.SIGSEGV}"
    assert "memagent: native code crashed with SIGSEGV in fault_here" in result.stderr
    assert "could not finish" not in result.stderr
