"""PI-Mem's passes with the real model in-process: a pass's chunk calls decoded together,
each in a sequence of its own of one llama.cpp context, give byte for byte what they give
asked one by one (--exact, greedy), in the library and through `ask --parallel`."""

from __future__ import annotations

import json

import pytest
from support.story import FACT_QUESTION, story

from memagent_cli import readers
from memagent_cli.backend import Sampling
from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions
from memagent_cli.chunking import make_chunks
from memagent_cli.reader import Settings, read
from memagent_cli.scheduler import Job, read_together

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("on_tiny_model")]

SETTINGS = Settings(150, 24, Sampling(temperature=0.0), reader="pi-mem")


def test_a_pass_read_together_equals_its_chunks_read_one_by_one(tiny_model):
    backend = LlamaCppBackend(tiny_model, LlamaOptions(threads=2, gpu_layers=0, exact=True))
    tokens = backend.tokenize(story(30, seed=7))
    chunks = make_chunks(tokens, SETTINGS.chunk_tokens, backend.detokenize)
    assert len(chunks) >= 3
    spec = readers.get("pi-mem")
    context = spec.context_needed(backend, [FACT_QUESTION], SETTINGS, len(chunks))
    backend.prepare(context, sequences=len(chunks))
    rounds = []
    asked = backend.next_replies

    def counted(calls, *, sampling):
        rounds.append(len(calls))
        return asked(calls, sampling=sampling)

    alone = read(backend, FACT_QUESTION, chunks, SETTINGS, reader=spec.loop(backend, tokens))
    backend.next_replies = counted
    job = Job(FACT_QUESTION, reader=spec.loop(backend, tokens))
    [together] = read_together(backend, [job], chunks, SETTINGS, slots=len(chunks))
    assert rounds[0] == len(chunks)  # the first pass's chunk calls, at once
    assert [s.memory for s in together.steps] == [s.memory for s in alone.steps]
    assert [s.extra for s in together.steps] == [s.extra for s in alone.steps]
    assert together.reply == alone.reply


def test_ask_parallel_reads_a_pass_together_as_one_by_one(memagent, tmp_path):
    book = tmp_path / "village.txt"
    book.write_text(story(30, seed=7))
    args = [
        *("ask", str(book), FACT_QUESTION, "--reader", "pi-mem", "--exact", "--no-trace"),
        *("--chunk-tokens", "150", "--memory-tokens", "24", "--temperature", "0", "--json"),
    ]
    one = memagent(*args, "--parallel", "1")
    three = memagent(*args, "--parallel", "3")
    assert one.returncode == 0, one.stderr
    assert three.returncode == 0, three.stderr
    alone, together = json.loads(one.stdout), json.loads(three.stdout)
    assert alone["document"]["chunks"] >= 3
    assert [s["memory"] for s in together["steps"]] == [s["memory"] for s in alone["steps"]]
    assert together["reply"] == alone["reply"]
