"""``replay export --perfetto``: the bundle's timeline as Chrome trace events (opens in ui.perfetto.dev
next to a torch profiler trace): memory counters, requests as slices, events as instants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from replay.bundle import Bundle


def trace_events(b: Bundle) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "memory"}},
                                 {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "requests"}},
                                 {"ph": "M", "pid": 3, "name": "process_name", "args": {"name": "events"}}]
    mem = b.samples.filter(pl.col("metric").is_in(["device_used_bytes", "process_rss_bytes", "kv_usage_ratio", "requests_running", "requests_waiting"]))
    for t, gpu, source, metric, value in mem.iter_rows():
        out.append({"ph": "C", "pid": 1, "ts": t, "name": f"{metric} ({source}{'' if gpu is None else f' gpu{gpu}'})",
                    "args": {"value": value}})
    for i, r in enumerate(b.requests.iter_rows(named=True)):
        start = r["sent_us"] if r["sent_us"] is not None else r["arrival_us"]
        end = r["finish_us"] if r["finish_us"] is not None else start
        if start is None:
            continue
        out.append({"ph": "X", "pid": 2, "tid": i % 64, "ts": start, "dur": max(1, end - start), "name": r["id"],
                    "args": {k: r[k] for k in ("input_tokens", "output_tokens", "prompt_logprobs", "status", "error")}})
    for e in b.events:
        if e.get("t_us") is not None and not str(e.get("kind")).startswith("request_"):
            out.append({"ph": "i", "pid": 3, "tid": 0, "s": "g", "ts": e["t_us"], "name": e["kind"],
                        "args": {"source": e.get("source")}})
    return out


def write_perfetto(b: Bundle, out: Path) -> int:
    ev = trace_events(b)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ms",
                               "metadata": {"t0_utc": b.meta.t0_utc, "source": "replay"}}), encoding="utf-8")
    return len(ev)
