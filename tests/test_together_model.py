"""Several questions read together by the real model in one llama.cpp context: each
answer, memory and trace record equals the one its question gets read alone, and an
interrupted pass resumes to the uninterrupted answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.command import MEMAGENT
from support.story import FACT_QUESTION, story

from memagent_cli.trace import read_trace

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("on_model_file")]

QUESTIONS = [FACT_QUESTION, "Who lives in the village?"]
STEPS = [
    *("--chunk-tokens", "300", "--memory-tokens", "48", "--temperature", "0", "--no-reuse"),
    "--exact",  # byte-identical together and alone: the promise of --exact
    # Together, whatever this machine's calibration says a batch costs (one question alone
    # is read alone all the same).
    *("--parallel", "2"),
]


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


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("together") / "village.txt"
    # About 1,700 tokens: 6 chunks of 300, so that an interrupt after the first step lands
    # well before the last, however fast the model.
    path.write_text(story(150, seed=5))
    return path


@pytest.fixture(scope="module")
def together(doc, model_file) -> list[dict]:
    """The questions read together once by the model under test (tiny, or the real default
    model in `make test-real`), for the tests below to compare with."""
    home = doc.parent / f"data-{model_file.stem}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    env["XDG_DATA_HOME"], env["MEMAGENT_HOME"] = str(home), str(home / "memagent")
    env["MEMAGENT_MODEL"] = str(model_file)
    result = subprocess.run(
        [str(MEMAGENT), "ask", str(doc), *QUESTIONS, *STEPS, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    assert "trace:" in result.stderr
    return answers_of(result.stdout)


def test_questions_read_together_equal_questions_read_alone(memagent, doc, together):
    assert [r["question"] for r in together] == QUESTIONS
    for question, joint in zip(QUESTIONS, together, strict=True):
        alone = memagent("ask", str(doc), question, *STEPS, "--json")
        assert alone.returncode == 0, alone.stderr
        (single,) = answers_of(alone.stdout)
        assert joint["reply"] == single["reply"] and joint["answer"] == single["answer"]
        assert [kept(s) for s in joint["steps"]] == [kept(s) for s in single["steps"]]
        assert len(joint["steps"]) == 6
        traced = read_trace(Path(joint["trace"]))
        assert traced.finished and [s.memory for s in traced.steps] == [
            s["memory"] for s in single["steps"]
        ]


def test_an_interrupted_pass_resumes_every_question_to_its_uninterrupted_answer(
    memagent, env, doc, together, model_file
):
    expected = [r["reply"] for r in together]
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

    def steps_in(path: Path) -> int:
        try:  # memagent probes that it can write a trace: the file may come and go once
            return path.read_text().count('"type": "step"')
        except FileNotFoundError:
            return 0

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            traces = fresh_traces()
        except FileNotFoundError:  # listed, then gone before its stat
            continue
        if len(traces) == len(QUESTIONS) and all(steps_in(p) >= 1 for p in traces):
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert stdout == ""
    assert "Traceback" not in stderr and "resume with:" in stderr
    cut = fresh_traces()
    assert len(cut) == len(QUESTIONS)
    for path in cut:
        status = read_trace(path)
        assert not status.finished and 1 <= len(status.steps) < status.header.total_steps
    resumed = memagent("ask", str(doc), *QUESTIONS, *STEPS, "--json", "--resume-latest")
    assert resumed.returncode == 0, resumed.stderr
    assert stderr.count("Interrupted") >= 1
    assert [r["reply"] for r in answers_of(resumed.stdout)] == expected
    for path in cut:
        assert read_trace(path).finished
