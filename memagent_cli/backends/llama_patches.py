"""What memagent changes in llama.cpp and llama-cpp-python where they offer no supported
route, each in one place, undone when done where it can be:

- `cxx_runtime_first`: libstdc++ in the global symbol scope before llama_cpp loads, so that
  a CUDA build's libraries cannot bind to their own copies of it (docs/troubleshooting.md).
  It runs when `memagent_cli.backends` is imported, before anything there imports
  llama_cpp; a library once loaded stays loaded, so it is never undone.
- `Overrides` and `apply`: ggml's tensor buffer overrides, a C struct llama-cpp-python
  does not wrap, set on one load's model params and dropped after the load.
- `placed_weights`: llama-cpp-python's own `Llama` (its server, tests that load it) gets
  memagent's weight placement (backends/build.py: AMX buffers crash). Llama takes no
  model params, so its module's llama_model_default_params is replaced while the context
  lasts and put back after it.
- `whole_pieces`: llama-cpp-python's own detokenize (its server's /extras/detokenize and
  replies) gives every token's text: its own puts each token in a 32-byte buffer and drops
  a longer one (runs of 33 or more spaces, `=`, `-`). Put back after the context.
- `LlamaLog`: llama.cpp's log (one callback for the whole process, in llama.cpp itself) to
  stderr, printable, with --verbose and nowhere otherwise; `restore` puts back the
  callback it replaced.

Each was checked against llama-cpp-python CHECKED_WITH and the llama.cpp it vendors
(pyproject.toml pins it); tests/test_llama_patches.py fails on another version, so that
each is checked again.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from memagent_cli.backends.build import Placement, extra_buffers
from memagent_cli.text import printable

CHECKED_WITH = "0.3.36"  # llama-cpp-python


def cxx_runtime_first() -> None:
    """Put the process's libstdc++ in the global symbol scope, where it is looked up before
    any library llama_cpp loads; nothing where there is none (macOS, Windows, musl).

    A CUDA build's libggml-cuda carries its own copies of some libstdc++ functions. When an
    earlier import (numpy) has loaded libstdc++ privately, llama.cpp's own libraries bind
    those calls to libggml-cuda's copies, and loading a model died inside its first
    `std::ostream` call (llama_model::print_info) with SIGSEGV."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)


class _Override(ctypes.Structure):
    """llama.cpp's struct llama_model_tensor_buft_override (llama-cpp-python omits it)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


class Overrides:
    """llama.cpp's tensor_buft_overrides for a placement: a NULL-terminated C array that
    must live as long as the model params that point at it."""

    def __init__(self, patterns: Sequence[str], repack_buffer: int) -> None:
        entry = _Override
        self._patterns = [p.encode() for p in patterns]
        self.array = (entry * (len(patterns) + 1))()
        for i, pattern in enumerate(self._patterns):
            self.array[i].pattern = pattern
            self.array[i].buft = repack_buffer

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def apply(params: Any, placement: Placement) -> Overrides | None:
    """Set `placement` on llama_model_params; the returned object must outlive the load
    (llama.cpp reads the patterns while loading only)."""
    params.use_extra_bufts = placement.extra_buffers
    if not placement.repack:
        return None
    buffer = extra_buffers().get("CPU_REPACK")
    if buffer is None:  # the rule said REPACK = 1, so this is a build we do not know
        return None
    overrides = Overrides(placement.repack, buffer)
    params.tensor_buft_overrides = overrides.address
    return overrides


@contextlib.contextmanager
def placed_weights(placement: Placement) -> Iterator[Placement]:
    """While the context lasts, every model llama-cpp-python's own `Llama` loads gets
    `placement`, as memagent's loader gives it (backends/build.py `placement_for`)."""
    import llama_cpp.llama_cpp as library

    default = library.llama_model_default_params
    loads: list[Overrides | None] = []  # each load's overrides, alive until the context ends

    def placed() -> Any:
        params = default()
        loads.append(apply(params, placement))
        return params

    library.llama_model_default_params = placed
    try:
        yield placement
    finally:
        library.llama_model_default_params = default


@contextlib.contextmanager
def whole_pieces() -> Iterator[None]:
    """While the context lasts, llama-cpp-python's LlamaModel.detokenize (what `Llama`, its
    tokenizer and its server detokenize with) returns every token's bytes, at any length
    (llama_parts.piece); it keeps its one rule besides, a leading space cut after a BOS."""
    from llama_cpp import _internals

    from memagent_cli.backends.llama_parts import piece

    model = _internals.LlamaModel
    own = model.detokenize

    def detokenize(self: Any, tokens: list[int], special: bool = False) -> bytes:
        text = b"".join(piece(self.vocab, token, special) for token in tokens)
        after_bos = len(tokens) > 0 and tokens[0] == self.token_bos()
        return text[1:] if after_bos and text[:1] == b" " else text

    model.detokenize = detokenize
    try:
        yield
    finally:
        model.detokenize = own


def _log_to_stderr(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # A model file's metadata is in the log: printable, as all memagent shows.
    sys.stderr.write(printable(text.decode("utf-8", errors="replace")))


def _log_nowhere(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


_CALLBACKS: dict[bool, Any] = {}  # made once and kept: llama.cpp holds only their address


def _callback(verbose: bool) -> Any:
    import llama_cpp

    if verbose not in _CALLBACKS:
        _CALLBACKS[verbose] = llama_cpp.llama_log_callback(
            _log_to_stderr if verbose else _log_nowhere
        )
    return _CALLBACKS[verbose]


class LlamaLog:
    """llama.cpp's log sent to stderr (`verbose`) or nowhere, from now until `restore`,
    which puts back the callback this replaced. llama.cpp keeps one callback for the whole
    process: a LlamaLog made later wins until it is restored."""

    def __init__(self, verbose: bool) -> None:
        import llama_cpp

        self._before = llama_cpp.llama_log_callback()
        self._before_data = ctypes.c_void_p()
        llama_cpp.llama_log_get(ctypes.byref(self._before), ctypes.byref(self._before_data))
        llama_cpp.llama_log_set(_callback(verbose), ctypes.c_void_p(0))

    def restore(self) -> None:
        """Put back the callback this replaced (the ones memagent and llama-cpp-python set
        live as long as the process, so the one put back is never freed)."""
        import llama_cpp

        llama_cpp.llama_log_set(self._before, self._before_data)
