"""A tiny random-weight model in the Hugging Face Qwen2 (or Qwen3) format, built with numpy,
with the real Qwen2.5 tokenizer (tests/support/qwen_material.py: 151,643 tokens, 22 added ones, the
real chat template), and a numpy forward pass of the same weights to check llama.cpp
against: RMSNorm, rotary embeddings as Qwen2 applies them (halves rotated, "NEOX"),
grouped-query attention with q/k/v biases (Qwen3: none, but q/k RMSNorm per head and a head
size of its own), SwiGLU."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from support import qwen_material

# As Qwen2.5's config.json: the tokenizer's 151,665 ids, padded (ids without a token exist).
VOCAB_SIZE = 151936
BOS, EOS = 151643, 151645  # <|endoftext|>, <|im_end|>
QWEN3_HEAD_DIM = 32  # not hidden_size / heads (16): the GGUF must carry it
CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}


def write_tokenizer(folder: Path) -> None:
    """Qwen2.5's tokenizer.json and tokenizer_config.json (eos <|im_end|>, pad
    <|endoftext|>, no bos, the real chat template)."""
    qwen_material.copy_tokenizer(folder)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "BF16") -> None:
    """A safetensors file written by hand: 8-byte header length, JSON header, raw data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in tensors.items():
        data = _encode(array, dtype)
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        for blob in blobs:
            file.write(blob)


def _encode(array: np.ndarray, dtype: str) -> bytes:
    if dtype == "F32":
        return array.astype("<f4").tobytes()
    if dtype == "F16":
        return array.astype("<f2").tobytes()
    bits = array.astype("<f4").view("<u4")
    return (bits >> 16).astype("<u2").tobytes()  # the test's values are exact in bf16


def decoded(array: np.ndarray, dtype: str) -> np.ndarray:
    """The values a reader of the file gets back."""
    if dtype == "BF16":
        return ((array.astype("<f4").view("<u4") >> 16) << 16).view("<f4").astype(np.float32)
    return array.astype("<f2" if dtype == "F16" else "<f4").astype(np.float32)


def build(
    folder: Path,
    *,
    tied: bool = True,
    dtype: str = "BF16",
    seed: int = 0,
    qwen3: bool = False,
    sizes: dict[str, int] | None = None,
    values: dict[tuple[str, int, int], float] | None = None,
    scale_rows: dict[tuple[str, int], float] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny Qwen2 model folder; returns its weights as a reader decodes them.
    `values` sets single weights: {(name, row, column): value}; `scale_rows` multiplies
    rows: {(name, row): factor}."""
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder)
    vocab_size = VOCAB_SIZE
    config = {
        "architectures": ["Qwen3ForCausalLM" if qwen3 else "Qwen2ForCausalLM"],
        "model_type": "qwen3" if qwen3 else "qwen2",
        **({"head_dim": QWEN3_HEAD_DIM} if qwen3 else {}),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        **(shape := CONFIG | (sizes or {})),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, BOS]}))
    rng = np.random.default_rng(seed)
    d, ff = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = QWEN3_HEAD_DIM if qwen3 else d // heads

    def w(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tensors = {
        "model.embed_tokens.weight": w(vocab_size, d, scale=0.5),
        "model.norm.weight": 1 + w(d),
    }
    if not tied:
        tensors["lm_head.weight"] = w(vocab_size, d, scale=0.2)
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if qwen3:
            tensors[p + "self_attn.q_norm.weight"] = 1 + w(hd)
            tensors[p + "self_attn.k_norm.weight"] = 1 + w(hd)
        tensors |= {
            p + "input_layernorm.weight": 1 + w(d),
            p + "post_attention_layernorm.weight": 1 + w(d),
            p + "self_attn.q_proj.weight": w(heads * hd, d),
            p + "self_attn.q_proj.bias": w(heads * hd),
            p + "self_attn.k_proj.weight": w(kv * hd, d),
            p + "self_attn.k_proj.bias": w(kv * hd),
            p + "self_attn.v_proj.weight": w(kv * hd, d),
            p + "self_attn.v_proj.bias": w(kv * hd),
            p + "self_attn.o_proj.weight": w(d, heads * hd),
            p + "mlp.gate_proj.weight": w(ff, d),
            p + "mlp.up_proj.weight": w(ff, d),
            p + "mlp.down_proj.weight": w(d, ff),
        }
    if qwen3:
        tensors = {k: v for k, v in tensors.items() if not k.endswith("_proj.bias")}
    for (name, row, column), value in (values or {}).items():
        tensors[name][row, column] = value
    for (name, row), factor in (scale_rows or {}).items():
        tensors[name][row] *= factor
    # Two shards and an index, as the released models come.
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
    for file, part in shards.items():
        write_safetensors(folder / file, {n: tensors[n] for n in part}, dtype)
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return {name: decoded(array, dtype) for name, array in tensors.items()}


def forward(
    weights: dict[str, np.ndarray], tokens: list[int], sizes: dict[str, int] | None = None
) -> np.ndarray:
    """Logits for every position of `tokens`, as Qwen2 computes them (float64), for the
    model `build` made with `sizes`."""
    c = CONFIG | (sizes or {})
    d, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    W = {k: v.astype(np.float64) for k, v in weights.items()}
    qwen3 = "model.layers.0.self_attn.q_norm.weight" in W
    hd, eps = QWEN3_HEAD_DIM if qwen3 else d // heads, c["rms_norm_eps"]
    x = W["model.embed_tokens.weight"][tokens]
    n = len(tokens)
    inv = c["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    angles = np.outer(np.arange(n), inv)
    cos, sin = np.cos(np.concatenate([angles] * 2, 1)), np.sin(np.concatenate([angles] * 2, 1))

    def norm(v: np.ndarray, g: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * g

    def rope(v: np.ndarray) -> np.ndarray:  # v: (n, heads, hd)
        half = np.concatenate([-v[..., hd // 2 :], v[..., : hd // 2]], -1)
        return v * cos[:, None] + half * sin[:, None]

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = norm(x, W[p + "input_layernorm.weight"])
        q, k, v = (
            (
                h @ W[p + f"self_attn.{x}_proj.weight"].T + W.get(p + f"self_attn.{x}_proj.bias", 0)
            ).reshape(n, count, hd)
            for x, count in (("q", heads), ("k", kv), ("v", kv))
        )
        if qwen3:  # RMSNorm of each head's query and key, before the rotation
            q = norm(q, W[p + "self_attn.q_norm.weight"])
            k = norm(k, W[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", scores, v).reshape(n, heads * hd)
        x = x + attn @ W[p + "self_attn.o_proj.weight"].T
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        gate = h @ W[p + "mlp.gate_proj.weight"].T
        x = (
            x
            + ((gate / (1 + np.exp(-gate))) * (h @ W[p + "mlp.up_proj.weight"].T))
            @ W[p + "mlp.down_proj.weight"].T
        )
    x = norm(x, W["model.norm.weight"])
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T
