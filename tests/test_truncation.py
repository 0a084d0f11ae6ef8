"""A server that cuts a prompt to a context smaller than one step (Ollama with its default
num_ctx) is caught from the usage it reports: one sentence, exit 1, the trace kept to the
last finished step. A server that reads the whole prompt is never flagged, however few
tokens its tokenizer counts, through chat completions or InfMem's /v1/completions. All
against tests/support/fake_openai.py on 127.0.0.1, whose usage counts tiktoken's tokens, or a word a
token (`count_words`: far fewer on text of few spaces, as a model's tokenizer may count
far fewer than tiktoken on a script it has many tokens for)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.command import assert_clean_failure, words
from support.fake_openai import Raw, served
from support.story import FACT_QUESTION, story

from memagent_cli.backend import Sampling
from memagent_cli.backends.openai import BackendError, OpenAIBackend, ServerOptions
from memagent_cli.trace import read_trace

# Chunks of the default size: a first step's prompt of about 5,150 tokens, more than
# Ollama's default context of 4,096.
STEPS = ["--chunk-tokens", "5000", "--memory-tokens", "64", "--temperature", "0", "-q"]
ADVICE = (
    "give it a larger context (Ollama: num_ctx, or OLLAMA_CONTEXT_LENGTH) or lower --chunk-tokens"
)


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("books") / "village.txt"
    path.write_text(story(3000))  # about 33K tokens: seven steps of 5,000
    return path


def ask(cli, server, book: Path, *more: str):
    return cli("ask", str(book), FACT_QUESTION, *served(server, *STEPS, *more))


def test_a_prompt_cut_to_the_context_stops_in_one_sentence(cli, fake_server, book, tmp_path):
    """Ollama's way: every longer prompt read to num_ctx (4,096 here) and that count
    reported; the first step's prompt of about 5,200 tokens is caught, by one more call."""
    fake_server.cut_to = 4096
    trace_path = tmp_path / "cut.jsonl"
    result = ask(cli, fake_server, book, "--trace", str(trace_path))
    assert_clean_failure(result, 1, "The server read 4,096 of the prompt's about 5,", ADVICE)
    assert "smaller than one step" in result.stderr
    assert fake_server.chat_calls == 2  # the step, and the probe that tells the cut
    assert fake_server.messages[1] == "the" + " the" * (4096 + 63)
    trace = read_trace(trace_path)
    assert not trace.finished and trace.steps == []


def test_a_cut_after_finished_steps_keeps_them_in_the_trace(cli, fake_server, tmp_path):
    """Two chunks that the server reads whole (Chinese: few words, so few tokens to a
    server that counts words), then prose it cuts: the two steps stay in the trace, and a
    resume against a server that reads the rest finishes the reading."""
    book = tmp_path / "mixed.txt"
    book.write_text("鹈鹕鹈鹕 " * 833 + "\n\n" + story(3000))  # 10,000 tokens of Chinese first
    fake_server.cut_to, fake_server.count_words = 4096, True
    trace_path = tmp_path / "cut.jsonl"
    result = ask(cli, fake_server, book, "--trace", str(trace_path))
    assert_clean_failure(result, 1, "The server read 4,096 of the prompt's about", ADVICE)
    assert "Stopped after 2 of" in words(result.stderr) and "resume with:" in result.stderr
    trace = read_trace(trace_path)
    assert not trace.finished and [s.index for s in trace.steps] == [0, 1]
    fake_server.cut_to = None
    resumed = ask(cli, fake_server, book, "--resume", str(trace_path))
    assert resumed.returncode == 0, resumed.stderr
    assert read_trace(trace_path).finished


def test_a_cut_to_no_round_size_is_caught_too(cli, fake_server, book):
    fake_server.cut_to = 3000
    result = ask(cli, fake_server, book, "--no-trace")
    assert_clean_failure(result, 1, "The server read 3,000 of the prompt's about 5,", ADVICE)


