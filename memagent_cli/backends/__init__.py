"""Backends: how tokens are produced, in this process (llama.cpp) or by a server.

Importing this package makes the C++ runtime global before any llama.cpp library loads. A
CUDA build's libggml-cuda carries its own copies of some libstdc++ functions. When an earlier
import (numpy) has loaded libstdc++ privately, llama.cpp's own libraries bind those calls to
libggml-cuda's copies, and loading a model died inside its first `std::ostream` call
(llama_model::print_info) with SIGSEGV: docs/troubleshooting.md. Everything in this package
imports llama_cpp after this has run.
"""

import contextlib
import ctypes
import sys


def _cxx_runtime_first() -> None:
    """Put the process's libstdc++ in the global symbol scope, where it is looked up before
    any library llama_cpp loads; nothing where there is none (macOS, Windows, musl)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)


_cxx_runtime_first()
