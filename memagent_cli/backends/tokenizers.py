"""Model-free token counts with tiktoken, working offline.

tiktoken downloads its encoding files on first use, and this machine may have no internet.
memagent ships cl100k_base (backends/data/, with its licence) and seeds tiktoken's cache
with it, after checking its sha256; tiktoken checks the hash again when it loads the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from memagent_cli.errors import UserError
from memagent_cli.files import private_folder
from memagent_cli.folders import cache_dir

DEFAULT_ENCODING = "cl100k_base"
_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_DATA = Path(__file__).resolve().parent / "data"
# The files shipped in _DATA and their sha256, as tiktoken's own constructors expect them.
SHIPPED = {"cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"}


def cache_directory() -> Path:
    """Where tiktoken keeps its encoding files: $TIKTOKEN_CACHE_DIR, else memagent's cache."""
    return Path(os.environ.get("TIKTOKEN_CACHE_DIR") or cache_dir() / "tiktoken")


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _seed_cache(name: str) -> None:
    """Put the shipped file for `name` where tiktoken looks before downloading, unless a
    good copy is there already. A shipped file whose hash is wrong is never copied."""
    expected = SHIPPED.get(name)
    if expected is None:
        return
    cache = cache_directory()
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    target = cache / hashlib.sha1(_URL.format(name=name).encode()).hexdigest()
    if _sha256(target) == expected:
        return
    shipped = _DATA / f"{name}.tiktoken"
    if _sha256(shipped) != expected:
        raise UserError(
            f"memagent's copy of the tiktoken encoding {name} ({shipped}) is damaged: its "
            "sha256 is not the one tiktoken publishes; reinstall memagent."
        )
    try:
        private_folder(cache)
        temp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(shipped, temp)
        os.replace(temp, target)  # never a half-copied file where tiktoken reads
    except OSError as exc:
        raise UserError(
            f"Cannot write the tiktoken encoding {name} to {cache}: {exc.strerror}; set "
            "TIKTOKEN_CACHE_DIR to a folder that can be written."
        ) from None


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
            f"only {', '.join(SHIPPED)} ships with memagent."
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
