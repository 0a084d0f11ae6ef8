"""Provenance as `ask` and `trace` show it, and the HTML reports (`trace --html`, `ask
--html`, `eval report --html`), checked as text and, where chromium is installed, opened in
a real headless browser as a person would open them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.command import assert_clean_failure, words
from support.fake_openai import served
from support.scripted import ScriptedBackend
from support.story import story

from memagent_cli.chunking import make_chunks
from memagent_cli.documents import assemble
from memagent_cli.evaluation import results
from memagent_cli.reader import Settings, read
from memagent_cli.trace import Header, TraceWriter, read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
HOSTILE = "<script>document.title='pwned'</script> <a href=\"javascript:alert(1)\">click</a>"
QUESTION = "What is the password for the vault?"
PAGES = [
    ("i", "A preface about the village and its old stone tower by the sea."),
    ("1", "The vault sits in the tower. The keeper whispered the word PELICAN to me."),
    ("2", "At noon the guard sleeps. Nobody else knows the word, and the keeper left."),
    ("3", "Years later the tower fell into the sea, and the vault was never opened."),
]
MEMORIES = [
    "The vault is in the tower.",
    "The vault is in the tower.\nThe password is PELICAN.",
    f"The password is PELICAN.\nThe guard sleeps at noon. {HOSTILE}",
    "The password is PELICAN.\nThe keeper left the village.",
    "The password is PELICAN.\nThe tower fell.",
]
REPLY = "The password is \\boxed{PELICAN}."


def write_trace(
    path: Path,
    memories: list[str],
    question: str = QUESTION,
    reply: str = REPLY,
    parts: list[tuple[str, str]] = PAGES,
    unit: str = "page",
) -> Path:
    """A trace of the real loop over a four-page PDF's text (or an EPUB's, in `parts` named
    by chapter) with scripted memories: finished, or interrupted after as many steps as there
    are memories."""
    kind = "pdf" if unit == "page" else "epub"
    book = assemble(parts, path=f"/books/tower.{kind}", format=kind, sha256="ab" * 32, unit=unit)
    chunks = make_chunks(list(book.text.encode()), 60, bytes)
    header = Header(
        question=question,
        document={
            "path": book.path, "sha256": book.sha256, "format": kind, "unit": unit,
            "characters": len(book.text), "tokens": len(book.text.encode()), "chunks": len(chunks),
        },
        model={"path": "/models/tiny.gguf", "name": "tiny-model", "size": 2**28},
        settings={"chunk_tokens": 60, "memory_tokens": 64, "temperature": 0.0},
        templates_sha256={"update": "cd" * 32, "final": "ef" * 32},
        created="2025-03-01T10:00:00+00:00",
        memagent="0.1.0",
    )  # fmt: skip
    writer = TraceWriter(path, header, span_of=book.span)
    replies = [*memories, reply] if len(memories) == len(chunks) else memories
    try:
        read(ScriptedBackend(replies), question, chunks, Settings(60, 64), writer)
    except KeyboardInterrupt:  # fewer memories than chunks: stopped as Ctrl-C stops a run
        writer.interrupted("SIGINT")
    finally:
        writer.close()
    return path


def as_old_release(path: Path, evidence: dict | None) -> Path:
    """The trace as memagent 0.1 wrote it: one evidence dict (step from 0), or None."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[-1]["evidence"] = evidence
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture
def doc(tmp_path) -> Path:
    # The stand-in model boxes the first word of its memory, which here is the document's:
    # about 950 tiktoken tokens, 4 chunks of 300, so the memory never outgrows 30 words.
    path = tmp_path / "zanzibar.txt"
    path.write_text("Zanzibar opens this text. " + story(60, fact=None))
    return path


# ---------------------------------------------------------------- provenance in the commands


def test_ask_says_where_the_answer_came_from_and_json_carries_it(cli, fake_server, doc):
    result = cli("ask", str(doc), "Which word opens the text?", *served(fake_server, *STEPS))
    assert ok(result) == "Zanzibar\n"
    chunks = read_trace(Path(re.search(r"trace: (\S+)", result.stderr)[1])).header.total_steps
    assert 2 <= chunks <= 5  # the stand-in's memory keeps 30 words: 6 from each chunk
    # On stderr, under the answer: the tokens of a text (no pages), steps counted from 1.
    assert f"from tokens 0–300, step 1 of {chunks}" in words(result.stderr)
    again = served(fake_server, *STEPS, "--json", "--no-reuse", "-q")
    out = json.loads(ok(cli("ask", str(doc), "Which word opens the text?", *again)))
    assert out["evidence"] == [
        {"step": 1, "words": ["zanzibar"], "tokens": [0, 300], "chars": out["steps"][0]["chars"]}
    ]
    assert out["evidence"] == read_trace(Path(out["trace"])).final.to_json()["evidence"]


