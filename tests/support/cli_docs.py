"""Keep docs/cli.md equal to `--help`: the page is every command's and subcommand's own
`--help`, verbatim (as a terminal 110 columns wide shows it), under a heading for each.

    python tests/support/cli_docs.py          # write docs/cli.md again (`make docs`)
    python tests/support/cli_docs.py --check  # exit 1 if docs/cli.md differs (tests/test_shell.py)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer.main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_HEAD = """\
# Command reference

<!-- Made from the commands' own --help by `make docs` (tests/support/cli_docs.py); do not edit:
tests/test_shell.py fails when this page differs from `--help`. -->

Every command and subcommand of `memagent`, as its `--help` prints it. Every command takes
`-h` as well as `--help`. What the commands do, with examples: [asking](asking.md),
[traces](traces.md), [models](models.md), [evaluation](eval.md), [where files
go](configuration.md).
"""


def root() -> Any:
    """The (click) group `memagent` runs."""
    from memagent_cli.cli import app

    return typer.main.get_command(app)


def command(path: str) -> Any:
    """The (click) command `memagent PATH` runs: "ask", "models list"."""
    found = root()
    for name in path.split():
        found = found.commands[name]
    return found


def every_command() -> list[str]:
    """Every command and group, top first, as the words after `memagent` ("" for itself)."""
    found: list[str] = []

    def walk(group: Any, words: list[str]) -> None:
        found.append(" ".join(words))
        for name, sub in getattr(group, "commands", {}).items():
            if not sub.hidden:
                walk(sub, [*words, name])

    walk(root(), [])
    return found


# The width of the page's help: wide enough for ask's option panels without wrapping most
# choice lists, narrow enough to read on GitHub without scrolling far.
WIDTH = 110


def help_text(path: str) -> str:
    """`memagent PATH --help` as a terminal WIDTH columns wide prints it, without colour and
    without the spaces that pad each line to the width."""
    from typer import rich_utils
    from typer.testing import CliRunner

    from memagent_cli.cli import app

    saved = rich_utils.MAX_WIDTH, rich_utils.FORCE_TERMINAL, rich_utils.COLOR_SYSTEM
    rich_utils.MAX_WIDTH, rich_utils.FORCE_TERMINAL, rich_utils.COLOR_SYSTEM = WIDTH, False, None
    try:
        result = CliRunner().invoke(
            app, [*path.split(), "--help"], prog_name="memagent", env={"NO_COLOR": "1"}
        )
    finally:
        rich_utils.MAX_WIDTH, rich_utils.FORCE_TERMINAL, rich_utils.COLOR_SYSTEM = saved
    if result.exit_code != 0:
        raise RuntimeError(f"memagent {path} --help failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.splitlines()).strip("\n")


def section(path: str) -> str:
    """One command's part of the page: a heading to link to, then its help, verbatim."""
    level = "#" * min(2 + len(path.split()), 4) if path else "##"
    return f"{level} memagent{' ' + path if path else ''}\n\n```text\n{help_text(path)}\n```\n"


def reference() -> str:
    """docs/cli.md as the commands make it."""
    return _HEAD + "".join("\n" + section(path) for path in every_command())


def main() -> int:
    new = reference()
    if "--check" in sys.argv[1:]:
        if not PAGE.exists() or PAGE.read_text() != new:
            print("docs/cli.md differs from --help: run `make docs`.", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
