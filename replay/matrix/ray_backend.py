"""A matrix's runs as Ray tasks (the ``replay[cluster]`` extra; the only module that imports ray).

Each run is one task asking for what its engine needs: on a cluster with GPUs, the GPUs of its tensor x
pipeline parallel size; on a CPU-only cluster, that many times ``cpus_per_run`` CPUs. On its node the
task gets its vLLM version's env the way ``replay run`` does (``envs.install``: built once per node,
locked against a second builder) and writes its bundle under the matrix folder, which must be a path
every node and the driver share (``-o`` on a shared file system; a local cluster shares this host's).
A task that raises, or whose worker or node dies, is tried again up to ``max_retries`` times; a
``ReplayError`` (an engine that cannot be installed, an option it cannot use) is a failed run at once.
Progress comes back through a small actor the driver polls for its live table.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import ray

from replay.errors import EXIT_ENGINE, EXIT_USAGE, ReplayError
from replay.matrix.local import Attempt, Job, Progress, Record, RunFn, attempt, error_words

_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_RESOURCE = {"num_cpus": "CPU", "num_gpus": "GPU"}
CANCEL_WAIT_S = 60.0  # after Ctrl-C: how long the runs' own shutdown (their engines stopped) is waited for


@ray.remote(num_cpus=0)
class _Board:
    """Where tasks post their progress; the driver drains it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def post(self, run_id: str, info: dict[str, Any]) -> None:
        self.events.append((run_id, info))

    def drain(self) -> list[tuple[str, dict[str, Any]]]:
        out, self.events = self.events, []
        return out


def _task(job: Job, run_fn: RunFn, board: Any) -> Attempt:
    host = socket.gethostname()
    board.post.remote(job.run_id, {"state": "running", "node": host, "t": time.time()})
    try:
        return attempt(job, run_fn, node=host)
    except Exception as e:
        board.post.remote(job.run_id, {"state": "error", "error": error_words(e)})
        raise


_remote_task = ray.remote(_task)