def test_trace_shows_the_sources_of_a_kept_answer(cli, tmp_path):
    path = write_trace(tmp_path / "kept.jsonl", MEMORIES)
    out = ok(cli("trace", str(path)))
    assert "Answer: PELICAN" in out and "Evidence: from pp. i–1, step 2 of 5" in out
    assert "- **Evidence:** from pp. i–1, step 2 of 5" in ok(cli("trace", str(path), "--markdown"))
    final = json.loads(ok(cli("trace", str(path), "--json")))["final"]
    assert final["evidence"] == [
        {"step": 2, "words": ["pelican"], "tokens": [60, 120], "chars": [60, 120], "pages": "i–1"}
    ]


@pytest.mark.parametrize(
    "old, shown",
    [
        ({"step": 1, "span": "p. i–1", "tokens": [60, 120], "chars": [60, 120]},
         "from pp. i–1, step 2 of 5"),
        (None, "no source in the document"),
    ],
    ids=["one-evidence-dict", "no-evidence"],
)  # fmt: skip
def test_a_trace_of_the_previous_release_shows_in_every_view(cli, tmp_path, old, shown):
    path = as_old_release(write_trace(tmp_path / "old.jsonl", MEMORIES), old)
    assert f"Evidence: {shown}" in ok(cli("trace", str(path)))
    data = json.loads(ok(cli("trace", str(path), "--json")))
    assert data["problems"] == [] and isinstance(data["final"]["evidence"], list)
    page = tmp_path / "old.html"
    ok(cli("trace", str(path), "--html", str(page)))
    text = page.read_text()
    assert ("pp. i–1, step 2 of 5</a>" if old else "No source in the document") in text
    assert ('class="step source" id="run-1-step-2"' in text) == (old is not None)


# ---------------------------------------------------------------- the HTML, as text


def test_ask_report_has_a_tab_per_question_and_every_step(cli, fake_server, doc, tmp_path):
    page = tmp_path / "report.html"
    questions = ["Which word opens the text?", "What <b>opens</b> it?"]
    options = served(fake_server, *STEPS, "--html", str(page), "--no-trace")
    ok(cli("ask", str(doc), *questions, *options))
    text = page.read_text()
    chunks = fake_server.chat_calls // len(questions) - 1  # an update per chunk, the answer
    assert text.count("(none written: --no-trace)") == 2  # the report holds what no trace does
    assert text.count('<section class="run" id="run-') == 2
    assert 'type="radio" name="run" id="tab-2"' in text
    assert "What &lt;b&gt;opens&lt;/b&gt; it?" in text and "<b>opens" not in text
    for run in (1, 2):
        assert text.count(f'id="run-{run}-step-') == chunks
        assert f'class="step source" id="run-{run}-step-1"' in text  # "Zanzibar" came in there
    # Nothing runs and nothing is fetched: links stay in the page.
    assert "<script" not in text and not re.search(r'(src|href)="(?!#)', text)


def test_ask_report_path_is_checked_before_any_model(cli, doc, tmp_path):
    result = cli("ask", str(doc), "q?", "--html", str(tmp_path / "no" / "r.html"),
                      "-m", "nope.gguf")  # fmt: skip
    assert_clean_failure(result, 1, "Cannot write the report")


def test_several_traces_need_html_and_a_missing_one_is_one_sentence(cli, tmp_path):
    path = write_trace(tmp_path / "a.jsonl", MEMORIES)
    assert_clean_failure(cli("trace", str(path), str(path)), 2, "only in an --html report")
    missing = cli("trace", str(path), str(tmp_path / "nope.jsonl"), "--html", "r.html")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr


