"""Model-free token counts with tiktoken, working offline.

tiktoken downloads its encoding files on first use, and this machine may have no internet.
memagent ships cl100k_base (backends/data/, with its licence) and builds the encoding from
that file itself, after checking its sha256: nothing is downloaded, nothing written, and no
setting of the process (such as $TIKTOKEN_CACHE_DIR) is changed to get there.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memagent_cli.errors import UserError
from memagent_cli.folders import cache_dir

if TYPE_CHECKING:
    import tiktoken

DEFAULT_ENCODING = "cl100k_base"
_DATA = Path(__file__).resolve().parent / "data"
# The files shipped in _DATA and their sha256, as tiktoken's own constructors expect them.
SHIPPED = {"cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"}
# What tiktoken's own constructor of each shipped encoding gives tiktoken.Encoding besides
# the file (its cl100k_base(), in tiktoken_ext/openai_public.py of tiktoken 0.14):
# tests/test_offline_tokens.py checks they are still the same.
_FORMS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "pat_str": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
        "special_tokens": {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    }
}


def cache_directory() -> Path:
    """Where tiktoken keeps encoding files it downloads, when $TIKTOKEN_CACHE_DIR names it;
    else memagent's cache. The shipped encodings are read in place, never copied here."""
    return Path(os.environ.get("TIKTOKEN_CACHE_DIR") or cache_dir() / "tiktoken")


def encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """The tiktoken encoding `name`; a clear UserError when it cannot be loaded here."""
    import tiktoken

    if name not in tiktoken.list_encoding_names():
        known = ", ".join(tiktoken.list_encoding_names())
        raise UserError(f"Unknown tiktoken encoding {name}; known encodings: {known}.")
    if name in SHIPPED:
        return _shipped(name)
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # requests' and tiktoken's errors when offline or corrupt
        raise UserError(
            f"The tiktoken encoding {name} is not available offline ({type(exc).__name__}); "
            f"only {', '.join(SHIPPED)} ships with memagent."
        ) from None


@functools.cache  # a few hundred milliseconds to build; tiktoken keeps its own likewise
def _shipped(name: str) -> tiktoken.Encoding:
    """The encoding `name` from the file memagent ships, whose sha256 must be tiktoken's.

    Read here, not with tiktoken's load_tiktoken_bpe: that keeps a copy of every file it
    reads in tiktoken's cache ($TIKTOKEN_CACHE_DIR, else the temporary folder), outside
    the folders memagent writes to (docs/configuration.md)."""
    import tiktoken

    shipped = _DATA / f"{name}.tiktoken"
    try:
        data = shipped.read_bytes()
    except OSError:
        data = b""
    if hashlib.sha256(data).hexdigest() != SHIPPED[name]:
        raise UserError(
            f"memagent's copy of the tiktoken encoding {name} ({shipped}) is damaged: its "
            "sha256 is not the one tiktoken publishes; reinstall memagent."
        )
    # tiktoken's file format: a base64 token and its rank on each line.
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    return tiktoken.Encoding(name, mergeable_ranks=ranks, **_FORMS[name])


class TiktokenTokenizer:
    """A tiktoken encoding as a chunking tokenizer: approximate for any particular model."""

    def __init__(self, name: str = DEFAULT_ENCODING) -> None:
        self.name = name
        self._encoding = encoding(name)

    def tokenize(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._encoding.decode_bytes(list(tokens))
