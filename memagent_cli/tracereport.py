"""Traces for people and scripts elsewhere: the list of saved runs, and a Markdown report."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memagent_cli import display, trace
from memagent_cli.trace import Trace
from memagent_cli.traceview import about, changes, evidence, step_title


def listing() -> list[dict[str, Any]]:
    """One row per trace in the data folder, newest first. A trace that cannot be read is a
    row saying so (and why), so one bad file never hides the others."""
    rows = []
    for path in trace.recent_traces():
        try:
            loaded = trace.read_trace(path)
        except trace.TraceError as exc:
            display.warn(f"{path.name} cannot be read: {exc.message}")
            rows.append({"path": str(path), "status": "unreadable", "error": exc.message})
            continue
        header, status = loaded.header, loaded.status
        rows.append(
            {
                "path": str(path),
                "created": header.created,
                "document": header.document["path"],
                "question": header.question,
                "model": header.model["name"],
                "steps_done": status.done,
                "steps_total": status.total,
                "status": status.state,
                "interrupted": status.reason,
                "answer": loaded.final.answer if loaded.final else None,
            }
        )
    return rows


def _when(created: str | None, path: Path) -> str:
    try:
        moment = datetime.fromisoformat(created or "").astimezone()
    except ValueError:
        try:
            moment = datetime.fromtimestamp(path.stat().st_mtime)
        except OSError:
            return "?"
    return moment.strftime("%Y-%m-%d %H:%M")


def _one_line(value: Any) -> Text:
    return Text(" ".join(str(value or "").split()))


def print_listing(out: Console, rows: list[dict[str, Any]]) -> None:
    """The list of traces as a table."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("when", no_wrap=True)
    for name in ("document", "question"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("model", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("answer", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("trace", no_wrap=True)
    for row in rows:
        path = Path(row["path"])
        name = Text(path.name, style="dim")
        if row["status"] == "unreadable":
            table.add_row(_when(None, path), "", "", "", "", Text("unreadable", "red"), "", name)
            continue
        status = row["status"] + (f" ({row['interrupted']})" if row["interrupted"] else "")
        table.add_row(
            _when(row["created"], path),
            Text(Path(row["document"]).name),
            _one_line(row["question"]),
            _one_line(row["model"]),
            f"{row['steps_done']}/{row['steps_total']}",
            Text(status, style="green" if row["status"] == "finished" else "yellow"),
            _one_line(row["answer"]),
            name,
        )
    out.print(table)


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks inside `text`."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _md(text: str) -> str:
    """`text` safe to put inline in Markdown."""
    return re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", " ".join(text.split()))


def _block(text: str) -> str:
    fence = _fence(text)
    return f"{fence}text\n{text.strip()}\n{fence}\n"


def markdown(loaded: Trace) -> str:
    """A report of the run a person can read or share."""
    lines = [f"# {_md(loaded.header.question) or 'memagent trace'}", ""]
    final = loaded.final
    if final is not None:
        answer = _md(final.answer) if final.answer is not None else "(none)"
        lines.append(f"- **Answer:** {answer}")
        if where := evidence(loaded):
            lines.append(f"- **Evidence:** {_md(where)}")
    else:
        lines.append(f"- **Status:** {_md(str(loaded.status))}")
    for label, text in about(loaded):
        if label != "question":
            lines.append(f"- **{label.capitalize()}:** {_md(text)}")
    lines += ["", "## Memory at each step", ""]
    for record, (added, removed) in zip(loaded.steps, changes(loaded), strict=True):
        lines += [
            f"### S{_md(step_title(record))[1:]}",
            "",
            f"{record.completion_tokens} memory tokens, +{added} -{removed} words.",
            "",
            _block(record.memory),
        ]
    if final is not None:
        lines += ["## Final reply", "", _block(final.reply)]
    return "\n".join(lines)
