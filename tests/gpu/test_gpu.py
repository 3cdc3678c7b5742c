"""The GPU tier: NVML read-only sampling, the ballast holding device memory, and the allocator probe
with a real CUDA OOM and its snapshot. Skipped (by conftest) where no NVIDIA GPU is present; the
Python with CUDA torch is the engine env of VLLM (or $REPLAY_TORCH_PYTHON)."""

from __future__ import annotations

import os
import pickle
import subprocess
import time
from pathlib import Path

import pytest

from replay.drive.probe import ProbeReader, probe_env
from replay.engine.ballast import Ballast
from replay.nvml import open_nvml

pytestmark = pytest.mark.gpu


def _torch_python() -> Path:
    env = os.environ.get("REPLAY_TORCH_PYTHON")
    if env:
        return Path(env)
    from replay.engine.envs import resolve
    spec = resolve(os.environ.get("VLLM", "0.32"), "cuda")
    if not spec.python.exists():
        pytest.skip("no Python with CUDA torch: set REPLAY_TORCH_PYTHON or install the engine env")
    return spec.python


def test_nvml_reads_every_gpu_read_only() -> None:
    nv = open_nvml()
    assert nv is not None
    gpus = nv.read()
    assert gpus and all(g.total_bytes > 0 and 0 <= (g.used_bytes or 0) <= g.total_bytes for g in gpus)
    nv.close()


def test_ballast_holds_device_memory() -> None:
    nv = open_nvml()
    assert nv is not None
    first = nv.read()[0]
    before = first.used_bytes or 0
    with Ballast(_torch_python(), 2 * 2**30, "cuda:0", free_before_bytes=first.free_bytes) as b:
        time.sleep(0.5)
        g = nv.read()[0]
        assert abs((g.used_bytes or 0) - before - 2 * 2**30) < 64 * 2**20  # (its context counted in)
        assert b.pid in g.processes or not g.processes  # per-process info may be hidden in containers
    time.sleep(0.5)
    assert (nv.read()[0].used_bytes or 0) < before + 2**30


