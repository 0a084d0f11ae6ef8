"""A stand-in for a registry model not pulled yet, to time on this machine: a GGUF with the
model's layer shapes (hidden size, attention and KV heads, head size, FFN size) and the
tensor types of its quantization, a few layers deep, random weights, and the default model's
tokenizer and chat template. Its rates are the model's per layer: llama.cpp runs the same
kernels on the same matrix shapes, so the real model's rates are these scaled by its layers
and its output matrix (run/unpulled.py). Nothing here is downloaded; its replies are noise.

Made as bench/shaped.py made the 7B-shaped engine the docs' first 7B figures came from,
with K-quant blocks where the model's quantization has them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from memagent_cli.errors import ModelError

Q = gguf.GGMLQuantizationType
# A quantization's tensor types: most weights, and those llama.cpp gives more bits (its
# use_more_bits: attn_v and ffn_down in an eighth of the layers at each end and every third
# between, about half: the stand-in's first layer has them, its second not).
TYPES: dict[str, tuple[Q, Q]] = {
    "Q4_K_M": (Q.Q4_K, Q.Q6_K),
    "Q4_K_S": (Q.Q4_K, Q.Q4_K),
    "Q5_K_M": (Q.Q5_K, Q.Q6_K),
    "Q5_K_S": (Q.Q5_K, Q.Q5_K),
    "Q6_K": (Q.Q6_K, Q.Q6_K),
    "Q8_0": (Q.Q8_0, Q.Q8_0),
    "Q4_0": (Q.Q4_0, Q.Q4_0),
}
# Where each block type keeps its fp16 scales (byte offsets): set small, so that the
# activations of random weights stay finite through the stand-in's layers.
_SCALES = {Q.Q4_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
LAYERS = 2  # the stand-in's: one with the larger types, one without


@dataclass(frozen=True)
class Shape:
    """A decoder's shape, as a registry entry's `shape` gives it (its config.json)."""

    parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0  # 0: hidden / heads
    tied: bool = False  # the output matrix is the embedding's
    context: int = 32768

    @classmethod
    def of(cls, name: str, entry: Mapping[str, object]) -> Shape | None:
        """The shape a registry entry gives; None without one. A shape that is not one is a
        bug in the registry that ships with memagent."""
        raw = entry.get("shape")
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ValueError(f"registry entry {name}'s shape is not a table")
        try:
            shape = cls(**raw)
        except TypeError as exc:
            raise ValueError(f"registry entry {name}'s shape: {exc}") from None
        numbers = (shape.parameters, shape.layers, shape.hidden, shape.heads, shape.kv_heads)
        if min(*numbers, shape.ffn, shape.vocab) < 1 or shape.hidden % 256:
            raise ValueError(f"registry entry {name}'s shape is not a model's")
        return shape

    @property
    def head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def layer_weights(self) -> int:
        """Weights of one layer's matrices (attention and FFN), read once per token."""
        attention = (
            2 * self.hidden * self.heads * self.head + 2 * self.hidden * self.kv_heads * self.head
        )
        return attention + 3 * self.hidden * self.ffn

    def output_weights(self) -> int:
        """Weights of the output matrix, read once per token decoded."""
        return self.vocab * self.hidden


def quant_types(quant: str) -> tuple[Q, Q]:
    """The tensor types a stand-in of `quant` is written with; ModelError for one it does
    not know."""
    try:
        return TYPES[quant.upper()]
    except KeyError:
        known = ", ".join(TYPES)
        raise ModelError(
            f"No stand-in for {quant} weights to time; the estimate knows {known}."
        ) from None


def _random(kind: Q, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` x `columns` weights of `kind` as raw blocks: random bytes, small scales."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    if columns % block:
        raise ValueError(f"{columns} columns are not whole {kind.name} blocks")
    blocks = rng.integers(0, 256, size=(rows, columns // block, size), dtype=np.uint8)
    small = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    for offset in _SCALES[kind]:
        blocks[:, :, offset : offset + 2] = small
    return blocks.reshape(rows, columns // block * size)


def write(shape: Shape, quant: str, tokenizer: Path, path: Path, seed: int = 0) -> Shape:
    """A stand-in of `shape` quantized as `quant`, LAYERS deep, at `path`, with the
    tokenizer and chat template of the GGUF `tokenizer`; returns the stand-in's own shape
    (its layers and the tokenizer's vocabulary). Its output matrix is its embedding's."""
    most, more_bits = quant_types(quant)
    source = gguf.GGUFReader(tokenizer)
    writer = gguf.GGUFWriter(path, "llama")
    try:
        writer.add_name("memagent stand-in (random weights, timing only)")
        vocabulary = copy_tokenizer(source, writer)
        h, head, ffn = shape.hidden, shape.head, shape.ffn
        writer.add_context_length(shape.context)
        writer.add_embedding_length(h)
        writer.add_block_count(LAYERS)
        writer.add_feed_forward_length(ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_key_length(head)
        writer.add_value_length(head)
        writer.add_rope_dimension_count(head)
        writer.add_rope_freq_base(1_000_000.0)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_vocab_size(vocabulary)
        rng = np.random.default_rng(seed)
        writer.add_tensor("token_embd.weight", _random(most, vocabulary, h, rng), raw_dtype=most)
        q, kv = shape.heads * head, shape.kv_heads * head
        for layer in range(LAYERS):
            bigger = more_bits if layer == 0 else most
            for name, rows, columns, kind in (
                ("attn_q", q, h, most), ("attn_k", kv, h, most), ("attn_v", kv, h, bigger),
                ("attn_output", h, q, most), ("ffn_gate", ffn, h, most),
                ("ffn_up", ffn, h, most), ("ffn_down", h, ffn, bigger),
            ):  # fmt: skip
                tensor = _random(kind, rows, columns, rng)
                writer.add_tensor(f"blk.{layer}.{name}.weight", tensor, raw_dtype=kind)
            for norm in ("attn_norm", "ffn_norm"):
                writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(h, dtype=np.float32))
        writer.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=False)
    finally:
        writer.close()
    return Shape(
        parameters=LAYERS * shape.layer_weights() + vocabulary * h,
        layers=LAYERS,
        hidden=h,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        ffn=ffn,
        vocab=vocabulary,
        head_dim=head,
        tied=True,
        context=shape.context,
    )


def copy_tokenizer(source: gguf.GGUFReader, writer: gguf.GGUFWriter) -> int:
    """Every tokenizer.* key of `source` (its chat template too); returns the vocabulary's
    size."""
    vocabulary = 0
    for name, field in source.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            values = field.contents()
            if name == "tokenizer.ggml.tokens":
                vocabulary = len(values)
            writer.add_key_value(name, values, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), kind)
    if not vocabulary:
        raise ModelError(
            f"{source.data.filename if hasattr(source, 'data') else 'the model'} has no vocabulary"
        )
    return vocabulary
