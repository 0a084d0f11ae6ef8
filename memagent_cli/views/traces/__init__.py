"""Saved runs as a person reads them: a trace step by step (summary, steps, diffs, grep,
follow), the list of traces, and a Markdown report. `diffs` and `wording` say what a trace
holds (pure: no Rich); `terminal` and `markdown` render it. Renderers of typed trace records
only; finding traces is trace/folder.py's, the command's options are cli/trace.py's."""

from memagent_cli.views.traces.diffs import DIFF_LIMIT, Piece, changes, word_change, word_diff
from memagent_cli.views.traces.markdown import markdown
from memagent_cli.views.traces.terminal import (
    diff,
    follow,
    grep,
    load,
    print_listing,
    step,
    summary,
    warn_problems,
    warn_unreadable,
)
from memagent_cli.views.traces.wording import (
    about,
    evidence,
    evidence_line,
    presence,
    source_place,
    source_text,
    step_title,
)

__all__ = [
    "DIFF_LIMIT",
    "Piece",
    "about",
    "changes",
    "diff",
    "evidence",
    "evidence_line",
    "follow",
    "grep",
    "load",
    "markdown",
    "presence",
    "print_listing",
    "source_place",
    "source_text",
    "step",
    "step_title",
    "summary",
    "warn_problems",
    "warn_unreadable",
    "word_change",
    "word_diff",
]
