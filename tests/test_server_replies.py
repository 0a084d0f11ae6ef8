"""What a server can make memagent do: replies that never end, come a byte a second, are
gzip bombs, carry a page of error text, or have a shape the OpenAI API never gives. Each is
one sentence on stderr and exit 1, in bounded time and memory. All against real servers on
127.0.0.1 (tests/support/fake_openai.py): `memagent ask` where no model is needed, the backend
itself where a measurement needs this process."""

from __future__ import annotations

import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from support.command import assert_clean_failure, words
from support.fake_openai import MODEL, FakeServer, Raw, served
from support.story import FACT_QUESTION, story

from memagent_cli.backend import Sampling
from memagent_cli.backends.openai import (
    MOST_REPLY_BYTES,
    BackendError,
    OpenAIBackend,
    ServerOptions,
)

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0", "-q"]
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 8192}]}


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    path = tmp_path / "doc.txt"
    path.write_text(story(30))
    return path


def ask(cli, server: FakeServer, doc: Path, *more: str):
    return cli("ask", str(doc), FACT_QUESTION, *served(server, *STEPS, *more))


def zeros_gzipped(size: int) -> bytes:
    """`size` bytes of zeros, gzipped: a thousandth of that on the wire."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(1 << 20)
    return b"".join([*(packer.compress(block) for _ in range(size >> 20)), packer.flush()])


def test_a_reply_past_the_bound_is_cut_off_in_one_sentence(cli, fake_server, doc):
    fake_server.raw["/v1/chat/completions"] = Raw(b" " * (MOST_REPLY_BYTES + 1))
    result = ask(cli, fake_server, doc)  # a completion of 64 tokens: 1 MiB and 256 bytes each
    assert_clean_failure(
        result, 1, "sent more than 1.02 MiB in reply to /v1/chat/completions; memagent reads no"
    )


def test_a_gzip_bomb_is_read_no_further_than_the_bound(fake_server):
    bomb = zeros_gzipped(256 << 20)  # 256 MiB of zeros, 250 KB on the wire
    assert len(bomb) < 1 << 20
    fake_server.raw["/v1/models"] = Raw(bomb, headers={"Content-Encoding": "gzip"})
    tracemalloc.start()
    try:
        with pytest.raises(BackendError, match="sent more than 8 MiB in reply to /v1/models"):
            OpenAIBackend(ServerOptions(base_url=fake_server.url))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MOST_REPLY_BYTES + (8 << 20)  # the bound and a piece, not 256 MiB


def test_a_compressed_reply_is_read_as_before(fake_server):
    import json

    fake_server.raw["/v1/models"] = Raw(
        zlib.compress(json.dumps(MODELS).encode(), wbits=zlib.MAX_WBITS | 16),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url))
    assert backend.served_model == MODEL and backend.context_limit == 8192
    fake_server.raw["/v1/models"] = Raw(b"\x1f\x8b not gzip", headers={"Content-Encoding": "gzip"})
    with pytest.raises(BackendError, match="a compressed reply to /v1/models that does not"):
        OpenAIBackend(ServerOptions(base_url=fake_server.url))


@pytest.mark.parametrize(
    ("path", "trickle"),
    [("/v1/models", "head"), ("/v1/chat/completions", "body")],
    ids=["headers-of-the-model-list", "body-of-a-completion"],
)
def test_a_server_that_trickles_is_cut_off_at_the_timeout(cli, fake_server, doc, path, trickle):
    """A byte a second never lets a socket's own timeout pass; --timeout bounds the call."""
    reply = b'{"choices": [{"message": {"content": "trickled"}}]}' + b" " * 30
    fake_server.raw[path] = Raw.json(MODELS) if path == "/v1/models" else Raw(reply)
    fake_server.raw[path].trickle, fake_server.raw[path].every = trickle, 0.25
    started = time.monotonic()
    result = ask(cli, fake_server, doc, "--timeout", "2")
    took = time.monotonic() - started
    assert_clean_failure(result, 1, f"did not answer {path} within 2 seconds (--timeout)")
    assert took < 2 + 3, took  # the whole reply would take 30 s or more


