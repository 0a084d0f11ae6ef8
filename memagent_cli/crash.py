"""A crash inside native code (llama.cpp) is never silent: stderr gets Python's traceback of
every thread, the native frames that led to the signal (where libc can list them), then one
sentence naming the native call that died and what to try. The process then dies of the same
signal, so a shell still reports 139 for SIGSEGV.

The report runs Python inside the signal handler, and entering Python from a thread that
never ran any (a llama.cpp or OpenMP worker) allocates memory first: after a fault inside
malloc that waits forever on the heap's lock. So faulthandler, which needs no allocation,
writes its traceback into a pipe, and a watcher thread that reads it forwards it to stderr
and, if the process still lives REPORT_SECONDS later, ends it with the same signal. An
alarm a little later is the last resort, for a report that hangs holding the GIL (exit 142).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import linecache
import os
import re
import select
import signal
import sys
import threading
import time
from types import FrameType

# Windows has no SIGBUS (and catches none of these from C here): only those this Python has.
_FATAL = {
    getattr(signal, name): name
    for name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
    if hasattr(signal, name)
}
# How faulthandler's first line names each signal, for the watcher.
_FAULTHANDLER_NAMES = {
    b"Segmentation fault": "SIGSEGV",
    b"Bus error": "SIGBUS",
    b"Illegal instruction": "SIGILL",
    b"Floating point exception": "SIGFPE",
    b"Floating-point exception": "SIGFPE",
    b"Aborted": "SIGABRT",
}
# Seconds after a fault at which the watcher ends a process whose report has not.
REPORT_SECONDS = 10
_LAST_RESORT_SECONDS = 5  # more, for the alarm: a report that hangs holding the GIL
_notes: dict[str, str] = {}  # what was running, for the sentence: note() sets them
_installed: list[object] = []  # libc and the C callback, which must outlive every crash
# faulthandler writes into _pipe[1]; the watcher and the report read _pipe[0]. The report
# also writes a byte into _pipe[3], since it may drain the first pipe before the watcher
# wakes (a pipe drained again is not readable).
_pipe: list[int] = []
_forwarding = threading.Lock()  # one reader of the pipe at a time, so the text keeps its order
_buffer = bytearray(1 << 16)  # allocated now: reading the pipe after a fault allocates nothing
_first = bytearray()  # the start of faulthandler's text: which signal it was
_CUT_OFF = (
    b"\nmemagent: native code crashed, and the report could not finish (a fault inside the "
    b"memory allocator leaves it waiting): ending the process with the same signal. "
    b"docs/troubleshooting.md says what to try.\n"
)


def note(key: str, text: str) -> None:
    """Remember one fact for a crash report ("weights": where llama.cpp put them)."""
    _notes[key] = text


def install() -> None:
    """Report fatal signals as the module says. Where signals cannot be caught from C
    (not POSIX), Python's faulthandler alone prints the traceback."""
    if _installed:
        return
    if os.name != "posix" or not hasattr(signal, "SIGALRM"):
        faulthandler.enable(file=sys.stderr, all_threads=True)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    handler = ctypes.CFUNCTYPE(None, ctypes.c_int)(_on_fatal)
    # faulthandler must run first (its traceback needs no allocation) and then call ours. One
    # already on (PYTHONFAULTHANDLER=1, -X faulthandler) would be overwritten below and not
    # enabled again by enable(), which does nothing while it is on: turn it off first.
    faulthandler.disable()
    for signum in _FATAL:
        libc.signal(signum, ctypes.cast(handler, ctypes.c_void_p))
    _installed.extend((libc, handler))
    native_frames()  # the first call loads the unwinder: not inside a signal handler
    reading, writing = os.pipe()
    os.set_blocking(reading, False)
    with contextlib.suppress(ImportError, AttributeError, OSError):
        import fcntl  # room for every thread's traceback (Linux's F_SETPIPE_SZ)

        fcntl.fcntl(writing, fcntl.F_SETPIPE_SZ, 1 << 20)
    _pipe[:] = [reading, writing, *os.pipe()]
    # faulthandler saves the handler above and calls it once it has printed the traceback.
    faulthandler.enable(file=writing, all_threads=True)
    threading.Thread(target=_watch, name="memagent-crash-watcher", daemon=True).start()
    os.register_at_fork(after_in_child=_after_fork)


