"""The OpenAI-compatible backend against a real server on 127.0.0.1: llama-cpp-python's own
(`llama_cpp.server`, started with memagent's weight placement) running the default model."""

from __future__ import annotations

import gc
import json
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

import pytest
from support.command import interrupt_after_steps
from support.models import default_model_path
from support.story import FACT_QUESTION, story

from memagent_cli.trace import read_trace

SECOND_QUESTION = "Who painted the red barn?"
CHUNK, MEMORY = 500, 64  # small: the suite stays short
SMALL_STEPS = ["--chunk-tokens", str(CHUNK), "--memory-tokens", str(MEMORY), "--temperature", "0"]


class Server:
    """llama_cpp.server (through backends/llama_server.py, or its own `module`) with the
    default model on a free loopback port; stops itself."""

    def __init__(self, module: str = "memagent_cli.backends.llama_server") -> None:
        self.module = module
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None

    def start(self) -> Server:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.module,
                "--model",
                str(default_model_path()),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--n_ctx",
                "4096",
                "--n_threads",
                "2",
                "--verbose",
                "false",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/models", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError("llama_cpp.server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None


@pytest.fixture
def server():
    running = Server()
    yield running
    running.stop()


@dataclass
class Reading:
    memories: list[str]
    reply: str
    tokens: int  # the document's, in the model's own tokens
    windows: list[list[int]]  # each step's [first, end) tokens


def read_single_row(doc, question: str) -> Reading:
    """The run `ask` makes, decoded as llama.cpp's own completion path decodes (one row per
    token, no flash attention): the reference a llama.cpp server must match."""
    from memagent_cli.backend import Sampling
    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
    from memagent_cli.chunking import chunk_text
    from memagent_cli.documents import load_document
    from memagent_cli.reader import Settings, context_needed, read

    backend = LlamaCppBackend(
        default_model_path(),
        LlamaOptions(threads=2, gpu_layers=0, speculate=False, exact=False, flash_attn="off"),
    )
    settings = Settings(CHUNK, MEMORY, Sampling(temperature=0.0))
    backend.prepare(context_needed(backend, [question], settings))
    tokens, chunks = chunk_text(load_document(str(doc)).text, backend, CHUNK)
    answer = read(backend, question, chunks, settings)
    del backend
    gc.collect()  # the weights go before the server loads its own
    windows = [[c.token_start, c.token_end] for c in chunks]
    return Reading([s.memory for s in answer.steps], answer.reply, len(tokens), windows)


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_a_server_answers_like_the_in_process_model(memagent, tmp_path, server):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(80))  # two chunks: a memory carried from one call to the next
    ask = [str(doc), FACT_QUESTION, *SMALL_STEPS, "--json", "--no-reuse"]
    plain = read_single_row(doc, FACT_QUESTION)

    server.start()  # after the in-process runs: one llama.cpp at a time on this machine
    remote = memagent(
        "ask",
        *ask,
        "--backend",
        "openai",
        "--base-url",
        server.url,
        "--trace",
        str(tmp_path / "remote.jsonl"),
    )
    assert remote.returncode == 0, remote.stderr
    got = json.loads(remote.stdout)
    assert got["document"]["tokens"] == plain.tokens  # the server's tokenizer is the model's
    assert [s["tokens"] for s in got["steps"]] == plain.windows
    assert got["model"]["path"] == server.url
    # The same protocol, so the same answers: the server decodes on llama.cpp's single-row
    # kernels, memagent's exact decoding always on its batched ones (so that speculation
    # changes nothing), and those differ in near-ties. Compare with the same kernels.
    remote_memories = [s.memory for s in read_trace(tmp_path / "remote.jsonl").steps]
    assert remote_memories == plain.memories and got["reply"] == plain.reply

    # Two questions, two runs in flight, answers in the order asked.
    both = memagent(
        "ask",
        str(doc),
        FACT_QUESTION,
        SECOND_QUESTION,
        *SMALL_STEPS,
        "--json",
        "--backend",
        "openai",
        "--base-url",
        server.url,
        "--parallel",
        "2",
    )
    assert both.returncode == 0, both.stderr
    lines = [json.loads(line) for line in both.stdout.splitlines()]
    assert [line["question"] for line in lines] == [FACT_QUESTION, SECOND_QUESTION]
    assert lines[0]["reply"] == got["reply"]  # the same server, the same reading
    assert "[q1] step" in both.stderr and "[q2] step" in both.stderr


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_a_server_stopped_mid_run_leaves_a_trace_to_resume(memagent, env, tmp_path, server):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(170))  # 4 chunks
    cut = tmp_path / "cut.jsonl"
    server.start()
    args = [
        str(doc),
        FACT_QUESTION,
        *SMALL_STEPS,
        "--backend",
        "openai",
        "--base-url",
        server.url,
        "--timeout",  # bounds the tries against the stopped server (15 s of backoff else)
        "6",
        "--trace",
        str(cut),
    ]
    process, stdout, stderr = interrupt_after_steps(
        args, cut, env, 1, interrupt=lambda process: server.stop()
    )
    assert process.returncode == 1, stderr
    assert stdout == "" and "Traceback" not in stderr
    assert "Cannot reach the server" in stderr and "resume with: memagent ask" in stderr
    trace = read_trace(cut)
    assert not trace.finished and len(trace.steps) >= 1
    assert "Cannot reach the server" in trace.interruption.reason

    server.start()
    resumed = memagent("ask", *args[:-2], "--resume", str(cut), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert read_trace(cut).finished
    assert len(json.loads(resumed.stdout)["steps"]) == trace.header.total_steps


RULED = "".join(
    f"Part {i}\n{'=' * 80}\nThe keeper counted {i * 7} boats.{' ' * 40}\n" for i in range(9)
)


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_every_character_reaches_the_server(memagent, tmp_path, server):
    """Runs of 80 `=` and 40 spaces are tokens past the 32 bytes llama-cpp-python's server
    detokenized: through memagent's start of it every one comes back. (Its own start, which
    drops them, is test_ask.py's stand-in: on a CPU with AMX it crashes.)"""
    doc = tmp_path / "ruled.txt"
    doc.write_text(RULED)
    server.start()
    try:
        result = memagent(
            "ask", str(doc), FACT_QUESTION, "--chunk-tokens", "64", "--memory-tokens", "8",
            "--temperature", "0", "--json", "--no-reuse", "--backend", "openai",
            "--base-url", server.url,
        )  # fmt: skip
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    ranges = [step["chars"] for step in out["steps"]]
    assert len(ranges) >= 3
    assert (
        ranges[0][0] == 0 and ranges[-1][1] == len(RULED.rstrip()) == out["document"]["characters"]
    )
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert "drops" not in result.stderr and "tiktoken" not in result.stderr
    assert out["document"]["tokens"] > len(out["steps"]) * 32  # the model's tokens, not bytes


def test_an_unreachable_server_is_one_sentence(memagent, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("text")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = memagent(
        "ask", str(doc), "q?", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1"
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "Cannot reach the server" in result.stderr and "Traceback" not in result.stderr
