"""An OpenAI-compatible server on 127.0.0.1 with a deterministic stand-in for a model, so that
`memagent ask --backend openai` runs end to end with no GGUF and no llama.cpp.

The stand-in follows the MemAgent protocol's shape: an update keeps the last words of the
memory and adds the first words of the section; a final reply boxes the memory's first word.
It has no tokenize endpoint unless told to (`tokenizer`: llama-server's /tokenize, with
its `with_pieces` and `parse_special`, and /detokenize, one token per byte and one per
`control` token spelled; `vllm_tokenizer`: vLLM's /tokenize and /detokenize on the same
vocabulary, its `return_token_strs` answered as a byte-level BPE's token strings where
`token_strs`; `sglang_tokenizer`: SGLang's, the same paths with vLLM's request shape, also
under /v1, a reply's text under `text`, control tokens left out as its `skip_special_tokens`
default does, and lists of windows answered in one; `extras_tokenizer`: llama-cpp-python's
/extras/tokenize
and /extras/detokenize, a token per run of a character, and the text of a token longer
than 32 bytes dropped as its 0.3.36 drops it), so memagent cuts chunks with tiktoken
(offline); the usage
it reports counts a prompt's tokens as tiktoken's cl100k_base does (or a word a token,
`count_words`: a tokenizer that counts far fewer on text of few spaces; `composes`: one
that composes Unicode first; `vocabulary`: a GGUF's, llama.cpp's tokens instead of bytes).
With a `chat_template` or a `model_path` it answers /props
with them, as llama-server does. A test may give
the stand-in model's chat `reply`, and reads every POST's path in `paths`. The server
can be told to take a fixed time per call with a number of slots (calls answered at once,
the others waiting), to turn calls away as busy (429 with Retry-After), to fail with 503,
to stop answering after a number of calls, to hold the
calls after a number until the test releases them (a run that cannot end before a signal),
to want an API key, to answer a path with any bytes at any pace (`Raw`: a hostile or
broken server), or to cut every prompt to a context and report only what it read
(`cut_to`: Ollama with a num_ctx smaller than the prompt).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memagent_cli.backends.tokenizers import TiktokenTokenizer

MODEL = "fake-memagent"
_TIKTOKEN = TiktokenTokenizer()
_MEMORY = re.compile(r"<memory>\n(.*?)\n</memory>", re.S)
_SECTION = re.compile(r"<section>\n(.*?)\n</section>", re.S)


def reply_to(message: str) -> str:
    """The stand-in model: a pure function of the prompt, so every run is reproducible."""
    memory = _MEMORY.search(message)
    remembered = memory.group(1).split() if memory else []
    if remembered == ["No", "previous", "memory"]:
        remembered = []
    section = _SECTION.search(message)
    if section is None:  # the final prompt
        return f"From memory: \\boxed{{{remembered[0] if remembered else 'nothing'}}}"
    return " ".join((remembered + section.group(1).split()[:6])[-30:])


_RUN = re.compile(r"(.)\1{0,199}", re.S)


def run_tokens(text: str) -> list[int]:
    """A token per run of one character, up to 200 long: its length and code point."""
    return [len(m.group()) << 21 | ord(m.group(1)) for m in _RUN.finditer(text)]


def runs_text(tokens: list[int]) -> str:
    """The text of run tokens, as llama-cpp-python 0.3.36 detokenizes: a token whose text is
    longer than 32 bytes gives nothing."""
    pieces = (chr(token & 0x1FFFFF) * (token >> 21) for token in tokens)
    return "".join(piece for piece in pieces if len(piece.encode()) <= 32)


_CHUNK = re.compile(r"<recurrent_chunk>\n(.*?)\n</recurrent_chunk>", re.S)


def completion_to(prompt: str) -> str:
    """The stand-in for InfMem's model on `/v1/completions`: every call thinks first (a
    prompt that ends at the assistant's turn gets a closed thinking), then the planner
    says STOP, an update keeps the chunk's first words, and the answer names the first."""
    turn = prompt.rsplit("<|im_start|>assistant\n", 1)[-1]
    if "</think>" not in turn:
        return "<think>ok</think>"
    if "You are a Retrieval Planner" in prompt:
        return "STOP"
    chunk = _CHUNK.search(prompt)
    if chunk is not None:
        return " ".join(chunk.group(1).split()[:6])
    memory = _MEMORY.search(prompt)
    first = memory.group(1).split()[0] if memory and memory.group(1).split() else "nothing"
    return f"Therefore, the answer is {first}."


