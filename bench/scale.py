"""Held at length, on the wire: each reader over a 3.5M-token document (the paper's longest),
against a stand-in model that replies at once, with the real Qwen2.5 vocabulary.

The text is made here (deterministic, never stored): plain paragraphs with what books hold
between them, rules of 80 `=`, 40-space table gaps, decomposed accents, Chinese, code. The
vocabulary is the real Qwen2.5 GGUF of the test material (tests/support/qwen_material.py),
loaded vocab-only by memagent's own llama.cpp backend; the model's decoding is replaced by
replies made from each prompt (a memory of the chunk's first words, an InfMem planner that
always searches, a ReMemR1 update with a `<recall>`). Hugging Face `tokenizers` on the same
vocabulary's tokenizer.json is the reference.

Checked, per reader, and printed as a table:

- the document's tokens are the Hugging Face tokenizer's, and the chunks tile it: token and
  character ranges consecutive from 0 to the end, each chunk's text the Hugging Face
  decoding of its token range, and the document's own characters there (composed: NFC);
- every prompt (and its reply limit) is the one the authors' code writes: their templates
  as tests/ keeps them verbatim, filled as their loops fill them (a mirror of each loop
  runs beside the reading, with the authors' BM25 and TF-IDF written out in numpy);
- time per step at the end (steps 596-605) against the start (steps 6-15): no growth beyond
  the protocol's own work (the tokens of the step's prompts, which InfMem's retrieval
  history makes grow, and the past memories each ReMemR1 recall fits TF-IDF on again); RSS
  at the start and the end (at most 16 MB more), and its peak;
- through a stand-in OpenAI server on 127.0.0.1 (llama-server's /tokenize and /detokenize
  on the same vocabulary, no Unicode composition, as llama-server), the HTTP requests each
  step makes, at the start and the end, against a bound: the reader's calls, and two texts
  of its own tokenized and detokenized.

    python bench/scale.py [--tokens 3500000] [--readers memagent,infmem,rememr1]

Exit status 1 when a check fails that is not an expected failure (marked `xfail`, with the
issue that tracks it). About 5 minutes on 2 cores; loads no weights.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import platform
import random
import re
import statistics
import sys
import threading
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import test_protocol as memagent_oracle  # noqa: E402  # the spec's strings, verbatim
import test_readers_protocol as oracle  # noqa: E402  # the authors' strings, verbatim
from support.qwen_material import shipped_gguf, tokenizer_folder  # noqa: E402

from memagent_cli import readers  # noqa: E402
from memagent_cli.backend import Generation, Raw, Sampling  # noqa: E402
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions  # noqa: E402
from memagent_cli.backends.openai import OpenAIBackend, ServerOptions  # noqa: E402
from memagent_cli.documents.document import Document  # noqa: E402
from memagent_cli.reader import Settings, StepFinished, read  # noqa: E402
from memagent_cli.run.engine import Engine, ReadOptions, reading_settings  # noqa: E402
from memagent_cli.run.session import open_session  # noqa: E402

QUESTION = "Which captain wrote to the council about the storm, and from which harbour?"
START, END = (6, 15), (596, 605)  # 1-based steps whose times are compared
ISSUE = "issue 47"
CHECKS = ("tokens", "token tiling", "character tiling", "chunk text", "chunk characters",
          "prompts", "time per step", "memory", "server requests")  # fmt: skip
# Checks known to fail, with why: none now (ReMemR1's TF-IDF through a server asked a
# /detokenize per token until its pieces came with one /tokenize).
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}

# --- the text ---------------------------------------------------------------------------

WORDS = (  # noqa: SIM905
    "the harbour bell rang at noon while the keeper counted ships along the grey stone quay "
    "and a captain in a blue coat wrote letters to the council about the storm lamps cargo "
    "salt copper old tower northern road miller's daughter seven lanterns silver key ledger "
    "winter orchard river ferry market bridge signal whistle anchor compass chart tide "
    "lighthouse village archive vault password clerk journey evening morning careful quiet "
    "sudden distant hidden bright narrow heavy"
).split()
ODD_PIECES = (
    "=" * 80,
    "-" * 66,
    "Name" + " " * 40 + "Harbour" + " " * 40 + "Tonnage",
    unicodedata.normalize(
        "NFD",
        "Le café était déjà fermé à Québec. Tiếng Việt: người được học. Åsa läste på "
        "Ångström-laboratoriet. 한국어 문서, 한글 자모.",
    ),
    "长文档的记忆测试：港口的钟声在正午响起。",
    "def keeper(ships):\n    return sorted(ships, key=len)  # " + "*" * 36,
)
CHARS_PER_TOKEN = 5.25  # of this text with Qwen2.5's vocabulary (measured: 5.21)


def book(characters: int, seed: int = 47) -> str:
    """About `characters` characters of numbered paragraphs joined by blank lines, every
    third one followed by an odd piece. It spells no chat control token: a document's
    `<|im_end|>` is text to memagent and markup to the authors' tokenizer
    (tests/test_special_tokens.py)."""
    rng = random.Random(seed)
    parts, size, number = [], 0, 0
    while size < characters:
        number += 1
        sentences = []
        for _ in range(rng.randint(3, 7)):
            sentences.append(" ".join(rng.choices(WORDS, k=rng.randint(8, 18))).capitalize() + ".")
        part = f"{number}. " + " ".join(sentences)
        if number % 3 == 0:
            part += "\n" + ODD_PIECES[(number // 3) % len(ODD_PIECES)]
        parts.append(part)
        size += len(part) + 2
    return "\n\n".join(parts)


# --- the stand-in model: a reply made from each prompt ----------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _between(text: str, start: str, end: str) -> str:
    """What lies between the last `end` and the `start` before it."""
    close = text.rfind(end)
    return text[text.rfind(start, 0, close) + len(start) : close]


def memagent_reply(message: str) -> str:
    if "\n<section>\n" not in message:
        memory = _between(message, "<memory>\n", "\n</memory>").split()
        return f"The captain is \\boxed{{{memory[2] if len(memory) > 2 else 'nobody'}}}."
    section = _between(message, "<section>\n", "\n</section>")
    return f"Memory {_digest(section)}: " + " ".join(section.split()[:30])


def rememr1_reply(message: str) -> str:
    if "\n<section>\n" not in message:
        return "<thinking>done</thinking> The captain is \\boxed{Ferry}."
    section = _between(message, "<section>\n", "\n</section>")
    digest, words = _digest(section), section.split()
    reply = f"<thinking>Reading {digest}.</thinking>\n<update>Memory {digest}: "
    reply += " ".join(words[:30]) + "</update>"
    if digest[0] not in "01":  # an eighth of the steps recall nothing
        reply += "\n<recall>" + " ".join(words[30:36]) + "</recall>"
    return reply


def infmem_reply(prompt: str) -> str:
    """Both stages of every InfMem call: thinking (left unclosed on odd planner steps, so
    their closing sentence is added), then a search, a memory, or the answer."""
    turn = prompt.rsplit("<|im_start|>assistant\n", 1)[-1]
    planner = "You are a Retrieval Planner" in prompt
    if not turn:
        if planner:
            step = int(re.search(r"Current retrieval step: (\d+)", prompt).group(1))
            return f"<think>Step {step}: the memory needs more" + ("" if step % 2 else ".</think>")
        return "<think>Reading.</think>"
    if planner:
        memory = _between(prompt, "CURRENT MEMORY:\n", "\n\n<|im_end|>")
        rng = random.Random(_digest(memory))
        query = " ".join(rng.choices(WORDS, k=5))
        arguments = json.dumps({"query": query, "top_k": rng.randint(3, 9)})
        return f"✿FUNCTION✿: retrievesearch\n✿ARGS✿: {arguments}"
    if "<recurrent_chunk>\n" in prompt:
        chunk = _between(prompt, "<recurrent_chunk>\n", "\n</recurrent_chunk>")
        return f"Memory {_digest(chunk)}: " + " ".join(chunk.split()[:30])
    return "Therefore, the answer is Ferry."


REPLIES: dict[str, Callable[[str], str]] = {
    "memagent": memagent_reply,
    "rememr1": rememr1_reply,
    "infmem": infmem_reply,
}


# --- the reference: Hugging Face's tokenizer and the authors' loops ---------------------


class Reference:
    """The document as the authors' Hugging Face tokenizer reads it."""

    def __init__(self, text: str) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_folder() / "tokenizer.json"))
        self.ids = self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.ids[start:end], skip_special_tokens=False)

    def chunks(self, size: int) -> list[str]:
        return [self.decode(s, min(s + size, len(self.ids))) for s in range(0, len(self.ids), size)]

    def terms(self, text: str) -> list[str]:
        """ReMemR1's TfidfRetriever._llm_tokenizer after the vectorizer's lowercasing."""
        tokens = self.tokenizer.encode(text.lower().lower(), add_special_tokens=False).tokens
        return [token.replace("Ġ", "") for token in tokens]


