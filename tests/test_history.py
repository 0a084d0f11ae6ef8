"""What an estimate learns from this model's past readings: traces written by the trace
writer as `ask` writes them, priced with a made-up speed, then the estimate that uses them."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from support.scripted import ScriptedBackend
from support.story import story

from memagent_cli import protocol, readers
from memagent_cli.backend import Description, Generation
from memagent_cli.backends.speed import Speed
from memagent_cli.chunking import make_chunks
from memagent_cli.reader import Answer, Finished, Settings, Step, StepFinished
from memagent_cli.readers import infmem
from memagent_cli.run import history
from memagent_cli.run.history import History, PastCall, past_readings
from memagent_cli.run.inspect import (
    FIRST_GUESS,
    CallSize,
    Templates,
    call_seconds,
    estimate_reading,
    reading_calls,
)
from memagent_cli.trace import Header, TraceWriter

MODEL = {"path": "/models/m.gguf", "name": "m", "size": 1000}
ENGINE = {
    "backend": "llama",
    "threads": 2,
    "gpu_layers": 0,
    "speculate": True,
    "exact": False,
    "flash_attn": "auto",
    "cache_type_k": "f16",
    "cache_type_v": "f16",
}
# Prefill 1 ms a token, decode 10 ms, at every depth: a call of r reply tokens after its
# prompt decodes r - 1 of them, 10 ms each.
FLAT = Speed(1e-3, 0.0, 1e-2, 0.0)

# (prompt tokens, reply tokens, prompt seconds, seconds) per step, then the answer's.
Call = tuple[int, int, float, float]


def write_reading(
    path: Path,
    steps: list[Call],
    final: Call | None,
    *,
    model: dict = MODEL,
    engine: dict = ENGINE,
    memory: int = 100,
    reader: str | None = None,
) -> Path:
    """A trace of a reading as `ask` writes it; unfinished (interrupted) without `final`."""
    chunks = make_chunks(list(b"x" * (4 * len(steps))), 4, bytes)
    settings = {"chunk_tokens": 4, "memory_tokens": memory, "temperature": 0.0, "seed": None}
    settings |= {"reader": reader} if reader else {}
    header = Header(
        question="q",
        document={"path": "d.txt", "sha256": "ab" * 32, "format": "text", "tokens": 4 * len(steps),
                  "chunks": len(steps)},
        model=model,
        settings=settings | {"context_tokens": 4096, **engine},
        templates_sha256={"update": "cd" * 32, "final": "ef" * 32},
        created="2026-11-27T00:00:00+00:00",
        memagent="0.1.0",
    )  # fmt: skip
    writer = TraceWriter(path, header)
    done = []
    for chunk, (prompt, reply, prompt_seconds, seconds) in zip(chunks, steps, strict=True):
        gen = Generation("m", prompt, reply, prompt_seconds, seconds, "stop")
        done.append(Step(chunk, "m", gen))
        writer(StepFinished(done[-1], len(chunks)))
    if final is None:
        writer.interrupted("SIGINT")
    else:
        gen = Generation("\\boxed{x}", final[0], final[1], final[2], final[3], "stop")
        writer(Finished(Answer("q", "x", "\\boxed{x}", done, gen)))
    writer.close()
    return path


def decoding(reply: int, factor: float) -> float:
    """Seconds of decoding `reply` tokens at `factor` times FLAT's price."""
    return factor * (reply - 1) * 1e-2


def test_a_reading_teaches_how_long_replies_run_and_what_decoding_costs(tmp_path):
    # Memories of 50, 80 and 20 of 100 tokens; answers of 10 and 30 of FINAL_MAX_TOKENS;
    # decoding at half the single-decode price, once at twice it (a busy moment).
    write_reading(
        tmp_path / "a.jsonl",
        [(500, 50, 0.5, 0.5 + decoding(50, 0.5)), (600, 80, 0.6, 0.6 + decoding(80, 2.0))],
        (200, 10, 0.2, 0.2 + decoding(10, 0.5)),
    )
    write_reading(
        tmp_path / "b.jsonl",
        [(500, 20, 0.5, 0.5 + decoding(20, 0.5))],
        (200, 30, 0.2, 0.2 + decoding(30, 0.5)),
    )
    past = past_readings(MODEL, ENGINE, folder=tmp_path)
    assert past.readings == 2 and len(past.calls) == 5
    assert past.written() == pytest.approx(0.5)
    assert past.answered() == pytest.approx(20 / protocol.FINAL_MAX_TOKENS)
    # The answer of 10 tokens is too short to tell decoding's price: 4 calls, median 0.5.
    assert past.decode_factor(FLAT) == pytest.approx(0.5)
    # The price follows the depth of each call where the rates fall with it.
    deep = Speed(1e-3, 0.0, 1e-2, 1e-5)
    call = next(c for c in past.calls if c.completion_tokens == 50)
    assert call.decode_price(deep) == pytest.approx(deep.decode_seconds(49, 501))


