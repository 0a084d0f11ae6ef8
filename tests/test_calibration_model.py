"""The calibration as `ask` meets it on the tiny model: a FIFO or a hostile file in its
place is measured again, two readings started together on an empty data folder measure it
once, one measured while the machine was busy is measured again once the readings that
follow disagree, and a data folder that cannot keep it is said once
(backends/calibration.py, calibration_store.py, probe.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.command import MEMAGENT
from support.story import FACT_QUESTION, story

from memagent_cli.backend import Sampling

pytestmark = pytest.mark.model

STEPS = ["--chunk-tokens", "200", "--memory-tokens", "24", "--temperature", "0", "--json"]


@pytest.fixture
def book(tmp_path: Path) -> Path:
    path = tmp_path / "book.txt"
    path.write_text(story(12, seed=3))
    return path


def kept(env: dict[str, str]) -> Path:
    """The one calibration file of the data folder of `env`."""
    (found,) = (Path(env["MEMAGENT_HOME"]) / "calibrations").glob("*.json")
    return found


@pytest.mark.usefixtures("on_tiny_model")
def test_a_fifo_in_the_calibrations_place_is_measured_again_at_once(memagent, env, book):
    path = kept(env)
    path.unlink()
    os.mkfifo(path)  # opened to read, it would wait forever for a writer
    started = time.monotonic()
    result = memagent("ask", str(book), FACT_QUESTION, *STEPS, timeout=120)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60
    assert f"the calibration {path} cannot be used (it is not a regular file)" in result.stderr
    assert path.is_file()  # measured and kept in its place


@pytest.mark.usefixtures("on_tiny_model")
def test_a_hostile_calibration_is_measured_again(cli, env, book):
    """Every round size exact and every round free: well formed, and not what a round can
    cost; drafts priced by it would always look free."""
    path = kept(env)
    raw = json.loads(path.read_text())
    raw["costs"] = {rows: 1e-9 for rows in raw["costs"]}
    path.write_text(json.dumps(raw))
    result = cli("ask", str(book), FACT_QUESTION, *STEPS)
    assert result.returncode == 0, result.stderr
    assert f"the calibration {path} cannot be used" in result.stderr
    assert min(json.loads(path.read_text())["costs"].values()) >= 1.0  # measured again


def test_two_readings_started_together_on_an_empty_data_folder_measure_once(env, tiny_model, book):
    env["MEMAGENT_MODEL"] = str(tiny_model)
    runs = [
        subprocess.Popen(
            [str(MEMAGENT), "ask", str(book), question, *STEPS],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for question in (FACT_QUESTION, "Who keeps the light?")  # two batches, two journals
    ]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    used = [json.loads(out)["settings"]["calibration"] for out, _ in outputs]
    # Measured by the first; the second waited, then read the one kept (same record, to
    # the millisecond of its measuring time).
    assert used[0] == used[1]
    assert len(list((Path(env["MEMAGENT_HOME"]) / "calibrations").glob("*.json"))) == 1


@pytest.mark.usefixtures("on_tiny_model")
def test_a_calibration_measured_while_the_machine_was_busy_is_measured_again(
    env, monkeypatch, capsys
):
    """Measured while another process ran, every round priced as dear as its rows: the
    default never drafts but for probes, and the probes' rounds, timed on a quiet machine,
    cost far less. The reading says so once and keeps the calibration disputed; the next
    one measures it again, and drafting pays again."""
    from memagent_cli.backends import calibration, drafting
    from memagent_cli.backends.llama_cpp import LlamaCppBackend

    monkeypatch.setenv("MEMAGENT_HOME", env["MEMAGENT_HOME"])
    monkeypatch.setattr(calibration, "DISPUTE_AFTER", 2, raising=False)
    # The tiny model: rounds of under a millisecond, and drafts of one token (2-row rounds).
    monkeypatch.setattr(calibration, "DISPUTE_SECONDS", 0.0, raising=False)
    monkeypatch.setattr(calibration, "DISPUTE_ROWS", 1, raising=False)
    monkeypatch.setattr(drafting.DraftPolicy, "PROBE_MIN", 1)  # a probe every round or two
    monkeypatch.setattr(drafting.DraftPolicy, "PROBE_MAX", 2)
    path = kept(env)
    raw = json.loads(path.read_text())
    raw["costs"] = {rows: float(rows) for rows in raw["costs"]}  # a busy machine's: linear
    path.write_text(json.dumps(raw))

    backend = LlamaCppBackend(Path(env["MEMAGENT_MODEL"]))
    backend.prepare(512)
    prompt = " ".join(["the keeper counted nine boats in the harbour"] * 20)
    for _ in range(3):
        backend.decode(prompt, max_tokens=64, sampling=Sampling(temperature=0.0))
    notes = [line for line in capsys.readouterr().err.splitlines() if "calibration" in line]
    assert len(notes) == 1 and "measured again at the next reading" in notes[0], notes
    assert json.loads(path.read_text()).get("disputed")

    again = LlamaCppBackend(Path(env["MEMAGENT_MODEL"]))
    again.prepare(512)
    remeasured = json.loads(path.read_text())
    assert "disputed" not in remeasured and remeasured["remeasured"] == 1
    assert float(remeasured["costs"]["9"]) < 6  # measured quiet: rows cost less than decodes


@pytest.mark.usefixtures("on_tiny_model")
def test_a_busy_calibration_is_disputed_by_the_decodes_of_a_reading_that_never_drafts(
    env, monkeypatch, capsys
):
    """Measured while another process ran, its 1-row decodes took far longer than a quiet
    reading's, and its rounds cost as much as their rows, so the default does not draft and
    no round of drafts is there to dispute it (the default model's short readings drafted 14
    tokens in all, in probes of changing sizes): the reading's own decodes dispute it."""
    from memagent_cli.backends import calibration, drafting
    from memagent_cli.backends.llama_cpp import LlamaCppBackend

    monkeypatch.setenv("MEMAGENT_HOME", env["MEMAGENT_HOME"])
    # The tiny model decodes in under a millisecond; no probes at all.
    monkeypatch.setattr(calibration, "DISPUTE_SECONDS", 0.0, raising=False)
    monkeypatch.setattr(drafting.DraftPolicy, "PROBE_MIN", 1 << 20)
    monkeypatch.setattr(drafting.DraftPolicy, "PROBE_MAX", 1 << 20)
    path = kept(env)
    raw = json.loads(path.read_text())
    assert 0 < raw["decode_seconds"] < 1
    raw["costs"] = {rows: float(rows) for rows in raw["costs"]}  # a busy machine's: linear
    raw["decode_seconds"] *= 10  # and its decodes slowed down
    path.write_text(json.dumps(raw))

    backend = LlamaCppBackend(Path(env["MEMAGENT_MODEL"]))
    backend.prepare(512)
    prompt = " ".join(["the keeper counted nine boats in the harbour"] * 20)
    backend.decode(prompt, max_tokens=64, sampling=Sampling(temperature=0.0))
    assert backend.decode(prompt, max_tokens=64, sampling=Sampling()).drafted == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "calibration" in line]
    assert len(notes) == 1 and "a decode" in notes[0], notes
    assert json.loads(path.read_text()).get("disputed")

    again = LlamaCppBackend(Path(env["MEMAGENT_MODEL"]))
    again.prepare(512)
    remeasured = json.loads(path.read_text())
    assert "disputed" not in remeasured and remeasured["remeasured"] == 1
    assert remeasured["decode_seconds"] < raw["decode_seconds"] / 3


