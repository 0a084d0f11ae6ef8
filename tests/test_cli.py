"""The command line as a user meets it: help, version, and bad input (no model generation)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli_docs
from support.command import MEMAGENT, assert_clean_failure, words
from support.story import story


@pytest.fixture
def doc(tmp_path):
    """A one-word document, for failures that happen before any reading."""
    path = tmp_path / "doc.txt"
    path.write_text("text")
    return path


def test_version(cli):
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("memagent 0.")


def test_the_top_help_names_every_command(cli):
    text = cli("--help").stdout
    for command in ("ask", "inspect", "trace", "models"):
        assert f" {command} " in text


def test_ask_help_lists_llama_cpp_spellings(cli):
    text = cli("ask", "--help").stdout
    for option in ("--chunk-tokens", "--memory-tokens", "-ngl", "-t", "-m", "--json", "--trace"):
        assert option in text


def test_help_shows_a_metavar_only_where_it_says_something(cli):
    for command in (["ask"], ["inspect"], ["eval", "niah"], ["models", "pull"], ["trace"]):
        text = cli(*command, "--help").stdout
        assert not [t for t in ("<bool>", "<str>", "<int", "<float", "<path>", "[x>=") if t in text]
    rows = {line.split()[1]: line for line in cli("ask", "--help").stdout.splitlines()[1:]
            if line.startswith("│ --")}  # fmt: skip
    assert rows["--chunk-tokens"].split()[2] == "N" and rows["--trace"].split()[2] == "FILE"
    assert rows["--base-url"].split()[2] == "URL" and rows["--format"].split()[2] == "text|pdf|epub"
    assert rows["--json"].split()[2] == "Print"  # a flag: its help follows its name


def test_python_dash_m_works(env):
    result = subprocess.run(
        [sys.executable, "-m", "memagent_cli", "--version"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0 and result.stdout.startswith("memagent ")


def test_missing_document(cli, tmp_path):
    result = cli("ask", str(tmp_path / "nope.txt"), "q?")
    assert_clean_failure(result, 1, "Document not found", "nope.txt")


def test_a_folder_without_documents(cli, tmp_path):
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert_clean_failure(cli("ask", str(tmp_path), "q?"), 1, "holds no supported documents")
    assert_clean_failure(cli("inspect", str(tmp_path)), 1, "is a directory")


def test_empty_document(cli, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("  \n\n \t")
    assert_clean_failure(cli("ask", str(path), "q?"), 1, "The document is empty")


def test_empty_stdin(cli):
    result = cli("ask", "-", "q?", input="")
    assert_clean_failure(result, 1, "The document is empty", "stdin")


def test_no_question(cli, doc):
    assert_clean_failure(cli("ask", str(doc)), 2, "at least one question")


def test_missing_model_file(cli, tmp_path, doc):
    result = cli("ask", str(doc), "q?", "--model", str(tmp_path / "missing.gguf"))
    assert_clean_failure(result, 1, "Model not found", "missing.gguf", "registry name")


def test_missing_model_from_env(cli, env, doc):
    env["MEMAGENT_MODEL"] = "no-such-model"
    result = cli("ask", str(doc), "q?")
    assert_clean_failure(result, 1, "$MEMAGENT_MODEL no-such-model", "known names")


def test_registry_model_not_downloaded(cli, doc):
    result = cli("ask", str(doc), "q?", "-m", "memagent-7b")
    assert_clean_failure(
        result, 1, "memagent-7b", "is not pulled yet", "memagent models pull memagent-7b"
    )


def test_non_gguf_model(cli, tmp_path, doc):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    result = cli("ask", str(doc), "q?", "-m", str(fake))
    assert_clean_failure(result, 1, "is not a GGUF model file")


def test_truncated_gguf_model(cli, tmp_path, doc):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 8)
    result = cli("ask", str(doc), "q?", "-m", str(broken))
    # memagent reads the header before llama.cpp does
    assert_clean_failure(result, 1, f"{broken} is a damaged GGUF file")


@pytest.mark.parametrize("option", ["--chunk-tokens", "--memory-tokens"])
def test_zero_tokens_is_a_usage_error(cli, option, doc):
    result = cli("ask", str(doc), "q?", option, "0")
    assert_clean_failure(result, 2, "Invalid value", option)


def test_watching_a_question_that_is_not_asked_is_a_usage_error(cli, tmp_path, doc):
    """--watch 3 with two questions would show the first one's memory without a word."""
    questions = tmp_path / "q.txt"
    questions.write_text("one?\ntwo?\n")
    missing_model = ["-m", str(tmp_path / "none.gguf")]  # said before any model is sought
    for asked in (["one?", "two?"], ["--questions", str(questions)]):
        result = cli("ask", str(doc), *asked, "--watch", "3", *missing_model)
        assert_clean_failure(result, 2, "--watch", "there are 2 questions")


