"""The calibration's file and what decoding takes from it: kept per model and engine,
measured again when damaged, hostile or from another version, and the round sizes and
prices the draft policy may use (no model: tests/test_calibration_model.py measures)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memagent_cli.backends import calibration, calibration_store, probe
from memagent_cli.backends.calibration import MOST, Calibration
from memagent_cli.backends.drafting import DraftPolicy

KEY = {"version": calibration.VERSION, "model": {"path": "/m.gguf", "size": 1, "mtime_ns": 2}}


def measured(widths=tuple(range(2, MOST + 1)), together=4, per_row=0.5) -> Calibration:
    costs = {w: 1.0 + per_row * (w - 1) for w in range(1, MOST + 1)}
    return Calibration(KEY, tuple(widths), together, costs, 2.5, "2026-11-27T12:00:00Z")


def hostile(cost) -> bytes:
    """A well-formed calibration whose costs are `cost(rows)`."""
    raw = measured().to_json() | {"costs": {str(w): cost(w) for w in range(1, MOST + 1)}}
    return json.dumps(raw).encode()


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_calibration_is_kept_and_read_back_for_its_key_only(home: Path) -> None:
    kept = measured(widths=(2, 3, 5))
    path = calibration_store.store(kept)
    assert path is not None and path.parent == home / "calibrations"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert calibration_store.load(KEY) == kept
    assert calibration_store.load(KEY | {"threads": 3}) is None  # another engine: not measured
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "it is not JSON"),
        (b"[1, 2]", "it is not a JSON object"),
        (json.dumps(measured().to_json() | {"version": 0}).encode(), "another version"),
        (json.dumps(measured().to_json() | {"widths": ["2"]}).encode(), "round sizes"),
        (json.dumps(measured().to_json() | {"widths": [99]}).encode(), "round sizes"),
        (json.dumps(measured().to_json() | {"together": True}).encode(), "sequences"),
        (json.dumps(measured().to_json() | {"costs": {"1": 1.0}}).encode(), "miss"),
        (json.dumps(measured().to_json() | {"costs": {"x": 1.0}}).encode(), "by round size"),
        (json.dumps(measured().to_json() | {"costs": {"1": "1"}}).encode(), "not numbers"),
        (json.dumps(measured().to_json() | {"key": {"other": 1}}).encode(), "another model"),
        (b" " * (calibration.MAX_FILE_BYTES + 10) + b"{}", "bytes"),
        (b"[" * 60_000, "not JSON"),
        (hostile(lambda rows: 1e-9), "not what a round can cost"),  # every draft free
        (hostile(lambda rows: 1.0 + 40 * (rows - 1)), "not what a round can cost"),
        (hostile(lambda rows: 2.0 if rows == 2 else 1.0), "not what a round can cost"),
        (hostile(lambda rows: 1.5), "not what a round can cost"),  # one row is one decode
    ],
    ids=[
        "damaged",
        "list",
        "version",
        "width-type",
        "width-size",
        "together-type",
        "costs-short",
        "costs-key",
        "costs-type",
        "key",
        "huge",
        "deep",
        "free-rounds",
        "dearer-than-its-rows",
        "cheaper-than-a-smaller-round",
        "one-row-not-one-decode",
    ],
)
def test_a_damaged_hostile_or_other_version_file_is_measured_again_with_a_note(
    content: bytes, why: str
) -> None:
    path = calibration_store.path_for(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    notes: list[str] = []
    assert calibration_store.load(KEY, note=notes.append) is None
    (line,) = notes
    assert why in line and str(path) in line and "measuring again" in line
    assert "\n" not in line


def test_a_costs_value_that_is_nan_or_huge_is_refused() -> None:
    for bad in ("NaN", "1e300", "-1"):
        text = json.dumps(measured().to_json()).replace('"2": 1.5', f'"2": {bad}')
        with pytest.raises(calibration.Damaged):
            calibration.parse(text.encode())


def test_a_folder_in_place_of_the_file_is_measured_again() -> None:
    calibration_store.path_for(KEY).mkdir(parents=True)
    notes: list[str] = []
    assert calibration_store.load(KEY, note=notes.append) is None
    assert len(notes) == 1


def test_models_info_finds_the_calibrations_of_a_file_as_it_is(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    info = model.stat()
    key = KEY | {
        "model": {"path": str(model), "size": info.st_size, "mtime_ns": info.st_mtime_ns},
        "machine": calibration_store.machine(),
        "threads": 2,
    }
    calibration_store.store(Calibration(key, (2, 3), 1, measured().costs))
    calibration_store.store(
        Calibration(key | {"machine": "another CPU"}, (2,), 1, measured().costs)
    )
    (found,) = calibration_store.kept_for(model)
    assert found.widths == (2, 3) and "-t 2" in calibration.settings(found)
    model.write_bytes(b"GGUF2")  # another file under the same name: measured again
    assert calibration_store.kept_for(model) == []


def test_the_summary_says_what_exact_may_use() -> None:
    line = measured(widths=(2, 3, 4, 7), together=1).summary()
    assert "exact rounds of 2-4, 7 rows" in line and "alone only" in line
    assert "no" not in measured(widths=()).summary().split(";")[0].replace("none", "")
    assert "exact rounds of none" in measured(widths=()).summary()


def test_sequences_are_cut_into_counts_proved_together() -> None:
    assert measured(together=4).groups(3) == [2, 1]
    assert measured(together=4).groups(9) == [4, 4, 1]
    assert measured(together=1).groups(3) == [1, 1, 1]
    assert calibration.assumed(KEY).groups(7) == [7]


def test_the_price_of_a_round_comes_from_the_measured_costs() -> None:
    cheap = measured(per_row=0.1)
    assert cheap.price(1) == 1.0 and cheap.price(5) == pytest.approx(1.4)
    assert cheap.price(5, min_rows=2) == pytest.approx(1.4 / 1.1)
    # Past the table: the marginal cost of its upper half.
    assert cheap.price(2 * MOST) == pytest.approx(1.0 + 0.1 * (2 * MOST - 1))


def test_the_draft_policy_uses_only_the_round_sizes_proved() -> None:
    policy = DraftPolicy(min_rows=2, widths=(2, 3, 5), fixed=8)
    assert policy.length(3, 16) == 4  # a round of 5 rows, the largest proved up to 9
    assert policy.length(3, 3) == 2  # 4 rows unproved: 3
    assert DraftPolicy(min_rows=2, widths=(), fixed=8).length(3, 16) == 0
    # Chosen by price, never an unproved size: drafts accepted nearly always, cheap rows.
    free = DraftPolicy(min_rows=2, widths=(2, 4))
    for _ in range(30):
        free.record_draft(3, 16, 16)
    for _ in range(20):
        free.record_batch(2, 0.01)
        for rows in range(3, MOST + 1):
            free.record_batch(rows, 0.0101)
    assert {free.length(3, 16) for _ in range(500)} == {3}


def test_the_default_prices_rows_from_the_calibration() -> None:
    """Drafts accepted about half the time: on a machine whose rows are cheap they pay, on
    one where a row costs most of a decode they do not; the same counts, the same lengths,
    whatever this run's timings."""
    lengths = {}
    for per_row in (0.05, 0.9):
        policy = DraftPolicy(prices=measured(per_row=per_row).price)
        for _ in range(30):
            policy.record_draft(3, 2, 1)
        lengths[per_row] = policy.length(3, 8)
    assert lengths[0.05] > 0 == lengths[0.9]


