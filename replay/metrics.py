"""vLLM's metrics under the bundle's names, across vLLM versions, in one table: read by the recorder's
Prometheus parsers and by the live sampler alike.
"""

from __future__ import annotations

from collections.abc import Iterable

# vLLM metric name (any version) -> (bundle metric, scale)
VLLM_METRICS: dict[str, tuple[str, float]] = {
    "vllm:gpu_cache_usage_perc": ("kv_usage_ratio", 1.0),  # V0, V1 0.7.3-0.10 (fraction 0-1)
    "vllm:kv_cache_usage_perc": ("kv_usage_ratio", 1.0),  # V1 0.9.2+
    "vllm:cpu_cache_usage_perc": ("cpu_kv_usage_ratio", 1.0),  # V0 only
    "vllm:num_requests_running": ("requests_running", 1.0),
    "vllm:num_requests_waiting": ("requests_waiting", 1.0),
    "vllm:num_requests_swapped": ("requests_swapped", 1.0),  # V0 only
    "vllm:num_preemptions": ("preemptions_total", 1.0),
    "vllm:num_preemptions_total": ("preemptions_total", 1.0),
    "vllm:prompt_tokens": ("prompt_tokens_total", 1.0),
    "vllm:prompt_tokens_total": ("prompt_tokens_total", 1.0),
    "vllm:generation_tokens": ("generation_tokens_total", 1.0),
    "vllm:generation_tokens_total": ("generation_tokens_total", 1.0),
    "vllm:mm_cache_queries": ("mm_cache_queries_total", 1.0),  # V1 0.11+: the multimodal processor cache
    "vllm:mm_cache_queries_total": ("mm_cache_queries_total", 1.0),
    "vllm:mm_cache_hits": ("mm_cache_hits_total", 1.0),
    "vllm:mm_cache_hits_total": ("mm_cache_hits_total", 1.0),
}
CACHE_CONFIG = "vllm:cache_config_info"  # the KV cache's settings, as labels
# what a pipeline between vLLM and the store may have made of 'vllm:' (an OpenTelemetry collector or
# an exporter that keeps colons for recording rules writes 'vllm_num_requests_running')
RENAMED_PREFIXES = ("vllm_", "vllm.")


def vllm_name(name: str) -> str | None:
    """The name vLLM itself gives the metric ``name`` stands for, where it is one the recorder reads
    (VLLM_METRICS or CACHE_CONFIG), under vLLM's own name or a pipeline's renaming of its prefix;
    None for any other metric."""
    if name in VLLM_METRICS or name == CACHE_CONFIG:
        return name
    for pre in RENAMED_PREFIXES:
        if name.startswith(pre):
            own = "vllm:" + name[len(pre):]
            if own in VLLM_METRICS or own == CACHE_CONFIG:
                return own
    return None


def releases_exposing(name: str) -> list[str]:
    """The vLLM releases (oldest first) whose ``/metrics`` shows ``name`` (vLLM's own name, or a
    counter's name without the ``_total`` that the exposition adds), by the version catalogue."""
    from replay.engine import catalogue  # (the catalogue's JSON is read once, where it is needed)
    cat = catalogue.load()
    return cat.metric_releases(name) or (cat.metric_releases(name + "_total") if not name.endswith("_total") else [])


def releases_exposing_all(names: Iterable[str]) -> tuple[str, str] | None:
    """The range of vLLM releases (oldest, newest) whose ``/metrics`` shows every one of ``names``
    that any catalogued release shows (as a file has them: renamed prefixes read as vLLM's own); None
    where no name is catalogued, or where no release shows them all (a file of several servers)."""
    from replay.engine import catalogue
    order = catalogue.load().versions
    alive: set[str] | None = None
    for name in names:
        own = vllm_name(name) or name
        having = set(releases_exposing(own))
        if having:
            alive = having if alive is None else alive & having
    if not alive:
        return None
    got = [v for v in order if v in alive]
    return got[0], got[-1]


NEVER_EXISTED_METRICS = {
    "vllm_gpu_memory_usage_bytes": "vllm_gpu_memory_usage_bytes has never existed in any vLLM version "
    "(0.6-0.34, by the version catalogue): no vLLM metric reports GPU memory bytes. A monitor that scraped it read nothing, not "
    "zero. Device memory comes from DCGM (DCGM_FI_DEV_FB_USED) or NVML; vLLM's own view is "
    "vllm:kv_cache_usage_perc (the fill of its KV pool, not device memory).",
}
NEVER_EXISTED_METRICS["vllm:gpu_memory_usage_bytes"] = NEVER_EXISTED_METRICS["vllm_gpu_memory_usage_bytes"]


def vllm_metric_values(text: str) -> list[tuple[str, float]]:
    """The vLLM metrics a live sampler needs, from a /metrics body, without parsing the rest: a line
    scan keyed on VLLM_METRICS names (a vLLM exposition is hundreds of histogram lines; the sampler
    reads it several times a second and must stay cheap). Same mapping as ``parse_exposition``, renamed
    names too (an OpenTelemetry collector's or a federating Prometheus' endpoint)."""
    out: list[tuple[str, float]] = []
    for line in text.splitlines():
        if not line.startswith("vllm"):
            continue
        m = VLLM_METRICS.get(vllm_name(line.split("{", 1)[0].split(" ", 1)[0]) or "")
        if m is None:
            continue
        parts = line.rsplit("}", 1)[-1].split()
        try:
            out.append((m[0], float(parts[0]) * m[1]))
        except (IndexError, ValueError):
            continue
    return out
