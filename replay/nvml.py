"""The one module that imports pynvml (from nvidia-ml-py). Strictly read-only: only query calls.

``NvmlReader`` is the seam; ``FakeNvml`` ships in the package so the sampler and live recorder
can be tested without a GPU, the way httpx ships MockTransport.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# NVML's "not available" for a process's memory (NVML_VALUE_NOT_AVAILABLE_ulonglong): nvidia-ml-py turns
# it into None itself; a copy that does not is read the same
_NOT_AVAILABLE = 2**64 - 1


@dataclass
class GpuMemory:
    index: int
    name: str | None
    uuid: str | None
    # None where NVML states none (NOT_SUPPORTED: a unified-memory device, DGX Spark's GB10, has no
    # framebuffer of its own)
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    reserved_bytes: int | None  # v2 memory info only; None when the driver lacks it
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> used bytes (None: not reported)


class NvmlReader(Protocol):
    def read(self) -> list[GpuMemory]: ...

    def close(self) -> None: ...


class Nvml:
    """Real NVML. Raises RuntimeError with a clear message when no driver/GPU is present."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - dependency is declared
            raise RuntimeError("nvidia-ml-py is not installed") from e
        self._n: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise RuntimeError(f"NVML unavailable: {e}") from None
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def read(self) -> list[GpuMemory]:
        n = self._n
        out = []
        for i, h in enumerate(self._handles):
            reserved = None
            try:
                mem = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
                reserved = int(mem.reserved)
            except (n.NVMLError, TypeError, AttributeError):
                try:
                    mem = n.nvmlDeviceGetMemoryInfo(h)
                except n.NVMLError:  # (NOT_SUPPORTED on a unified-memory device: its memory is the host's)
                    mem = None
            procs: dict[int, int | None] = {}
            try:
                for p in n.nvmlDeviceGetComputeRunningProcesses(h):
                    used = p.usedGpuMemory
                    procs[int(p.pid)] = None if used is None or int(used) == _NOT_AVAILABLE else int(used)
            except n.NVMLError:
                pass
            name = n.nvmlDeviceGetName(h)
            uuid = n.nvmlDeviceGetUUID(h)
            out.append(GpuMemory(i, name.decode() if isinstance(name, bytes) else name,
                                 uuid.decode() if isinstance(uuid, bytes) else uuid,
                                 None if mem is None else int(mem.total), None if mem is None else int(mem.used),
                                 None if mem is None else int(mem.free), reserved, procs))
        return out

    def close(self) -> None:
        try:
            self._n.nvmlShutdown()
        except self._n.NVMLError:
            pass


class FakeNvml:
    """Scripted NVML for tests: each read() returns the next frame (the last one repeats)."""

    def __init__(self, frames: list[list[GpuMemory]]) -> None:
        self.frames = frames
        self.calls = 0

    def read(self) -> list[GpuMemory]:
        f = self.frames[min(self.calls, len(self.frames) - 1)]
        self.calls += 1
        return f

    def close(self) -> None:
        pass


def open_nvml() -> NvmlReader | None:
    try:
        return Nvml()
    except RuntimeError:
        return None
