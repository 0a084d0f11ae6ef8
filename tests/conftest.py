"""Shared helpers: run the real `memagent` command, and build real documents."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

MEMAGENT = Path(sys.executable).with_name("memagent")

FACT = "The secret password for the vault is PELICAN."
FACT_QUESTION = "What is the secret password for the vault?"
FACT_VALUE = "PELICAN"


def story(sentences: int, fact: str | None = FACT, seed: int = 1) -> str:
    """Plain sentences (about 11 model tokens each) with `fact` as the first one.

    SmolLM2-135M reliably copies a fact that opens its first chunk into memory and keeps
    it; one planted mid-document is lost. Tests build on what the model can do.
    """
    rng = random.Random(seed)
    subjects = ["The old miller", "A young sailor", "The village baker", "Her neighbour",
                "The quiet teacher", "A tired farmer", "The town clerk", "His sister"]
    verbs = ["walked to", "looked at", "painted", "cleaned", "visited", "talked about",
             "repaired", "counted the birds near"]
    places = ["the stone bridge", "the green field", "the small harbour", "the red barn",
              "the market square", "the wooden fence", "the long road", "the church tower"]
    times = ["in the morning", "after lunch", "before the rain", "on Sunday", "at dusk",
             "during the fair", "in early spring", "late at night"]
    lines = [fact] if fact else []
    for _ in range(sentences):
        lines.append(
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(places)} "
            f"{rng.choice(times)}."
        )
    return " ".join(lines)


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

    def run(*args: str, input: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
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
