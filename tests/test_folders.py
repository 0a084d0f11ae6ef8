"""One setting for all of memagent's files: $MEMAGENT_HOME holds the models, traces, eval
results and the cache, and `memagent paths` says where each is."""

from __future__ import annotations

import json
from pathlib import Path

from support import builders
from support.fake_openai import served
from support.story import story

STEPS = ["--chunk-tokens", "300", "--memory-tokens", "64", "--temperature", "0"]
FOLDERS = [
    *("data", "models", "traces", "batches", "evals", "calibrations"),
    *("cache", "documents", "tiktoken"),
]


def test_paths_follow_the_platform_folders_by_default(cli, env):
    del env["MEMAGENT_HOME"]  # the suite's isolation
    result = cli("paths", "--json")
    assert result.returncode == 0, result.stderr
    found = {name: Path(path) for name, path in json.loads(result.stdout).items()}
    assert list(found) == FOLDERS
    data, cache = Path(env["XDG_DATA_HOME"]) / "memagent", Path(env["XDG_CACHE_HOME"]) / "memagent"
    assert found["data"] == data and found["cache"] == cache
    assert found["traces"] == data / "traces" and found["documents"] == cache / "documents"
    assert found["batches"] == data / "batches"  # the journals of `ask library/` and eval
    assert found["calibrations"] == data / "calibrations"  # backends/calibration_store.py
    table = cli("paths")
    assert table.returncode == 0 and "MEMAGENT_HOME is not set" in table.stderr
    assert [line.split()[0] for line in table.stdout.splitlines()] == FOLDERS


def test_memagent_home_holds_everything_a_run_writes(cli, env, fake_server, tmp_path):
    home = tmp_path / "memagent-home"
    env["MEMAGENT_HOME"] = str(home)
    shown = json.loads(cli("paths", "--json").stdout)
    assert all(Path(path).is_relative_to(home) for path in shown.values()), shown
    assert shown["models"] == str(home / "models") and shown["cache"] == str(home / "cache")
    assert shown["batches"] == str(home / "batches")
    one = cli("paths", "traces")
    assert one.returncode == 0 and one.stdout == f"{home / 'traces'}\n"

    book = builders.pdf(tmp_path / "book.pdf", [story(60, fact=None), story(60, seed=2)])
    result = cli("ask", str(book), "Who?", *served(fake_server, *STEPS), "--json", "-q")
    assert result.returncode == 0, result.stderr
    assert Path(json.loads(result.stdout)["trace"]).parent == home / "traces"
    written = {p.relative_to(home).parent for p in home.rglob("*") if p.is_file()}
    assert written == {Path("traces"), Path("cache/documents")}  # tiktoken: read in place
    # Nothing went to the platform's folders.
    assert not (tmp_path / "data").exists() and not (tmp_path / "cache").exists()
    listed = cli("trace", "--list", "--json")
    assert [Path(row["path"]).parent for row in json.loads(listed.stdout)] == [home / "traces"]