# A mirror yields each call the authors' loop makes, (prompt, max_tokens), and is sent the
# reply; a reply is always made from the prompt memagent sent.
Mirror = Generator[tuple[str, int], str, None]


def memagent_mirror(ref: Reference, chunks: Sequence[str], settings: Settings, tally) -> Mirror:
    """MemAgent's loop (the protocol, step 4 and 5)."""
    memory = "No previous memory"
    for chunk in chunks:
        reply = yield (
            memagent_oracle.SPEC_UPDATE.format(prompt=QUESTION, memory=memory, chunk=chunk),
            settings.memory_tokens,
        )
        memory = reply.split("</think>")[-1] if "</think>" in reply else reply
    yield memagent_oracle.SPEC_FINAL.format(prompt=QUESTION, memory=memory), 1024


class TfIdf:
    """TfidfRetriever.top1_retrieve, refitted on every memory so far at each recall, with
    scikit-learn's defaults written out in numpy (the memories in the order first written;
    a tie goes to the last, as argsort(...)[::-1] of a stable sort)."""

    def __init__(self, ref: Reference) -> None:
        self.ref, self.vocabulary = ref, {}
        self.memory, self.term, self.count = [], [], []  # one row per (memory, term)
        self.memories: list[str] = []
        self.terms = 0  # in every memory so far: what a refit reads

    def add(self, memory: str) -> None:
        if memory in self.memories:
            return
        for term, count in Counter(self.ref.terms(memory)).items():
            self.memory.append(len(self.memories))
            self.term.append(self.vocabulary.setdefault(term, len(self.vocabulary)))
            self.count.append(count)
            self.terms += count
        self.memories.append(memory)

    def top1(self, query: str) -> str | None:
        if not query or not self.vocabulary:
            return None
        memory, term = np.array(self.memory), np.array(self.term)
        count = np.array(self.count, dtype=float)
        n = len(self.memories)
        df = np.bincount(term, minlength=len(self.vocabulary))
        idf = np.log((1 + n) / (1 + df)) + 1
        weight = count * idf[term]
        norms = np.sqrt(np.bincount(memory, weight * weight, minlength=n))
        asked = Counter(t for t in self.ref.terms(query) if t in self.vocabulary)
        q = np.zeros(len(self.vocabulary))
        for t, c in asked.items():
            q[self.vocabulary[t]] = c * idf[self.vocabulary[t]]
        q_norm = np.sqrt((q * q).sum())
        if q_norm:
            q /= q_norm
        dots = np.bincount(memory, weight * q[term], minlength=n)
        sims = np.divide(dots, norms, out=np.zeros(n), where=norms > 0)
        best = np.flatnonzero(sims >= sims.max() - 1e-12)
        return self.memories[best[-1]]