def test_exact_decoding_starts_from_the_calibrations_costs_until_it_measures_its_own() -> None:
    policy = DraftPolicy(min_rows=2, prices=measured(per_row=0.1).price)
    assert policy.cost(5) == pytest.approx(1.4 / 1.1)
    for _ in range(20):
        policy.record_batch(2, 0.01)
        policy.record_batch(5, 0.03)
    assert policy.cost(5) == pytest.approx(3.0)  # this run's own measurement wins


def test_models_info_shows_the_calibration_on_this_machine(cli, env, tiny_model: Path) -> None:
    shown = cli("models", "info", str(tiny_model))
    assert shown.returncode == 0, shown.stderr
    assert "calibration: none on this machine yet" in shown.stdout
    info = tiny_model.resolve().stat()
    model = {"path": str(tiny_model.resolve()), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    key = KEY | {"model": model, "machine": calibration_store.machine(), "threads": 2}
    key |= {"gpu_layers": 0, "flash_attn": "off", "cache_type_k": "f16", "cache_type_v": "f16"}
    kept = Calibration(key, (2, 3, 4, 9), 1, measured(per_row=0.25).costs, 1.5)
    home = env["MEMAGENT_HOME"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEMAGENT_HOME", home)
        calibration_store.store(kept)
    shown = cli("models", "info", str(tiny_model))
    line = next(x for x in shown.stdout.splitlines() if x.startswith("calibration"))
    assert "-t 2 -ngl 0 -fa off -ctk f16 -ctv f16" in line
    assert "exact rounds of 2-4, 9 rows; sequences alone only" in line
    assert "8 rows 2.75" in line
    as_json = json.loads(cli("models", "info", str(tiny_model), "--json").stdout)
    assert as_json["calibrations"] == [kept.to_json()]


def test_the_trace_records_the_calibration_as_one_plain_value() -> None:
    """A trace header's settings are plain values (trace/records.py refuses others)."""
    record = measured(widths=(2, 3, 9), together=2, per_row=0.5).record()
    assert record.startswith("exact 2-3, 9; together 2; costs 1:1.000,2:1.500,3:2.000,")
    assert record.endswith("17:9.000; measured 2026-11-27T12:00:00Z")


def test_one_slowed_round_does_not_make_the_costs() -> None:
    """A round another process slowed down is an outlier among its neighbours' timings,
    and no round costs more than that many single decodes."""
    timed = {w: 1.0 + 0.3 * (w - 1) for w in range(2, MOST + 1)}
    timed[5] = 40.0
    costs = probe.smoothed(timed)
    assert costs[5] == pytest.approx(2.5) and costs[1] == 1.0
    assert probe.smoothed({w: 100.0 for w in range(2, MOST + 1)})[3] == 3.0
    assert all(costs[w] <= costs[w + 1] for w in range(1, MOST))


def costs_of(cost) -> dict[int, float]:
    return {w: cost(w) for w in range(1, MOST + 1)}


def test_readings_go_together_only_where_a_batch_costs_less_than_its_rows_apart() -> None:
    """A round of several sequences holds each one's rows: its pending token and a draft,
    whose length is not known ahead. So several go at once only where a round of them costs
    clearly less than their rounds apart at every size a sequence's round may have."""
    flat = Calibration(KEY, (), 4, costs_of(lambda w: 1.0 + 0.02 * (w - 1)))  # a GPU
    assert flat.readings_at_once(6) == 6
    assert flat.readings_at_once(1) == 1
    linear = Calibration(KEY, (), 4, costs_of(float))  # every row a decode: never pays
    assert linear.readings_at_once(6) == 1
    # A 2-core CPU (bench/results/2026-11-26-xeon-amx/continuous.log): rows of the pending
    # token alone are cheap together, but a round of full drafts costs nearly its rows.
    cpu = Calibration(KEY, (), 4, costs_of(lambda w: 0.63 + 0.37 * w))
    assert cpu.readings_at_once(8) == 1
    assert cpu.readings_at_once(8, max_rows=1) == 8  # without drafts it pays
    # Near 1.0, noise in the timings does not make a batch.
    near = Calibration(KEY, (), 4, costs_of(lambda w: 0.05 + 0.95 * w))
    assert near.price(2 * MOST) / 2 < near.price(MOST)  # cheaper, by a hair
    assert near.readings_at_once(8) == 1


def test_with_exact_only_the_counts_proved_together_share_a_round() -> None:
    """With --exact, sequences not proved to share a round exactly are rounds apart
    (groups()): reading them together saves nothing."""
    cheap = costs_of(lambda w: 1.0 + 0.02 * (w - 1))
    assert Calibration(KEY, (2, 3), 1, cheap).readings_at_once(4, min_rows=2, exact=True) == 1
    assert Calibration(KEY, (2, 3), 4, cheap).readings_at_once(4, min_rows=2, exact=True) == 4
    # 3 proved as 2 and 1: no cheaper per sequence than 2.
    assert Calibration(KEY, (2, 3), 2, cheap).readings_at_once(3, min_rows=2, exact=True) == 2


def test_a_fifo_or_a_device_in_the_files_place_is_measured_again_without_waiting() -> None:
    path = calibration_store.path_for(KEY)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # opened to read, it would wait for a writer forever
    notes: list[str] = []
    assert calibration_store.load(KEY, note=notes.append) is None
    assert notes == [f"the calibration {path} cannot be used (it is not a regular file): "
                     "measuring again"]  # fmt: skip
    path.unlink()
    path.symlink_to("/dev/zero")  # never ends
    assert calibration_store.load(KEY, note=notes.append) is None
    assert "it is not a regular file" in notes[-1]


def test_a_file_that_cannot_be_kept_is_said_once(home: Path) -> None:
    home.mkdir(parents=True)
    (home / "calibrations").write_text("a file where the folder should be")
    notes: list[str] = []
    assert calibration_store.store(measured(), note=notes.append) is None
    assert calibration_store.store(measured(widths=(2,)), note=notes.append) is None
    assert len(notes) == 1 and "could not keep this model's calibration" in notes[0]
    assert calibration_store.load(KEY, note=notes.append) is None  # not measured: silent
    assert len(notes) == 1


def test_a_calibration_is_named_by_its_model_first() -> None:
    path = calibration_store.path_for(KEY)
    other = calibration_store.path_for(KEY | {"threads": 8})
    assert path != other and path.name[:13] == other.name[:13]  # the model's digest, then -
    assert (
        calibration_store.path_for(KEY | {"model": {"path": "/n.gguf"}}).name[:12]
        != (path.name[:12])
    )


def test_the_key_names_the_gpus_and_their_driver_not_the_cpu_twice(tmp_path: Path) -> None:
    """Two nodes with one CPU and other GPUs (a shared home) measure apart, as do two
    drivers of one GPU; a build without GPUs names none."""
    cpu = ("CPU", "AMD EPYC 9654", "CPU")
    h200, a100 = ("CUDA0", "NVIDIA H200", "GPU"), ("CUDA0", "NVIDIA A100-SXM4-80GB", "GPU")
    assert calibration_store.hardware([cpu], "") == {"devices": [], "driver": ""}
    on_h200 = calibration_store.hardware([cpu, h200], "nvidia 550.54.15")
    assert on_h200 == {"devices": ["GPU CUDA0: NVIDIA H200"], "driver": "nvidia 550.54.15"}
    keys = [
        KEY | on_h200,
        KEY | calibration_store.hardware([cpu, a100], "nvidia 550.54.15"),
        KEY | calibration_store.hardware([cpu, h200], "nvidia 560.35.03"),
    ]
    assert len({calibration_store.path_for(key) for key in keys}) == 3
    # The driver as the system says it; a FIFO or nothing there is no driver, at once.
    version = tmp_path / "version"
    version.write_text("550.54.15\n")
    assert calibration_store.gpu_driver([str(version)]) == f"{tmp_path.name} 550.54.15"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    found = calibration_store.gpu_driver([str(fifo), str(tmp_path / "none")])
    assert found == "" or sys.platform == "darwin"


def test_the_readings_that_follow_dispute_a_calibration_that_priced_rounds_too_dear() -> None:
    busy = measured(per_row=1.0)  # measured while another process ran: every row a decode
    quiet = {9: (3.2, calibration.DISPUTE_AFTER)}  # rounds of 9 rows timed in a reading
    why = busy.disputed_by(quiet, min_rows=1)
    assert why == (
        f"a round of 9 rows at 9.00 times a round of 1, and {calibration.DISPUTE_AFTER} "
        "such rounds of this reading cost 3.20"
    )
    assert busy.disputed_by({9: (3.2, calibration.DISPUTE_AFTER - 1)}, 1) == ""  # too few
    assert busy.disputed_by({9: (6.5, 50)}, 1) == ""  # near its price: noise, or depth
    assert busy.disputed_by({9: (12.0, 50)}, 1) == ""  # dearer: deeper, or busy now
    assert busy.disputed_by({2: (0.8, 50), 3: (1.2, 50)}, 1) == ""  # other kernels
    assert measured(per_row=0.3).disputed_by(quiet, 1) == ""  # priced right
    # With --exact, rounds are priced over a round of 2 rows.
    assert busy.disputed_by({9: (2.0, 9)}, min_rows=2).startswith("a round of 9 rows at 4.50")
    assert busy.disputed_by({4: (1.0, 9)}, min_rows=2) == ""  # two rows more: other kernels
    # Measured again often enough in a row: kept, whatever the readings say.
    again = dataclasses.replace(busy, remeasured=calibration.MOST_REMEASURED)
    assert again.disputed_by(quiet, 1) == ""
    assert calibration.unmeasured(KEY).disputed_by(quiet, 1) == ""  # nothing measured


def test_a_disputed_calibration_is_kept_as_such_and_read_back() -> None:
    busy = measured(per_row=1.0)
    assert calibration_store.dispute(busy, "rounds cost less")
    found = calibration_store.load(KEY)
    assert found is not None and found.disputed == "rounds cost less"
    assert "disputed by a reading: measured again at the next" in found.summary()
    assert dataclasses.replace(found, disputed="") == busy


MEASURING = """
import sys, time
from memagent_cli.backends import calibration, calibration_store
key = {"version": calibration.VERSION, "model": {"path": "/m.gguf", "size": 1, "mtime_ns": 2}}
costs = {w: 1.0 + 0.5 * (w - 1) for w in range(1, calibration.MOST + 1)}
with calibration_store.measuring(key):
    found = calibration_store.load(key)
    print("found" if found else "measuring", time.monotonic(), flush=True)
    if found is None:
        time.sleep(float(sys.argv[1]))
        calibration_store.store(calibration.Calibration(key, (2,), 1, costs, 1.0, sys.argv[2]))
"""


def test_two_processes_measuring_one_calibration_measure_once(home: Path) -> None:
    """The second waits while the first measures, then reads what it kept."""
    env = {**os.environ, "MEMAGENT_HOME": str(home)}
    first = subprocess.Popen(
        [sys.executable, "-c", MEASURING, "1.5", "first"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert first.stdout is not None
    began = float(first.stdout.readline().split()[1])  # holds the lock now
    second = subprocess.run(
        [sys.executable, "-c", MEASURING, "0", "second"], env=env, capture_output=True, text=True
    )
    assert first.wait(timeout=60) == 0 and second.returncode == 0, second.stderr
    said, when = second.stdout.split()
    assert said == "found" and float(when) - began >= 1.4
    key = {"version": calibration.VERSION, "model": {"path": "/m.gguf", "size": 1, "mtime_ns": 2}}
    found = calibration_store.load(key)
    assert found is not None and found.measured == "first"
