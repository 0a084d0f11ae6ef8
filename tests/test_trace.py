"""Trace files: written step by step, read back as far as they go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memagent_cli.backend import Generation
from memagent_cli.chunking import make_chunks
from memagent_cli.reader import Answer, Finished, Step, StepFinished
from memagent_cli.trace import (
    FORMAT_VERSION,
    Header,
    Interruption,
    StepRecord,
    TraceError,
    TraceWriter,
    read_trace,
)


def header(chunks: int = 3, question: str = "q") -> Header:
    return Header(
        question=question,
        document={
            "path": "d.txt",
            "sha256": "ab" * 32,
            "format": "text",
            "tokens": 12,
            "chunks": chunks,
        },
        model={"path": "/m.gguf", "name": "m", "size": 1},
        settings={"chunk_tokens": 4, "memory_tokens": 8, "temperature": 0.0, "seed": None},
        templates_sha256={"update": "cd" * 32, "final": "ef" * 32},
        created="2026-01-01T00:00:00+00:00",
        memagent="0.1.0",
    )


def write_run(path: Path, steps: int, finish: bool) -> list[Step]:
    chunks = make_chunks(list(b"x" * (steps * 4)), 4, bytes)
    writer = TraceWriter(path, header(steps), lambda a, b: f"p. {a}")
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
    assert trace.header.question == "q" and trace.header.format == FORMAT_VERSION
    assert [s.index for s in trace.steps] == [0, 1, 2]
    assert trace.steps[1].memory == "memory 1"
    assert trace.steps[1].tokens == (4, 8) and trace.steps[1].span == "p. 4"
    assert trace.final.answer == "yes" and trace.finished
    assert str(trace.status) == "finished"
    assert not trace.problems


def test_a_step_becomes_a_record_and_the_record_the_same_step(tmp_path):
    path = tmp_path / "t.jsonl"
    done = write_run(path, 3, finish=True)
    again = [
        record.to_step(step.chunk)
        for record, step in zip(read_trace(path).steps, done, strict=True)
    ]
    rounded = [StepRecord.of(step, "p. 0").to_step(step.chunk) for step in done]
    assert again == rounded


def test_each_step_is_on_disk_before_the_next_one(tmp_path):
    path = tmp_path / "t.jsonl"
    chunks = make_chunks(list(b"abcd"), 2, bytes)
    writer = TraceWriter(path, header(2))
    writer(StepFinished(Step(chunks[0], "m", Generation("m", 1, 1, 0, 0, "stop")), 2))
    # Not closed: a crash now must still leave the step readable.
    assert len(read_trace(path).steps) == 1
    writer.close()


def test_an_interrupted_run_says_where_it_stopped(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 2, finish=False)
    trace = read_trace(path)
    assert not trace.finished
    assert trace.interruption == Interruption("SIGINT", 2)
    assert str(trace.status) == "interrupted (SIGINT) after 2 of 2 steps"


def test_replies_kept_at_a_stop_never_take_its_record_past_a_line_s_limit(tmp_path):
    """A stop in the middle of a long pass keeps the replies that came (Reply), as far as
    a readable record holds them; the rest a resumed run asks again."""
    from memagent_cli.files import MAX_LINE_BYTES
    from memagent_cli.trace import Reply

    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path, header(), lambda a, b: "")
    text = "a reply of a megabyte " * ((1 << 20) // 22)
    replies = [Reply.of(f"{i:064x}", Generation(text, 40, 7, 0.1, 0.3, "stop")) for i in range(40)]
    writer.interrupted("SIGINT", replies)
    writer.close()
    trace = read_trace(path)
    assert not trace.problems and trace.interruption is not None
    kept = trace.interruption.replies
    assert 0 < len(kept) < len(replies) and kept == tuple(replies[: len(kept)])
    assert max(map(len, path.read_bytes().splitlines())) < MAX_LINE_BYTES


def test_a_trace_cut_in_the_middle_of_a_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    data = path.read_bytes()
    lines = data.split(b"\n")
    cut = b"\n".join(lines[:3]) + b"\n" + lines[3][: len(lines[3]) // 2]
    path.write_bytes(cut)
    trace = read_trace(path)
    assert [s.index for s in trace.steps] == [0, 1]
    assert not trace.finished
    assert trace.problems and "cut short" in trace.problems[0]


def test_another_format_is_refused_with_its_number(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"type": "header", "format": 0, "question": "q"}) + "\n")
    with pytest.raises(TraceError, match="format 0; this memagent reads formats 1 and 2"):
        read_trace(path)


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


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rewrite(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    "line, field, value",
    [
        (1, "document", "book.txt"),
        (1, "created", 1_700_000_000),
        (2, "tokens", "0-4"),
        (2, "memory", None),
        (5, "evidence", "step 1"),
        (5, "answer", 42),
    ],
)
def test_a_record_with_a_field_of_the_wrong_type_names_its_line(tmp_path, line, field, value):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    records = lines_of(path)
    records[line - 1][field] = value
    with pytest.raises(TraceError, match=f"line {line} has a '{field}' field of the wrong type"):
        read_trace(rewrite(path, records))


def test_a_step_without_its_memory_names_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    records = lines_of(path)
    del records[2]["memory"]
    with pytest.raises(TraceError, match="line 3 has no 'memory' field"):
        read_trace(rewrite(path, records))


@pytest.mark.parametrize(
    "junk",
    ["[" * 200_000 + "]" * 200_000, '{"type": "step", "index": ' + "9" * 5000 + "}"],
    ids=["200000-deep nesting", "5000-digit number"],
)
def test_absurd_json_is_a_skipped_line(tmp_path, junk):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + junk + "\n" + "".join(lines[2:]))
    trace = read_trace(path)
    assert [s.index for s in trace.steps] == [0, 1, 2] and trace.finished
    assert trace.problems == ["line 3 is not a trace record and was skipped"]


def test_steps_out_of_order_or_twice_are_skipped_and_said(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 3, finish=True)
    records = lines_of(path)
    # header, step 3, step 1, step 1 again, step 2, step 3, final
    rewrite(path, [records[0], records[3], records[1], records[1], *records[2:]])
    trace = read_trace(path)
    assert [s.index for s in trace.steps] == [0, 1, 2]
    assert trace.steps[0].memory == "memory 0"
    assert trace.problems == [
        "a record of step 3 came where step 1 was due and was skipped",
        "a record of step 1 came where step 2 was due and was skipped",
    ]


def test_a_header_alone_is_a_run_not_started(tmp_path):
    path = tmp_path / "t.jsonl"
    TraceWriter(path, header(5)).close()
    trace = read_trace(path)
    assert trace.status.state == "not started" and not trace.steps
    assert str(trace.status).startswith("not started: 0 of 5 steps")


def test_a_fresh_run_never_writes_into_an_existing_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    write_run(path, 2, finish=True)
    before = path.read_bytes()
    with pytest.raises(TraceError, match=f"already exists; continue its run with --resume {path}"):
        TraceWriter(path, header(2))
    assert path.read_bytes() == before


def test_a_second_run_in_one_file_is_not_merged_into_the_first(tmp_path):
    # What older versions wrote for `ask --trace SAME` twice.
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_run(first, 2, finish=False)
    write_run(second, 3, finish=True)
    first.write_text(first.read_text() + second.read_text())
    trace = read_trace(first)
    assert len(trace.steps) == 2 and not trace.finished
    assert "a second run starts later in the file" in trace.problems[0]


def test_a_fifo_or_a_folder_is_not_read_as_a_trace(tmp_path):
    import os

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="is not a regular file"):
        read_trace(fifo)  # would block forever if opened
    with pytest.raises(TraceError, match="is not a regular file"):
        read_trace(tmp_path)


def test_a_huge_line_is_skipped_in_bounded_memory(tmp_path, monkeypatch):
    from memagent_cli.trace import file

    monkeypatch.setattr(file, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "t.jsonl"
    write_run(path, 2, finish=True)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + "x" * 5000 + "\n" + "".join(lines[2:]))
    trace = read_trace(path)
    assert [s.index for s in trace.steps] == [0, 1] and trace.finished
    assert trace.problems == ["line 3 is longer than 1,000 bytes and was skipped"]


def test_a_run_with_other_engine_arithmetic_is_another_run():
    """Values as a user gives them: on and off, and "not set" for a setting the other run
    had none of (a server's run has no llama.cpp cache type), never Python's None."""
    from memagent_cli.trace import differences

    here = header()
    there = header()
    there.settings.update(cache_type_k="q8_0", exact=False)
    assert differences(there, here) == [
        "--cache-type-k differs (q8_0 there, not set here)",
        "--exact differs (off there, not set here)",
    ]
    assert differences(header(), header()) == []


def engine_header(**engine) -> Header:
    made = header()
    made.settings.update(engine)
    return made


def test_speculation_is_another_run_unless_exact():
    from memagent_cli.trace import differences

    # Without --exact a verified draft decodes on other kernels: a near-tie token may differ.
    assert differences(
        engine_header(speculate=False, exact=False), engine_header(speculate=True, exact=False)
    ) == ["--speculate differs (off there, on here)"]
    # With --exact the output is byte-identical either way: the same run.
    exact = engine_header(speculate=False, exact=True), engine_header(speculate=True, exact=True)
    assert not differences(*exact)
    # A header from before the key was recorded speculated, as the default does.
    assert not differences(engine_header(exact=False), engine_header(speculate=True, exact=False))
    assert differences(engine_header(exact=False), engine_header(speculate=False, exact=False))
    # --exact against not: said once, not again as --speculate.
    assert differences(
        engine_header(speculate=False, exact=True), engine_header(speculate=True, exact=False)
    ) == ["--exact differs (on there, off here)"]


def test_a_batch_journal_tells_speculation_apart_unless_exact():
    from types import SimpleNamespace

    from memagent_cli.run.journal import run_identity

    def identity(**engine) -> dict:
        settings = {"chunk_tokens": 4, "memory_tokens": 8, "temperature": 0.0, **engine}
        stand_in = SimpleNamespace(
            model_record={"path": "/m.gguf", "size": 1}, settings_record=lambda: settings
        )
        return run_identity(stand_in)  # type: ignore[arg-type]

    assert identity(speculate=False, exact=False) != identity(speculate=True, exact=False)
    assert identity(speculate=False, exact=True) == identity(speculate=True, exact=True)
    # A speculating batch (the default) keeps the journal name it had before the key.
    assert "speculate" not in identity(speculate=True, exact=False)["settings"]


def test_journals_and_results_files_keep_the_identity_they_were_written_with():
    from types import SimpleNamespace

    from memagent_cli.errors import UserError
    from memagent_cli.evaluation.evaluate import run_info
    from memagent_cli.evaluation.runner import check_resumable
    from memagent_cli.run.journal import run_identity

    reading = {"chunk_tokens": 4, "memory_tokens": 8, "temperature": 0.0, "top_p": 0.95, "seed": 7}
    usual = {"flash_attn": "off", "cache_type_k": "f16", "cache_type_v": "f16", "exact": False}

    def engine(**settings):
        record = reading | {"context_tokens": 99, "backend": "llama", "threads": 2} | settings
        model = {"path": "/m.gguf", "name": "m", "size": 1}
        return SimpleNamespace(model_record=model, settings_record=lambda: record)

    # What a batch journal is named by (its file name is a hash of it), and what every record
    # of an eval results file holds, as written before: an earlier run's files are found.
    default = engine(**usual, speculate=True)
    assert run_identity(default) == {
        "model": {"path": "/m.gguf", "size": 1},
        "settings": reading | usual,
    }
    assert run_info(default) == {"model": "m", "settings": reading}
    assert run_info(engine(backend="openai")) == {"model": "m", "settings": reading}
    # Another reader is another run; MemAgent's, which runs from before the readers were,
    # goes unnamed.
    assert run_identity(engine(reader="rememr1"))["settings"]["reader"] == "rememr1"
    assert "reader" not in run_identity(engine(reader="memagent"))["settings"]
    # eval takes the engine's flags now: a results file continues only with the same arithmetic.
    other = engine(**(usual | {"flash_attn": "on"}), speculate=False)
    assert run_info(other)["settings"] == reading | {"flash_attn": "on", "speculate": False}
    earlier = SimpleNamespace(path=Path("r.jsonl"), records=[run_info(default)])
    check_resumable(earlier, run_info(default))  # type: ignore[arg-type]
    with pytest.raises(UserError, match="holds results of another settings"):
        check_resumable(earlier, run_info(other))  # type: ignore[arg-type]


def test_a_journal_that_is_not_a_regular_file_is_one_sentence(tmp_path):
    """A FIFO in a batch journal's place: refused at once, never read (a read would wait for
    a writer forever) nor a traceback."""
    import os

    from memagent_cli.errors import UserError
    from memagent_cli.run.journal import Journal

    fifo = tmp_path / "journal.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is not a regular file"):
        Journal(fifo, {"batch": 1})
