"""A ballast: device memory held by a helper process, so a bigger GPU behaves like the production one.

To replay an incident from an 80 GB GPU on a 141 GB one, the difference is allocated and held by a
small helper (the engine environment's own Python and torch; ``replay`` never imports torch) for the
whole run, and the engine's ``gpu_memory_utilization`` is scaled so that vLLM's budget in bytes is
the production one (``scaled_utilization``). The helper only allocates memory; it changes no GPU
setting. On CPU the same helper holds host memory, which is how its life cycle is tested here.

The helper's own CUDA context takes device memory too (619 MiB on an H200 with torch 2.11, 527 of
them the context and the rest the kernels loaded at first use): given the device's free bytes before
it starts (NVML's), the helper measures its context and allocates that much less, so that the engine
finds exactly ``nbytes`` fewer free.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from replay.errors import EXIT_ENGINE, ReplayError

_HOLD = r"""
import sys
import torch
n, dev, free_before = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
context = 0
if dev.startswith("cuda") and free_before >= 0:
    torch.ones(1, dtype=torch.uint8, device=dev).fill_(1)  # the context, and the kernels the fill loads
    torch.cuda.synchronize()
    context = max(0, free_before - torch.cuda.mem_get_info(dev)[0])
x = torch.empty(max(1, n - context), dtype=torch.uint8, device=dev)
x.fill_(1)  # touch every page: on CPU untouched pages would not be resident
if dev.startswith("cuda"):
    torch.cuda.synchronize()
print("ready", x.numel(), context, flush=True)
sys.stdin.read()  # hold until replay closes our stdin (or exits)
"""


def scaled_utilization(util: float, production_total_bytes: int, local_total_bytes: int) -> float:
    """The local gpu_memory_utilization whose budget in bytes equals production's util x total."""
    return round(util * production_total_bytes / local_total_bytes, 4)


class Ballast:
    """``nbytes`` held on ``device``; with ``free_before_bytes`` (the device's free memory before the
    helper starts) its CUDA context is counted in them. ``context_bytes`` is what the context took."""

    def __init__(self, python: Path, nbytes: int, device: str = "cuda:0", *,
                 free_before_bytes: int | None = None) -> None:
        if nbytes <= 0:
            raise ValueError("ballast size must be positive")
        self.python, self.nbytes, self.device = python, nbytes, device
        self.free_before_bytes = free_before_bytes
        self.context_bytes: int | None = None
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        free = -1 if self.free_before_bytes is None else self.free_before_bytes
        self.proc = subprocess.Popen([str(self.python), "-c", _HOLD, str(self.nbytes), self.device, str(free)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = self.proc.stdout.readline()  # blocks until ready or the helper dies
        if not line.startswith("ready") or time.monotonic() > deadline:
            err = self.proc.stderr.read()[-800:] if self.proc.stderr else ""
            self.stop()
            raise ReplayError(f"could not hold a {self.nbytes / 2**30:.2f} GiB ballast on {self.device}: "
                              f"{err.strip() or 'helper exited'}", EXIT_ENGINE)
        if self.free_before_bytes is not None:
            self.context_bytes = int(line.split()[2])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Ballast:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
