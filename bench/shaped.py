"""Models where a batch costs less than on the default model, to time llama.cpp with.

    .venv/bin/python bench/shaped.py f32 build/bench/smollm2-f32.gguf
    .venv/bin/python bench/shaped.py 7b build/bench/shaped-7b.gguf

Speculation and reading together pay where decoding k tokens in one batch costs little
more than one token: where weights must stream from memory for every round. Two such
models can be made here without downloading anything:
- `f32`: the default model with its weights dequantized to F32 (llama.cpp's own
  quantizer). The same weights and a real model's replies, 4x the bytes per token.
- `7b`: Qwen2.5-7B's layer shapes (hidden 3584, 28 layers, 28 query and 4 KV heads, FFN
  18944) on a llama graph, random Q4_0 weights, the default model's tokenizer copied in.
  No 7B MemAgent weights can be fetched here, and a 7B reading would take hours on 2
  cores. Its replies are noise; its engine rates and batch costs are a 7B's
  (`bench/reading.py --model FILE --engine-only`), and `--predict-with` prices a real
  model's rounds and acceptance with them.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memagent_cli import models  # noqa: E402
from memagent_cli.models.shaped import copy_tokenizer  # noqa: E402

SHAPE = {"hidden": 3584, "layers": 28, "heads": 28, "kv_heads": 4, "ffn": 18944}
Q4_0 = gguf.GGMLQuantizationType.Q4_0


def random_q4_0(rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """Q4_0 blocks of 32 weights (an fp16 scale, 16 bytes of nibbles) with small scales,
    so that activations stay finite through 28 layers."""
    blocks = rng.integers(0, 256, size=(rows, columns // 32, 18), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(0.004).tobytes(), dtype=np.uint8)
    return blocks.reshape(rows, columns // 32 * 18)


def write(path: Path, seed: int = 0) -> None:
    """The 7B-shaped model with random weights."""
    source = gguf.GGUFReader(models.resolve(None).path)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("random 7B-shaped (timing only)")
    vocabulary = copy_tokenizer(source, writer)
    h, ffn, heads, kv_heads = SHAPE["hidden"], SHAPE["ffn"], SHAPE["heads"], SHAPE["kv_heads"]
    writer.add_context_length(32768)
    writer.add_embedding_length(h)
    writer.add_block_count(SHAPE["layers"])
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(h // heads)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocabulary)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    rng = np.random.default_rng(seed)
    kv = h // heads * kv_heads
    writer.add_tensor("token_embd.weight", random_q4_0(vocabulary, h, rng), raw_dtype=Q4_0)
    for layer in range(SHAPE["layers"]):
        for name, rows, columns in (
            ("attn_q", h, h), ("attn_k", kv, h), ("attn_v", kv, h), ("attn_output", h, h),
            ("ffn_gate", ffn, h), ("ffn_up", ffn, h), ("ffn_down", h, ffn),
        ):  # fmt: skip
            tensor = random_q4_0(rows, columns, rng)
            writer.add_tensor(f"blk.{layer}.{name}.weight", tensor, raw_dtype=Q4_0)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(h, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    writer.add_tensor("output.weight", random_q4_0(vocabulary, h, rng), raw_dtype=Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def dequantize(path: Path) -> None:
    """The default model with every weight as F32, by llama.cpp's quantizer."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType.ALL_F32)
    params.allow_requantize = True
    params.nthread = 2
    source = str(models.resolve(None).path).encode()
    if llama_cpp.llama_model_quantize(source, str(path).encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama.cpp could not write {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["f32", "7b"])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.kind == "f32":
        dequantize(args.out)
    else:
        write(args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**30:.1f} GiB)", file=sys.stderr)


if __name__ == "__main__":
    main()
