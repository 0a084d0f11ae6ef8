"""Models from the Hugging Face Hub: `OWNER/NAME[:QUANT]` picks a GGUF file the way
llama.cpp's `-hf` does, or, for a repository of Hugging Face weights, has them converted
(models/pull.py). Downloads resume where they stopped and are checked against
the Hub's sha256.

Files go through huggingface_hub's public pieces (hf_hub_url, get_session, build_hf_headers,
hf_raise_for_status): its hf_hub_download deletes a partial file when a download fails, so it
cannot resume an interrupted pull. Progress and notes go to callbacks, never to a display.

Pulled files live in the user data folder, under models/hf/OWNER/NAME/, so that
`hf:OWNER/NAME:QUANT` finds them again without asking the Hub.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from rich.filesize import decimal

from memagent_cli.errors import Interrupted, ModelError
from memagent_cli.files import check_folder
from memagent_cli.folders import data_dir
from memagent_cli.gguf_header import split_parts
from memagent_cli.models import gguf
from memagent_cli.models.gguf import quant_tag
from memagent_cli.progress import Note, Progress, silent

PREFIX = "hf:"
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's -hf choice when no tag is given
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_DEFAULT_ENDPOINT = "https://huggingface.co"
_RETRIES = 5  # dropped connections in a row, with no byte between them, before giving up
_TIMEOUT = 60.0  # seconds without a byte from the Hub
VERIFIED_FILE = "verified.json"  # in models/: the pulled files that matched the Hub's checksum


@dataclass(frozen=True)
class Spec:
    """A GGUF on the Hub: a repository and a quantization tag ("" for llama.cpp's default),
    or an exact file path in the repository (a tag that ends in .gguf)."""

    repo: str
    quant: str = ""

    def __str__(self) -> str:
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository, as the Hub describes it."""

    path: str
    size: int | None
    sha256: str | None  # LFS files (every GGUF on the Hub)
    blob_id: str | None  # git's sha1 of the blob, for files not in LFS


def parse(text: str) -> Spec:
    """`[hf:]OWNER/NAME[:QUANT]` as a Spec; ModelError if it is not one."""
    repo, _, quant = text.removeprefix(PREFIX).partition(":")
    if not _REPO.match(repo):
        raise ModelError(
            f"{text} is not a Hugging Face repository: write OWNER/NAME[:QUANT], "
            "e.g. bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M."
        )
    return Spec(repo, quant.strip())


def looks_like_repo(text: str) -> bool:
    return text.startswith(PREFIX) or bool(_REPO.match(text.partition(":")[0]))


def models_dir() -> Path:
    """Where pulled models go: the user data folder's models/."""
    return data_dir() / "models"


def repo_dir(repo: str) -> Path:
    owner, name = repo.split("/")
    return models_dir() / "hf" / owner / name


def spec_of(path: Path) -> Spec | None:
    """The Spec a pulled file answers to, from where it lies; None if it was not pulled."""
    try:
        owner, name, *_ = path.relative_to(models_dir() / "hf").parts
    except ValueError:
        return None
    return Spec(f"{owner}/{name}", quant_tag(path.name) or path.name)


def choose(paths: Iterable[str], quant: str, repo: str = "") -> list[str]:
    """The files to fetch for `quant`: the model file first, then its other split parts.

    As llama.cpp: the first model GGUF (not mmproj or imatrix) whose path holds the tag
    (tag_pattern); without a tag Q4_K_M, then Q8_0, then the first model GGUF. A tag
    ending in .gguf names the file itself.
    """
    paths = sorted(paths)
    models = [p for p in paths if is_model(p) and split_parts(Path(p))[0] == 1]
    if quant.lower().endswith(".gguf"):
        primary = next((p for p in paths if p == quant), None)
    else:
        primary = None
        for tag in [quant] if quant else DEFAULT_QUANTS:
            pattern = tag_pattern(tag)
            if primary := next((p for p in models if pattern.search(p)), None):
                break
        if primary is None and not quant and models:
            primary = models[0]
    if primary is None:
        where = f" in {repo}" if repo else ""
        if not models:
            raise ModelError(f"There is no GGUF model file{where}.")
        tags = sorted({quant_tag(p) or p for p in models})
        raise ModelError(f"No GGUF file{where} matches {quant}; available: {', '.join(tags)}.")
    return [primary] + _other_parts(primary, paths)


def tag_pattern(tag: str) -> re.Pattern[str]:
    """A quantization tag in a file's path: followed by `.` or `-`, ignoring case, as
    llama.cpp matches it, and, unlike a bare substring, not the end of a longer name:
    F16 is not BF16."""
    return re.compile(r"(?<![a-z0-9])" + re.escape(tag) + r"[.-]", re.IGNORECASE)


def find_pulled(spec: Spec) -> Path | None:
    """The local file for `spec` if it was pulled, all split parts present; no network."""
    folder = repo_dir(spec.repo)
    if not folder.is_dir():
        return None
    local = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf") if p.is_file()]
    try:
        chosen = choose(local, spec.quant)
    except ModelError:
        return None
    if split_parts(Path(chosen[0]))[1] != len(chosen):
        return None  # a split model with parts missing
    return folder / chosen[0]


def endpoint_url() -> str:
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, when first imported.
    return os.environ.get("HF_ENDPOINT", _DEFAULT_ENDPOINT).rstrip("/")


def is_model(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and "mmproj" not in name and "imatrix" not in name


def _other_parts(primary: str, paths: list[str]) -> list[str]:
    index, count = split_parts(Path(primary))
    if count == 1:
        return []
    prefix = primary[: -len(f"-00001-of-{count:05d}.gguf")]
    return [f"{prefix}-{i:05d}-of-{count:05d}.gguf" for i in range(2, count + 1)]


def note_other_matches(spec: Spec, files: dict[str, RemoteFile], primary: str, note: Note) -> None:
    tag = spec.quant or quant_tag(primary)
    pattern = tag_pattern(tag)
    others = [
        p
        for p in sorted(files)
        if p != primary and is_model(p) and split_parts(Path(p))[0] == 1 and pattern.search(p)
    ]
    if others:
        note(
            f"{len(others) + 1} files match {tag}; taking {primary}. Name another file "
            f"exactly with {spec.repo}:FILE.gguf (also: {', '.join(others)})."
        )


def list_files(repo: str, endpoint: str | None = None) -> tuple[str, dict[str, RemoteFile]]:
    """The commit the Hub serves for `repo` and its files with sizes and checksums."""
    from huggingface_hub import HfApi

    endpoint = endpoint or endpoint_url()
    try:
        info = HfApi(endpoint=endpoint).model_info(repo, files_metadata=True)
    except Exception as exc:
        raise _hub_error(exc, repo, endpoint) from None
    files = {
        s.rfilename: RemoteFile(
            s.rfilename,
            s.lfs.size if s.lfs else s.size,
            s.lfs.sha256 if s.lfs else None,
            s.blob_id,
        )
        for s in info.siblings or []
    }
    for name in files:
        if not _safe_name(name):
            raise ModelError(
                f"{repo} lists a file named {name!r}, which would be written outside the "
                "model's folder; memagent refuses to pull from it."
            )
    return info.sha or "main", files


def _safe_name(name: str) -> bool:
    """Whether a repository file name stays inside the folder it is written to: relative,
    no `..` part, no backslash or NUL (a Windows separator, a truncated C string)."""
    parts = name.split("/")
    return (
        bool(name)
        and not name.startswith("/")
        and "\\" not in name
        and "\x00" not in name
        and not (len(name) > 1 and name[1] == ":")  # C:...
        and all(part not in ("", ".", "..") for part in parts)
    )


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

    if _already_pulled(dest, remote, note, progress):
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
    except (KeyboardInterrupt, Interrupted):
        note(f"interrupted; {_kept(partial, total)} Run the same pull again to resume.")
        raise
    except Exception as exc:
        reason = _hub_error(exc, repo, endpoint).message.rstrip(".")
        raise ModelError(
            f"Download of {remote.path} stopped: {reason}; {_kept(partial, total)} "
            "Run the same command again to resume."
        ) from None
    _verify(partial, remote, note, progress)
    durable_rename(partial, dest)
    _mark_verified(dest, remote)
    note(f"pulled {dest}")


def _checksum(remote: RemoteFile) -> str | None:
    return (remote.sha256 or remote.blob_id or "").lower() or None


def _verified_path() -> Path:
    """Where memagent records the pulled files it checked whole, by path under models/."""
    return models_dir() / VERIFIED_FILE


def _verified() -> dict[str, Any]:
    try:
        recorded = json.loads(_verified_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
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


def _mark_verified(dest: Path, remote: RemoteFile) -> None:
    """Record that `dest` matched the Hub's checksum: a later pull trusts the file while its
    size and modification time are unchanged, instead of reading gigabytes again. Written
    after the file's bytes reached the disk, so a record never vouches for lost ones; the
    records of files no longer there are dropped."""
    root = models_dir()
    recorded = {k: v for k, v in _verified().items() if (root / k).is_file()}
    recorded[_key(dest)] = _stamp(dest, remote)
    path = _verified_path()
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:  # without the record, the next pull reads the file again: no harm
        temp.write_text(json.dumps(recorded, indent=1), encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)


def _already_pulled(
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
            _verify(dest, remote, note, progress, delete=False)
        except ModelError as exc:
            why = exc.message
        else:
            _mark_verified(dest, remote)
            return True
    note(f"{dest} is damaged ({why.rstrip('.')}); pulling it again")
    dest.unlink()
    return False


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


def _verify(
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


def check_space(folder: Path, needed: int, what: str = "the download") -> None:
    """Refuse, before writing anything, when `folder`'s disk cannot hold `needed` more bytes."""
    check_folder(folder, "models", ModelError)
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise ModelError(
            f"Not enough disk space in {folder}: {what} needs {decimal(needed)} more, "
            f"{decimal(free)} are free."
        )


def _kept(partial: Path, total: int) -> str:
    have = partial.stat().st_size if partial.is_file() else 0
    of = f" of {decimal(total)}" if total else ""
    return f"{decimal(have)}{of} kept in {partial}."


def _hub_error(exc: Exception, repo: str, endpoint: str) -> ModelError:
    """One sentence for what went wrong talking to the Hub."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    if isinstance(exc, ModelError):
        return exc
    if isinstance(exc, GatedRepoError):
        return ModelError(
            f"{repo} is gated: accept its terms at {endpoint}/{repo} and set HF_TOKEN to a "
            "token of that account."
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(
            f"There is no repository {repo} on the Hugging Face Hub ({endpoint}); check the "
            "name (a private repository needs HF_TOKEN)."
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return ModelError(f"HF_HUB_OFFLINE is set, so {repo} cannot be pulled.")
    if isinstance(exc, httpx2.TransportError):
        return ModelError(
            f"Cannot reach the Hugging Face Hub at {endpoint} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}); check the connection "
            "or HF_ENDPOINT."
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "an error"
        return ModelError(f"The Hugging Face Hub at {endpoint} answered HTTP {status} for {repo}.")
    if isinstance(exc, OSError):  # disk full, or the size check after a short download
        return ModelError(f"{exc.strerror or str(exc).splitlines()[0]}.")
    raise exc
