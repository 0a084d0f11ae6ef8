"""`memagent trace`: read a trace back, step by step."""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from memagent_cli import display, protocol
from memagent_cli.errors import UserError
from memagent_cli.trace import Trace, TraceError, default_dir, read_trace, recent_traces


def show(
    trace: Path | None,
    *,
    list_traces: bool,
    step: int | None,
    diff: int | None,
    grep: str | None,
    as_json: bool,
    markdown: bool,
    follow_run: bool,
) -> None:
    """Show one view of a trace (or the list of traces) on stdout."""
    views = {
        "--list": list_traces,
        "--step": step is not None,
        "--diff": diff is not None,
        "--grep": grep is not None,
        "--markdown": markdown,
        "--follow": follow_run,
    }
    chosen = [name for name, on in views.items() if on]
    if len(chosen) > 1:
        raise typer.BadParameter(f"{' and '.join(chosen)} are different views; pick one.")
    if as_json and chosen and chosen != ["--list"]:
        raise typer.BadParameter(f"--json goes with the whole trace or --list, not {chosen[0]}.")
    out = display.results_console()
    if list_traces:
        if trace is not None:
            raise typer.BadParameter("--list lists the data folder; leave out TRACE.")
        _show_list(out, as_json)
        return
    path = _locate(trace)
    if follow_run:
        _follow(out, path)
        return
    loaded = read_trace(path)
    _warn_problems(loaded)
    if as_json:
        print(json.dumps(_as_json(loaded), ensure_ascii=False, indent=2))
    elif markdown:
        print(_markdown(loaded), end="")
    elif step is not None:
        _show_step(out, loaded, step)
    elif diff is not None:
        _show_diff(out, loaded, diff)
    elif grep is not None:
        _show_grep(out, loaded, grep)
    else:
        _show_summary(out, loaded)


def _locate(trace: Path | None) -> Path:
    """The trace to show: the one named, one of that name in the data folder, or the newest."""
    if trace is None:
        found = recent_traces()
        if not found:
            raise TraceError(
                f"There are no traces in {default_dir()} yet; `memagent ask` writes one for "
                "every question."
            )
        return found[0]
    if not trace.exists() and len(trace.parts) == 1 and (default_dir() / trace).exists():
        return default_dir() / trace
    return trace


def _warn_problems(trace: Trace) -> None:
    for problem in trace.problems:
        display.warn(f"{trace.path}: {problem}.")
    if trace.problems:
        display.note("Showing the trace as far as it goes.")


# ---------------------------------------------------------------- what a trace says


def _memories(trace: Trace) -> list[str]:
    return [str(s.get("memory", "")) for s in trace.steps]


def _word_change(before: str, after: str) -> tuple[int, int]:
    """Words added and removed going from `before` to `after`."""
    matcher = difflib.SequenceMatcher(None, before.split(), after.split(), autojunk=False)
    added = removed = 0
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def _changes(trace: Trace) -> list[tuple[int, int]]:
    memories = _memories(trace)
    before = [protocol.INITIAL_MEMORY, *memories[:-1]]
    return [_word_change(b, a) for b, a in zip(before, memories, strict=True)]


def _total_steps(trace: Trace) -> int | None:
    total = (trace.header.get("document") or {}).get("chunks")
    return total if isinstance(total, int) else None


def _interrupted(trace: Trace) -> dict[str, Any] | None:
    """The interruption a trace ends with; None once the run was resumed or finished.

    `read_trace` forgets an interruption when a "resumed" record follows it. A run resumed
    before its first step starts again with a header instead, so an interruption that counts
    fewer steps than the trace holds is an old one as well.
    """
    found = trace.interrupted
    if trace.finished or not found:
        return None
    done = found.get("steps_done")
    if isinstance(done, int) and not isinstance(done, bool) and done < len(trace.steps):
        return None
    return found


def _status_word(trace: Trace) -> str:
    if trace.finished:
        return "finished"
    return "interrupted" if _interrupted(trace) else "unfinished"


def _status(trace: Trace) -> str:
    """finished / interrupted / unfinished, in words."""
    if trace.finished:
        return "finished"
    total = _total_steps(trace)
    done = f"{len(trace.steps)} of {total} steps" if total else f"{len(trace.steps)} steps"
    interrupted = _interrupted(trace)
    if interrupted:
        return f"interrupted ({interrupted.get('reason', '?')}) after {done}"
    return f"unfinished: {done} (still running, or the run was killed)"


def _shown(index: Any) -> str:
    """A 0-based step index as people count steps, from 1 (as `memagent ask` does)."""
    if isinstance(index, int) and not isinstance(index, bool):
        return str(index + 1)
    return "?"