def test_infmem_records_join_their_calls_and_stages():
    """An InfMem step joins its planner's and its update's calls, each thinking then
    replying: the allowed reply and the decoding price count all four stages."""
    limits = readers.get("infmem").replies(100)
    assert limits.update == limits.answer == infmem.THINKING_TOKENS + 100
    joined = PastCall(False, 0.5, 4000, 400, 0.0, stages=4)
    assert joined.decode_price(FLAT) == pytest.approx(4 * 99 * 1e-2)


def test_no_reading_of_this_model_and_engine_teaches_anything(tmp_path):
    steps, final = [(500, 50, 0.5, 1.0)], (200, 30, 0.2, 0.5)
    write_reading(tmp_path / "other-model.jsonl", steps, final, model={**MODEL, "path": "/x.gguf"})
    write_reading(tmp_path / "other-size.jsonl", steps, final, model={**MODEL, "size": 999})
    write_reading(tmp_path / "threads.jsonl", steps, final, engine={**ENGINE, "threads": 8})
    write_reading(tmp_path / "no-drafts.jsonl", steps, final, engine={**ENGINE, "speculate": False})
    write_reading(tmp_path / "server.jsonl", steps, final, engine={"backend": "openai"})
    write_reading(tmp_path / "infmem.jsonl", steps, final, reader="infmem")
    assert past_readings(MODEL, ENGINE, folder=tmp_path) == History()
    # The same traces teach the reading they are of.
    assert past_readings(MODEL, ENGINE, "infmem", folder=tmp_path).readings == 1
    assert past_readings({**MODEL, "path": "/x.gguf"}, ENGINE, folder=tmp_path).readings == 1
    # A model behind a server: its calls' seconds are the server's, not this machine's.
    assert past_readings(MODEL, {"backend": "openai"}, folder=tmp_path) == History()


def test_damaged_unfinished_and_huge_traces_are_passed_over_in_bounded_time(tmp_path, monkeypatch):
    steps, final = [(500, 50, 0.5, 1.0)], (200, 30, 0.2, 0.5)
    write_reading(tmp_path / "unfinished.jsonl", steps, None)
    cut = write_reading(tmp_path / "cut.jsonl", steps, final)
    lines = cut.read_bytes().splitlines(keepends=True)
    cut.write_bytes(b"".join([lines[0], b'{"type": "st\n', *lines[1:]]))  # a line cut short
    (tmp_path / "not-a-trace.jsonl").write_text("hello\n")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "folder.jsonl").mkdir()
    huge = write_reading(tmp_path / "huge.jsonl", steps, final)
    os.truncate(huge, 900 << 20)  # sparse: 900 MB that take no disk, and must not be read
    opened = []
    read = history.read_records
    monkeypatch.setattr(history, "read_records", lambda f, w: opened.append(w) or read(f, w))
    assert past_readings(MODEL, ENGINE, folder=tmp_path) == History()
    assert str(huge) not in opened and str(cut) in opened  # passed over by its size, unread
    monkeypatch.setattr(history, "read_records", read)
    write_reading(tmp_path / "whole.jsonl", steps, final)
    assert past_readings(MODEL, ENGINE, folder=tmp_path).readings == 1
    # One that grows past its bound while it is read (a run writing it) is left there.
    monkeypatch.setattr(history, "MAX_RECORDS", 1)
    assert past_readings(MODEL, ENGINE, folder=tmp_path) == History()


def test_only_the_newest_readings_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "READINGS", 2)
    for age, reply in enumerate((20, 40, 90)):
        path = write_reading(tmp_path / f"{reply}.jsonl", [(500, reply, 0.5, 1.0)], (9, 9, 0, 0))
        os.utime(path, (1e9 - age * 100, 1e9 - age * 100))  # 20 the newest, 90 the oldest
    past = past_readings(MODEL, ENGINE, folder=tmp_path)
    assert past.readings == 2 and past.written() == pytest.approx(0.3)