def test_questions_file_missing(cli, tmp_path, doc):
    result = cli("ask", str(doc), "--questions", str(tmp_path / "q.txt"))
    assert_clean_failure(result, 1, "Questions file not found")


def test_an_unknown_backend(cli, doc):
    result = cli("ask", str(doc), "q?", "--backend", "bogus")
    assert_clean_failure(result, 2, "--backend", "'bogus' is not one of 'llama', 'openai'")


def test_the_document_is_read_before_the_model_is_sought(cli, env, tmp_path):
    missing = str(tmp_path / "nope.txt")
    result = cli("ask", missing, "q?", "-m", str(tmp_path / "missing.gguf"))
    assert_clean_failure(result, 1, "Document not found")
    # An hf: model would be downloaded: nothing may be fetched for a document that is not there.
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there
    result = cli("ask", missing, "q?", "-m", "hf:someone/Model-GGUF:Q4_K_M")
    assert_clean_failure(result, 1, "Document not found")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    result = cli("ask", str(empty), "q?", "-m", "hf:someone/Model-GGUF:Q4_K_M")
    assert_clean_failure(result, 1, "The document is empty")


@pytest.mark.parametrize(
    "content, phrase",
    [
        (bytes(range(256)) * 8, "is not UTF-8 text"),
        (b"What?\x00\x01\x02\n", "is not UTF-8 text"),
    ],
    ids=["binary", "nul-bytes"],
)
def test_a_binary_questions_file_is_refused(cli, tmp_path, doc, content, phrase):
    questions = tmp_path / "q.bin"
    questions.write_bytes(content)
    assert_clean_failure(cli("ask", str(doc), "--questions", str(questions)), 1, phrase)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_questions_file_that_is_not_a_file_is_refused_at_once(cli, tmp_path, doc, kind):
    import os

    if kind == "fifo":
        path = tmp_path / "q.fifo"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero") if kind == "dev-zero" else tmp_path
    result = cli("ask", str(doc), "--questions", str(path), timeout=60)
    assert_clean_failure(result, 1, "is not a regular file")


def test_a_documents_list_that_is_a_fifo_is_refused(cli, tmp_path, doc):
    import os

    path = tmp_path / "docs.fifo"
    os.mkfifo(path)
    result = cli("ask", "q?", "--documents", str(path), timeout=60)
    assert_clean_failure(result, 1, "Documents file", "is not a regular file")


@pytest.mark.parametrize("content", ["", "\n  \n\n"], ids=["empty", "blank lines"])
def test_a_documents_list_that_names_none_is_refused(cli, tmp_path, content):
    """Not exit 0 with nothing read and nothing said."""
    path = tmp_path / "docs.txt"
    path.write_text(content)
    result = cli("ask", "q?", "--documents", str(path), "-m", str(tmp_path / "none.gguf"))
    assert_clean_failure(result, 1, f"Documents file {path} names no documents")


