"""Run `memagent` as a user would, and check what the user reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

# The installed command beside this Python (the venv's console script).
MEMAGENT = Path(sys.executable).with_name("memagent")


def run_memagent(
    env: dict[str, str], *args: str, input: str | None = None, timeout: float = 900, umask: int = -1
) -> subprocess.CompletedProcess:
    """Run the installed `memagent` command with `env`; returns the finished process."""
    return subprocess.run(
        [str(MEMAGENT), *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        umask=umask,  # -1: this process's
    )


class InProcess:
    """`memagent` run inside the test's process through Typer's test runner: the same
    commands, options and exit codes as the installed command, without starting Python and
    importing memagent again for each call (0.6 s each, most of the time of tests that make
    dozens of calls). What only a process has stays with `memagent`: the console script,
    `crash.install()`, signals, and a time limit (a call given `timeout` runs as a process)."""

    def __init__(self, env: dict[str, str], process: Callable[..., subprocess.CompletedProcess]):
        self.env = env
        self.process = process

    def __call__(
        self, *args: str, input: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess:
        if timeout is not None:
            return self.process(*args, input=input, timeout=timeout)
        from typer.testing import CliRunner

        from memagent_cli.cli import app

        saved, argv = dict(os.environ), sys.argv
        sigterm = signal.getsignal(signal.SIGTERM)
        os.environ.clear()
        os.environ.update(self.env)
        sys.argv = [str(MEMAGENT), *args]  # the "resume with:" hint repeats the command line
        try:
            result = CliRunner().invoke(app, list(args), input=input or "", prog_name="memagent")
        finally:
            os.environ.clear()
            os.environ.update(saved)
            sys.argv = argv
            signal.signal(signal.SIGTERM, sigterm)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception  # a traceback the installed command would have printed
        return subprocess.CompletedProcess(
            ["memagent", *args], result.exit_code, result.stdout, result.stderr
        )


def words(text: str) -> str:
    """`text` with its whitespace collapsed, as a check of what a user reads."""
    return " ".join(text.split())


def assert_clean_failure(result: subprocess.CompletedProcess, code: int, *phrases: str) -> None:
    """One clear message on stderr, nothing on stdout, no traceback."""
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in words(result.stderr), result.stderr


def interrupt_after_steps(
    args: list[str],
    trace_path: Path,
    env: dict[str, str],
    steps: int,
    sig: int = signal.SIGINT,
    interrupt: Callable[[subprocess.Popen], None] | None = None,
) -> tuple[subprocess.Popen, str, str]:
    """Start `memagent ask ARGS`, send `sig` (or call `interrupt(process)`) once `steps` steps
    are in its trace (as a terminal delivers Ctrl-C: to a process started from Python), and
    let it end."""
    process = subprocess.Popen(
        [str(MEMAGENT), "ask", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        try:  # memagent probes that it can write the trace: the file may come and go once
            if trace_path.read_text().count('"type": "step"') >= steps:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    if interrupt is None:
        process.send_signal(sig)
    else:
        interrupt(process)
    stdout, stderr = process.communicate(timeout=180)
    return process, stdout, stderr
