"""`memagent ask` end to end through a deterministic stand-in model served on 127.0.0.1
(tests/support/fake_openai.py): traces, --json, cache, resume and interrupts, with no GGUF at all.
The same properties are checked with the real model in test_ask_model.py."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

import pytest
from support.command import assert_clean_failure, interrupt_after_steps, words
from support.fake_openai import served
from support.story import FACT_QUESTION, story

from memagent_cli.trace import read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "village.txt"
    path.write_text(story(120))  # about 1,900 tiktoken tokens: 7 chunks of 300
    return path


def ask(cli, server, doc: Path, *more: str):
    return cli("ask", str(doc), FACT_QUESTION, *served(server, *STEPS, *more))


def test_an_answer_on_stdout_and_a_trace_with_one_record_per_chunk(cli, fake_server, doc):
    trace_path = doc.with_suffix(".jsonl")
    result = ask(cli, fake_server, doc, "--trace", str(trace_path))
    assert result.returncode == 0, result.stderr
    trace = read_trace(trace_path)
    assert trace.finished and not trace.problems
    assert result.stdout == trace.final.answer + "\n"
    chunks = trace.header.document["chunks"]
    assert chunks == -(-trace.header.document["tokens"] // 300) >= 5
    assert [s.index for s in trace.steps] == list(range(chunks))
    # The windows tile the document: no gap, no overlap, in tokens and in characters.
    assert trace.steps[0].tokens[0] == 0 and trace.steps[0].chars[0] == 0
    for before, after in zip(trace.steps, trace.steps[1:], strict=False):
        assert before.tokens[1] == after.tokens[0] and before.chars[1] == after.chars[0]
    assert trace.steps[-1].tokens[1] == trace.header.document["tokens"]
    assert trace.steps[-1].chars[1] == trace.header.document["characters"]
    assert fake_server.chat_calls == chunks + 1  # one call per chunk, then the answer
    assert f"step {chunks}/{chunks}" in result.stderr and str(trace_path) in result.stderr


def test_with_a_documents_file_every_argument_is_a_question(cli, fake_server, doc, tmp_path):
    listing = tmp_path / "documents.txt"
    listing.write_text(f"{doc}\n")
    questions = [FACT_QUESTION, "Who keeps the tower?"]
    result = cli("ask", *questions, "--documents", str(listing), *served(fake_server, *STEPS))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) >= 2  # an answer per question
    as_json = cli(
        "ask", *questions, "--documents", str(listing), "--json", "-q", *served(fake_server, *STEPS)
    )
    runs = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["question"] for r in runs] == questions
    assert {r["document"]["path"] for r in runs} == {str(doc)}

    none = cli("ask", "--documents", str(listing), *served(fake_server, *STEPS))
    assert_clean_failure(none, 2, "give at least one question")
    nothing = cli("ask", *served(fake_server, *STEPS))
    assert_clean_failure(nothing, 2, "give a DOCUMENT, or a file of them with --documents FILE")


def test_json_carries_the_records_the_trace_holds(cli, fake_server, doc):
    result = ask(cli, fake_server, doc, "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = json.loads(result.stdout)
    trace = read_trace(Path(out["trace"]))
    assert out["steps"] == [
        {k: v for k, v in s.to_json().items() if k != "type"} for s in trace.steps
    ]
    assert out["answer"] == trace.final.answer and out["reply"] == trace.final.reply
    assert out["evidence"] == trace.final.to_json()["evidence"]
    assert out["document"] == trace.header.document
    assert (
        out["model"]
        == trace.header.model
        == {
            "path": fake_server.url,
            "name": "fake-memagent",
            "size": None,
        }
    )
    assert out["settings"] == trace.header.settings
    assert out["settings"]["backend"] == "openai" and "threads" not in out["settings"]


def test_a_fresh_run_refuses_an_existing_trace_before_any_model(cli, fake_server, doc):
    trace_path = doc.with_suffix(".jsonl")
    assert ask(cli, fake_server, doc, "--trace", str(trace_path)).returncode == 0
    before, calls = trace_path.read_bytes(), fake_server.chat_calls
    again = ask(cli, fake_server, doc, "--trace", str(trace_path), "--no-reuse")
    assert_clean_failure(again, 1, f"{trace_path} already exists", f"--resume {trace_path}")
    assert trace_path.read_bytes() == before  # one run per trace, never two mixed
    assert fake_server.chat_calls == calls
    missing_model = cli("ask", str(doc), "q?", "--trace", str(trace_path), "-m", "nope.gguf")
    assert_clean_failure(missing_model, 1, "already exists")  # said before the model is sought


@pytest.mark.parametrize("where", ["file-as-folder", "proc"])
def test_a_trace_path_that_cannot_be_written_is_one_sentence(cli, tmp_path, doc, where):
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    path = blocker / "t.jsonl" if where == "file-as-folder" else Path("/proc/memagent.jsonl")
    # A model that does not exist: the trace check must come first.
    result = cli("ask", str(doc), "q?", "--trace", str(path), "-m", "nope.gguf")
    assert_clean_failure(result, 1, f"Cannot write the trace {path}")


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("fifo", "is not a regular file"),
        ("device", "is not a regular file"),
        ("dangling link", "it is a link to a file that does not exist"),
        ("loop of links", "Too many levels of symbolic links"),
    ],
)
def test_a_trace_path_that_is_no_file_to_write_names_why(cli, tmp_path, doc, where, reason):
    """Not "already exists; continue its run with --resume" (which then refuses it), nor "a
    file stands where a folder should be"."""
    path = tmp_path / "t.jsonl"
    if where == "fifo":
        os.mkfifo(path)
    elif where == "device":
        path = Path("/dev/null")
    elif where == "dangling link":
        path.symlink_to(tmp_path / "nowhere.jsonl")
    else:
        path.symlink_to(tmp_path / "other.jsonl")
        (tmp_path / "other.jsonl").symlink_to(path)
    result = cli("ask", str(doc), "q?", "--trace", str(path), "-m", "nope.gguf")
    assert_clean_failure(result, 1, str(path), reason)
    assert "--resume" not in result.stderr and "folder" not in result.stderr