def _cause(e: BaseException) -> BaseException:
    """The task's own exception inside Ray's wrapper."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


class RayBackend:
    """Runs as Ray tasks on the cluster this process is connected to (``cluster``)."""

    name = "ray"
    shared = True

    def __init__(self, max_retries: int = 1, cpus_per_run: float = 1.0, poll_s: float = 0.5) -> None:
        if max_retries < 0:
            raise ReplayError(f"--retries: expected 0 or more, got {max_retries}", EXIT_USAGE)
        if cpus_per_run <= 0:
            raise ReplayError(f"--cpus-per-run: expected more than 0, got {cpus_per_run}", EXIT_USAGE)
        self.max_retries = max_retries
        self.cpus_per_run = cpus_per_run
        self.poll_s = poll_s
        self._device: str | None = None

    @property
    def device(self) -> str:
        """cuda where the cluster has GPUs (the runs get CUDA builds and ask for GPUs), else cpu."""
        if self._device is None:
            gpus = ray.cluster_resources().get("GPU", 0)  # type: ignore[no-untyped-call,unused-ignore]
            self._device = "cuda" if float(gpus) > 0 else "cpu"
        return self._device

    def resources(self, job: Job) -> dict[str, float]:
        if self.device == "cuda":
            return {"num_gpus": float(job.devices), "num_cpus": 1.0}
        return {"num_cpus": self.cpus_per_run * job.devices}

    def _check_fits(self, jobs: list[Job]) -> None:
        """Refuse a run no node of the cluster can hold (Ray would queue it for ever)."""
        nodes = [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call,unused-ignore]
        for job in jobs:
            need = {_RESOURCE[k]: v for k, v in self.resources(job).items() if v}
            if not any(all(float(n.get(k, 0)) >= v for k, v in need.items()) for n in nodes):
                what = ", ".join(f"{v:g} {k}" for k, v in need.items())
                raise ReplayError(f"run {job.run_id} needs {what} on one node; no node of the cluster has that "
                                  "(tensor_parallel_size x pipeline_parallel_size, --cpus-per-run)", EXIT_ENGINE)

    def execute(self, jobs: list[Job], run_fn: RunFn, progress: Progress, record: Record) -> None:
        if not jobs:
            return
        self._check_fits(jobs)
        board = _Board.remote()  # type: ignore[attr-defined]
        fn_ref = ray.put(run_fn)
        refs: dict[Any, Job] = {}
        for job in jobs:
            progress(job.run_id, {"state": "queued"})
            ref = _remote_task.options(max_retries=self.max_retries, retry_exceptions=True,
                                       **self.resources(job)).remote(job, fn_ref, board)
            refs[ref] = job
        tries: dict[str, int] = defaultdict(int)
        errors: dict[str, list[str]] = defaultdict(list)
        open_try: dict[str, bool] = defaultdict(bool)  # an attempt began and has not reported its end

        def drain() -> None:
            for rid, info in ray.get(board.drain.remote()):
                if info.get("state") == "running":
                    if open_try[rid]:  # (the last attempt never said how it ended: its worker or node died)
                        errors[rid].append(f"attempt {tries[rid]} ended without a result (its worker or node died)")
                        progress(rid, {"state": "retrying", "attempt": tries[rid], "error": errors[rid][-1]})
                    tries[rid] += 1
                    open_try[rid] = True
                    progress(rid, {"state": "running", "attempt": tries[rid], "node": info.get("node")})
                elif info.get("state") == "error":
                    open_try[rid] = False
                    errors[rid].append(str(info.get("error")))
                    progress(rid, {"state": "retrying", "attempt": tries[rid], "error": errors[rid][-1]})

        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=self.poll_s)
                drain()
                for ref in done:
                    job = refs[ref]
                    try:
                        a: Attempt = ray.get(ref)
                        earlier = errors[job.run_id]
                    except ray.exceptions.TaskCancelledError:
                        a = Attempt(job.run_id, "interrupted", None, None, "cancelled", False, "")
                        earlier = errors[job.run_id]
                    except ray.exceptions.RayError as e:
                        words = error_words(_cause(e))
                        earlier = [x for x in errors[job.run_id] if x != words]
                        a = Attempt(job.run_id, "failed", None, None, words, True, "")
                    record(job, a, list(earlier), max(1, tries[job.run_id]))
                    progress(job.run_id, {"state": "done", "status": a.status, "outcome": a.outcome, "error": a.error})
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=False)
            with contextlib.suppress(Exception):
                ray.wait(pending, num_returns=len(pending), timeout=CANCEL_WAIT_S)
            raise
        finally:
            with contextlib.suppress(Exception):
                ray.kill(board)


def _quiet() -> None:
    for name in ("ray", "ray._private", "ray.worker"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # (a local cluster's token is its own business: not a warning to the user)
    logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)


@contextlib.contextmanager
def cluster(address: str, *, num_cpus: int | None = None, max_retries: int = 1, cpus_per_run: float = 1.0,
            runtime_env: dict[str, Any] | None = None) -> Iterator[RayBackend]:
    """Connected to a Ray cluster for the block: ``local`` starts a head on this host (CPU and GPU
    resources as it finds them, or ``num_cpus``; its session under a fresh folder in /tmp, no dashboard,
    a token of its own unless RAY_AUTH_* says otherwise) and stops it at the end; an ADDRESS (``host:port``, ``ray://host:10001``, ``auto``) joins a cluster
    and leaves it running. Already connected (``ray.init`` called by the caller): that connection."""
    _quiet()
    owned = not ray.is_initialized()
    temp: str | None = None
    saved = {k: os.environ.get(k) for k in _AUTH_ENV}
    try:
        if owned:
            if address == "local":
                if not any(os.environ.get(k) for k in _AUTH_ENV):
                    # (a token of its own, for its lifetime, that ray.init takes up: none written to ~/.ray)
                    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
                temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp,
                         object_store_memory=128 * 2**20, log_to_driver=False, logging_level=logging.WARNING,
                         runtime_env=runtime_env)
            else:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as e:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        _restore(saved)
        raise ReplayError(f"--ray {address}: cannot connect to a Ray cluster ({error_words(e)})", EXIT_ENGINE) from None
    try:
        yield RayBackend(max_retries=max_retries, cpus_per_run=cpus_per_run)
    finally:
        if owned:
            ray.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        _restore(saved)


def _restore(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

