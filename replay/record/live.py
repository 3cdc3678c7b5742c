"""``replay record --live``: poll a running vLLM server's ``/metrics`` (and NVML, read-only) into a
bundle written incrementally, so a crash or Ctrl-C still leaves a valid bundle. Warns when actual
memory grows beyond what vLLM sized."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape

from replay.bundle import BundleMeta, BundleWriter, utc_now_iso
from replay.drive.sampler import Sampler
from replay.errors import ReplayError
from replay.nvml import NvmlReader, open_nvml
from replay.record.evidence import vllm_metric_values


def record_live(url: str, out: Path, *, interval_s: float = 1.0, duration_s: float | None = None,
                use_nvml: bool = False, nvml: NvmlReader | None = None, console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
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
    meta = BundleMeta(kind="production", t0_utc=utc_now_iso(), extra={"live_url": base, "interval_s": interval_s},
                      notes=list(warnings))
    w = BundleWriter(out, meta, flush_every=500)
    t0 = time.time()
    s = Sampler(w, t0, metrics_url=f"{base}/metrics", nvml=nvml, interval_s=interval_s, per_process=True)
    start_used: dict[int, int] = {}
    n = 0
    try:
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
    except KeyboardInterrupt:
        w.event({"t_us": s.t_us(), "kind": "interrupted", "source": "live"})
    finally:
        w.close()
    return {"samples": w.counts["samples"], "seconds": time.time() - t0, "metrics_errors": s.metrics_errors,
            "warnings": warnings}
