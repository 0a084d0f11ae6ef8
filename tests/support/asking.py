"""One question, or the questions of one document read in one pass, through run/ask.py's
`ask_runs` as the library reads every batch: the tests' short way to a Result."""

from __future__ import annotations

from memagent_cli.progress import SILENT, Layout, Reporter
from memagent_cli.run.ask import Result, Run, RunOptions, Stopped, ask_runs
from memagent_cli.run.session import Session


def ask(session: Session, question: str, options: RunOptions, report: Reporter = SILENT) -> Result:
    """Answer `question` about the session's document; Stopped raised when the run ends
    early."""
    outcome = ask_together(session, [question], [options], report)[0]
    if isinstance(outcome, Stopped):
        raise outcome
    return outcome


def ask_together(
    session: Session,
    questions: list[str],
    options: list[RunOptions],
    report: Reporter = SILENT,
    watch: int = 0,
) -> list[Result | Stopped]:
    """Answer several questions about the session's document in one pass (`ask_runs` with
    room for them all). `watch`: whose memory the live view shows."""
    runs = [
        Run(session, question, how, (0, index))
        for index, (question, how) in enumerate(zip(questions, options, strict=True))
    ]
    batch = Layout(questions=len(runs), at_once=len(runs), watch=watch)
    return list(ask_runs(runs, len(runs), report, batch))
