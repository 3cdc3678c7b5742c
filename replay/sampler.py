"""One-clock sampler for a running engine (a replay's, or the one ``record --live`` watches): vLLM
``/metrics``, actual memory (process-tree RSS on CPU, NVML device and per-process on CUDA), from its
own threads: memory in one, the scrape in another, so that a server too busy to answer ``/metrics`` at
once does not hold back the memory samples (those are what an incident is read from). It measures its
own CPU time so the run can report the sampler's overhead next to the engine's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from replay.bundle import BundleWriter
from replay.metrics import vllm_metric_values
from replay.nvml import NvmlReader

Sample = tuple[int, int | None, str, str, float]  # (t_us, gpu, source, metric, value)


class Probe(Protocol):
    """What the sampler reads at each tick besides memory and metrics (a replay's in-engine probe)."""

    def poll(self) -> tuple[list[Sample], list[dict[str, Any]]]: ...

    def summary(self) -> dict[str, Any]: ...


class Sampler:
    def __init__(self, writer: BundleWriter, t0_wall: float, *, metrics_url: str | None,
                 rss: Callable[[], int | None] | None = None, nvml: NvmlReader | None = None,
                 pids: Callable[[], list[int]] | None = None, interval_s: float = 0.25,
                 capacity_bytes: int | None = None, on_capacity: Callable[[int], None] | None = None,
                 probe: Probe | None = None, ballast_pids: set[int] | None = None, per_process: bool = False) -> None:
        self.w = writer
        self.t0 = t0_wall
        self.metrics_url = metrics_url
        self.rss = rss
        self.nvml = nvml
        self.pids = pids
        self.interval_s = interval_s
        self.capacity_bytes = capacity_bytes
        self.on_capacity = on_capacity
        self.probe = probe
        self.ballast_pids = ballast_pids or set()  # capacity emulation: not a co-tenant
        self.per_process = per_process  # each GPU process's memory a series of its own ('process_used_bytes:<pid>')
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="replay-sampler", daemon=True)
        self._scraper = threading.Thread(target=self._scrape_loop, name="replay-scraper", daemon=True)
        self._client: httpx.Client | None = None
        self._cpu_s = {"memory": 0.0, "metrics": 0.0}
        self.n = 0
        self.last_rss: int | None = None
        self.peak_rss: int | None = None
        self.last_kv: float | None = None
        self.metrics_errors = 0
        self.failed: dict[str, int] = {}  # ticks of a thread that raised ("memory", "metrics")
        self.first_failure: dict[str, str] = {}  # what the first of them raised

    def t_us(self) -> int:
        return int((time.time() - self.t0) * 1_000_000)

    @property
    def cpu_s(self) -> float:
        """CPU time of the sampler's threads so far, seconds."""
        return sum(self._cpu_s.values())

    def start(self) -> None:
        self._thread.start()
        if self.metrics_url:
            self._client = httpx.Client(timeout=2.0)  # (made here, not on the scraper's clock)
            self._scraper.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._scraper.is_alive():
            self._scraper.join(timeout=10)
        if self._client is not None:
            self._client.close()

    def sample_once(self, client: httpx.Client | None) -> None:
        """One tick: memory, and the scrape where ``client`` is given."""
        self.sample_memory()
        if client is not None:
            self.scrape(client)
        self.n += 1

    def sample_memory(self) -> None:
        """Actual memory (process RSS, NVML) and the probe's figures, each at the time it was read. (Stamped
        once read, not when asked: a walk of the process tree waits for the GIL and the CPU, and a sample
        stamped before it could show memory that a request sent meanwhile had already taken, before that
        request on the timeline.)"""
        if self.rss is not None:
            v = self.rss()
            t = self.t_us()
            if v is not None:
                self.last_rss = v
                self.peak_rss = max(self.peak_rss or 0, v)
                with self.lock:
                    self.w.sample(t, None, "process", "process_rss_bytes", v)
                if self.capacity_bytes and v > self.capacity_bytes and self.on_capacity:
                    self.on_capacity(v)
        if self.nvml is not None:
            mine = set(self.pids() if self.pids else [])
            gpus = self.nvml.read()
            t = self.t_us()
            for g in gpus:
                with self.lock:
                    self.w.sample(t, g.index, "nvml", "device_used_bytes", g.used_bytes)
                    self.w.sample(t, g.index, "nvml", "device_total_bytes", g.total_bytes)
                    self.w.sample(t, g.index, "nvml", "device_free_bytes", g.free_bytes)
                    self.w.sample(t, g.index, "nvml", "device_reserved_bytes", g.reserved_bytes)
                    own = sum(v or 0 for p, v in g.processes.items() if p in mine)
                    held = sum(v or 0 for p, v in g.processes.items() if p in self.ballast_pids)
                    other = sum(v or 0 for p, v in g.processes.items() if p not in mine and p not in self.ballast_pids)
                    if self.ballast_pids:
                        self.w.sample(t, g.index, "nvml", "ballast_bytes", held)
                    if mine:
                        self.w.sample(t, g.index, "nvml", "process_used_bytes", own)
                    self.w.sample(t, g.index, "nvml", "other_processes_bytes", other)
                    if self.per_process:
                        for pid, used in g.processes.items():
                            self.w.sample(t, g.index, "nvml", f"process_used_bytes:{pid}", used)
        if self.probe is not None:
            ps, pe = self.probe.poll()
            with self.lock:
                for s in ps:
                    self.w.sample(*s)
                for e in pe:
                    self.w.event(e)

    def scrape(self, client: httpx.Client) -> None:
        """vLLM's /metrics, at the time it was asked for (a failed scrape is counted, not fatal)."""
        t = self.t_us()
        if self.metrics_url:
            try:
                r = client.get(self.metrics_url)
                r.raise_for_status()  # (an error page holds no metrics: a failed scrape, not an empty one)
                with self.lock:
                    for metric, value in vllm_metric_values(r.text):
                        self.w.sample(t, None, "vllm-metrics", metric, value)
                        if metric == "kv_usage_ratio":
                            self.last_kv = value
            except httpx.HTTPError:
                self.metrics_errors += 1

    def _every(self, what: str, tick: Callable[[], None]) -> None:
        """``tick`` every interval until stopped (a late tick is not made up), its thread's CPU time kept."""
        start_cpu = time.thread_time()
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                tick()
            except Exception as e:  # (one failed reading is a gap in the series, not the end of them all)
                self.failed[what] = self.failed.get(what, 0) + 1
                self.first_failure.setdefault(what, f"{type(e).__name__}: {e}")
            self._cpu_s[what] = time.thread_time() - start_cpu
            nxt = max(nxt + self.interval_s, time.monotonic())
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def failures(self) -> list[str]:
        """Each thread's failed ticks, said once with what the first raised (none: an empty list)."""
        return [f"{what} sampling failed {n} time(s), its series has gaps there (first: {self.first_failure[what]})"
                for what, n in sorted(self.failed.items())]

    def _loop(self) -> None:
        self._every("memory", lambda: self.sample_once(None))

    def _scrape_loop(self) -> None:
        client = self._client
        if client is not None:
            self._every("metrics", lambda: self.scrape(client))
