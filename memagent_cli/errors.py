"""Errors a user can cause: each carries one sentence for stderr and an exit code."""

from __future__ import annotations

import signal


class UserError(Exception):
    """A problem with the user's input or environment, not a bug in memagent."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DocumentError(UserError):
    """The document is missing, unreadable or empty."""


class ModelError(UserError):
    """No usable model was found or it could not be loaded."""


class BudgetError(UserError):
    """One MemAgent step does not fit the model's context window."""


class Interrupted(Exception):
    """A signal stopped the work: SIGTERM, or a stop asked of a run in another thread (Ctrl-C
    in the main thread arrives as KeyboardInterrupt). The exit code is 128 + the signal's
    number, as a shell reports a process the signal ended: 143 for SIGTERM, 130 for SIGINT."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.exit_code = 128 + signal.Signals[signal_name].value
