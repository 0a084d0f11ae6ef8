"""Trace files: written step by step, read back as far as they go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memagent_cli.backends import Generation
from memagent_cli.chunking import make_chunks
from memagent_cli.reader import Answer, Finished, Step, StepFinished
from memagent_cli.trace import FORMAT_VERSION, TraceError, TraceWriter, read_trace


def write_run(path: Path, steps: int, finish: bool) -> list[Step]:
    chunks = make_chunks(list(b"x" * (steps * 4)), 4, bytes)
    writer = TraceWriter(path, {"question": "q"}, lambda a, b: f"p. {a}")
    done = []
    for chunk in chunks:
        gen = Generation(f"memory {chunk.index}", 40, 7, 0.1, 0.3, "stop")
        done.append(Step(chunk, f"memory {chunk.index}", gen))
        writer(StepFinished(done[-1], len(chunks)))
    if finish:
        final = Generation("\\boxed{yes}", 30, 4, 0.1, 0.2, "stop")
        writer(Finished(Answer("q", "yes", "\\boxed{yes}", done, final)))
    else:
        writer.interrupted("SIGINT")
    writer.close()
    return done


def test_a_finished_run_reads_back_whole(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    trace = read_trace(path)
    assert trace.header["question"] == "q" and trace.header["format"] == FORMAT_VERSION
    assert [s["index"] for s in trace.steps] == [0, 1, 2]
    assert trace.steps[1]["memory"] == "memory 1"
    assert trace.steps[1]["tokens"] == [4, 8] and trace.steps[1]["span"] == "p. 4"
    assert trace.final["answer"] == "yes" and trace.finished
    assert not trace.problems


def test_each_step_is_on_disk_before_the_next_one(tmp_path):
    path = tmp_path / "t.jsonl"
    chunks = make_chunks(list(b"abcd"), 2, bytes)
    writer = TraceWriter(path, {"question": "q"})
    writer(StepFinished(Step(chunks[0], "m", Generation("m", 1, 1, 0, 0, "stop")), 2))
    # Not closed: a crash now must still leave the step readable.
    assert len(read_trace(path).steps) == 1
    writer.close()


def test_an_interrupted_run_says_where_it_stopped(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 2, finish=False)
    trace = read_trace(path)
    assert not trace.finished
    assert trace.interrupted == {"type": "interrupted", "reason": "SIGINT", "steps_done": 2}


def test_a_trace_cut_in_the_middle_of_a_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    data = path.read_bytes()
    lines = data.split(b"\n")
    cut = b"\n".join(lines[:3]) + b"\n" + lines[3][: len(lines[3]) // 2]
    path.write_bytes(cut)
    trace = read_trace(path)
    assert [s["index"] for s in trace.steps] == [0, 1]
    assert not trace.finished
    assert trace.problems and "cut short" in trace.problems[0]


def test_an_older_format_is_read_as_far_as_it_goes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps({"type": "header", "format": 0, "question": "q"})
        + "\n"
        + json.dumps({"type": "step", "index": 0, "memory": "m"})
        + "\n"
    )
    trace = read_trace(path)
    assert len(trace.steps) == 1
    assert "format 0" in trace.problems[0]


@pytest.mark.parametrize(
    "content", [b"", b"hello world\n", b"\x89PNG\r\n\x1a\n\x00\x00", b"[1, 2]\n"]
)
def test_a_file_that_is_not_a_trace(tmp_path, content):
    path = tmp_path / "not-a-trace.jsonl"
    path.write_bytes(content)
    with pytest.raises(TraceError, match="not a memagent trace"):
        read_trace(path)


def test_a_missing_trace(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        read_trace(tmp_path / "nope.jsonl")
