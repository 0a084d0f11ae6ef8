"""`memagent trace` on traces written by the real reading loop (a scripted backend, no model)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.command import MEMAGENT, assert_clean_failure, words

from memagent_cli.backend import Generation, InTurn, Sampling
from memagent_cli.chunking import make_chunks
from memagent_cli.documents import assemble
from memagent_cli.reader import Settings, Step, read
from memagent_cli.trace import Header, TraceWriter

QUESTION = "What is the password for the vault?"
PAGES = [
    ("i", "A preface about the village and its old stone tower by the sea."),
    ("1", "The vault sits in the tower. The keeper whispered the word PELICAN to me."),
    ("2", "At noon the guard sleeps. Nobody else knows the word, and the keeper left."),
    ("3", "Years later the tower fell into the sea, and the vault was never opened."),
]
CHUNK = 60  # bytes (tokens): five chunks over four pages
MEMORIES = [
    "The vault is in the tower.",
    "The vault is in the tower.\nThe password is PELICAN.",
    "The password is PELICAN.\nThe guard sleeps at noon.",
    "The guard sleeps at noon.\nThe keeper left the village.",
    "The guard sleeps at noon.\nThe keeper left the village.\nThe tower fell.",
]
REPLY = "The password is \\boxed{PELICAN}."
PATIENCE = 60  # seconds a `trace` command may take to show a line or end, on a busy machine


class ScriptedBackend(InTurn):
    """Replies from a list; `gate`, when given, is waited on before every call after the first."""

    def __init__(self, replies: list[str], gate: threading.Semaphore | None = None) -> None:
        self.replies = list(replies)
        self.gate = gate
        self.calls = 0

    def generate(self, message: str, *, max_tokens: int, sampling: Sampling) -> Generation:
        if self.gate is not None and self.calls > 0:
            assert self.gate.acquire(timeout=PATIENCE), "the follower never showed the last step"
        self.calls += 1
        if not self.replies:
            raise KeyboardInterrupt
        text = self.replies.pop(0)
        return Generation(text, len(message), len(text.split()) + 2, 0.1, 1.2, "stop")


def book():
    return assemble(PAGES, path="/books/tower.pdf", format="pdf", sha256="ab" * 32, unit="page")


def header(document, chunks, question: str = QUESTION) -> Header:
    return Header(
        created="2025-03-01T10:00:00+00:00",
        memagent="0.1.0",
        question=question,
        document={
            "path": document.path,
            "sha256": document.sha256,
            "format": document.format,
            "characters": len(document.text),
            "tokens": len(document.text.encode()),
            "chunks": len(chunks),
        },
        model={"path": "/models/tiny.gguf", "name": "tiny-model", "size": 2**28},
        settings={
            "chunk_tokens": CHUNK,
            "memory_tokens": 64,
            "temperature": 0.0,
            "top_p": 0.95,
            "seed": None,
            "context_tokens": 4096,
            "threads": 2,
            "gpu_layers": 0,
        },
        templates_sha256={"update": "cd" * 32, "final": "ef" * 32},
    )


def write_trace(
    path: Path,
    replies: list[str] | None = None,
    question: str = QUESTION,
    gate: threading.Semaphore | None = None,
) -> Path:
    """Run the real loop over the book with scripted replies into a real trace.

    Fewer replies than chunks + 1 stops the run as Ctrl-C would, recording the interruption.
    """
    document = book()
    chunks = make_chunks(list(document.text.encode()), CHUNK, bytes)
    assert len(chunks) == len(MEMORIES)
    writer = TraceWriter(path, header(document, chunks, question), span_of=document.span)
    backend = ScriptedBackend(MEMORIES + [REPLY] if replies is None else replies, gate)
    try:
        read(backend, question, chunks, Settings(CHUNK, 64), writer)
    except KeyboardInterrupt:
        writer.interrupted("SIGINT")
    finally:
        writer.close()
    return path


def resume_trace(path: Path, steps_done: int, replies: list[str] | None = None) -> Path:
    """Go on with an interrupted trace after `steps_done` steps, as `memagent ask --resume`
    does: the same file, a "resumed" record, then the rest of the run (or another interruption
    when `replies` run out)."""
    document = book()
    chunks = make_chunks(list(document.text.encode()), CHUNK, bytes)
    done = [
        Step(chunk, memory, Generation(memory, 1, 1, 0.1, 1.2, "stop"))
        for chunk, memory in zip(chunks[:steps_done], MEMORIES, strict=False)
    ]
    writer = TraceWriter(
        path, header(document, chunks), span_of=document.span, resume_from=steps_done
    )
    backend = ScriptedBackend(MEMORIES[steps_done:] + [REPLY] if replies is None else replies)
    try:
        read(backend, QUESTION, chunks, Settings(CHUNK, 64), writer, done=done)
    except KeyboardInterrupt:
        writer.interrupted("SIGINT")
    finally:
        writer.close()
    return path


def traces_dir(env: dict[str, str]) -> Path:
    folder = Path(env["XDG_DATA_HOME"]) / "memagent" / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def ok(result) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture
def finished(env) -> Path:
    return write_trace(traces_dir(env) / "run.jsonl")


def test_the_latest_trace_shows_the_run_and_a_table_of_steps(cli, env, finished):
    older = write_trace(traces_dir(env) / "older.jsonl", question="Who is the keeper?")
    os.utime(older, (1_000_000, 1_000_000))
    out = ok(cli("trace"))
    assert "Question: " + QUESTION in out and "Who is the keeper" not in out
    assert "Document: /books/tower.pdf (pdf, " in out and "5 chunks" in out
    assert "Model: tiny-model (/models/tiny.gguf, 0.25 GiB)" in out
    assert "chunk tokens 60, memory tokens 64, temperature 0.0" in out and "seed none" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    # Steps count from 1, as `memagent ask` counts them ("step 1/5" reads the first chunk).
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"]
    # step, span, memory tokens, +added -removed words, seconds
    assert rows[0] == ["1", "p.", "i", "8", "+6", "-3", "1.2"]
    assert rows[1] == ["2", "p.", "i–1", "12", "+4", "-0", "1.2"]  # "The password is PELICAN."
    assert rows[2] == ["3", "p.", "1–2", "11", "+5", "-6", "1.2"]
    assert "Answer: PELICAN" in out
    # PELICAN came in at step 2 but the final memory lost it: the answer has no source there.
    assert "Evidence: no source in the document: the final memory does not hold" in words(out)
    assert ok(cli("trace", str(finished))) == out


def test_a_trace_named_without_its_folder_is_found_in_the_data_folder(cli, finished):
    assert "Answer: PELICAN" in ok(cli("trace", "run.jsonl"))


def test_step_shows_the_whole_memory_with_its_span(cli, finished):
    out = ok(cli("trace", str(finished), "--step", "3"))
    assert out.splitlines()[0] == "memory after step 3, p. 1–2, tokens 120–180 (11 tokens)"
    assert out.splitlines()[1:] == MEMORIES[2].splitlines()


def test_step_1_is_the_first_chunk_and_the_last_step_is_the_number_of_steps(cli, finished):
    first = ok(cli("trace", str(finished), "--step", "1")).splitlines()
    assert first[0] == "memory after step 1, p. i, tokens 0–60 (8 tokens)"
    assert first[1:] == MEMORIES[0].splitlines()
    last = ok(cli("trace", str(finished), "--step", "5")).splitlines()
    assert last[0].startswith("memory after step 5, p. 3, ")
    assert last[1:] == MEMORIES[4].splitlines()


def test_a_step_out_of_range_is_one_sentence(cli, finished):
    assert_clean_failure(cli("trace", str(finished), "--step", "6"), 1, "no step 6", "steps 1 to 5")
    assert_clean_failure(cli("trace", str(finished), "--step", "0"), 1, "no step 0", "steps 1 to 5")
    assert_clean_failure(cli("trace", str(finished), "--diff", "0"), 1, "no step 0", "steps 1 to 5")
    assert_clean_failure(cli("trace", str(finished), "--diff", "-1"), 1, "no step -1")


def test_diff_shows_words_dropped_and_added(cli, finished):
    out = ok(cli("trace", str(finished), "--diff", "3"))
    lines = out.splitlines()
    assert lines[0] == "step 3, p. 1–2, tokens 120–180: +5 -6 words against step 2"
    assert lines[1:] == [
        "[-The vault is in the tower.-]",
        "The password is PELICAN.",
        "{+The guard sleeps at noon.+}",
    ]


def test_diff_of_the_first_step_is_against_the_initial_memory(cli, finished):
    out = ok(cli("trace", str(finished), "--diff", "1"))
    assert out.startswith("step 1, p. i, tokens 0–60: +6 -3 words against the initial memory\n")
    assert "[-No previous memory-]{+The vault is in the tower.+}" in out


def test_diff_is_coloured_on_a_terminal(cli, env, finished):
    env["FORCE_COLOR"] = "1"
    out = ok(cli("trace", str(finished), "--diff", "3"))
    assert "\x1b[" in out and "[-" not in out and "{+" not in out


def test_grep_tells_when_a_fact_entered_and_left_the_memory(cli, finished):
    out = ok(cli("trace", str(finished), "--grep", "pelican"))
    assert "step 2, p. i–1, tokens 60–120\n  The password is PELICAN.\n" in out
    assert "step 3, p. 1–2, tokens 120–180\n  The password is PELICAN.\n" in out
    assert "step 1," not in out and "step 4" not in out
    assert "'pelican' is in the memory at steps 2–3 (of steps 1–5)." in out
    out = ok(cli("trace", str(finished), "--grep", "vault"))
    assert "'vault' is in the memory at steps 1–2 (of steps 1–5)." in out
    out = ok(cli("trace", str(finished), "--grep", "fell"))
    assert out.startswith("step 5, p. 3, ")
    assert "'fell' is in the memory at step 5 (of steps 1–5)." in out


def test_grep_with_no_match_exits_1_like_grep(cli, finished):
    result = cli("trace", str(finished), "--grep", "albatross")
    assert result.returncode == 1 and result.stdout == ""
    assert "No step's memory contains 'albatross'" in result.stderr


def test_json_is_the_whole_trace(cli, finished):
    data = json.loads(ok(cli("trace", str(finished), "--json")))
    assert data["status"] == "finished" and data["problems"] == []
    assert data["header"]["question"] == QUESTION
    assert [s["memory"] for s in data["steps"]] == MEMORIES
    assert [s["span"] for s in data["steps"]] == ["p. i", "p. i–1", "p. 1–2", "p. 2–3", "p. 3"]
    # Steps count from 1, as in every other view.
    assert [s["step"] for s in data["steps"]] == [1, 2, 3, 4, 5]
    assert data["final"]["answer"] == "PELICAN" and data["final"]["evidence"] == []


def test_a_trace_of_format_1_still_reads_with_steps_from_1(cli, finished):
    """Format 1 counted from 0 (a step record's "index") and recorded no evidence as null."""
    old = finished.with_name("old.jsonl")
    records = [json.loads(line) for line in finished.read_text().splitlines()]
    for record in records:
        if record["type"] == "header":
            record["format"] = 1
        elif record["type"] == "step":
            record["index"] = record.pop("step") - 1
        elif record["type"] == "final":
            record["evidence"] = None
    old.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert '"index": 0' in old.read_text()
    data = json.loads(ok(cli("trace", str(old), "--json")))
    assert [s["step"] for s in data["steps"]] == [1, 2, 3, 4, 5] and data["problems"] == []
    assert data["final"]["evidence"] == [] and data["header"]["format"] == 2
    assert ok(cli("trace", str(old))) == ok(cli("trace", str(finished))).replace(
        str(finished), str(old)
    )


def test_markdown_is_a_report_with_every_memory(cli, finished):
    out = ok(cli("trace", str(finished), "--markdown"))
    assert out.startswith(f"# {QUESTION}\n")
    assert "- **Answer:** PELICAN" in out
    assert "- **Evidence:** no source in the document" in out
    assert "- **Settings:** chunk tokens 60" in out
    for n, memory in enumerate(MEMORIES, start=1):
        assert f"```text\n{memory}\n```" in out
        assert f"### Step {n}, p. " in out
    assert "### Step 1, p. i, tokens 0–60\n" in out and "### Step 0" not in out
    assert "## Final reply" in out and REPLY in out


def test_list_shows_traces_newest_first(cli, env):
    folder = traces_dir(env)
    write_trace(folder / "a.jsonl", question="Who is the keeper?")
    write_trace(folder / "b.jsonl", replies=MEMORIES[:2], question="When does the guard sleep?")
    write_trace(folder / "c.jsonl", question="Where is the vault?")
    (folder / "junk.jsonl").write_text("not a trace\n")
    for age, name in enumerate(["c", "a", "b"]):  # c newest, then a, then b
        os.utime(folder / f"{name}.jsonl", (2_000_000 - age * 1000,) * 2)
    os.utime(folder / "junk.jsonl", (1_000, 1_000))

    result = cli("trace", "--list")
    out = ok(result)
    rows = [line for line in out.splitlines() if ".jsonl" in line]
    assert [r.split()[-1] for r in rows] == ["c.jsonl", "a.jsonl", "b.jsonl", "junk.jsonl"]
    assert "Where is the vault?" in rows[0] and "5/5" in rows[0] and "finished" in rows[0]
    assert "PELICAN" in rows[0] and "tiny-model" in rows[0] and "tower.pdf" in rows[0]
    assert "2/5" in rows[2] and "interrupted (SIGINT)" in rows[2]
    assert "junk.jsonl cannot be read" in words(result.stderr)
    junk = [line for line in out.splitlines() if "junk.jsonl" in line]
    assert junk and "unreadable" in junk[0]  # listed, and the others still are

    listed = json.loads(ok(cli("trace", "--list", "--json")))
    assert [Path(t["path"]).name for t in listed] == ["c.jsonl", "a.jsonl", "b.jsonl", "junk.jsonl"]
    assert listed[3]["status"] == "unreadable" and "not a memagent trace" in listed[3]["error"]
    assert listed[2]["status"] == "interrupted" and listed[2]["steps_done"] == 2
    assert listed[2]["steps_total"] == 5 and listed[2]["answer"] is None


def test_no_traces_yet(cli):
    assert_clean_failure(cli("trace"), 1, "no traces in", "memagent ask")


def test_an_interrupted_trace_says_how_far_it_got(cli, tmp_path):
    path = write_trace(tmp_path / "t.jsonl", replies=MEMORIES[:3])
    out = ok(cli("trace", str(path)))
    assert "Unfinished: interrupted (SIGINT) after 3 of 5 steps" in out
    assert "Answer" not in out


def test_a_trace_cut_mid_line_is_shown_as_far_as_it_goes(cli, tmp_path):
    path = write_trace(tmp_path / "t.jsonl")
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:4]) + b"\n" + lines[4][:40])  # header, steps 0-2, cut
    result = cli("trace", str(path))
    out = ok(result)
    rows = [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert rows == ["1", "2", "3"]
    assert "Unfinished: unfinished: 3 of 5 steps" in out
    assert "line 5 is cut short" in " ".join(result.stderr.split())


def step_rows(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit()]


def test_a_resumed_run_that_finished_is_finished_with_every_step_once(cli, env):
    path = write_trace(traces_dir(env) / "resumed.jsonl", replies=MEMORIES[:2])
    resume_trace(path, 2)
    kinds = [json.loads(line)["type"] for line in path.read_text().splitlines()]
    assert kinds == ["header", "step", "step", "interrupted", "resumed", *["step"] * 3, "final"]

    out = ok(cli("trace", str(path)))
    assert step_rows(out) == ["1", "2", "3", "4", "5"]
    assert "Answer: PELICAN" in out and "Evidence: no source in the document" in out
    assert "Unfinished" not in out and "nterrupted" not in out
    assert ok(cli("trace", str(path), "--step", "3")).splitlines()[1:] == (MEMORIES[2].splitlines())
    assert "- **Answer:** PELICAN" in ok(cli("trace", str(path), "--markdown"))

    row = [line for line in ok(cli("trace", "--list")).splitlines() if ".jsonl" in line][0]
    assert "5/5" in row and "finished" in row and "nterrupted" not in row
    (listed,) = json.loads(ok(cli("trace", "--list", "--json")))
    assert listed["status"] == "finished" and listed["interrupted"] is None
    assert listed["steps_done"] == 5
    assert json.loads(ok(cli("trace", str(path), "--json")))["status"] == "finished"


def test_a_resumed_run_interrupted_again_says_how_far_it_got(cli, env):
    path = write_trace(traces_dir(env) / "again.jsonl", replies=MEMORIES[:2])
    resume_trace(path, 2, replies=MEMORIES[2:4])
    out = ok(cli("trace", str(path)))
    assert step_rows(out) == ["1", "2", "3", "4"]
    assert "Unfinished: interrupted (SIGINT) after 4 of 5 steps" in out
    assert "Answer" not in out
    row = [line for line in ok(cli("trace", "--list")).splitlines() if ".jsonl" in line][0]
    assert "4/5" in row and "interrupted (SIGINT)" in row
    (listed,) = json.loads(ok(cli("trace", "--list", "--json")))
    assert listed["status"] == "interrupted" and listed["steps_done"] == 4

    resume_trace(path, 4)
    out = ok(cli("trace", str(path)))
    assert step_rows(out) == ["1", "2", "3", "4", "5"] and "Answer: PELICAN" in out
    assert "nterrupted" not in out


def test_a_run_stopped_before_its_first_step_shows_as_not_started(cli, tmp_path):
    document = book()
    chunks = make_chunks(list(document.text.encode()), CHUNK, bytes)
    path = tmp_path / "t.jsonl"
    TraceWriter(path, header(document, chunks), span_of=document.span).close()
    out = ok(cli("trace", str(path)))
    assert "Unfinished: not started: 0 of 5 steps" in out
    assert_clean_failure(cli("trace", str(path), "--step", "1"), 1, "has no steps yet")
    assert "Status:** not started" in ok(cli("trace", str(path), "--markdown"))
    assert json.loads(ok(cli("trace", str(path), "--json")))["status"] == "not started"


def test_out_of_order_steps_are_warned_about_and_step_1_is_step_1(cli, tmp_path):
    path = write_trace(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    # header, step 3, steps 1-5, final: the stray step 3 is skipped and said.
    path.write_text(lines[0] + lines[3] + "".join(lines[1:]))
    result = cli("trace", str(path), "--step", "1")
    assert ok(result).splitlines()[0].startswith("memory after step 1, ")
    assert "a record of step 3 came where step 1 was due" in words(result.stderr)


def test_an_older_format_is_refused_with_a_sentence(cli, tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"type": "header", "format": 0, "question": "Old?"}) + "\n")
    assert_clean_failure(
        cli("trace", str(path)), 1, "trace of format 0; this memagent reads formats 1 and 2"
    )