def test_the_calls_of_a_reading_with_shorter_replies():
    templates = Templates(update=150, final=80)
    calls = reading_calls("memagent", [5000, 5000], templates, 1000, 4, written=0.5, answered=0.01)
    # Each memory is half the budget, in the reply and in the next prompt.
    assert calls == [CallSize(5154, 500), CallSize(150 + 500 + 5000, 500), CallSize(580, 10)]
    assert reading_calls("rememr1", [5000, 5000], templates, 1000, 4, 0.5)[1].prompt == 6150
    assert reading_calls("memagent", [10], templates, 1000, 4, 0.0, 0.0)[0].reply == 1


def test_the_estimate_is_about_what_past_readings_say_and_at_most_the_bound():
    backend = ScriptedBackend([])  # one token per byte
    chunks = make_chunks(backend.tokenize(story(40)), 500, backend.detokenize)
    settings = Settings(chunk_tokens=500, memory_tokens=64)

    def measure(model, tokens, depth):
        return Speed(1e-3, 1e-7, 2e-2, 1e-6, measured_to=depth, seconds=3.0)

    bound = estimate_reading(backend, chunks, settings, measure=measure, past=History())  # type: ignore[arg-type]
    assert bound["learned"] is None and "learns" in bound["assumes"]

    # A reading whose memories ran to a quarter of the budget and answer to 100 tokens,
    # decoded at 0.4 the price of single decodes (drafts copied the memory).
    speed = measure(None, [], 0)
    calls = (PastCall(False, 0.25, 600, 40, 0.0), PastCall(True, 100 / 1024, 200, 100, 0.0))
    past = History(
        1, tuple(dataclasses.replace(c, decode_seconds=0.4 * c.decode_price(speed)) for c in calls)
    )
    est = estimate_reading(backend, chunks, settings, measure=measure, past=past)  # type: ignore[arg-type]
    assert est["learned"] == {
        "readings": 1,
        "calls": 2,
        "ignored_calls": 0,
        "memory_fraction": 0.25,
        "answer_fraction": round(100 / 1024, 3),
        "decode_factor": 0.4,
    }
    likely = [CallSize(*call) for call in est["likely_calls"]]
    assert [c.reply for c in likely] == [16] * len(chunks) + [100]
    assert est["seconds_per_question"] == pytest.approx(
        sum(call_seconds(c, speed, 0.4) for c in likely), abs=0.05
    )
    # At most: every reply in full at single decodes, the bound without past readings.
    assert est["seconds_at_most"] == bound["seconds_at_most"]
    assert est["calls"] == bound["calls"]
    assert est["seconds_per_question"] < 0.5 * est["seconds_at_most"]
    assert (
        "as long as in 1 reading with this model on this machine (memories 25% of the 64"
        in est["assumes"]
    )


class _Drafting(ScriptedBackend):
    """The stand-in, saying as llama.cpp's does whether it drafts (describe().engine)."""

    speculate = True

    def describe(self) -> Description:
        found = super().describe()
        return Description(found.model, {**found.engine, "speculate": self.speculate})


def test_before_any_reading_the_estimate_is_a_likely_figure_within_a_range_to_the_bound():
    """On first use (no reading of this model here) the bound alone overstated a reading
    1.4-1.9x (replies ran shorter, drafts copied): the figure is priced at the replies and
    draft savings of FIRST_GUESS, within a range from LEAST_GUESS to the bound."""
    backend = _Drafting([])  # drafts, as by default
    chunks = make_chunks(backend.tokenize(story(40)), 500, backend.detokenize)
    settings = Settings(chunk_tokens=500, memory_tokens=64)
    speed = Speed(1e-3, 1e-7, 2e-2, 1e-6, measured_to=700, seconds=3.0)
    est = estimate_reading(backend, chunks, settings, measure=lambda *_: speed, past=History())  # type: ignore[arg-type]
    likely, most = est["seconds_per_question"], est["seconds_at_most"]
    assert likely < most
    assert est["seconds_at_least"] < likely
    guess = FIRST_GUESS
    calls = [CallSize(*call) for call in est["likely_calls"]]
    assert [c.reply for c in calls] == [round(64 * guess.written)] * len(chunks) + [
        round(protocol.FINAL_MAX_TOKENS * guess.answered)
    ]
    priced = sum(call_seconds(c, speed, guess.factor) for c in calls)
    assert likely == pytest.approx(priced, abs=0.05)
    assert "before this model has read here" in est["assumes"]
    # Without drafts nothing is saved on decoding: only shorter replies lower it.
    backend.speculate = False
    plain = estimate_reading(backend, chunks, settings, measure=lambda *_: speed, past=History())  # type: ignore[arg-type]
    assert likely < plain["seconds_per_question"] < most == plain["seconds_at_most"]


