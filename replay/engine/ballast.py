"""A ballast: device memory held by a helper process, so a bigger GPU behaves like the production one.

To replay an incident from an 80 GB GPU on a 141 GB one, the difference is allocated and held by a
small helper (the engine environment's own Python and torch; ``replay`` never imports torch) for the
whole run, and the engine's ``gpu_memory_utilization`` is scaled so that vLLM's budget in bytes is
the production one (``scaled_utilization``). The helper only allocates memory; it changes no GPU
setting. On CPU the same helper holds host memory, which is how its life cycle is tested here.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from replay.errors import EXIT_ENGINE, ReplayError

_HOLD = r"""
import sys
import torch
n, dev = int(sys.argv[1]), sys.argv[2]
x = torch.empty(n, dtype=torch.uint8, device=dev)
x.fill_(1)  # touch every page: on CPU untouched pages would not be resident
if dev.startswith("cuda"):
    torch.cuda.synchronize()
print("ready", x.numel(), flush=True)
sys.stdin.read()  # hold until replay closes our stdin (or exits)
"""


def scaled_utilization(util: float, production_total_bytes: int, local_total_bytes: int) -> float:
    """The local gpu_memory_utilization whose budget in bytes equals production's util x total."""
    return round(util * production_total_bytes / local_total_bytes, 4)


class Ballast:
    def __init__(self, python: Path, nbytes: int, device: str = "cuda:0") -> None:
        if nbytes <= 0:
            raise ValueError("ballast size must be positive")
        self.python, self.nbytes, self.device = python, nbytes, device
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        self.proc = subprocess.Popen([str(self.python), "-c", _HOLD, str(self.nbytes), self.device],
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
