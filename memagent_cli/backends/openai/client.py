"""One JSON request to a server: retried while its failure looks transient, waited for as
a busy server asks, over within --timeout, its reply read no further than a bound, and
each failure one sentence (BackendError)."""

from __future__ import annotations

import email.utils
import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx2
import tenacity

from memagent_cli.backends.openai.deadline import Deadline, DeadlineTransport
from memagent_cli.backends.openai.urls import without_credentials
from memagent_cli.errors import UserError

# Transient failures (the server restarting, overloaded, or dropping a connection) are
# retried after 1, 2, 4 and 8 seconds, then reported. A call that times out is not: a server
# that does not answer within --timeout will not answer the same call sooner next time. One
# clock bounds the whole call, tries, backoff and busy waits together: --timeout.
RETRIES = 4
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_TRANSIENT = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpx2.ReadError,
    httpx2.RemoteProtocolError,
)
# A server that is busy (429, or 503 while loading) and says when to come back (Retry-After)
# is waited for as it asks, each wait capped, for up to this long in all: a busy server is
# doing its work, and giving up on it would only make a batch of readings start over.
_BUSY_STATUS = {429, 503}
_MOST_RETRY_AFTER = 60.0  # seconds of one wait, whatever the header says
MOST_BUSY_WAIT = 600.0  # seconds of waiting for one call, all retries together
# First contact (the model list, /props, the tokenize probes) is a seconds job: a server
# that takes longer there is not answering, however long --timeout gives a completion.
DISCOVERY_SECONDS = 10.0
# A reply is read up to a bound (in bytes, after decompression) and no further, since what
# is read is parsed, and json.loads makes up to 25 bytes of Python objects of each byte
# (`[{},{},...]`): the bound is what a hostile server or a gzip bomb can make memagent hold.
# A model list (OpenRouter's, of hundreds of models, is about a megabyte) or /props is
# read to MOST_REPLY_BYTES; a completion or a tokenize endpoint's reply to SHORT_REPLY_BYTES
# and an allowance for what it was asked to hold (docs/reliability.md has the peaks).
MOST_REPLY_BYTES = 8 << 20
SHORT_REPLY_BYTES = 1 << 20
_MOST_ERROR_CHARS = 200  # of a server's error text, shown on one line


class BackendError(UserError):
    """The server could not be reached or refused a request."""


class Client:
    """JSON requests to one server (`root`: its URL without /v1, credentials and all), each
    with `api_key` as a bearer token and within `timeout` seconds.

    Safe to share between threads: every call is one independent HTTP request.
    """

    def __init__(
        self,
        root: str,
        *,
        api_key: str | None,
        timeout: float,
        discovery_seconds: float = DISCOVERY_SECONDS,
    ) -> None:
        self.root = root  # what requests go to
        self.server = without_credentials(root)  # what is shown
        self.timeout = timeout
        self.discovery_seconds = discovery_seconds  # the bound of each first-contact call
        self._api_key = api_key
        if api_key and not (api_key.isascii() and api_key.isprintable()):
            # httpx2 would raise UnicodeEncodeError, or name the header, key and all.
            raise BackendError(
                "The API key holds characters an HTTP header cannot carry; a key is printable "
                "ASCII."
            )
        try:
            httpx2.URL(root)
        except (httpx2.InvalidURL, ValueError) as exc:  # ValueError: httpx2's port parsing
            raise _unusable(self.server, exc) from None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Only what _read_body can decode within its bounds (httpx2's decoders, 1 MiB a go).
        headers["Accept-Encoding"] = "gzip, deflate"
        self._deadline = Deadline()
        self._client = httpx2.Client(
            headers=headers,
            timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
            transport=DeadlineTransport(self._deadline),
        )

    def request(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        retry: bool = True,
        most_bytes: int = MOST_REPLY_BYTES,
        seconds: float | None = None,
    ) -> dict[str, Any]:
        """The JSON object the server answers at `path` (under its root): a GET, or a POST
        of `body`. Retried with backoff while the failure looks transient, the whole call
        over within `seconds` (--timeout unless fewer are given) from the first byte sent
        to the last wait, and its reply at most `most_bytes` long."""
        url = f"{self.root}{path}"
        limit = self.timeout if seconds is None else min(seconds, self.timeout)
        end = time.monotonic() + limit
        tries = 0

        def send() -> _Reply:
            nonlocal tries
            tries += 1
            self._deadline.at = end
            try:
                method = "GET" if body is None else "POST"
                with self._client.stream(method, url, json=body) as response:
                    return _Reply(response, _read_body(response, most_bytes))
            finally:
                self._deadline.at = None

        retrying = tenacity.Retrying(
            stop=lambda state: _stop(state) or time.monotonic() + state.upcoming_sleep >= end,
            wait=_wait,
            retry=tenacity.retry_if_exception_type(_TRANSIENT)
            | tenacity.retry_if_result(lambda reply: reply.response.status_code in _RETRY_STATUS),
            retry_error_callback=lambda state: state.outcome.result(),  # the last answer
            reraise=True,
        )
        try:
            reply = retrying(send) if retry else send()
        except _TooLong:
            raise BackendError(
                f"The server at {self.server} sent more than {_size(most_bytes)} in reply to "
                f"{path}; memagent reads no further."
            ) from None
        except httpx2.TimeoutException as exc:
            if isinstance(exc, httpx2.ConnectTimeout) and time.monotonic() < end:
                raise BackendError(
                    f"Cannot reach the server at {self.server}: it did not "
                    "accept the connection; is it running?"
                ) from None
            which = " (--timeout)" if limit == self.timeout else ""
            raise BackendError(
                f"The server at {self.server} did not answer {path} within {limit:g} "
                f"seconds{which}."
            ) from None
        except httpx2.InvalidURL as exc:  # the URL with the path asked: too long, say
            raise _unusable(self.server, exc) from None
        except httpx2.DecodingError:
            raise BackendError(
                f"The server at {self.server} sent a compressed reply to {path} that does not "
                "decompress."
            ) from None
        except httpx2.HTTPError as exc:
            detail = _shortened(without_credentials(str(exc))) or "no answer"
            raise BackendError(
                f"Cannot reach the server at {self.server} ({type(exc).__name__}: "
                f"{detail}){f' after {tries} tries' if tries > 1 else ''}; is it running?"
            ) from None
        response = reply.response
        if response.is_error:
            hint = ""
            if response.status_code in (401, 403) and not self._api_key:
                hint = (
                    "; it may need a key: pass --api-key or set $MEMAGENT_API_KEY "
                    "($OPENAI_API_KEY goes only to $OPENAI_BASE_URL or api.openai.com)"
                )
            detail = _shortened(without_credentials(_error_detail(response, reply.body)))
            raise BackendError(
                f"The server at {self.server} answered HTTP {response.status_code} to {path}: "
                f"{detail}{hint}."
            )
        try:
            payload = json.loads(reply.body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            payload = None
        if not isinstance(payload, dict):
            raise BackendError(
                f"The server at {self.server} did not answer a JSON object at {path}; is "
                "--base-url right?"
            )
        return payload


def retry_after(response: httpx2.Response) -> float | None:
    """The seconds a busy server (429, 503) asks a client to wait before it tries again,
    from its Retry-After header (seconds, or an HTTP date), kept within 1 to 60 seconds;
    None when it names none."""
    if response.status_code not in _BUSY_STATUS:
        return None
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 1.0), _MOST_RETRY_AFTER)  # at least 1: a bounded number of tries


