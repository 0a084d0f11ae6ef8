"""End to end: `memagent eval` with the real default model, greedy, on a small file set in the
authors' format; interrupted, continued, reported as a table, JSON, JSON Lines and a PNG."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.command import MEMAGENT
from support.jsonl import lines_of
from support.story import FACT_QUESTION, FACT_VALUE, story

from memagent_cli.trace import read_trace

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("on_tiny_model")]

TINY = ["--chunk-tokens", "400", "--memory-tokens", "48", "--temperature", "0"]


def authors_file(path: Path, sentences: int, seeds: tuple[int, int]) -> Path:
    """Two cases in the authors' shape: a planted fact opens each document."""
    items = [
        {
            "_id": f"{path.stem}-{seed}",
            "input": FACT_QUESTION,
            "context": story(sentences, seed=seed),
            "answers": [FACT_VALUE],
        }
        for seed in seeds
    ]
    path.write_text(json.dumps(items))
    return path


def test_eval_is_interrupted_continued_and_reported(tmp_path, env, memagent, cli):
    data = tmp_path / "cases"  # not "data": env's XDG_DATA_HOME is there
    data.mkdir()
    authors_file(data / "eval_short.json", 40, (1, 2))  # about 450 tokens: 2 steps
    authors_file(data / "eval_long.json", 80, (3, 4))  # about 900 tokens: 3 steps
    out = tmp_path / "run.jsonl"
    command = [str(MEMAGENT), "eval", str(data), *TINY, "--output", str(out)]

    # Ctrl-C once the first case is in the results file: finished cases stay.
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not lines_of(out) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    kept = lines_of(out)
    assert process.returncode == 130, stderr
    assert 1 <= len(kept) < 4
    assert "run the same command again to continue" in stderr
    assert "Traceback" not in stderr

    # The same command again runs only what is missing, then reports.
    png = tmp_path / "acc.png"
    again = memagent(*command[1:], "--plot", str(png))
    assert again.returncode == 0, again.stderr
    records = lines_of(out)
    assert records[: len(kept)] == kept
    assert sorted(r["id"] for r in records) == [
        "eval_long-3",
        "eval_long-4",
        "eval_short-1",
        "eval_short-2",
    ]
    assert again.stderr.count(" sub_em ") == 4 - len(kept)  # one line per case run now
    assert f"continuing: {len(kept)} cases done" in again.stderr

    # JSON Lines: one scored record per case, pointing at its finished trace.
    for record in records:
        assert record["group"] in ("eval_short", "eval_long")
        assert record["gold"] == FACT_VALUE and record["question"] == FACT_QUESTION
        assert record["sub_em"] in (0.0, 1.0) and 0.0 <= record["f1"] <= 1.0
        assert record["settings"]["temperature"] == 0.0
        trace = read_trace(Path(record["trace"]))
        assert trace.finished and trace.final.reply == record["reply"]
        assert trace.header.document["tokens"] == record["tokens"]

    # The table on stdout: a row per length group, shortest first.
    table = again.stdout
    assert table.index("eval_short") < table.index("eval_long")
    for column in ("sub_em", "em", "f1", "boxed", "s/case", "tok/s"):
        assert column in table

    # The same summary as JSON, from the results file.
    shown = cli("eval", "report", str(out), "--json")  # reads no model: in-process
    assert shown.returncode == 0, shown.stderr
    (run,) = json.loads(shown.stdout)["runs"]
    short, long = run["groups"]
    assert (short["group"], short["cases"], long["group"], long["cases"]) == (
        "eval_short",
        2,
        "eval_long",
        2,
    )
    assert short["tokens"] < long["tokens"]
    assert 0 <= run["overall"]["sub_em"] <= 100

    from PIL import Image

    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 400
