"""A saved run on a terminal: its summary, a step's memory, a step's diff, grep, follow, and
the list of traces. Rich renderers of typed trace records; the sentences are wording.py's,
the diffs diffs.py's."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memagent_cli import protocol, trace
from memagent_cli.errors import UserError
from memagent_cli.trace import StepRecord, Trace
from memagent_cli.views import console as display
from memagent_cli.views.traces.diffs import changes, word_change, word_diff
from memagent_cli.views.traces.wording import (
    about,
    evidence,
    presence,
    reader_actions,
    step_title,
    stopped,
)


def load(path: Path) -> Trace:
    """The trace at `path`, with a warning on stderr for every part that could not be read."""
    loaded = trace.read_trace(path)
    warn_problems(loaded)
    return loaded


def warn_problems(loaded: Trace) -> None:
    for problem in loaded.problems:
        display.warn(f"{loaded.path}: {problem}.")
    if loaded.problems:
        display.note("Showing the trace as far as it goes.")


def _position(loaded: Trace, number: int) -> int:
    """The position in the trace of step `number`, counted from 1."""
    if not loaded.steps:
        raise UserError(f"{loaded.path} has no steps yet ({loaded.status}).")
    if not 1 <= number <= len(loaded.steps):
        count = len(loaded.steps)
        has = "only step 1" if count == 1 else f"steps 1 to {count}"
        raise UserError(
            f"There is no step {number}: {loaded.path} has {has} (step 1 reads the first chunk)."
        )
    return number - 1


def _labelled(out: Console, label: str, text: str, style: str = "bold") -> None:
    out.print(Text.assemble((f"{label}: ", style), text), soft_wrap=True)


def _plain(out: Console, text: str, style: str = "") -> None:
    out.print(Text(text, style=style), soft_wrap=True)


def summary(out: Console, loaded: Trace) -> None:
    """The run, a table of its steps, and its answer or how far it got."""
    for label, text in about(loaded):
        _labelled(out, label.capitalize(), text)
    out.print()
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("step", justify="right")
    table.add_column("span")
    table.add_column("memory tokens", justify="right")
    table.add_column("changed words", justify="right")
    table.add_column("seconds", justify="right")
    for record, (added, removed) in zip(loaded.steps, changes(loaded), strict=True):
        table.add_row(
            str(record.index + 1),
            Text(record.span),
            f"{record.completion_tokens:,}",
            Text.assemble((f"+{added}", "green"), " ", (f"-{removed}", "red")),
            f"{record.seconds:.1f}",
        )
    out.print(table)
    out.print()
    final = loaded.final
    if final is None:
        _labelled(out, "Unfinished", str(loaded.status), "bold yellow")
        return
    if final.answer is None:
        _labelled(out, "Answer", "(none in \\boxed{}; the reply follows)")
        _plain(out, final.reply.strip())
    else:
        _labelled(out, "Answer", final.answer, "bold green")
    if early := stopped(loaded):  # a reader that answered before the last chunk
        _labelled(out, "Stopped early", early)
    if where := evidence(loaded):
        _labelled(out, "Evidence", where)


def step(out: Console, loaded: Trace, number: int) -> None:
    """The whole memory after step `number`."""
    record = loaded.steps[_position(loaded, number)]
    title = f"memory after {step_title(record)} ({record.completion_tokens} tokens)"
    _plain(out, title, "bold")
    _plain(out, record.memory)
    for label, text in reader_actions(loaded, record):  # a reader after MemAgent (readers/)
        _labelled(out, label.capitalize(), text)


def _word_diff(before: str, after: str, colour: bool) -> Text:
    """`after` with the words `before` lost struck out; marked [-..-] {+..+} without colour."""
    text = Text()
    for kind, piece in word_diff(before, after):
        if kind == "-":
            text.append(piece if colour else f"[-{piece}-]", "red strike")
        elif kind == "+":
            text.append(piece if colour else f"{{+{piece}+}}", "green")
        else:
            text.append(piece)
    return text


def diff(out: Console, loaded: Trace, number: int) -> None:
    """What step `number` changed in the memory, word by word."""
    n = _position(loaded, number)
    record = loaded.steps[n]
    before = protocol.INITIAL_MEMORY if n == 0 else loaded.steps[n - 1].memory
    added, removed = word_change(before, record.memory)
    against = "the initial memory" if n == 0 else f"step {n}"
    _plain(out, f"{step_title(record)}: +{added} -{removed} words against {against}", "bold")
    out.print(_word_diff(before, record.memory, out.is_terminal), soft_wrap=True)


def grep(out: Console, loaded: Trace, pattern: str) -> bool:
    """The steps whose memory holds `pattern` (any case); False when none does."""
    needle = pattern.casefold()
    hits = [i for i, s in enumerate(loaded.steps) if needle in s.memory.casefold()]
    if not hits:
        display.note(f"No step's memory contains {pattern!r}.")
        return False
    finder = re.compile(re.escape(pattern), re.IGNORECASE)
    for i in hits:
        _plain(out, step_title(loaded.steps[i]), "bold")
        for line in loaded.steps[i].memory.splitlines():
            if needle in line.casefold():
                shown = Text("  " + line.strip())
                shown.highlight_regex(finder, "bold magenta")
                out.print(shown, soft_wrap=True)
    out.print()
    _plain(out, presence([i + 1 for i in hits], len(loaded.steps), pattern))
    return True


def follow(out: Console, path: Path) -> None:
    """Print the run so far, then each step as it lands, until the run ends.

    An interruption ends the view only when nothing follows it within a poll interval: a run
    continued with `memagent ask --resume` appends a "resumed" record and goes on.
    """
    items = trace.records(path, follow=True)
    loaded = trace.start(path, next(items))
    for label, text in about(loaded):
        _labelled(out, label.capitalize(), text)
    out.print()
    memory, interrupted = protocol.INITIAL_MEMORY, False
    announced = False
    for item in items:
        if item is None:
            if interrupted:
                return
            if not announced:
                display.note(f"following {path}; Ctrl-C stops.")
                announced = True
            continue
        interrupted = False
        before = len(loaded.problems)
        loaded.add(item)
        for problem in loaded.problems[before:]:
            display.warn(f"{path}: {problem}.")
        if isinstance(item, trace.Resumed):
            _plain(out, f"resumed after step {item.steps_done}")
            memory = loaded.steps[-1].memory if loaded.steps else protocol.INITIAL_MEMORY
        elif isinstance(item, StepRecord) and loaded.steps and loaded.steps[-1] is item:
            added, removed = word_change(memory, item.memory)
            memory = item.memory
            span, total = (f"  {item.span}" if item.span else ""), loaded.total_steps
            _plain(
                out,
                f"step {item.index + 1}/{total}{span}  memory {item.completion_tokens} tokens  "
                f"+{added} -{removed} words  {item.seconds:.1f}s",
            )
        elif isinstance(item, trace.FinalRecord):
            _labelled(out, "Answer", item.reply.strip() if item.answer is None else item.answer)
            return
        elif isinstance(item, trace.Interruption):
            _labelled(out, "Interrupted", item.reason, "bold yellow")
            interrupted = True  # the end, unless a resumed run goes on at once
        if loaded.ended:
            return


def _when(created: str | None, path: Path) -> str:
    try:
        moment = datetime.fromisoformat(created or "").astimezone()
    except ValueError:
        try:
            moment = datetime.fromtimestamp(path.stat().st_mtime)
        except OSError:
            return "?"
    return moment.strftime("%Y-%m-%d %H:%M")


def warn_unreadable(rows: list[dict[str, Any]]) -> None:
    """A warning for each trace of a listing that could not be read."""
    for row in rows:
        if row["status"] == "unreadable":
            display.warn(f"{Path(row['path']).name} cannot be read: {row['error']}")


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
