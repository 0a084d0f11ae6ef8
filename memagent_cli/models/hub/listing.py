"""What the Hub holds: a repository's files with their sizes and checksums, through
huggingface_hub's public API, and one sentence for each way talking to the Hub fails."""

from __future__ import annotations

import os
from dataclasses import dataclass

from memagent_cli.errors import ModelError

_DEFAULT_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repository, as the Hub describes it."""

    path: str
    size: int | None
    sha256: str | None  # LFS files (every GGUF on the Hub)
    blob_id: str | None  # git's sha1 of the blob, for files not in LFS


def endpoint_url() -> str:
    """The Hub's address: $HF_ENDPOINT, else huggingface.co."""
    # Read at call time: huggingface_hub reads HF_ENDPOINT once, when first imported.
    return os.environ.get("HF_ENDPOINT", _DEFAULT_ENDPOINT).rstrip("/")


def list_files(repo: str, endpoint: str | None = None) -> tuple[str, dict[str, RemoteFile]]:
    """The commit the Hub serves for `repo` and its files with sizes and checksums."""
    from huggingface_hub import HfApi

    endpoint = endpoint or endpoint_url()
    try:
        info = HfApi(endpoint=endpoint).model_info(repo, files_metadata=True)
    except Exception as exc:
        raise hub_error(exc, repo, endpoint) from None
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
        if not safe_name(name):
            raise ModelError(
                f"{repo} lists a file named {name!r}, which would be written outside the "
                "model's folder; memagent refuses to pull from it."
            )
    return info.sha or "main", files


def safe_name(name: str) -> bool:
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


def hub_error(exc: Exception, repo: str, endpoint: str) -> ModelError:
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
