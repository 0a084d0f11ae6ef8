"""`deadline(seconds)`: a block that must end within `seconds`, else TimeoutError at once,
even inside a regular expression (re checks for signals as it runs). Main thread only."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except TimeoutError as exc:  # the interrupted frame may have no line number, which
        raise TimeoutError(str(exc)) from None  # pytest cannot show
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
