"""A saved run as a Markdown report a person can read or share (`trace --markdown`)."""

from __future__ import annotations

import re

from memagent_cli.trace import Trace
from memagent_cli.views.traces.diffs import changes
from memagent_cli.views.traces.wording import (
    about,
    evidence,
    reader_actions,
    step_title,
    stopped,
)


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
        if early := stopped(loaded):  # a reader that answered before the last chunk
            lines.append(f"- **Stopped early:** {_md(early)}")
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
        ]
        if actions := reader_actions(loaded, record):  # a reader after MemAgent (readers/)
            lines += [f"- {label.capitalize()}: {_md(text)}" for label, text in actions] + [""]
        lines.append(_block(record.memory))
    if final is not None:
        lines += ["## Final reply", "", _block(final.reply)]
    return "\n".join(lines)
