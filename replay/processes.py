"""Work in processes of their own: calls run side by side in fresh interpreters, their progress passed
back to the caller's, every one of them ended when the block is left.

A vLLM log's reading is bounded by the process that reads it: its pieces are prepared by threads, but
the line-by-line parser of the lines the fast lane leaves, polars' own pool and the GIL between them
kept a 2-core machine ~1.55 cores busy. Two logs read in two processes kept it ~1.9 busy: two 1.2 GiB
logs in 10.0 s where one after the other took 12.8 s (``benchmarks/bench_time_to_answer.py``).

The processes are started fresh ("spawn": a fork of a process that runs threads may copy a lock that
one of them held), ignore Ctrl-C from their first instruction (the caller's handler decides: a Ctrl-C
at a terminal reaches every process of the command, and one that came while a worker was still starting
printed its traceback), and die with the caller; leaving the block after an error or a signal ends them
at once, and what they were writing is the caller's to remove.
A worker that dies in the middle of a call (the kernel's OOM killer) fails it (``WorkerDied``).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import resource_tracker
from typing import Any, Generic, TypeVar

from replay import malloc, signals

R = TypeVar("R")
_PR_SET_PDEATHSIG = 1  # (prctl's option, from linux/prctl.h)
_SLOTS_PER_WORKER = 4  # (room to spare: each worker started takes a slot of its own)
_HAVE_SIGMASK = hasattr(signal, "pthread_sigmask")  # (POSIX; elsewhere a terminal's Ctrl-C is not a group's)
_slot: tuple[Any, int] | None = None  # in a worker: the shared counts, and which one is its own


def _start(counts: Any, taken: Any) -> None:
    """A worker's start: a progress count of its own, Ctrl-C left to the caller, killed with it, its
    allocator set as the caller's."""
    global _slot
    with taken.get_lock():
        mine = taken.value
        taken.value += 1
    _slot = (counts, mine) if mine < len(counts) else None
    signals.ignore()
    if _HAVE_SIGMASK:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])  # (blocked from its start: see ``_started``)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    malloc.give_back_large_blocks()


def report(n: int) -> None:
    """In a worker, add ``n`` to the caller's progress (bytes read, say). Each worker counts in a shared
    slot of its own that the caller reads: no lock is taken (a worker ended while it held one, as
    leaving the block ends them, would leave it held) and no message can be left half-sent."""
    if _slot is not None and n:
        counts, mine = _slot
        counts[mine] += n


@contextlib.contextmanager
def _started() -> Iterator[None]:
    """Processes this thread starts in the block (a pool starts a worker as a call is handed on) start
    with Ctrl-C blocked, as the standard library starts its resource tracker: a new interpreter keeps the
    mask it is started with, until the worker ignores Ctrl-C (``_start``). The caller is not shielded:
    its other threads still take a Ctrl-C, which the main thread handles as ever. (The resource tracker
    is started first: starting it unblocks the signals it blocked for itself, whatever the mask was.)"""
    if not _HAVE_SIGMASK:
        yield
        return
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


class WorkerDied(Exception):
    """A worker ended before its call did: killed (the kernel's OOM killer, say) or crashed."""


class Pending(Generic[R]):
    """A call handed to a worker: ``get`` waits for its result, or raises what it raised (WorkerDied
    where the worker ended first: a pool that waited on such a call waited forever)."""

    def __init__(self, future: Future[R]) -> None:
        self._future = future

    def get(self) -> R:
        try:
            return self._future.result()
        except BrokenProcessPool as e:
            raise WorkerDied(str(e)) from None


class Workers:
    """A pool of ``processes`` workers, started at the first call handed on."""

    def __init__(self, processes: int, progress: Callable[[int], None] | None) -> None:
        self._processes, self._on_progress = processes, progress
        self._pool: ProcessPoolExecutor | None = None
        self._counts: Any = None
        self._passed = 0
        self._stopped = threading.Event()
        self._watch: threading.Thread | None = None
        self._handed: list[Future[Any]] = []  # (every call handed on, in order)

    def submit(self, fn: Callable[..., R], *args: Any) -> Pending[R]:
        """``fn(*args)`` in a worker (``fn`` a module's function, ``args`` what pickle can carry)."""
        if self._pool is None:  # (a spawning pool starts no process before a call is handed on)
            ctx = multiprocessing.get_context("spawn")
            self._counts = ctx.Array("q", self._processes * _SLOTS_PER_WORKER, lock=False)
            self._pool = ProcessPoolExecutor(self._processes, ctx, initializer=_start,
                                             initargs=(self._counts, ctx.Value("i", 0)))
            self._watch = threading.Thread(target=self._pass_progress, name="progress", daemon=True)
            self._watch.start()
        with _started():
            future = self._pool.submit(fn, *args)
        self._handed.append(future)
        return Pending(future)

    def waiting(self) -> list[int]:
        """The calls that no worker has begun, by their order of handing on (from 0): those not done
        beyond the first one a worker (workers begin the calls in that order)."""
        return [k for k, f in enumerate(self._handed) if not f.done()][self._processes:]

    def wait_for_one(self, timeout_s: float) -> None:
        """Wait until one more call is done (or failed), or for ``timeout_s``."""
        wait([f for f in self._handed if not f.done()], timeout=timeout_s, return_when=FIRST_COMPLETED)

    def _pass_progress(self) -> None:
        """The workers' progress passed on, ten times a second, and once more when they have ended."""
        while not self._stopped.wait(PROGRESS_EVERY_S):
            self._pass_new()
        self._pass_new()

    def _pass_new(self) -> None:
        total = sum(self._counts)
        if total > self._passed and self._on_progress is not None:
            self._on_progress(total - self._passed)
        self._passed = total

    def stop(self, finished: bool) -> None:
        """Wait for the workers to end (``finished``: each call's result was taken), or end them now."""
        if self._pool is None:
            return
        if not finished:  # (ended now: SIGKILL, a call in its middle has nothing of its own to clean up; the
            for proc in list((self._pool._processes or {}).values()):  # executor has no call for it before 3.14)
                with contextlib.suppress(OSError, ValueError):
                    proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)
        assert self._watch is not None
        self._stopped.set()
        self._watch.join()
        self._pool = None


PROGRESS_EVERY_S = 0.1


@contextlib.contextmanager
def workers(processes: int, progress: Callable[[int], None] | None = None) -> Iterator[Workers]:
    """Workers for the block: left normally, they are waited for; left by an error, Ctrl-C or SIGTERM,
    they are ended at once."""
    w = Workers(processes, progress)
    try:
        yield w
    except BaseException:
        w.stop(finished=False)
        raise
    w.stop(finished=True)
