"""memagent's weight placement on a CPU with AMX against extra buffers off, side by side.

    .venv/bin/python bench/amx.py [--runs 3] [--out bench/results/amx-guard.json]

The default model as shipped (Q4_1) and requantized to Q4_K_M and Q4_0; for each, the
default placement (AMX buffers off, llama.cpp's repacked layouts for the tensors its rule
takes) and --no-repack (no extra buffer at all), alternated run by run in one process.
Each run prefills one MemAgent update prompt and decodes 64 tokens, greedy, without drafts.
Prints medians and the ratio. On a CPU without AMX both ways differ only by repacking.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import llama_cpp  # noqa: E402
from village import FACT, story  # noqa: E402

from memagent_cli import protocol  # noqa: E402
from memagent_cli.backend import Sampling  # noqa: E402
from memagent_cli.backends import build  # noqa: E402
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions  # noqa: E402
from memagent_cli.models import resolve  # noqa: E402

FTYPES = {"Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}


def requantize(source: Path, dest: Path, kind: str) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = FTYPES[kind], True, 2
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(dest).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise SystemExit(f"quantizing to {kind} failed ({status})")
    return dest


def one_run(path: Path, repack: bool | None, message: str) -> dict[str, float]:
    backend = LlamaCppBackend(path, LlamaOptions(threads=2, gpu_layers=0, speculate=False,
                                                 repack=repack))  # fmt: skip
    backend.prepare(2048)
    reply = backend.generate(message, max_tokens=64, sampling=Sampling(temperature=0.0))
    decode_seconds = reply.seconds - reply.prompt_seconds
    return {
        "prompt_tok_s": reply.prompt_tokens / reply.prompt_seconds,
        "gen_tok_s": reply.completion_tokens / decode_seconds if decode_seconds > 0 else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "amx.json")
    args = parser.parse_args()
    info = llama_cpp.llama_print_system_info().decode().strip()
    message = protocol.render_update("What is the password?", protocol.INITIAL_MEMORY,
                                     FACT + " " + story(90, fact=None))  # fmt: skip
    shipped = resolve(None).path
    results: dict[str, object] = {"system_info": info, "amx": build.has_amx(info), "models": {}}
    with tempfile.TemporaryDirectory() as work:
        models = {"Q4_1": shipped}
        for kind in FTYPES:
            models[kind] = requantize(shipped, Path(work) / f"default.{kind}.gguf", kind)
        for kind, path in models.items():
            tensors = build.gguf_tensors(path)
            placement = build.place_weights(info, tensors, repack=None, offload=False)
            runs: dict[str, list[dict[str, float]]] = {"default": [], "--no-repack": []}
            for _ in range(args.runs):
                runs["default"].append(one_run(path, None, message))
                runs["--no-repack"].append(one_run(path, False, message))
            row = {"weights": placement.why}
            for name, measured in runs.items():
                for key in ("prompt_tok_s", "gen_tok_s"):
                    row[f"{name} {key}"] = statistics.median(r[key] for r in measured)
            for key in ("prompt_tok_s", "gen_tok_s"):
                row[f"ratio {key}"] = row[f"default {key}"] / row[f"--no-repack {key}"]
            results["models"][kind] = row  # type: ignore[index]
            print(f"{kind:7} {placement.why}", file=sys.stderr)
            for key in ("prompt_tok_s", "gen_tok_s"):
                print(f"  {key:13} default {row[f'default {key}']:7.1f}  --no-repack "
                      f"{row[f'--no-repack {key}']:7.1f}  ratio {row[f'ratio {key}']:.3f}",
                      file=sys.stderr)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
