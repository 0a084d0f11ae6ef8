"""`memagent eval` stopped as a shell stops it: SIGTERM exits 143, as for `ask`, and keeps
every finished case in the results file and every finished step in the traces, so the same
command continues. Runs through the stand-in server (tests/support/fake_openai.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from support.command import MEMAGENT, words
from support.fake_openai import FakeServer, served
from support.jsonl import lines_of
from support.story import story

from memagent_cli.trace import read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]


def mid_case(path: Path) -> bool:
    """Whether `path` is the trace of a case with a step done and its answer not yet."""
    text = path.read_text()
    return '"type": "step"' in text and '"type": "final"' not in text


def test_sigterm_exits_143_keeping_results_and_traces(env, memagent, tmp_path):
    data = tmp_path / "eval_100.json"
    # c0 is one chunk (two calls), the others several: the server answers c0 and c1's first
    # step, then holds the run there, mid-case, until SIGTERM has landed.
    cases = [
        {"_id": f"c{i}", "input": "Which word opens the text?", "answers": [word],
         "context": f"{word} opens this text. " + story(60 if i else 20, fact=None, seed=i)}
        for i, word in enumerate(["Paris", "Rome", "Oslo", "Lima"])
    ]  # fmt: skip
    data.write_text(json.dumps(cases))
    out = tmp_path / "run.jsonl"
    traces = Path(env["XDG_DATA_HOME"]) / "memagent" / "traces"
    with FakeServer(delay=0.2, hold_after=3) as server:
        process = subprocess.Popen(
            [str(MEMAGENT), "eval", str(data), *served(server, *STEPS), "-o", str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        # A case finished, and the next one has a step in its trace: mid-case.
        while time.monotonic() < deadline and process.poll() is None:
            started = list(traces.glob("*.jsonl")) if traces.is_dir() else []
            if server.held and lines_of(out) and any(mid_case(path) for path in started):
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 143, stderr
        assert stdout == "" and "Traceback" not in stderr
        assert "Interrupted (SIGTERM)" in words(stderr)
        assert "run the same command again to continue" in words(stderr)
        kept = lines_of(out)
        assert 1 <= len(kept) < 4
        for record in kept:  # every kept case is whole, its trace finished
            assert read_trace(Path(record["trace"])).finished
        stopped = [t for t in map(read_trace, traces.glob("*.jsonl")) if not t.finished]
        assert [t.interruption.reason for t in stopped] == ["SIGTERM"]
        assert stopped[0].interruption.steps_done >= 1

        # The same command, on the same server, takes the stopped case up where it ended.
        server.release()
        server.delay, calls = 0.0, server.chat_calls
        again = memagent("eval", str(data), *served(server, *STEPS), "-o", str(out), "--json")
        assert again.returncode == 0, again.stderr
        assert f"continuing: {len(kept)} cases done" in again.stderr
        assert f"resuming {stopped[0].path}" in words(again.stderr)
        # Only what was left: each missing case's steps and answer, less the steps kept.
        new = lines_of(out)[len(kept) :]
        needed = sum(-(-r["tokens"] // 300) + 1 for r in new)
        assert server.chat_calls - calls == needed - stopped[0].interruption.steps_done
    assert sorted(r["id"] for r in lines_of(out)) == ["c0", "c1", "c2", "c3"]
