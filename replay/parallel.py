"""Work in threads: a function over items with results in order and bounded look-ahead, calls run
in order beside the thread that hands them on (an import's output written while it parses), and the
removal of spilled files behind the work that follows.

The heavy work in the importers and the recorder is polars, which releases the GIL, so threads
overlap it with the Python that reads input and writes output in order. ``Executor.map`` would
submit every item at once and hold all their inputs and results; this holds at most ``ahead``.
"""

from __future__ import annotations

import functools
import shutil
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from pathlib import Path
from queue import SimpleQueue
from typing import TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")
_NONE = object()  # (no item)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int, ahead: int) -> Generator[R, None, None]:
    """``fn`` of each item, in the items' order, computed by ``workers`` threads; at most ``ahead``
    items are taken from ``items`` and not yet handed back. Stopping early cancels the rest. A
    single item is computed in this thread (where ``ahead`` lets two be taken to know there is only
    one): starting a thread cost a small file's import a tenth of its time.

    However it stops (an error, Ctrl-C or SIGTERM, the caller closing it), no call of ``fn`` runs once
    it has: the calls running are waited for, through further interrupts, and those not started never
    are. (A pool of the standard library's counts a thread only once it has started, and starting one
    waits for it: an interrupt landing in that wait left an uncounted thread to run the item it was
    started for, after the caller's cleanup removed the folder that item's spill went to.)"""
    it = iter(items)
    head: list[object] = []  # (two items, to know whether there is more than one)
    while len(head) < min(2, ahead) and (x := next(it, _NONE)) is not _NONE:
        head.append(x)
    if len(head) < min(2, ahead):
        for x in head:
            yield fn(cast(T, x))
        return
    jobs: SimpleQueue[tuple[Future[R], T] | None] = SimpleQueue()
    threads: list[threading.Thread] = []  # (each counted before it is started)
    pending: deque[Future[R]] = deque()

    def work() -> None:
        while (job := jobs.get()) is not None:
            future, item = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(item))
                except BaseException as e:  # (handed to the caller with its result)
                    future.set_exception(e)

    def submit(item: T) -> None:
        future: Future[R] = Future()
        pending.append(future)
        jobs.put((future, item))
        if len(threads) < workers:
            threads.append(threading.Thread(target=work, name=f"ordered_map-{len(threads)}", daemon=True))
            threads[-1].start()

    def join_threads() -> None:
        for t in threads:
            if t.ident is not None:  # (one not started runs nothing)
                t.join()
    try:
        for x in head:
            submit(cast(T, x))
        while True:
            while len(pending) < ahead:
                try:
                    item = next(it)
                except StopIteration:
                    break
                submit(item)
            if not pending:
                return
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        for _ in threads:
            jobs.put(None)
        _through_interrupts(join_threads)


@contextmanager
def in_order(ahead: int) -> Iterator[Callable[[Callable[[], object]], None]]:
    """A function that runs calls one after another, in the order given, in a thread of its own
    (started at the second call: the first runs at once, in this thread, so that work of one call
    starts none); at most ``ahead`` calls wait, and handing on more waits for the oldest. Leaving
    the block waits for every call handed on and raises the first one's error.

    An import renders its output in order while its blocks are parsed; rendering in the thread that
    reads the input made that thread the one every other waited for."""
    pool: ThreadPoolExecutor | None = None
    pending: deque[Future[object]] = deque()

    def run(call: Callable[[], object]) -> None:
        nonlocal pool
        if pool is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="in-order")
            call()
            return
        while pending and len(pending) >= ahead:
            pending.popleft().result()
        pending.append(pool.submit(call))

    try:
        yield run
        while pending:
            pending.popleft().result()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


@contextmanager
def background_removal() -> Iterator[Callable[[Path], None]]:
    """A function that removes a file or folder (missing ones too) in a thread of its own; leaving
    the block waits until everything handed to it is gone.

    Spilled intermediate files are hundreds of megabytes. Once the kernel has written them back,
    unlinking them waits on the file system's journal: 0.3-0.5 s for 400 MB on a virtual disk, with
    next to no CPU. The work that follows need not wait for that.

    Ctrl-C or SIGTERM while the block is left waits on too, then is raised: a removal still running
    when the caller's own cleanup removes the folder around it made the two race, and left that folder
    (a recorder's partial bundle and its spill) behind."""
    with ThreadPoolExecutor(1, thread_name_prefix="remove") as pool:
        handed: deque[Future[None]] = deque()  # (those not yet done: one thread removes them in turn)
        lock = threading.Lock()
        waiting: list[Path] | None = None  # the paths of the job not yet started, which later paths join: while
        # the thread lags, each path handed on would be a job of ~3 KB until done (a fleet's request join hands
        # on a file for each piece of log and each bucket, ~770; 25,000 when it spilled one a bucket and group)

        def run(paths: list[Path]) -> None:
            nonlocal waiting
            with lock:
                if waiting is paths:
                    waiting = None  # (started: later paths make a job of their own)
            for path in paths:
                _remove(path)

        def remove(path: Path) -> None:
            nonlocal waiting
            with lock:
                if waiting is not None:
                    waiting.append(path)
                    return
                waiting = [path]
                while handed and handed[0].done():
                    handed.popleft()
                handed.append(pool.submit(run, waiting))
        try:
            yield remove
        finally:
            _through_interrupts(functools.partial(wait, list(handed)))


def _through_interrupts(wait_for: Callable[[], object]) -> None:
    """Call ``wait_for`` (a wait that may be called again) until it returns without an interrupt; the first
    interrupt that came meanwhile is raised then."""
    stopped: BaseException | None = None
    while True:
        try:
            wait_for()
            break
        except KeyboardInterrupt as e:
            stopped = stopped or e
    if stopped is not None:
        raise stopped


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with suppress(OSError):
            path.unlink(missing_ok=True)
