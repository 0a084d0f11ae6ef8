"""memagent as the client of a serving engine: a busy server is waited for as it asks
(429/503 with Retry-After), and many readings in flight at once, killed and run again,
are each read once and answered once. All against the stand-in server on 127.0.0.1
(tests/support/fake_openai.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx2
import pytest
from support.command import MEMAGENT
from support.fake_openai import MODEL, FakeServer, Raw, served
from support.story import FACT_QUESTION, story

from memagent_cli.backend import Sampling
from memagent_cli.backends import openai
from memagent_cli.backends.openai import BackendError, OpenAIBackend, ServerOptions, client
from memagent_cli.trace import TraceError, read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]


def answer(status: int, retry_after: str | None) -> httpx2.Response:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return httpx2.Response(status, headers=headers)


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
    monkeypatch.setattr(client, "MOST_BUSY_WAIT", 2.5)
    with FakeServer(busy=10**6, retry_after="1") as server:
        backend = OpenAIBackend(ServerOptions(base_url=server.url))
        started = time.monotonic()
        with pytest.raises(BackendError, match="answered HTTP 429 .* too many requests"):
            backend.generate("hello", max_tokens=8, sampling=Sampling())
        assert time.monotonic() - started >= 2.0
        assert len(server.turned_away) == 3  # waits of about 1 s until 2.5 s would be passed


def test_calls_go_through_the_proxy_the_environment_names(monkeypatch):
    """HTTP_PROXY is followed, NO_PROXY bypasses it, as any HTTP client does: the stand-in
    server answers as the proxy for a host that does not exist."""
    models = {"data": [{"id": "proxied", "max_model_len": 4096}]}
    far = "http://models.invalid/v1"  # .invalid never resolves: only a proxy reaches it
    with FakeServer(raw={f"{far}/models": Raw.json(models)}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/v1"))
        monkeypatch.setenv("NO_PROXY", "")
        backend = OpenAIBackend(ServerOptions(base_url=far))
        assert (backend.served_model, backend.context_limit) == ("proxied", 4096)
    with FakeServer() as server:
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert OpenAIBackend(ServerOptions(base_url=server.url)).served_model == MODEL


def traces_in(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["XDG_DATA_HOME"]) / "memagent" / "traces").glob("*.jsonl"))


def calls_kept(path: Path) -> int:
    """Model calls whose result a trace keeps: its steps, and its answer once finished (none
    where a kill came before its header was whole)."""
    try:
        kept = read_trace(path)
    except TraceError:
        return 0
    return len(kept.steps) + kept.finished


def kill_when(command: list[str], env: dict[str, str], ready, timeout: float = 120) -> str:
    """Start `memagent COMMAND`, SIGKILL it once `ready()` holds (no chance to clean up, as
    an out-of-memory kill or a lost machine); its stdout so far."""
    process = subprocess.Popen(
        [str(MEMAGENT), *command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None and not ready():
        time.sleep(0.02)
    process.kill()
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    return stdout


@pytest.fixture
def library(tmp_path) -> list[str]:
    """`ask` arguments for six short documents of 1 to 3 chunks, listed in a file."""
    folder = tmp_path / "library"
    folder.mkdir()
    paths = []
    for i in range(6):
        path = folder / f"book{i}.txt"
        path.write_text(story(25 + 12 * (i % 3), fact=None, seed=i))
        paths.append(str(path))
    listing = tmp_path / "documents.txt"
    listing.write_text("\n".join(paths) + "\n")
    return ["--documents", str(listing)]


def test_a_killed_batch_run_again_reads_only_what_is_missing_and_answers_each_once(
    memagent, env, library, tmp_path
):
    # Sampled (the default temperature): no greedy cache to fall back on, only the journal.
    questions = ["Who keeps the tower?", "What fell?"]
    args = ["ask", *library, *questions, "--chunk-tokens", "300", "--parallel", "3"]
    with FakeServer() as server:
        reference = dict(env, MEMAGENT_HOME=str(tmp_path / "reference" / "memagent"))
        whole = subprocess.run(
            [str(MEMAGENT), *args, *served(server)],
            capture_output=True, text=True, env=reference, timeout=120,
        )  # fmt: skip
        assert whole.returncode == 0, whole.stderr
        needed = server.chat_calls
        port = server.port  # the same server URL for every run below: the same model
    answers = whole.stdout.splitlines()
    assert len(answers) == 12

    def some_done_some_in_flight() -> bool:
        try:
            states = [read_trace(p) for p in traces_in(env)]
        except TraceError:  # a trace whose header is being written
            return False
        return sum(t.finished for t in states) >= 3 and any(
            t.steps and not t.finished for t in states
        )

    # However late the kill comes, the run cannot finish first: its last call waits. One
    # reading unfinished, missing only its answer or a step after the first, means every
    # other one has finished and it has a step: some done, some in flight.
    with FakeServer(delay=0.15, port=port, hold_after=needed - 1) as slow:
        printed = kill_when([*args, *served(slow)], env, some_done_some_in_flight)
    kept = sum(calls_kept(p) for p in traces_in(env))
    assert 0 < kept < needed and len(printed.splitlines()) < 12

    with FakeServer(port=port) as server:
        again = memagent(*args, *served(server))
        assert again.returncode == 0, again.stderr
        assert server.chat_calls == needed - kept  # nothing kept was asked again
    assert again.stdout.splitlines() == answers  # every answer once, in order
    assert "finished before this command was stopped" in again.stderr
    assert "resuming" in again.stderr
    # One trace per document and question: none was started twice.
    assert len(traces_in(env)) == 12 and all(read_trace(p).finished for p in traces_in(env))

    # Finished, the batch is forgotten: the same command again is a new batch.
    with FakeServer(port=port) as server:
        fresh = memagent(*args, *served(server), "-q")
        assert fresh.returncode == 0 and server.chat_calls == needed


def test_a_trace_killed_before_its_header_is_written_again_not_twice(
    memagent, env, library, tmp_path
):
    # A kill lands between the journal's line and the trace's header: the trace the journal
    # names is missing or holds half a header. The next run writes that same trace.
    args = ["ask", *library, "Who keeps the tower?", "--chunk-tokens", "300", "--parallel", "2"]
    with FakeServer(fail_after=4, fail_status=400) as server:
        stopped = memagent(*args, *served(server))
        port = server.port
    assert stopped.returncode != 0
    journals = list((Path(env["XDG_DATA_HOME"]) / "memagent" / "batches").glob("*.jsonl"))
    assert len(journals) == 1, stopped.stderr
    named = [
        Path(entry["trace"])
        for entry in map(json.loads, journals[0].read_text().splitlines())
        if "reading" in entry
    ]
    assert len(named) >= 2
    named[0].write_text(named[0].read_text()[:40])  # half a header, no line end
    named[1].unlink()
    with FakeServer(port=port) as server:
        again = memagent(*args, *served(server))
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.splitlines()) == 6
    traces = traces_in(env)
    assert len(traces) == 6 and all(read_trace(p).finished for p in traces)
    assert {named[0], named[1]} <= set(traces)


def test_a_killed_evaluation_run_again_reads_only_what_is_missing(memagent, env, tmp_path):
    cases = [
        {
            "_id": f"c{i}",
            "input": "Which word opens the text?",
            "context": f"Word{i} opens this text. " + story(20 + 15 * (i % 3), fact=None, seed=i),
            "answers": [f"Word{i}"],
        }
        for i in range(6)
    ]
    data = tmp_path / "eval_100.json"
    data.write_text(json.dumps(cases))
    out = tmp_path / "run.jsonl"
    args = ["eval", str(data), "--chunk-tokens", "300", "--parallel", "2", "-o", str(out)]
    with FakeServer() as server:
        reference = dict(env, MEMAGENT_HOME=str(tmp_path / "reference" / "memagent"))
        whole = subprocess.run(
            [str(MEMAGENT), *args[:-1], str(tmp_path / "whole.jsonl"), *served(server)],
            capture_output=True, text=True, env=reference, timeout=120,
        )  # fmt: skip
        assert whole.returncode == 0, whole.stderr
        needed, port = server.chat_calls, server.port

    def recorded() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    def some_done_some_in_flight() -> bool:
        try:
            states = [read_trace(p) for p in traces_in(env)]
        except TraceError:
            return False
        return len(recorded()) >= 1 and any(t.steps and not t.finished for t in states)

    # The run's last call waits, as above: a case with a step is in flight and, results being
    # written in order, those before it are recorded.
    with FakeServer(delay=0.15, port=port, hold_after=needed - 1) as slow:
        kill_when([*args, *served(slow)], env, some_done_some_in_flight)
    kept = sum(calls_kept(p) for p in traces_in(env))
    assert 1 <= len(recorded()) < 6

    with FakeServer(port=port) as server:
        again = memagent(*args, *served(server))
        assert again.returncode == 0, again.stderr
        assert server.chat_calls == needed - kept
    assert sorted(r["id"] for r in recorded()) == [f"c{i}" for i in range(6)]  # each once
    whole_lines = (tmp_path / "whole.jsonl").read_text().splitlines()
    expected = {r["id"]: r["reply"] for r in map(json.loads, whole_lines)}
    assert {r["id"]: r["reply"] for r in recorded()} == expected
    assert len(traces_in(env)) == 6
