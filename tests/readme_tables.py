"""Keep the README's option tables equal to `--help`: each table between
`<!-- options: COMMAND -->` and `<!-- /options -->` is made from the command's own options,
grouped in its help panels.

    python tests/readme_tables.py          # rewrite the tables in README.md (`make readme`)
    python tests/readme_tables.py --check  # exit 1 if a table differs (tests/test_shell.py)
"""

from __future__ import annotations

import re
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import typer.main

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(
    r"(<!-- options: (?P<command>[a-z ]+) -->\n)(?P<table>.*?)(<!-- /options -->)", re.S
)
_DEFAULT = re.compile(r"\s*\\?\[default: (?P<default>[^\]]*)\]\.?")


def command(path: str) -> Any:
    """The (click) command `memagent PATH` runs: "ask", "models list"."""
    from memagent_cli.cli import app

    found = typer.main.get_command(app)
    for name in path.split():
        found = found.commands[name]
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _names(option: Any) -> str:
    names = ", ".join(f"`{name}`" for name in option.opts)
    if option.metavar:
        names = names.replace(f"`{option.opts[0]}`", f"`{option.opts[0]} {option.metavar}`", 1)
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


def table(path: str) -> str:
    """The options of `memagent PATH` as Markdown tables, one per help panel."""
    panels: dict[str, list[str]] = {}
    for option in command(path).params:
        if option.param_type_name != "option" or option.hidden:
            continue
        help_text = option.help or ""
        row = f"| {_names(option)} | {_cell(_default(option, help_text))} | "
        what = _cell(_DEFAULT.sub("", help_text).replace("\\[", "["))
        row += what + ("" if what.endswith(".") or not what else ".") + " |"
        panels.setdefault(getattr(option, "rich_help_panel", None) or "Options", []).append(row)
    parts = []
    for panel, rows in panels.items():
        head = f"**{panel}**\n\n" if len(panels) > 1 else ""
        parts.append(
            head + "| option | default | what it does |\n|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(parts) + "\n"


def updated(text: str) -> str:
    """`text` (a README) with every option table made again from the CLI."""
    return _BLOCK.sub(lambda m: m[1] + table(m["command"]) + m[4], text)


def main() -> int:
    text = README.read_text()
    new = updated(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print(
                "README.md's option tables differ from --help: run `make readme`.", file=sys.stderr
            )
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
