"""The memory model: actual memory per sample, what vLLM accounted for, and the gap between them.

Version-aware: vLLM's accounted parts come from its startup log (weights, profiled activation
peak, non-torch, KV pool, CUDA graphs where that version counts them); the actual layers come from
NVML / DCGM / nvidia-smi on GPUs, or the engine process tree's resident memory on CPU. Anything
estimated rather than measured is labelled so.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from replay.bundle import (
    DEVICE_SOURCES,
    MIG_TAG,
    Bundle,
    Samples,
    is_device_source,
    sample_names,
    samples_where,
)
from replay.units import GiB, fraction
from replay.versioning import version_key

ACTUAL_PREFERENCE = [*((source, "device_used_bytes") for source in DEVICE_SOURCES), ("process", "process_rss_bytes")]


@dataclass
class Accounting:
    """What vLLM believed it was using, in bytes (None = the evidence does not say)."""

    accounted_bytes: float | None
    budget_bytes: float | None
    total_bytes: float | None
    kv_pool_bytes: float | None
    parts: dict[str, float | None] = field(default_factory=dict)
    basis: str = ""
    estimated: bool = False


def _first(events: list[dict[str, Any]], kind: str, key: str) -> Any:
    for e in events:
        if e.get("kind") == kind and e.get(key) is not None:
            return e[key]
    return None


# Where vLLM states each part of its memory, most direct first: the line of its era that states the part
# in its own terms, then V1's start-up summary ('Free memory on device … Actual usage is …', INFO from
# 0.29), then an estimate. A part stated as 0 GiB is stated: it is not looked for further down.
STATED_BY: dict[str, tuple[tuple[str, str], ...]] = {
    "weights_gib": (("memory_profile", "weights_gib"), ("weights", "weights_gib"), ("startup_free", "weights_gib")),
    "non_torch_gib": (("memory_profile", "non_torch_gib"), ("startup_free", "non_torch_gib")),
    "activation_peak_gib": (("memory_profile", "activation_peak_gib"), ("memory_profile", "peak_less_weights"),
                            ("startup_free", "activation_peak_gib")),
    "kv_cache_gib": (("memory_profile", "kv_cache_gib"), ("kv_memory", "kv_cache_gib"), ("startup_free", "kv_cache_gib")),
    "cuda_graph_gib": (("cuda_graph", "cuda_graph_gib"), ("startup_free", "cuda_graph_gib"),
                       ("cuda_graph_estimate", "cuda_graph_gib")),
}


def stated_gib(events: list[dict[str, Any]], part: str) -> float | None:
    """The first statement of one part of vLLM's memory (a STATED_BY key), in GiB; None where the
    log states none. (0.6.4 logs torch's allocation peak, weights included, as 'peak_torch_memory':
    the activation peak is that less the weights, where a line states those.)"""
    for kind, key in STATED_BY[part]:
        if key == "peak_less_weights":
            peak, weights = _first(events, kind, "peak_torch_gib"), stated_gib(events, "weights_gib")
            v = round(peak - weights, 4) if peak is not None and weights is not None else None
        else:
            v = _first(events, kind, key)
        if v is not None:
            return float(v)
    return None


def accounting(b: Bundle) -> Accounting:
    ev = b.events
    total = None
    for g in b.meta.gpus:
        if g.get("total_bytes"):
            total = float(g["total_bytes"])
            break
    # (fraction(): a bundle recorded before it was a number holds a scrape's label text, '0.92')
    util = fraction(b.meta.engine_args.get("gpu_memory_utilization")) or fraction(_first(ev, "memory_budget", "gpu_memory_utilization"))
    budget_gib = _first(ev, "memory_budget", "budget_gib") or _first(ev, "startup_free", "budget_gib")
    if total is None:
        tg = _first(ev, "memory_budget", "total_gpu_gib") or _first(ev, "memory_profile", "total_gpu_gib") \
            or _first(ev, "startup_free", "total_gib")
        total = tg * GiB if tg else None
    budget = budget_gib * GiB if budget_gib else (util * total if util and total else None)
    ready_rss = _first(ev, "engine_ready", "rss_bytes")
    if b.meta.kind == "replay" and b.meta.extra.get("device") == "cpu" and ready_rss:
        kv = _first(ev, "kv_memory", "kv_cache_gib")
        cap = b.meta.extra.get("capacity_bytes")
        return Accounting(float(ready_rss), float(ready_rss), float(cap) if cap else None,
                          kv * GiB if kv else None,
                          {"engine_at_ready": float(ready_rss), "kv_pool": kv * GiB if kv else None},
                          "CPU engine: memory at ready (weights + preallocated KV pool + runtime); vLLM "
                          "sizes nothing beyond it", estimated=False)
    # each part where vLLM states it (STATED_BY)
    weights, non_torch = stated_gib(ev, "weights_gib"), stated_gib(ev, "non_torch_gib")
    # (0.29+ states weights and non-torch memory only as one sum: non-torch is the sum less the weights
    # where another line states those, else the sum is one part)
    both = _first(ev, "startup_free", "consumed_gib") if non_torch is None else None
    if both is not None and weights is not None:
        non_torch, both = max(both - weights, 0.0), None
    act, kv, graph = (stated_gib(ev, k) for k in ("activation_peak_gib", "kv_cache_gib", "cuda_graph_gib"))
    if graph is not None and graph < 0:  # a pool measured below 0 (memory freed while capturing) holds nothing
        graph = 0.0
    # (0.6.4 without its weights line: torch's allocation peak is weights and activations as one part)
    peak = _first(ev, "memory_profile", "peak_torch_gib") if weights is None and act is None else None
    version = b.meta.vllm_version or (b.meta.vllm_version_inferred or "").split("..")[0] or None
    # CUDA graphs are inside the budget where vLLM profiles them: it says so at start-up (0.18+), else
    # by version (an opt-in from 0.18, the default from 0.20)
    stated = _first(ev, "cudagraph_profiling", "enabled")
    graphs_counted = bool(stated) if stated is not None else version is not None and version_key(version) >= (0, 20)
    parts = {"weights": weights, "non_torch": non_torch, **({"weights_and_non_torch": both} if both is not None else {}),
             **({"weights_and_activation_peak": peak} if peak is not None else {}),
             "activation_peak": act, "kv_pool": kv, "cuda_graphs": graph if graphs_counted else None}
    known = [v for v in parts.values() if v is not None]
    accounted = sum(known) * GiB if kv is not None and known else None
    basis = "startup log: " + ", ".join(k for k, v in parts.items() if v is not None) if accounted else ""
    estimated = False
    if accounted is None and budget is not None:
        accounted, basis, estimated = budget, "budget = gpu_memory_utilization x total (parts not logged)", True
    return Accounting(accounted, budget, total, kv * GiB if kv is not None else None,
                      {k: (v * GiB if v is not None else None) for k, v in parts.items()}, basis, estimated)


def actual_frame(samples: Samples) -> tuple[pl.DataFrame, str | None]:
    """Per-sample actual memory (t_us, gpu, actual_bytes) from the best source present."""
    present = samples_where(samples, pl.col("source").is_in([s for s, _ in ACTUAL_PREFERENCE])
                            & pl.col("metric").is_in([m for _, m in ACTUAL_PREFERENCE]))
    for source, metric in ACTUAL_PREFERENCE:
        f = present.filter((pl.col("source") == source) & (pl.col("metric") == metric))
        if f.height:
            return (f.select("t_us", pl.col("gpu").fill_null(0).alias("gpu"), pl.col("value").alias("actual_bytes"))
                    .sort("t_us"), f"{source}:{metric}")
    return pl.DataFrame(schema={"t_us": pl.Int64, "gpu": pl.Int32, "actual_bytes": pl.Float64}), None


# Measured layers of actual memory, outermost first (each one contains the ones below it, except
# other processes, which sit beside this process on the device).
LAYERS = [
    ("device_used_bytes", "device used", DEVICE_SOURCES),
    ("other_processes_bytes", "other processes", ("nvml", "nvidia-smi")),
    ("process_used_bytes", "this process (driver view)", ("nvml", "nvidia-smi")),
    ("torch_reserved_bytes", "torch reserved", ("torch",)),
    ("torch_allocated_bytes", "torch allocated", ("torch",)),
    ("process_rss_bytes", "engine process tree (RSS)", ("process",)),
]


def layers_frame(samples: Samples) -> pl.DataFrame:
    """The actual layers that were measured, long format (t_us, gpu, layer, source, value_bytes);
    one source per layer (the first present in LAYERS' order), nothing made up for the rest."""
    out = []
    layers = samples_where(samples, pl.col("metric").is_in([m for m, _, _ in LAYERS])
                           & pl.col("source").is_in(sorted({s for _, _, ss in LAYERS for s in ss})))
    for metric, label, sources in LAYERS:
        for src in sources:
            f = layers.filter((pl.col("metric") == metric) & (pl.col("source") == src))
            if f.height:
                out.append(f.select("t_us", pl.col("gpu").fill_null(0).cast(pl.Int32), pl.lit(label).alias("layer"),
                                    pl.lit(src).alias("source"), pl.col("value").alias("value_bytes")))
                break
    if not out:
        return pl.DataFrame(schema={"t_us": pl.Int64, "gpu": pl.Int32, "layer": pl.Utf8, "source": pl.Utf8,
                                    "value_bytes": pl.Float64})
    return pl.concat(out).sort("t_us", maintain_order=True)


MACHINES_DRAWN = 8  # series of other machines drawn at most: a cluster-wide query may hold hundreds


def machines_frame(samples: Samples, limit: int = MACHINES_DRAWN) -> tuple[pl.DataFrame, int]:
    """Device memory kept as series of several machines or hosts ('dcgm[Hostname=node-2]',
    'nvidia-smi[node2.csv]'), long format (t_us, series, value_bytes), one series per source and
    GPU; the ``limit`` with the highest peaks, and how many there were in all. Only the drawn series
    are held (a fleet's day of 64 GPUs is 5.5M samples): the peaks are found streaming."""
    tagged = [s for s in sample_names(samples) if is_device_source(s, tagged_only=True)]
    empty = pl.DataFrame(schema={"t_us": pl.Int64, "series": pl.Utf8, "value_bytes": pl.Float64})
    if not tagged:
        return empty, 0
    named = samples.lazy().filter((pl.col("metric") == "device_used_bytes") & pl.col("source").is_in(tagged)).select(
        "t_us", series=pl.concat_str(pl.col("source").cast(pl.Utf8), pl.when(pl.col("gpu").is_not_null())
                                     .then(pl.format(" GPU {}", "gpu")).otherwise(pl.lit(""))), value_bytes="value")
    peaks = (named.group_by("series").agg(pl.col("value_bytes").max()).collect(engine="streaming")
             .sort("value_bytes", "series", descending=[True, False]))
    if not peaks.height:
        return empty, 0
    keep = peaks["series"].head(limit)
    drawn = named.filter(pl.col("series").is_in(keep.implode())).collect(engine="streaming")
    return drawn.sort("series", "t_us", maintain_order=True), peaks.height


def unchosen(series: list[str]) -> tuple[str, str]:
    """What device series of several machines or MIG instances (``machines_frame``'s) are, and the
    record option that makes one of them the bundle's device memory."""
    mig = [MIG_TAG in t for t in series]
    if mig and all(mig):
        return "MIG instances", "--gpu-instance ID (the instance vLLM ran in: DCGM's GPU_I_ID)"
    return ("machines", "--host NODE (the node vLLM ran on)" + (
        ", and --gpu-instance ID where its GPU is split into MIG instances" if any(mig) else ""))


def stacked_parts(acc: Accounting) -> list[tuple[str, float]]:
    """vLLM's accounted parts as non-overlapping segments, bottom first, for a stacked view."""
    p = acc.parts
    ready = p.get("engine_at_ready")
    if ready is not None:  # CPU engine: the KV pool is inside the memory at ready
        kv = p.get("kv_pool") or 0.0
        return [(k, v) for k, v in (("runtime + weights (at ready)", ready - kv), ("KV pool", kv)) if v]
    names = {"weights": "weights", "non_torch": "non-torch", "weights_and_non_torch": "weights + non-torch",
             "weights_and_activation_peak": "weights + activation peak (torch peak)",
             "activation_peak": "activation peak (profiled)",
             "kv_pool": "KV pool", "cuda_graphs": "CUDA graphs"}
    return [(names.get(k, k), v) for k, v in p.items() if v]


def gap_frame(actual: pl.DataFrame, acc: Accounting) -> pl.DataFrame:
    """actual - accounted, and headroom to capacity, per sample."""
    if acc.accounted_bytes is None or actual.height == 0:
        return actual.with_columns(gap_bytes=pl.lit(None, dtype=pl.Float64), headroom_bytes=pl.lit(None, dtype=pl.Float64))
    return actual.with_columns(
        gap_bytes=pl.col("actual_bytes") - acc.accounted_bytes,
        headroom_bytes=(pl.lit(acc.total_bytes) - pl.col("actual_bytes")) if acc.total_bytes else pl.lit(None, dtype=pl.Float64),
    )


def kv_usage_at(kv: pl.DataFrame) -> Callable[[int | None, Collection[str] | None], float | None]:
    """The KV usage ratio at a moment, from ``kv`` (``kv_in_use``): ``at(t_us, sources)`` is the latest
    sample at or before ``t_us`` (None: the last of all) among the series ``sources`` (None: of every
    series). Each series is split out once: a fleet's day asks it for hundreds of OOMs."""
    series = {str(src): (df["t_us"].to_numpy(), df["kv_usage_ratio"].to_numpy())
              for (src,), df in kv.partition_by("source", as_dict=True).items()}

    def at(t_us: int | None, sources: Collection[str] | None = None) -> float | None:
        best: tuple[int, float] | None = None
        for src in series if sources is None else sources:
            ts, values = series.get(src, (None, None))
            if ts is None or values is None:
                continue
            k = len(ts) if t_us is None else int(np.searchsorted(ts, t_us, side="right"))
            if k and (best is None or ts[k - 1] > best[0]):
                best = (int(ts[k - 1]), float(values[k - 1]))
        return None if best is None else best[1]
    return at


def kv_in_use(samples: Samples, acc: Accounting) -> pl.DataFrame:
    f = samples_where(samples, pl.col("metric") == "kv_usage_ratio").sort("t_us")
    if acc.kv_pool_bytes is None:
        return f.select("t_us", "source", pl.col("value").alias("kv_usage_ratio"), pl.lit(None, dtype=pl.Float64).alias("kv_used_bytes"))
    return f.select("t_us", "source", pl.col("value").alias("kv_usage_ratio"),
                    (pl.col("value") * acc.kv_pool_bytes).alias("kv_used_bytes"))