def test_probe_samples_allocator_and_snapshots_a_real_oom(tmp_path: Path) -> None:
    pdir = tmp_path / "probe"
    code = ("import time, torch\n"
            "x = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda')\n"
            "time.sleep(1.0)\n"
            "try:\n    torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
            "except torch.OutOfMemoryError:\n    pass\n"
            "time.sleep(0.5)\n")
    env = {**os.environ, **probe_env(pdir, interval_s=0.1)}
    r = subprocess.run([str(_torch_python()), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    reader = ProbeReader(pdir, 0.0)
    samples, events = reader.poll()
    reserved = [s[4] for s in samples if s[3] == "torch_reserved_bytes"]
    assert reserved and max(reserved) >= 256 * 2**20
    oom = [e for e in events if e["kind"] == "torch_oom"]
    assert oom and oom[0]["snapshot"]
    snap = pickle.loads((pdir / oom[0]["snapshot"]).read_bytes())
    assert "segments" in snap


_RAMP = ("import sys, time, torch\n"
         "held = []\n"
         "for _ in range(4):\n"
         "    held.append(torch.ones(2**30, dtype=torch.uint8, device='cuda'))\n"
         "    torch.cuda.synchronize()\n"
         "    time.sleep(0.6)\n"
         "try:\n    torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
         "except torch.OutOfMemoryError:\n    print('oom', flush=True)\n"
         "time.sleep(0.6)\n")


def _first_at(df: object, level: float) -> int:
    import polars as pl
    assert isinstance(df, pl.DataFrame)
    hit = df.filter(pl.col("value") >= level)
    assert hit.height, f"never reached {level / 2**30:.2f} GiB"
    return int(hit["t_us"].min())  # type: ignore[arg-type]


def test_sampler_puts_nvml_the_probe_and_a_real_oom_on_one_timeline(tmp_path: Path) -> None:
    """A torch process on the GPU takes 1 GiB four times, then meets a real CUDA OOM, beside a 2 GiB
    ballast. The sampler's NVML series, the in-process probe's allocator series and the OOM event land
    in one bundle, on one clock: the device's used memory reaches +4 GiB within a second of torch's
    reserve doing so, and the OOM comes after both."""
    import polars as pl

    from replay.bundle import BundleMeta, BundleWriter, read_bundle
    from replay.sampler import Sampler

    python = _torch_python()
    nv = open_nvml()
    assert nv is not None
    uuids = {g.uuid: g.index for g in nv.read() if g.uuid}
    t0 = time.time()
    writer = BundleWriter(tmp_path / "bundle", BundleMeta(kind="replay", extra={"device": "cuda"}))
    pdir = tmp_path / "probe"
    env = {**os.environ, **probe_env(pdir, interval_s=0.05)}
    with Ballast(python, 2 * 2**30, "cuda:0") as ballast:
        child = subprocess.Popen([str(python), "-c", _RAMP], env=env, stdout=subprocess.PIPE, text=True)
        sampler = Sampler(writer, t0, metrics_url=None, nvml=nv, pids=lambda: [child.pid], interval_s=0.05,
                          probe=ProbeReader(pdir, t0, uuids), ballast_pids={ballast.pid} if ballast.pid else None)
        sampler.start()
        out, _ = child.communicate(timeout=300)
        time.sleep(0.3)
        sampler.stop()
    writer.close()
    nv.close()
    assert child.returncode == 0 and "oom" in out
    b = read_bundle(tmp_path / "bundle")
    s = b.samples
    used = s.filter((pl.col("source") == "nvml") & (pl.col("metric") == "device_used_bytes") & (pl.col("gpu") == 0))
    reserved = s.filter((pl.col("source") == "torch") & (pl.col("metric") == "torch_reserved_bytes"))
    assert used.height > 20 and reserved.height > 20
    base = float(used["value"].min())  # type: ignore[arg-type]
    assert float(reserved["value"].max()) >= 4 * 2**30  # type: ignore[arg-type]
    t_nvml = _first_at(used, base + 3.9 * 2**30)
    t_torch = _first_at(reserved, 3.9 * 2**30)
    assert abs(t_nvml - t_torch) < 1_000_000, (t_nvml, t_torch)
    oom = b.events_of("torch_oom")
    assert len(oom) == 1 and oom[0]["snapshot"] and oom[0]["tried_to_allocate_bytes"] == 1 << 50
    assert int(oom[0]["t_us"]) > max(t_nvml, t_torch)
    own = s.filter((pl.col("source") == "nvml") & (pl.col("metric") == "process_used_bytes"))
    held = s.filter((pl.col("source") == "nvml") & (pl.col("metric") == "ballast_bytes"))
    if own.height:  # (per-process figures may be hidden in a container)
        assert float(own["value"].max()) >= 4 * 2**30  # type: ignore[arg-type]
        assert float(held["value"].max()) >= 2 * 2**30  # type: ignore[arg-type]


def test_emulated_capacity_leaves_an_engine_production_s_free_memory() -> None:
    """Production's 80 GiB GPU on this larger one: the planned ballast, its own CUDA context counted in
    it, takes exactly its size (within 64 MiB) from what a new CUDA process finds free
    (torch.cuda.mem_get_info, the figure vLLM sizes its KV cache from), and the scaled utilization's
    budget in bytes is production's."""
    from rich.console import Console

    from replay.drive.runner import RunOptions, _plan_emulation

    python = _torch_python()
    nv = open_nvml()
    assert nv is not None
    gpu = nv.read()[0]
    prod_total = 80 * 2**30
    if gpu.total_bytes is None or gpu.total_bytes < prod_total + 4 * 2**30:
        pytest.skip("this GPU is not larger than an 80 GiB one")
    args: dict[str, object] = {"gpu_memory_utilization": 0.9}
    plan = _plan_emulation(nv, {"gpu_total_bytes": prod_total, "gpu_name": "NVIDIA A100-SXM4-80GB"}, args,
                           RunOptions(emulate_capacity=True), Console(quiet=True))
    assert plan is not None and plan["ballast_bytes"] == gpu.total_bytes - prod_total
    assert abs(float(plan["gpu_memory_utilization_scaled"]) * gpu.total_bytes - 0.9 * prod_total) < 2**30 / 100
    probe = [str(python), "-c", "import torch; print(*torch.cuda.mem_get_info())"]
    alone = subprocess.run(probe, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-2000:]
    free_alone, total = (int(v) for v in alone.stdout.split())
    assert total == gpu.total_bytes - (gpu.reserved_bytes or 0)  # (CUDA's total leaves out the driver's reserve)
    with Ballast(python, int(plan["ballast_bytes"]), "cuda:0", free_before_bytes=nv.read()[0].free_bytes) as b:
        beside = subprocess.run(probe, capture_output=True, text=True, timeout=300)
    nv.close()
    assert beside.returncode == 0, beside.stderr[-2000:]
    taken = free_alone - int(beside.stdout.split()[0])
    assert abs(taken - plan["ballast_bytes"]) < 64 * 2**20, (taken - plan["ballast_bytes"]) / 2**20
    assert b.context_bytes is not None and 0 < b.context_bytes < 4 * 2**30


def test_live_recording_keeps_a_real_gpu_process_s_memory(tmp_path: Path) -> None:
    """`record --live --nvml` beside a vLLM-like /metrics endpoint while a torch process holds 3 GiB:
    the recording runs its whole duration (its first NVML read of a GPU with a process raised, and
    ended it), and that process's memory is a series of its own, of at least what it holds."""
    import io

    import polars as pl
    from rich.console import Console

    from replay.bundle import read_bundle
    from replay.record.live import record_live
    from tests.conftest import DATA, metrics_server

    hold = ("import sys, torch\nx = torch.ones(3 * 2**30, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()\nprint('ready', flush=True)\nsys.stdin.read()\n")
    child = subprocess.Popen([str(_torch_python()), "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("ready")
        with metrics_server((DATA / "vllm_v0_metrics_excerpt.prom").read_bytes()) as url:
            res = record_live(url, tmp_path / "live", interval_s=0.1, duration_s=1.5, use_nvml=True,
                              console=Console(file=io.StringIO()))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
    assert res["seconds"] >= 1.5
    s = read_bundle(tmp_path / "live").samples
    mine = s.filter((pl.col("source") == "nvml") & (pl.col("metric") == f"process_used_bytes:{child.pid}"))
    assert mine.height >= 10 and float(mine["value"].min()) >= 3 * 2**30  # type: ignore[arg-type]
    used = s.filter((pl.col("source") == "nvml") & (pl.col("metric") == "device_used_bytes"))
    assert used.height >= 10 and float(used["value"].min()) >= 3 * 2**30  # type: ignore[arg-type]