def test_the_same_greedy_run_is_answered_from_its_trace(cli, fake_server, doc):
    first = json.loads(ask(cli, fake_server, doc, "--json", "--quiet").stdout)
    calls = fake_server.chat_calls
    again = ask(cli, fake_server, doc, "--json")
    assert again.returncode == 0, again.stderr
    cached = json.loads(again.stdout)
    assert cached["cached"] is True and cached["trace"] == first["trace"]
    assert cached["steps"] == first["steps"] and cached["reply"] == first["reply"]
    assert fake_server.chat_calls == calls and "answered from the finished trace" in again.stderr
    fresh = json.loads(ask(cli, fake_server, doc, "--json", "--no-reuse", "-q").stdout)
    assert fresh["cached"] is False and fresh["trace"] != first["trace"]
    assert [s["memory"] for s in fresh["steps"]] == [s["memory"] for s in first["steps"]]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_resumes_to_the_uninterrupted_answer(
    cli, env, fake_server, doc, tmp_path, sig
):
    whole = json.loads(ask(cli, fake_server, doc, "--json", "--quiet").stdout)
    # Three steps answered, then the server holds the run until the signal has landed: it
    # cannot finish first, however busy the machine.
    fake_server.hold_after = fake_server.chat_calls + 3
    cut = tmp_path / "cut.jsonl"
    args = [
        str(doc),
        FACT_QUESTION,
        *served(fake_server, *STEPS, "--no-reuse", "--trace", str(cut)),
    ]
    process, stdout, stderr = interrupt_after_steps(args, cut, env, 2, sig)
    # As a shell reports a process the signal ended: 130 for Ctrl-C, 143 for SIGTERM.
    assert process.returncode == 128 + sig == {"SIGINT": 130, "SIGTERM": 143}[sig.name]
    assert stdout == "" and "Traceback" not in stderr
    assert f"Interrupted ({sig.name}) after" in words(stderr)
    stopped = read_trace(cut)
    assert stopped.status.state == "interrupted" and stopped.interruption.steps_done >= 2
    assert stopped.interruption.reason == sig.name
    hint = words(stderr).split("resume with: ")[1]
    assert hint.startswith(f"memagent ask {doc} ") and hint.endswith(f"--resume {cut}")
    assert "--trace" not in hint

    fake_server.release()
    resumed = cli(*shlex.split(hint)[1:], "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {cut} after step {stopped.interruption.steps_done}" in words(resumed.stderr)
    out = json.loads(resumed.stdout)
    assert out["answer"] == whole["answer"] and out["reply"] == whole["reply"]
    assert [s["memory"] for s in out["steps"]] == [s["memory"] for s in whole["steps"]]
    finished = read_trace(cut)
    assert finished.finished and [s.index for s in finished.steps] == list(
        range(len(whole["steps"]))
    )


def test_resume_refuses_another_run(cli, fake_server, doc, tmp_path):
    fake_server.fail_after, fake_server.fail_status = 2, 400
    cut = tmp_path / "cut.jsonl"
    stopped = ask(cli, fake_server, doc, "--trace", str(cut))
    assert stopped.returncode == 1 and "HTTP 400" in stopped.stderr
    assert "Stopped after 2 of" in words(stopped.stderr)
    fake_server.fail_after = None
    other = cli("ask", str(doc), "Who?", *served(fake_server, *STEPS, "--resume", str(cut)))
    assert_clean_failure(other, 1, f"Cannot resume {cut}", "the question differs")
    smaller = ask(cli, fake_server, doc, "--memory-tokens", "32", "--resume", str(cut))
    assert_clean_failure(smaller, 1, "--memory-tokens differs (64 there, 32 here)")
    latest = ask(cli, fake_server, doc, "--resume-latest")
    assert_clean_failure(latest, 1, "no unfinished trace")  # --trace put it outside the folder
    assert ask(cli, fake_server, doc, "--resume", str(cut)).returncode == 0
    assert read_trace(cut).finished


def test_resume_needs_a_trace_and_never_becomes_a_question(cli, doc):
    result = cli("ask", str(doc), "q?", "--resume", "missing.trace")
    assert_clean_failure(result, 1, "Trace not found: missing.trace")
    result = cli("ask", str(doc), "q?", "--resume")
    assert result.returncode == 2 and "requires an argument" in result.stderr


def test_a_server_that_stops_answering_times_out_and_keeps_the_trace(
    cli, fake_server, doc, tmp_path
):
    fake_server.hang_after = 3
    trace_path = tmp_path / "t.jsonl"
    result = ask(cli, fake_server, doc, "--trace", str(trace_path), "--timeout", "2")
    assert_clean_failure(result, 1, "did not answer /v1/chat/completions within 2 seconds")
    assert "resume with:" in result.stderr
    assert len(read_trace(trace_path).steps) == 3


def test_a_step_larger_than_the_served_context(cli, fake_server, doc):
    result = cli("ask", str(doc), FACT_QUESTION, *served(fake_server, "--chunk-tokens", "9000"))
    assert_clean_failure(result, 1, "context holds 8192", "lower --chunk-tokens or --memory-tokens")
    result = cli("ask", str(doc), "why " * 6000, *served(fake_server))
    assert_clean_failure(result, 1, "question is too long")
    assert fake_server.chat_calls == 0


def test_a_server_that_loses_long_tokens_text_is_not_trusted_with_the_chunks(cli, tmp_path):
    """llama-cpp-python's own server detokenizes each token into 32 bytes and drops longer
    ones: memagent finds that out before reading and cuts with tiktoken, so that every
    character of the rules and table gaps still reaches the model."""
    from support.fake_openai import FakeServer

    doc = tmp_path / "ruled.txt"
    text = "".join(f"Part {i}\n{'=' * 80}\nThe keeper counted.{' ' * 40}\n" for i in range(40))
    doc.write_text(text)
    with FakeServer(extras_tokenizer=True) as server:
        result = cli("ask", str(doc), FACT_QUESTION, "--json", *served(server, *STEPS))
    assert result.returncode == 0, result.stderr
    assert "drops" in words(result.stderr) and "tiktoken" in words(result.stderr)
    out = json.loads(result.stdout)
    ranges = [step["chars"] for step in out["steps"]]
    assert len(ranges) >= 2 and ranges[0][0] == 0
    assert ranges[-1][1] == out["document"]["characters"] == len(text.rstrip())
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def test_resume_of_a_damaged_trace_names_the_bad_line(cli, fake_server, doc, tmp_path):
    fake_server.fail_after, fake_server.fail_status = 3, 400
    cut = tmp_path / "cut.jsonl"
    assert ask(cli, fake_server, doc, "--trace", str(cut)).returncode == 1
    lines = cut.read_text().splitlines(keepends=True)
    step = json.loads(lines[2])
    del step["memory"]
    cut.write_text(lines[0] + lines[1] + json.dumps(step) + "\n" + "".join(lines[3:]))
    fake_server.fail_after = None
    result = ask(cli, fake_server, doc, "--resume", str(cut))
    assert_clean_failure(result, 1, f"{cut}, line 3 has no 'memory' field")


def test_a_damaged_trace_in_the_data_folder_is_passed_over_by_the_cache(cli, fake_server, doc, env):
    first = json.loads(ask(cli, fake_server, doc, "--json", "-q").stdout)
    path = Path(first["trace"])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[1]["tokens"] = "0-300"  # a mistyped field: this trace cannot answer again
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    again = json.loads(ask(cli, fake_server, doc, "--json", "-q").stdout)
    assert again["cached"] is False and again["reply"] == first["reply"]


def test_a_trace_of_format_1_resumes_in_its_own_format(cli, fake_server, doc, tmp_path):
    """A run interrupted before steps counted from 1 (format 1: "index" from 0) goes on."""
    whole = json.loads(ask(cli, fake_server, doc, "--json", "-q").stdout)
    fake_server.fail_after, fake_server.fail_status = 2, 400
    cut = tmp_path / "cut.jsonl"
    assert ask(cli, fake_server, doc, "--trace", str(cut), "--no-reuse").returncode == 1
    records = [json.loads(line) for line in cut.read_text().splitlines()]
    for record in records:  # as memagent wrote traces before format 2
        if record["type"] == "header":
            record["format"] = 1
        elif record["type"] == "step":
            record["index"] = record.pop("step") - 1
    cut.write_text("".join(json.dumps(r) + "\n" for r in records))

    fake_server.fail_after = None
    resumed = ask(cli, fake_server, doc, "--resume", str(cut), "--json")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["answer"] == whole["answer"] and out["evidence"] == whole["evidence"]
    assert [s["step"] for s in out["steps"]] == list(range(1, len(whole["steps"]) + 1))
    written = [json.loads(line) for line in cut.read_text().splitlines()]
    steps = [r for r in written if r["type"] == "step"]
    assert [r["index"] for r in steps] == list(range(len(whole["steps"])))  # still format 1
    assert all("step" not in r for r in steps)
    final = read_trace(cut)
    assert (
        final.finished
        and not final.problems
        and final.final.to_json()["evidence"] == whole["evidence"]
    )


def parsed(*args: str):
    """`memagent ask ARGS` as Typer parses it, without running it."""
    from support import cli_docs

    return cli_docs.command("ask").make_context("ask", list(args))


def test_the_resume_hint_is_the_command_as_parsed(monkeypatch):
    from memagent_cli.cli.ask import resume_command

    monkeypatch.setenv("MEMAGENT_SERVED_MODEL", "from-the-environment")
    given = parsed(
        "doc.txt", "-m", "m.gguf", "-t", "2", "--no-speculate", "-fa", "on", "--api-key=k-1",
        "--backend", "openai", "--trace", "old.jsonl", "--temperature", "0", "--", "-why?",
    )  # fmt: skip
    hint, left_out = resume_command(given, Path("cut.jsonl"))
    assert hint.startswith("memagent ask ") and hint.endswith("-- doc.txt '-why?'")
    assert left_out == ["--api-key"] and "k-1" not in hint
    assert "from-the-environment" not in hint  # the variable gives it again
    # Run as printed, it parses to the same command, continuing from the trace.
    again = parsed(*shlex.split(hint)[2:])
    assert again.params == given.params | {
        "trace": None,
        "resume": Path("cut.jsonl"),
        "api_key": None,
    }
    # With several runs the same command resumes each: nothing is added or dropped but secrets.
    latest = parsed("doc.txt", "who", "--resume-latest", "-b", "64")
    hint, left_out = resume_command(latest, None)
    assert hint == "memagent ask doc.txt who --resume-latest --batch-size 64" and left_out == []
