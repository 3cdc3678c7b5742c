"""The matrix's scheduling overhead per run: a 20-run matrix (4 versions x 5 max_num_seqs values) of the
stub engine (``replay.matrix.stubrun``: the real driver and bundle writer against the stub OpenAI
server, about 0.5 s a run) on the local runner, then as Ray tasks on a local Ray cluster the benchmark
starts (one CPU: the runs one at a time, as the local runner goes, so the difference is Ray's own).
Prints from one run: wall time per run on each, the overhead per run, their ratio (target: under 1.5x),
and the cluster's start, which a matrix pays once.

Usage: python benchmarks/bench_matrix.py [--runs-per-version 5] [--speed 20] [--cpus 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from replay.drive.runner import RunOptions
from replay.matrix.local import LocalBackend
from replay.matrix.orchestrate import Matrix
from replay.matrix.stubrun import StubRun

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "example_incident_short.jsonl"
VERSIONS = ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]


def timed_matrix(root: Path, backend: object, per_version: int, speed: float) -> float:
    """Seconds to execute the matrix's runs (not its verdicts or report: the same work on either)."""
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115
    m = Matrix(TRACE, root, RunOptions(speed=speed), backend=backend, run_fn=StubRun(), console=quiet)  # type: ignore[arg-type]
    runs = m.plan(VERSIONS, {"max_num_seqs": [str(i) for i in range(1, per_version + 1)]})
    t = time.perf_counter()
    m.ensure(runs)
    took = time.perf_counter() - t
    bad = [r.id for r in runs if r.status != "completed"]
    if bad:
        raise SystemExit(f"runs failed: {bad}: {[r.reason for r in runs if r.status != 'completed'][:2]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs-per-version", type=int, default=5)
    ap.add_argument("--speed", type=float, default=20.0, help="the trace's 9.6 s at this speed (20: 0.48 s a run)")
    ap.add_argument("--cpus", type=int, default=1, help="CPUs of the local Ray cluster (1: runs one at a time)")
    a = ap.parse_args()
    n = len(VERSIONS) * a.runs_per_version
    tmp = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    try:
        local = timed_matrix(tmp / "local", LocalBackend(max_retries=0), a.runs_per_version, a.speed)
        from replay.matrix.ray_backend import cluster
        t = time.perf_counter()
        with cluster("local", num_cpus=a.cpus, max_retries=0) as backend:
            start = time.perf_counter() - t
            ray = timed_matrix(tmp / "ray", backend, a.runs_per_version, a.speed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{n}-run matrix of the stub engine (the trace at {a.speed:g}x: {9.6 / a.speed:.2f} s of requests a run)")
    print(f"  local runner:             {local:6.2f} s, {1000 * local / n:6.0f} ms a run")
    print(f"  Ray, local cluster ({a.cpus} CPU): {ray:6.2f} s, {1000 * ray / n:6.0f} ms a run "
          f"(+{1000 * (ray - local) / n:.0f} ms a run of Ray's own)")
    print(f"  cluster start:            {start:6.2f} s once ({1000 * start / n:.0f} ms a run over {n} runs)")
    print(f"ratio Ray / local: {ray / local:.2f}x (target < 1.5x); with the cluster's start: "
          f"{(ray + start) / local:.2f}x")


if __name__ == "__main__":
    main()
