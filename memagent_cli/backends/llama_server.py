"""llama-cpp-python's OpenAI-compatible server with memagent's weight placement, so that
it does not crash on a CPU with AMX (backends/build.py, backends/llama_patches.py), and
with every token's text in its detokenize (llama_patches.whole_pieces). It takes the
server's own options, and llama.cpp's --repack/--no-repack:

    python -m memagent_cli.backends.llama_server --model model.gguf --n_ctx 8192 --port 8080
"""

from __future__ import annotations

import sys
from pathlib import Path


def _value(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in llama_cpp.server's arguments."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def main(argv: list[str]) -> None:
    from llama_cpp.server.__main__ import main as serve

    from memagent_cli.backends import build
    from memagent_cli.backends.llama_patches import placed_weights, whole_pieces

    repack = True if "--repack" in argv else False if "--no-repack" in argv else None
    argv = [arg for arg in argv if arg not in ("--repack", "--no-repack")]
    model = _value(argv, "--model")
    if model is not None and not Path(model).is_file():
        sys.exit(f"error: model not found: {model} is not a file.")
    layers = int(_value(argv, "--n_gpu_layers") or 0)
    offload = layers != 0 and build.offloads()
    placement = build.placement_for(Path(model) if model else None, repack=repack, offload=offload)
    sys.argv = [sys.argv[0], *argv]
    with placed_weights(placement), whole_pieces():
        serve()


if __name__ == "__main__":
    main(sys.argv[1:])
