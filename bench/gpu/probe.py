"""Load the tests' tiny model one way, decode a few tokens, and say so: the pieces of a
`memagent ask` that died on a CUDA build (docs/development.md, "A GPU"), taken apart.

    python3 probe.py MODE MODEL [--crash] [--gpu-layers N]

MODE: backend (memagent's LlamaCppBackend), llama (llama_cpp.Llama), raw (llama.cpp's C
API with its default model params), raw-noextra (the same with use_extra_bufts off, as
memagent sets it on a CPU with AMX). --crash installs memagent's crash report first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["backend", "llama", "raw", "raw-noextra"])
    parser.add_argument("model", type=Path)
    parser.add_argument("--crash", action="store_true")
    parser.add_argument("--gpu-layers", type=int, default=99)
    args = parser.parse_args()
    if args.crash:
        from memagent_cli import crash

        crash.install()
    import llama_cpp

    step = lambda text: print(f"probe {args.mode}: {text}", file=sys.stderr, flush=True)  # noqa: E731
    if args.mode == "backend":
        from memagent_cli.backend import Sampling
        from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

        backend = LlamaCppBackend(args.model, LlamaOptions(gpu_layers=args.gpu_layers))
        step(f"vocabulary read; placement {backend.placement()}")
        backend.prepare(512)
        step("weights loaded")
        reply = backend.decode("Say hi.", max_tokens=8, sampling=Sampling(temperature=0))
        step(f"decoded {reply!r:.120}")
    elif args.mode == "llama":
        llama = llama_cpp.Llama(str(args.model), n_gpu_layers=args.gpu_layers, verbose=False)
        step("loaded")
        step(f"decoded {llama('Say hi.', max_tokens=8, temperature=0)['choices'][0]['text']!r}")
    else:
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = args.gpu_layers
        if args.mode == "raw-noextra":
            params.use_extra_bufts = False
        model = llama_cpp.llama_model_load_from_file(str(args.model).encode(), params)
        step(f"loaded: {bool(model)}")
        llama_cpp.llama_model_free(model)
    step("done")


if __name__ == "__main__":
    main()
