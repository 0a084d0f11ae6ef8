"""Several questions read together by the real model in one llama.cpp context: each
answer, memory and trace record equals the one its question gets read alone, and an
interrupted pass resumes to the uninterrupted answers."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FACT_QUESTION, MEMAGENT, story

from memagent_cli.trace import read_trace

pytestmark = pytest.mark.model

QUESTIONS = [FACT_QUESTION, "Who lives in the village?", "What happened at the mill?"]
STEPS = ["--chunk-tokens", "700", "--memory-tokens", "80", "--temperature", "0", "--no-cache"]


def kept(step: dict) -> dict:
    """A step record without its timings and draft counts (the draft policy learns from
    measured batch times, so those may differ between runs; the text may not)."""
    return {
        k: v
        for k, v in step.items()
        if k not in ("seconds", "prompt_seconds", "drafted", "accepted")
    }


def answers_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "village.txt"
    path.write_text(story(170, seed=5))  # about 1,900 tokens: 3 chunks of 700
    return path


def test_questions_read_together_equal_questions_read_alone(memagent, doc):
    together = memagent("ask", str(doc), *QUESTIONS, *STEPS, "--json")
    assert together.returncode == 0, together.stderr
    results = answers_of(together.stdout)
    assert [r["question"] for r in results] == QUESTIONS
    assert "3 questions" in together.stderr or "q3" in together.stderr
    for question, joint in zip(QUESTIONS, results, strict=True):
        alone = memagent("ask", str(doc), question, *STEPS, "--json")
        assert alone.returncode == 0, alone.stderr
        (single,) = answers_of(alone.stdout)
        assert joint["reply"] == single["reply"] and joint["answer"] == single["answer"]
        assert [kept(s) for s in joint["steps"]] == [kept(s) for s in single["steps"]]
        assert len(joint["steps"]) == 3
        traced = read_trace(Path(joint["trace"]))
        assert traced.finished and [s.memory for s in traced.steps] == [
            s["memory"] for s in single["steps"]
        ]


def test_one_question_at_a_time_is_the_same_as_all_together(memagent, doc):
    one = memagent("ask", str(doc), *QUESTIONS[:2], *STEPS, "--json", "--parallel", "1")
    two = memagent("ask", str(doc), *QUESTIONS[:2], *STEPS, "--json", "--parallel", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert [r["reply"] for r in answers_of(one.stdout)] == [
        r["reply"] for r in answers_of(two.stdout)
    ]


def test_an_interrupted_pass_resumes_every_question_to_its_uninterrupted_answer(memagent, env, doc):
    whole = memagent("ask", str(doc), *QUESTIONS, *STEPS, "--json")
    assert whole.returncode == 0, whole.stderr
    expected = [r["reply"] for r in answers_of(whole.stdout)]
    started = time.time()
    process = subprocess.Popen(
        [str(MEMAGENT), "ask", str(doc), *QUESTIONS, *STEPS, "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    folder = Path(env["XDG_DATA_HOME"]) / "memagent" / "traces"

    def fresh_traces() -> list[Path]:
        return [p for p in folder.glob("*.jsonl") if p.stat().st_mtime >= started]

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        traces = fresh_traces()
        if len(traces) == 3 and all(p.read_text().count('"type": "step"') >= 1 for p in traces):
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert stdout == ""
    assert "Traceback" not in stderr and "resume with:" in stderr
    cut = fresh_traces()
    assert len(cut) == 3
    for path in cut:
        status = read_trace(path)
        assert not status.finished and 1 <= len(status.steps) < 3
    resumed = memagent("ask", str(doc), *QUESTIONS, *STEPS, "--json", "--resume-latest")
    assert resumed.returncode == 0, resumed.stderr
    assert stderr.count("Interrupted") >= 1
    assert [r["reply"] for r in answers_of(resumed.stdout)] == expected
    for path in cut:
        assert read_trace(path).finished