def _step_number(trace: Trace, n: int) -> str:
    """The number shown for the step at position `n` (0-based) of the trace."""
    index = trace.steps[n].get("index", n)
    return _shown(index if isinstance(index, int) else n)


def _evidence(trace: Trace) -> str | None:
    """Where the answer entered the memory, in words; None when the trace does not say."""
    if trace.final is None or "evidence" not in trace.final or trace.final.get("answer") is None:
        return None
    found = trace.final["evidence"]
    if not found:
        return "the answer's text is in no step's memory"
    where = f"step {_shown(found.get('step'))}"
    if found.get("span"):
        where += f", {found['span']}"
    tokens = found.get("tokens")
    if tokens:
        where += f" (tokens {tokens[0]:,}–{tokens[1]:,})"
    return where


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _about(trace: Trace) -> list[tuple[str, str]]:
    """Question, document, model and settings as (label, text) pairs."""
    header = trace.header
    doc, model = header.get("document") or {}, header.get("model") or {}
    facts = [(k, f"{_number(doc[k])} {k}") for k in ("characters", "tokens", "chunks") if k in doc]
    about = [("question", str(header.get("question", "")))]
    if doc:
        details = ", ".join([str(doc.get("format", "?"))] + [text for _, text in facts])
        about.append(("document", f"{doc.get('path', '?')} ({details})"))
    if model:
        size = model.get("size")
        gib = f", {size / 2**30:.2f} GiB" if isinstance(size, int) else ""
        about.append(("model", f"{model.get('name', '?')} ({model.get('path', '?')}{gib})"))
    settings = header.get("settings") or {}
    if settings:
        listed = ", ".join(f"{k.replace('_', ' ')} {_none(v)}" for k, v in settings.items())
        about.append(("settings", listed))
    if header.get("created"):
        about.append(("created", f"{header['created']} by memagent {header.get('memagent', '?')}"))
    return about


def _none(value: Any) -> str:
    return "none" if value is None else _number(value)


def _check_step(trace: Trace, number: int) -> int:
    """The position in the trace of step `number`, counted from 1 as `memagent ask` does."""
    if not trace.steps:
        raise UserError(f"{trace.path} has no steps yet.")
    if not 1 <= number <= len(trace.steps):
        steps = len(trace.steps)
        has = "only step 1" if steps == 1 else f"steps 1 to {steps}"
        raise UserError(
            f"There is no step {number}: {trace.path} has {has} (step 1 reads the first chunk)."
        )
    return number - 1


def _step_title(trace: Trace, n: int) -> str:
    """ "step 3, p. 1–2, tokens 120–180" for the step at position `n` (0-based)."""
    record = trace.steps[n]
    span = f", {record['span']}" if record.get("span") else ""
    tokens = record.get("tokens")
    where = f", tokens {tokens[0]:,}–{tokens[1]:,}" if tokens else ""
    return f"step {_step_number(trace, n)}{span}{where}"


# ---------------------------------------------------------------- views


def _labelled(out: Console, label: str, text: str, style: str = "bold") -> None:
    out.print(Text.assemble((f"{label}: ", style), text), soft_wrap=True)


def _show_summary(out: Console, trace: Trace) -> None:
    for label, text in _about(trace):
        _labelled(out, label.capitalize(), text)
    out.print()
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("step", justify="right")
    table.add_column("span")
    table.add_column("memory tokens", justify="right")
    table.add_column("changed words", justify="right")
    table.add_column("seconds", justify="right")
    for n, (record, (added, removed)) in enumerate(zip(trace.steps, _changes(trace), strict=True)):
        seconds = record.get("seconds")
        table.add_row(
            _step_number(trace, n),
            Text(str(record.get("span", ""))),
            _number(record.get("completion_tokens", "")),
            Text.assemble((f"+{added}", "green"), " ", (f"-{removed}", "red")),
            f"{seconds:.1f}" if isinstance(seconds, int | float) else "",
        )
    out.print(table)
    out.print()
    if trace.final is not None:
        answer = trace.final.get("answer")
        if answer is None:
            _labelled(out, "Answer", "(none in \\boxed{}; the reply follows)")
            out.print(Text(str(trace.final.get("reply", "")).strip()), soft_wrap=True)
        else:
            _labelled(out, "Answer", str(answer), "bold green")
        evidence = _evidence(trace)
        if evidence:
            _labelled(out, "Evidence", evidence)
    else:
        _labelled(out, "Unfinished", _status(trace), "bold yellow")


