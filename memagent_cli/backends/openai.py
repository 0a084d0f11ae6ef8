"""An OpenAI-compatible server (llama.cpp's llama-server, vLLM, SGLang, Ollama, or
llama-cpp-python's server): the same protocol over `/v1/chat/completions`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from memagent_cli.backends import Generation, Sampling
from memagent_cli.errors import UserError

# Transient failures are retried after these pauses (seconds), then reported.
_BACKOFF = (1.0, 2.0, 4.0, 8.0)
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_UNKNOWN_CONTEXT = 10**9


class BackendError(UserError):
    """The server could not be reached or refused a request."""


class OpenAIBackend:
    """Chat completions from a server; tokens from its tokenize endpoint, else tiktoken.

    Safe to share between threads: every call is one independent HTTP request.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        served_model: str | None = None,
        encoding: str = "cl100k_base",
        timeout: float = 600.0,
        note: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self._root = self.base_url[: -len("/v1")]
        self._api_key = api_key
        self._timeout = timeout
        # No retries at first contact: a server that is not there should be said at once.
        served = self._request(f"{self.base_url}/models", retry=False).get("data") or []
        if not served and not served_model:
            raise BackendError(f"The server at {self._root} serves no model; pass --served-model.")
        self.served_model = served_model or str(served[0]["id"])
        self.name = self.served_model
        self.path = f"{self.base_url} ({self.served_model})"
        self.threads = 0
        self.gpu_layers = 0
        self.context_limit = self._context_limit(served)
        self._tokenizer = self._find_tokenizer(encoding, note)

    # -- HTTP -------------------------------------------------------------------------
    def _request(
        self, url: str, body: dict[str, Any] | None = None, *, retry: bool = True
    ) -> dict[str, Any]:
        """One JSON request, retried with backoff while the failure looks transient."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        for attempt, pause in enumerate((*_BACKOFF, None) if retry else (None,)):
            request = urllib.request.Request(url, data=data, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self._timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code not in _RETRY_STATUS or pause is None:
                    raise BackendError(
                        f"The server at {self._root} answered HTTP {exc.code} to "
                        f"{url.removeprefix(self._root)}: {detail}."
                    ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                if pause is None:
                    raise BackendError(
                        f"Cannot reach the server at {self._root} ({reason}) after "
                        f"{attempt + 1} tries; is it running?"
                    ) from None
            except json.JSONDecodeError:
                raise BackendError(
                    f"The server at {self._root} did not answer JSON at "
                    f"{url.removeprefix(self._root)}; is --base-url right?"
                ) from None
            time.sleep(pause)  # transient: wait and try again
        raise AssertionError("unreachable")

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
    def _find_tokenizer(self, encoding: str, note: Callable[[str], None]) -> _Tokenizer:
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
        return _TiktokenTokenizer(encoding)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._tokenizer.detokenize(tokens)

    def chat_overhead(self) -> int:
        return 16  # a typical chat template's wrapping; the server enforces the real limit

    def prepare(self, context_tokens: int) -> None:
        return None

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
        reply = self._request(f"{self.base_url}/chat/completions", body)
        seconds = time.perf_counter() - start
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise BackendError(
                f"The server at {self._root} sent a reply without a message."
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


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason or "error"
    error = payload.get("error", payload.get("detail", exc.reason))
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error).strip().rstrip(".") or "error"


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


class _TiktokenTokenizer:
    def __init__(self, name: str) -> None:
        from memagent_cli import tokenizers

        self._encoding = tokenizers.encoding(name)

    def tokenize(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._encoding.decode_bytes(list(tokens))
