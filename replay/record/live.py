"""``replay record --live``: poll a running vLLM server's ``/metrics`` (and NVML, read-only) into a
bundle written incrementally, so a crash or Ctrl-C still leaves a readable bundle. Warns when actual
memory grows beyond what vLLM sized.

A new bundle is written where it is named, readable while it records, and marked complete when the
recording stops (Ctrl-C, SIGTERM, --duration); one its recorder could not close (killed, the host
down) is read with a note that it did not finish. Over an earlier bundle, the recording is written
beside it (OUT.partial-PID, named when it starts) and replaces it only once it is complete."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.markup import escape

from replay.atomic import write_error
from replay.bundle import BundleMeta, BundleWriter, bundle_written, utc_now_iso, writes_in_place
from replay.errors import ReplayError
from replay.metrics import CACHE_CONFIG, vllm_metric_values, vllm_name
from replay.nvml import NvmlReader, open_nvml
from replay.sampler import Sampler
from replay.text import console as safe_console
from replay.units import fraction


def process_tree_rss(pid: int) -> Callable[[], int | None]:
    """The resident memory of a process and all its children (vLLM's API server, engine core and workers),
    read anew at each call; None once the process is gone."""
    def rss() -> int | None:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        total, seen = 0, False
        for p in procs:
            try:
                total += p.memory_info().rss
                seen = True
            except psutil.Error:
                continue
        return total if seen else None
    return rss


def _check_pid(pid: int) -> str:
    try:
        p = psutil.Process(pid)
        return " ".join(p.cmdline()[:4]) or p.name()
    except psutil.NoSuchProcess:
        raise ReplayError(f"--pid {pid}: no such process on this host") from None
    except psutil.AccessDenied:
        raise ReplayError(f"--pid {pid}: not permitted to read that process's memory (run as its user)") from None


def _scraped_config(text: str) -> dict[str, str] | None:
    """The labels of ``vllm:cache_config_info`` in a scrape: the KV cache's settings as vLLM states them."""
    from prometheus_client.parser import text_string_to_metric_families
    try:
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                if vllm_name(smp.name) == CACHE_CONFIG:
                    return dict(smp.labels)
    except ValueError:
        return None
    return None


def record_live(url: str, out: Path, *, interval_s: float = 1.0, duration_s: float | None = None,
                use_nvml: bool = False, nvml: NvmlReader | None = None, console: Console | None = None,
                pid: int | None = None) -> dict[str, Any]:
    console = console or safe_console(stderr=True)
    proc_name = _check_pid(pid) if pid is not None else None
    base = url.rstrip("/").removesuffix("/metrics")
    try:
        first = httpx.get(f"{base}/metrics", timeout=5.0)
        first.raise_for_status()
    except httpx.HTTPError as e:
        raise ReplayError(f"{base}/metrics: not reachable ({e})") from None
    if use_nvml and nvml is None:
        nvml = open_nvml()
        if nvml is None:
            raise ReplayError("--nvml: NVML is not available on this host (no NVIDIA driver)")
    warnings: list[str] = []
    if not vllm_metric_values(first.text):  # (an HTML page, another exporter, vLLM with --disable-log-stats)
        head = first.text.strip().splitlines()[0][:80] if first.text.strip() else "an empty body"
        msg = (f"{base}/metrics answered without any vLLM metric (vllm:…; it begins with {head!r}): not vLLM's "
               "server, or one started with --disable-log-stats")
        if nvml is None:
            raise ReplayError(msg + "; there is nothing to record (--nvml samples GPU memory alone)")
        warnings.append(msg + "; recording NVML alone")
        console.print(f"[yellow]{escape(warnings[-1])}[/]")
    if nvml is None and pid is None:
        warnings.append("no actual memory is recorded (no --nvml, no --pid): only what vLLM reports; on a host "
                        "without NVML, --pid PID samples the server's process-tree memory")
        console.print(f"[yellow]{escape(warnings[-1])}[/]")
    meta = BundleMeta(kind="production", t0_utc=utc_now_iso(), notes=list(warnings),
                      extra={"live_url": base, "interval_s": interval_s, "pid": pid, "process": proc_name})
    config = _scraped_config(first.text)
    failure: BaseException | None = None
    with ExitStack() as stack:
        into = out
        if not writes_in_place(out):
            into = stack.enter_context(bundle_written(out))
            console.print(f"[dim]recording into {escape(str(into))}; it replaces {escape(str(out))} when the "
                          "recording stops[/]")
        t0 = time.time()
        w = BundleWriter(into, meta, flush_every=500)
        s: Sampler | None = None
        try:
            if config:  # (as a scrape file's: the recorder reads the configuration from it)
                w.event({"t_us": 0, "kind": "kv_config", "source": f"{base}/metrics", "rank": None, **config})
                util = fraction(config.get("gpu_memory_utilization"))
                if util is not None:
                    meta.engine_args["gpu_memory_utilization"] = util
            s = Sampler(w, t0, metrics_url=f"{base}/metrics", nvml=nvml, interval_s=interval_s, per_process=True,
                        rss=process_tree_rss(pid) if pid is not None else None)
            _poll(s, w, nvml, t0, interval_s, duration_s, warnings, console)
        except KeyboardInterrupt:  # (Ctrl-C, SIGTERM: how a live recording is meant to stop)
            w.event({"t_us": s.t_us() if s is not None else 0, "kind": "interrupted", "source": "live"})
        except BaseException as e:  # (what was recorded until then is kept: the bundle is closed, then it is said)
            failure = e
        finally:
            w.close()
    if failure is not None:
        raise write_error(failure, out) or failure
    return {"samples": w.counts["samples"], "seconds": time.time() - t0,
            "metrics_errors": s.metrics_errors if s is not None else 0, "warnings": warnings}


def _poll(s: Sampler, w: BundleWriter, nvml: NvmlReader | None, t0: float, interval_s: float,
          duration_s: float | None, warnings: list[str], console: Console) -> None:
    """Sample every ``interval_s`` until ``duration_s`` has passed (or for ever), flushing every tenth."""
    start_used: dict[int, int] = {}
    n = 0
    with httpx.Client(timeout=5.0) as client:
        while duration_s is None or time.time() - t0 < duration_s:
            tick = time.monotonic()
            s.sample_once(client)
            if nvml is not None:
                for g in nvml.read():
                    if g.used_bytes is None or g.total_bytes is None:
                        if not any(f"GPU {g.index}: NVML" in x for x in warnings):
                            warnings.append(f"GPU {g.index}: NVML states no device memory ({g.name}: a unified-memory "
                                            "device, whose memory is the host's); its processes' memory is recorded")
                            console.print(f"[yellow]{escape(warnings[-1])}[/]")
                        continue
                    start_used.setdefault(g.index, g.used_bytes)
                    growth = g.used_bytes - start_used[g.index]
                    if growth > 0.05 * g.total_bytes and not any(f"GPU {g.index}" in x for x in warnings):
                        msg = f"GPU {g.index}: device memory grew {growth / 2**30:.2f} GiB since start while vLLM's KV pool is fixed"
                        warnings.append(msg)
                        console.print(f"[yellow]{escape(msg)}[/]")
            n += 1
            if n % 10 == 0:
                w.flush()
            time.sleep(max(0.0, interval_s - (time.monotonic() - tick)))
