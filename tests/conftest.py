"""Shared helpers: run the real `memagent` command, and build real documents."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

MEMAGENT = Path(sys.executable).with_name("memagent")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
# The README's example document; tests import FACT and story from here.
from village import FACT, story  # noqa: E402, F401

FACT_QUESTION = "What is the secret password for the vault?"
FACT_VALUE = "PELICAN"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user with no settings of their own and a private data folder."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMAGENT_")}
    clean["XDG_DATA_HOME"] = str(tmp_path / "data")
    clean["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    clean["COLUMNS"] = "120"
    return clean


@pytest.fixture
def memagent(env: dict[str, str]):
    """Run the installed `memagent` command as a user would; returns the finished process."""

    def run(
        *args: str, input: str | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(MEMAGENT), *args],
            input=input if input is not None else "",
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )

    return run


def default_model_path() -> Path:
    from memagent_cli import models

    return models.resolve(None).path


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
