"""memagent's folders and its document cache as a person reads them."""

from __future__ import annotations

from pathlib import Path

from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from memagent_cli.documents.cache import LIMIT_VARIABLE, Usage
from memagent_cli.folders import HOME_VARIABLE, home
from memagent_cli.views import console as display


def print_folders(found: dict[str, Path]) -> None:
    """One line per folder on stdout; on stderr, what decides where they are."""
    table = Table.grid(padding=(0, 2))
    for name, path in found.items():
        table.add_row(Text(name), Text(str(path)))
    display.results_console().print(table)
    root = home()
    if root is None:
        display.note(f"${HOME_VARIABLE} is not set: the platform's folders are used.")
    else:
        display.note(f"${HOME_VARIABLE} is {root}.")


def print_cache(usage: Usage) -> None:
    """What the document cache holds, on stdout."""
    table = Table.grid(padding=(0, 2))
    table.add_row("path", Text(str(usage.path)))
    table.add_row("documents", f"{usage.entries:,}")
    table.add_row("size", decimal(usage.bytes))
    limit = f"{decimal(usage.limit)} (${LIMIT_VARIABLE})" if usage.limit else "off (0)"
    table.add_row("limit", limit)
    display.results_console().print(table)


def cleared(usage: Usage) -> None:
    """What `cache clear` deleted."""
    documents = "document" if usage.entries == 1 else "documents"
    display.note(
        f"deleted {usage.entries:,} cached {documents} ({decimal(usage.bytes)}) from {usage.path}"
    )
