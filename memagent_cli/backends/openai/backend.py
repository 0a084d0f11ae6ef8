"""The Backend of an OpenAI-compatible server: the model it serves, its context, and chat
completions with the paper's sampling."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memagent_cli.backend import Description, Generation, InTurn, Raw, Sampling
from memagent_cli.backends.openai.client import (
    DISCOVERY_SECONDS,
    SHORT_REPLY_BYTES,
    BackendError,
    Client,
    is_count,
    is_number,
    is_whole,
)
from memagent_cli.backends.openai.tokens import find_tokenizer
from memagent_cli.backends.openai.urls import without_credentials
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.errors import UserError
from memagent_cli.progress import Note, Progress, silent

_UNKNOWN_CONTEXT = 10**9
# How chat control tokens are spelled: ChatML's <|im_end|>, Llama's <|eot_id|>, and the like.
_CONTROL = re.compile(r"<\|[A-Za-z_][\w.-]*\|>")
_BYTES_PER_TOKEN = 256  # of a completion's reply, for each token it may hold
# A prompt cut to a context: how a server that read less than it was sent is told from one
# whose tokenizer counts fewer tokens than tiktoken (see _check_read).
_FAR_BELOW = 0.5  # of tiktoken's count: below it, a cut whatever the count
_BELOW_CONTEXT = 0.85  # of tiktoken's count: a context's size below it is a cut


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


class OpenAIBackend(InTurn):
    """Chat completions from a server; tokens from its tokenize endpoint, else tiktoken.

    Safe to share between threads: every call is one independent HTTP request.
    """

    def __init__(self, options: ServerOptions, note: Note = silent) -> None:
        if not options.base_url:
            raise UserError("--backend openai needs --base-url (or $MEMAGENT_BASE_URL).")
        url = options.base_url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        self._client = Client(url[: -len("/v1")], api_key=options.api_key, timeout=options.timeout)
        # What is shown and recorded: without any credentials the URL carries.
        self.base_url, self.server = without_credentials(url), self._client.server
        # No retries at first contact: a server that is not there should be said at once.
        served = self._models(
            self._client.request("/v1/models", retry=False, seconds=DISCOVERY_SECONDS)
        )
        if not served and not options.served_model:
            raise BackendError(f"The server at {self.server} serves no model; pass --served-model.")
        self.served_model = options.served_model or served[0]["id"]
        self.name = self.served_model
        self.context_limit = self._context_limit(served)
        self._tokenizer = find_tokenizer(self._client, self.served_model, options.encoding, note)

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
            if model["id"] == self.served_model and is_whole(model.get("max_model_len")):
                return model["max_model_len"]
        try:
            props = self._client.request("/props", retry=False, seconds=DISCOVERY_SECONDS)
        except BackendError:
            return _UNKNOWN_CONTEXT
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return n_ctx if is_whole(n_ctx) else _UNKNOWN_CONTEXT

    # -- tokens -----------------------------------------------------------------------
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
        messages = [{"role": "user", "content": message}]
        return self._completion(
            "/v1/chat/completions", {"messages": messages}, max_tokens, sampling
        )

    def complete(self, raw: Raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        """Continue a prompt a reader wrote whole (readers/infmem.py), as its authors send
        it: the text to `/v1/completions`, where the server applies no chat template. A
        server reads markup in that text as markup, so a text piece that spells a chat
        control token (a document's `<|im_end|>`) is refused, never sent, nor changed."""
        for text, markup in raw:
            if not markup and (spelled := _CONTROL.search(text)):
                raise UserError(
                    f"The text to read spells the chat markup {spelled.group(0)}, which a "
                    "server would take as markup; read it with llama.cpp in this process."
                )
        prompt = "".join(text for text, _ in raw)
        return self._completion("/v1/completions", {"prompt": prompt}, max_tokens, sampling)

    def _completion(
        self, path: str, prompt: dict[str, Any], max_tokens: int, sampling: Sampling
    ) -> Generation:
        body: dict[str, Any] = {
            "model": self.served_model,
            **prompt,
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
        # Far above a real reply's size: its text, escaped, and its reasoning, if any.
        most_bytes = SHORT_REPLY_BYTES + _BYTES_PER_TOKEN * max_tokens
        reply = self._client.request(path, body, most_bytes=most_bytes)
        seconds = time.perf_counter() - start
        choices = reply.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if "prompt" in prompt and isinstance(choice, dict):  # a completion: its text is the reply
            message = {"content": choice.get("text")}
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
            is_count(prompt_tokens)
            and is_count(completion_tokens)
            and is_number(prompt_ms)
            and isinstance(finish_reason, str)
        ):
            raise BackendError(
                f"The server at {self.server} sent a completion whose usage, timings or "
                "finish_reason are not of the types OpenAI's API gives them."
            )
        sent = prompt.get("prompt") or "".join(m["content"] for m in prompt["messages"])
        self._check_read(sent, prompt_tokens)
        return Generation(
            text=text or "",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            prompt_seconds=min(prompt_ms / 1000, seconds),
            seconds=seconds,
            finish_reason=finish_reason,
        )

    def _check_read(self, sent: str, read: int) -> None:
        """Stops when the server reports having read a prompt cut to a context smaller than
        it: Ollama cuts a longer prompt to num_ctx and reports num_ctx as its prompt_tokens
        (its log says "truncating input prompt"), where llama-server and vLLM refuse it.

        Checked where the server has no tokenize endpoint (Ollama's case), so what was sent
        is known only by tiktoken's count. A chat template only adds tokens, and a model's
        tokenizer counts within tens of percent of tiktoken (Qwen's and Llama 3's within a
        few percent on English; fewer on scripts tiktoken splits finely). So a cut is:
        - a count below half of tiktoken's, whatever it is; or
        - a count that is a context's size, a power of two from 1,024 (Ollama's defaults
          2,048 and 4,096, and what users set), below 85% of tiktoken's. Ollama's default
          4,096 against the first step of the default settings (about 5,150 tokens) is
          0.8. An honest server meets this only where its tokenizer counts 15% fewer
          tokens than tiktoken and the prompt is exactly 1,024, 2,048, 4,096... tokens.
        Servers with a tokenize endpoint (llama-server, vLLM, llama-cpp-python's) refuse a
        prompt longer than their context, so nothing is checked there; nor where the server
        reports no usage (read is 0)."""
        if read <= 0 or not isinstance(self._tokenizer, TiktokenTokenizer):
            return
        about = len(self._tokenizer.tokenize(sent))
        a_context = read >= 1024 and read & (read - 1) == 0
        if read < _FAR_BELOW * about or (a_context and read < _BELOW_CONTEXT * about):
            shown = round(about, -2) if about >= 1000 else about
            raise BackendError(
                f"The server read {read:,} of the prompt's about {shown:,} tokens: its context "
                "is smaller than one step; give it a larger context (Ollama: num_ctx, or "
                "OLLAMA_CONTEXT_LENGTH) or lower --chunk-tokens."
            )
