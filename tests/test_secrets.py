"""Secrets a user gives memagent (a PDF's password, a server's API key) never come back out:
not on stdout or stderr, not in a trace or any other file, not in the printed resume hint.
Both may come from the environment, and a terminal is asked for a missing PDF password."""

from __future__ import annotations

import json
import os
import pty
import shlex
import subprocess
import termios
import time
from pathlib import Path

import builders
import pytest
from conftest import MEMAGENT, assert_clean_failure, served, story, words

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
QUESTION = "Who repaired the barn?"


@pytest.fixture
def locked_pdf(tmp_path: Path) -> Path:
    """An AES-encrypted PDF of three pages, about 7 chunks of 300 tokens."""
    pages = [story(40, fact=None, seed=page) for page in range(3)]
    return builders.pdf(tmp_path / "locked.pdf", pages, password="pdf-Secret-2718")


def files_holding(folder: Path, *secrets: str) -> list[Path]:
    """Every file under `folder` whose bytes hold one of `secrets`."""
    return [
        path
        for path in folder.rglob("*")
        if path.is_file() and any(s.encode() in path.read_bytes() for s in secrets)
    ]


@pytest.mark.parametrize(
    "spelling",
    [
        ["--password=pdf-Secret-2718", "--api-key", "key-Secret-3141"],
        ["--password", "pdf-Secret-2718", "--api-key=key-Secret-3141"],
    ],
    ids=["password=,api-key", "password,api-key="],
)
def test_no_secret_given_on_the_command_line_comes_back_out(
    memagent, env, fake_server, locked_pdf, tmp_path, spelling
):
    secrets = ("pdf-Secret-2718", "key-Secret-3141")
    fake_server.fail_after, fake_server.fail_status = 2, 400  # stops the run: a resume hint
    stopped = memagent("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS, *spelling))
    assert_clean_failure(stopped, 1, "Stopped after 2 of", "resume with:")
    assert fake_server.authorizations == {"Bearer key-Secret-3141"}  # the key was used
    for secret in secrets:
        assert secret not in stopped.stdout + stopped.stderr
    assert files_holding(tmp_path, *secrets) == []  # traces, cache, anything written

    # The hint leaves both out, says so, and runs as printed with both in the environment.
    hint = words(stopped.stderr).split("resume with: ")[1].split(" (")[0]
    assert "--password" not in hint and "--api-key" not in hint
    assert (
        "(--password and --api-key left out: give them again, or set $MEMAGENT_PDF_PASSWORD "
        "and $MEMAGENT_API_KEY)" in words(stopped.stderr)
    )
    fake_server.fail_after = None
    env.update(MEMAGENT_PDF_PASSWORD=secrets[0], MEMAGENT_API_KEY=secrets[1])
    resumed = memagent(*shlex.split(hint)[1:], "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and json.loads(resumed.stdout)["answer"]
    for secret in secrets:
        assert secret not in resumed.stdout + resumed.stderr
    assert files_holding(tmp_path, *secrets) == []


def test_both_secrets_come_from_the_environment(memagent, env, fake_server, locked_pdf):
    refused = memagent("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS))
    assert_clean_failure(refused, 1, "is encrypted; pass --password, or set MEMAGENT_PDF_PASSWORD")
    env.update(MEMAGENT_PDF_PASSWORD="pdf-Secret-2718", OPENAI_API_KEY="key-from-openai-var")
    result = memagent("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS), "-q")
    assert result.returncode == 0, result.stderr
    assert fake_server.authorizations >= {"Bearer key-from-openai-var"}
    env["MEMAGENT_API_KEY"] = "key-from-memagent-var"  # memagent's own variable comes first
    result = memagent("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS, "--no-cache"))
    assert result.returncode == 0, result.stderr
    assert "Bearer key-from-memagent-var" in fake_server.authorizations


def test_the_server_url_comes_from_openai_base_url(memagent, env, fake_server, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(30))
    env["OPENAI_BASE_URL"] = fake_server.url
    result = memagent("ask", str(doc), QUESTION, "--backend", "openai", *STEPS, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["path"] == fake_server.url
    assert fake_server.chat_calls > 0


def test_a_terminal_is_asked_for_the_password_without_echo(env, fake_server, locked_pdf):
    """As on a terminal: stdin is a pty, so a missing password is asked for, hidden."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [str(MEMAGENT), "ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS)],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # no controlling terminal: getpass reads the pty on stdin
    )
    os.close(follower)
    try:
        deadline = time.monotonic() + 60
        # Type only once echo is off: the prompt flushes anything typed before it.
        while termios.tcgetattr(leader)[3] & termios.ECHO and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.05)
        os.write(leader, b"pdf-Secret-2718\n")
        echoed = _pending(leader)  # a terminal echoes as the line is typed, if echo is on
        stdout, stderr = process.communicate(timeout=120)
    finally:
        os.close(leader)
    assert process.returncode == 0, stderr
    assert "Password for locked.pdf:" in stderr
    assert stdout.strip() and "pdf-Secret-2718" not in stdout + stderr
    assert b"pdf-Secret-2718" not in echoed  # typed without echo


def _pending(fd: int) -> bytes:
    """What the terminal has written back so far (nothing once the other side closed)."""
    import select

    try:
        return os.read(fd, 4096) if select.select([fd], [], [], 0.2)[0] else b""
    except OSError:
        return b""


def test_no_prompt_without_a_terminal(memagent, locked_pdf):
    result = memagent("inspect", str(locked_pdf), "--tokenizer", "tiktoken", input="guess\n")
    assert_clean_failure(result, 1, "locked.pdf is encrypted; pass --password")
