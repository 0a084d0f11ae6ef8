"""A crash inside native code (llama.cpp) is never silent: stderr gets Python's traceback of
every thread, then one sentence naming the native call that died and what to try. The
process then dies of the same signal, so a shell still reports 139 for SIGSEGV."""

from __future__ import annotations

import ctypes
import faulthandler
import linecache
import os
import re
import signal
import sys
import threading
from types import FrameType

_FATAL = {
    signal.SIGSEGV: "SIGSEGV",
    signal.SIGBUS: "SIGBUS",
    signal.SIGILL: "SIGILL",
    signal.SIGFPE: "SIGFPE",
    signal.SIGABRT: "SIGABRT",
}
_notes: dict[str, str] = {}  # what was running, for the sentence: note() sets them
_installed: list[object] = []  # the C callback, which must outlive every crash


def note(key: str, text: str) -> None:
    """Remember one fact for a crash report ("weights": where llama.cpp put them)."""
    _notes[key] = text


def install() -> None:
    """Report fatal signals as the module says. Where signals cannot be caught from C
    (not POSIX), Python's faulthandler alone prints the traceback."""
    if _installed:
        return
    if os.name == "posix":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(_on_fatal)
        for signum in _FATAL:
            libc.signal(signum, ctypes.cast(handler, ctypes.c_void_p))
        _installed.extend((libc, handler))
    # faulthandler saves the handler above and calls it once it has printed the traceback.
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _on_fatal(signum: int) -> None:
    # Runs inside the signal handler, with the GIL (ctypes takes it; llama.cpp's calls run
    # without it). Only write to fd 2, then die of the signal with its default action.
    libc = _installed[0]
    try:
        os.write(2, message(signum, native_call()).encode("utf-8", "replace"))
    finally:
        libc.signal(signum, 0)  # SIG_DFL
        libc["raise"](signum)  # delivered, and fatal, once this handler returns


def native_call() -> tuple[str, str] | None:
    """(function, "file:line") of the native call the main thread is in, read from the line
    of Python that made it ("llama_cpp.llama_decode(...)" gives llama_decode)."""
    frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return None
    filename, line = frame.f_code.co_filename, frame.f_lineno
    calls = re.findall(r"\.(\w+)\s*\(", linecache.getline(filename, line))
    where = f"{_short(filename)}:{line}"
    return (calls[0] if calls else frame.f_code.co_name), where


def message(signum: int, call: tuple[str, str] | None) -> str:
    """The sentence a fatal signal leaves on stderr."""
    name = _FATAL.get(signal.Signals(signum), f"signal {signum}")
    where = f" in {call[0]} (called from {call[1]})" if call else ""
    facts = "".join(f" {key.capitalize()}: {text}." for key, text in _notes.items())
    if signum == signal.SIGILL:
        advice = (
            "This build of llama.cpp uses instructions this CPU lacks: run `make install` "
            "again on this machine."
        )
    else:
        advice = "Try --no-repack (llama.cpp's plain weight layouts), or --gpu-layers 0 with a GPU."
    return (
        f"\nmemagent: native code crashed with {name}{where}.{facts} {advice} To report it, "
        "include the output of `memagent --version --json` (docs/troubleshooting.md).\n"
    )


def _short(filename: str) -> str:
    """A path from the package or site-packages folder on, not the user's home."""
    parts = filename.replace(os.sep, "/").split("/")
    for anchor in ("memagent_cli", "llama_cpp"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) :])
    return parts[-1]
