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
    before = nv.read()[0].used_bytes or 0
    with Ballast(_torch_python(), 2 * 2**30, "cuda:0") as b:
        time.sleep(0.5)
        g = nv.read()[0]
        assert (g.used_bytes or 0) - before >= 2 * 2**30 * 0.95
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
