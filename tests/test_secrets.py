"""Secrets a user gives memagent (a PDF's password, a server's API key) never come back out:
not on stdout or stderr, not in a trace or any other file, not in the printed resume hint.
Both may come from the environment, and a terminal is asked for a missing PDF password. A
key goes only where the user sent it: the OpenAI SDK's $OPENAI_API_KEY with its
$OPENAI_BASE_URL, and any key sent unencrypted to another machine is warned of."""

from __future__ import annotations

import json
import os
import pty
import shlex
import subprocess
import termios
import time
from pathlib import Path

import pytest
from support import builders
from support.command import MEMAGENT, assert_clean_failure, words
from support.fake_openai import served
from support.story import story

from memagent_cli.backends.openai import in_the_clear, openai_api_key

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
    cli, env, fake_server, locked_pdf, tmp_path, spelling
):
    secrets = ("pdf-Secret-2718", "key-Secret-3141")
    fake_server.fail_after, fake_server.fail_status = 2, 400  # stops the run: a resume hint
    # An encrypted document's run keeps a trace (and so can resume) only when one is named.
    trace = ["--trace", str(tmp_path / "kept.jsonl")]
    stopped = cli("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS, *spelling, *trace))
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
    resumed = cli(*shlex.split(hint)[1:], "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and json.loads(resumed.stdout)["answer"]
    for secret in secrets:
        assert secret not in resumed.stdout + resumed.stderr
    assert files_holding(tmp_path, *secrets) == []


def test_both_secrets_come_from_the_environment(cli, env, fake_server, locked_pdf):
    refused = cli("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS))
    assert_clean_failure(refused, 1, "is encrypted; pass --password, or set MEMAGENT_PDF_PASSWORD")
    env.update(MEMAGENT_PDF_PASSWORD="pdf-Secret-2718", MEMAGENT_API_KEY="key-from-memagent-var")
    result = cli("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS), "-q")
    assert result.returncode == 0, result.stderr
    assert fake_server.authorizations == {"Bearer key-from-memagent-var"}
    result = cli("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS, "--no-reuse"))
    assert result.returncode == 0, result.stderr
    assert "unencrypted" not in result.stderr  # 127.0.0.1: the key never leaves this machine


def test_the_server_url_comes_from_openai_base_url(cli, env, fake_server, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(30))
    env["OPENAI_BASE_URL"] = fake_server.url
    result = cli("ask", str(doc), QUESTION, "--backend", "openai", *STEPS, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["path"] == fake_server.url
    assert fake_server.chat_calls > 0


def test_openai_api_key_goes_only_where_openai_base_url_points(cli, env, fake_server, tmp_path):
    """$OPENAI_API_KEY is the OpenAI SDK's key for $OPENAI_BASE_URL: a --base-url typed for
    another server (even on this machine) never gets it; memagent's own key goes anywhere."""
    doc = tmp_path / "doc.txt"
    doc.write_text(story(30))
    fake_server.api_key = "sdk-Secret-2236"
    env["OPENAI_API_KEY"] = "sdk-Secret-2236"

    typed = cli("ask", str(doc), QUESTION, *served(fake_server, *STEPS))
    assert_clean_failure(
        typed, 1, "answered HTTP 401 to /v1/models: Invalid API key; it may need a key: pass "
        "--api-key or set $MEMAGENT_API_KEY ($OPENAI_API_KEY goes only to $OPENAI_BASE_URL or "
        "api.openai.com)."
    )  # fmt: skip
    assert fake_server.authorizations == {""}
    env["MEMAGENT_BASE_URL"] = fake_server.url  # memagent's own variable is typed too
    assert cli("ask", str(doc), QUESTION, "--backend", "openai", *STEPS).returncode == 1
    assert fake_server.authorizations == {""}
    del env["MEMAGENT_BASE_URL"]

    env["OPENAI_BASE_URL"] = fake_server.url  # the SDK's pair: the key goes with its URL
    paired = cli("ask", str(doc), QUESTION, "--backend", "openai", *STEPS, "-q")
    assert paired.returncode == 0, paired.stderr
    assert fake_server.authorizations == {"", "Bearer sdk-Secret-2236"}
    again = cli("ask", str(doc), QUESTION, *served(fake_server, *STEPS, "--no-reuse", "-q"))
    assert again.returncode == 0, again.stderr  # typed, but the same server as the pair's

    del env["OPENAI_BASE_URL"]
    fake_server.api_key = "own-Secret-7071"  # a key given explicitly goes where it is sent
    for given, variable in (
        (["--api-key", "own-Secret-7071"], {}),
        ([], {"MEMAGENT_API_KEY": "own-Secret-7071"}),
    ):
        fake_server.authorizations.clear()
        env.update(variable)
        own = cli("ask", str(doc), QUESTION, *served(fake_server, *STEPS, *given, "--no-reuse"))
        assert own.returncode == 0, own.stderr
        assert fake_server.authorizations == {"Bearer own-Secret-7071"}
        assert "unencrypted" not in own.stderr  # 127.0.0.1
    for secret in ("sdk-Secret-2236", "own-Secret-7071"):
        assert files_holding(tmp_path, secret) == []


def test_the_rule_for_openai_api_key():
    sdk = {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://gpu-box:8000/v1"}
    assert openai_api_key("http://gpu-box:8000/v1", sdk) == "k"
    assert openai_api_key("http://GPU-BOX:8000", sdk) == "k"  # the same server
    assert openai_api_key("https://api.openai.com/v1", sdk) == "k"  # OpenAI's own key
    assert openai_api_key("https://api.openai.com/v1", {"OPENAI_API_KEY": "k"}) == "k"
    for elsewhere in (
        "http://gpu-box:8001/v1", "https://gpu-box:8000/v1", "http://127.0.0.1:8000/v1",
        "http://api.openai.com/v1", "https://api.openai.com.example.net/v1", "", None,
    ):  # fmt: skip
        assert openai_api_key(elsewhere, sdk) is None, elsewhere
    assert openai_api_key("http://gpu-box:8000/v1", {"OPENAI_API_KEY": "k"}) is None
    assert openai_api_key("https://api.openai.com/v1", {"OPENAI_BASE_URL": "x"}) is None


def test_what_crosses_a_network_in_the_clear():
    for mine in (
        "http://127.0.0.1:8080/v1", "http://127.8.9.10/v1", "http://[::1]:8080/v1",
        "http://localhost:8080", "http://LocalHost./v1", "https://gpu-box:8000/v1",
        "https://10.0.0.5/v1",
    ):  # fmt: skip
        assert not in_the_clear(mine), mine
    for theirs in (
        "http://10.0.0.5:8000/v1", "http://gpu-box:8000/v1", "http://[2001:db8::1]/v1",
        "http://192.0.2.1/v1", "http://localhost.example.com/v1", "http://128.0.0.1/v1",
    ):  # fmt: skip
        assert in_the_clear(theirs), theirs


def test_a_key_sent_over_plain_http_to_another_machine_is_warned_of(cli, env, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(story(30))
    far = "http://192.0.2.1:9/v1"  # TEST-NET-1: never answers, nothing leaves this machine
    result = cli(
        "ask", str(doc), QUESTION, "--backend", "openai", "--base-url", far, "--timeout", "1",
        "--api-key", "key-Secret-3141", "-q",
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        "warning: the API key goes unencrypted to http://192.0.2.1:9/v1 (plain http to another "
        "machine), where anyone on the way can read it; use https." in words(result.stderr)
    )
    assert "key-Secret-3141" not in result.stdout + result.stderr
    credentials = far.replace("http://", "http://reader:url-Secret-1618@")
    result = cli("ask", str(doc), QUESTION, "--backend", "openai", "--base-url", credentials,
                 "--timeout", "1")  # fmt: skip
    assert "warning: the user:password of the server URL goes unencrypted to " + far in words(
        result.stderr
    )
    assert "url-Secret-1618" not in result.stderr


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


def test_no_prompt_without_a_terminal(cli, locked_pdf):
    result = cli("inspect", str(locked_pdf), "--tokenizer", "tiktoken", input="guess\n")
    assert_clean_failure(result, 1, "locked.pdf is encrypted; pass --password")


def test_credentials_in_the_server_url_are_sent_but_never_shown(cli, env, fake_server, tmp_path):
    import base64

    doc = tmp_path / "doc.txt"
    doc.write_text(story(30))
    secret = "url-Secret-1618"
    url = fake_server.url.replace("http://", f"http://reader:{secret}@")
    fake_server.fail_after, fake_server.fail_status = 2, 400  # an error and a resume hint
    report = tmp_path / "report.html"
    stopped = cli(
        "ask", str(doc), QUESTION, "--backend", "openai", "--base-url", url, *STEPS,
        "--html", str(report),
    )  # fmt: skip
    assert_clean_failure(stopped, 1, f"The server at {fake_server.url[:-3]} answered HTTP 400")
    basic = base64.b64encode(f"reader:{secret}".encode()).decode()
    assert fake_server.authorizations == {f"Basic {basic}"}  # sent with every request
    assert secret not in stopped.stdout + stopped.stderr
    assert report.is_file() and files_holding(tmp_path, secret) == []  # trace, report, journal

    # The hint leaves the URL out and says so; it runs as printed with the URL in a variable.
    assert "(--base-url left out: give it again, or set $MEMAGENT_BASE_URL)" in words(
        stopped.stderr
    )
    hint = words(stopped.stderr).split("resume with: ")[1].split(" (")[0]
    assert "--base-url" not in hint
    fake_server.fail_after = None
    env["MEMAGENT_BASE_URL"] = url
    resumed = cli(*shlex.split(hint)[1:], "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert json.loads(resumed.stdout)["model"]["path"] == fake_server.url  # recorded without
    assert secret not in resumed.stdout + resumed.stderr
    assert files_holding(tmp_path, secret) == []

    # A URL without credentials stays in the hint as it was given.
    fake_server.fail_after = fake_server.chat_calls + 1
    plain = cli("ask", str(doc), "Who?", *served(fake_server, *STEPS))
    assert plain.returncode == 1 and f"--base-url {fake_server.url}" in words(plain.stderr)
    assert "left out" not in plain.stderr


def test_an_encrypted_documents_run_keeps_no_trace_and_the_hint_says_so(
    cli, env, fake_server, locked_pdf, tmp_path
):
    env["MEMAGENT_PDF_PASSWORD"] = "pdf-Secret-2718"
    plain = tmp_path / "plain.txt"
    plain.write_text(story(30))
    fake_server.fail_after, fake_server.fail_status = 2, 400
    alone = cli("ask", str(locked_pdf), QUESTION, *served(fake_server, *STEPS))
    assert_clean_failure(alone, 1, "Stopped after 2 of")
    said = words(alone.stderr)
    assert "locked.pdf is encrypted, so no trace is written" in said
    assert "its run cannot be resumed; --trace PATH keeps one" in said
    assert "resume with:" not in said  # nothing to resume
    assert "an encrypted document's run keeps no trace, so none resumes" in said
    assert not list(tmp_path.rglob("*.jsonl"))

    # With a plain document beside it, the hint resumes the plain one and says the other
    # starts again.
    fake_server.fail_after = fake_server.chat_calls + 2
    listed = tmp_path / "documents.txt"
    listed.write_text(f"{locked_pdf}\n{plain}\n")
    both = cli("ask", QUESTION, "--documents", str(listed), *served(fake_server, *STEPS))
    assert both.returncode == 1
    said = words(both.stderr)
    assert "resume with: memagent ask" in said
    assert "an encrypted document's run keeps no trace, so none resumes" in said
    (kept,) = (Path(env["XDG_DATA_HOME"]) / "memagent" / "traces").iterdir()
    assert "plain" in kept.name  # the plain document's trace, and no other


def test_eval_never_shows_the_api_key(cli, fake_server, tmp_path):
    data = tmp_path / "eval_50.json"
    cases = [
        {"_id": f"c{i}", "input": "Which word opens the text?", "answers": [word],
         "context": f"{word} opens this text. " + story(20, fact=None, seed=i)}
        for i, word in enumerate(["Paris", "Rome", "Oslo"])
    ]  # fmt: skip
    data.write_text(json.dumps(cases))
    out = tmp_path / "run.jsonl"
    secret = "key-Secret-3141"
    args = ["eval", str(data), *served(fake_server, *STEPS), "-o", str(out), "--api-key", secret]
    fake_server.fail_after, fake_server.fail_status = 3, 400  # the second case fails
    stopped = cli(*args)
    assert_clean_failure(stopped, 1, "run the same command again to continue")
    fake_server.fail_after = None
    finished = cli(*args, "--json")
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["cases"] == 3
    assert fake_server.authorizations == {f"Bearer {secret}"}  # the key was used
    for result in (stopped, finished):
        assert secret not in result.stdout + result.stderr
    assert files_holding(tmp_path, secret) == []  # results, traces, journal
