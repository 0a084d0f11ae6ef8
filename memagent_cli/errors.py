"""Errors a user can cause: each carries one sentence for stderr and an exit code."""

from __future__ import annotations


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
    """SIGTERM arrived while reading (Ctrl-C arrives as KeyboardInterrupt)."""
