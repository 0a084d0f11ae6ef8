"""The evaluation loop: records appended per finished case, resume, interruption, parallel
runs. Cases are answered by a plain function here; the real runs are in test_eval_model.py."""

from __future__ import annotations

import threading
import time

import pytest

from memagent_cli.errors import UserError
from memagent_cli.evaluation import results
from memagent_cli.evaluation.data import Case
from memagent_cli.evaluation.runner import Answered, check_resumable, evaluate
from memagent_cli.run import pool

INFO = {"model": "m", "settings": {"chunk_tokens": 10}}


def cases(n: int, group: str = "eval_50") -> list[Case]:
    return [
        Case(f"q{i}", group, f"Question {i}?", "Some text.", (f"answer {i}",), "qa")
        for i in range(n)
    ]


def in_threads(answer, parallel=1):
    """Each case answered by `answer(case, cancel)`, `parallel` at once in threads, as a
    server's cases are (run/pool.py)."""
    return lambda todo: pool.ordered(todo, answer, parallel)


def boxed(case: Case, cancel: threading.Event | None) -> Answered:
    """Right on even cases, a prose reply (no box) on odd ones."""
    number = int(case.id[1:])
    reply = f"So \\boxed{{{case.answers[0]}}}" if number % 2 == 0 else case.answers[0]
    return Answered(reply, tokens=100, seconds=0.5, prompt_tokens=120, generated_tokens=9,
                    trace=f"/t/{case.id}.jsonl")  # fmt: skip


def test_each_finished_case_is_a_scored_record(tmp_path):
    path = tmp_path / "run.jsonl"
    seen = []
    with results.Writer(path) as writer:
        outcome = evaluate(
            cases(3),
            in_threads(boxed),
            writer,
            finished=set(),
            run_info=INFO,
            on_record=seen.append,
        )
    assert (outcome.ran, outcome.skipped) == (3, 0)
    run = results.read(path)
    assert run.records == seen == outcome.records
    first, second = run.records[:2]
    assert first["prediction"] == "answer 0" and first["gold"] == "answer 0"
    assert (first["sub_em"], first["em"], first["f1"]) == (1.0, 1.0, 1.0)
    assert second["prediction"] is None and second["sub_em"] == 0.0  # prose: not boxed
    assert first["reply"] == "So \\boxed{answer 0}" and first["trace"] == "/t/q0.jsonl"
    assert first["model"] == "m" and first["settings"] == {"chunk_tokens": 10}


def test_an_interruption_keeps_finished_cases_and_a_second_run_skips_them(tmp_path):
    path = tmp_path / "run.jsonl"

    def stops_at_q2(case, cancel):
        if case.id == "q2":
            raise KeyboardInterrupt
        return boxed(case, cancel)

    with results.Writer(path) as writer, pytest.raises(KeyboardInterrupt):
        evaluate(cases(4), in_threads(stops_at_q2), writer, finished=set(), run_info=INFO)
    assert [r["id"] for r in results.read(path).records] == ["q0", "q1"]

    asked = []

    def counting(case, cancel):
        asked.append(case.id)
        return boxed(case, cancel)

    earlier = results.read(path)
    with results.Writer(path) as writer:
        outcome = evaluate(
            cases(4), in_threads(counting), writer, finished=earlier.finished, run_info=INFO
        )
    assert asked == ["q2", "q3"] and (outcome.ran, outcome.skipped) == (2, 2)
    assert [r["id"] for r in results.read(path).records] == ["q0", "q1", "q2", "q3"]


def test_parallel_runs_keep_what_finishes_when_one_fails(tmp_path):
    path = tmp_path / "run.jsonl"
    started = threading.Barrier(3)

    def slow(case, cancel):
        if case.id in ("q0", "q1", "q2"):
            started.wait(timeout=60)  # three in flight at once
        if case.id == "q1":
            raise UserError("The server went away.")
        while case.id == "q2" and not cancel.is_set():  # a long run, stopped by the failure
            time.sleep(0.01)
        if case.id == "q2":
            raise KeyboardInterrupt
        return boxed(case, cancel)

    with results.Writer(path) as writer, pytest.raises(UserError, match="went away"):
        evaluate(cases(8), in_threads(slow, 3), writer, finished=set(), run_info=INFO)
    ids = [r["id"] for r in results.read(path).records]
    assert "q0" in ids and "q1" not in ids and "q2" not in ids
    assert len(ids) < 8


def test_parallel_runs_answer_every_case(tmp_path):
    path = tmp_path / "run.jsonl"
    with results.Writer(path) as writer:
        outcome = evaluate(cases(7), in_threads(boxed, 3), writer, finished=set(), run_info=INFO)
    assert outcome.ran == 7
    assert sorted(r["id"] for r in results.read(path).records) == [f"q{i}" for i in range(7)]


def test_a_results_file_continues_only_with_the_same_model_and_settings(tmp_path):
    path = tmp_path / "run.jsonl"
    with results.Writer(path) as writer:
        evaluate(cases(1), in_threads(boxed), writer, finished=set(), run_info=INFO)
    earlier = results.read(path)
    check_resumable(earlier, INFO)
    with pytest.raises(UserError, match="another settings; give a new --output"):
        check_resumable(earlier, INFO | {"settings": {"chunk_tokens": 20}})
