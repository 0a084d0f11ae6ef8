"""Does a token's result depend on the batch it is decoded in? The question `--exact` rests on.

    flock /tmp/llama.lock .venv/bin/python bench/widths.py [--gpu-layers 99] [--flash-attn on]

Exact decoding (backends/decoding.py) promises the same tokens with and without drafts. A
reply decoded without drafts computes position p + i as row 0 of its own round (the pending
token and one throwaway row); with a draft of k tokens, position p + i is row i of one
round of 1 + k rows, and the cache holds what earlier rows of that round wrote. So, from a
prompt prefilled to each depth p:

- the reference: the next 16 positions decoded as exact decoding does without drafts,
  one round each (2 rows, logits for the first), keeping each round's logits;
- for each round size W = 2..16: positions p..p+W-1 in one round of W rows, logits for
  every row, as a draft is verified; each row's logits compared with the reference's
  for its position, bit for bit;
- the same with rounds of 1 row (the single-row kernels of the default decoding), which
  exact decoding avoids.

Prints, per depth, which round sizes give every row's logits bit for bit: on this CPU all
of them with the default model. memagent itself makes the same check, in fewer positions,
once per model and machine (the calibration, memagent_cli/backends/calibration.py), and
`--exact` uses only the sizes it proved; this script shows the differences' sizes. A build
with CUDA shows which sizes differ there, and by how much (docs/performance.md, On a GPU).
Depths next to a multiple of 256 let a round cross the KV cache's padding.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples"))

import llama_cpp  # noqa: E402
from engine import note  # noqa: E402
from village import story  # noqa: E402

from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions  # noqa: E402
from memagent_cli.backends.llama_parts import Batch  # noqa: E402
from memagent_cli.models import resolve  # noqa: E402

MOST = 16  # the largest round: a draft of 15


def logits(context: Any, row: int, n_vocab: int) -> bytes:
    return ctypes.string_at(llama_cpp.llama_get_logits_ith(context, row), 4 * n_vocab)


def largest_difference(a: bytes, b: bytes) -> float:
    x = memoryview(a).cast("f")
    y = memoryview(b).cast("f")
    return max(abs(p - q) for p, q in zip(x, y, strict=True))


def rounds_one_by_one(
    batch: Batch, context: Any, memory: Any, tokens: list[int], depth: int, rows: int, n: int
) -> list[bytes]:
    """Positions depth..depth+MOST-1 decoded one round each, as a reply without drafts:
    the token (with logits) and rows - 1 throwaway rows; each round's logits."""
    got = []
    for i in range(MOST):
        pos = depth + i
        batch.clear()
        batch.add(tokens[pos], pos, 0, True)
        for extra in range(1, rows):
            batch.add(tokens[pos], pos + extra, 0, False)
        batch.decode(context)
        got.append(logits(context, 0, n))
        llama_cpp.llama_memory_seq_rm(memory, 0, pos + 1, -1)
    llama_cpp.llama_memory_seq_rm(memory, 0, depth, -1)
    return got


def one_round(
    batch: Batch, context: Any, memory: Any, tokens: list[int], depth: int, width: int, n: int
) -> list[bytes]:
    """Positions depth..depth+width-1 in one round, logits for every row, as a draft."""
    batch.clear()
    for i in range(width):
        batch.add(tokens[depth + i], depth + i, 0, True)
    batch.decode(context)
    got = [logits(context, i, n) for i in range(width)]
    llama_cpp.llama_memory_seq_rm(memory, 0, depth, -1)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="500,250,1020", help="prompt lengths, in tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--flash-attn", choices=["on", "off"], default="off")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench" / "widths.json")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    options = LlamaOptions(
        threads=args.threads, gpu_layers=args.gpu_layers, flash_attn=args.flash_attn
    )
    backend = LlamaCppBackend(resolve(None).path, options)
    tokens = backend.tokenize(story(max(depths) // 6, fact=None, seed=3))
    assert len(tokens) > max(depths) + MOST, "the story is too short for the depths asked"
    backend.prepare(max(depths) + 2 * MOST)
    decoder = backend.decoder
    assert decoder is not None
    context, memory = decoder.context, decoder.memory
    n = llama_cpp.llama_vocab_n_tokens(decoder.vocab)
    batch = Batch(decoder.n_batch)
    result: dict[str, Any] = {"gpu_layers": args.gpu_layers, "flash_attn": args.flash_attn}
    note(f"offloaded layers: {args.gpu_layers}; flash attention {args.flash_attn}")
    try:
        for depth in depths:
            llama_cpp.llama_memory_seq_rm(memory, 0, 0, -1)
            for start in range(0, depth, decoder.n_batch):  # the prompt, in n_batch pieces
                batch.clear()
                end = min(start + decoder.n_batch, depth)
                for pos in range(start, end):
                    batch.add(tokens[pos], pos, 0, pos == end - 1)
                batch.decode(context)
            exact = rounds_one_by_one(batch, context, memory, tokens, depth, 2, n)
            single = rounds_one_by_one(batch, context, memory, tokens, depth, 1, n)
            rows: dict[str, Any] = {
                "1-row rounds": {
                    "equal_rows": sum(a == b for a, b in zip(single, exact, strict=True)),
                    "largest_difference": max(
                        largest_difference(a, b) for a, b in zip(single, exact, strict=True)
                    ),
                }
            }
            for width in range(2, MOST + 1):
                got = one_round(batch, context, memory, tokens, depth, width, n)
                rows[str(width)] = {
                    "equal_rows": sum(a == b for a, b in zip(got, exact, strict=False)),
                    "largest_difference": max(
                        largest_difference(a, b) for a, b in zip(got, exact, strict=False)
                    ),
                }
            result[str(depth)] = rows
            same = [w for w, r in rows.items() if w.isdigit() and r["equal_rows"] == int(w)]
            differ = {w: r for w, r in rows.items() if w not in same}
            note(
                f"depth {depth}: rounds of {', '.join(same) or 'no size'} rows equal decoding "
                "without drafts bit for bit"
            )
            for width, row in differ.items():
                size = f"rounds of {width}" if width.isdigit() else width
                note(
                    f"  {size}: {row['equal_rows']} rows equal, largest difference "
                    f"{row['largest_difference']:.3g}"
                )
    finally:
        batch.close()
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    note(f"wrote {args.out}")


if __name__ == "__main__":
    main()
