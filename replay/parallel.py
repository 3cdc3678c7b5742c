"""A function over items in worker threads, with results in order and bounded look-ahead.

The heavy work in the importers and the recorder is polars, which releases the GIL, so threads
overlap it with the Python that reads input and writes output in order. ``Executor.map`` would
submit every item at once and hold all their inputs and results; this holds at most ``ahead``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int, ahead: int) -> Iterator[R]:
    """``fn`` of each item, in the items' order, computed by ``workers`` threads; at most ``ahead``
    items are taken from ``items`` and not yet handed back. Stopping early cancels the rest."""
    with ThreadPoolExecutor(workers) as pool:
        pending: deque[Future[R]] = deque()
        it = iter(items)
        try:
            while True:
                while len(pending) < ahead:
                    try:
                        item = next(it)
                    except StopIteration:
                        break
                    pending.append(pool.submit(fn, item))
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
