"""A Hugging Face Hub on 127.0.0.1 with the two endpoints a pull uses: model info with file
metadata (`/api/models/OWNER/NAME?blobs=true`) and file downloads with Range
(`/OWNER/NAME/resolve/REVISION/PATH`). A file can drop its connection midway, fail, or
announce a checksum its bytes do not have, or come slowly."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_MODEL_INFO = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/[^/]+)?/?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@dataclass
class HubFile:
    """One file of a repository, and how the server misbehaves while serving it."""

    content: bytes
    announced_sha256: str | None = None  # default: the content's own
    drop_after: int | None = None  # the first download stops after this many bytes
    then_fail: bool = False  # after the drop, every download answers 503
    lfs: bool = True
    announced_size: int | None = None  # default: the content's own length
    pace: float = 0.0  # seconds of pause after each 64 KiB of a download: a slow Hub

    @property
    def size(self) -> int:
        return len(self.content) if self.announced_size is None else self.announced_size

    @property
    def sha256(self) -> str:
        return self.announced_sha256 or hashlib.sha256(self.content).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None
    at: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class FakeHub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def add(self, repo: str, files: dict[str, bytes | HubFile]) -> None:
        self.repos[repo] = {
            path: f if isinstance(f, HubFile) else HubFile(f) for path, f in files.items()
        }

    def downloads(self, path: str) -> list[Request]:
        """The GET requests for the file at `path` (its repository path)."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + path)]

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    owner: FakeHub
    protocol_version = "HTTP/1.1"
    timeout = 10  # a stuck client must not hang the tests

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.owner.requests.append(
            Request(
                self.command, path, self.headers.get("Range"), self.headers.get("Authorization")
            )
        )
        if match := _MODEL_INFO.match(path):
            return self._model_info(match[1])
        if match := _RESOLVE.match(path):
            return self._file(match[1], match[3], body)
        self._error(404, "", "Not found")

    def _model_info(self, repo: str) -> None:
        files = self.owner.repos.get(repo)
        if files is None:
            return self._error(404, "RepoNotFound", "Repository not found")
        siblings = []
        for name, f in sorted(files.items()):
            sibling = {
                "rfilename": name,
                "size": f.size,
                "blobId": hashlib.sha1(b"blob %d\0" % len(f.content) + f.content).hexdigest(),
            }
            if f.lfs:
                sibling["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": 134}
            siblings.append(sibling)
        data = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings})
        self._send(200, data.encode(), {"Content-Type": "application/json"})

    def _file(self, repo: str, name: str, body: bool) -> None:
        f = self.owner.repos.get(repo, {}).get(name)
        if f is None:
            code = "EntryNotFound" if repo in self.owner.repos else "RepoNotFound"
            return self._error(404, code, "Not found")
        if body and f.drop_after is None and f.then_fail:
            return self._error(503, "", "Service unavailable")
        start = 0
        if r := re.match(r"bytes=(\d+)-$", self.headers.get("Range", "")):
            start = int(r[1])
        content = f.content[start:]
        headers = {
            "ETag": f'"{f.sha256}"',
            "X-Repo-Commit": COMMIT,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(f.content) - 1}/{len(f.content)}"
        if not body:
            return self._send(status, b"", headers, length=len(content))
        if f.drop_after is not None:  # send the headers in full, then part of the body, and hang up
            cut, f.drop_after = f.drop_after, None
            self._send(status, content[:cut], headers, length=len(content))
            self.close_connection = True
            return
        self._send(status, content, headers, pace=f.pace)

    def _error(self, status: int, code: str, message: str) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _send(
        self,
        status: int,
        data: bytes,
        headers: dict[str, str],
        length: int | None = None,
        pace: float = 0.0,
    ) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        step = 1 << 16 if pace else max(len(data), 1)
        try:
            for start in range(0, len(data), step):
                self.wfile.write(data[start : start + step])
                self.wfile.flush()
                time.sleep(pace)
        except (BrokenPipeError, ConnectionResetError):  # the client went away meanwhile
            self.close_connection = True
            return
        self.wfile.flush()


def use_hub(env: dict[str, str], server: FakeHub, hf_home: Path) -> None:
    """Point `env`'s user at a fake Hugging Face Hub, with no token, proxy or offline mode."""
    env.update(
        HF_ENDPOINT=server.url,
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env.pop(name, None)
        env.pop(name.lower(), None)