@pytest.mark.parametrize("pattern", ["../../*", "/etc/*", "sub/../../*.txt"])
def test_a_glob_cannot_reach_outside_the_folder(cli, tmp_path, pattern):
    library = tmp_path / "library"
    library.mkdir()
    (library / "a.txt").write_text(story(5))
    (tmp_path / "secret.txt").write_text("not for the server")
    result = cli("ask", str(library), "q?", "--glob", pattern)
    assert_clean_failure(result, 1, "reaches outside", "patterns match inside it")


def test_a_link_out_of_the_folder_is_not_followed(tmp_path):
    from memagent_cli.documents.inputs import document_paths

    library = tmp_path / "library"
    library.mkdir()
    (library / "a.txt").write_text("a")
    (tmp_path / "secret.txt").write_text("s")
    (library / "link.txt").symlink_to(tmp_path / "secret.txt")
    assert document_paths(str(library), None, "*.txt") == [str(library / "a.txt")]


def test_format_text_reads_a_text_that_starts_like_a_pdf(cli, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("%PDF-1.7 is the version my printer writes; these are my notes.\n" * 20)
    refused = cli("inspect", str(notes), "--tokenizer", "tiktoken")
    assert_clean_failure(refused, 1, "looks like a damaged PDF", "--format text")
    read = cli("inspect", str(notes), "--tokenizer", "tiktoken", "--format", "text", "--json")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["document"]["format"] == "text"
    bad = cli("inspect", str(notes), "--format", "docx")
    assert_clean_failure(bad, 2, "docx")


def test_what_a_reader_worked_around_is_said_on_stderr(cli, tmp_path):
    from support import builders

    book = builders.epub_book(
        tmp_path / "book.epub",
        [("one.xhtml", "One", builders.xhtml("One", ["The keeper kept the key."]))],
    )
    # Without a spine the book is read in manifest order, and memagent says so.
    builders.rewrite_zip(book, edit={"EPUB/content.opf": _without_spine(book)})
    result = cli("inspect", str(book), "--tokenizer", "tiktoken")
    assert result.returncode == 0, result.stderr
    assert "no spine" in words(result.stderr)


def _without_spine(book: Path) -> bytes:
    import re
    import zipfile

    with zipfile.ZipFile(book) as archive:
        opf = archive.read("EPUB/content.opf")
    return re.sub(rb"<spine[^>]*>.*?</spine>", b"", opf, flags=re.S)


def test_every_command_that_reads_takes_the_same_engine_flags():
    from memagent_cli.cli.options import ModelFlags, ReadFlags

    def flags(path: str, kind: type) -> dict[str, tuple]:
        """Each of `kind`'s flags as `memagent PATH` declares it: names, help, panel."""
        shown = {param.name: param for param in cli_docs.command(path).params}
        return {
            f.name: (shown[f.name].opts, shown[f.name].help, shown[f.name].rich_help_panel)
            for f in dataclasses.fields(kind)
        }

    ask = flags("ask", ReadFlags)
    assert "--flash-attn" in ask["flash_attn"][0] and "--parallel" in ask["parallel"][0]
    for path in ("eval run", "eval niah"):  # one declaration: the same names, help, panel
        assert flags(path, ReadFlags) == ask, path
    inspect = flags("inspect", ModelFlags)
    assert inspect == {name: ask[name] for name in inspect}


@pytest.mark.parametrize("words", [["ask", "q?"], ["eval"], ["eval", "niah", "--haystack"]])
def test_the_engine_flags_are_checked_alike_by_every_command(cli, doc, words):
    # A quantized V cache needs flash attention: llama.cpp's rule, said in one sentence by
    # eval as by ask (eval had no --cache-type-v before the flags were shared).
    command = [words[0], str(doc), *words[1:]] if words[0] == "ask" else [*words, str(doc)]
    result = cli(*command, "--cache-type-v", "q8_0")
    assert_clean_failure(result, 1, "quantized V cache (q8_0) needs flash attention")
    result = cli(*command, "--parallel", "0")
    assert_clean_failure(result, 2, "Invalid value for '--parallel'", "greater than or equal to 1")


def test_version_says_why_a_broken_llama_cpp_cannot_load(env, tmp_path):
    """A CUDA build of llama.cpp on a machine without the driver: loading its library raises
    OSError. --version still names memagent's version, and says why in one line."""
    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    why = "libcuda.so.1: cannot open shared object file: No such file or directory"
    (fake / "__init__.py").write_text(f"raise OSError({why!r})\n")
    broken = env | {"PYTHONPATH": os.pathsep.join([str(fake.parent), *sys.path])}

    for args in (["--version"], ["--version", "--json"]):
        result = subprocess.run(
            [str(MEMAGENT), *args], capture_output=True, text=True, env=broken, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        if "--json" in args:
            assert json.loads(result.stdout)["llama_cpp"] == f"cannot load: {why}"
        else:
            assert result.stdout.startswith("memagent 0.")
            assert result.stdout.splitlines()[1] == f"llama.cpp cannot load: {why}"


def _numeric_options() -> list[tuple[list[str], str, int, list[str]]]:
    """(command words, flag, the arguments the command takes, its required options) of
    every option of every command that takes a number."""
    import typing

    from typer import core
    from typer.main import get_command

    from memagent_cli.cli import app

    found = []

    def walk(command: typing.Any, words: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*words, name])
        for param in command.params if words else []:
            kind = param.type_descriptor.annotation
            kinds = set(typing.get_args(kind)) or {kind}
            if isinstance(param, core.TyperOption) and kinds & {int, float}:
                arguments = sum(isinstance(p, core.TyperArgument) for p in command.params)
                needed = [max(p.opts, key=len) for p in command.params if p.required]
                found.append((words, max(param.opts, key=len), arguments, needed))

    walk(get_command(app), [])
    return found


NUMERIC = _numeric_options()


@pytest.mark.parametrize(
    ("words", "flag", "arguments", "needed"),
    NUMERIC,
    ids=[" ".join([*w, f]) for w, f, _, _ in NUMERIC],
)
def test_every_number_option_refuses_nan_and_infinities_in_one_line(
    cli, env, doc, tmp_path, words, flag, arguments, needed
):
    """A NaN compares false with every bound, so a range check alone lets it through
    (`--temperature nan` started a reading)."""
    assert ("ask", "--temperature") in {(" ".join(w), f) for w, f, _, _ in NUMERIC}
    env["MEMAGENT_MODEL"] = str(tmp_path / "absent.gguf")  # a value let through reads nothing
    given = [f"{option}={doc}" for option in needed if option != flag]
    for value in ("nan", "inf", "-inf", "-Infinity"):
        result = cli(*words, f"{flag}={value}", *given, *[str(doc)] * arguments)
        assert_clean_failure(result, 2, f"Invalid value for '{flag}'")


def test_a_full_disk_under_stdout_is_one_sentence_and_keeps_the_trace(env, fake_server, tmp_path):
    """`memagent ... > answers.txt` on a full disk (/dev/full): each command says it could not
    write its results, in one sentence, not a traceback; `ask`'s trace is whole."""
    from support.fake_openai import served

    doc = tmp_path / "doc.txt"
    doc.write_text(story(40))
    trace = tmp_path / "t.jsonl"
    commands = [
        ["ask", str(doc), "q?", *served(fake_server, "--trace", str(trace))],
        ["trace", str(trace)],
        ["trace", str(trace), "--json"],
        ["inspect", str(doc), "--tokenizer", "tiktoken", "--text"],
        ["models", "list", "--json"],
        ["paths"],
    ]
    for args in commands:
        with open("/dev/full", "w") as full:
            result = subprocess.run(
                [str(MEMAGENT), *args], stdout=full, stderr=subprocess.PIPE, text=True, env=env
            )
        assert result.returncode == 1 and "Traceback" not in result.stderr, (args, result.stderr)
        said = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert said == ["error: Cannot write the results: No space left on device."], args
    with open("/dev/null", "w") as null:
        shown = subprocess.run([str(MEMAGENT), "trace", str(trace)], stdout=null, env=env)
    assert shown.returncode == 0  # the run the full stdout stopped is in its trace, finished
    from memagent_cli.trace import read_trace

    assert read_trace(trace).finished

    closed = subprocess.run(  # started with stdout closed (`>&-`): said, not dropped
        [str(MEMAGENT), "trace", str(trace)], stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert closed.returncode == 1 and "Traceback" not in closed.stderr, closed.stderr
    assert "error: Cannot write the results: standard output is closed." in closed.stderr


NOWHERE = "http://127.0.0.1:9/v1"  # the discard port: nothing answers
SERVER_OPTIONS = {
    "a URL whose port cannot be read": ("--base-url", "http://[::1", 1, "cannot be used"),
    "a URL with a line break": ("--base-url", f"{NOWHERE}\r\nX-Evil: 1", 1, "cannot be used"),
    "a URL too long to send": ("--base-url", f"{NOWHERE}?q=" + "a" * 70_000, 1, "cannot be used"),
    "a key that is not ASCII": ("--api-key", "ключ-Secret-5151", 1, "printable ASCII"),
    "a key with a line break": ("--api-key", "k-Secret-5151\r\nX-Evil: 1", 1, "printable ASCII"),
    "a timeout past time_t": ("--timeout", "1e300", 2, "Invalid value for '--timeout'"),
    "a timeout past poll's": ("--timeout", "3e9", 2, "Invalid value for '--timeout'"),
}


@pytest.mark.parametrize("case", SERVER_OPTIONS)
def test_a_server_option_that_cannot_be_used_is_one_sentence(cli, doc, case):
    """Each was a traceback (httpx's InvalidURL or ValueError, UnicodeEncodeError,
    OverflowError), or a key with a line break was said as "Cannot reach the server" with
    the key in it."""
    option, value, code, phrase = SERVER_OPTIONS[case]
    result = cli("ask", str(doc), "q?", "--backend", "openai", "--base-url", NOWHERE, option, value)
    assert_clean_failure(result, code, phrase)
    assert "Secret" not in result.stderr and len(result.stderr) < 1000


@pytest.mark.model
def test_more_threads_than_this_process_s_cpus_are_said_once(tiny_model, caplog):
    """llama.cpp with more threads than cores runs them in turns, 10-100x slower (512 on 2
    cores: a 3-step tiny reading took over 120 s): `--threads` past the CPUs this process
    may use is said, with what to do; as many as it may use are not."""
    import logging

    from memagent_cli import cpus
    from memagent_cli.backends.llama_cpp import LlamaCppBackend, LlamaOptions

    usable = cpus.usable()
    with caplog.at_level(logging.INFO, logger="memagent"):
        LlamaCppBackend(tiny_model, LlamaOptions(threads=usable))
        assert not [r for r in caplog.records if "--threads" in r.getMessage()]
        LlamaCppBackend(tiny_model, LlamaOptions(threads=usable + 1))
    said = [r.getMessage() for r in caplog.records if "--threads" in r.getMessage()]
    assert len(said) == 1 and f"--threads {usable + 1}" in said[0], said
    assert f"{usable} CPU" in said[0] and "leave --threads out" in said[0]


@pytest.mark.parametrize("threads", ["513", "100000", str(2**31)])
def test_more_threads_than_llama_cpp_can_run_is_a_usage_error(cli, doc, tmp_path, threads):
    """llama.cpp runs at most 512 (GGML_MAX_N_THREADS): 5,000 ended in libgomp's "Thread
    creation failed" with no sentence of memagent's, 100,000 in SIGSEGV; 2**31 wrapped."""
    for command in (["ask", str(doc), "q?"], ["inspect", str(doc)]):
        result = cli(*command, "--threads", threads, "-m", str(tmp_path / "none.gguf"))
        assert_clean_failure(result, 2, "Invalid value for '--threads'", "or equal to 512")
