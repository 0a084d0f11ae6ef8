"""What stderr shows while reading, when it is not a terminal (logs, pipes, CI)."""

from __future__ import annotations

import logging

import pytest

from memagent_cli.backend import Generation
from memagent_cli.chunking import make_chunks
from memagent_cli.progress import Layout, ReadingId
from memagent_cli.reader import Answering, Step, StepFinished, StepStarted
from memagent_cli.views import progress as display


def test_quick_extraction_shows_nothing(capsys):
    with display.Terminal().progress("pages") as progress:
        for page in range(1, 101):
            progress("extracting book.pdf", page, 100)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_slow_extraction_shows_pages_on_stderr(capsys, monkeypatch):
    monkeypatch.setattr(display.Bar, "_DELAY", 0.0)
    with display.Terminal().progress("pages") as progress:
        for page in range(1, 2401):
            progress("extracting manual.pdf", page, 2400)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "extracting manual.pdf: 2,400/2,400 pages" in captured.err
    assert captured.err.count("extracting") == 1  # throttled: one line, at the end


def test_slow_transfers_show_bytes_on_stderr(capsys, monkeypatch):
    monkeypatch.setattr(display.Bar, "_DELAY", 0.0)
    with display.Terminal().progress("bytes") as progress:
        progress("model.gguf", 1_500_000, 3_000_000)
        progress("model.gguf", 3_000_000, 3_000_000)
    assert "model.gguf: 3.0 MB of 3.0 MB" in capsys.readouterr().err


def test_plain_lines_of_long_work_say_how_much_is_left(capsys, monkeypatch):
    """A quantization seen through a log: a line every 10 s with the share done and the
    time left at the rate so far, and a last line without a guess."""
    clock = [100.0]
    monkeypatch.setattr(display.Bar, "_DELAY", 0.0)
    monkeypatch.setattr(display.time, "monotonic", lambda: clock[0])
    with display.Terminal().progress("bytes") as progress:
        for done in range(0, 30_000_000_001, 1_000_000_000):  # 1 GB every 4 s
            progress("quantizing to Q4_K_M", done, 30_000_000_000)
            clock[0] += 4.0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "quantizing to Q4_K_M: 3.0 GB of 30.0 GB, 10%, about 1m48s left"
    assert lines[-2] == "quantizing to Q4_K_M: 27.0 GB of 30.0 GB, 90%, about 12s left"
    assert lines[-1] == "quantizing to Q4_K_M: 30.0 GB of 30.0 GB"
    assert len(lines) == 10  # throttled to one line per 10 s or more (12 s here)


def test_quiet_shows_nothing(capsys, monkeypatch):
    monkeypatch.setattr(display.Bar, "_DELAY", 0.0)
    with display.reporter(quiet=True).progress("pages") as progress:
        progress("extracting book.pdf", 100, 100)
    display.reporter(quiet=True).note("a note")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_plain_progress_lines_name_the_step_pages_and_run(capsys):
    chunks = make_chunks(list(b"x" * 30), 10, bytes)
    view = display.PlainProgress(lambda start, end: f"p. {start // 10 + 1}", label="q2")
    gen = Generation("memory", 120, 42, 0.5, 1.5, "stop")
    view(StepFinished(Step(chunks[1], "memory", gen), 3))
    view(Answering("memory"))
    captured = capsys.readouterr()
    assert captured.out == ""
    line, answering = captured.err.splitlines()
    assert line.startswith("[q2] step 2/3  tokens 10-20  p. 2  memory 42 tokens  1.5s")
    assert "prompt 240 tok/s" in line  # 120 prompt tokens in 0.5 s
    assert answering == "[q2] answering from the final memory"


def test_the_live_view_has_a_row_per_question_and_the_watched_memory(monkeypatch):
    import io

    from rich.console import Console

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=150, highlight=False)
    monkeypatch.setattr(display, "console", terminal)
    chunks = make_chunks(list(b"x" * 30), 10, bytes)
    view = display.Terminal().reading(Layout(questions=3, at_once=3, watch=1))
    readings = [
        ReadingId("/b/book.txt", "m", f"q {i}", (0, i), 30, lambda a, b: "") for i in range(3)
    ]
    gen = Generation("", 120, 42, 0.5, 1.5, "stop")
    with view:
        shows = [view.started(reading) for reading in readings]
        assert view.showing  # results wait while the live view draws
        for show, memory in zip(
            shows, ["first [b]kept[/b]", "second kept", "third kept"], strict=True
        ):
            show(StepFinished(Step(chunks[0], memory, gen), 3))
        shows[2](Answering("third kept"))
        for reading in readings:
            view.ended(reading)
        assert not view.showing
    shown = screen.getvalue()
    assert "book.txt · m · 3 questions" in shown
    assert all(f"q{i}" in shown for i in (1, 2, 3)) and "q3 answering" in shown
    assert "second kept" in shown and "memory after step 1 (q2)" in shown
    assert "first" not in shown and "third kept" not in shown  # only q2's memory is shown


