"""A Hugging Face byte-level BPE tokenizer (tokenizer.json) as GGUF metadata, the way
llama.cpp's converter writes it (`_set_vocab_gpt2`), read without transformers: the token
list with its types, the merges, the special token ids, add_bos and the chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf

from memagent_cli.errors import ModelError
from memagent_cli.progress import Note

# The split pattern of Qwen2's tokenizer (Qwen2.5 and Qwen3 use it too): llama.cpp's
# pre-tokenizer "qwen2" implements exactly this one.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {gguf.MODEL_ARCH.QWEN2: "qwen2", gguf.MODEL_ARCH.QWEN3: "qwen2"}


def write(
    writer: gguf.GGUFWriter,
    folder: Path,
    arch: gguf.MODEL_ARCH,
    vocab_size: int | None,
    note: Note,
) -> int:
    """Add the tokenizer of the model in `folder` to `writer`; returns the vocabulary size."""
    data = _load(folder / "tokenizer.json")
    model = data.get("model")
    if (
        not isinstance(model, dict)
        or model.get("type") != "BPE"
        or not isinstance(model.get("vocab"), dict)
    ):
        raise ModelError(
            f"{folder / 'tokenizer.json'} is not a BPE tokenizer; memagent converts byte-level "
            "BPE tokenizers only."
        )
    if QWEN2_PATTERN not in json.dumps(data.get("pre_tokenizer"), ensure_ascii=False).replace(
        "\\\\", "\\"
    ):
        note(
            "warning: the tokenizer's split pattern is not Qwen2's; llama.cpp will split text "
            "as Qwen2 does, so some texts may tokenize differently"
        )
    tokens, types = token_list(model["vocab"], data.get("added_tokens") or [], vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZERS[arch])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # gguf's reader of tokenizer.json, tokenizer_config.json and config.json: merges,
    # bos/eos/pad ids, add_bos/add_eos and the chat template.
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens))
    if not special.merges:
        raise ModelError(f"{folder / 'tokenizer.json'} has no merges; it is not a BPE tokenizer.")
    special.add_to_gguf(writer, quiet=True)
    return len(tokens)


def token_list(
    vocab: dict[str, int], added: list[dict[str, Any]], vocab_size: int | None
) -> tuple[list[str], list[int]]:
    """Tokens by id and their GGUF types; ids the tokenizer does not use become [PADn]."""
    by_id = {int(i): token for token, i in vocab.items()}
    special: dict[int, bool] = {}
    for entry in added:
        by_id[int(entry["id"])] = str(entry["content"])
        special[int(entry["id"])] = bool(entry.get("special"))
    size = max(vocab_size or 0, max(by_id) + 1)
    tokens, types = [], []
    for i in range(size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            tokens.append(token)
            looks_special = token.startswith("<|") and token.endswith("|>")
            control = special[i] or looks_special
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def no_tokenizer(where: str) -> ModelError:
    return ModelError(
        f"{where} has no tokenizer.json; memagent needs the model's Hugging Face tokenizer file."
    )


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise no_tokenizer(str(path.parent)) from None
    except (OSError, UnicodeDecodeError, ValueError):
        raise ModelError(f"{path} is not a readable tokenizer file (not JSON).") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a tokenizer file.")
    return data