def _after_fork() -> None:
    # A child has no watcher: its faulthandler writes to stderr itself, and its report
    # leaves the parent's pipes alone. A byte in them would wake the parent's watcher,
    # which then ends the parent, healthy, with the child's signal.
    if sys.stderr is not None:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    inherited, _pipe[:] = list(_pipe), []
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)


def _forward() -> int:
    """Copy what faulthandler has written into the pipe to stderr; the bytes copied."""
    copied = 0
    with _forwarding:
        while True:
            try:
                count = os.readv(_pipe[0], [_buffer])
            except (BlockingIOError, InterruptedError):
                return copied
            if count <= 0:
                return copied
            if len(_first) < 128:  # faulthandler writes its first line in pieces
                _first.extend(_buffer[: min(count, 128 - len(_first))])
            os.write(2, memoryview(_buffer)[:count])
            copied += count


def _watch() -> None:
    """Wait for a fault (faulthandler writing), forward its traceback, and end the process
    with the same signal if it still lives REPORT_SECONDS later: the report on the faulting
    thread may be waiting forever for memory."""
    select.select([_pipe[0], _pipe[2]], [], [])
    deadline = time.monotonic() + REPORT_SECONDS
    while time.monotonic() < deadline:
        _forward()
        time.sleep(0.05)
    _forward()
    name = next((n for text, n in _FAULTHANDLER_NAMES.items() if text in _first), "SIGABRT")
    signum = getattr(signal, name)
    os.write(2, _CUT_OFF)
    _installed[0].signal(signum, 0)  # SIG_DFL
    os.kill(os.getpid(), signum)  # the faulting thread blocks it; another thread takes it


def _on_fatal(signum: int) -> None:
    # Runs inside the signal handler, with the GIL (ctypes takes it; llama.cpp's calls run
    # without it). Only write to fd 2, then die of the signal with its default action.
    libc = _installed[0]
    libc.signal(signal.SIGALRM, 0)  # SIG_DFL: the alarm ends the process
    libc.alarm(REPORT_SECONDS + _LAST_RESORT_SECONDS)
    try:
        if _pipe:  # a forked child has no watcher (_after_fork)
            os.write(_pipe[3], b"!")  # wakes the watcher, which ends a report that hangs
            _forward()  # faulthandler's traceback first, where the watcher has not sent it
        ident = threading.get_ident()
        frames = fault_frames(native_frames())
        if frames:
            listed = "".join(f"  {frame}\n" for frame in frames)
            os.write(2, f"\nNative frames (most recent call first):\n{listed}".encode())
        call = native_call(ident)  # None: a thread that runs no Python (a native worker)
        native_thread = call is None
        if native_thread and "weights" in _notes:
            # llama.cpp's workers compute what its call on the main thread asked for; with no
            # model loaded the main thread's call says nothing (`trace --follow` sleeps).
            call = native_call()
        text = message(signum, call, native_thread=native_thread)
        os.write(2, text.encode("utf-8", "replace"))
    finally:
        # SIG_DFL only now: llama.cpp's other threads may fault a moment after this one, and
        # with the default set they would end the process before this report is written.
        libc.signal(signum, 0)
        libc["raise"](signum)  # delivered, and fatal, once this handler returns


def native_frames(limit: int = 48) -> list[str]:
    """The native call stack of this thread, as libc's backtrace_symbols gives it (glibc:
    "/lib/libllama.so(llama_decode+0x5e) [0x7f...]"; macOS: "3   libllama.dylib   0x0001...
    llama_decode + 94"); empty where libc has no backtrace (musl) or nothing is installed.
    Inside a signal handler the stack runs through the signal frame into the code that
    faulted."""
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
        return [(names[i] or b"?").decode("utf-8", "replace") for i in range(count)]
    finally:
        libc.free(ctypes.cast(names, ctypes.c_void_p))