def rememr1_mirror(ref: Reference, chunks: Sequence[str], settings: Settings, tally) -> Mirror:
    """rememr1.async_query_llm (syr-cn/ReMemR1 at 43e69f3, docs/internals/readers.md);
    `tally(n)` hears of the n terms of past memories each recall fits TF-IDF on again."""
    memory, recalled, past = "No previous memory", "No memory was recalled.", TfIdf(ref)
    for chunk in chunks:
        reply = yield (
            oracle.REMEMR1_TEMPLATE.format(
                prompt=QUESTION, recalled_memory=recalled, memory=memory, chunk=chunk
            ),
            settings.memory_tokens,
        )
        memory = re.sub(r"<recall>.*?</recall>", "", reply, flags=re.DOTALL).strip()
        past.add(memory)
        query = re.search(r"<recall>(.+)</recall>", reply)
        if query is None:
            recalled = "No memory was recalled."
        else:
            found = past.top1(query.group(1))
            tally(past.terms)
            recalled = "None" if found is None else found
    yield (
        oracle.REMEMR1_TEMPLATE_FINAL_BOXED.format(
            prompt=QUESTION, recalled_memory=recalled, memory=memory
        ),
        2048,
    )


class BM25Okapi:
    """rank_bm25 0.2.2's BM25Okapi(corpus of `text.lower().split()`), its get_scores in
    numpy over an inverted index; ties to the unit first in the document."""

    def __init__(self, texts: Sequence[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        corpus = [text.lower().split() for text in texts]
        self.lengths = np.array([len(words) for words in corpus], dtype=float)
        self.average = self.lengths.mean()
        postings: dict[str, list[tuple[int, int]]] = {}
        for i, words in enumerate(corpus):
            for word, freq in Counter(words).items():
                postings.setdefault(word, []).append((i, freq))
        n = len(corpus)
        idf = {w: math.log(n - len(p) + 0.5) - math.log(len(p) + 0.5) for w, p in postings.items()}
        total = 0.0
        for value in idf.values():  # a plain running sum, as rank_bm25's
            total += value
        floor = 0.25 * (total / len(idf))
        self.idf = {w: (floor if v < 0 else v) for w, v in idf.items()}
        self.postings = {w: np.array(p).T for w, p in postings.items()}

    def top(self, query: str, n: int = 4) -> list[int]:
        scores = np.zeros(len(self.lengths))
        for word in query.lower().split():
            freq = np.zeros(len(self.lengths))
            if word in self.postings:
                where, count = self.postings[word]
                freq[where] = count
            shape = 1 - self.b + self.b * self.lengths / self.average
            scores += (self.idf.get(word) or 0) * (freq * (self.k1 + 1) / (freq + self.k1 * shape))
        return [int(i) for i in np.argsort(-scores, kind="stable")[:n]]


FNCALL = re.compile(
    r"✿FUNCTION✿:\s*([^\n]+)\s*✿ARGS✿:\s*([^✿]+?)(?=✿RESULT✿|✿RETURN✿|✿FUNCTION✿|$)", re.DOTALL
)
CLOSING = "\n\nConsidering the limited time, I must stop thinking now.\n</think>\n\n"


def infmem_mirror(ref: Reference, chunks: Sequence[str], settings: Settings, tally) -> Mirror:
    """infmem.async_query_llm_multi_turn (UCMP13753/InfMem at 4f4de32, run.py's infmem
    config; docs/internals/readers.md): a planner call and an update call a chunk, each in
    two stages, BM25 over 500-token units restarting at every chunk."""
    size, unit_size = settings.chunk_tokens, 500
    spans = [
        (s, min(s + unit_size, c + size, len(ref.ids)))
        for c in range(0, len(ref.ids), size)
        for s in range(c, min(c + size, len(ref.ids)), unit_size)
    ]
    units = [ref.decode(s, e) for s, e in spans]
    index = BM25Okapi(units)

    def thought(user: str, system: str | None = None) -> Generator[tuple[str, int], str, str]:
        prompt = oracle.qwen3_chat(user, system)
        first = yield prompt, 1024
        closed = first if "</think>" in first else first.rstrip() + CLOSING
        second = yield prompt + closed, settings.memory_tokens
        return (closed + second.strip()).strip()

    memory, history = "No previous memory", []
    for step, chunk in enumerate(chunks):
        lines = [f"Step {i}: query={q!r}, top_k={k}" for i, (q, k) in enumerate(history, 1)]
        head = (
            f"Current retrieval step: {step + 1}  Maximum allowed retrieval steps: {len(chunks)}\n"
        )
        user = oracle.INFMEM_TEMPLATE_CALL_OR_ANSWER.format(
            prompt=QUESTION, retrieval_history=head + "\n".join(lines), memory=memory
        )
        plan = yield from thought(user, oracle.QWEN_AGENT_TOOL_SYSTEM)
        assert "STOP" not in plan
        name, arguments = FNCALL.findall(plan)[-1]
        arguments = json.loads(arguments.strip())
        history.append((arguments["query"], str(arguments["top_k"])))
        found = index.top(arguments["query"])
        retrieved = "\n\n".join(f"[Retrieved #{r}] {units[i]}" for r, i in enumerate(found, 1))
        user = oracle.INFMEM_TEMPLATE_RETREIVE_RECURRENT.format(
            prompt=QUESTION, retrieve=retrieved, chunk=chunk, memory=memory
        )
        reply = yield from thought(user)
        memory = reply.split("</think>")[-1].strip() if "</think>" in reply else reply
    user = oracle.INFMEM_TEMPLATE_FINAL.format(prompt=QUESTION, memory=memory)
    yield from thought(user)


MIRRORS = {"memagent": memagent_mirror, "rememr1": rememr1_mirror, "infmem": infmem_mirror}


@dataclass
class Checked:
    """The calls a mirror saw, the first that differed, and how many did."""

    calls: int = 0
    differ: int = 0
    first: str | None = None

    def compare(self, sent: str, limit: int, expected: tuple[str, int] | None) -> None:
        self.calls += 1
        if expected == (sent, limit):
            return
        self.differ += 1
        if self.first is None:
            if expected is None:
                self.first = f"call {self.calls}: the authors' loop has ended"
                return
            want, want_limit = expected
            at = next((i for i, (a, b) in enumerate(zip(sent, want, strict=False)) if a != b), None)
            at = min(len(sent), len(want)) if at is None else at
            self.first = (
                f"call {self.calls}: at character {at} sent {sent[at - 40 : at + 40]!r}, "
                f"expected {want[at - 40 : at + 40]!r}; reply limit {limit} vs {want_limit}"
            )


# --- the stand-in backend: memagent's llama.cpp backend, vocabulary only -----------------


class StandIn(LlamaCppBackend):
    """memagent's llama.cpp backend on the real vocabulary, weights never loaded: its
    tokenizing, chunking and prompt tokens are memagent's own; each reply is made from the
    prompt at once. Time spent making replies and checking prompts is kept apart
    (`outside`), so a step's time is memagent's alone."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, LlamaOptions(threads=1, speculate=False))
        self.reply: Callable[[str], str] = memagent_reply
        self.mirror: Mirror | None = None
        self.checked = Checked()
        self.last_reply = ""  # what the mirror is sent before it gives the next call
        self.outside = 0.0
        self.prompt_tokens = 0
        self.refitted = 0  # terms of past memories the authors' loop fits TF-IDF on again
        self.tokenizing = 0.0  # in tokenize and detokenize: a reader's own texts (terms, units)

    def tokenize(self, text: str) -> list[int]:
        started = time.perf_counter()
        try:
            return super().tokenize(text)
        finally:
            self.tokenizing += time.perf_counter() - started

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        started = time.perf_counter()
        try:
            return super().detokenize(tokens)
        finally:
            self.tokenizing += time.perf_counter() - started

    def prepare(self, context_tokens: int, sequences: int = 1, progress=None) -> None:
        self.context_tokens, self.sequences = context_tokens, sequences

    def sequences_that_fit(self, context_tokens: int) -> int:
        return 1

    def needs_measuring(self) -> bool:
        return False

    def pays_together(self, most: int) -> int:
        return 1

    def _answer(self, text: str, tokens: int, max_tokens: int) -> Generation:
        started = time.perf_counter()
        if self.mirror is not None:
            try:
                first = not self.checked.calls
                expected = next(self.mirror) if first else self.mirror.send(self.last_reply)
            except StopIteration:
                expected = None
            self.checked.compare(text, max_tokens, expected)
        reply = self.last_reply = self.reply(text)
        self.prompt_tokens += tokens
        self.outside += time.perf_counter() - started
        return Generation(reply, tokens, len(reply) // 4, 0.0, 0.0, "stop")

    def generate(self, message: str, *, max_tokens: int, sampling: Sampling) -> Generation:
        tokens, _ = self._chat_prompt(message)  # as llama.cpp would be given it
        return self._answer(message, len(tokens), max_tokens)

    def complete(self, raw: Raw, *, max_tokens: int, sampling: Sampling) -> Generation:
        tokens, _ = self._raw(raw)
        return self._answer("".join(text for text, _ in raw), len(tokens), max_tokens)


# --- the stand-in server ----------------------------------------------------------------


class Server:
    """An OpenAI-compatible server on 127.0.0.1 with llama-server's /tokenize and
    /detokenize on the real vocabulary (llama.cpp's tokens, no normalization, every
    token's text), replies made as the stand-in's, and each request counted by path."""

    def __init__(self, path: Path, reply: Callable[[str], str], context: int) -> None:
        import llama_cpp

        from memagent_cli.backends.llama_parts import Pieces

        self.vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.pieces = Pieces(llama_cpp.llama_model_get_vocab(self.vocab.model), special=True)
        self.reply, self.context = reply, context
        self.requests: Counter[str] = Counter()
        self.lock = threading.Lock()

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests[path] += 1
        if path == "/v1/models":
            return {"data": [{"id": "stand-in", "object": "model", "max_model_len": self.context}]}
        if path == "/tokenize":  # llama-server's: parse_special true unless told, pieces asked
            text = body["content"].encode()
            special = body.get("parse_special", True)
            tokens = self.vocab.tokenize(text, add_bos=False, special=special)
            if not body.get("with_pieces"):
                return {"tokens": tokens}
            found = []
            for token in tokens:
                data = self.pieces.join([token])
                try:
                    found.append({"id": token, "piece": data.decode("utf-8")})
                except UnicodeDecodeError:  # bytes of a character split between tokens
                    found.append({"id": token, "piece": list(data)})
            return {"tokens": found}
        if path == "/detokenize":
            return {"content": self.pieces.join(body["tokens"]).decode(errors="replace")}
        usage = {"prompt_tokens": 1, "completion_tokens": 1}
        if path == "/v1/completions":
            choice = {"index": 0, "text": self.reply(body["prompt"]), "finish_reason": "stop"}
            return {"choices": [choice], "usage": usage}
        if path == "/v1/chat/completions":
            text = self.reply(body["messages"][0]["content"])
            message = {"role": "assistant", "content": text}
            return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage}  # fmt: skip
        raise KeyError(path)

    def __enter__(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                return None

            def _send(self, status: int, payload: object) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                try:
                    self._send(200, server.answer(self.path.rstrip("/"), body))
                except KeyError:
                    self._send(404, {"error": {"message": "not found"}})

            do_GET = do_POST = _handle  # noqa: N815

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()


# --- a reading, timed ------------------------------------------------------------------


class Stopped(Exception):
    """A reading through the server stopped after a step of far too many requests."""


@dataclass
class Timeline:
    """Per finished step: memagent's seconds, the protocol's work (its prompts' tokens, and
    the terms of past memories a ReMemR1 recall fits TF-IDF on again), RSS, and requests
    (through a server)."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    tokenizing: list[float] = field(default_factory=list)  # of `seconds`: a reader's texts


def window(values: Sequence[float], steps: tuple[int, int]) -> float:
    """The median of steps `steps` (1-based, inclusive), or of the last ten when fewer."""
    first, last = steps
    if len(values) < last:
        first, last = max(1, len(values) - 9), len(values)
    return statistics.median(values[first - 1 : last])


def timed_read(backend, session, settings: Settings, count: Callable[[], int] | None = None,
               most_requests: int | None = None) -> Timeline:  # fmt: skip
    """Read the session's chunks, recording each step; `count()` gives requests so far, and
    a reading stops after a step that made more than `most_requests`."""
    line, process = Timeline(), psutil.Process()
    marks = {"at": time.perf_counter(), "outside": 0.0, "tokens": 0, "tokenizing": 0.0}
    marks["requests"] = count() if count is not None else 0  # those of cutting it come first

    def listener(event: object) -> None:
        if not isinstance(event, StepFinished):
            return
        now, outside = time.perf_counter(), getattr(backend, "outside", 0.0)
        line.seconds.append(now - marks["at"] - (outside - marks["outside"]))
        tokens = getattr(backend, "prompt_tokens", 0) + getattr(backend, "refitted", 0)
        line.tokens.append(tokens - marks["tokens"])
        line.rss.append(process.memory_info().rss)
        tokenizing = getattr(backend, "tokenizing", 0.0)
        line.tokenizing.append(tokenizing - marks["tokenizing"])
        if count is not None:
            requests = count()
            line.requests.append(requests - marks["requests"])
            marks["requests"] = requests
        marks.update(at=time.perf_counter(), outside=outside, tokens=tokens, tokenizing=tokenizing)
        # Step 1 may build a reader's index (InfMem's units): the guard starts after it.
        late = len(line.requests) > 1
        if most_requests is not None and late and line.requests[-1] > most_requests:
            raise Stopped

    with contextlib.suppress(Stopped):
        read(backend, QUESTION, session.chunks, settings, listener, reader=session.reader)
    return line


# --- the checks -------------------------------------------------------------------------


@dataclass
class Row:
    reader: str
    steps: int = 0
    calls: int = 0
    start_ms: float = 0.0
    end_ms: float = 0.0
    start_tokens: int = 0
    end_tokens: int = 0
    rss_before_mb: float = 0.0  # before the document is cut
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    peak_mb: float = 0.0
    server_steps: int = 0
    server_setup: int = 0  # requests before the first step: models, tokenize, chunks
    server_first: int = 0
    server_start: float = 0.0
    server_end: float = 0.0
    server_bound: int = 0
    checks: dict[str, str] = field(default_factory=dict)  # name: "ok", or why it failed


def tiling(document: str, tokens: Sequence[int], chunks, ref: Reference, size: int) -> dict:
    """The chunks against the document and the reference: a reason per failed check."""
    failed: dict[str, str] = {}
    if list(tokens) != ref.ids:
        pairs = enumerate(zip(tokens, ref.ids, strict=False))
        at = next((i for i, (a, b) in pairs if a != b), min(len(tokens), len(ref.ids)))
        failed["tokens"] = f"memagent's tokens differ from Hugging Face's from token {at}"
    ends = [(c.token_start, c.token_end, c.char_start, c.char_end) for c in chunks]
    token_gaps = [i for i in range(1, len(ends)) if ends[i][0] != ends[i - 1][1]]
    char_gaps = [i for i in range(1, len(ends)) if ends[i][2] != ends[i - 1][3]]
    if ends[0][0] != 0 or ends[-1][1] != len(tokens) or token_gaps:
        failed["token tiling"] = f"token ranges leave gaps or overlap at chunks {token_gaps[:5]}"
    if ends[0][2] != 0 or ends[-1][3] != len(document) or char_gaps:
        failed["character tiling"] = (
            f"character ranges end at {ends[-1][3]} of {len(document)}, gaps at {char_gaps[:5]}"
        )
    texts = ref.chunks(size)
    differ = [c.index for c, text in zip(chunks, texts, strict=True) if c.text != text]
    if differ:
        failed["chunk text"] = (
            f"{len(differ)} chunks' text is not Hugging Face's, first {differ[0]}"
        )
    own = [
        c.index
        for c in chunks
        if unicodedata.normalize("NFC", document[c.char_start : c.char_end]) != c.text
        and "\ufffd" not in c.text[:1] + c.text[-1:]  # a character split between two chunks
    ]
    if own:
        failed["chunk characters"] = f"{len(own)} chunks are not their characters, first {own[0]}"
    return failed


def run_reader(name: str, document: Document, gguf: Path, ref: Reference, args) -> Row:
    row = Row(name)
    backend = StandIn(gguf)
    settings = reading_settings(backend, ReadOptions(reader=name))
    engine = Engine.for_questions(backend, settings, [QUESTION])
    gc.collect()
    row.rss_before_mb = psutil.Process().memory_info().rss / 2**20
    started = time.perf_counter()
    session = open_session(document, engine)
    note(f"{name}: {len(session.tokens):,} tokens in {len(session.chunks)} chunks, "
         f"cut in {time.perf_counter() - started:.1f} s")  # fmt: skip
    failed = tiling(document.text, session.tokens, session.chunks, ref, settings.chunk_tokens)
    backend.reply = REPLIES[name]
    chunks = ref.chunks(settings.chunk_tokens)

    def tally(terms: int) -> None:
        backend.refitted += terms

    backend.mirror = MIRRORS[name](ref, chunks, settings, tally)
    engine.prepare(1)
    started = time.perf_counter()
    line = timed_read(backend, session, settings)
    note(f"{name}: read {len(line.seconds)} steps in {time.perf_counter() - started:.1f} s")
    with contextlib.suppress(StopIteration):  # the authors' loop has no call left
        backend.checked.compare("", 0, backend.mirror.send(backend.last_reply))
    if backend.checked.differ:
        failed["prompts"] = (
            f"{backend.checked.differ} of {backend.checked.calls} calls differ; "
            + (backend.checked.first or "")
        )
    row.steps, row.calls = len(line.seconds), backend.checked.calls
    row.start_ms, row.end_ms = 1000 * window(line.seconds, START), 1000 * window(line.seconds, END)
    row.start_tokens, row.end_tokens = (
        int(window(line.tokens, START)),
        int(window(line.tokens, END)),
    )
    row.rss_start_mb = window(line.rss, START) / 2**20
    row.rss_end_mb = window(line.rss, END) / 2**20
    row.peak_mb = max(line.rss) / 2**20
    # The protocol's own growth: each step tokenizes its prompts, which grow where the
    # protocol makes them (InfMem's retrieval history), and ReMemR1 fits TF-IDF again on every
    # past memory at each recall.
    allowed = 1.5 * max(1.0, row.end_tokens / max(row.start_tokens, 1))
    if row.end_ms > allowed * row.start_ms:
        failed["time per step"] = (
            f"step time grew {row.end_ms / row.start_ms:.1f}x (protocol's work "
            f"{row.end_tokens / max(row.start_tokens, 1):.2f}x; allowed {allowed:.2f}x); "
            f"of the end's {row.end_ms:.1f} ms, {1000 * window(line.tokenizing, END):.1f} ms "
            f"tokenize the reader's own texts, against {1000 * window(line.tokenizing, START):.1f}"
            " ms at the start"
        )
    if row.rss_end_mb - row.rss_start_mb > args.rss_growth_mb:
        failed["memory"] = f"RSS grew {row.rss_end_mb - row.rss_start_mb:.1f} MB over the reading"
    server_reading(name, document, gguf, row, failed, args)
    for check in CHECKS:
        row.checks[check] = failed.get(check, "ok")
    return row


def server_reading(name: str, document: Document, gguf: Path, row: Row, failed: dict, args) -> None:
    """The same reading through the stand-in server: requests per step."""
    spec = readers.get(name)
    server = Server(gguf, REPLIES[name], context=32768)
    with server as url:
        backend = OpenAIBackend(ServerOptions(base_url=url))
        settings = reading_settings(backend, ReadOptions(reader=name))
        engine = Engine.for_questions(backend, settings, [QUESTION])
        session = open_session(document, engine)
        row.server_setup = sum(server.requests.values())
        # Its calls, and a new memory and a query tokenized and detokenized (ReMemR1).
        bound = spec.step_calls * spec.stages + 4
        row.server_bound = bound

        def count() -> int:
            return sum(server.requests.values())

        started = time.perf_counter()
        line = timed_read(backend, session, settings, count, most_requests=1000)
    note(f"{name} through a server: {len(line.requests)} steps in "
         f"{time.perf_counter() - started:.1f} s, {dict(server.requests)}")  # fmt: skip
    row.server_steps = len(line.requests)
    row.server_first = line.requests[0]
    row.server_start = window(line.requests, START)
    row.server_end = window(line.requests, END)
    if max(line.requests[1:], default=0) > bound:
        worst = max(range(1, len(line.requests)), key=lambda i: line.requests[i])
        failed["server requests"] = (
            f"step {worst + 1} made {line.requests[worst]} requests (bound {bound}); "
            f"step {min(START[1], len(line.requests))} made "
            f"{line.requests[min(START[1], len(line.requests)) - 1]}"
        )


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def table(rows: Sequence[Row]) -> str:
    """The numbers, a reader a row, then each check's result."""
    heads = [("reader", "", "<9"), ("steps", "", ">6"), ("calls", "", ">6"),
             ("ms/step", "6-15", ">9"), ("ms/step", "596-605", ">9"),
             ("work", "6-15", ">8"), ("work", "596-605", ">8"),
             ("RSS MB", "before", ">8"), ("RSS MB", "6-15", ">8"), ("RSS MB", "596-605", ">8"),
             ("peak MB", "", ">8"), ("server", "steps", ">8"), ("req", "step 1", ">8"),
             ("req", "6-15", ">6"), ("req", "596-605", ">8"), ("req", "bound", ">6")]  # fmt: skip
    out = ["".join(f"{a:{f}}" for a, _, f in heads), "".join(f"{b:{f}}" for _, b, f in heads)]
    for r in rows:
        values = [r.reader, r.steps, r.calls, f"{r.start_ms:.2f}", f"{r.end_ms:.2f}",
                  f"{r.start_tokens:,}", f"{r.end_tokens:,}", f"{r.rss_before_mb:.0f}",
                  f"{r.rss_start_mb:.0f}", f"{r.rss_end_mb:.0f}", f"{r.peak_mb:.0f}",
                  r.server_steps, r.server_first, f"{r.server_start:g}", f"{r.server_end:g}",
                  r.server_bound]  # fmt: skip
        out.append("".join(f"{v:{f}}" for v, (_, _, f) in zip(values, heads, strict=True)))
    out.append("")
    for r in rows:
        for check, result in r.checks.items():
            expected = EXPECTED_FAILURES.get((r.reader, check))
            mark = "ok" if result == "ok" else "FAIL"
            if expected:
                mark = "XPASS (remove the xfail)" if result == "ok" else f"xfail ({expected})"
            said = "" if result == "ok" else f": {result}"
            out.append(f"{r.reader:<9}{check:<18}{mark}{said}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=3_500_000)
    parser.add_argument("--readers", default="memagent,infmem,rememr1")
    parser.add_argument("--rss-growth-mb", type=float, default=16.0)
    parser.add_argument("--out", type=Path, default=ROOT / "build/bench/scale.json")
    args = parser.parse_args()
    gguf = shipped_gguf()
    started = time.perf_counter()
    text = book(int(args.tokens * CHARS_PER_TOKEN))
    document = Document(text=text, path="scale.txt", format="text", sha256=_digest(text))
    ref = Reference(text)
    note(f"text: {len(text):,} characters, {len(ref.ids):,} tokens by Hugging Face's "
         f"tokenizer ({time.perf_counter() - started:.1f} s)")  # fmt: skip
    rows = [run_reader(name, document, gguf, ref, args) for name in args.readers.split(",")]
    header = (
        f"bench/scale.py --tokens {args.tokens} ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {psutil.cpu_count(logical=False)} cores, Python "
        f"{platform.python_version()}), in {time.perf_counter() - started:.0f} s\n"
        f"document: {len(text):,} characters, {len(ref.ids):,} tokens (Qwen2.5's vocabulary), "
        f"chunks of {Settings().chunk_tokens}; question: {QUESTION!r}\n"
        "ms/step: memagent's own time per step, in this process (the stand-in's replies and "
        "the checks left out), the median of the steps named; work: the protocol's per step, "
        "the tokens of its prompts and, for ReMemR1, the terms of the past memories its recall "
        "fits TF-IDF on again; RSS: the process's, before the document is cut and during the "
        "steps named (the reference's copies of the text included); req: HTTP requests per "
        "step through the stand-in server (step 1 includes InfMem's search index), and the "
        "bound checked (its calls, and two texts tokenized and detokenized)\n"
    )
    print(header)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    bad = [
        (r.reader, c)
        for r in rows
        for c, result in r.checks.items()
        if result != "ok" and (r.reader, c) not in EXPECTED_FAILURES
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
