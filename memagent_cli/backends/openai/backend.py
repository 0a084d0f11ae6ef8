"""The Backend of an OpenAI-compatible server: the model it serves, its context, and chat
completions with the paper's sampling."""

from __future__ import annotations

import functools
import struct
import threading
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memagent_cli import gguf_header
from memagent_cli.backend import Description, Generation, InTurn, Raw, Sampling
from memagent_cli.backends.openai.client import (
    DISCOVERY_SECONDS,
    SHORT_REPLY_BYTES,
    BackendError,
    Client,
)
from memagent_cli.backends.openai.markup import Markup
from memagent_cli.backends.openai.tokens import find_tokenizer
from memagent_cli.backends.openai.urls import without_credentials
from memagent_cli.backends.tokenizers import DEFAULT_ENCODING, TiktokenTokenizer
from memagent_cli.chunking import NORMALIZATIONS, detokenize_all, token_pieces
from memagent_cli.errors import UserError
from memagent_cli.progress import Note, Progress, silent
from memagent_cli.text import json_count, json_number

_UNKNOWN_CONTEXT = 10**9
_BYTES_PER_TOKEN = 256  # of a completion's reply, for each token it may hold
# A prompt cut to a context (see _check_read): a count below this share of tiktoken's is
# worth a second look; tokenizers differ from tiktoken by tens of percent, more on CJK.
_SUSPECT_BELOW = 0.85
_PROBE_MORE = 64  # tokens more than the suspect count, in the probe that tells a cut
# Qwen2's vocabulary (Qwen2's, Qwen2.5's and Qwen3's, and their finetunes': memagent-7b,
# ReMemR1, InfMem's) splits this text into these tokens, each digit one (its pre-tokenizer,
# llama.cpp's "qwen2": Llama 3's groups digits by three): measured with the Qwen2.5 GGUF of
# tests/support/qwen_material.py. No other family's vocabulary gives these ids.
_QWEN2_SAMPLE = "Hello world, 2026: 中文 café"
_QWEN2_TOKENS = [9707, 1879, 11, 220, 17, 15, 17, 21, 25, 72858, 16744, 51950]
_QWEN_CHAT = "<|im_start|>"  # Qwen's chat templates' (ChatML) turn marker


# About 11 days: past 2**31 seconds socket waits overflow (a spurious timeout at once), and
# past about 1e10 the deadline's clock does (OverflowError). Longer is "never" in practice.
MOST_TIMEOUT = 1e6


@dataclass(frozen=True)
class ServerOptions:
    """How to reach an OpenAI-compatible server: every default, and its check."""

    base_url: str | None = None
    api_key: str | None = None
    served_model: str | None = None  # None: the first model the server lists
    encoding: str = DEFAULT_ENCODING  # tiktoken, where the server cannot tokenize
    timeout: float = 300.0  # seconds a server may take for one call

    def __post_init__(self) -> None:
        if not 0 < self.timeout <= MOST_TIMEOUT:
            raise UserError(
                f"--timeout must be a positive number of seconds, at most {MOST_TIMEOUT:g}."
            )