# macOS's backtrace_symbols: index, image, address, then "symbol + decimal offset".
_MACOS_FRAME = re.compile(r"^\d+\s+(\S+)\s+(0x[0-9a-fA-F]+)\s+(.*?)(?: \+ (\d+))?$")


def fault_frames(symbols: list[str]) -> list[str]:
    """The frames of `symbols` (backtrace_symbols' lines, glibc's or macOS's) from the code
    that faulted down to the ctypes call that entered it (Python's traceback has the rest),
    each as "libllama.so(llama_decode+0x5e) [0x7f...]", the library without its folder.
    This handler runs inside faulthandler's, which re-raised the signal, so the stack is this
    handler, a signal frame, the re-raise (raise, or gsignal as glibc names it), faulthandler,
    another signal frame (macOS's _sigtramp is dropped), then the fault. Without the
    re-raise in the stack there is nothing to show."""
    frames = [_normal(symbol) for symbol in symbols]
    for i, frame in enumerate(frames):
        if re.search(r"\((raise|gsignal)\+", frame):
            frames = frames[i + 2 :]
            break
    else:  # the unwinder stopped short of the fault (seen on llama.cpp's worker threads)
        return []
    if frames and "(_sigtramp+" in frames[0]:
        frames = frames[1:]
    for i, frame in enumerate(frames):
        if i and frame.startswith(("libffi", "_ctypes")):
            return frames[:i]
    return frames


def _normal(symbol: str) -> str:
    """One frame as glibc writes it, its library without the folder."""
    mac = _MACOS_FRAME.match(symbol.strip())
    if mac:
        image, address, name, offset = mac.groups()
        return f"{image}({name}+{int(offset or 0):#x}) [{address}]"
    path, paren, rest = symbol.partition("(")
    return _short(path) + paren + rest


def native_call(ident: int | None = None) -> tuple[str, str] | None:
    """(function, "file:line") of the native call the thread `ident` (the main thread by
    default) is in, read from the line of Python that made it ("llama_cpp.llama_decode(...)"
    gives llama_decode); None for a thread that runs no Python (a native worker)."""
    if ident is None:
        ident = threading.main_thread().ident or 0
    frame: FrameType | None = sys._current_frames().get(ident)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return None
    filename, line = frame.f_code.co_filename, frame.f_lineno
    calls = re.findall(r"\.(\w+)\s*\(", linecache.getline(filename, line))
    where = f"{_short(filename)}:{line}"
    return (calls[0] if calls else frame.f_code.co_name), where


def message(signum: int, call: tuple[str, str] | None, *, native_thread: bool = False) -> str:
    """The sentence a fatal signal leaves on stderr. `call` is the native call that died;
    with `native_thread` the faulting thread ran no Python (a llama.cpp or OpenMP worker,
    the traceback shows where Python's threads were), and `call`, if any, is the main
    thread's call that the worker was computing for."""
    name = _FATAL.get(signum, f"signal {signum}")
    where = f" in {call[0]} (called from {call[1]})" if call else ""
    if native_thread:
        where += (
            ", on one of its native threads"
            if call
            else " in a native thread (not one of Python's)"
        )
    facts = "".join(f" {key.capitalize()}: {text}." for key, text in _notes.items())
    if signum == getattr(signal, "SIGILL", None):
        advice = (
            " This build of llama.cpp uses instructions this CPU lacks: run `make install` "
            "again on this machine."
        )
    elif "weights" in _notes:  # a model was loaded: its weight layouts are the usual cause
        advice = (
            " Try --no-repack (llama.cpp's plain weight layouts), or --gpu-layers 0 with a GPU."
        )
    else:
        advice = ""
    return (
        f"\nmemagent: native code crashed with {name}{where}.{facts}{advice} To report it, "
        "include the output of `memagent --version --json` (docs/troubleshooting.md).\n"
    )


def _short(filename: str) -> str:
    """A path from the package or site-packages folder on, not the user's home."""
    parts = filename.replace(os.sep, "/").split("/")
    for anchor in ("memagent_cli", "llama_cpp"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) :])
    return parts[-1]