def _show_step(out: Console, trace: Trace, number: int) -> None:
    n = _check_step(trace, number)
    record = trace.steps[n]
    tokens = record.get("completion_tokens")
    extra = f" ({tokens} tokens)" if tokens is not None else ""
    out.print(Text(f"memory after {_step_title(trace, n)}{extra}", style="bold"), soft_wrap=True)
    out.print(Text(str(record.get("memory", ""))), soft_wrap=True)


def _word_diff(before: str, after: str, colour: bool) -> Text:
    """`after` with the words `before` lost struck out, git --word-diff style."""
    old, new = re.findall(r"\S+\s*", before), re.findall(r"\S+\s*", after)
    matcher = difflib.SequenceMatcher(
        None, [w.strip() for w in old], [w.strip() for w in new], autojunk=False
    )
    text = Text()
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            text.append("".join(new[j1:j2]))
            continue
        gone, came = "".join(old[i1:i2]), "".join(new[j1:j2])
        if gone.strip():
            text.append(gone.rstrip() if colour else f"[-{gone.rstrip()}-]", "red strike")
        if came.strip():
            text.append(came.rstrip() if colour else f"{{+{came.rstrip()}+}}", "green")
        spacing = came or gone  # keep the line breaks of the text that is left
        text.append(spacing[len(spacing.rstrip()) :])
    return text


def _show_diff(out: Console, trace: Trace, number: int) -> None:
    n = _check_step(trace, number)
    record = trace.steps[n]
    before = protocol.INITIAL_MEMORY if n == 0 else str(trace.steps[n - 1].get("memory", ""))
    after = str(record.get("memory", ""))
    added, removed = _word_change(before, after)
    against = "the initial memory" if n == 0 else f"step {_step_number(trace, n - 1)}"
    out.print(
        Text(f"{_step_title(trace, n)}: +{added} -{removed} words against {against}", style="bold"),
        soft_wrap=True,
    )
    out.print(_word_diff(before, after, out.is_terminal), soft_wrap=True)


def _show_grep(out: Console, trace: Trace, pattern: str) -> None:
    needle = pattern.casefold()
    hits = [i for i, memory in enumerate(_memories(trace)) if needle in memory.casefold()]
    if not hits:
        display.note(f"No step's memory contains {pattern!r}.")
        raise typer.Exit(1)
    finder = re.compile(re.escape(pattern), re.IGNORECASE)
    for i in hits:
        out.print(Text(_step_title(trace, i), style="bold"), soft_wrap=True)
        for line in str(trace.steps[i].get("memory", "")).splitlines():
            if needle in line.casefold():
                shown = Text("  " + line.strip())
                shown.highlight_regex(finder, "bold magenta")
                out.print(shown, soft_wrap=True)
    out.print()
    out.print(Text(_presence([i + 1 for i in hits], len(trace.steps), pattern)), soft_wrap=True)


def _presence(hits: list[int], steps: int, pattern: str) -> str:
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


POLL_SECONDS = 0.2


def _records(path: Path, poll_seconds: float = POLL_SECONDS) -> Iterator[dict[str, Any] | None]:
    """Every record of a trace as its line lands on disk, and None after each poll interval
    in which nothing arrived; never ends.

    A line still being written waits for the rest; a line that is not a record is skipped.
    """
    pending = b""
    with path.open("rb") as file:
        while True:
            data = file.read()
            if not data:
                time.sleep(poll_seconds)
                data = file.read()
                if not data:
                    yield None
                    continue
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "type" in record:
                    yield record


def _follow(out: Console, path: Path, poll_seconds: float = POLL_SECONDS) -> None:
    """Print the run so far, then each step as it lands, until the run ends (or Ctrl-C).

    An interruption ends the view only when nothing follows it within a poll interval: a run
    continued with `memagent ask --resume` appends a "resumed" record and goes on.
    """
    loaded = read_trace(path)  # a file that is not a trace fails here, with a sentence
    _warn_problems(loaded)
    if not loaded.finished and not _interrupted(loaded):
        display.note(f"following {path}; Ctrl-C stops.")
    total: int | None = None
    memory = protocol.INITIAL_MEMORY
    seen_header = interrupted = False
    steps = 0
    try:
        for record in _records(path, poll_seconds):
            if record is None:
                if interrupted:
                    return
                continue
            interrupted = False
            kind = record.get("type")
            if kind == "header" and not seen_header:
                seen_header = True
                for label, text in _about(Trace(path=path, header=record)):
                    _labelled(out, label.capitalize(), text)
                total = _total_steps(Trace(path=path, header=record))
                out.print()
            elif kind in ("resumed", "header"):  # a run resumed before its first step restarts
                done = record.get("steps_done", 0 if kind == "header" else steps)
                out.print(f"resumed after step {_number(done)}", soft_wrap=True, markup=False)
            elif kind == "step":
                after = str(record.get("memory", ""))
                index = record.get("index", steps)
                added, removed = _word_change(memory, after)
                memory = after
                steps += 1
                of = f"/{total}" if total else ""
                span = f"  {record['span']}" if record.get("span") else ""
                seconds = record.get("seconds")
                took = f"  {seconds:.1f}s" if isinstance(seconds, int | float) else ""
                tokens = record.get("completion_tokens", "?")
                out.print(
                    f"step {_shown(index)}{of}{span}  memory {tokens} tokens  "
                    f"+{added} -{removed} words{took}",
                    soft_wrap=True,
                    markup=False,
                )
            elif kind == "final":
                answer = record.get("answer")
                reply = str(record.get("reply", "")).strip()
                _labelled(out, "Answer", reply if answer is None else str(answer), "bold green")
                return
            elif kind == "interrupted":
                _labelled(out, "Interrupted", str(record.get("reason", "?")), "bold yellow")
                interrupted = True  # the end, unless a resumed run goes on at once
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


