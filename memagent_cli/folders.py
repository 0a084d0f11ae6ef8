"""Where memagent keeps its files: one data folder (models, traces, eval results) and one
cache folder (extracted document text, tiktoken's encoding file).

$MEMAGENT_HOME moves all of them at once, as LLM_USER_PATH, OLLAMA_MODELS or HF_HOME do:
data goes to $MEMAGENT_HOME itself and the cache to $MEMAGENT_HOME/cache. Without it the
platform's folders are used (~/.local/share/memagent and ~/.cache/memagent on Linux, which
XDG_DATA_HOME and XDG_CACHE_HOME move). Each part names its own subfolder.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

HOME_VARIABLE = "MEMAGENT_HOME"


def home() -> Path | None:
    """$MEMAGENT_HOME as a path, or None when it is not set."""
    value = os.environ.get(HOME_VARIABLE, "").strip()
    return Path(value).expanduser() if value else None


def data_dir() -> Path:
    """memagent's data folder: models, traces and eval results live under it."""
    root = home()
    return root if root is not None else platformdirs.user_data_path("memagent")


def cache_dir() -> Path:
    """memagent's cache folder: anything in it can be deleted and is made again."""
    root = home()
    return root / "cache" if root is not None else platformdirs.user_cache_path("memagent")