def step_lines(path: Path, count: int) -> bytes:
    """`count` step records as the trace at `path` holds its first one, numbered on."""
    lines = path.read_bytes().splitlines(keepends=True)
    step = json.loads(next(line for line in lines if b'"type": "step"' in line))
    return b"".join((json.dumps(step | {"step": i + 1}) + "\n").encode() for i in range(count))


def test_blank_lines_count_against_the_bound_on_records(tmp_path, monkeypatch):
    path = write_reading(tmp_path / "a.jsonl", [(500, 50, 0.5, 1.0)], (200, 30, 0.2, 0.5))
    header, *rest = path.read_bytes().splitlines(keepends=True)
    monkeypatch.setattr(history, "MAX_RECORDS", 1000)
    path.write_bytes(header + b"\n" * 2000 + b"".join(rest))  # 2,003 lines, 3 records
    assert past_readings(MODEL, ENGINE, folder=tmp_path) == History()


def test_unfinished_traces_are_not_read_whole(tmp_path, monkeypatch):
    """A trace whose last record is not an answer teaches nothing: only its first and last
    lines are read, however many steps it holds (a run still writing, or one planted: 8 MB
    of them cost seconds each to parse)."""
    from memagent_cli.trace import file

    first = write_reading(tmp_path / "0.jsonl", [(500, 50, 0.5, 1.0)], None)
    header = first.read_bytes().splitlines(keepends=True)[0]
    steps = step_lines(first, 2_000)
    for i in range(3):
        (tmp_path / f"{i}.jsonl").write_bytes(header + steps)
    parsed = []
    parse = file._parse
    monkeypatch.setattr(file, "_parse", lambda *a: parsed.append(a[1]) or parse(*a))
    assert past_readings(MODEL, ENGINE, folder=tmp_path) == History()
    assert len(parsed) <= 3  # each one's header


def test_an_estimate_reads_a_bounded_number_of_bytes_in_all(tmp_path, monkeypatch):
    for i in range(5):
        write_reading(tmp_path / f"{i}.jsonl", [(500, 50, 0.5, 1.0)], (200, 30, 0.2, 0.5))
    size = (tmp_path / "0.jsonl").stat().st_size
    monkeypatch.setattr(history, "TOTAL_BYTES", 3 * size + 10, raising=False)
    assert past_readings(MODEL, ENGINE, folder=tmp_path).readings == 3


def test_only_this_machines_readings_teach_the_estimate(tmp_path):
    """A shared home: the same model read on a machine 10x slower says nothing of this one."""
    here, there = ENGINE | {"machine": "a1"}, ENGINE | {"machine": "b2"}
    slow = [(500, 50, 0.5, 0.5 + decoding(50, 10.0))] * 40
    write_reading(tmp_path / "there.jsonl", slow, (200, 30, 0.2, 0.5), engine=there)
    write_reading(tmp_path / "before.jsonl", slow, (200, 30, 0.2, 0.5))  # no machine named
    assert past_readings(MODEL, here, folder=tmp_path) == History()
    write_reading(
        tmp_path / "here.jsonl", [(500, 50, 0.5, 0.5 + decoding(50, 1.0))], None, engine=here
    )
    write_reading(
        tmp_path / "here2.jsonl",
        [(500, 50, 0.5, 0.5 + decoding(50, 1.0))],
        (200, 30, 0.2, 0.2 + decoding(30, 1.0)),
        engine=here,
    )
    past = past_readings(MODEL, here, folder=tmp_path)
    assert past.readings == 1 and past.decode_factor(FLAT) == pytest.approx(1.0)


def test_values_no_machine_gives_are_ignored_and_counted(tmp_path):
    """A hostile trace's decoding at 1e16 times the price of a decode, or for nothing."""
    write_reading(
        tmp_path / "hostile.jsonl",
        [(500, 50, 0.5, 1e14), (500, 50, 0.5, 0.5), (500, 50, 0.5, 0.5 + decoding(50, 0.5))],
        (200, 30, 0.2, 0.2 + decoding(30, 0.5)),
    )
    past = past_readings(MODEL, ENGINE, folder=tmp_path)
    assert past.readings == 1
    assert past.decode_factor(FLAT) == pytest.approx(0.5)
    assert past.ignored(FLAT) == 2
