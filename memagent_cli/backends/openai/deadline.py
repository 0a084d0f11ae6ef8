"""Connections that keep a call's deadline: httpcore2's own timeouts bound each socket
operation, so a server that trickles a byte at a time would never time out. Every read,
write and connect here is cut to the time its call has left.

httpx2 builds its connection pools itself, with no option for the network they use, so
this is a transport of its own over httpcore2's public pools (`ConnectionPool`,
`HTTPProxy`, `SOCKSProxy`, each with `network_backend=`), as httpx2's `HTTPTransport` is.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore2
import httpx2


class Deadline(threading.local):
    """When the call under way in this thread must be over (time.monotonic()), if any."""

    at: float | None = None

    def left(self, timeout: float | None, late: type[Exception]) -> float | None:
        """`timeout` for one socket operation, cut to the time left; `late` once none is."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise late("--timeout passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore2.NetworkStream):
    """A connection whose every read and write ends by the deadline of its call."""

    def __init__(self, stream: httpcore2.NetworkStream, deadline: Deadline) -> None:
        self._stream, self._deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.left(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.left(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        left = self._deadline.left(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, left), self._deadline
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineNetwork(httpcore2.NetworkBackend):
    """httpcore2's sockets, each connection a _DeadlineStream."""

    def __init__(self, deadline: Deadline) -> None:
        self._network, self._deadline = httpcore2.SyncBackend(), deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        left = self._deadline.left(timeout, httpcore2.ConnectTimeout)
        stream = self._network.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.NetworkStream:
        left = self._deadline.left(timeout, httpcore2.ConnectTimeout)
        stream = self._network.connect_unix_socket(path, left, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._network.sleep(seconds)


# httpcore2's errors as httpx2's, most specific first (what httpx2's own transport raises).
_ERRORS: list[tuple[type[Exception], type[httpx2.HTTPError]]] = [
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.ProxyError, httpx2.ProxyError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
]


class _HttpxErrors:
    """Raise httpcore2's errors as httpx2's, so that callers see one client's errors."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _: Any):
        for theirs, ours in _ERRORS:
            if isinstance(error, theirs):
                raise ours(str(error)) from error
        return False


class _Body(httpx2.SyncByteStream):
    """A reply's body as httpcore2 streams it, its errors httpx2's."""

    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _HttpxErrors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class DeadlineTransport(httpx2.BaseTransport):
    """httpx2's transport over connections that keep `deadline`: direct, or through the
    proxy the environment names for the request's scheme (HTTP_PROXY, HTTPS_PROXY,
    ALL_PROXY, NO_PROXY, read as urllib reads them)."""

    def __init__(self, deadline: Deadline) -> None:
        self._network = _DeadlineNetwork(deadline)
        self._ssl_context = httpx2.create_ssl_context()  # SSL_CERT_FILE, as httpx2's own
        self._pools: dict[str | None, httpcore2.ConnectionPool] = {}
        self._lock = threading.Lock()

    def _pool(self, url: httpx2.URL) -> httpcore2.ConnectionPool:
        proxy = _proxy_for(url)
        with self._lock:
            pool = self._pools.get(proxy)
            if pool is None:
                pool = self._pools[proxy] = self._open(proxy)
            return pool

    def _open(self, proxy_url: str | None) -> httpcore2.ConnectionPool:
        common: dict[str, Any] = {
            "ssl_context": self._ssl_context,
            "max_connections": 100,  # httpx2's default limits
            "max_keepalive_connections": 20,
            "keepalive_expiry": 5.0,
            "network_backend": self._network,
        }
        if proxy_url is None:
            return httpcore2.ConnectionPool(**common)
        proxy = httpx2.Proxy(proxy_url)
        url = httpcore2.URL(
            scheme=proxy.url.raw_scheme,
            host=proxy.url.raw_host,
            port=proxy.url.port,
            target=proxy.url.raw_path,
        )
        if proxy.url.scheme in ("socks5", "socks5h"):
            return httpcore2.SOCKSProxy(proxy_url=url, proxy_auth=proxy.raw_auth, **common)
        return httpcore2.HTTPProxy(
            proxy_url=url, proxy_auth=proxy.raw_auth, proxy_headers=proxy.headers.raw, **common
        )

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        assert isinstance(request.stream, httpx2.SyncByteStream)
        sent = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _HttpxErrors():
            answer = self._pool(request.url).handle_request(sent)
        assert isinstance(answer.stream, Iterable)
        return httpx2.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def _proxy_for(url: httpx2.URL) -> str | None:
    """The proxy the environment names for `url`, None to go direct."""
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(url.host):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"