def test_runs_stopped_early_or_before_any_step_show_as_far_as_they_go(cli, tmp_path):
    stopped = write_trace(tmp_path / "stopped.jsonl", MEMORIES[:2])
    never = write_trace(tmp_path / "never.jsonl", [])
    page = tmp_path / "stopped.html"
    ok(cli("trace", str(stopped), str(never), "--html", str(page)))
    text = page.read_text()
    assert text.count("No answer yet") == 2
    assert "interrupted (SIGINT) after 2 of 5 steps" in text and "after 0 of 5 steps" in text
    assert text.count('id="run-1-step-') == 2 and 'id="run-2-step-' not in text
    assert ">token 288</text>" in text  # the strip ends where the document does, unread


def test_a_report_names_files_in_the_home_folder_from_its_tilde(cli, env, tmp_path):
    """A report may be shared: it does not carry its author's home folder (a user name)."""
    home = tmp_path / "home" / "alice"
    trace = write_trace(home / "traces" / "t.jsonl", MEMORIES)
    env["HOME"] = str(home)
    page = tmp_path / "r.html"
    ok(cli("trace", str(trace), "--html", str(page)))
    text = page.read_text()
    assert "~/traces/t.jsonl" in text and str(home) not in text


def test_hostile_text_is_escaped_everywhere(cli, tmp_path):
    path = write_trace(tmp_path / "h.jsonl", MEMORIES, question=f"Who? {HOSTILE}")
    page = tmp_path / "h.html"
    ok(cli("trace", str(path), "--html", str(page)))
    text = page.read_text()
    assert "<script" not in text and 'href="javascript' not in text
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in text
    assert "<title>memagent: Who? &lt;script&gt;" in text


def test_a_runaway_reply_is_cut_on_top_and_whole_below(cli, tmp_path):
    reply = "The password is PELICAN. " * 100  # no box, as small models answer
    path = write_trace(tmp_path / "long.jsonl", MEMORIES, reply=reply)
    page = tmp_path / "long.html"
    ok(cli("trace", str(path), "--html", str(page)))
    text = page.read_text()
    top = re.search(r'<div class="answer">(.*?)</div>', text, re.S)[1]
    assert len(top) < 500 and top.endswith(" …")
    assert "raw final reply, cut here" in text and reply.strip() in text
    assert "pp. i–1, step 2 of 5</a>" in text  # the reply's content word, "pelican"


def strip_of(page: Path) -> str:
    """The first run's document strip: the page's first SVG drawing."""
    return re.search(r"<svg.*?</svg>", page.read_text(), re.S)[0]


def test_the_strip_reads_as_the_documents_pages(cli, tmp_path):
    page = tmp_path / "pages.html"
    ok(cli("trace", str(write_trace(tmp_path / "t.jsonl", MEMORIES)), "--html", str(page)))
    strip = strip_of(page)
    # A tick where each step starts (288 tokens over 1,000 units), naming its first page ...
    ticks = re.findall(r'<line x1="([\d.]+)"[^>]*><title>step (\d) starts on (.*?), token', strip)
    assert ticks == [
        ("0.00", "1", "p. i"), ("208.33", "2", "p. i"), ("416.67", "3", "p. 1"),
        ("625.00", "4", "p. 2"), ("833.33", "5", "p. 3"),
    ]  # fmt: skip
    # ... and under the ticks each page once, where the first step on it starts.
    labels = re.findall(r'<text class="dim" x="([\d.]+)" y="84.0">(.*?)</text>', strip)
    assert labels == [("0.0", "p. i"), ("416.7", "p. 1"), ("625.0", "p. 2"), ("833.3", "p. 3")]


def test_the_strip_reads_as_the_documents_chapters(cli, tmp_path):
    titles = ["Prologue", "The Vault – Part One", "Noon & <Night>", "The Fall"]
    parts = [(title, text) for title, (_, text) in zip(titles, PAGES, strict=True)]
    path = write_trace(tmp_path / "t.jsonl", MEMORIES, parts=parts, unit="chapter")
    page = tmp_path / "chapters.html"
    ok(cli("trace", str(path), "--html", str(page)))
    labels = re.findall(r'<text class="dim" x="[\d.]+" y="84.0"[^>]*>(.*?)</text>', strip_of(page))
    # A title holding the separator of spans is cut there ("The Vault"); each is text.
    assert labels == ["Prologue", "The Vault", "Noon &amp; &lt;Night&gt;", "The Fall"]


# ---------------------------------------------------------------- eval report --html


