"""What a document, a server, a trace or a file name can put on a terminal: text, never a
control sequence and never Rich markup; and file names that are not UTF-8, read and shown.

The document's first word is a run of escape sequences (OSC 52 sets the clipboard, OSC 8
disguises a link, CSI 2J clears the screen, 0x9b is CSI in one byte) and Rich markup; the
stand-in model (tests/support/fake_openai.py) boxes the memory's first word, so it is the answer,
and the memory holds it at every step."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from support.command import assert_clean_failure, words
from support.fake_openai import served
from support.story import story

from memagent_cli.trace import read_trace

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
HOSTILE = (
    "\x1b]52;c;SGVsbG8=\x07"  # OSC 52: put "Hello" on the clipboard
    "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\"  # OSC 8: a link that reads "click"
    "\x1b[2J\x9b2J\x7f"  # clear the screen, twice, and DEL
    "[bold]loud[/bold][link=http://evil]x[/link]"  # Rich markup, to print as written
)
SHOWN = "]52;c;SGVsbG8=]8;;http://evil\\click]8;;\\[2J2J[bold]loud[/bold][link=http://evil]x[/link]"


def assert_plain(*outputs: str) -> None:
    """No control character but newline (and tab) reached the output."""
    for text in outputs:
        assert not [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]


def assert_harmless(text: str) -> None:
    """Output for a terminal: Rich's own colours may be there, none of the document's codes."""
    for sequence in ("\x1b]52", "\x1b]8;;http://evil", "\x1b[2J", "\x9b", "\x07", "\x7f"):
        assert sequence not in text


@pytest.fixture
def doc(tmp_path) -> Path:
    path = tmp_path / "hostile.txt"
    path.write_text(f"{HOSTILE} opens the book. " + story(60), encoding="utf-8")
    return path


def ask(cli, server, doc: Path, *more: str):
    return cli("ask", str(doc), "What opens the book?", *served(server, *STEPS, *more))


def test_an_answer_and_progress_in_plain_output_are_text_and_json_keeps_it_exactly(
    cli, fake_server, doc, tmp_path
):
    trace_path = tmp_path / "run.jsonl"
    result = ask(cli, fake_server, doc, "--trace", str(trace_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout == SHOWN + "\n"  # markup as written, not bold and not a link
    assert_plain(result.stdout, result.stderr)
    assert read_trace(trace_path).final.answer == HOSTILE  # the trace keeps what was read

    as_json = ask(cli, fake_server, doc, "--json", "--quiet")
    assert as_json.returncode == 0, as_json.stderr
    assert_plain(as_json.stdout)  # every control escaped as \u...
    out = json.loads(as_json.stdout)
    assert out["answer"] == HOSTILE and out["steps"][0]["memory"].startswith(HOSTILE)


def test_the_live_view_on_a_terminal_shows_the_memory_as_text(memagent, env, fake_server, doc):
    env["FORCE_COLOR"] = "1"  # stderr counts as a terminal: the live view, in colour
    result = memagent("ask", str(doc), "What opens the book?", *served(fake_server, *STEPS))
    assert result.returncode == 0, result.stderr
    assert "memory after step" in result.stderr and "\x1b[" in result.stderr  # Rich's colours
    assert_harmless(result.stderr)
    assert "[bold]loud[/bold]" in result.stderr


def test_inspect_text_prints_the_document_as_text(cli, doc):
    shown = cli("inspect", str(doc), "--text", "--tokenizer", "tiktoken")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.endswith("\n\f")  # memagent's own form feed ends the text
    assert_plain(shown.stdout.removesuffix("\f")) and shown.stdout.startswith(SHOWN)
    as_json = json.loads(cli("inspect", str(doc), "--text", "--json").stdout)
    assert as_json[0]["text"].startswith(HOSTILE)  # JSON keeps it exactly


def test_every_view_of_a_trace_shows_its_text_as_text(cli, env, fake_server, doc, tmp_path):
    trace_path = tmp_path / "run.jsonl"
    assert ask(cli, fake_server, doc, "--trace", str(trace_path)).returncode == 0
    views = [
        [],
        ["--step", "1"],
        ["--diff", "2"],
        ["--grep", "loud"],
        ["--markdown"],
        ["--follow"],
    ]
    for view in views:
        shown = cli("trace", str(trace_path), *view)
        assert shown.returncode == 0, (view, shown.stderr)
        assert_plain(shown.stdout, shown.stderr)
        assert "[bold]loud[/bold]" in shown.stdout.replace("\\", ""), view  # Markdown escapes
    env["FORCE_COLOR"] = "1"
    for view in ([], ["--diff", "1"]):
        coloured = cli("trace", str(trace_path), *view)
        assert "\x1b[" in coloured.stdout and "[bold]loud[/bold]" in coloured.stdout
        assert_harmless(coloured.stdout)
    del env["FORCE_COLOR"]
    as_json = cli("trace", str(trace_path), "--json")
    assert_plain(as_json.stdout)
    assert json.loads(as_json.stdout)["final"]["answer"] == HOSTILE


def test_a_trace_someone_sent_cannot_reach_the_terminal_through_its_warnings(cli, tmp_path):
    sent = tmp_path / f"sent{HOSTILE.replace('/', '')}.jsonl"
    header = {"type": "header", "format": 2, "question": HOSTILE, "memagent": HOSTILE}
    sent.write_text(json.dumps(header) + "\n" + HOSTILE + "\n", encoding="utf-8")
    for view in ([], ["--list"]):
        shown = cli("trace", str(sent), *view) if view == [] else cli("trace", "--list")
        assert_plain(shown.stdout, shown.stderr)
        assert "Traceback" not in shown.stderr


def test_a_server_error_is_shown_as_text(cli, fake_server, doc):
    fake_server.fail_after, fake_server.fail_status = 0, 400
    fake_server.fail_message = HOSTILE
    result = ask(cli, fake_server, doc)
    assert_clean_failure(result, 1, "HTTP 400")
    assert_plain(result.stderr)
    assert "[bold]loud[/bold]" in result.stderr


def test_file_names_in_messages_progress_and_inspect_are_text(cli, fake_server, doc, tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    name = "a\x1b]52;c;SGk=\x07\x1b[2J\x9b[red]b"  # no "/": a name
    (folder / f"{name}.txt").write_text("")  # empty: an error that names it
    (folder / f"{name}2.txt").write_text(story(30))
    result = cli("ask", str(folder), "What opens the book?", *served(fake_server, *STEPS))
    assert result.returncode == 1  # the empty one is skipped, the other answered
    assert len(result.stdout.splitlines()) == 1
    assert_plain(result.stdout, result.stderr)
    assert "a]52;c;SGk=[2J[red]b.txt" in result.stderr  # the error names it
    listed = cli("trace", "--list")
    assert listed.returncode == 0 and "a]52;c;SGk=[2J[red]b2.txt" in listed.stdout
    assert_plain(listed.stdout, listed.stderr)

    inspected = cli("inspect", str(folder / f"{name}2.txt"), "--tokenizer", "tiktoken")
    assert inspected.returncode == 0, inspected.stderr
    assert "a]52;c;SGk=[2J[red]b2.txt" in inspected.stdout
    assert_plain(inspected.stdout, inspected.stderr)
    as_json = cli("inspect", str(folder / f"{name}2.txt"), "--tokenizer", "tiktoken", "--json")
    assert_plain(as_json.stdout)
    assert json.loads(as_json.stdout)["document"]["path"] == str(folder / f"{name}2.txt")


def test_an_evaluation_and_its_reports_show_a_hostile_case_as_text(cli, fake_server, tmp_path):
    data = tmp_path / "eval_50.json"
    case = {"_id": HOSTILE, "input": "Which word?", "context": f"{HOSTILE} opens this."}
    data.write_text(json.dumps([case | {"answers": [HOSTILE]}]))
    out, page = tmp_path / "run.jsonl", tmp_path / "run.html"
    result = cli("eval", str(data), *served(fake_server, *STEPS), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert_plain(result.stdout, result.stderr)
    shown = cli("eval", "report", str(out), "--html", str(page))
    assert shown.returncode == 0, shown.stderr
    assert_plain(shown.stdout, shown.stderr, page.read_text())
    assert "[bold]loud[/bold]" in page.read_text()


def test_html_reports_hold_text_never_markup_or_controls(cli, fake_server, doc, tmp_path):
    page = tmp_path / "report.html"
    result = ask(cli, fake_server, doc, "--html", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert_plain(text)
    assert "[bold]loud[/bold][link=http://evil]x[/link]" in text
    assert 'href="http://evil' not in text


def test_the_screen_console_keeps_rich_s_codes_and_drops_the_text_s():
    from rich.panel import Panel
    from rich.text import Text

    from memagent_cli.views.console import Screen

    screen = io.StringIO()
    Screen(file=screen, force_terminal=True, width=100).print(
        Panel(Text(HOSTILE, style="bold"), title="memory")
    )
    assert "\x1b[1m" in screen.getvalue()  # bold, from Rich
    assert_harmless(screen.getvalue())
    assert "[bold]loud[/bold]" in screen.getvalue()


# ---------------------------------------------------------------- names that are not UTF-8

LATIN1 = b"caf\xe9.txt"  # "café.txt" as Latin-1 wrote it: not UTF-8


def latin1_file(folder: Path, text: str) -> Path:
    """A file whose name is the Latin-1 bytes of "café.txt", made as a file system does."""
    handle = os.open(os.fsencode(folder) + b"/" + LATIN1, os.O_WRONLY | os.O_CREAT, 0o644)
    with os.fdopen(handle, "w") as file:
        file.write(text)
    return folder / os.fsdecode(LATIN1)


def test_a_folder_with_a_latin1_name_is_read_and_shown(cli, fake_server, tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    latin = latin1_file(folder, "Paris opens this book. " + story(30))
    (folder / "plain.txt").write_text("Rome opens this book. " + story(30))
    result = cli("ask", str(folder), "What opens the book?", *served(fake_server, *STEPS))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["Paris", "Rome"]  # both read: one name stops nothing
    assert "Traceback" not in result.stderr

    traces = {read_trace(p).header.document["path"]: p for p in _traces(cli)}
    assert str(latin) in traces  # the trace keeps the name's bytes
    assert "caf\ufffd.txt" in cli("trace", "--list").stdout  # shown with U+FFFD
    for view in ([], ["--markdown"], ["--json"]):
        shown = cli("trace", str(traces[str(latin)]), *view)
        assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["header"]["document"]["path"] == str(latin)
    page = tmp_path / "report.html"
    assert cli("trace", str(traces[str(latin)]), "--html", str(page)).returncode == 0
    assert "caf\ufffd.txt" in page.read_text()

    again = cli("ask", str(latin), "What opens the book?", *served(fake_server, *STEPS), "--json")
    assert json.loads(again.stdout)["document"]["path"] == str(latin)
    inspected = cli("inspect", str(latin), "--tokenizer", "tiktoken")
    assert inspected.returncode == 0 and "caf\ufffd.txt" in inspected.stdout


def _traces(cli) -> list[Path]:
    return [Path(row["path"]) for row in json.loads(cli("trace", "--list", "--json").stdout)]


def test_a_list_of_documents_and_a_question_need_not_be_utf8(cli, fake_server, tmp_path):
    latin = latin1_file(tmp_path, "Paris opens this book. " + story(30))
    listing = tmp_path / "documents.txt"
    listing.write_bytes(os.fsencode(latin) + b"\n")
    question = "Qu'est-ce qui ouvre le livre, caf" + os.fsdecode(b"\xe9") + "?"
    result = cli("ask", question, "--documents", str(listing), *served(fake_server, *STEPS))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Paris\n"
    (trace,) = _traces(cli)
    assert read_trace(trace).header.question == "Qu'est-ce qui ouvre le livre, caf\ufffd?"
    assert words(cli("trace", str(trace)).stdout).startswith("Question: Qu'est-ce")


def test_an_evaluation_file_whose_name_is_not_utf8_is_a_group(cli, fake_server, tmp_path):
    case = {"_id": "c1", "input": "Which word?", "context": "Paris opens this. " + story(20)}
    data = latin1_file(tmp_path, json.dumps([case | {"answers": ["Paris"]}]))
    out = tmp_path / "run.jsonl"
    result = cli("eval", str(data), *served(fake_server, *STEPS), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "caf\ufffd" in result.stdout  # the group: the file's name
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["group"] == data.stem and record["prediction"] == "Paris"


def test_a_model_folder_and_a_gguf_whose_names_are_not_utf8_convert(cli, tmp_path):
    from support.hf_model import build

    folder = tmp_path / os.fsdecode(b"mod\xe8le")  # llama.cpp's quantizer opens both names
    build(folder)
    out = tmp_path / os.fsdecode(b"mod\xe8le.Q8_0.gguf")
    result = cli("models", "convert", str(folder), "--quant", "Q8_0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert (
        out.is_file() and result.stdout == str(out).replace(os.fsdecode(b"\xe8"), "\ufffd") + "\n"
    )


@pytest.mark.model
def test_a_model_file_whose_name_is_not_utf8_loads(memagent, tiny_model, tmp_path):
    model = tmp_path / os.fsdecode(b"mod\xe8le.gguf")
    model.symlink_to(tiny_model)
    doc = tmp_path / "book.txt"
    doc.write_text(story(30))
    result = memagent("inspect", str(doc), "-m", str(model), "--no-estimate")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "tokens" in result.stdout
