"""`memagent models list` and `info` as a person reads them, on stdout."""

from __future__ import annotations

from pathlib import Path

from rich.filesize import decimal
from rich.markup import escape
from rich.table import Table

from memagent_cli import readers
from memagent_cli.models import Listed
from memagent_cli.models.removal import Removal
from memagent_cli.views import console as display


def _short(path: Path | None) -> str:
    """The path with the home folder as ~, to keep the table narrow."""
    return escape(display.home_relative(path))


def print_catalogue(rows: list[Listed]) -> None:
    """One row per model: what it is for, its size (or what a pull downloads), and its file
    (or how to get it). `models info` shows the rest of its header."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("name", "size", "quant", "context", "what it is"):
        table.add_column(column, justify="right" if column in ("size", "context") else "left")
    table.add_column("file", overflow="fold")  # a path cut short is no use
    for row in rows:
        name = escape(row.name) + (" (default)" if row.default else "")
        about = escape(row.summary)
        if not readers.implied(row.reader):  # the readers after MemAgent say so
            about += f" (--reader {escape(row.reader)})"
        if row.info is None:
            if row.path is None:
                size = f"{decimal(row.download)} to pull" if row.download else ""
                table.add_row(name, size, "", "", about, "not downloaded")
            else:
                table.add_row(name, "", "", "", "broken (below)", _short(row.path))
            continue
        info = row.info
        table.add_row(
            name,
            decimal(info.size),
            escape(info.quantization),
            f"{info.context_length:,}" if info.context_length else "?",
            about,
            _short(row.path),
        )
    display.results_console().print(table)
    for row in rows:  # how to get a missing model, or why a file is unreadable
        if row.note:
            text = f"{row.name} is not downloaded: {row.note}" if row.path is None else row.note
            (display.note if row.path is None else display.warn)(text)


def print_info(row: Listed) -> None:
    """Every header fact of one model, then its chat template."""
    info = row.info
    assert info is not None
    facts = {
        "name": row.name,
        "file": str(row.path),
        "size": f"{decimal(info.size)} ({info.size:,} bytes"
        + (f", {info.parts} parts)" if info.parts > 1 else ")"),
        "architecture": info.architecture,
        "quantization": info.quantization,
        "context": f"{info.context_length:,} tokens (trained)" if info.context_length else "?",
        "chat template": "yes" if info.chat_template else "no (memagent needs one)",
        "general.name": info.name,
        "parameters": info.size_label,
        "layers": str(info.layers or "?"),
        "vocabulary": f"{info.vocabulary:,} tokens" if info.vocabulary else "?",
        "tensors": f"{info.tensors:,}",
        "reader": f"{row.reader} (--reader {row.reader}; docs/readers.md)",
        "description": row.description,
    }
    grid = Table.grid(padding=(0, 2))
    grid.add_column()
    grid.add_column(overflow="fold")
    for key, value in facts.items():
        if value:
            grid.add_row(key, escape(value))
    out = display.results_console()
    out.print(grid)
    if info.chat_template:
        out.print()
        out.print("chat template:", style="bold")
        out.print(escape(info.chat_template), soft_wrap=True)


def print_removal(removal: Removal) -> None:
    """Each path removed with its size, then the total freed."""
    out = display.results_console()
    for path, size in removal.removed:
        out.print(f"removed {escape(str(path))} ({decimal(size)})", highlight=False, soft_wrap=True)
    out.print(f"freed {decimal(removal.freed)}", highlight=False)
