"""A Hugging Face byte-level BPE tokenizer (tokenizer.json) as GGUF metadata, the way
llama.cpp's converter writes it (`_set_vocab_gpt2`), read without transformers: the token
list with its types, the merges, the special token ids, add_bos and the chat template.

llama.cpp splits text before BPE with one of its built-in pre-tokenizers, named in the
GGUF. Its converter names it by the sha256 of the token ids of a fixed check text
(`get_vocab_base_pre`) and refuses a tokenizer whose hash it does not know: a wrong name
makes a model that loads and then tokenizes some texts differently from its training. The
same check is done here, with the `tokenizers` library reading tokenizer.json."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gguf

from memagent_cli.errors import ModelError

# llama.cpp's check text and the hashes of its known pre-tokenizers that memagent's
# architectures use, from convert_hf_to_gguf.py's get_vocab_base_pre.
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n"
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 "
    "3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български " + "'" * 6 + "`" * 7 + '"' * 4 + "......!!!!!!?????? "
    "I've been "
    "'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
PRE_TOKENIZERS = {
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5-2.5, 3
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3-Embedding
}


def check(folder: Path, vocab_size: int | None) -> str:
    """Check the tokenizer in `folder` before anything is written: every token id fits the
    model's `vocab_size` (the embedding's rows), and llama.cpp knows its pre-tokenizer.
    Returns the pre-tokenizer's name; ModelError with a sentence otherwise."""
    path = folder / "tokenizer.json"
    data = _load(path)
    model = data.get("model")
    if (
        not isinstance(model, dict)
        or model.get("type") != "BPE"
        or not isinstance(model.get("vocab"), dict)
    ):
        raise ModelError(
            f"{path} is not a BPE tokenizer; memagent converts byte-level BPE tokenizers only."
        )
    ids = [int(i) for i in model["vocab"].values()]
    ids += [int(entry["id"]) for entry in data.get("added_tokens") or []]
    if vocab_size and ids and max(ids) >= vocab_size:
        raise ModelError(
            f"{path} has token id {max(ids)}, but config.json's vocab_size is {vocab_size}: "
            "the model has no embedding row for it, so llama.cpp could not load the result."
        )
    return pre_tokenizer(path)


def pre_tokenizer(path: Path) -> str:
    """llama.cpp's name for the pre-tokenizer of tokenizer.json at `path`, found as its
    converter finds it; ModelError for one llama.cpp does not know."""
    from tokenizers import Tokenizer

    try:
        # From its bytes: the library takes a file name as UTF-8 only (not a Latin-1 name).
        tokenizer = Tokenizer.from_buffer(path.read_bytes())
    except Exception as exc:  # the library raises its own Exception for any bad file
        raise ModelError(f"{path} cannot be read as a tokenizer: {exc}.") from None
    ids = tokenizer.encode(CHECK_TEXT).ids
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    if digest not in PRE_TOKENIZERS:
        raise ModelError(
            f"llama.cpp does not know the pre-tokenizer of {path} (check hash {digest[:16]}...): "
            "a GGUF naming another one would split some texts differently from the model's "
            "training, so memagent converts Qwen2's tokenizer (Qwen2, Qwen2.5, Qwen3) only."
        )
    return PRE_TOKENIZERS[digest]


def write(
    writer: gguf.GGUFWriter,
    folder: Path,
    pre: str,
    vocab_size: int | None,
) -> int:
    """Add the tokenizer of the model in `folder` (checked by `check`, whose pre-tokenizer
    name is `pre`) to `writer`; returns the vocabulary size."""
    data = _load(folder / "tokenizer.json")
    tokens, types = token_list(data["model"]["vocab"], data.get("added_tokens") or [], vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
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
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        raise ModelError(f"{path} is not a readable tokenizer file (not JSON).") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path} is not a tokenizer file.")
    return data