class Clock:
    """time.monotonic for a Bar, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_say_the_time_left_at_the_pace_so_far(capsys, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(display.time, "monotonic", clock)
    with display.Terminal().progress("cases") as progress:
        progress("evaluating", 4, 20)  # 4 done in an earlier run: not this run's pace
        for done in range(5, 21):
            clock.now += 30  # a case every 30 s
            progress("evaluating", done, 20)
    lines = capsys.readouterr().err.splitlines()
    # A line at most every 10 s: here one per case, each with the time the rest will take.
    assert lines[0] == "evaluating: 5/20 cases, 25%, about 7m30s left"  # 15 cases x 30 s
    assert lines[9] == "evaluating: 14/20 cases, 70%, about 3m00s left"
    assert lines[-1] == "evaluating: 20/20 cases"  # done: no time left to tell


def test_a_model_loading_shows_percent(capsys, monkeypatch):
    monkeypatch.setattr(display.Bar, "_DELAY", 0.0)
    with display.Terminal().progress("%") as progress:
        for percent in (0, 50, 100):
            progress("loading model.gguf", percent, 100)
    assert capsys.readouterr().err.splitlines()[-1] == "loading model.gguf: 100%"


def test_plain_step_lines_say_the_time_left_from_the_steps_so_far(capsys):
    """A reading seen through a log: each step's line ends with the time left at the speeds
    and memory its steps measured, falling to the answer's call."""
    from memagent_cli.run.time_left import TimeLeft

    chunks = make_chunks(list(range(5000 * 4)), 5000, lambda tokens: b"x" * len(tokens))
    view = display.PlainProgress(lambda start, end: "", left=TimeLeft(5000 * 4))
    for chunk in chunks:  # 5,650-token prompts at 150 a second, 500-token memories at 25
        gen = Generation("m", 5650, 500, 5650 / 150, 5650 / 150 + 20, "stop")
        view(StepFinished(Step(chunk, "m", gen), 4))
    lines = capsys.readouterr().err.splitlines()
    lefts = [line.rpartition("about ")[2] for line in lines]
    assert lefts == ["3m17s left", "2m20s left", "1m22s left", "24s left"]  # then the answer


def test_the_live_view_counts_down_the_time_left(monkeypatch):
    import io

    from rich.console import Console

    from memagent_cli.progress import Expected

    chunks = make_chunks(list(b"x" * 30), 10, bytes)
    expected = Expected(seconds=4000.0, answer=10.0)
    reading = ReadingId("/b/book.txt", "m", "q", (0, 0), 30, lambda a, b: "", expected=expected)

    def shown(*events: object) -> str:
        screen = io.StringIO()
        terminal = Console(file=screen, force_terminal=True, width=200, highlight=False)
        monkeypatch.setattr(display, "console", terminal)
        view = display.Terminal().reading(Layout())
        with view:
            show = view.started(reading)
            for event in events:
                show(event)  # type: ignore[arg-type]
            view.ended(reading)
        return screen.getvalue()

    assert "about 1h06m left" in shown(StepStarted(chunks[0], 3))  # before any step: expected
    gen = Generation("", 20, 10, 1.0, 2.0, "stop")
    stepped = shown(StepStarted(chunks[0], 3), StepFinished(Step(chunks[0], "m", gen), 3))
    # Two steps at the first one's pace (2 s each), then the answer as expected (10 s).
    assert "about 14s left" in stepped


def test_the_engine_s_notes_are_the_library_s_and_read_as_they_always_did(
    capsys, monkeypatch, caplog
):
    """The engine notes (its calibration, drafts it cannot use) to the library's logger and
    prints nothing itself; the command's view shows each as `memagent: ` and the sentence."""
    from memagent_cli import files
    from memagent_cli.views import console

    monkeypatch.setattr(files.NOTES, "handlers", [])  # a library user's: the command's view off
    with caplog.at_level(logging.INFO, logger="memagent"):
        files.ENGINE_NOTES.info("could not measure this model's calibration")
    assert [r.getMessage() for r in caplog.records] == [
        "could not measure this model's calibration"
    ]
    assert capsys.readouterr().err == ""
    console.show_notes()
    files.ENGINE_NOTES.info("could not measure this model's calibration")
    files.NOTES.info("could not restrict the permissions")
    assert capsys.readouterr().err.splitlines() == [
        "memagent: could not measure this model's calibration",
        "memagent: note: could not restrict the permissions",
    ]