def eval_results(path: Path, name: str) -> Path:
    with results.Writer(path) as writer:
        for i, (group, tokens, score) in enumerate(
            [("eval_50", 7168, 1.0), ("eval_50", 7168, 0.0), ("eval_100", 14336, 1.0)]
        ):
            writer.add({
                "id": f"c{i}", "group": group, "tokens": tokens, "seconds": 2.0, "sub_em": score,
                "em": score, "f1": score, "gold": "Paris", "question": "Where?",
                "prediction": name if score else None, "model": "tiny",
                "settings": {"chunk_tokens": 300},
            })  # fmt: skip
    return path


def test_eval_report_html_holds_the_tables_and_the_plot(cli, tmp_path):
    runs = [
        eval_results(tmp_path / "q4.jsonl", "<i>Paris</i>"),
        eval_results(tmp_path / "<q8>.jsonl", "x"),
    ]
    page = tmp_path / "eval.html"
    result = cli("eval", "report", *map(str, runs), "--html", str(page))
    table = ok(result)  # the terminal table still comes on stdout
    assert "eval_50" in table and f"report: {page}" in words(result.stderr)
    text = page.read_text()
    assert text.count("<h2>") == 3  # the chart, then each file
    assert '<td>eval_50</td><td class="num">7K</td><td class="num">2</td>' in text
    assert "&lt;i&gt;Paris&lt;/i&gt;" in text and "<i>Paris" not in text
    # The chart is inline SVG: a line per run and per paper row, a point per length group.
    chart = re.search(r'<svg[^>]*aria-label="Accuracy[^"]*">.*?</svg>', text, re.S)[0]
    assert chart.count("<polyline") == 4 and chart.count('stroke-dasharray="6 4"/>') >= 2
    assert "<title>q4: 50.00% at 7K tokens</title>" in chart
    assert "<title>q4: 100.00% at 14K tokens</title>" in chart
    assert ">&lt;q8&gt;</text>" in chart and "<q8>" not in chart  # a file name is text too
    assert ">RL-MemAgent-14B (paper)</text>" in chart and ">3.5M</text>" in chart
    assert "<img" not in text and "<script" not in text


def test_eval_report_html_draws_its_chart_without_matplotlib(tmp_path, monkeypatch):
    from memagent_cli.views import evaluation as views

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    run = results.read(eval_results(tmp_path / "q4.jsonl", "Paris"))
    views.write_html([run], tmp_path / "eval.html")
    text = (tmp_path / "eval.html").read_text()
    assert "<title>q4: 50.00% at 7K tokens</title>" in text and "<td>eval_100</td>" in text
    assert "matplotlib" not in text


def test_eval_report_html_of_a_needle_run_has_its_depth_grid(tmp_path):
    from memagent_cli.views import evaluation as views

    path = tmp_path / "niah.jsonl"
    with results.Writer(path) as writer:
        for i, (group, tokens, depth, score) in enumerate(
            [("niah_8k", 8192, 10.0, 1.0), ("niah_8k", 8192, 90.0, 0.0),
             ("niah_16k", 16384, 10.0, 1.0)]
        ):  # fmt: skip
            writer.add({
                "id": f"n{i}", "group": group, "tokens": tokens, "depth": depth, "seconds": 1.0,
                "sub_em": score, "gold": ["PELICAN"], "question": "Which word?",
                "prediction": "PELICAN" if score else "x",
            })  # fmt: skip
    views.write_html([results.read(path)], tmp_path / "niah.html")
    text = (tmp_path / "niah.html").read_text()
    grid = re.search(r'<svg[^>]*aria-label="Needle recall[^"]*">.*?</svg>', text, re.S)[0]
    # Red at 0%, green at 100%, blank where nothing ran (depth 90% of the 16K group).
    assert 'fill="#1a9850" stroke="#fff"><title>depth 10%, niah_8k: 100%</title>' in grid
    assert 'fill="#d73027" stroke="#fff"><title>depth 90%, niah_8k: 0%</title>' in grid
    assert "<title>depth 90%, niah_16k: not run</title>" in grid


# ---------------------------------------------------------------- in a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium to open the report in (apt-get install chromium; .ci/run does)",
)


