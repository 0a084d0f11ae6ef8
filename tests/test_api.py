"""memagent from Python: the example of docs/python-api.md, and the library against the
command."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from support.scripted import ScriptedBackend
from support.story import FACT_QUESTION, story

from memagent_cli import api
from memagent_cli.api import Finished, Sampling, StepFinished, StepStarted
from memagent_cli.run import engine

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def page_example() -> str:
    """The first python example of docs/python-api.md."""
    found = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert found, "docs/python-api.md has no python example"
    return found[1]


def test_the_python_api_example_runs_as_written(tmp_path, monkeypatch):
    """The example as printed, with a stand-in backend for the default model."""
    (tmp_path / "book.txt").write_text("The vault is in the old tower. " * 3)
    stand_in = ScriptedBackend(["The vault is in the tower.", "It is \\boxed{the tower}."])
    monkeypatch.setattr(engine, "open_backend", lambda options, note, progress: stand_in)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(page_example(), "docs/python-api.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "the tower"
    assert lines[1] == "1 The vault is in the tower."
    # The first step's update brought "tower" into the memory (steps count from 1 there).
    assert lines[2:] == ["step 1 brought in tower"]
    assert stand_in.messages[0][1] == 256  # memory_tokens reached the loop
    assert not (tmp_path / "data").exists()  # no trace unless one is asked for


def test_ask_many_reads_together_and_each_answers_as_alone(tmp_path):
    document = tmp_path / "notes.txt"
    document.write_text("alpha beta gamma delta " * 4)
    replies = ["m1", "m2", "\\boxed{one}", "\\boxed{two}"]
    model = api.Model(ScriptedBackend(replies))
    events: list[object] = []
    first, second = api.ask_many(model, document, ["q1?", "q2?"], progress=events.append)
    assert (first.answer, second.answer) == ("one", "two")
    assert (first.memories, second.memories) == (["m1"], ["m2"])
    assert model.backend.rounds[0] == [0, 1]  # one round, a sequence each
    kinds = {type(event) for event in events}
    assert {StepStarted, StepFinished, Finished} <= kinds
    records = first.records()
    assert [r["type"] for r in records] == ["header", "step", "final"]
    assert records[0]["question"] == "q1?" and records[-1]["answer"] == "one"


def test_a_trace_is_written_only_where_asked(tmp_path):
    model = api.Model(ScriptedBackend(["memory", "\\boxed{x}"]))
    book = api.load_document(_write(tmp_path / "a.txt", "some text to read"))
    result = api.ask(model, book, "q?", trace_path=tmp_path / "run.jsonl")
    assert result.trace_path == tmp_path / "run.jsonl"
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [line["type"] for line in lines] == [r["type"] for r in result.records()]


def test_a_reading_that_stops_raises_with_its_steps_kept(tmp_path):
    model = api.Model(ScriptedBackend([]))  # no reply: the stand-in raises Ctrl-C
    with pytest.raises(api.Stopped) as stopped:
        api.ask(model, _write(tmp_path / "a.txt", "text"), "q?")
    assert stopped.value.exit_code == 130


def test_a_batch_is_what_the_command_reads_and_continues_after_a_stop(tmp_path, monkeypatch):
    """ask_batch: every question about every document, in order, a trace each in the data
    folder; stopped, the same call continues each run from its trace (the journal)."""
    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path / "home"))
    books = [_write(tmp_path / f"b{i}.txt", f"book {i} " * 3) for i in (1, 2)]  # a chunk each
    boxed = "\\boxed{a}"

    def model(replies: list[str]) -> api.Model:
        backend = ScriptedBackend(replies)
        backend.fits = 1  # one run at a time
        return api.Model(backend)

    # Run 1 answers; run 2 makes its step, then Ctrl-C (the replies run out).
    stopped = api.ask_batch(books, ["q1?", "q2?"], lambda: model(["m", boxed, "m"]))
    first, second = list(stopped)
    assert stopped.exit_code == 130
    assert isinstance(first, api.Result) and first.answer == "a"
    assert isinstance(second, api.Stopped) and second.done == 1
    # Again: run 1 from its finished trace, run 2 after its step, runs 3 and 4 read.
    again = api.ask_batch(books, ["q1?", "q2?"], lambda: model([boxed, "m", boxed, "m", boxed]))
    results = list(again)
    assert again.exit_code == 0
    assert [r.answer for r in results] == ["a"] * 4
    assert [r.cached for r in results] == [True, False, False, False]
    assert results[1].trace_path == second.trace_path
    assert all(r.trace_path and r.trace_path.is_file() for r in results)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_the_library_answers_as_the_command_does(memagent, tmp_path):
    """The real default model, greedy: the library's answer and memories are the command's."""
    book = tmp_path / "village.txt"
    book.write_text(story(60))  # about 680 tokens: 2 chunks
    args = ["--chunk-tokens", "400", "--memory-tokens", "64", "--temperature", "0"]
    cli = memagent("ask", str(book), FACT_QUESTION, *args, "--json", "--no-trace", "--no-reuse")
    assert cli.returncode == 0, cli.stderr
    expected = json.loads(cli.stdout)
    model = api.open_model(memory_tokens=64, chunk_tokens=400, sampling=Sampling(0.0))
    result = api.ask(model, book, FACT_QUESTION)
    assert result.to_json()["reply"] == expected["reply"]
    assert result.memories == [step["memory"] for step in expected["steps"]]


def test_an_evaluation_from_python_scores_as_the_command_does(
    cli, fake_server, tmp_path, monkeypatch
):
    """eval_files and eval_niah take the command's options as keywords: the same cases give
    the same records (the stand-in boxes the first word of the memory), and a niah run
    without a seed is seeded 0, as `memagent eval niah` is."""
    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path / "home"))
    data = tmp_path / "eval_50.json"
    cases = [
        {"_id": f"c{i}", "input": "Which word opens it?", "context": f"{word} opens it. " * 9,
         "answers": [word]}
        for i, word in enumerate(["Paris", "Rome"])
    ]  # fmt: skip
    data.write_text(json.dumps(cases))
    steps = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
    server = api.ServerOptions(base_url=fake_server.url)
    settings = api.Settings(300, 64, Sampling(temperature=0))

    def scored(path: Path) -> list[tuple]:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return [(r["id"], r["question"], r["gold"], r["prediction"], r["sub_em"]) for r in lines]

    ours = api.eval_files([data], server=server, settings=settings, output=tmp_path / "a.jsonl")
    assert [r["sub_em"] for r in ours.records] == [1.0, 1.0]
    command = ["--backend", "openai", "--base-url", fake_server.url, *steps]
    theirs = cli("eval", str(data), *command, "-o", str(tmp_path / "b.jsonl"))
    assert theirs.returncode == 0, theirs.stderr
    assert scored(tmp_path / "a.jsonl") == scored(tmp_path / "b.jsonl")

    haystack = tmp_path / "haystack.txt"
    haystack.write_text(story(200, fact=None))
    niah = {"lengths": "1K", "depths": "0,100", "output": tmp_path / "n.jsonl"}
    ours = api.eval_niah(haystack, server=server, settings=settings, **niah)
    theirs = cli(
        "eval", "niah", "--haystack", str(haystack), "--lengths", "1K", "--depths", "0,100",
        *command, "--seed", "0", "-o", str(tmp_path / "m.jsonl"),
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr
    assert len(ours.records) == 2
    assert scored(tmp_path / "n.jsonl") == scored(tmp_path / "m.jsonl")
