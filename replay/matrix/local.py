"""Runs of a matrix on this host, one after another, and the one attempt of a run that every backend
makes (a Ray task calls ``attempt`` on its node).

A run's OOM (exit 10: the engine died, the capacity guard fired) is its result, not a failure. A run
fails when its runner raises: a ``ReplayError`` (the engine cannot be installed or started, an option
it cannot use) at once, since another attempt would fail the same way; any other exception (a fault
of the host, a killed process) is tried again, up to ``max_retries`` more times.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from replay.drive.runner import RunOptions


class RunFn(Protocol):
    """The runner seam: ``replay.drive.runner.run``'s signature (a trace, the run's options, a console)."""

    def __call__(self, trace_path: Path, opts: RunOptions, console: Console | None = None) -> Any: ...


def default_run(trace_path: Path, opts: RunOptions, console: Console | None = None) -> Any:
    """``replay run``: the trace through the real vLLM of ``opts.vllm``, its env built on this host
    where missing (``envs.install``, locked against another run building it at the same time)."""
    from replay.drive.runner import run
    return run(trace_path, opts, console)


@dataclass
class Job:
    """One run as a backend executes it (picklable: a Ray task gets it whole)."""

    run_id: str
    trace: Path
    opts: RunOptions
    log: Path  # the run's console output (the driver's terminal shows the matrix's table)
    devices: int = 1  # tensor_parallel_size x pipeline_parallel_size: the GPUs it needs on a GPU node


@dataclass
class Attempt:
    """What one attempt of a run came to."""

    run_id: str
    status: str  # completed | failed | interrupted
    exit_code: int | None = None
    outcome: str | None = None
    error: str | None = None
    retriable: bool = False  # failed for a reason another attempt may not meet
    node: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def attempt(job: Job, run_fn: RunFn, node: str | None = None) -> Attempt:
    """Run ``job`` once through ``run_fn``, its console into ``job.log``. A ``ReplayError`` is a failed
    attempt, not retriable; an exit of 130 (Ctrl-C inside the run) an interrupted one; any other
    exception is raised to the caller (a backend tries the run again)."""
    from replay.errors import ReplayError
    job.log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with job.log.open("a", encoding="utf-8") as fh:
        console = Console(file=fh, force_terminal=False, width=160, log_time=False)
        console.print(f"--- {job.run_id}: vLLM {job.opts.vllm}, set {job.opts.set_args or '-'}, on "
                      f"{node or socket.gethostname()} pid {os.getpid()}", markup=False)
        try:
            res = run_fn(job.trace, job.opts, console)
        except ReplayError as e:
            console.print(f"error: {e.message}", markup=False)
            return Attempt(job.run_id, "failed", e.exit_code, None, e.message, False,
                           node or socket.gethostname(), wall_s=round(time.monotonic() - t0, 3))
        except Exception:
            console.print(traceback.format_exc(), markup=False)
            raise
        code = int(getattr(res, "exit_code", 0))
        outcome = str(getattr(res, "outcome", "completed"))
        console.print(f"--- {job.run_id}: {outcome} (exit {code})", markup=False)
    status = "interrupted" if outcome == "interrupted" or code == 130 else "completed"
    return Attempt(job.run_id, status, code, outcome, None, False, node or socket.gethostname(),
                   wall_s=round(time.monotonic() - t0, 3))


def error_words(e: BaseException) -> str:
    """An exception in one line: its type and first line (a Ray error's own first line is its task's)."""
    first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    return f"{type(e).__name__}: {first}"[:500]


Progress = Callable[[str, dict[str, Any]], None]  # run id, {"state": queued|running|retrying|done, ...}
Record = Callable[[Job, Attempt, list[str], int], None]  # job, its last attempt, earlier errors, attempts


class Backend(Protocol):
    """Where a matrix's runs execute: ``LocalBackend`` or ``ray_backend.RayBackend``."""

    name: str
    shared: bool  # whether the runs execute elsewhere and read their trace from the matrix folder

    @property
    def device(self) -> str: ...  # cuda | cpu: the engine builds the runs get

    def execute(self, jobs: list[Job], run_fn: RunFn, progress: Progress, record: Record) -> None:
        """Run every job (each up to its retries), calling ``record`` in the caller's thread as each ends."""


class LocalBackend:
    """The runs one after another in this process (a run's engine is its own process group)."""

    name = "local"
    shared = False

    def __init__(self, max_retries: int = 1) -> None:
        self.max_retries = max_retries

    @property
    def device(self) -> str:
        from replay.engine.envs import has_nvidia_gpu
        return "cuda" if has_nvidia_gpu() else "cpu"

    def execute(self, jobs: list[Job], run_fn: RunFn, progress: Progress, record: Record) -> None:
        for job in jobs:
            progress(job.run_id, {"state": "queued"})
        for job in jobs:
            errors: list[str] = []
            n = 0
            while True:
                n += 1
                progress(job.run_id, {"state": "running", "attempt": n, "node": socket.gethostname()})
                try:
                    a = attempt(job, run_fn)
                except Exception as e:  # (a fault of the run, not an option: try again)
                    errors.append(error_words(e))
                    if n <= self.max_retries:
                        progress(job.run_id, {"state": "retrying", "attempt": n, "error": errors[-1]})
                        continue
                    a = Attempt(job.run_id, "failed", None, None, errors[-1], True)
                    errors.pop()
                break
            record(job, a, errors, n)
            progress(job.run_id, {"state": "done", "status": a.status, "outcome": a.outcome, "error": a.error})
            if a.status == "interrupted":
                raise KeyboardInterrupt