@dataclass
class Raw:
    """A reply written byte for byte: any status line, headers and body. `trickle` sends it
    a byte every `every` seconds: from the first byte ("head"), or after the headers ("body")."""

    body: bytes = b""
    status: int = 200
    reason: str = ""  # the status line's words: HTTP's own phrase unless given
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    trickle: str | None = None
    every: float = 1.0

    @classmethod
    def json(cls, payload: object, status: int = 200) -> Raw:
        return cls(json.dumps(payload).encode(), status)

    def head(self) -> bytes:
        reason = self.reason or HTTPStatus(self.status).phrase
        headers = {"Content-Length": str(len(self.body)), "Connection": "close", **self.headers}
        lines = [f"HTTP/1.1 {self.status} {reason}", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass
class FakeServer:
    context: int | None = 8192  # max_model_len announced, None: not announced
    delay: float = 0.0  # seconds before each chat reply
    slots: int | None = None  # chat calls answered at once (a server's slots); None: any
    fail_after: int | None = None  # chat calls answered before every call fails
    fail_status: int = 503  # 503 is retried by memagent, 400 is not
    fail_message: str = "the model is unwell"  # the error text of a failing call
    hang_after: int | None = None  # chat calls answered before the server stops answering
    hold_after: int | None = None  # chat calls answered before the rest wait for release()
    held: int = 0  # chat calls waiting for release() now
    tokenizer: bool = False  # llama-server's /tokenize and /detokenize, a token per byte
    control: tuple[str, ...] = ()  # the stand-in's control tokens, as the tokenizer spells them
    chat_template: str | None = None  # llama-server's /props gives it; None: no /props
    model_path: str | None = None  # the model file /props names, as llama-server's does
    composes: bool = False  # the tokenizer composes Unicode (NFC) first, as Qwen's in vLLM
    vllm_tokenizer: bool = False  # vLLM's /tokenize and /detokenize, a token per byte
    token_strs: bool = False  # vLLM's return_token_strs answered (GPT-2's byte characters)
    clean_up: bool = False  # vLLM's /detokenize cleans up spaces, as Llama 3's tokenizer does
    sglang_tokenizer: bool = False  # SGLang's /tokenize and /detokenize, a token per byte
    vocabulary: str | None = None  # a GGUF whose vocabulary tokenizes (llama.cpp's), not bytes
    extras_tokenizer: bool = False  # llama-cpp-python's, losing its long tokens' text
    tokenize_delay: float = 0.0  # seconds before each /tokenize reply
    tokenize_calls: int = 0
    busy: int = 0  # chat calls turned away first, with 429 and `Retry-After: retry_after`
    retry_after: str = "1"
    keep_messages: bool = True  # False: a long run keeps no prompts (bounded memory)
    chat_calls: int = 0
    in_flight: int = 0  # chat calls being answered now
    most_in_flight: int = 0
    turned_away: list[float] = field(default_factory=list)  # when each 429 was sent
    answered: list[float] = field(default_factory=list)  # when each served call arrived
    messages: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)  # /v1/completions, as sent
    authorizations: set[str] = field(default_factory=set)  # Authorization headers received
    api_key: str | None = None  # a key every call must bring, else 401
    # A context that cuts longer prompts, as Ollama does: usage.prompt_tokens says at most
    # this many.
    cut_to: int | None = None
    count_words: bool = False  # usage counts a word a token, not tiktoken's tokens
    raw: dict[str, Raw] = field(default_factory=dict)  # a path's reply, as given
    reply: Callable[[str], str] | None = None  # the stand-in model's chat reply; reply_to
    paths: list[str] = field(default_factory=list)  # every POST's path, in the order sent
    port: int = 0  # 0: any free port; a server restarted where it was keeps its URL
    url: str = ""

    def __enter__(self) -> FakeServer:
        fake = self
        self._lock = threading.Lock()
        self._released = threading.Event()
        slots = threading.BoundedSemaphore(self.slots) if self.slots else contextlib.nullcontext()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real servers: one connection per client
            disable_nagle_algorithm = True  # else headers then body wait on a delayed ACK (40 ms)

            def log_message(self, *args: object) -> None:
                return None

            def _json(self, status: int, payload: object, headers: dict | None = None) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)  # unless the client was stopped meanwhile

            def _refused(self) -> bool:
                """Answered already: without the key it wants, or as the test scripted."""
                given = self.headers.get("Authorization", "")
                fake.authorizations.add(given)
                if fake.api_key is not None and given != f"Bearer {fake.api_key}":
                    self._json(401, {"error": {"message": "Invalid API key"}})
                    return True
                raw = fake.raw.get(self.path)
                if raw is None:
                    return False
                self.close_connection = True
                reply = raw.head() + raw.body
                at_once = {None: len(reply), "head": 0, "body": len(raw.head())}[raw.trickle]
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(reply[:at_once])
                    for byte in range(at_once, len(reply)):
                        self.wfile.flush()
                        time.sleep(raw.every)
                        self.wfile.write(reply[byte : byte + 1])
                return True

            def _vllm(self, body: dict) -> None:
                """vLLM's endpoints: a body of another server's shape is refused (400)."""
                if self.path == "/detokenize":
                    if not isinstance(body.get("tokens"), list) or "model" not in body:
                        self._json(400, {"error": {"message": "tokens: field required"}})
                        return
                    data = b"".join(fake.token_bytes(t) for t in body["tokens"])
                    text = data.decode("utf-8", errors="replace")
                    if fake.clean_up:  # Hugging Face's clean_up_tokenization, in part
                        for spaced in (" .", " ,", " !", " ?"):
                            text = text.replace(spaced, spaced[1:])
                    self._json(200, {"prompt": text})
                    return
                if not isinstance(body.get("prompt"), str) or "model" not in body:
                    self._json(400, {"error": {"message": "prompt: field required"}})
                    return
                fake.tokenize_calls += 1
                tokens = fake.tokens(body["prompt"])
                reply = {"tokens": tokens, "count": len(tokens), "max_model_len": fake.context}
                if fake.token_strs and body.get("return_token_strs"):
                    reply["token_strs"] = [byte_level(fake.token_bytes(t)) for t in tokens]
                self._json(200, reply)

            def _sglang(self, body: dict) -> None:
                """SGLang's endpoints (sglang/srt/entrypoints/openai/serving_tokenize.py): a
                body without vLLM's fields is refused (400, as its validation errors are)."""
                if self.path.endswith("/detokenize"):
                    tokens = body.get("tokens")
                    if not isinstance(tokens, list):
                        self._json(400, {"message": "tokens: field required", "code": 400})
                        return
                    skip = body.get("skip_special_tokens", True)

                    def text(window: list[int]) -> str:
                        kept = [t for t in window if not (skip and t >= 256)]
                        return b"".join(map(fake.token_bytes, kept)).decode(errors="replace")

                    many = bool(tokens) and isinstance(tokens[0], list)
                    self._json(200, {"text": [*map(text, tokens)] if many else text(tokens)})
                    return
                if not isinstance(body.get("prompt"), str):
                    self._json(400, {"message": "prompt: field required", "code": 400})
                    return
                fake.tokenize_calls += 1
                tokens = fake.tokens(body["prompt"])
                self._json(200, {"tokens": tokens, "count": len(tokens), "max_model_len": 8192})

            def do_GET(self) -> None:  # noqa: N802
                if self._refused():
                    return
                if self.path.rstrip("/") == "/v1/models":
                    model = {"id": MODEL, "object": "model"}
                    if fake.context is not None:
                        model["max_model_len"] = fake.context
                    self._json(200, {"object": "list", "data": [model]})
                elif self.path.rstrip("/") == "/props" and (fake.chat_template or fake.model_path):
                    props = {"chat_template": fake.chat_template, "model_path": fake.model_path}
                    self._json(200, {k: v for k, v in props.items() if v is not None})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.paths.append(self.path)
                if self._refused():
                    return
                if fake.sglang_tokenizer and self.path.removeprefix("/v1") in (
                    "/tokenize",
                    "/detokenize",
                ):
                    self._sglang(body)
                    return
                if fake.vllm_tokenizer and self.path in ("/tokenize", "/detokenize"):
                    self._vllm(body)
                    return
                if fake.tokenizer and self.path == "/tokenize":
                    fake.tokenize_calls += 1
                    time.sleep(fake.tokenize_delay)
                    tokens = fake.tokens(body["content"], body.get("parse_special", True))
                    if body.get("with_pieces"):
                        tokens = [{"id": t, "piece": fake.piece(t)} for t in tokens]
                    self._json(200, {"tokens": tokens})
                    return
                if fake.extras_tokenizer and self.path == "/extras/tokenize":
                    self._json(200, {"tokens": run_tokens(body["input"])})
                    return
                if fake.extras_tokenizer and self.path == "/extras/detokenize":
                    self._json(200, {"text": runs_text(body["tokens"])})
                    return
                if fake.tokenizer and self.path == "/detokenize":
                    data = b"".join(fake.token_bytes(t) for t in body["tokens"])
                    text = data.decode("utf-8", errors="replace")
                    self._json(200, {"content": text})
                    return
                if self.path.rstrip("/") == "/v1/completions":
                    with fake._lock:
                        fake.prompts.append(body["prompt"])
                    text = completion_to(body["prompt"])
                    read = fake.read(body["prompt"])
                    usage = {"prompt_tokens": read, "completion_tokens": 1}
                    choice = {"index": 0, "text": text, "finish_reason": "stop"}
                    self._json(
                        200, {"object": "text_completion", "choices": [choice], "usage": usage}
                    )
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": "not found"}})
                    return
                with fake._lock:
                    fake.chat_calls += 1
                    calls = fake.chat_calls
                    if calls <= fake.busy:
                        fake.turned_away.append(time.monotonic())
                    else:
                        fake.answered.append(time.monotonic())
                if calls <= fake.busy:
                    self._json(
                        429,
                        {"error": {"message": "too many requests"}},
                        {"Retry-After": fake.retry_after},
                    )
                    return
                if fake.hang_after is not None and calls > fake.hang_after:
                    time.sleep(3600)
                if fake.hold_after is not None and calls > fake.hold_after:
                    with fake._lock:
                        fake.held += 1
                    fake._released.wait(timeout=600)
                    with fake._lock:
                        fake.held -= 1
                if fake.fail_after is not None and calls > fake.fail_after:
                    self._json(fake.fail_status, {"error": {"message": fake.fail_message}})
                    return
                with slots:  # the others wait their turn, as on a server's slots
                    with fake._lock:
                        fake.in_flight += 1
                        fake.most_in_flight = max(fake.most_in_flight, fake.in_flight)
                    time.sleep(fake.delay)
                    with fake._lock:
                        fake.in_flight -= 1
                message = body["messages"][0]["content"]
                if fake.keep_messages:
                    fake.messages.append(message)
                text = (fake.reply or reply_to)(message)  # reply_to as it is now
                words = len(text.split())
                length_cut = words >= body.get("max_tokens", 10**9)
                self._json(
                    200,
                    {
                        "object": "chat.completion",
                        "model": MODEL,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": "length" if length_cut else "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": fake.read(message),
                            "completion_tokens": words,
                        },
                    },
                )

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # many clients connecting at once (--parallel 64)

        self._server = Server(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def tokens(self, text: str, parse_special: bool = True) -> list[int]:
        """llama-server's /tokenize of the stand-in's vocabulary: a token per byte, and with
        `parse_special` (its default) a token of its own, 256 on, for each `control` spelled."""
        if self.composes:
            text = unicodedata.normalize("NFC", text)
        if self.vocabulary is not None:
            return self._vocabulary()[0].tokenize(
                text.encode(), add_bos=False, special=parse_special
            )
        if not (parse_special and self.control):
            return list(text.encode())
        spelled = re.compile("|".join(re.escape(c) for c in self.control))
        tokens, at = [], 0
        for match in spelled.finditer(text):
            tokens += [*text[at : match.start()].encode(), 256 + self.control.index(match[0])]
            at = match.end()
        return [*tokens, *text[at:].encode()]

    def _vocabulary(self):
        """The GGUF's vocabulary, loaded once (llama.cpp, no weights), and its pieces."""
        if not hasattr(self, "_vocab"):
            import llama_cpp

            from memagent_cli.backends.llama_parts import Pieces

            vocab = llama_cpp.Llama(model_path=self.vocabulary, vocab_only=True, verbose=False)
            pieces = Pieces(llama_cpp.llama_model_get_vocab(vocab.model), special=True)
            self._vocab = (vocab, pieces)
        return self._vocab

    def token_bytes(self, token: int) -> bytes:
        if self.vocabulary is not None:
            return self._vocabulary()[1](token)
        return bytes([token]) if token < 256 else self.control[token - 256].encode()

    def piece(self, token: int) -> str | list[int]:
        """A token's piece as llama-server's `with_pieces` gives it: its text, or its bytes
        where they are not UTF-8 on their own."""
        data = self.token_bytes(token)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return list(data)

    def read(self, prompt: str) -> int:
        """The prompt's tokens this server reports having read, at most `cut_to`."""
        tokens = len(prompt.split() if self.count_words else _TIKTOKEN.tokenize(prompt))
        return tokens if self.cut_to is None else min(tokens, self.cut_to)

    def release(self) -> None:
        """Answer the calls `hold_after` holds, and every call after them."""
        self._released.set()

    def __exit__(self, *exc: object) -> None:
        self._released.set()  # a held call's thread ends
        self._server.shutdown()
        self._server.server_close()


def _byte_characters() -> list[str]:
    """GPT-2's bytes_to_unicode: the character a byte-level BPE's token strings spell each
    byte with (Qwen2's, Llama 3's): printable bytes as themselves, the others shifted."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = (b for b in range(256) if b not in printable)
    shifted = {b: chr(256 + n) for n, b in enumerate(others)}
    return [chr(b) if b in printable else shifted[b] for b in range(256)]


_BYTE_CHARACTERS = _byte_characters()


def byte_level(data: bytes) -> str:
    """A token's string as a byte-level BPE tokenizer's convert_ids_to_tokens spells it."""
    return "".join(_BYTE_CHARACTERS[b] for b in data)


def served(server: FakeServer, *args: str) -> list[str]:
    """`ask` options that read through `server` (the fake one) instead of a GGUF."""
    return ["--backend", "openai", "--base-url", server.url, *args]