def _busy_wait(state: tenacity.RetryCallState) -> float | None:
    """The Retry-After of the last answer, when it was a busy server's."""
    outcome = state.outcome
    if outcome is None or outcome.failed:
        return None
    return retry_after(outcome.result().response)


_backoff = tenacity.wait_exponential(multiplier=1, min=1, max=8)


def _wait(state: tenacity.RetryCallState) -> float:
    """As long as a busy server asks (with a little jitter, so that many calls turned away
    at once do not all come back at the same instant), else 1, 2, 4, 8 seconds."""
    asked = _busy_wait(state)
    if asked is None:
        return _backoff(state)
    return asked + random.uniform(0.0, min(0.1 * asked, 1.0))


def _stop(state: tenacity.RetryCallState) -> bool:
    """Other failures stop after RETRIES retries; a busy server that says when to come back
    is waited for until MOST_BUSY_WAIT seconds have been spent waiting on this call."""
    asked = _busy_wait(state)
    if asked is None:
        return state.attempt_number >= RETRIES + 1
    return state.idle_for + asked > MOST_BUSY_WAIT


@dataclass(frozen=True)
class _Reply:
    """A server's answer with its body, read whole within its bound."""

    response: httpx2.Response
    body: bytes


class _TooLong(Exception):
    """A reply that goes on past its bound."""


def _read_body(response: httpx2.Response, most_bytes: int) -> bytes:
    """The body of `response`, decompressed, or _TooLong as soon as it passes `most_bytes`:
    httpx2 inflates a compressed reply 1 MiB at a time, so a bomb stops at the bound."""
    pieces, size = [], 0
    for piece in response.iter_bytes():
        pieces.append(piece)
        size += len(piece)
        if size > most_bytes:
            raise _TooLong
    return b"".join(pieces)


def _error_detail(response: httpx2.Response, body: bytes) -> str:
    """What a server said went wrong: the message of its JSON error, else the reason."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return response.reason_phrase or "error"
    error = payload.get("error", payload.get("detail")) if isinstance(payload, dict) else None
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error or response.reason_phrase).strip().rstrip(".") or "error"


def _unusable(server: str, exc: Exception) -> BackendError:
    detail = str(exc) if isinstance(exc, httpx2.InvalidURL) else "its host or port is malformed"
    return BackendError(f"The server URL {_shortened(server)} cannot be used: {detail}.")


def _shortened(text: str) -> str:
    """`text` on one line and at most _MOST_ERROR_CHARS long: a server's error text can be a
    page of HTML or a stack trace."""
    line = " ".join(text.split())
    if len(line) <= _MOST_ERROR_CHARS:
        return line
    return line[: _MOST_ERROR_CHARS - 1].rstrip() + "…"


def _size(count: int) -> str:
    """A byte count as people read it: 8 MiB, 1.03 MiB."""
    return f"{count / (1 << 20):.3g} MiB" if count >= 1 << 20 else f"{count:,} bytes"
