"""End to end: the real `memagent ask` with the real default model in llama.cpp, greedy."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FACT, FACT_QUESTION, FACT_VALUE, MEMAGENT, story

from memagent_cli.trace import read_trace

pytestmark = pytest.mark.model

SMALL_STEPS = ["--chunk-tokens", "2000", "--memory-tokens", "128", "--temperature", "0"]


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    """About 20K model tokens of plain sentences; the planted fact opens the first chunk."""
    path = tmp_path_factory.mktemp("docs") / "village.txt"
    path.write_text(story(1800))
    return path


def test_ask_finds_a_fact_in_a_20k_token_text(memagent, book, tmp_path):
    trace_path = tmp_path / "run.jsonl"
    result = memagent("ask", str(book), FACT_QUESTION, *SMALL_STEPS, "--trace", str(trace_path))

    assert result.returncode == 0, result.stderr
    assert FACT_VALUE in result.stdout
    assert "Traceback" not in result.stderr
    assert "llama" not in result.stderr and "ggml" not in result.stderr  # llama.cpp stays quiet

    trace = read_trace(trace_path)
    document = trace.header["document"]
    assert document["tokens"] >= 20_000
    assert document["chunks"] == -(-document["tokens"] // 2000)
    assert len(trace.steps) == document["chunks"]
    assert [s["index"] for s in trace.steps] == list(range(document["chunks"]))
    assert trace.steps[0]["tokens"] == [0, 2000]
    assert trace.steps[-1]["tokens"][1] == document["tokens"]
    assert FACT_VALUE in trace.steps[-1]["memory"]
    assert trace.final is not None and FACT_VALUE in trace.final["reply"]
    assert trace.header["settings"]["temperature"] == 0.0
    assert trace.header["settings"]["context_tokens"] < 8192
    # stderr is not a terminal here: one plain line per step, then where the trace went.
    assert f"step {document['chunks']}/{document['chunks']}" in result.stderr
    assert str(trace_path) in result.stderr

    # The real trace, read back the way a user would.
    shown = memagent("trace", str(trace_path), "--grep", FACT_VALUE)
    assert shown.returncode == 0, shown.stderr
    n = document["chunks"]
    assert f"at steps 1–{n} (of steps 1–{n})" in " ".join(shown.stdout.split())
    first = memagent("trace", str(trace_path), "--step", "1")
    assert FACT in " ".join(first.stdout.split())


def test_json_answers_every_question_from_stdin(memagent, env):
    text = story(300)
    result = memagent(
        "ask",
        "-",
        FACT_QUESTION,
        "Who painted the red barn?",
        *SMALL_STEPS,
        "--json",
        input=text,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert [first["question"], second["question"]] == [FACT_QUESTION, "Who painted the red barn?"]
    # Too small a model to be right here; the answer is whatever it said, reported whole.
    assert first["reply"].strip() and second["reply"].strip()
    assert first["answer"] is None or first["answer"] in first["reply"]
    doc = first["document"]
    assert doc["path"] == "<stdin>"
    assert doc["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert doc["chunks"] == 2 == len(first["steps"])
    assert first["model"]["name"] == "smollm2-135m"
    assert first["settings"]["chunk_tokens"] == 2000
    assert first["tokens_per_second"]["prompt"] > 0 and first["tokens_per_second"]["generation"] > 0
    assert first["seconds"] > 0
    traces = {first["trace"], second["trace"]}
    assert len(traces) == 2
    for path in traces:
        assert path.startswith(env["XDG_DATA_HOME"])
        assert read_trace(Path(path)).finished


def interrupt_after_steps(
    args: list[str],
    trace_path: Path,
    env,
    steps: int,
    sig: int = signal.SIGINT,
    interrupt: Callable[[subprocess.Popen], None] | None = None,
) -> tuple[subprocess.Popen, str, str]:
    """Start `memagent ask`, send `sig` (or call `interrupt`) once `steps` steps are in its
    trace, and let it end."""
    process = subprocess.Popen(
        [str(MEMAGENT), "ask", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if trace_path.exists() and trace_path.read_text().count('"type": "step"') >= steps:
            break
        time.sleep(0.2)
    if interrupt is None:
        process.send_signal(sig)
    else:
        interrupt(process)
    stdout, stderr = process.communicate(timeout=180)
    return process, stdout, stderr


def test_resume_finishes_like_an_uninterrupted_run(memagent, env, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(850))
    ask = [str(doc), FACT_QUESTION, *SMALL_STEPS]

    whole = memagent("ask", *ask, "--json", "--quiet")
    assert whole.returncode == 0, whole.stderr
    expected = json.loads(whole.stdout)
    assert expected["cached"] is False
    assert len(expected["steps"]) == expected["document"]["chunks"] >= 4

    # The same greedy run again comes from its trace, without reading.
    again = memagent("ask", *ask, "--json")
    assert again.returncode == 0, again.stderr
    cached = json.loads(again.stdout)
    assert cached["cached"] is True and cached["reply"] == expected["reply"]
    assert (
        cached["trace"] == expected["trace"] and "answered from the finished trace" in again.stderr
    )

    cut = tmp_path / "cut.jsonl"
    process, _, _ = interrupt_after_steps([*ask, "--no-cache", "--trace", str(cut)], cut, env, 2)
    assert process.returncode == 130
    assert not read_trace(cut).finished

    other = tmp_path / "other.txt"
    other.write_text(story(850, seed=3))
    refused = memagent("ask", str(other), FACT_QUESTION, *SMALL_STEPS, "--resume", str(cut))
    assert refused.returncode == 1 and "the document differs" in refused.stderr
    refused = memagent("ask", *ask, "--memory-tokens", "64", "--resume", str(cut))
    assert refused.returncode == 1 and "--memory-tokens differs (128 there, 64 here)" in " ".join(
        refused.stderr.split()
    )

    resumed = memagent("ask", *ask, "--json", "--resume", str(cut))
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert "resuming" in resumed.stderr
    assert result["reply"] == expected["reply"] and result["answer"] == expected["answer"]
    trace = read_trace(cut)
    assert trace.finished and trace.interrupted is None
    reference = read_trace(Path(expected["trace"]))
    assert [s["memory"] for s in trace.steps] == [s["memory"] for s in reference.steps]


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_an_interrupted_run_keeps_its_finished_steps(env, tmp_path, sig):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(900))
    trace_path = tmp_path / "run.jsonl"
    args = [str(doc), FACT_QUESTION, *SMALL_STEPS, "--trace", str(trace_path)]
    process, stdout, stderr = interrupt_after_steps(args, trace_path, env, 1, sig)

    assert stdout == ""
    trace = read_trace(trace_path)
    assert not trace.finished and len(trace.steps) >= 1
    if sig == signal.SIGKILL:  # no chance to say anything: the trace alone must hold
        assert process.returncode == -signal.SIGKILL
        assert trace.interrupted is None
        assert all("cut short" in problem for problem in trace.problems)  # killed mid-write
        return
    assert not trace.problems
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "Interrupted" in stderr and str(trace_path) in stderr
    assert f"resume with: memagent ask {doc}" in " ".join(stderr.split())
    assert trace.interrupted is not None
    assert trace.interrupted["steps_done"] == len(trace.steps)


def test_a_folder_of_documents_skips_the_unreadable_one(memagent, tmp_path):
    library = tmp_path / "library"
    (library / "sub").mkdir(parents=True)
    (library / "a.txt").write_text(story(40))
    (library / "sub" / "b.md").write_text(story(40, seed=2))
    (library / "broken.pdf").write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 4)
    (library / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # not a supported suffix
    listed = tmp_path / "more.txt"
    listed.write_text(f"{library / 'a.txt'}\n")

    result = memagent(
        "ask",
        str(library),
        FACT_QUESTION,
        "--documents",
        str(listed),
        "--json",
        "--chunk-tokens",
        "2000",
        "--memory-tokens",
        "64",
        "--temperature",
        "0",
    )
    assert result.returncode == 1  # one document could not be read
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(line["document"]["path"]).name for line in lines] == ["a.txt", "b.md", "a.txt"]
    assert all(line["question"] == FACT_QUESTION for line in lines)
    assert "broken.pdf" in result.stderr and "Skipped; the other documents go on" in result.stderr
    assert "Traceback" not in result.stderr

    none = memagent("ask", str(library), FACT_QUESTION, "--glob", "*.epub")
    assert none.returncode == 1 and "holds no supported documents matching *.epub" in none.stderr
