"""A tiny random-weight model in the Hugging Face Qwen2 (or Qwen3) format, built with numpy
and the `tokenizers` library, and a numpy forward pass of the same weights to check
llama.cpp against: RMSNorm, rotary embeddings as Qwen2 applies them (halves rotated,
"NEOX"), grouped-query attention with q/k/v biases (Qwen3: none, but q/k RMSNorm per head
and a head size of its own), SwiGLU."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "The captain kept the logbook in the chart room, and the first mate read it every night.",
    "Crème brûlée, déjà vu, naïve façade: accents are part of the text too.",
    "北京是中国的首都。我们在图书馆读书。",
    "Emoji travel well: 🚀🦙✅ and numbers 3.14159, 2026, 1e-6.",
    "def answer(question):\n    return memory[-1]  # the last memory holds the answer\n",
] * 20
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


def write_tokenizer(folder: Path, vocab_size: int = 400) -> int:
    """A byte-level BPE tokenizer.json with Qwen2's split pattern and the ChatML specials;
    returns the number of ids it uses."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


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
) -> dict[str, np.ndarray]:
    """Write a tiny Qwen2 model folder; returns its weights as a reader decodes them."""
    folder.mkdir(parents=True, exist_ok=True)
    used = write_tokenizer(folder)
    vocab_size = -(-used // 64) * 64  # padded as Qwen2.5's, so ids without a token exist
    config = {
        "architectures": ["Qwen3ForCausalLM" if qwen3 else "Qwen2ForCausalLM"],
        "model_type": "qwen3" if qwen3 else "qwen2",
        **({"head_dim": QWEN3_HEAD_DIM} if qwen3 else {}),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
        "bos_token_id": used - 3,
        "eos_token_id": used - 1,
        **(shape := CONFIG | (sizes or {})),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "add_bos_token": False,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML,
                "model_max_length": 32768,
            }
        )
    )
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [used - 1, used - 3]})
    )
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
    # Two shards and an index, as the released models come.
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
    for file, part in shards.items():
        write_safetensors(folder / file, {n: tensors[n] for n in part}, dtype)
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return {name: decoded(array, dtype) for name, array in tensors.items()}


def forward(weights: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """Logits for every position of `tokens`, as Qwen2 computes them (float64)."""
    c = CONFIG
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
