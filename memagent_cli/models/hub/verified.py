"""Which pulled files are whole: a file is checked against the Hub's checksum once, then
trusted while the record of that check (models/verified.json) matches its size and
modification time, instead of reading gigabytes again at every pull."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rich.filesize import decimal

from memagent_cli.errors import ModelError
from memagent_cli.files import lock, open_private, read_checked, remove_stale, replace_private
from memagent_cli.models import gguf
from memagent_cli.models.hub.listing import RemoteFile
from memagent_cli.models.hub.specs import models_dir
from memagent_cli.progress import Note, Progress

VERIFIED_FILE = "verified.json"  # in models/: the pulled files that matched the Hub's checksum
# About 150 bytes a file: room for thousands. A larger file, or no regular file (a FIFO would
# block the read forever), is no record, and a pulled file is checked against the Hub again.
MAX_VERIFIED_BYTES = 4 << 20
STALE_SECONDS = 3600


def _checksum(remote: RemoteFile) -> str | None:
    return (remote.sha256 or remote.blob_id or "").lower() or None


def _verified_path() -> Path:
    """Where memagent records the pulled files it checked whole, by path under models/."""
    return models_dir() / VERIFIED_FILE


def _verified() -> dict[str, Any]:
    try:
        recorded = json.loads(read_checked(_verified_path(), MAX_VERIFIED_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _stamp(dest: Path, remote: RemoteFile) -> dict[str, Any]:
    info = dest.stat()
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "checksum": _checksum(remote)}


def _key(dest: Path) -> str:
    try:
        return dest.resolve().relative_to(models_dir().resolve()).as_posix()
    except ValueError:
        return str(dest.resolve())


def mark_verified(dest: Path, remote: RemoteFile) -> None:
    """Record that `dest` matched the Hub's checksum: a later pull trusts the file while its
    size and modification time are unchanged, instead of reading gigabytes again. Written
    after the file's bytes reached the disk, so a record never vouches for lost ones; the
    records of files no longer there are dropped."""
    root = models_dir()
    path = _verified_path()
    try:  # without the record, the next pull reads the file again: no harm
        # Read, add, write back under a lock: two pulls at once each keep the other's records.
        # The lock is a file of its own, as the records' file is replaced whole.
        with open_private(path.with_name(f"{path.name}.lock"), "a") as held:
            if not lock(held, wait=True):
                return
            recorded = {k: v for k, v in _verified().items() if (root / k).is_file()}
            recorded[_key(dest)] = _stamp(dest, remote)
            replace_private(path, json.dumps(recorded, indent=1), f"{path.name}.")  # 0600
            remove_stale(path.parent, f"{path.name}.", STALE_SECONDS, suffix=".tmp")
    except OSError:
        pass


def already_pulled(
    dest: Path, remote: RemoteFile, note: Note, progress: Progress | None = None
) -> bool:
    """Whether `dest` is `remote`, whole: of its size, a GGUF whose header reads, and
    matching the Hub's checksum, read once and then trusted while _mark_verified's record
    holds. A file that fails (zeros after a power loss, a damaged copy) is deleted, to be
    pulled again."""
    if not dest.is_file() or remote.size is None:
        return False
    info = dest.stat()
    if info.st_size != remote.size:
        return False
    why = None
    if dest.name.endswith(".gguf"):
        try:
            gguf.read(dest)
        except ModelError as exc:
            why = exc.message
    if why is None:
        if _checksum(remote) is None or _verified().get(_key(dest)) == _stamp(dest, remote):
            return True
        note(f"checking {dest.name}, pulled before, against the Hub's checksum")
        try:
            verify(dest, remote, note, progress, delete=False)
        except ModelError as exc:
            why = exc.message
        else:
            mark_verified(dest, remote)
            return True
    note(f"{dest} is damaged ({why.rstrip('.')}); pulling it again")
    dest.unlink()
    return False


def verify(
    path: Path,
    remote: RemoteFile,
    note: Note,
    progress: Progress | None = None,
    *,
    delete: bool = True,
) -> None:
    """Refuse, and delete (unless not `delete`), a download whose checksum differs from the
    Hub's; reading a multi-GB file back takes a while, so its bytes go through `progress`."""
    if remote.sha256:
        kind, expected = "sha256", remote.sha256.lower()
        digest = hashlib.sha256()
    elif remote.blob_id:
        kind, expected = "git blob sha1", remote.blob_id.lower()
        digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    else:
        note(f"warning: the Hub published no checksum for {remote.path}; it was not verified.")
        return
    size = path.stat().st_size
    if size > 1 << 30:
        note(f"checking the {kind} of {decimal(size)}")
    done = 0
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
            done += len(block)
            if progress:
                progress(f"checking {remote.path}", done, size)
    actual = digest.hexdigest()
    if actual != expected:
        if not delete:
            raise ModelError(f"its {kind} is {actual}, the Hub says {expected}")
        path.unlink()
        raise ModelError(
            f"The download of {remote.path} is corrupt: its {kind} is {actual}, the Hub says "
            f"{expected}; the file was deleted, pull it again."
        )
