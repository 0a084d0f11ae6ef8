"""Many runs at once, results in input order: a bounded, cancellable pool of threads for
backends that serve several calls in flight (a server)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from memagent_cli.progress import silent

T = TypeVar("T")
R = TypeVar("R")
BACKLOG = 2  # runs submitted ahead per worker: enough to keep every worker busy


def ordered(
    items: Iterable[T],
    run: Callable[[T, threading.Event | None], R],
    parallel: int,
    *,
    on_stop: Callable[[], None] = silent,
) -> Iterator[tuple[T, R]]:
    """(item, run(item, cancel)) for each item, in input order, with at most `parallel` runs
    at once and at most BACKLOG x `parallel` items taken from `items` ahead of the results,
    so that memory stays bounded however many items there are.

    With `parallel` 1 each run happens in this thread (cancel None), so that Ctrl-C reaches
    the model at once. Otherwise the first exception of a run, or Ctrl-C while waiting, sets
    `cancel` for every run and calls `on_stop`; the runs still in flight finish and are
    yielded, and then the exception is raised.
    """
    if parallel <= 1:
        for item in items:
            yield item, run(item, None)
        return
    cancel = threading.Event()
    pending: deque[tuple[T, Future[R]]] = deque()
    failure: BaseException | None = None

    def stop(exc: BaseException) -> None:
        nonlocal failure
        if failure is None:
            failure = exc
            cancel.set()
            on_stop()

    def settle(keep: int) -> Iterator[tuple[T, R]]:
        while len(pending) > keep:
            item, future = pending.popleft()
            try:
                result = future.result()
            except BaseException as exc:  # raised once every run in flight has ended
                stop(exc)
                continue
            yield item, result

    with ThreadPoolExecutor(parallel) as pool:
        try:
            for item in items:
                if failure is not None:
                    break
                pending.append((item, pool.submit(run, item, cancel)))
                yield from settle(BACKLOG * parallel)
            yield from settle(0)
        except GeneratorExit:  # the caller stopped reading: stop the runs, wait for them
            cancel.set()
            raise
        except BaseException as exc:  # Ctrl-C while waiting, or `items` failed
            stop(exc)
            yield from settle(0)
    if failure is not None:
        raise failure
