"""``replay inspect``: the facts a bundle holds, as a fixed set of keys (null where the evidence is silent)."""

from __future__ import annotations

from typing import Any

import polars as pl

from replay.analysis.memory import Accounting, stacked_parts, stated_gib
from replay.bundle import Bundle, names_where
from replay.units import GiB

OOM_KEYS = ("tried_to_allocate_bytes", "gpu_total_bytes", "free_bytes", "process_in_use_bytes",
            "allocated_by_pytorch_bytes", "reserved_unallocated_bytes")


def _first(b: Bundle, kind: str, key: str) -> Any:
    for e in b.events:
        if e.get("kind") == kind and e.get(key) is not None:
            return e[key]
    return None


def inspect_bundle(b: Bundle) -> dict[str, Any]:
    s = b.samples.filter(names_where(pl.col("source"), lambda s: s.str.starts_with("vllm-log")))  # (every engine's, with data parallelism)

    def series(metric: str, scale: float = 1.0) -> list[float]:
        col = s.filter(pl.col("metric") == metric).sort("t_us", maintain_order=True)["value"].to_list()
        return [round(v * scale, 4) if scale != 1.0 else (int(v) if float(v).is_integer() else v) for v in col]

    # each part from the line that states it first, in vLLM's own terms where a line of its era does
    weights, kv_gib, act, non_torch, graph = (stated_gib(b.events, k) for k in (
        "weights_gib", "kv_cache_gib", "activation_peak_gib", "non_torch_gib", "cuda_graph_gib"))
    per_source: dict[str, int] = {}
    for row in b.samples.group_by("source").len().iter_rows():
        per_source[str(row[0])] = int(row[1])
    return {
        "vllm_version": b.meta.vllm_version,
        "vllm_version_inferred": b.meta.vllm_version_inferred,
        "engine": b.meta.engine,
        "gpu_blocks": _first(b, "kv_blocks", "gpu_blocks"),
        "cpu_blocks": _first(b, "kv_blocks", "cpu_blocks"),
        "kv_cache_tokens": _first(b, "kv_tokens", "kv_cache_tokens"),
        "kv_cache_gib": kv_gib,
        "weights_gib": None if weights is None else round(weights, 4),
        "activation_peak_gib": act,
        "non_torch_gib": non_torch,
        "cuda_graph_gib": graph,
        "stats_lines": s.filter(pl.col("metric") == "kv_usage_ratio").height,
        "kv_usage_pct": series("kv_usage_ratio", 100.0),
        "running": series("requests_running"),
        "waiting": series("requests_waiting"),
        "ooms": [{k: e.get(k) for k in OOM_KEYS} for e in b.events if e.get("kind") == "oom"],
        "preemption_warnings": sum(1 + int(e.get("repeated") or 0) for e in b.events if e.get("kind") == "preemption"),
        "samples_per_source": per_source,
        "events": len(b.events),
        "quarantined": b.quarantine_count,
        "inputs": len(b.meta.inputs),
        "engine_args": {k: {"value": v, "sources": b.meta.engine_args_sources.get(k, [])}
                        for k, v in sorted(b.meta.engine_args.items())},
    }


def describe_gib(n: float | None) -> str:
    return "—" if n is None else f"{n / GiB:.2f} GiB"


_PART_NAMES = {"weights": "weights", "activation_peak": "activation peak", "non_torch": "non-torch", "kv_pool": "KV cache"}
_SUMS = {"weights_and_non_torch": ("weights", "non_torch"), "weights_and_activation_peak": ("weights", "activation_peak")}


def accounting_line(acc: Accounting) -> str | None:
    """vLLM's accounted parts as one sum beside its budget, the first thing to check after an OOM
    (they add up to the budget when the log states every part); None when the log states none."""
    parts = stacked_parts(acc)
    if not parts or acc.estimated:
        return None
    line = " + ".join(f"{name} {v / GiB:.2f}" for name, v in parts) + f" = {sum(v for _, v in parts) / GiB:.2f} GiB"
    if acc.budget_bytes:
        line += f" of its budget {acc.budget_bytes / GiB:.2f} GiB"
    in_sums = {k for s, v in acc.parts.items() if v is not None for k in _SUMS.get(s, ())}
    missing = [name for k, name in _PART_NAMES.items() if acc.parts.get(k) is None and k not in in_sums]
    return line + (f"; the log does not state: {', '.join(missing)}" if missing else "")