def test_a_data_folder_that_cannot_keep_the_calibration_is_said_once(cli, env, tiny_model, book):
    env["MEMAGENT_MODEL"] = str(tiny_model)
    home = Path(env["MEMAGENT_HOME"])
    home.mkdir(parents=True)
    (home / "calibrations").write_text("a file where the folder should be")
    result = cli("ask", str(book), FACT_QUESTION, "--parallel", "1", *STEPS)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "calibration" in line]
    assert len(said) == 1, said
    assert "could not keep this model's calibration" in said[0]
    assert "each reading measures it again" in said[0]


@pytest.mark.usefixtures("on_tiny_model")
def test_a_measurement_cleans_what_killed_writes_left(cli, env, book):
    folder = kept(env).parent
    stale, fresh = folder / ".calibration-1-2.json", folder / ".calibration-3-4.json"
    for path in (stale, fresh):
        path.write_text("{")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    result = cli("ask", str(book), FACT_QUESTION, *STEPS, "--recalibrate")
    assert result.returncode == 0, result.stderr
    assert not stale.exists() and fresh.exists()  # one a moment old may be in flight


@pytest.mark.usefixtures("on_tiny_model")
def test_models_info_finds_a_models_calibration_among_many(cli, env):
    """A data folder of hundreds of calibrations (models tried and gone): `models info`
    reads every one of this model's, however many others there are."""
    path = kept(env)
    other = json.loads(path.read_text())
    other["key"]["model"] = {"path": "/gone.gguf", "size": 1, "mtime_ns": 1}
    for i in range(300):
        (path.parent / f"000-{i:04}.json").write_text(json.dumps(other))
    shown = cli("models", "info", env["MEMAGENT_MODEL"])
    assert shown.returncode == 0, shown.stderr
    assert "calibration: none" not in shown.stdout
    assert any(line.startswith("calibration (-t") for line in shown.stdout.splitlines())
