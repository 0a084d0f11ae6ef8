"""Saved runs as a person reads them: a trace step by step (summary, steps, diffs, grep,
follow), the list of traces, and a Markdown report. Renderers of typed trace records only;
finding traces is trace/folder.py's, the command's options are cli/trace.py's."""

from __future__ import annotations

import difflib
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


# ---------------------------------------------------------------- what a trace says


# Word pairs a diff may compare: a memory of 1,000 words against another takes 0.15 s at
# worst (few distinct words). difflib's matcher is quadratic or worse in the words, so a
# larger pair of memories (a hostile trace's) is shown as all of one replaced by the other.
DIFF_LIMIT = 1_000_000


def _opcodes(old: list[str], new: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib's opcodes turning `old` into `new`, or one "replace" above DIFF_LIMIT."""
    if len(old) * len(new) > DIFF_LIMIT:
        return [("replace", 0, len(old), 0, len(new))]
    return difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()


def word_change(before: str, after: str) -> tuple[int, int]:
    """Words added and removed going from `before` to `after`."""
    added = removed = 0
    for op, i1, i2, j1, j2 in _opcodes(before.split(), after.split()):
        if op != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def changes(loaded: Trace) -> list[tuple[int, int]]:
    """Words added and removed by each step."""
    memories = [s.memory for s in loaded.steps]
    before = [protocol.INITIAL_MEMORY, *memories][: len(memories)]
    return [word_change(b, a) for b, a in zip(before, memories, strict=True)]


def evidence(loaded: Trace) -> str | None:
    """Where the trace's answer came from, in words; None when there is no answer."""
    if loaded.final is None:
        return None
    return evidence_line(loaded.final.evidence, loaded.header.total_steps)


def evidence_line(found: list[dict[str, Any]] | None, total: int) -> str | None:
    """ "from pp. 131–150, step 7 of 30", from a final record's evidence; "no source: ..."
    when the final memory does not hold the answer's words; None with nothing to trace."""
    if found is None:
        return None
    if not found:
        return "no source in the document: the final memory does not hold the answer's words"
    several = len(found) > 1
    return "from " + "; ".join(source_text(source, total, several) for source in found)


def source_text(source: dict[str, Any], total: int, several: bool = False) -> str:
    """ "pp. 131–150, step 7 of 30", with the words it brought in when there are `several`."""
    text = f"{source_place(source)}, step {source['step']} of {total}"
    if several and source.get("words"):
        text += f" ({' '.join(source['words'])})"
    return text


def source_place(source: dict[str, Any]) -> str:
    """Where one evidence step read: "p. 3", "pp. 3–5", chapters, or its tokens."""
    if pages := source.get("pages"):
        return f"pp. {pages}" if "–" in pages else f"p. {pages}"
    if chapters := source.get("chapters"):
        return chapters
    first, last = source["tokens"]
    return f"tokens {first:,}–{last:,}"


def about(loaded: Trace) -> list[tuple[str, str]]:
    """Question, document, model and settings as (label, text) pairs."""
    header = loaded.header
    doc, model = header.document, header.model
    counts = [f"{doc[k]:,} {k}" for k in ("characters", "tokens", "chunks") if k in doc]
    size = model.get("size")
    gib = f", {size / 2**30:.2f} GiB" if isinstance(size, int) else ""
    settings = ", ".join(f"{k.replace('_', ' ')} {_value(v)}" for k, v in header.settings.items())
    return [
        ("question", header.question),
        (
            "document",
            f"{display.home_relative(doc['path'])} ({', '.join([doc['format'], *counts])})",
        ),
        ("model", f"{model['name']} ({display.home_relative(model['path'])}{gib})"),
        ("settings", settings),
        ("created", f"{header.created} by memagent {header.memagent}"),
    ]


def _value(value: object) -> str:
    if value is None:
        return "none"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def step_title(record: StepRecord) -> str:
    """ "step 3, p. 1–2, tokens 120–180": steps count from 1, as `memagent ask` counts."""
    span = f", {record.span}" if record.span else ""
    return f"step {record.index + 1}{span}, tokens {record.tokens[0]:,}–{record.tokens[1]:,}"


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


# ---------------------------------------------------------------- views


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
    if where := evidence(loaded):
        _labelled(out, "Evidence", where)


def step(out: Console, loaded: Trace, number: int) -> None:
    """The whole memory after step `number`."""
    record = loaded.steps[_position(loaded, number)]
    title = f"memory after {step_title(record)} ({record.completion_tokens} tokens)"
    _plain(out, title, "bold")
    _plain(out, record.memory)


Piece = tuple[str, str]  # ("=", kept text), ("-", dropped words) or ("+", added words)


def word_diff(before: str, after: str) -> list[Piece]:
    """`after` against `before`, word by word, git --word-diff style: kept text with its own
    spacing and line breaks, and the words dropped and added, each run without its spacing."""
    old, new = re.findall(r"\S+\s*", before), re.findall(r"\S+\s*", after)
    pieces: list[Piece] = []
    for op, i1, i2, j1, j2 in _opcodes([w.strip() for w in old], [w.strip() for w in new]):
        if op == "equal":
            pieces.append(("=", "".join(new[j1:j2])))
            continue
        gone, came = "".join(old[i1:i2]), "".join(new[j1:j2])
        if gone.strip():
            pieces.append(("-", gone.rstrip()))
        if came.strip():
            pieces.append(("+", came.rstrip()))
        spacing = came or gone  # keep the line breaks of the text that is left
        pieces.append(("=", spacing[len(spacing.rstrip()) :]))
    return pieces


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


def presence(hits: list[int], steps: int, pattern: str) -> str:
    """When the text entered and left the memory, given the step numbers (from 1) it is in:
    "in the memory at steps 2–4 and 7 (of steps 1–9)"."""
    runs: list[list[int]] = []
    for i in hits:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in runs]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    label = "step" if len(hits) == 1 else "steps"
    of = "of step 1" if steps == 1 else f"of steps 1–{steps}"
    return f"{pattern!r} is in the memory at {label} {listed} ({of})."


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
    total, memory, interrupted = loaded.header.total_steps, protocol.INITIAL_MEMORY, False
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
            span = f"  {item.span}" if item.span else ""
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


# ---------------------------------------------------------------- the list, and Markdown


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
