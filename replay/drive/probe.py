"""The replay side of the in-engine torch allocator probe (``replay/engine/probe/sitecustomize.py``).

``probe_env`` switches the probe on for a server (PYTHONPATH and REPLAY_PROBE_DIR); ``ProbeReader``
follows the files it writes, one per engine process, and turns them into bundle samples (source
``torch``: ``torch_reserved_bytes``, ``torch_allocated_bytes`` per GPU) and events (the processes
that loaded it, CUDA OOMs with the snapshot file for PyTorch's memory viewer).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE_DIR = Path(__file__).resolve().parent.parent / "engine" / "probe"


def probe_env(out_dir: Path, interval_s: float = 0.25, history: bool = False) -> dict[str, str]:
    """Environment for the engine server that loads the probe into each of its Python processes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(PROBE_DIR) + (os.pathsep + path if path else ""), "REPLAY_PROBE_DIR": str(out_dir),
            "REPLAY_PROBE_INTERVAL_S": str(interval_s), "REPLAY_PROBE_HISTORY": "1" if history else "0"}


Sample = tuple[int, int | None, str, str, float]


def _bare(uuid: str) -> str:
    return uuid.removeprefix("GPU-")


@dataclass
class ProbeReader:
    """Follows ``probe-<pid>.jsonl`` files; times become µs from the bundle's t0 (wall clock)."""

    directory: Path
    t0_wall: float
    uuid_to_index: dict[str, int] = field(default_factory=dict)  # NVML's view, when there is one
    processes: dict[int, list[str]] = field(default_factory=dict)
    cuda_processes: set[int] = field(default_factory=set)
    oom_snapshots: list[str] = field(default_factory=list)
    errors: int = 0
    _pos: dict[Path, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # NVML names a GPU "GPU-<uuid>", torch by the bare uuid: compare them without the prefix
        self.uuid_to_index = {_bare(u): i for u, i in self.uuid_to_index.items()}

    def poll(self) -> tuple[list[Sample], list[dict[str, Any]]]:
        samples: list[Sample] = []
        events: list[dict[str, Any]] = []
        for f in sorted(self.directory.glob("probe-*.jsonl")):
            try:
                with f.open("rb") as fh:
                    fh.seek(self._pos.get(f, 0))
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # only complete lines; the rest next time
            self._pos[f] = self._pos.get(f, 0) + end
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self.errors += 1
                    continue
                self._one(rec, f, samples, events)
        return samples, events

    def _t(self, rec: dict[str, Any]) -> int:
        return int((float(rec.get("t", self.t0_wall)) - self.t0_wall) * 1_000_000)

    def _one(self, rec: dict[str, Any], f: Path, samples: list[Sample], events: list[dict[str, Any]]) -> None:
        kind = rec.get("kind")
        pid = int(rec.get("pid") or f.stem.split("-")[-1])
        if kind == "hello":
            self.processes[pid] = list(rec.get("argv") or [])
        elif kind == "cuda":
            self.cuda_processes.add(pid)
        elif kind == "sample":
            gpu = self.uuid_to_index.get(_bare(str(rec.get("uuid") or "")), int(rec.get("device") or 0))
            t = self._t(rec)
            samples.append((t, gpu, "torch", "torch_reserved_bytes", float(rec["reserved"])))
            samples.append((t, gpu, "torch", "torch_allocated_bytes", float(rec["allocated"])))
        elif kind == "oom":
            if rec.get("snapshot"):
                self.oom_snapshots.append(str(rec["snapshot"]))
            events.append({"t_us": self._t(rec), "kind": "torch_oom", "source": f"probe/{f.name}", "pid": pid,
                           "gpu": rec.get("device"), "tried_to_allocate_bytes": rec.get("tried_bytes"),
                           "device_allocated_bytes": rec.get("device_allocated_bytes"),
                           "free_bytes": rec.get("device_free_bytes"), "snapshot": rec.get("snapshot")})
        elif kind == "probe_error":
            self.errors += 1

    def summary(self) -> dict[str, Any]:
        return {"processes": [{"pid": p, "argv": a} for p, a in sorted(self.processes.items())],
                "cuda_processes": sorted(self.cuda_processes), "oom_snapshots": self.oom_snapshots,
                "errors": self.errors}
