"""An OpenAI-compatible server (llama.cpp's llama-server, vLLM, SGLang, Ollama, or
llama-cpp-python's server): the same protocol over `/v1/chat/completions`."""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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


def without_credentials(text: str) -> str:
    """`text` (a URL, or a message that quotes one) with every URL's user:password@ left
    out, as a trace, --json, an HTML report or an error may show it."""
    return _CREDENTIALS.sub(r"\1", text)


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
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx2.Client(
            headers=headers, timeout=httpx2.Timeout(timeout, connect=min(timeout, 10.0))
        )
        self._retrying = tenacity.Retrying(
            stop=_stop,
            wait=_wait,
            retry=tenacity.retry_if_exception_type(_TRANSIENT)
            | tenacity.retry_if_result(lambda response: response.status_code in _RETRY_STATUS),
            retry_error_callback=lambda state: state.outcome.result(),  # the last answer
            reraise=True,
        )
        # No retries at first contact: a server that is not there should be said at once.
        served = self._request(f"{self._url}/models", retry=False).get("data") or []
        if not served and not served_model:
            raise BackendError(f"The server at {self.server} serves no model; pass --served-model.")
        self.served_model = served_model or str(served[0]["id"])
        self.name = self.served_model
        self.context_limit = self._context_limit(served)
        self._tokenizer = self._find_tokenizer(encoding, note)

    # -- HTTP -------------------------------------------------------------------------
    def _request(
        self, url: str, body: dict[str, Any] | None = None, *, retry: bool = True
    ) -> dict[str, Any]:
        """One JSON request, retried with backoff while the failure looks transient."""
        where = url.removeprefix(self._root)

        def send() -> httpx2.Response:
            if body is None:
                return self._client.get(url)
            return self._client.post(url, json=body)

        try:
            response = self._retrying(send) if retry else send()
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
        except httpx2.HTTPError as exc:
            tries = f" after {_RETRIES + 1} tries" if retry else ""
            detail = without_credentials(str(exc)) or "no answer"
            raise BackendError(
                f"Cannot reach the server at {self.server} ({type(exc).__name__}: "
                f"{detail}){tries}; is it running?"
            ) from None
        if response.is_error:
            raise BackendError(
                f"The server at {self.server} answered HTTP {response.status_code} to {where}: "
                f"{without_credentials(_error_detail(response))}."
            )
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise BackendError(
                f"The server at {self.server} did not answer a JSON object at {where}; is "
                "--base-url right?"
            )
        return payload

    def _context_limit(self, served: list[dict[str, Any]]) -> int:
        """The served context when the server tells it (vLLM's max_model_len, llama-server's
        n_ctx); otherwise unknown, and the server itself reports a step too long."""
        for model in served:
            if model.get("id") == self.served_model and model.get("max_model_len"):
                return int(model["max_model_len"])
        try:
            props = self._request(f"{self._root}/props", retry=False)
            n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
            return int(n_ctx) if n_ctx else _UNKNOWN_CONTEXT
        except BackendError:
            return _UNKNOWN_CONTEXT

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
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise BackendError(
                f"The server at {self.server} sent a reply without a message."
            ) from None
        usage = reply.get("usage") or {}
        timings = reply.get("timings") or {}  # llama-server reports its own split
        prompt_seconds = (timings.get("prompt_ms") or 0.0) / 1000
        return Generation(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            prompt_seconds=min(prompt_seconds, seconds),
            seconds=seconds,
            finish_reason=choice.get("finish_reason") or "stop",
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
    return retry_after(outcome.result())


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


def _error_detail(response: httpx2.Response) -> str:
    try:
        payload = response.json()
    except ValueError:
        return response.reason_phrase or "error"
    error = payload.get("error", payload.get("detail")) if isinstance(payload, dict) else None
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error or response.reason_phrase).strip().rstrip(".") or "error"


class _Tokenizer:
    """One server's tokenize/detokenize endpoints, with any BOS it adds stripped."""

    tokenize_path = detokenize_path = ""

    def __init__(self, backend: OpenAIBackend) -> None:
        self._backend = backend
        self._prefix: list[int] | None = None

    def _call(self, path: str, body: dict[str, Any], retry: bool = True) -> dict[str, Any]:
        return self._backend._request(f"{self._backend._root}{path}", body, retry=retry)

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
        raw = self._call(self.tokenize_path, self._tokenize_body(text), retry).get("tokens")
        if not isinstance(raw, list):
            raise BackendError("no tokens")
        return [t["id"] if isinstance(t, dict) else int(t) for t in raw]

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        reply = self._call(self.detokenize_path, self._detokenize_body(list(tokens)))
        text = reply.get("content", reply.get("prompt", reply.get("text", "")))
        return str(text).encode("utf-8")

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
