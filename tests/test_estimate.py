"""`memagent inspect`'s time estimate: the speed lines, the calls a reading makes and their
price, with a made-up measurement; then the command with the tiny model, measured for real."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from support.scripted import ScriptedBackend
from support.story import FACT_QUESTION, story

from memagent_cli import protocol
from memagent_cli.backends.speed import Speed, _line
from memagent_cli.chunking import make_chunks
from memagent_cli.reader import Settings
from memagent_cli.readers import infmem
from memagent_cli.run.inspect import (
    CallSize,
    Templates,
    call_seconds,
    estimate_reading,
    reading_calls,
)

# About the default model's lines on the AMX Xeon (reading-predict.log): 337 tok/s prefill
# at depth 512 down to 96 at 7168, decode 76 down to 30.
XEON = Speed(2.4e-3, 1.12e-6, 10.0e-3, 3.3e-6)


def test_a_speed_prices_every_token_at_its_own_depth():
    prefill = sum(XEON.prefill_base + XEON.prefill_slope * (d + 0.5) for d in range(6000))
    assert XEON.prefill_seconds(6000) == pytest.approx(prefill)
    decode = sum(XEON.decode_base + XEON.decode_slope * d for d in range(6000, 7024))
    assert XEON.decode_seconds(1024, 6000) == pytest.approx(decode)
    # A step's prompt reads at well under the rate of a few hundred tokens: what a
    # short warm-up measured, and why the old estimate was 3-4x optimistic on this machine.
    assert 6000 / XEON.prefill_seconds(6000) < 0.6 * XEON.prefill_rate(256)
    assert XEON.decode_rate(7000) < 0.5 * XEON.decode_rate(256)


def test_the_lines_go_through_the_faster_points_and_stay_physical():
    line = [(d, 0.002 + 1e-6 * d) for d in (256, 768, 1280, 1792, 2304, 2816)]
    assert _line(line) == (pytest.approx(0.002), pytest.approx(1e-6))
    # Another process stalled two batches (on a shared machine): the line holds.
    stalled = [(d, y * (5 if d in (768, 2304) else 1)) for d, y in line]
    assert _line(stalled) == (pytest.approx(0.002), pytest.approx(1e-6))
    # Noise can make a deeper point faster: then the line is flat.
    assert _line([(512, 0.4), (1024, 0.35)]) == (pytest.approx(0.375), 0.0)
    assert _line([(512, 0.4)]) == (0.4, 0.0)
    # Measured short of half a step's depth, the lines are flat: the faster half's median.
    assert _line([(256, 0.07), (768, 0.083)], flat=True) == (0.07, 0.0)
    # Never below half the shallow cost at depth 0, where noise would take it below zero
    # (seen: -0.3 s a decode on a loaded machine); the deep point is kept.
    base, slope = _line([(2304, 0.05), (4608, 0.4)])
    assert base == pytest.approx(0.025) and base + slope * 4608 == pytest.approx(0.4)


TEMPLATES = Templates(update=150, final=80, planner=900)


def test_memagent_calls_one_per_chunk_with_full_memories_then_the_answer():
    calls = reading_calls("memagent", [5000, 5000, 2100], TEMPLATES, 1024, first_memory=4)
    assert calls == [
        CallSize(150 + 4 + 5000, 1024),  # the first memory is "No previous memory"
        CallSize(150 + 1024 + 5000, 1024),
        CallSize(150 + 1024 + 2100, 1024),  # the last chunk is shorter
        CallSize(80 + 1024, protocol.FINAL_MAX_TOKENS),
    ]


def test_rememr1_shows_a_recalled_memory_beside_the_last():
    calls = reading_calls("rememr1", [5000, 5000], TEMPLATES, 1024, first_memory=4)
    assert [c.prompt for c in calls] == [5154, 150 + 2048 + 5000, 80 + 2048]


def test_infmem_plans_then_updates_with_units_thinking_first():
    calls = reading_calls("infmem", [5000, 300], TEMPLATES, 1024, first_memory=4)
    reply = infmem.THINKING_TOKENS + 1024
    units = infmem.RESULTS * infmem.UNIT_TOKENS
    assert calls == [
        CallSize(900 + 4, reply),
        CallSize(150 + 4 + units + 5000, reply),
        CallSize(900 + 1024, reply),
        CallSize(150 + 1024 + infmem.RESULTS * 300 + 300, reply),  # units within the chunk
        CallSize(80 + 1024, reply),
    ]


def test_a_call_is_its_prompt_from_an_empty_context_then_its_reply_after_it():
    call = CallSize(6000, 1024)
    # The first reply token comes with the prompt; the other 1023 are decoded after it.
    expected = XEON.prefill_seconds(6000) + XEON.decode_seconds(1023, 6001)
    assert call_seconds(call, XEON) == pytest.approx(expected)
    assert call_seconds(CallSize(100, 1), XEON) == pytest.approx(XEON.prefill_seconds(100))


def test_the_estimate_sums_every_call_at_the_measured_speed():
    """With a stand-in model and measurement: the calls of every chunk of the document,
    measured to the depth of the deepest prompt, and the sentences a user reads."""
    backend = ScriptedBackend([])  # one token per byte
    text = story(40)
    chunks = make_chunks(backend.tokenize(text), 500, backend.detokenize)
    asked = []

    def measure(model, tokens, depth):
        asked.append((model, depth))
        return Speed(1e-3, 1e-7, 2e-2, 1e-6, measured_to=depth, seconds=3.0)

    settings = Settings(chunk_tokens=500, memory_tokens=64)
    est = estimate_reading(backend, chunks, settings, measure=measure)  # type: ignore[arg-type]
    calls = [CallSize(*call) for call in est["calls"]]
    assert len(calls) == len(chunks) + 1
    assert backend.prepared == 0  # a measure of its own loads what it times
    assert [c.reply for c in calls] == [64] * len(chunks) + [protocol.FINAL_MAX_TOKENS]
    assert asked == [(backend, max(c.prompt for c in calls))] == [(backend, est["depth"])]
    speed = Speed(**est["speed"])
    assert est["seconds_at_most"] == pytest.approx(
        sum(call_seconds(c, speed) for c in calls), abs=0.05
    )
    assert est["measure_seconds"] == 3.0 and est["may_stop_sooner"] is None
    assert est["speed_measured"] == "now"
    assert "memories 75% of the 64 tokens allowed" in est["assumes"]
    assert "at most every reply as long as allowed" in est["assumes"]

    backend.complete = backend.generate  # infmem writes its prompts whole: they need this
    infmem_settings = Settings(chunk_tokens=500, memory_tokens=64, reader="infmem")
    est = estimate_reading(backend, chunks, infmem_settings, measure=measure)  # type: ignore[arg-type]
    assert len(est["calls"]) == 2 * len(chunks) + 1
    stops = "the infmem reader may stop sooner: its planner may say STOP 3 times in a row"
    assert est["may_stop_sooner"] == stops


def test_a_reading_of_more_than_an_hour_names_the_faster_routes():
    backend = ScriptedBackend([])
    chunks = make_chunks(backend.tokenize(story(40)), 500, backend.detokenize)
    settings = Settings(chunk_tokens=500, memory_tokens=64)

    def at(seconds_a_token: float):
        return lambda *_: Speed(seconds_a_token, 0.0, 20 * seconds_a_token, 0.0, 700)

    slow = estimate_reading(backend, chunks, settings, measure=at(1.0))  # type: ignore[arg-type]
    assert slow["seconds_per_question"] > 3600
    assert slow["faster"].startswith("more than an hour; faster: a smaller model")
    assert "a reader that stops once it has the answer" in slow["faster"]
    assert "llama.cpp built for a GPU" in slow["faster"]
    quick = estimate_reading(backend, chunks, settings, measure=at(1e-4))  # type: ignore[arg-type]
    assert quick["faster"] is None
    infmem_settings = Settings(chunk_tokens=500, memory_tokens=64, reader="infmem")
    backend.complete = backend.generate  # type: ignore[attr-defined]
    stops = estimate_reading(backend, chunks, infmem_settings, measure=at(1.0))  # type: ignore[arg-type]
    assert "a reader that stops" not in stops["faster"]  # it is one


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_inspect_estimates_a_reading_at_a_steps_depth(memagent, tmp_path):
    """End to end with the tiny model: the speed measured to the deepest prompt, every
    call priced at it, and the text says the same seconds."""
    path = tmp_path / "a.txt"
    path.write_text(story(400))
    sizes = ["--chunk-tokens", "2000", "--memory-tokens", "128"]
    result = memagent("inspect", str(path), *sizes)
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert "per question on this machine (" in shown and ", reading every chunk" in shown
    assert "before this model has read here" in shown and "learned from" not in shown
    assert "measuring the model's speed at the depth of a step" in result.stderr
    report = json.loads(memagent("inspect", str(path), *sizes, "--json").stdout)
    est = report["estimate"]
    calls = [CallSize(*call) for call in est["calls"]]
    chunks = [c["tokens"][1] - c["tokens"][0] for c in report["chunks"]]
    assert len(calls) == len(chunks) + 1 and len(chunks) == -(-report["tokens"] // 2000)
    assert [c.reply for c in calls] == [128] * len(chunks) + [protocol.FINAL_MAX_TOKENS]
    # The second step shows a full memory where the first shows "No previous memory".
    assert calls[1].prompt - calls[0].prompt > 100
    assert est["measured_depth"] == est["depth"] == max(c.prompt for c in calls)
    speed = Speed(**est["speed"])
    assert speed.prefill_base > 0 and speed.decode_base > 0
    assert est["seconds_at_most"] == pytest.approx(
        sum(call_seconds(c, speed) for c in calls), abs=0.05
    )
    assert est["seconds_at_least"] < est["seconds_per_question"] < est["seconds_at_most"]
    assert est["learned"] is None
    assert 0 < est["measure_seconds"] < 60
    assert est["may_stop_sooner"] is None and "may stop sooner" not in result.stdout


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_inspect_says_a_reader_that_stops_early_may_stop_sooner(memagent, tmp_path):
    path = tmp_path / "a.txt"
    path.write_text(story(100))
    sizes = ["--chunk-tokens", "300", "--memory-tokens", "64"]
    result = memagent("inspect", str(path), *sizes, "--reader", "infmem")
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert "reading every chunk; the infmem reader may stop sooner" in shown
    plain = memagent("inspect", str(path), *sizes, "--reader", "memagent")
    assert plain.returncode == 0, plain.stderr
    assert "may stop sooner" not in plain.stdout


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_inspect_learns_from_a_reading_with_the_same_model(memagent, tmp_path):
    """After one `ask`, the estimate for another document takes how long this model's
    replies ran, as its trace recorded them, and says so."""
    first, other = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(story(60))
    other.write_text(story(90, seed=2))
    sizes = ["--chunk-tokens", "300", "--memory-tokens", "64"]
    asked = memagent("ask", str(first), FACT_QUESTION, *sizes, "--json")
    assert asked.returncode == 0, asked.stderr
    reading = json.loads(asked.stdout)
    result = memagent("inspect", str(other), *sizes)
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert "learned from 1 reading with this model" in shown
    assert "at most" in shown and "if every memory is written in full" in shown
    report = json.loads(memagent("inspect", str(other), *sizes, "--json").stdout)
    est = report["estimate"]
    replies = [s["completion_tokens"] / 64 for s in reading["steps"]]
    answer = reading["final"]["completion_tokens"] / protocol.FINAL_MAX_TOKENS
    assert est["learned"]["readings"] == 1
    assert est["learned"]["memory_fraction"] == round(statistics.median(replies), 3)
    assert est["learned"]["answer_fraction"] == round(answer, 3)
    likely = [CallSize(*call) for call in est["likely_calls"]]
    assert len(likely) == len(est["calls"]) == len(report["chunks"]) + 1
    assert est["seconds_per_question"] <= est["seconds_at_most"]


@pytest.mark.model
@pytest.mark.usefixtures("on_tiny_model")
def test_a_second_inspect_prices_another_text_at_the_speed_kept(memagent, env, tmp_path):
    """The speed measured once is kept per model and machine in the data folder: a look at
    another text prices it at once, without loading the weights; --recalibrate measures
    again."""
    first, other = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(story(300))
    other.write_text(story(200, seed=2))
    sizes = ["--chunk-tokens", "1000", "--memory-tokens", "64"]
    measured = memagent("inspect", str(first), *sizes, "--json")
    assert measured.returncode == 0, measured.stderr
    assert "measuring the model's speed" in measured.stderr
    (kept,) = (Path(env["MEMAGENT_HOME"]) / "speeds").iterdir()
    assert kept.stat().st_mode & 0o777 == 0o600
    again = memagent("inspect", str(other), *sizes, "--json")
    assert again.returncode == 0, again.stderr
    assert "measuring" not in again.stderr
    before, after = (json.loads(r.stdout)["estimate"] for r in (measured, again))
    assert before["speed_measured"] == "now" and after["speed_measured"] != "now"
    assert after["speed"] == before["speed"]
    shown = memagent("inspect", str(other), *sizes)
    assert "and kept (--recalibrate measures again)" in " ".join(shown.stdout.split())
    remeasured = memagent("inspect", str(other), *sizes, "--json", "--recalibrate")
    assert remeasured.returncode == 0, remeasured.stderr
    assert "measuring the model's speed" in remeasured.stderr
    assert json.loads(remeasured.stdout)["estimate"]["speed_measured"] == "now"


@pytest.mark.model
def test_a_registry_model_not_pulled_is_estimated_from_its_shape_with_its_download(
    memagent, env, tmp_path
):
    """`inspect -m memagent-7b` before any pull: tokens counted with tiktoken, the
    download and conversion priced, a question's time from its layer shapes timed here in a
    stand-in (nothing downloaded), kept for the next look."""
    from memagent_cli.models import registry

    path = tmp_path / "a.txt"
    path.write_text(story(60))
    sizes = ["--chunk-tokens", "300", "--memory-tokens", "64"]
    result = memagent("inspect", str(path), "-m", "memagent-7b", *sizes)
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert "memagent-7b is not pulled yet (memagent models pull memagent-7b): 15.2 GB to" in shown
    assert "to convert and quantize to Q4_K_M" in shown and "a stated rate" in shown
    assert "per question on this machine" in shown and "an estimate" in shown
    assert "2-layer stand-in with random Q4_K_M weights, scaled to its 28 layers" in shown
    assert "approximate for memagent-7b's tokenizer" in shown
    assert "nothing is downloaded" in result.stderr
    again = memagent("inspect", str(path), "-m", "memagent-7b", *sizes, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    entry = registry.registry()["memagent-7b"]
    assert report["pull"]["download_bytes"] == entry["download"]
    assert report["pull"]["download_seconds"] > 0 and report["pull"]["conversion_seconds"] > 0
    est = report["estimate"]
    assert est["stand_in"] and est["speed_measured"] != "now"  # kept from the first look
    assert "stand-in" not in again.stderr
    assert est["seconds_at_least"] < est["seconds_per_question"] < est["seconds_at_most"]
    assert not list((Path(env["MEMAGENT_HOME"]) / "cache").rglob("*.gguf"))  # removed
    assert registry.find_file("memagent-7b") is None


@pytest.mark.model
def test_a_pulled_model_is_expected_at_its_stand_ins_speed_until_it_has_its_own(
    tiny_model, monkeypatch, tmp_path
):
    """`ask -m memagent-7b` after a pull finds the speed `inspect` timed its stand-in at
    before the pull (the engine's key, the registry's name for the file): it can say what a
    first reading will take."""
    from support.models import default_model_path

    from memagent_cli.backends import speeds_store
    from memagent_cli.backends.llama_cpp import LlamaCppBackend
    from memagent_cli.models import registry
    from memagent_cli.models.shaped import Shape
    from memagent_cli.run import unpulled

    monkeypatch.setenv("MEMAGENT_HOME", str(tmp_path))
    shape = Shape.of("memagent-7b", registry.registry()["memagent-7b"])
    assert shape is not None
    timed = LlamaCppBackend(default_model_path(), name="memagent-7b")  # as inspect times it
    speed = Speed(0.04, 5e-6, 0.4, 9e-6, measured_to=6000, seconds=20.0)
    speeds_store.store(unpulled.stand_in_key(timed, "memagent-7b", shape, "Q4_K_M"), speed, 6000)
    pulled = LlamaCppBackend(tiny_model, name="memagent-7b")  # stands for the pulled file
    found = unpulled.kept_stand_in(pulled)
    assert found is not None and found.speed == speed
    assert unpulled.kept_stand_in(LlamaCppBackend(tiny_model)) is None  # not a registry name