# ---------------------------------------------------------------- for scripts and reports


def _as_json(trace: Trace) -> dict[str, Any]:
    return {
        "path": str(trace.path),
        "status": _status_word(trace),
        "header": trace.header,
        "steps": trace.steps,
        "final": trace.final,
        "interrupted": trace.interrupted,
        "problems": trace.problems,
    }


def _listing(path: Path, trace: Trace) -> dict[str, Any]:
    header = trace.header
    return {
        "path": str(path),
        "created": header.get("created"),
        "document": (header.get("document") or {}).get("path"),
        "question": header.get("question"),
        "model": (header.get("model") or {}).get("name"),
        "steps_done": len(trace.steps),
        "steps_total": _total_steps(trace),
        "status": _status_word(trace),
        "interrupted": (_interrupted(trace) or {}).get("reason"),
        "answer": (trace.final or {}).get("answer"),
    }


def _when(created: str | None, path: Path) -> str:
    try:
        moment = datetime.fromisoformat(created or "").astimezone()
    except ValueError:
        moment = datetime.fromtimestamp(path.stat().st_mtime)
    return moment.strftime("%Y-%m-%d %H:%M")


def _show_list(out: Console, as_json: bool) -> None:
    rows = []
    for path in recent_traces():
        try:
            rows.append((path, _listing(path, read_trace(path))))
        except TraceError as exc:
            display.note(f"skipped {path.name}: {exc.message}")
    if as_json:
        print(json.dumps([row for _, row in rows], ensure_ascii=False, indent=2))
        return
    if not rows:
        raise TraceError(f"There are no traces in {default_dir()} yet.")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("when", no_wrap=True)
    for name in ("document", "question"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("model", no_wrap=True, overflow="ellipsis", max_width=20)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("answer", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("trace", no_wrap=True)
    for path, row in rows:
        total = row["steps_total"]
        status = row["status"] + (f" ({row['interrupted']})" if row["interrupted"] else "")
        table.add_row(
            _when(row["created"], path),
            Text(Path(row["document"] or "?").name),
            Text(" ".join(str(row["question"] or "").split())),
            Text(str(row["model"] or "?")),
            f"{row['steps_done']}/{total if total is not None else '?'}",
            Text(status, style="green" if row["status"] == "finished" else "yellow"),
            Text(" ".join(str(row["answer"] or "").split())),
            Text(path.name, style="dim"),
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


def _markdown(trace: Trace) -> str:
    """A report of the run a person can read or share."""
    question = str(trace.header.get("question", ""))
    lines = [f"# {_md(question) or 'memagent trace'}", ""]
    if trace.final is not None:
        answer = trace.final.get("answer")
        lines.append(f"- **Answer:** {_md(str(answer)) if answer is not None else '(none)'}")
        evidence = _evidence(trace)
        if evidence:
            lines.append(f"- **Evidence:** {_md(evidence)}")
    else:
        lines.append(f"- **Status:** {_md(_status(trace))}")
    for label, text in _about(trace):
        if label != "question":
            lines.append(f"- **{label.capitalize()}:** {_md(text)}")
    lines += ["", "## Memory at each step", ""]
    for n, (record, (added, removed)) in enumerate(zip(trace.steps, _changes(trace), strict=True)):
        tokens = record.get("completion_tokens", "?")
        lines += [
            f"### S{_md(_step_title(trace, n))[1:]}",
            "",
            f"{tokens} memory tokens, +{added} -{removed} words.",
            "",
            _block(str(record.get("memory", ""))),
        ]
    if trace.final is not None:
        lines += ["## Final reply", "", _block(str(trace.final.get("reply", "")))]
    return "\n".join(lines)
