"""`make test`'s runner: the model tests one at a time on their own CPUs, never beside
llama.cpp threads of another run (tests/split_run.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
import split_run


class Started:
    """The runs split_run starts, with the CPUs each asked for, instead of starting them."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, cpus: set[int], quota: int | None = None
    ) -> None:
        from memagent_cli import cpus as usable

        self.runs: list[tuple[list[str], set[int] | None]] = []
        pinned: list[set[int]] = []
        monkeypatch.setattr(usable, "quota", lambda: quota, raising=False)  # none unless given
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus, raising=False)
        monkeypatch.setattr(
            os, "sched_setaffinity", lambda pid, s: pinned.append(set(s)), raising=False
        )

        def record(command, preexec_fn=None, **_):
            if preexec_fn is not None:
                preexec_fn()
            self.runs.append((command, pinned.pop() if pinned else None))
            return 0

        class Process:
            def __init__(self, command, **kw):
                record(command, **kw)

            def wait(self):
                return 0

        monkeypatch.setattr(subprocess, "call", record)
        monkeypatch.setattr(subprocess, "Popen", Process)

    def selections(self) -> list[tuple[str, set[int] | None]]:
        return [(command[command.index("-m", 3) + 1], cpus) for command, cpus in self.runs]


def test_model_tests_get_half_the_cpus_and_the_rest_the_other_half(monkeypatch, tmp_path):
    monkeypatch.setattr(split_run, "ROOT", tmp_path)
    started = Started(monkeypatch, {0, 1, 2, 3})
    assert split_run.main([]) == 0
    assert started.selections() == [
        ("model and not real_model and not slower", {0, 1}),
        ("not model and not real_model", {2, 3}),
    ]


def test_with_one_cpu_the_two_run_one_after_the_other_unpinned(monkeypatch, tmp_path):
    monkeypatch.setattr(split_run, "ROOT", tmp_path)
    started = Started(monkeypatch, {0})
    assert split_run.main([]) == 0
    assert started.selections() == [
        ("not model and not real_model", None),
        ("model and not real_model and not slower", None),
    ]


def test_a_cpu_quota_below_the_affinity_is_what_is_split(monkeypatch, tmp_path):
    """Under `docker --cpus=2` on an 8-core host every CPU is in the affinity, but the two
    runs share 2 CPUs of time: each half gets one CPU, not four."""
    monkeypatch.setattr(split_run, "ROOT", tmp_path)
    started = Started(monkeypatch, set(range(8)), quota=2)
    assert split_run.main([]) == 0
    assert started.selections() == [
        ("model and not real_model and not slower", {0}),
        ("not model and not real_model", {1}),
    ]


def test_a_quota_of_one_cpu_runs_the_two_one_after_the_other(monkeypatch, tmp_path):
    monkeypatch.setattr(split_run, "ROOT", tmp_path)
    started = Started(monkeypatch, set(range(8)), quota=1)
    assert split_run.main([]) == 0
    assert [selection for selection, _ in started.selections()] == [
        "not model and not real_model",
        "model and not real_model and not slower",
    ]
