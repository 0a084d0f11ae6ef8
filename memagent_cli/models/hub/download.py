"""A file of the Hub fetched through a partial file that survives interruptions: a dropped
connection is resumed at once, an interrupted pull when run again, and the whole file is
checked against the Hub's checksum before it takes its name.

Files go through huggingface_hub's public pieces (hf_hub_url, get_session, build_hf_headers,
hf_raise_for_status): its hf_hub_download deletes a partial file when a download fails, so it
cannot resume an interrupted pull. Progress and notes go to callbacks, never to a display.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import BinaryIO

from rich.filesize import decimal

from memagent_cli.errors import STOPS, ModelError
from memagent_cli.files import check_folder
from memagent_cli.models.disk import check_space, durable_rename
from memagent_cli.models.hub.listing import RemoteFile, endpoint_url, hub_error
from memagent_cli.models.hub.verified import already_pulled, mark_verified, verify
from memagent_cli.progress import Note, Progress, silent

_RETRIES = 5  # dropped connections in a row, with no byte between them, before giving up
_TIMEOUT = 60.0  # seconds without a byte from the Hub


def partial_path(dest: Path, remote: RemoteFile) -> Path:
    """Where the bytes of `remote` gather until it is complete and verified."""
    checksum = remote.sha256 or remote.blob_id or "unknown"
    return dest.with_name(f"{dest.name}.{checksum[:16]}.incomplete")


def download(
    repo: str,
    commit: str,
    remote: RemoteFile,
    dest: Path,
    *,
    note: Note = silent,
    progress: Progress | None = None,
) -> None:
    """Fetch `remote` to `dest` through a partial file that survives interruptions: a
    dropped connection is resumed at once, an interrupted pull when run again."""
    from huggingface_hub import hf_hub_url

    if already_pulled(dest, remote, note, progress):
        note(f"already pulled: {dest}")
        return
    check_folder(dest.parent, "models", ModelError)  # one sentence, before any byte comes
    partial = partial_path(dest, remote)
    for stale in dest.parent.glob(f"{glob.escape(dest.name)}.*.incomplete"):
        if stale != partial:  # left by an older revision of the file
            stale.unlink()
    have = partial.stat().st_size if partial.is_file() else 0
    if remote.size is not None and have > remote.size:
        partial.unlink()
        have = 0
    total = remote.size or 0
    check_space(dest.parent, total - have)
    size = decimal(total) if total else "size unknown"
    if have:
        note(f"resuming {remote.path} from {repo} at {decimal(have)} of {size}")
    else:
        note(f"downloading {remote.path} ({size}) from {repo} to {dest.parent}")
    partial.touch()
    endpoint = endpoint_url()
    url = hf_hub_url(repo, remote.path, revision=commit, endpoint=endpoint)
    try:
        _fetch(url, partial, remote.size, progress, remote.path)
    except STOPS:
        note(f"interrupted; {_kept(partial, total)} Run the same pull again to resume.")
        raise
    except Exception as exc:
        reason = hub_error(exc, repo, endpoint).message.rstrip(".")
        raise ModelError(
            f"Download of {remote.path} stopped: {reason}; {_kept(partial, total)} "
            "Run the same command again to resume."
        ) from None
    verify(partial, remote, note, progress)
    durable_rename(partial, dest)
    mark_verified(dest, remote)
    note(f"pulled {dest}")


def _fetch(
    url: str, partial: Path, size: int | None, progress: Progress | None, label: str
) -> None:
    """Append the bytes of `url` that `partial` lacks, resuming with a Range request after a
    dropped connection for as long as each attempt brings new bytes. Drops are retried
    after 1, 2, 4 and 8 seconds (tenacity, as the server backend retries): a Hub that just
    hung up is seldom back the same instant."""
    import httpx2
    import tenacity
    from huggingface_hub import get_session, hf_raise_for_status
    from huggingface_hub.utils import build_hf_headers

    failures = 0  # drops in a row with no byte between them

    def attempt(file: BinaryIO) -> None:
        nonlocal failures
        have = file.seek(0, os.SEEK_END)
        if size is not None and have >= size:
            return
        headers = build_hf_headers()  # HF_TOKEN, as every huggingface_hub call
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with get_session().stream(
                "GET", url, headers=headers, follow_redirects=True, timeout=_TIMEOUT
            ) as response:
                hf_raise_for_status(response)
                if have and response.status_code != 206:  # the server sent it all again
                    file.truncate(0)
                    file.seek(0)
                    have = 0
                # As they arrive: a fixed chunk size would lose the bytes buffered
                # toward a chunk when the connection drops.
                for block in response.iter_bytes():
                    if size is not None and have + len(block) > size:
                        block = block[: size - have]  # a server sending more is not read on
                    file.write(block)
                    have += len(block)
                    failures = 0
                    if progress:
                        progress(label, have, size)
                    if size is not None and have >= size:
                        break
            if size is not None and have < size:
                raise httpx2.RemoteProtocolError("the connection closed early")
        except httpx2.TransportError:
            failures += 1
            raise

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(httpx2.TransportError),
        stop=lambda state: failures > _RETRIES,
        wait=lambda state: min(2 ** (failures - 1), 8),
        reraise=True,
    )
    with partial.open("r+b") as file:
        retrying(attempt, file)


def _kept(partial: Path, total: int) -> str:
    have = partial.stat().st_size if partial.is_file() else 0
    of = f" of {decimal(total)}" if total else ""
    return f"{decimal(have)}{of} kept in {partial}."