def test_a_server_that_reads_the_whole_prompt_is_never_flagged(cli, fake_server, book):
    """A server whose count is tiktoken's: no second look, no extra call."""
    for chunk in ("5000", "300"):
        result = ask(cli, fake_server, book, "--chunk-tokens", chunk, "--json")
        assert result.returncode == 0, result.stderr
        steps = len(json.loads(result.stdout)["steps"])
        assert fake_server.chat_calls == steps + 1
        fake_server.chat_calls = 0


def test_a_tokenizer_that_counts_far_fewer_is_not_a_cut(cli, fake_server, tmp_path):
    """Words of Chinese and Cyrillic counted a word a token, a tenth of tiktoken's count:
    a suspect is looked at once more, reads whole, and the reading ends as it would."""
    book = tmp_path / "pelican.txt"
    book.write_text("ПЕЛИКАН 鹈鹕 鹈鹕鹈鹕 " * 3000)
    fake_server.count_words = True
    fake_server.cut_to = 8192  # a context larger than a step: nothing is cut
    result = ask(cli, fake_server, book, "--json")
    assert result.returncode == 0, result.stderr
    steps = len(json.loads(result.stdout)["steps"])
    probes = [m for m in fake_server.messages if m.startswith("the the")]
    assert 1 <= len(probes) <= 2 and fake_server.chat_calls == steps + 1 + len(probes)


def test_a_context_larger_than_the_step_is_never_flagged(cli, fake_server, book):
    fake_server.cut_to = 8192
    assert ask(cli, fake_server, book, "--no-trace").returncode == 0


def test_infmem_through_completions_is_flagged_only_when_cut(memagent, fake_server, book):
    """InfMem's prompts go to /v1/completions (readers/infmem.py): the same check there."""
    steps = [*STEPS, "--chunk-tokens", "3000"]  # InfMem's calls hold more than MemAgent's
    args = [str(book), FACT_QUESTION, *served(fake_server, *steps), "--reader", "infmem"]
    honest = memagent("ask", *args, "--json", "--no-trace")
    assert honest.returncode == 0, honest.stderr
    assert json.loads(honest.stdout)["chunks_read"] >= 1
    assert not any(p.startswith("the the") for p in fake_server.prompts)
    fake_server.cut_to = 2048
    cut = memagent("ask", *args, "--no-trace", "--no-reuse")
    assert_clean_failure(cut, 1, "The server read 2,048 of the prompt's about 3,", ADVICE)
    assert fake_server.chat_calls == 0
    assert fake_server.prompts[-1] == "the" + " the" * (2048 + 63)


LONG = story(260)  # 2,902 tiktoken tokens


@pytest.mark.parametrize(
    ("read", "flagged"),
    [
        (0, False),  # no usage reported: nothing to check
        (3000, False),  # read whole, with a chat template's tokens
        (2500, False),  # 86%: a tokenizer's spread
        (2400, True),  # 83%, and the probe read no more: cut
        (1000, True),
    ],
)
def test_a_server_that_reports_one_count_for_every_prompt(fake_server, read, flagged):
    """A server that answers every prompt with the same usage, as one that cuts to that
    count does: a count under 85% of tiktoken's is looked at once more, and the probe,
    longer than it, is reported at the same count."""
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url))
    assert len(backend.tokenize(LONG)) == 2902
    reply = {
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": read, "completion_tokens": 1},
    }
    fake_server.raw["/v1/chat/completions"] = Raw.json(reply)
    sampling = Sampling(temperature=0.0, top_p=1.0)
    if flagged:
        with pytest.raises(BackendError, match=f"read {read:,} of the prompt's about 2,900 "):
            backend.generate(LONG, max_tokens=8, sampling=sampling)
    else:
        assert backend.generate(LONG, max_tokens=8, sampling=sampling).prompt_tokens == read


def test_a_probe_the_server_refuses_is_no_cut(fake_server):
    """A server that refuses the longer probe (its context is full) is one that refuses,
    not one that cuts: the step stands."""
    fake_server.fail_after, fake_server.fail_status = 1, 400
    fake_server.count_words = True
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url))
    text = story(260).replace(" ", "-")  # a few words to the stand-in: a suspect
    generation = backend.generate(text, max_tokens=8, sampling=Sampling(temperature=0.0))
    assert generation.prompt_tokens == len(text.split()) and fake_server.chat_calls == 2
