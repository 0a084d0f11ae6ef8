"""An OpenAI-compatible server (llama.cpp's llama-server, vLLM, SGLang, Ollama, or
llama-cpp-python's server): the same protocol over `/v1/chat/completions`."""

from __future__ import annotations

import email.utils
import ipaddress
import json
import math
import random
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpcore2
import httpx2
import tenacity

from memagent_cli.backend import Description, Generation, InTurn, Sampling
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.errors import UserError
from memagent_cli.progress import Note, Progress, silent

# Transient failures (the server restarting, overloaded, or dropping a connection) are
# retried after 1, 2, 4 and 8 seconds, then reported. A call that times out is not: a server
# that does not answer within --timeout will not answer the same call sooner next time.
_RETRIES = 4
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
_MOST_BUSY_WAIT = 600.0  # seconds of waiting for one call, all retries together
_UNKNOWN_CONTEXT = 10**9
# The user:password@ of a URL (also one without a scheme): sent, never shown or recorded.
_CREDENTIALS = re.compile(r"(^|[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# A reply is read up to this many bytes (after decompression) and no further: far above any
# real one (a completion is kilobytes, a long model list a few megabytes), and what a hostile
# server or a gzip bomb can make memagent hold. A tokenize endpoint may send more in reply
# to a long text: up to _TOKEN_BYTES per byte of the text sent (a token per byte, as JSON).
MOST_REPLY_BYTES = 64 << 20
_TOKEN_BYTES = 16
_MOST_ERROR_CHARS = 200  # of a server's error text, shown on one line
# OPENAI_API_KEY is the OpenAI SDK's key for its own base URL: it goes with OPENAI_BASE_URL,
# or to OpenAI, and to no other server (cli/options.py).
_OPENAI_SERVER = "https://api.openai.com/v1"


def without_credentials(text: str) -> str:
    """`text` (a URL, or a message that quotes one) with every URL's user:password@ left
    out, as a trace, --json, an HTML report or an error may show it."""
    return _CREDENTIALS.sub(r"\1", text)


def openai_api_key(url: str | None, environ: Mapping[str, str]) -> str | None:
    """$OPENAI_API_KEY where `url` is the server the OpenAI SDK would send it to: the one
    $OPENAI_BASE_URL names, or OpenAI's own; else None, whatever the variable holds."""
    key = environ.get("OPENAI_API_KEY") or None
    if key is None or not url:
        return None
    home = [
        _OPENAI_SERVER,
        *([environ["OPENAI_BASE_URL"]] if environ.get("OPENAI_BASE_URL") else []),
    ]
    origin = _origin(url)
    return key if origin is not None and origin in {_origin(place) for place in home} else None


def in_the_clear(url: str) -> bool:
    """Whether what is sent to `url` crosses a network unencrypted: plain http to a host
    other than this machine (127.0.0.0/8, ::1, localhost)."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return False  # never sent: opening the backend says what is wrong with it
    if parsed.scheme != "http":
        return False
    host = parsed.host.lower().rstrip(".")
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: another machine as far as anyone can tell from here


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """Scheme, host and port of `url` (None if it is not one): where a request goes."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return None
    default = {"http": 80, "https": 443}.get(parsed.scheme)
    return parsed.scheme, parsed.host.lower().rstrip("."), parsed.port or default


@dataclass(frozen=True)
class ServerOptions:
    """How to reach an OpenAI-compatible server: every default, and its check."""

    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None  # None: the first model the server lists
    encoding: str = DEFAULT_ENCODING  # tiktoken, where the server cannot tokenize
    timeout: float = 300.0  # seconds a server may take for one call

    def __post_init__(self) -> None:
        if self.timeout <= 0:
            raise UserError("--timeout must be a positive number of seconds.")


class BackendError(UserError):
    """The server could not be reached or refused a request."""


class OpenAIBackend(InTurn):
    """Chat completions from a server; tokens from its tokenize endpoint, else tiktoken.

    Safe to share between threads: every call is one independent HTTP request.
    """

    def __init__(self, options: ServerOptions, note: Note = silent) -> None:
        if not options.base_url:
            raise UserError("--backend openai needs --base-url (or $MEMAGENT_BASE_URL).")
        api_key, served_model, timeout = options.api_key, options.served_model, options.timeout
        encoding = options.encoding
        url = options.base_url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        self._url, self._root = url, url[: -len("/v1")]  # what requests go to
        # What is shown and recorded: without any credentials the URL carries.
        self.base_url, self.server = without_credentials(url), without_credentials(self._root)
        self._timeout = timeout
        self._api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Only what _read_body can decode within its bounds (httpx2's decoders, 1 MiB a go).
        headers["Accept-Encoding"] = "gzip, deflate"
        self._deadline = _Deadline()
        self._client = _deadline_client(
            self._deadline,
            headers=headers,
            timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0)),
        )
        self._retrying = tenacity.Retrying(
            stop=_stop,
            wait=_wait,
            retry=tenacity.retry_if_exception_type(_TRANSIENT)
            | tenacity.retry_if_result(lambda reply: reply.response.status_code in _RETRY_STATUS),
            retry_error_callback=lambda state: state.outcome.result(),  # the last answer
            reraise=True,
        )
        # No retries at first contact: a server that is not there should be said at once.
        served = self._models(self._request(f"{self._url}/models", retry=False))
        if not served and not served_model:
            raise BackendError(f"The server at {self.server} serves no model; pass --served-model.")
        self.served_model = served_model or served[0]["id"]
        self.name = self.served_model
        self.context_limit = self._context_limit(served)
        self._tokenizer = self._find_tokenizer(encoding, note)

    # -- HTTP -------------------------------------------------------------------------
    def _request(
        self,
        url: str,
        body: dict[str, Any] | None = None,
        *,
        retry: bool = True,
        most_bytes: int = MOST_REPLY_BYTES,
    ) -> dict[str, Any]:
        """One JSON request, retried with backoff while the failure looks transient; each
        try over within --timeout, and its reply at most `most_bytes` long."""
        where = url.removeprefix(self._root)

        def send() -> _Reply:
            self._deadline.at = time.monotonic() + self._timeout
            try:
                method = "GET" if body is None else "POST"
                with self._client.stream(method, url, json=body) as response:
                    return _Reply(response, _read_body(response, most_bytes))
            finally:
                self._deadline.at = None

        try:
            reply = self._retrying(send) if retry else send()
        except _TooLong:
            raise BackendError(
                f"The server at {self.server} sent more than {_size(most_bytes)} in reply to "
                f"{where}; memagent reads no further."
            ) from None
        except httpx2.TimeoutException as exc:
            if isinstance(exc, httpx2.ConnectTimeout):
                raise BackendError(
                    f"Cannot reach the server at {self.server}: it did not "
                    "accept the connection; is it running?"
                ) from None
            raise BackendError(
                f"The server at {self.server} did not answer {where} within {self._timeout:g} "
                "seconds (--timeout)."
            ) from None
        except httpx2.DecodingError:
            raise BackendError(
                f"The server at {self.server} sent a compressed reply to {where} that does not "
                "decompress."
            ) from None
        except httpx2.HTTPError as exc:
            tries = f" after {_RETRIES + 1} tries" if retry else ""
            detail = _shortened(without_credentials(str(exc))) or "no answer"
            raise BackendError(
                f"Cannot reach the server at {self.server} ({type(exc).__name__}: "
                f"{detail}){tries}; is it running?"
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
                f"The server at {self.server} answered HTTP {response.status_code} to {where}: "
                f"{detail}{hint}."
            )
        try:
            payload = json.loads(reply.body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python goes
            payload = None
        if not isinstance(payload, dict):
            raise BackendError(
                f"The server at {self.server} did not answer a JSON object at {where}; is "
                "--base-url right?"
            )
        return payload

    def _models(self, listed: dict[str, Any]) -> list[dict[str, Any]]:
        """The models of a /v1/models reply, each an object with a string id, or a sentence."""
        served = listed.get("data")
        if served is None:
            return []
        if not isinstance(served, list) or not all(
            isinstance(model, dict) and isinstance(model.get("id"), str) and model["id"]
            for model in served
        ):
            raise BackendError(
                f"The server at {self.server} answered /v1/models with a list memagent cannot "
                "read (each model needs an id); is --base-url an OpenAI-compatible server?"
            )
        return served

    def _context_limit(self, served: list[dict[str, Any]]) -> int:
        """The served context when the server tells it (vLLM's max_model_len, llama-server's
        n_ctx); otherwise unknown, and the server itself reports a step too long."""
        for model in served:
            if model["id"] == self.served_model and _whole(model.get("max_model_len")):
                return model["max_model_len"]
        try:
            props = self._request(f"{self._root}/props", retry=False)
        except BackendError:
            return _UNKNOWN_CONTEXT
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return n_ctx if _whole(n_ctx) else _UNKNOWN_CONTEXT

    # -- tokens -----------------------------------------------------------------------
    def _find_tokenizer(self, encoding: str, note: Note) -> _Tokenizer:
        for candidate in (_LlamaServerTokenizer, _VllmTokenizer, _LlamaCppPythonTokenizer):
            tokenizer = candidate(self)
            try:
                tokenizer.probe()
            except BackendError:
                continue
            return tokenizer
        note(
            "The server has no tokenize endpoint: chunks are cut with tiktoken "
            f"{encoding}, so their sizes in the model's tokens are approximate."
        )
        return TiktokenTokenizer(encoding)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._tokenizer.detokenize(tokens)

    def chat_overhead(self) -> int:
        return 16  # a typical chat template's wrapping; the server enforces the real limit

    def describe(self) -> Description:
        return Description(
            model={"path": self.base_url, "name": self.served_model, "size": None},
            engine={"backend": "openai"},
        )

    def sequences_that_fit(self, context_tokens: int) -> int:
        return 1  # several calls at once are --parallel's threads

    def prepare(
        self, context_tokens: int, sequences: int = 1, progress: Progress | None = None
    ) -> None:
        return None  # the server sizes its own context and slots

    # -- generation -------------------------------------------------------------------
    def generate(self, message: str, *, max_tokens: int, sampling: Sampling) -> Generation:
        body: dict[str, Any] = {
            "model": self.served_model,
            "messages": [{"role": "user", "content": message}],
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            # The paper sampled with vLLM's defaults; servers that know these fields
            # (llama.cpp, vLLM) would otherwise add top-k, min-p or a repeat penalty.
            "top_k": 0,  # 0 turns top-k off for llama.cpp, vLLM and llama-cpp-python
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "repetition_penalty": 1.0,
            "stream": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        start = time.perf_counter()
        reply = self._request(f"{self._url}/chat/completions", body)
        seconds = time.perf_counter() - start
        choices = reply.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        text = message.get("content") if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(text, str | None):
            raise BackendError(
                f"The server at {self.server} sent a completion without a message's text."
            )
        assert isinstance(choice, dict)
        usage = reply.get("usage") or {}
        timings = reply.get("timings") or {}  # llama-server reports its own split
        finish_reason = choice.get("finish_reason") or "stop"
        prompt_tokens: Any = None
        completion_tokens: Any = None
        prompt_ms: Any = None
        if isinstance(usage, dict) and isinstance(timings, dict):
            prompt_tokens = usage.get("prompt_tokens") or 0
            completion_tokens = usage.get("completion_tokens") or 0
            prompt_ms = timings.get("prompt_ms") or 0
        if not (
            _count(prompt_tokens)
            and _count(completion_tokens)
            and _number(prompt_ms)
            and isinstance(finish_reason, str)
        ):
            raise BackendError(
                f"The server at {self.server} sent a completion whose usage, timings or "
                "finish_reason are not of the types OpenAI's API gives them."
            )
        return Generation(
            text=text or "",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            prompt_seconds=min(prompt_ms / 1000, seconds),
            seconds=seconds,
            finish_reason=finish_reason,
        )


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
    """Other failures stop after _RETRIES retries; a busy server that says when to come back
    is waited for until _MOST_BUSY_WAIT seconds have been spent waiting on this call."""
    asked = _busy_wait(state)
    if asked is None:
        return state.attempt_number >= _RETRIES + 1
    return state.idle_for + asked > _MOST_BUSY_WAIT


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


def _shortened(text: str) -> str:
    """`text` on one line and at most _MOST_ERROR_CHARS long: a server's error text can be a
    page of HTML or a stack trace."""
    line = " ".join(text.split())
    if len(line) <= _MOST_ERROR_CHARS:
        return line
    return line[: _MOST_ERROR_CHARS - 1].rstrip() + "…"


def _size(count: int) -> str:
    """A byte count as people read it: 64 MiB."""
    return f"{count / (1 << 20):g} MiB" if count >= 1 << 20 else f"{count:,} bytes"


def _count(value: object) -> bool:
    """Whether `value` is a whole number >= 0 as JSON gives one (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _whole(value: object) -> bool:
    """Whether `value` is a whole number > 0 as JSON gives one."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: object) -> bool:
    """Whether `value` is a count or a duration as JSON gives one: a finite number >= 0."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < math.inf


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


class _Deadline(threading.local):
    """When the request under way in this thread must be over (time.monotonic()), if any."""

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
    """A connection whose every read and write ends by the deadline of its request."""

    def __init__(self, stream: httpcore2.NetworkStream, deadline: _Deadline) -> None:
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
    """httpcore's sockets with a deadline: its own timeouts bound each read, so a server
    that trickles a byte at a time would otherwise never time out."""

    def __init__(self, network: httpcore2.NetworkBackend, deadline: _Deadline) -> None:
        self._network, self._deadline = network, deadline

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


def _deadline_client(deadline: _Deadline, **options: Any) -> httpx2.Client:
    """An httpx2 client whose connections (direct, or through a proxy from the environment)
    keep `deadline`. httpx2 has no option for the network its pools use, so it is set on
    them: a change there fails tests/test_server_replies.py, not silently."""
    client = httpx2.Client(**options)
    for transport in (client._transport, *client._mounts.values()):
        if transport is None:  # a host that no_proxy sends direct: the default transport
            continue
        pool = transport._pool  # type: ignore[attr-defined]
        pool._network_backend = _DeadlineNetwork(pool._network_backend, deadline)
    return client


class _Tokenizer:
    """One server's tokenize/detokenize endpoints, with any BOS it adds stripped."""

    tokenize_path = detokenize_path = ""

    def __init__(self, backend: OpenAIBackend) -> None:
        self._backend = backend
        self._prefix: list[int] | None = None

    def _call(
        self, path: str, body: dict[str, Any], retry: bool = True, most_bytes: int = 0
    ) -> dict[str, Any]:
        url = f"{self._backend._root}{path}"
        most_bytes += MOST_REPLY_BYTES
        return self._backend._request(url, body, retry=retry, most_bytes=most_bytes)

    def probe(self) -> None:
        """Fails unless this server has these endpoints."""
        self._tokens("a", retry=False)

    def tokenize(self, text: str) -> list[int]:
        if self._prefix is None:
            self._prefix = []  # what the server adds to empty text, e.g. a BOS token
            self._prefix = self._tokens("")
        tokens = self._tokens(text)
        prefix = self._prefix
        return tokens[len(prefix) :] if prefix and tokens[: len(prefix)] == prefix else tokens

    def _tokens(self, text: str, retry: bool = True) -> list[int]:
        body = self._tokenize_body(text)
        most = _TOKEN_BYTES * len(text.encode("utf-8"))  # a long text has a long answer
        raw = self._call(self.tokenize_path, body, retry, most).get("tokens")
        ids = (
            [t.get("id") if isinstance(t, dict) else t for t in raw]
            if isinstance(raw, list)
            else []
        )
        if not isinstance(raw, list) or not all(_count(i) for i in ids):
            raise BackendError(
                f"The server at {self._backend.server} answered {self.tokenize_path} without "
                "a list of token ids."
            )
        return ids

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        reply = self._call(self.detokenize_path, self._detokenize_body(list(tokens)))
        text = reply.get("content", reply.get("prompt", reply.get("text", "")))
        if not isinstance(text, str):
            raise BackendError(
                f"The server at {self._backend.server} answered {self.detokenize_path} "
                "without the text of the tokens."
            )
        return text.encode("utf-8")

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"tokens": tokens}


class _LlamaServerTokenizer(_Tokenizer):
    tokenize_path, detokenize_path = "/tokenize", "/detokenize"

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": False}


class _VllmTokenizer(_Tokenizer):
    tokenize_path, detokenize_path = "/tokenize", "/detokenize"

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        return {"model": self._backend.served_model, "prompt": text, "add_special_tokens": False}

    def _detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"model": self._backend.served_model, "tokens": tokens}


class _LlamaCppPythonTokenizer(_Tokenizer):
    tokenize_path, detokenize_path = "/extras/tokenize", "/extras/detokenize"

    def _tokenize_body(self, text: str) -> dict[str, Any]:
        return {"input": text, "model": self._backend.served_model}

    def _detokenize_body(self, tokens: list[int]) -> dict[str, Any]:
        return {"tokens": tokens, "model": self._backend.served_model}