def browse(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Open `page` in headless chromium from disk, with the console logged on stderr."""
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--hide-scrollbars", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def console(shown: subprocess.CompletedProcess) -> list[str]:
    """What the page logged to the browser's console: errors, and requests its policy blocked."""
    return [line for line in shown.stderr.splitlines() if ":CONSOLE" in line]


@needs_browser
def test_the_console_check_sees_a_blocked_request_and_a_script_error(cli, tmp_path):
    # The control for the empty consoles asserted below: the same report, with a remote image
    # and a script added, logs both; without its policy, the script's error.
    page = tmp_path / "report.html"
    ok(cli("trace", str(write_trace(tmp_path / "kept.jsonl", MEMORIES)), "--html", str(page)))
    clean = page.read_text()
    added = '<img src="http://127.0.0.1:9/x.png" alt=""><script>missing()</script></body>'
    blocked = tmp_path / "blocked.html"
    blocked.write_text(clean.replace("</body>", added))
    logged = console(browse(blocked, tmp_path / "profile", "--dump-dom"))
    policy = [line for line in logged if "Content Security Policy" in line]
    assert any("'http://127.0.0.1:9/x.png'" in line for line in policy), logged
    assert any("inline script" in line for line in policy), logged
    unguarded = tmp_path / "unguarded.html"
    unguarded.write_text(re.sub(r"<meta http-equiv=\"Content-Security-Policy\"[^>]*>\n", "",
                                clean.replace("</body>", added)))  # fmt: skip
    assert "Content-Security-Policy" not in unguarded.read_text()
    logged = console(browse(unguarded, tmp_path / "profile", "--dump-dom"))
    assert any("Uncaught ReferenceError: missing is not defined" in line for line in logged)
    assert console(browse(page, tmp_path / "profile", "--dump-dom")) == []


@needs_browser
def test_the_report_renders_in_a_browser_and_a_hostile_trace_stays_inert(cli, tmp_path):
    kept = write_trace(tmp_path / "kept.jsonl", MEMORIES)
    hostile = write_trace(tmp_path / "h.jsonl", ["No.", HOSTILE, HOSTILE, HOSTILE, HOSTILE],
                          question=f"Who? {HOSTILE}")  # fmt: skip
    page = tmp_path / "report.html"
    ok(cli("trace", str(kept), str(hostile), "--html", str(page)))
    profile = tmp_path / "profile"

    shown = browse(page, profile, "--dump-dom")
    assert shown.returncode == 0, shown.stderr
    assert console(shown) == []  # no error, and nothing the page's policy had to block
    dom = shown.stdout
    assert re.search(r"<title>memagent: 2 questions</title>", dom) and "pwned</title>" not in dom
    # No script element and no link to javascript:, only their text.
    assert "<script" not in dom and not re.search(r"<a\s[^>]*href=\"javascript", dom)
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt; &lt;a href=\"javascript:" in dom
    assert dom.count('class="step') == 10 and "<ins>" in dom and "<del>" in dom
    assert "From <a " in dom and "pp. i–1, step 2 of 5</a>" in dom
    assert "No source in the document" in dom  # the hostile run's answer is in no memory

    shot = tmp_path / "report.png"
    browse(page, profile, f"--screenshot={shot}", "--window-size=1100,1400")
    from PIL import Image

    with Image.open(shot) as image:
        colours = dict((c, n) for n, c in image.convert("RGB").getcolors(maxcolors=1 << 24))
    # The source step is drawn in the strip, the chart and its card, in its own colour.
    assert colours.get((0xE8, 0x89, 0x0C), 0) > 500

    pdf = tmp_path / "report.pdf"
    browse(page, profile, f"--print-to-pdf={pdf}", "--no-pdf-header-footer")
    from pypdf import PdfReader

    printed = "".join(p.extract_text() for p in PdfReader(pdf).pages)
    # Printed, every question's tab is there, one after the other.
    assert "Question 1: What is the password" in printed and "Question 2: Who?" in printed


@needs_browser
def test_the_eval_report_renders_its_plot_in_a_browser(cli, tmp_path):
    page = tmp_path / "eval.html"
    ok(cli("eval", "report", str(eval_results(tmp_path / "q4.jsonl", "x")), "--html", str(page)))
    shown = browse(page, tmp_path / "profile", "--dump-dom")
    assert shown.returncode == 0, shown.stderr
    # The chart is inline SVG: nothing blocked, nothing logged.
    assert console(shown) == []
    dom = shown.stdout
    assert 'aria-label="Accuracy (sub_em, %)' in dom and "<td>eval_100</td>" in dom
    assert "<title>q4: 50.00% at 7K tokens</title>" in dom
