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


class Interrupted(BaseException):
    """A signal stopped the work: SIGTERM, or a stop asked of a run in another thread (Ctrl-C
    in the main thread arrives as KeyboardInterrupt). The exit code is 128 + the signal's
    number, as a shell reports a process the signal ended: 143 for SIGTERM, 130 for SIGINT.

    A BaseException, as KeyboardInterrupt is: libraries catch every Exception where a call
    may fail (huggingface_hub does around its first request to the Hub), and would take a
    stop for a failure and go on."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.exit_code = 128 + signal.Signals[signal_name].value


# What stops a run, each caught as one: Ctrl-C in the main thread (KeyboardInterrupt), and
# SIGTERM or a stop asked of another thread (Interrupted).
STOPS = (KeyboardInterrupt, Interrupted)


def stop_code(stop: BaseException) -> int:
    """The exit code of a process that `stop` (one of STOPS) ended: 130 for Ctrl-C, 143 for
    SIGTERM."""
    return stop.exit_code if isinstance(stop, Interrupted) else 130
