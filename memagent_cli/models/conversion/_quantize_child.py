"""The process that runs llama.cpp's quantizer for quantize.py: `llama_model_quantize` is one
ctypes call that Ctrl-C cannot interrupt, so it runs here, where the parent can stop it at
once, and llama.cpp's log comes out on stdout for the parent to read progress and reasons
from. Started as a script (`python -P this_file SOURCE DEST FTYPE THREADS`): it imports
nothing of memagent, so any install of memagent runs the child next to its own code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading


def _exit_with_parent() -> None:
    # The parent holds our stdin open and never writes to it: end of file means it is gone
    # (killed, or crashed), and a quantization nobody waits for is only disk filling up.
    while os.read(0, 1 << 16):
        pass
    os._exit(1)


def main(argv: list[str]) -> int:
    source, dest, ftype, threads = argv
    # Ctrl-C in a terminal reaches the whole process group: the parent decides, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    import llama_cpp

    @llama_cpp.llama_log_callback
    def log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        os.write(1, text)  # fragments of lines, as llama.cpp logs them

    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(ftype)
    params.nthread = int(threads)
    return int(
        llama_cpp.llama_model_quantize(os.fsencode(source), os.fsencode(dest), ctypes.byref(params))
    )


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # Not sys.exit: finalizing the interpreter under a thread blocked in read() can abort.
    os._exit(status)