def test_a_servers_error_text_is_shortened_to_one_line(cli, fake_server, doc):
    page = "Internal failure:\n" + "  at handler (server.js:1)\n" * 5000
    fake_server.raw["/v1/models"] = Raw.json({"error": {"message": page}}, status=400)
    result = ask(cli, fake_server, doc)
    assert_clean_failure(result, 1, "answered HTTP 400 to /v1/models: Internal failure: at handler")
    (line,) = result.stderr.strip().splitlines()
    assert len(line) < 400 and line.endswith("….")

    # Without a JSON body, the status line's own words, shortened as well.
    fake_server.raw["/v1/models"] = Raw(b"<html>", status=400, reason="Bad " * 1000)
    result = ask(cli, fake_server, doc)
    assert_clean_failure(result, 1, "answered HTTP 400 to /v1/models: Bad Bad")
    (line,) = result.stderr.strip().splitlines()
    assert len(line) < 400


MODEL_LISTS = {
    "data-not-a-list": Raw.json({"object": "list", "data": {"id": MODEL}}),
    "model-without-id": Raw.json({"data": [{"object": "model"}]}),
    "id-not-a-string": Raw.json({"data": [{"id": 7}]}),
    "model-not-an-object": Raw.json({"data": [MODEL]}),
}


@pytest.mark.parametrize("listed", MODEL_LISTS.values(), ids=MODEL_LISTS.keys())
def test_a_model_list_of_another_shape_is_one_sentence(cli, fake_server, doc, listed):
    fake_server.raw["/v1/models"] = listed
    result = ask(cli, fake_server, doc)
    assert_clean_failure(result, 1, "answered /v1/models with a list memagent cannot read")


NOT_OBJECTS = {
    "not-json": Raw(b"<html>It works!</html>"),
    "a-list": Raw.json([MODEL]),
    "nested-past-python": Raw(b"[" * 100_000 + b"]" * 100_000),
    "not-utf-8": Raw(b'{"data": "\xff\xfe"}'),
}


@pytest.mark.parametrize("reply", NOT_OBJECTS.values(), ids=NOT_OBJECTS.keys())
def test_a_reply_that_is_not_a_json_object_is_one_sentence(cli, fake_server, doc, reply):
    fake_server.raw["/v1/models"] = reply
    result = ask(cli, fake_server, doc)
    assert_clean_failure(result, 1, "did not answer a JSON object at /v1/models")


def completion(**fields: object) -> Raw:
    reply = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}
    reply.update(fields)
    return Raw.json(reply)


COMPLETIONS = {
    "no-choices": (Raw.json({"object": "chat.completion"}), "without a message's text"),
    "no-choice": (completion(choices=[]), "without a message's text"),
    "choice-not-an-object": (completion(choices=["x"]), "without a message's text"),
    "message-a-string": (completion(choices=[{"message": "x"}]), "without a message's text"),
    "text-a-number": (completion(choices=[{"message": {"content": 5}}]), "a message's text"),
    "usage-a-string": (completion(usage="lots"), "whose usage, timings or finish_reason"),
    "tokens-a-string": (completion(usage={"prompt_tokens": "12"}), "whose usage, timings"),
    "tokens-negative": (completion(usage={"completion_tokens": -3}), "whose usage, timings"),
    "timings-a-string": (completion(timings={"prompt_ms": "fast"}), "whose usage, timings"),
    "finish-a-number": (
        completion(choices=[{"message": {"content": "x"}, "finish_reason": 1}]),
        "whose usage, timings or finish_reason",
    ),
}


@pytest.mark.parametrize(("reply", "said"), COMPLETIONS.values(), ids=COMPLETIONS.keys())
def test_a_completion_of_another_shape_is_one_sentence(cli, fake_server, doc, reply, said):
    fake_server.raw["/v1/chat/completions"] = reply
    result = ask(cli, fake_server, doc)
    assert_clean_failure(result, 1, f"The server at {fake_server.url[:-3]} sent a completion")
    assert said in words(result.stderr)


def test_tokens_of_another_shape_are_one_sentence():
    with FakeServer(tokenizer=True) as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url))
        assert backend.tokenize("ab") == [97, 98]  # llama-server's endpoint, a token a byte
        for tokens in (["a"], [{"piece": "a"}], [-1], [True], "97 98", 97):
            server.raw["/tokenize"] = Raw.json({"tokens": tokens})
            with pytest.raises(BackendError, match="answered /tokenize without a list of token"):
                backend.tokenize("ab")
        server.raw["/detokenize"] = Raw.json({"content": ["a"]})
        with pytest.raises(BackendError, match="answered /detokenize without the text"):
            backend.detokenize([120])  # a token not seen: 97's piece came with its tokens


