"""`memagent eval` end to end through the deterministic stand-in model on 127.0.0.1
(tests/support/fake_openai.py): its final reply boxes the first word of the document, so scores are
known in advance. No GGUF is needed; the real model runs in test_eval_model.py."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.command import MEMAGENT, assert_clean_failure, words
from support.fake_openai import FakeServer, served
from support.jsonl import lines_of
from support.story import story

from memagent_cli.trace import read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]


def case(i: int, first_word: str, gold: str, sentences: int = 20) -> dict:
    return {
        "_id": f"c{i}",
        "input": "Which word opens the text?",
        "context": f"{first_word} opens this text. " + story(sentences, fact=None, seed=i),
        "answers": [gold],
    }


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    # Short documents (one chunk): both right. Long ones (4 chunks): one right, one wrong.
    short = [case(1, "Paris", "paris"), case(2, "Rome", "The Rome")]
    long = [case(3, "Oslo", "Oslo", 90), case(4, "Lima", "Quito", 90)]
    (folder / "eval_50.json").write_text(json.dumps(short))
    (folder / "eval_100.json").write_text("".join(json.dumps(c) + "\n" for c in long))
    return folder


def test_scores_table_json_and_records(cli, fake_server, data, tmp_path):
    out = tmp_path / "run.jsonl"
    result = cli("eval", str(data), *served(fake_server, *STEPS), "-o", str(out))
    assert result.returncode == 0, result.stderr
    table = [line.split() for line in result.stdout.splitlines() if "eval_" in line]
    assert [row[1] for row in table] == ["eval_50", "eval_100"]  # shortest first
    assert [row[7] for row in table] == ["100.00", "50.00"]  # sub_em, %
    assert [row[13] for row in table] == ["100%", "100%"]  # boxed: the stand-in always boxes
    assert f"results: {out}" in words(result.stderr)

    records = {r["id"]: r for r in lines_of(out)}
    assert records["c2"]["prediction"] == "Rome" and records["c2"]["em"] == 1.0  # articles
    assert records["c4"]["prediction"] == "Lima" and records["c4"]["sub_em"] == 0.0
    assert records["c3"]["tokens"] > 3 * 300 and records["c1"]["tokens"] < 300
    for record in records.values():
        trace = read_trace(Path(record["trace"]))
        assert trace.finished and trace.final.reply == record["reply"]
    assert fake_server.chat_calls == sum(-(-r["tokens"] // 300) + 1 for r in records.values())

    shown = cli("eval", "report", str(out), "--json")
    summary = json.loads(shown.stdout)["runs"][0]
    assert [(g["group"], g["cases"], g["sub_em"]) for g in summary["groups"]] == [
        ("eval_50", 2, 100.0),
        ("eval_100", 2, 50.0),
    ]
    assert summary["overall"]["sub_em"] == 75.0


def test_a_failing_server_keeps_finished_cases_and_the_same_command_continues(cli, data, tmp_path):
    out = tmp_path / "run.jsonl"
    with FakeServer(fail_after=3, fail_status=400) as failing:  # c1, c2 need two calls each
        stopped = cli("eval", str(data), *served(failing, *STEPS), "-o", str(out))
    assert_clean_failure(stopped, 1, "run the same command again to continue")
    assert [r["id"] for r in lines_of(out)] == ["c1"]

    with FakeServer() as server:
        again = cli("eval", str(data), *served(server, *STEPS), "-o", str(out), "--json")
        assert again.returncode == 0, again.stderr
        assert "continuing: 1 cases done" in again.stderr
        records = lines_of(out)
        # Only the three missing cases were run: one call per chunk, then the answer.
        assert server.chat_calls == sum(-(-r["tokens"] // 300) + 1 for r in records[1:])
    assert sorted(r["id"] for r in records) == ["c1", "c2", "c3", "c4"]
    assert json.loads(again.stdout)["cases"] == 4


def test_ctrl_c_with_parallel_runs_loses_at_most_the_cases_in_flight(data, env, tmp_path):
    out = tmp_path / "run.jsonl"
    # The first four calls finish c1 or c2 or both (one chunk each: two calls); the next ones
    # wait until Ctrl-C is sent, so the run cannot end first however busy the machine. Then
    # each call takes 0.2 s: c3 and c4 (four chunks each) need four more calls at least, time
    # for the stop to reach the runs in flight.
    with FakeServer(delay=0.2, hold_after=4) as server:
        process = subprocess.Popen(
            [str(MEMAGENT), "eval", str(data), *served(server, *STEPS), "-o", str(out)]
            + ["--parallel", "2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while server.held < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until both runs in flight wait on the server
        if server.held < 2:
            process.kill()
            pytest.fail(f"the runs never waited on the server: {process.communicate()}")
        process.send_signal(signal.SIGINT)
        server.release()
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stdout == ""
    kept = lines_of(out)
    assert 1 <= len(kept) < 4
    for record in kept:  # every kept case is whole and scored
        assert read_trace(Path(record["trace"])).finished


def test_report_compares_runs_in_one_plot(cli, fake_server, data, tmp_path):
    pytest.importorskip("matplotlib")
    runs = []
    for name, extra in (("a", []), ("b", ["--limit", "1"])):
        runs.append(tmp_path / f"{name}.jsonl")
        result = cli("eval", str(data), *served(fake_server, *STEPS), "-o", str(runs[-1]), *extra)
        assert result.returncode == 0, result.stderr
    png = tmp_path / "cmp.png"
    shown = cli("eval", "report", *map(str, runs), "--plot", str(png))
    assert shown.returncode == 0, shown.stderr
    assert str(runs[0]) in shown.stdout and str(runs[1]) in shown.stdout  # a table each
    from PIL import Image

    with Image.open(png) as image:
        assert image.format == "PNG"


def test_a_plot_is_written_where_it_is_said_to_be(cli, fake_server, data, tmp_path):
    """matplotlib adds .png to a name without an extension: the plot must be at the path
    given and said, and a path that cannot take it (/dev/full) is one sentence."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "a.jsonl"
    result = cli("eval", str(data), *served(fake_server, *STEPS), "-o", str(run), "--limit", "1")
    assert result.returncode == 0, result.stderr
    bare = tmp_path / "comparison"
    shown = cli("eval", "report", str(run), "--plot", str(bare))
    assert shown.returncode == 0, shown.stderr
    assert f"plot: {bare}" in words(shown.stderr)
    assert bare.read_bytes().startswith(b"\x89PNG") and not bare.with_suffix(".png").exists()

    full = cli("eval", "report", str(run), "--plot", "/dev/full")
    assert full.returncode == 1 and "Traceback" not in full.stderr
    assert "Cannot write the plot to /dev/full" in words(full.stderr)


