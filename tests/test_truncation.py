"""A server that cuts a prompt to a context smaller than one step (Ollama with its default
num_ctx) is caught from the usage it reports: one sentence, exit 1, the trace kept to the
last finished step. A server that reads the whole prompt is never flagged, through chat
completions or InfMem's /v1/completions. All against tests/fake_openai.py on 127.0.0.1,
whose stand-in counts a word a token (about 0.9 of tiktoken's count on these stories)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FACT_QUESTION, assert_clean_failure, served, story, words
from fake_openai import Raw

from memagent_cli.backend import Sampling
from memagent_cli.backends.openai import BackendError, OpenAIBackend, ServerOptions
from memagent_cli.trace import read_trace

# Chunks of the default size: a first step's prompt of about 5,150 tokens, more than
# Ollama's default context of 4,096.
BIG_STEPS = ["--chunk-tokens", "5000", "--memory-tokens", "64", "--temperature", "0", "-q"]
SMALL_STEPS = ["--chunk-tokens", "3000", "--memory-tokens", "64", "--temperature", "0", "-q"]
ADVICE = (
    "give it a larger context (Ollama: num_ctx, or OLLAMA_CONTEXT_LENGTH) or lower --chunk-tokens"
)


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("books") / "village.txt"
    path.write_text(story(3000))  # about 33K tokens: seven steps of 5,000
    return path


def test_a_prompt_cut_to_a_round_context_stops_in_one_sentence(cli, fake_server, book, tmp_path):
    """Ollama's way: every longer prompt read to num_ctx (4,096 here) and that count
    reported; the first step's prompt of about 5,200 tokens is caught."""
    fake_server.cut_to = 4096
    trace_path = tmp_path / "cut.jsonl"
    result = cli(
        "ask",
        str(book),
        FACT_QUESTION,
        *served(fake_server, *BIG_STEPS),
        "--trace",
        str(trace_path),
    )
    assert_clean_failure(result, 1, "The server read 4,096 of the prompt's about 5,", ADVICE)
    assert "smaller than one step" in result.stderr
    assert fake_server.chat_calls == 1
    trace = read_trace(trace_path)
    assert not trace.finished and trace.steps == []


def test_a_cut_after_finished_steps_keeps_them_in_the_trace(cli, fake_server, book, tmp_path):
    fake_server.cut_to, fake_server.cut_after = 4096, 2
    trace_path = tmp_path / "cut.jsonl"
    result = cli(
        "ask",
        str(book),
        FACT_QUESTION,
        *served(fake_server, *BIG_STEPS),
        "--trace",
        str(trace_path),
    )
    assert_clean_failure(result, 1, "The server read 4,096 of the prompt's about", ADVICE)
    assert "Stopped after 2 of" in words(result.stderr) and "resume with:" in result.stderr
    trace = read_trace(trace_path)
    assert not trace.finished and [s.index for s in trace.steps] == [0, 1]
    # What was read whole goes on whole once the server reads the rest.
    fake_server.cut_to = None
    resumed = cli(
        "ask",
        str(book),
        FACT_QUESTION,
        *served(fake_server, *BIG_STEPS),
        "--resume",
        str(trace_path),
    )
    assert resumed.returncode == 0, resumed.stderr
    assert read_trace(trace_path).finished


def test_a_prompt_read_to_far_less_than_was_sent_stops(cli, fake_server, book):
    """A context of no round size is caught when it reads less than half of the prompt."""
    fake_server.cut_to = 1000
    result = cli("ask", str(book), FACT_QUESTION, *served(fake_server, *SMALL_STEPS), "--no-trace")
    assert_clean_failure(result, 1, "The server read 1,000 of the prompt's about 3,", ADVICE)


def test_a_server_that_reads_the_whole_prompt_is_never_flagged(cli, fake_server, book):
    """The stand-in counts fewer tokens than tiktoken (a word a token), as a model's own
    tokenizer may: neither long steps nor short ones are taken for a cut."""
    for steps in (BIG_STEPS, SMALL_STEPS):
        result = cli("ask", str(book), FACT_QUESTION, *served(fake_server, *steps), "--json")
        assert result.returncode == 0, result.stderr
        assert "The server read" not in result.stderr


def test_a_context_larger_than_the_step_is_never_flagged(cli, fake_server, book):
    """A server with num_ctx set larger than a step reads every prompt whole."""
    fake_server.cut_to = 8192
    result = cli("ask", str(book), FACT_QUESTION, *served(fake_server, *BIG_STEPS), "--no-trace")
    assert result.returncode == 0, result.stderr


def test_infmem_through_completions_is_flagged_only_when_cut(memagent, fake_server, book):
    """InfMem's prompts go to /v1/completions (readers/infmem.py): the same check there."""
    args = [str(book), FACT_QUESTION, *served(fake_server, *SMALL_STEPS), "--reader", "infmem"]
    honest = memagent("ask", *args, "--json", "--no-trace")
    assert honest.returncode == 0, honest.stderr
    assert json.loads(honest.stdout)["chunks_read"] >= 1
    fake_server.cut_to = 1024
    cut = memagent("ask", *args, "--no-trace", "--no-reuse")
    assert_clean_failure(cut, 1, "The server read 1,024 of the prompt's about", ADVICE)
    assert fake_server.chat_calls == 0


LONG, SHORT = story(260), story(200)  # 2,902 and 2,236 tiktoken tokens


@pytest.mark.parametrize(
    ("text", "read", "flagged"),
    [
        (LONG, 0, False),  # no usage reported: nothing to check
        (LONG, 3000, False),  # read whole, with a chat template's tokens
        (LONG, 2048, True),  # a context's size, 71% of tiktoken's count: cut
        (LONG, 2047, False),  # no context's size, above half: a tokenizer's spread
        (LONG, 1452, False),  # just above half
        (LONG, 1450, True),  # under half: cut, whatever the count
        (SHORT, 2048, False),  # a context's size, but 92% of tiktoken's count
    ],
)
def test_the_rule_that_tells_a_cut_from_a_tokenizer(fake_server, text, read, flagged):
    """What the server says it read, against the prompt memagent sent (a chat completion
    with that usage, as a server would answer)."""
    backend = OpenAIBackend(ServerOptions(base_url=fake_server.url))
    about = len(backend.tokenize(text))
    assert about == (2902 if text is LONG else 2236)
    reply = {
        "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": read, "completion_tokens": 1},
    }
    fake_server.raw["/v1/chat/completions"] = Raw.json(reply)
    sampling = Sampling(temperature=0.0, top_p=1.0)
    if flagged:
        with pytest.raises(BackendError, match=f"read {read:,} of the prompt's about 2,900 "):
            backend.generate(text, max_tokens=8, sampling=sampling)
    else:
        assert backend.generate(text, max_tokens=8, sampling=sampling).prompt_tokens == read