class OpenAIBackend(InTurn):
    """Chat completions from a server; tokens from its tokenize endpoint, else tiktoken.

    Safe to share between threads: every call is one independent HTTP request.
    """

    threaded = True  # readings at once are calls in flight, each answered on its own

    def __init__(
        self,
        options: ServerOptions,
        note: Note = silent,
        *,
        discovery_seconds: float = DISCOVERY_SECONDS,
    ) -> None:
        """`discovery_seconds` bounds each call of first contact (client.py)."""
        if not options.base_url:
            raise UserError("--backend openai needs --base-url (or $MEMAGENT_BASE_URL).")
        url = options.base_url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        self._client = Client(
            url[: -len("/v1")],
            api_key=options.api_key,
            timeout=options.timeout,
            discovery_seconds=discovery_seconds,
        )
        # What is shown and recorded: without any credentials the URL carries.
        self.base_url, self.server = without_credentials(url), self._client.server
        # No retries at first contact: a server that is not there should be said at once.
        served = self._models(
            self._client.request("/v1/models", retry=False, seconds=self._client.discovery_seconds)
        )
        if not served and not options.served_model:
            raise BackendError(f"The server at {self.server} serves no model; pass --served-model.")
        self.served_model = options.served_model or served[0]["id"]
        self._server_props: dict[str, Any] | None = None
        self.name = self.served_model
        self.context_limit = self._context_limit(served)
        self._note, self._inexact_said = note, False
        self._tokenizer = find_tokenizer(self._client, self.served_model, options.encoding, note)
        self._pieces = token_pieces(self._tokenizer)
        self._markup = Markup(self._props, getattr(self._tokenizer, "reads_markup", None))
        self._most_read = 0  # the most prompt tokens this server said it read, probes included
        self._most_read_lock = threading.Lock()

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
            if model["id"] == self.served_model and _positive(model.get("max_model_len")):
                return model["max_model_len"]
        settings = self._props().get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return n_ctx if _positive(n_ctx) else _UNKNOWN_CONTEXT

    # -- tokens -----------------------------------------------------------------------
    @functools.cached_property
    def normalization(self) -> str | None:
        """The Unicode normalization the served model's own tokenizer applies before it
        splits (NFC for Qwen's), which memagent applies to every text it tokenizes or
        sends, as in this process. Where the server names its model's file (llama-server's
        /props, llama-cpp-python's model id) and it is on this machine, the file's
        pre-tokenizer says; else where the server's tokenizer composes text itself (a
        Hugging Face tokenizer, as vLLM's), NFC; else where it splits a sample into Qwen2's
        tokens (a llama.cpp server on another machine serving a Qwen model: no endpoint
        names its pre-tokenizer) and its chat template, if it gives one, is Qwen's ChatML,
        NFC, as the GGUF's pre-tokenizer would say; else none: the text goes as extracted."""
        props = self._props()
        for path in (props.get("model_path"), self.served_model):
            pre = _pre_tokenizer(path)
            if pre is not None:
                return NORMALIZATIONS.get(pre)
        if isinstance(self._tokenizer, TiktokenTokenizer):
            return None
        sample = "Việt, Ångström, été"
        decomposed = unicodedata.normalize("NFD", sample)
        template = props.get("chat_template")
        try:
            if self._tokenizer.tokenize(decomposed) == self._tokenizer.tokenize(sample):
                return "NFC"
            qwen = self._tokenizer.tokenize(_QWEN2_SAMPLE) == _QWEN2_TOKENS
        except BackendError:
            return None
        chatml = not isinstance(template, str) or not template or _QWEN_CHAT in template
        return "NFC" if qwen and chatml else None

    def _props(self) -> dict[str, Any]:
        """llama-server's /props, asked once; empty where the server has none."""
        if self._server_props is None:
            try:
                self._server_props = self._client.request(
                    "/props", retry=False, seconds=self._client.discovery_seconds
                )
            except BackendError:
                self._server_props = {}
        return self._server_props

    def _normal(self, text: str) -> str:
        """`text` as the model's own tokenizer normalizes it before splitting."""
        form = self.normalization
        if form is None or unicodedata.is_normalized(form, text):
            return text
        return unicodedata.normalize(form, text)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.tokenize(self._normal(text))

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self._tokenizer.detokenize(tokens)

    def inexact_ranges(self) -> None:
        """Said once, where a document's chunks cannot be placed exactly in its characters
        (chunking.make_chunks): the server's decoding of a window that cuts a character is
        not its bytes decoded (a Hugging Face tokenizer that cleans up spaces, as Llama 3's
        does), and the server gives no token's bytes (llama-server's with_pieces, vLLM's
        token strings)."""
        if not self._inexact_said:
            self._inexact_said = True
            self._note(
                f"The server at {self.server} gives no token's bytes, and its text of a chunk "
                "that cuts a character is not their bytes decoded: the chunks' character "
                "ranges after such a cut may be off by a character or two."
            )

    def detokenize_many(self, windows: Sequence[Sequence[int]]) -> list[bytes]:
        """Each window's bytes, as detokenize() gives them, in few requests (InfMem's units:
        none where the tokens came with their bytes, else many windows a request)."""
        return detokenize_all(self._tokenizer, windows)

    def pieces(self, text: str) -> list[bytes]:
        """Each token's bytes of `text` (what ReMemR1's recall counts): one request where
        the server gives them (llama-server), else each token not seen before detokenized
        on its own, once."""
        return self._pieces(self._normal(text))

    def markup(self, text: str) -> str | None:
        """The first spelling in `text` of one of the served model's chat control tokens,
        which the server reads as markup in a prompt, not as text (markup.Markup); None."""
        return self._markup.first(text)

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
        messages = [{"role": "user", "content": self._normal(message)}]
        return self._completion(
            "/v1/chat/completions", {"messages": messages}, max_tokens, sampling
        )

    def complete(self, raw: Raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        """Continue a prompt a reader wrote whole (readers/infmem.py), as its authors send
        it: the text to `/v1/completions`, where the server applies no chat template. A
        server reads markup in that text as markup, so a text piece that spells a chat
        control token (a document's `<|im_end|>`, the model's own: markup.Markup) is
        refused, never sent, nor changed. A document is looked at before the first call
        (run/session.py); a question or a memory is looked at here."""
        for text, markup in raw:
            if not markup and (spelled := self._markup.first(text)):
                raise UserError(
                    f"The text to read spells the chat markup {spelled}, which a server "
                    "would take as markup; read it with llama.cpp in this process."
                )
        prompt = self._normal("".join(text for text, _ in raw))
        return self._completion("/v1/completions", {"prompt": prompt}, max_tokens, sampling)

    def _completion(
        self,
        path: str,
        prompt: dict[str, Any],
        max_tokens: int,
        sampling: Sampling,
        check: bool = True,
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
            json_count(prompt_tokens)
            and json_count(completion_tokens)
            and json_number(prompt_ms)
            and isinstance(finish_reason, str)
        ):
            raise BackendError(
                f"The server at {self.server} sent a completion whose usage, timings or "
                "finish_reason are not of the types OpenAI's API gives them."
            )
        if check:
            self._check_read(path, prompt, prompt_tokens)
        return Generation(
            text=text or "",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            prompt_seconds=min(prompt_ms / 1000, seconds),
            seconds=seconds,
            finish_reason=finish_reason,
        )

    def _check_read(self, path: str, prompt: dict[str, Any], read: int) -> None:
        """Stops when the server reports having read a prompt cut to a context smaller than
        it: Ollama cuts a longer prompt to num_ctx, reads on, and reports num_ctx as its
        prompt_tokens (its log says "truncating input prompt"), where llama-server, vLLM and
        llama-cpp-python's server refuse it. Those have tokenize endpoints, and are not
        checked; Ollama has none, so what was sent is known only by tiktoken's count.

        A count alone cannot tell a cut: a chat template only adds tokens, but a model's
        tokenizer may count tens of percent fewer than tiktoken (far fewer on a script it
        has many tokens for), and no size a server reports is safe to call a context's. So
        a count under 85% of tiktoken's is only a suspect, and only while it is the most
        the server has said it read (a cut reports its context, the most it can read). A
        suspect is told by one more call: a prompt of the suspect count and 64 more
        " the", one token each in any tokenizer, with a reply of one token. A server that
        cuts reports no more than the suspect count again, and memagent stops; one that
        reads it whole has shown it reads more, and is not asked again below that. A
        probe the server refuses tells nothing, and is taken as no cut. No usage
        reported (read is 0): nothing is checked."""
        if read <= 0 or not isinstance(self._tokenizer, TiktokenTokenizer):
            return
        with self._most_read_lock:
            most, self._most_read = self._most_read, max(self._most_read, read)
        sent = prompt.get("prompt") or "".join(m["content"] for m in prompt["messages"])
        if read < most or read >= _SUSPECT_BELOW * len(self._tokenizer.tokenize(sent)):
            return
        longer = "the" + " the" * (read + _PROBE_MORE - 1)
        probe = (
            {"prompt": longer}
            if "prompt" in prompt
            else {"messages": [{"role": "user", "content": longer}]}
        )
        try:
            probed = self._completion(path, probe, 1, Sampling(temperature=0.0), check=False)
        except BackendError:
            return
        with self._most_read_lock:
            self._most_read = max(self._most_read, probed.prompt_tokens)
        if 0 < probed.prompt_tokens <= read:
            about = len(self._tokenizer.tokenize(sent))
            shown = round(about, -2) if about >= 1000 else about
            raise BackendError(
                f"The server read {read:,} of the prompt's about {shown:,} tokens: its context "
                "is smaller than one step; give it a larger context (Ollama: num_ctx, or "
                "OLLAMA_CONTEXT_LENGTH) or lower --chunk-tokens."
            )


def _pre_tokenizer(path: object) -> str | None:
    """The pre-tokenizer (tokenizer.ggml.pre) of the GGUF file at `path` on this machine;
    None where there is none to read."""
    if not isinstance(path, str) or not path.lower().endswith(".gguf"):
        return None
    try:
        if not Path(path).is_file():
            return None
        pre = gguf_header.read(Path(path)).fields.get("tokenizer.ggml.pre")
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
    return pre if isinstance(pre, str) else ""


def _positive(value: object) -> bool:
    """Whether a server's context length is one: a whole number above 0."""
    return json_count(value) and value > 0  # type: ignore[operator]