def test_niah_builds_runs_and_draws_the_heatmap(cli, fake_server, tmp_path):
    pytest.importorskip("matplotlib")
    haystack = tmp_path / "hay.txt"
    haystack.write_text(story(200, fact=None))
    out, png = tmp_path / "niah.jsonl", tmp_path / "heat.png"
    result = cli(
        "eval", "niah", "--haystack", str(haystack), "--lengths", "1K", "--depths", "3",
        *served(fake_server, *STEPS), "-o", str(out), "--plot", str(png),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = lines_of(out)
    assert sorted(r["depth"] for r in records) == [0.0, 50.0, 100.0]
    assert all(r["tokens"] == 1024 and r["kind"] == "needle" for r in records)
    assert all(len(r["gold"]) == 1 and r["em"] is None for r in records)
    from PIL import Image

    with Image.open(png) as image:
        assert image.format == "PNG"


def test_bad_data_is_one_sentence_before_any_model_is_touched(cli, tmp_path):
    bad = tmp_path / "eval_50.json"
    bad.write_text(json.dumps([{"_id": 1, "input": "q", "context": "c"}]))
    missing_model = ["--model", str(tmp_path / "none.gguf")]
    assert_clean_failure(cli("eval", str(bad), *missing_model), 1, 'case 1 has no "answers" field')
    bad.write_text("[]")
    assert_clean_failure(cli("eval", str(bad), *missing_model), 1, "holds no cases")
    assert_clean_failure(cli("eval", "report", str(tmp_path / "none.jsonl")), 1, "not found")
    assert_clean_failure(  # a choice, so the usage error lists the variants
        cli("eval", "niah", "--haystack", str(bad), "--needles", "many"),
        2,
        "'many' is not one of 'single', 'multikey', 'multivalue', 'multiquery'",
    )
