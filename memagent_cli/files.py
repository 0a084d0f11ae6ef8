"""Files memagent reads and appends to, opened with care: only regular files of a bounded
size (a FIFO would block forever, /dev/zero never ends), and an append-only log whose last
line a crash may have cut."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from memagent_cli.errors import ModelError, UserError

MAX_LINE_BYTES = 16 << 20  # longer than any record memagent writes


def open_regular(
    path: Path, what: str, *, limit: int | None = None, error: type[UserError] = UserError
) -> BinaryIO:
    """`path` opened for reading if it is a regular file of at most `limit` bytes; otherwise
    `error` with one sentence. `what` names the file in that sentence ("trace")."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise error(f"{what.capitalize()} not found: {path}") from None
    except OSError as exc:
        raise error(f"Cannot read {what} {path}: {exc.strerror}.") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{what.capitalize()} {path} is not a regular file.")
    if limit is not None and info.st_size > limit:
        raise error(
            f"{what.capitalize()} {path} is {info.st_size:,} bytes; the limit is {limit:,}."
        )
    try:
        return path.open("rb")
    except OSError as exc:
        raise error(f"Cannot read {what} {path}: {exc.strerror}.") from None


def drop_partial_line(path: Path) -> None:
    """Cut a line left half-written by a crash, so appended lines start on their own line."""
    with path.open("r+b") as file:
        size = file.seek(0, os.SEEK_END)
        back = min(size, MAX_LINE_BYTES)
        file.seek(size - back)
        tail = file.read(back)
        end = size - back + tail.rfind(b"\n") + 1
        if end < size:
            file.truncate(end)


def check_gguf(path: Path) -> None:
    """Fail with a sentence (ModelError) unless `path` can be read and starts like a GGUF
    file: llama.cpp would crash or abort on anything else."""
    if path.exists() and not path.is_file():  # a FIFO would block the read below forever
        raise ModelError(f"{path} is not a regular file, so not a GGUF model file.")
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as exc:
        raise ModelError(f"Cannot read model {path}: {exc.strerror or exc}.") from None
    if magic != b"GGUF":
        raise ModelError(f"{path} is not a GGUF model file (llama.cpp reads GGUF models only).")
