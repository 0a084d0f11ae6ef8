"""The speeds `inspect` keeps per model and machine (backends/speeds_store.py): written
privately, read back for their key only, and passed over when a file is not one (no model:
test_estimate.py keeps and reuses one with the tiny model)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memagent_cli.backends import speeds_store
from memagent_cli.backends.speed import Speed

CALIBRATION_KEY = {"version": 1, "model": {"path": "/m.gguf", "size": 1, "mtime_ns": 2}}
KEY = speeds_store.key_for(CALIBRATION_KEY, batch=512, exact=False)
SPEED = Speed(2.4e-3, 1.1e-6, 1.0e-2, 3.3e-6, measured_to=4096, seconds=31.5)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path))
    return tmp_path


def test_a_speed_is_kept_privately_and_read_back_for_its_key_only(home: Path) -> None:
    path = speeds_store.store(KEY, SPEED, asked_to=6000)
    assert path is not None and path.parent == home / "speeds"
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    kept = speeds_store.load(KEY)
    assert kept is not None and kept.speed == SPEED and kept.asked_to == 6000
    assert kept.measured.endswith("Z")
    # Another batch size, exact decoding or model file is another key: measured anew.
    assert speeds_store.load(speeds_store.key_for(CALIBRATION_KEY, batch=256, exact=False)) is None
    assert speeds_store.load(speeds_store.key_for(CALIBRATION_KEY, batch=512, exact=True)) is None
    assert speeds_store.load(KEY | {"threads": 3}) is None


def test_a_kept_speed_serves_calls_as_deep_as_it_was_asked_to_measure() -> None:
    kept = speeds_store.Kept(KEY, SPEED, asked_to=6000)
    assert kept.serves(6000) and kept.serves(7000)  # the lines carry on a little
    assert not kept.serves(20_000)  # far deeper: measured again
    short = speeds_store.Kept(KEY, SPEED, asked_to=4096)
    assert not short.serves(8000)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a speed"),
        (json.dumps({"version": 99}).encode(), "not a speed"),
        (b" " * (speeds_store.MAX_FILE_BYTES + 10) + b"{}", "bytes"),
    ],
)
def test_a_file_that_is_not_a_kept_speed_is_measured_again(
    home: Path, content: bytes, why: str
) -> None:
    path = speeds_store.path_for(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    notes: list[str] = []
    assert speeds_store.load(KEY, note=notes.append) is None
    assert len(notes) == 1 and why in notes[0] and "measuring again" in notes[0]


def test_unsound_rates_are_refused(home: Path) -> None:
    good = speeds_store.Kept(KEY, SPEED, 6000).to_json()
    for field, value in (("prefill_base", -1.0), ("decode_base", 0.0), ("decode_slope", 1e308)):
        bad = json.loads(json.dumps(good))
        bad["speed"][field] = value
        with pytest.raises(speeds_store.Damaged):
            speeds_store.parse(json.dumps(bad).encode())
    for field, value in (("measured_to", -5), ("measured_to", True), ("measured_to", 1.5)):
        bad = json.loads(json.dumps(good))
        bad["speed"][field] = value
        with pytest.raises(speeds_store.Damaged):
            speeds_store.parse(json.dumps(bad).encode())
    # Another key written into the file of this one: not this model's speed.
    path = speeds_store.path_for(KEY)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(good | {"key": KEY | {"threads": 9}}))
    assert speeds_store.load(KEY) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_link_in_its_place_is_not_read(home: Path, tmp_path: Path) -> None:
    """Opened without following links and read only as a regular file: a FIFO cannot stall
    an estimate, a link cannot point it at another file."""
    path = speeds_store.path_for(KEY)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    notes: list[str] = []
    assert speeds_store.load(KEY, note=notes.append) is None
    assert "not a regular file" in notes[0]
    path.unlink()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(speeds_store.Kept(KEY, SPEED, 6000).to_json()))
    path.symlink_to(elsewhere)
    assert speeds_store.load(KEY, note=notes.append) is None


def test_a_data_folder_that_cannot_be_written_keeps_nothing(home: Path) -> None:
    (home / "speeds").write_text("a file where the folder goes")
    assert speeds_store.store(KEY, SPEED, 6000) is None