@pytest.mark.parametrize("value", [None, "x" * 1_000_000, True], ids=["none", "a MB", "true"])
def test_a_header_without_a_format_number_is_one_short_sentence(cli, tmp_path, value):
    """It said "a trace of format None", or quoted a megabyte; true passed as format 1."""
    path = tmp_path / "t.jsonl"
    header = {"type": "header", "question": "Old?"} | ({"format": value} if value else {})
    path.write_text(json.dumps(header) + "\n")
    result = cli("trace", str(path))
    assert_clean_failure(result, 1, "is a trace without a format number")
    assert len(result.stderr) < 500 and "None" not in result.stderr


@pytest.mark.parametrize("field, value", [("document", "tower.pdf"), ("created", 12345)])
def test_a_header_field_of_the_wrong_type_is_one_sentence_in_every_view(
    cli, tmp_path, field, value
):
    path = write_trace(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    first[field] = value
    path.write_text(json.dumps(first) + "\n" + "".join(lines[1:]))
    for view in ([], ["--step", "1"], ["--json"], ["--markdown"], ["--grep", "x"]):
        assert_clean_failure(cli("trace", str(path), *view), 1, f"line 1 has a '{field}' field")


def test_a_fifo_is_refused_not_waited_on(cli, tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    assert_clean_failure(cli("trace", str(fifo), timeout=PATIENCE), 1, "is not a regular file")


def test_a_file_that_is_not_a_trace(cli, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n")
    assert_clean_failure(cli("trace", str(path)), 1, "is not a memagent trace")


def test_a_missing_trace(cli, tmp_path):
    assert_clean_failure(cli("trace", str(tmp_path / "nope.jsonl")), 1, "Trace not found")


def test_views_do_not_combine(cli, finished):
    result = cli("trace", str(finished), "--step", "1", "--diff", "1")
    assert result.returncode == 2 and "pick one" in result.stderr


def start_follow(env: dict[str, str], path: Path) -> tuple[subprocess.Popen, queue.Queue]:
    process = subprocess.Popen(
        [str(MEMAGENT), "trace", "--follow", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return process, lines


def next_line_starting(lines: queue.Queue, prefix: str) -> str:
    while True:
        line = lines.get(timeout=PATIENCE)
        assert line is not None, f"the follower ended before a line starting {prefix!r}"
        if line.startswith(prefix):
            return line


def test_follow_shows_each_step_as_it_is_written(env, tmp_path):
    path = tmp_path / "live.jsonl"
    # The run waits before each step until the follower has shown the step before it.
    gate = threading.Semaphore(0)
    writing = threading.Thread(target=write_trace, args=(path,), kwargs={"gate": gate})
    writing.start()
    deadline = time.monotonic() + PATIENCE
    while not (path.exists() and path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    process, lines = start_follow(env, path)
    try:
        assert next_line_starting(lines, "Question:") == f"Question: {QUESTION}\n"
        for n in range(len(MEMORIES)):
            assert next_line_starting(lines, "step ").startswith(f"step {n + 1}/5  p. ")
            gate.release()
        assert next_line_starting(lines, "Answer:") == "Answer: PELICAN\n"
        assert process.wait(timeout=PATIENCE) == 0
    finally:
        process.kill()
        for _ in MEMORIES:
            gate.release()
        writing.join(timeout=PATIENCE)
    assert "Traceback" not in process.stderr.read()


def test_follow_stops_quietly_on_ctrl_c(env, tmp_path):
    document = book()
    chunks = make_chunks(list(document.text.encode()), CHUNK, bytes)
    path = tmp_path / "waiting.jsonl"
    TraceWriter(path, header(document, chunks), span_of=document.span).close()
    process, lines = start_follow(env, path)
    try:
        next_line_starting(lines, "Question:")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=PATIENCE) == 130
    finally:
        process.kill()
    stderr = process.stderr.read()
    assert "Traceback" not in stderr and "Aborted" not in stderr


def follow_to_the_end(env: dict[str, str], path: Path) -> list[str]:
    """Everything `trace --follow` prints for a trace that is already complete; it must end."""
    process, lines = start_follow(env, path)
    try:
        assert process.wait(timeout=PATIENCE) == 0, process.stderr.read()
    finally:
        process.kill()
    printed = []
    while (line := lines.get(timeout=PATIENCE)) is not None:
        printed.append(line.rstrip("\n"))
    assert "Traceback" not in process.stderr.read()
    return printed


def test_follow_stops_at_an_interruption_nothing_follows(env, tmp_path):
    path = write_trace(tmp_path / "t.jsonl", replies=MEMORIES[:2])
    printed = follow_to_the_end(env, path)
    assert [line.split("  ")[0] for line in printed if line.startswith("step ")] == [
        "step 1/5",
        "step 2/5",
    ]
    assert printed[-1] == "Interrupted: SIGINT"


def test_follow_goes_on_through_a_resumed_run_to_its_answer(env, tmp_path):
    path = write_trace(tmp_path / "t.jsonl", replies=MEMORIES[:2])
    resume_trace(path, 2, replies=MEMORIES[2:3])  # interrupted again after step 3
    resume_trace(path, 3)
    printed = follow_to_the_end(env, path)
    shown = [
        line
        for line in printed
        if not line.startswith(("Question:", "Document:", "Model:", "Settings:", "Created:"))
    ]
    shown = [line.split("  ")[0] if line.startswith("step ") else line for line in shown if line]
    assert shown == [
        "step 1/5",
        "step 2/5",
        "Interrupted: SIGINT",
        "resumed after step 2",
        "step 3/5",
        "Interrupted: SIGINT",
        "resumed after step 3",
        "step 4/5",
        "step 5/5",
        "Answer: PELICAN",
    ]
    # The memory carries over the interruption: step 3 is compared with step 2's memory.
    step_3 = next(line for line in printed if line.startswith("step 3/5"))
    assert "+5 -6 words" in step_3


# A real trace of the previous release: `memagent ask` of memagent 0.1.0 (commit 9121636) run
# through its tests/support/fake_openai.py stand-in on a six-chunk text, with --chunk-tokens 30
# --memory-tokens 64 --temperature 0. Format 1: steps as "index" counted from 0, the evidence
# one dict whose "step" also counts from 0.
OLD_RELEASE = Path(__file__).parent / "data" / "trace-0.1.0.jsonl"


def test_a_trace_written_by_memagent_0_1_reads_in_every_view(cli, tmp_path):
    raw = [json.loads(line) for line in OLD_RELEASE.read_text().splitlines()]
    assert raw[0]["format"] == 1 and [r.get("index") for r in raw[1:7]] == [0, 1, 2, 3, 4, 5]
    assert raw[-1]["evidence"] == {"step": 1, "tokens": [30, 60], "chars": [142, 247], "span": ""}

    out = ok(cli("trace", str(OLD_RELEASE)))
    assert step_rows(out) == ["1", "2", "3", "4", "5", "6"]  # counted from 1, as ask counts
    assert "Answer: chandlery." in out
    # The 0.1 evidence (step 1 from 0, the second chunk) is step 2 to a person.
    assert "Evidence: from tokens 30–60, step 2 of 6" in words(out)
    second = ok(cli("trace", str(OLD_RELEASE), "--step", "2"))
    assert "memory after step 2, tokens 30–60" in second and raw[2]["memory"] in second

    data = json.loads(ok(cli("trace", str(OLD_RELEASE), "--json")))
    assert data["problems"] == [] and data["status"] == "finished"
    assert [step["step"] for step in data["steps"]] == [1, 2, 3, 4, 5, 6]
    assert data["final"]["evidence"] == [
        {"step": 2, "words": [], "tokens": [30, 60], "chars": [142, 247]}
    ]

    page = tmp_path / "old.html"
    ok(cli("trace", str(OLD_RELEASE), "--html", str(page)))
    text = page.read_text()
    assert [int(n) for n in re.findall(r'id="run-1-step-(\d+)"', text)] == [1, 2, 3, 4, 5, 6]
    assert '<article class="step source" id="run-1-step-2">' in text
    assert 'From <a href="#run-1-step-2">tokens 30–60, step 2 of 6</a>.' in text
    assert "chandlery." in text and "Lanterns hung along the harbour wall" in text
