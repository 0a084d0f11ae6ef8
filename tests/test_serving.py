"""memagent as the client of a serving engine: a busy server is waited for as it asks
(429/503 with Retry-After), and many readings in flight at once, killed and run again,
are each read once and answered once. All against the stand-in server on 127.0.0.1
(tests/fake_openai.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from conftest import FACT_QUESTION, served, story
from fake_openai import FakeServer

from memagent_cli.backend import Sampling
from memagent_cli.backends import openai
from memagent_cli.backends.openai import BackendError, OpenAIBackend, ServerOptions

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]


def answer(status: int, retry_after: str | None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx.Response(status, headers=headers)


def test_retry_after_is_read_as_seconds_or_a_date_and_kept_within_bounds():
    assert openai.retry_after(answer(429, "3")) == 3.0
    assert openai.retry_after(answer(503, "2.5")) == 2.5
    assert openai.retry_after(answer(429, "0")) == 1.0  # at least a second: bounded tries
    assert openai.retry_after(answer(429, "86400")) == 60.0  # at most a minute per wait
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= openai.retry_after(answer(429, later)) <= 30
    assert openai.retry_after(answer(429, "soon")) is None  # unreadable: plain backoff
    assert openai.retry_after(answer(429, None)) is None
    assert openai.retry_after(answer(500, "3")) is None  # only a busy server's counts


def test_a_busy_server_is_asked_again_when_it_says(memagent, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(30))
    with FakeServer(busy=2, retry_after="1.5") as server:
        result = memagent("ask", str(doc), FACT_QUESTION, *served(server, *STEPS), "-q")
        assert result.returncode == 0, result.stderr
        first_try, second_try = server.turned_away
        # Waited as asked both times; the plain backoff would have waited 1 s, then 2 s.
        assert second_try - first_try >= 1.5
        assert server.answered[0] - second_try >= 1.5
    with FakeServer() as calm:
        expected = memagent("ask", str(doc), FACT_QUESTION, *served(calm, *STEPS), "-q")
    assert result.stdout == expected.stdout


def test_a_server_busy_for_too_long_is_one_sentence(monkeypatch):
    monkeypatch.setattr(openai, "_MOST_BUSY_WAIT", 2.5)
    with FakeServer(busy=10**6, retry_after="1") as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url))
        started = time.monotonic()
        with pytest.raises(BackendError, match="answered HTTP 429 .* too many requests"):
            backend.generate("hello", max_tokens=8, sampling=Sampling())
        assert time.monotonic() - started >= 2.0
        assert len(server.turned_away) == 3  # waits of about 1 s until 2.5 s would be passed
