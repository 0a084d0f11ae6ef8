"""Model files written safely: room on the disk asked for before the first byte, and a
complete file renamed into place so that a power loss leaves no half of it (pulls and
conversions alike)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rich.filesize import decimal

from memagent_cli.errors import ModelError
from memagent_cli.files import check_folder


def check_space(folder: Path, needed: int, what: str = "the download") -> None:
    """Refuse, before writing anything, when `folder`'s disk cannot hold `needed` more bytes."""
    check_folder(folder, "models", ModelError)
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise ModelError(
            f"Not enough disk space in {folder}: {what} needs {decimal(needed)} more, "
            f"{decimal(free)} are free."
        )


def durable_rename(partial: Path, dest: Path) -> None:
    """Rename a complete file (a download, a conversion) into place so that a power loss
    leaves either no file or the whole one: its bytes reach the disk before the rename, and
    the rename before return."""
    with partial.open("rb+") as file:
        os.fsync(file.fileno())
    os.replace(partial, dest)
    if hasattr(os, "O_DIRECTORY"):  # POSIX: the folder's entry too
        folder = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
