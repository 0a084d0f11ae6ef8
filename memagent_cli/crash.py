"""A crash inside native code (llama.cpp) is never silent: stderr gets Python's traceback of
every thread, the native frames that led to the signal (where libc can list them), then one
sentence naming the native call that died and what to try. The process then dies of the same
signal, so a shell still reports 139 for SIGSEGV; a report that hangs (a fault inside malloc)
is cut off by an alarm after REPORT_SECONDS."""

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
# The report runs Python (and libc's backtrace_symbols, which allocates) inside the handler:
# after a fault inside malloc it could wait forever on the heap's lock. An alarm this many
# seconds after the fault ends the process (SIGALRM, exit 142) if the report has not.
REPORT_SECONDS = 10
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
        native_frames()  # the first call loads the unwinder: not inside a signal handler
    # faulthandler saves the handler above and calls it once it has printed the traceback.
    faulthandler.enable(file=sys.stderr, all_threads=True)


def _on_fatal(signum: int) -> None:
    # Runs inside the signal handler, with the GIL (ctypes takes it; llama.cpp's calls run
    # without it). Only write to fd 2, then die of the signal with its default action.
    libc = _installed[0]
    libc.signal(signal.SIGALRM, 0)  # SIG_DFL: the alarm ends the process
    libc.alarm(REPORT_SECONDS)
    try:
        frames = _fault_frames(native_frames())
        if frames:
            listed = "".join(f"  {frame}\n" for frame in frames)
            os.write(2, f"\nNative frames (most recent call first):\n{listed}".encode())
        os.write(2, message(signum, native_call()).encode("utf-8", "replace"))
    finally:
        libc.signal(signum, 0)  # SIG_DFL
        libc["raise"](signum)  # delivered, and fatal, once this handler returns


def native_frames(limit: int = 48) -> list[str]:
    """The native call stack of this thread, as libc's backtrace_symbols gives it ("libllama.so
    (llama_decode+0x5e)"), each library named without its folder; empty where libc has no
    backtrace (musl) or nothing is installed. Inside a signal handler the stack runs through
    the signal frame into the code that faulted."""
    if not _installed:
        return []
    libc = _installed[0]
    try:
        backtrace, symbols = libc.backtrace, libc.backtrace_symbols
    except AttributeError:
        return []
    backtrace.restype, backtrace.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]
    symbols.restype = ctypes.POINTER(ctypes.c_char_p)
    symbols.argtypes = [ctypes.c_void_p, ctypes.c_int]
    addresses = (ctypes.c_void_p * limit)()
    count = backtrace(addresses, limit)
    names = symbols(addresses, count)
    if not names:
        return []
    try:
        found = [(names[i] or b"?").decode("utf-8", "replace") for i in range(count)]
    finally:
        libc.free(ctypes.cast(names, ctypes.c_void_p))
    return [_short(path) + rest for path, rest in (_split_frame(frame) for frame in found)]


def _fault_frames(frames: list[str]) -> list[str]:
    """The native frames from the code that faulted down to the ctypes call that entered it
    (Python's traceback has the rest). This handler runs inside faulthandler's, which
    re-raised the signal, so the stack is this handler, a signal frame, the re-raise (raise,
    or gsignal as glibc names it), another signal frame, then the fault."""
    for i, frame in enumerate(frames):
        if re.search(r"\((raise|gsignal)\+", frame):
            frames = frames[i + 2 :]
            break
    for i, frame in enumerate(frames):
        if i and frame.startswith(("libffi", "_ctypes")):
            return frames[:i]
    return frames


def _split_frame(frame: str) -> tuple[str, str]:
    """A frame ("/lib/libc.so.6(strlen+0x1d) [0x7f...]") as its library and the rest."""
    path, paren, rest = frame.partition("(")
    return path, paren + rest


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
