"""Keep docs/cli.md equal to `--help`: the page is made from the commands themselves, every
command and subcommand with its usage, arguments and options, grouped in its help panels.

    python tests/cli_docs.py          # write docs/cli.md again (`make docs`)
    python tests/cli_docs.py --check  # exit 1 if docs/cli.md differs (tests/test_shell.py)
"""

from __future__ import annotations

import re
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import typer.main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
_DEFAULT = re.compile(r"\s*\\?\[default: (?P<default>[^\]]*)\]\.?")
_HEAD = """\
# Command reference

<!-- Made from the commands' own options by `make docs` (tests/cli_docs.py); do not edit:
tests/test_shell.py fails when this page differs from `--help`. -->

Every command and subcommand of `memagent`, as its `--help` describes it. Every command
takes `-h` as well as `--help`. What the commands do, with examples: [asking](asking.md),
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


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _sentence(help_text: str) -> str:
    what = _cell(_DEFAULT.sub("", help_text).replace("\\[", "["))
    return what + ("" if what.endswith(".") or not what else ".")


def _names(option: Any) -> str:
    names = ", ".join(f"`{name}`" for name in option.opts)
    if option.metavar:  # a choice's metavar is its choices, a|b: escaped for the table
        shown = f"`{option.opts[0]} {option.metavar}`".replace("|", "\\|")
        names = names.replace(f"`{option.opts[0]}`", shown, 1)
    if option.secondary_opts:
        names += " / " + ", ".join(f"`{name}`" for name in option.secondary_opts)
    return names


def _default(option: Any, help_text: str) -> str:
    """What the option is when it is not given: its variables, then its default."""
    found = _DEFAULT.search(help_text)
    value = found["default"] if found else ""
    if not found and option.show_default is not False and option.default is not None:
        default = option.default
        if option.secondary_opts:
            value = option.opts[0] if default else option.secondary_opts[0]
        elif isinstance(default, Enum):
            value = str(default.value)
        elif isinstance(default, float):
            value = f"{default:g}"
        elif not isinstance(default, bool):
            value = str(default)
    variables = option.envvar if isinstance(option.envvar, list) else [option.envvar]
    shown = [f"`${name}`" for name in variables if name]
    if value:
        shown.append(f"`{value}`" if not found else value)
    return ", else ".join(shown)


def _argument_name(argument: Any) -> str:
    name = argument.metavar or argument.name.upper()
    if argument.nargs == -1 and not name.endswith("..."):
        name += "..."
    return name if argument.required else f"[{name}]"


def usage(path: str) -> str:
    """`memagent PATH [OPTIONS] ARGUMENTS`, as a person types it."""
    found = command(path)
    words = ["memagent", *path.split(), "[OPTIONS]"]
    if hasattr(found, "commands"):
        words.append("COMMAND [ARGS]...")
    words += [_argument_name(p) for p in found.params if p.param_type_name == "argument"]
    return " ".join(words)


def arguments(path: str) -> str:
    """The arguments of `memagent PATH` as a Markdown table, or "" when it takes none."""
    found = command(path)
    rows = []
    for argument in found.params:
        if argument.param_type_name != "argument":
            continue
        what = _sentence(argument.help or "")
        kind = argument.type_descriptor.annotation
        if isinstance(kind, type) and issubclass(kind, Enum):  # a choice: `paths FOLDER`
            what += " One of: " + ", ".join(f"`{choice.value}`" for choice in kind) + "."
        default = _DEFAULT.search(argument.help or "")
        rows.append(
            f"| `{_argument_name(argument)}` | {default['default'] if default else ''} | {what} |"
        )
    if not rows:
        return ""
    return "| argument | default | what it is |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def table(path: str) -> str:
    """The options of `memagent PATH` as Markdown tables, one per help panel."""
    panels: dict[str, list[str]] = {}
    for option in command(path).params:
        if option.param_type_name != "option" or option.hidden:
            continue
        help_text = option.help or ""
        row = f"| {_names(option)} | {_cell(_default(option, help_text))} | "
        row += _sentence(help_text) + " |"
        panels.setdefault(getattr(option, "rich_help_panel", None) or "Options", []).append(row)
    parts = []
    for panel, rows in panels.items():
        head = f"**{panel}**\n\n" if len(panels) > 1 else ""
        parts.append(
            head + "| option | default | what it does |\n|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


def _summary(found: Any) -> str:
    """The first paragraph of a command's help, on one line."""
    return _cell((found.help or "").split("\n\n")[0])


def section(path: str) -> str:
    """One command's part of the page: its heading, usage, help, arguments and options."""
    found = command(path)
    level = "#" * min(2 + len(path.split()), 4) if path else "##"
    parts = [
        f"{level} memagent{' ' + path if path else ''}",
        f"```text\n{usage(path)}\n```",
        (found.help or "").replace("\\[", "[").strip(),
    ]
    if hasattr(found, "commands"):
        listed = [
            f"- `memagent {path + ' ' if path else ''}{name}`: {_summary(sub)}"
            for name, sub in found.commands.items()
            if not sub.hidden
        ]
        parts.append("\n".join(listed))
    if argument_table := arguments(path):
        parts.append(argument_table.rstrip("\n"))
    parts.append(table(path).rstrip("\n"))
    return "\n\n".join(part for part in parts if part) + "\n"


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