def test_a_completion_of_the_usual_shape_still_reads(fake_server):
    """The checks pass what servers send: no usage, null text, float timings."""
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url))
    fake_server.raw["/v1/chat/completions"] = completion(
        choices=[{"message": {"content": None}, "finish_reason": None}],
        usage=None,
        timings={"prompt_ms": 12.5},
    )
    reply = backend.generate("hello", max_tokens=8, sampling=Sampling())
    assert (reply.text, reply.prompt_tokens, reply.finish_reason) == ("", 0, "stop")


def slow(raw: Raw, every: float = 0.05) -> Raw:
    raw.trickle, raw.every = "body", every
    return raw


# Failures that are retried, each taking about 1.8 s: a 5xx error, and a reply cut off
# (the connection closes before the Content-Length it announced).
SLOW_FAILURES = {
    "5xx": slow(Raw(b'{"error": {"message": "overloaded"}}', status=500)),
    "dropped": slow(
        Raw(
            b'{"choices": [' + b" " * 23,
            headers={"Content-Type": "application/json", "Content-Length": "1000"},
        )
    ),
}


@pytest.mark.parametrize("failure", SLOW_FAILURES.values(), ids=SLOW_FAILURES.keys())
def test_retries_end_when_the_timeout_does(fake_server, failure):
    """--timeout bounds the call, not each try: five tries of 1.8 s and the waits between
    them would take 24 s."""
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url, timeout=3))
    fake_server.raw["/v1/chat/completions"] = failure
    started = time.monotonic()
    with pytest.raises(BackendError):
        backend.generate("hello", max_tokens=8, sampling=Sampling())
    assert time.monotonic() - started < 3 + 1.5


def test_a_busy_server_is_waited_for_no_longer_than_the_timeout():
    """Each wait as the server asks, but all of them within --timeout: a server that is
    always busy would otherwise be asked again for ten minutes."""
    with FakeServer(busy=10**6, retry_after="1") as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url, timeout=3))
        started = time.monotonic()
        with pytest.raises(BackendError, match="answered HTTP 429 .* too many requests"):
            backend.generate("hello", max_tokens=8, sampling=Sampling())
        assert time.monotonic() - started < 3 + 1.5
        assert 2 <= len(server.turned_away) <= 4  # about a second apart


def test_a_model_list_that_never_comes_is_given_seconds_not_the_timeout(fake_server):
    """A byte every half second keeps each read alive; the limit of first contact (10 s by
    default, 2 here to keep the suite short) bounds the whole reply."""
    fake_server.raw["/v1/models"] = Raw.json(MODELS)
    fake_server.raw["/v1/models"].trickle, fake_server.raw["/v1/models"].every = "head", 0.5
    started = time.monotonic()
    with pytest.raises(BackendError, match=r"did not answer /v1/models within 2 seconds\.$"):
        OpenAIBackend(ServerOptions(base_url=fake_server.url, timeout=120), discovery_seconds=2)
    assert time.monotonic() - started < 2 + 3


def empty_objects(before: bytes, size: int, after: bytes) -> bytes:
    """About `size` bytes of JSON that is mostly `{},{},...`: json.loads makes about 25
    bytes of Python objects of each byte, the most any JSON makes."""
    return before + b"{}," * (size // 3) + b"{}" + after


def test_a_model_list_is_read_no_further_than_a_model_list_can_be(fake_server):
    # 32 MiB: within the bound of any reply, but parsed it would take about 800 MB.
    reply = empty_objects(b'{"data": [', 32 << 20, b"]}")
    fake_server.raw["/v1/models"] = Raw(reply)
    tracemalloc.start()
    try:
        with pytest.raises(BackendError, match="sent more than 8 MiB in reply to /v1/models"):
            OpenAIBackend(ServerOptions(base_url=fake_server.url))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The server's copy of its reply (in this process too) and the bound read, never parsed.
    assert peak < 64 << 20


def test_a_completion_is_read_no_further_than_its_tokens_can_take(fake_server):
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url))
    fake_server.raw["/v1/chat/completions"] = Raw(empty_objects(b'{"choices": [', 4 << 20, b"]}"))
    tracemalloc.start()
    try:
        # 1 MiB, and 256 bytes for each token it may have (128): far above a real reply.
        with pytest.raises(BackendError, match=r"sent more than 1\.03 MiB in reply to /v1/chat"):
            backend.generate("hello", max_tokens=128, sampling=Sampling())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the server's 4 MiB and the bound read
