"""The command line as a user meets it: help, version, and bad input (no model generation)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import FACT_QUESTION, story


@pytest.fixture
def doc(tmp_path):
    """A one-word document, for failures that happen before any reading."""
    path = tmp_path / "doc.txt"
    path.write_text("text")
    return path


def assert_clean_failure(result, code: int, *phrases: str) -> None:
    """One clear message on stderr, nothing on stdout, no traceback."""
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in " ".join(result.stderr.split()), result.stderr


def test_version(memagent):
    result = memagent("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("memagent 0.")


def test_help_describes_every_command(memagent):
    result = memagent("--help")
    assert result.returncode == 0
    assert "ask" in result.stdout and "Read DOCUMENT chunk by chunk" in result.stdout


def test_ask_help_lists_llama_cpp_spellings(memagent):
    text = memagent("ask", "--help").stdout
    for option in ("--chunk-tokens", "--memory-tokens", "-ngl", "-t", "-m", "--json", "--trace"):
        assert option in text


def test_python_dash_m_works(env):
    result = subprocess.run(
        [sys.executable, "-m", "memagent_cli", "--version"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0 and result.stdout.startswith("memagent ")


def test_missing_document(memagent, tmp_path):
    result = memagent("ask", str(tmp_path / "nope.txt"), "q?")
    assert_clean_failure(result, 1, "Document not found", "nope.txt")


def test_a_folder_without_documents(memagent, tmp_path):
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert_clean_failure(memagent("ask", str(tmp_path), "q?"), 1, "holds no supported documents")
    assert_clean_failure(memagent("inspect", str(tmp_path)), 1, "is a directory")


def test_empty_document(memagent, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("  \n\n \t")
    assert_clean_failure(memagent("ask", str(path), "q?"), 1, "The document is empty")


def test_empty_stdin(memagent):
    result = memagent("ask", "-", "q?", input="")
    assert_clean_failure(result, 1, "The document is empty", "stdin")


def test_no_question(memagent, doc):
    assert_clean_failure(memagent("ask", str(doc)), 2, "at least one question")


def test_missing_model_file(memagent, tmp_path, doc):
    result = memagent("ask", str(doc), "q?", "--model", str(tmp_path / "missing.gguf"))
    assert_clean_failure(result, 1, "Model not found", "missing.gguf", "registry name")


def test_missing_model_from_env(memagent, env, doc):
    env["MEMAGENT_MODEL"] = "no-such-model"
    result = memagent("ask", str(doc), "q?")
    assert_clean_failure(result, 1, "$MEMAGENT_MODEL no-such-model", "known names")


def test_registry_model_not_downloaded(memagent, doc):
    result = memagent("ask", str(doc), "q?", "-m", "memagent-7b")
    assert_clean_failure(result, 1, "memagent-7b is known", "convert_hf_to_gguf.py")


def test_non_gguf_model(memagent, tmp_path, doc):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    result = memagent("ask", str(doc), "q?", "-m", str(fake))
    assert_clean_failure(result, 1, "is not a GGUF model file")


def test_truncated_gguf_model(memagent, tmp_path, doc):
    from conftest import default_model_path

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(default_model_path().read_bytes()[:4096])
    result = memagent("ask", str(doc), "q?", "-m", str(broken))
    assert_clean_failure(result, 1, "llama.cpp could not load")


@pytest.mark.parametrize("option", ["--chunk-tokens", "--memory-tokens"])
def test_zero_tokens_is_a_usage_error(memagent, option, doc):
    result = memagent("ask", str(doc), "q?", option, "0")
    assert_clean_failure(result, 2, "Invalid value", option)


def test_a_step_larger_than_the_model_context(memagent, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(50))
    result = memagent("ask", str(doc), FACT_QUESTION, "--chunk-tokens", "9000")
    assert_clean_failure(result, 1, "context holds 8192", "lower --chunk-tokens or --memory-tokens")


def test_a_question_too_long(memagent, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(50))
    result = memagent("ask", str(doc), "why " * 6000)
    assert_clean_failure(result, 1, "question is too long")


def test_questions_file_missing(memagent, tmp_path, doc):
    result = memagent("ask", str(doc), "--questions", str(tmp_path / "q.txt"))
    assert_clean_failure(result, 1, "Questions file not found")


def test_an_unknown_backend(memagent, doc):
    result = memagent("ask", str(doc), "q?", "--backend", "bogus")
    assert_clean_failure(result, 2, "--backend", "choose llama or openai")


def test_parallel_needs_a_server(memagent, doc):
    result = memagent("ask", str(doc), "q?", "--parallel", "2")
    assert_clean_failure(result, 2, "--parallel needs --backend openai")