def pimem_and_memreread_readings():
    """A PI-Mem reading of two passes and a MemReread reading of one reread, each over 3
    chunks: 6 steps each, by a scripted model."""
    from support.scripted import ScriptedBackend

    from memagent_cli import readers
    from memagent_cli.reader import Settings, read

    chunks = make_chunks(list(b"The tower bell rang at noon. " * 4), 40, bytes)
    no = "<check>no</check>"
    pimem = ["<check>yes</check> a bell", no, no, "merged", no, no, no, "\\boxed{bell}"]
    memreread = ["m0", "m1", "m2", "<query>Who rang the bell?</query>", "r0", "r1", "r2"]
    memreread += ["\\boxed{x}", "integrated", "enough", "\\boxed{bell}"]

    class Completing(ScriptedBackend):
        def complete(self, raw, *, max_tokens, sampling):
            return self.generate("".join(p for p, _ in raw), max_tokens=max_tokens, sampling=None)

    for name, replies in (("pi-mem", pimem), ("memreread", memreread)):
        backend = Completing(replies)
        reader = readers.get(name).loop(backend, ())
        settings = Settings(40, 64, reader=name)
        yield lambda listener, r=reader, b=backend, s=settings: read(
            b, "Who rang?", chunks, s, listener, reader=r
        )


@pytest.mark.parametrize(
    "reading", list(pimem_and_memreread_readings()), ids=["pi-mem", "memreread"]
)
def test_a_reader_that_reads_again_counts_the_steps_of_what_it_began(capsys, reading):
    """A second pass or a reread adds its steps to the total when it begins: the lines say
    each step of the steps begun, and the chunk it reads again; never step 1/3 twice."""
    reading(display.PlainProgress(lambda start, end: ""))
    lines = [line.split("  tokens")[0] for line in capsys.readouterr().err.splitlines()]
    assert lines[:6] == [
        "step 1/3",
        "step 2/3",
        "step 3/3",
        "step 4/6 (chunk 1)",
        "step 5/6 (chunk 2)",
        "step 6/6 (chunk 3)",
    ]


@pytest.mark.parametrize(
    "reading", list(pimem_and_memreread_readings()), ids=["pi-mem", "memreread"]
)
def test_the_live_bar_of_a_reader_that_reads_again_never_counts_past_its_total(
    monkeypatch, reading
):
    import io

    from rich.console import Console

    terminal = Console(file=io.StringIO(), force_terminal=True, width=150)
    monkeypatch.setattr(display, "console", terminal)
    live = display.LiveView("book.txt", 116)
    show = live.row("", lambda start, end: "")
    seen = []

    def listener(event):
        show(event)
        task = live._progress.tasks[0]
        seen.append((task.completed, task.total))

    with live:
        reading(listener)
    assert all(done <= total for done, total in seen if total is not None)
    assert seen[-1] == (6, 6)


def test_the_live_row_of_a_pass_read_at_once_counts_its_chunks_answered(monkeypatch):
    """A PI-Mem pass read together (the scheduler): the row says "pass 2: 2 of 3 chunks
    answered" and its bar counts the steps whose replies are in, reply by reply."""
    import io

    from rich.console import Console
    from support.scripted import ScriptedBackend

    from memagent_cli import readers
    from memagent_cli.reader import Replied, Settings
    from memagent_cli.scheduler import Job, read_together

    terminal = Console(file=io.StringIO(), force_terminal=True, width=150)
    monkeypatch.setattr(display, "console", terminal)
    chunks = make_chunks(list(b"The tower bell rang at noon. " * 4), 40, bytes)
    no = "<check>no</check>"
    backend = ScriptedBackend(["<check>yes</check> a bell", no, no, "merged", no, no, no, "x"])
    live = display.LiveView("book.txt", 116)
    show = live.row("", lambda start, end: "")
    seen = []

    def listener(event):
        show(event)
        if isinstance(event, Replied):
            task = live._progress.tasks[0]
            seen.append((task.description, task.completed, task.total))

    reader = readers.get("pi-mem").loop(backend, ())
    with live:
        job = Job("Who rang?", chunks, listener, reader=reader)
        read_together(backend, [job], chunks, Settings(40, 64, reader="pi-mem"), slots=3)
    assert seen == [
        *[(f"pass 1: {k} of 3 chunks answered", k, 3) for k in range(4)],
        *[(f"pass 2: {k} of 3 chunks answered", 3 + k, 6) for k in range(4)],
    ]
