"""AIPerf's outputs: its per-request records (``profile_export.jsonl``) as the bundle's requests, its
GPU telemetry (``gpu_telemetry_export.jsonl``, DCGM scrapes) as device samples, its server-metrics
scrapes (``server_metrics_export.jsonl``) as vLLM's metric samples, and its summary
(``profile_export_aiperf.json``) as notes.

AIPerf states times as epoch ns, durations as ``{"value", "unit"}`` and GPU memory in GB (10^9 bytes,
its DCGM MiB converted); its summary's start and end are local times without a zone."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypedDict

from replay.metrics import CACHE_CONFIG, VLLM_METRICS, vllm_name
from replay.record.common import (
    Parsed,
    ParsedRequest,
    Parser,
    as_list,
    as_obj,
    checks_values,
    json_value,
    lines_in,
    utc_us,
)
from replay.record.dcgm import dcgm_hosts
from replay.record.harness import (
    after,
    count,
    duration_us,
    epoch_us,
    json_records,
    number,
    shown,
)
from replay.record.options import RecordOptions

KINDS = ("aiperf-records", "aiperf-gpu-telemetry", "aiperf-server-metrics", "aiperf-summary")


class Metric(TypedDict, total=False):
    """A record's metric: its value and unit ('ms', 'tokens', 'ns')."""

    value: Any
    unit: str


class RecordMetadata(TypedDict, total=False):
    """What a per-request record's metadata holds of the request (the current layout, and the older
    one of 2025 with ``timestamp_ns`` and ``credit_phase``)."""

    x_request_id: str
    x_correlation_id: str
    request_start_ns: int
    request_ack_ns: int
    request_end_ns: int
    timestamp_ns: int
    benchmark_phase: str
    credit_phase: str
    was_cancelled: bool


class RecordError(TypedDict, total=False):
    code: int
    type: str
    message: str


# --- per-request records ------------------------------------------------------------------------------
def _ms(metrics: dict[str, Metric], *names: str) -> int | None:
    """The first of ``names`` among a record's metrics as a duration in µs (by its unit)."""
    for n in names:
        m = metrics.get(n)
        if isinstance(m, dict):
            return duration_us(m.get("value"), str(m.get("unit", "ms")))
    return None


def _tokens(metrics: dict[str, Metric], name: str) -> int | None:
    m = metrics.get(name)
    return count(m.get("value")) if isinstance(m, dict) else None


def _input_tokens(metrics: dict[str, Metric]) -> int | None:
    """The prompt's tokens: as the server counted them (its usage, where AIPerf kept it), else as AIPerf's
    tokenizer did."""
    used = _tokens(metrics, "usage_prompt_tokens")
    return used if used is not None else _tokens(metrics, "input_sequence_length")


def _output_tokens(metrics: dict[str, Metric]) -> int | None:
    """Tokens generated, reasoning ones among them (the KV cache holds both): as the server counted them,
    else output_sequence_length, else output_token_count plus reasoning_token_count."""
    osl = _tokens(metrics, "usage_completion_tokens")
    if osl is None:
        osl = _tokens(metrics, "output_sequence_length")
    if osl is not None:
        return osl
    out = _tokens(metrics, "output_token_count")
    return None if out is None else out + (_tokens(metrics, "reasoning_token_count") or 0)


def _error(e: RecordError) -> str:
    return f"{e.get('type') or 'error'}" + (f" ({e['code']})" if e.get("code") is not None else "") + (
        f": {e['message']}" if e.get("message") else "")


def _request(line: int, rec: dict[str, Any]) -> ParsedRequest:
    meta: RecordMetadata = as_obj(rec.get("metadata"))  # type: ignore[assignment]
    metrics: dict[str, Metric] = as_obj(rec.get("metrics"))
    start = epoch_us(meta.get("request_start_ns", meta.get("timestamp_ns")), "ns")
    end = epoch_us(meta.get("request_end_ns"), "ns")
    if end is None:  # (the older layout: its latency, or its last response's time)
        end = after(start, _ms(metrics, "request_latency"))
        if end is None and isinstance(metrics.get("max_response_timestamp"), dict):
            end = epoch_us(metrics["max_response_timestamp"].get("value"), "ns")
    err: RecordError = as_obj(rec.get("error"))  # type: ignore[assignment]
    cancelled = meta.get("was_cancelled") is True or err.get("type") == "RequestCancellationError"
    rid = meta.get("x_request_id") or meta.get("x_correlation_id")
    return ParsedRequest(
        id=str(rid) if rid else f"line {line}", line=line, arrival_t=start,
        first_token_t=after(start, _ms(metrics, "time_to_first_token", "ttft")), finish_t=end,
        input_tokens=_input_tokens(metrics), output_tokens=_output_tokens(metrics),
        status="aborted" if cancelled else "error" if err else "ok" if end is not None else "unknown",
        error=_error(err) if err else None)


@checks_values
def parse_records(path: Path, text: str) -> Parsed:
    """``profile_export.jsonl``: one request a line (a line that is no record is quarantined, with why)."""
    p = Parsed(kind="aiperf-records")
    phases: dict[str, int] = {}
    for r in json_records(text):
        if r.error is not None or not isinstance(r.value, dict) or not isinstance(r.value.get("metadata"), dict):
            p.quarantine.append((r.line, r.error or "not an AIPerf record (an object with 'metadata')", r.raw))
            continue
        req = _request(r.line, r.value)
        if req.arrival_t is None:
            p.quarantine.append((r.line, "an AIPerf record without a start time (request_start_ns, timestamp_ns)", r.raw))
            continue
        p.requests.append(req)
        p.parsed += 1
        meta = r.value["metadata"]
        phase = str(meta.get("benchmark_phase") or meta.get("credit_phase") or "")
        phases[phase] = phases.get(phase, 0) + 1
    p.lines = lines_in(text)
    kept = {k: n for k, n in phases.items() if k and k != "profiling"}
    errs = sum(1 for q in p.requests if q.status in ("error", "aborted"))
    p.notes.append(f"{path.name}: AIPerf's per-request records: {len(p.requests)} requests at the times it sent them"
                   + (f", {errs} of them failed or cancelled (kept, with their error)" if errs else "")
                   + ("; " + ", ".join(f"{n} of its {k} phase" for k, n in sorted(kept.items())) if kept else ""))
    return p


# --- GPU telemetry ----------------------------------------------------------------------------------------
GB = 1e9  # (AIPerf's GPU memory unit: DCGM's MiB × 1.048576 / 1000)
TELEMETRY: dict[str, tuple[str, float]] = {  # AIPerf's name -> (the bundle's metric, scale)
    "gpu_memory_used": ("device_used_bytes", GB),
    "gpu_memory_free": ("device_free_bytes", GB),
    "gpu_memory_total": ("device_total_bytes", GB),
    "total_gpu_memory": ("device_total_bytes", GB),  # (its name in releases of 2025)
    "gpu_utilization": ("util_gpu_pct", 1.0),
    "memory_copy_utilization": ("util_mem_pct", 1.0),  # (DCGM_FI_DEV_MEM_COPY_UTIL: nvidia-smi's utilization.memory)
}


class TelemetryRecord(TypedDict, total=False):
    """One GPU's scrape: either key layout (``dcgm_url`` first, or ``telemetry_source_url`` last)."""

    timestamp_ns: int
    dcgm_url: str
    telemetry_source_url: str
    gpu_index: int
    gpu_uuid: str
    gpu_model_name: str
    hostname: str
    telemetry_data: dict[str, Any]


@checks_values
def parse_gpu_telemetry(path: Path, text: str, host: str | None = None, instance: str | None = None) -> Parsed:
    """``gpu_telemetry_export.jsonl``: a GPU's DCGM scrape a line, as 'dcgm' samples. One GPU (one UUID)
    that several exporters scraped is one GPU: its series keep the bundle's device memory, with a note;
    GPUs of several machines are told apart as DCGM's own scrapes are (``dcgm_hosts``)."""
    p = Parsed(kind="aiperf-gpu-telemetry")
    machine: dict[str, str] = {}  # GPU UUID -> the host its first scrape named
    urls: dict[str, set[str]] = {}  # GPU UUID -> the exporters that scraped it
    for r in json_records(text):
        rec: TelemetryRecord = r.value if isinstance(r.value, dict) else {}  # type: ignore[assignment]
        t = epoch_us(rec.get("timestamp_ns"), "ns")
        gpu = count(rec.get("gpu_index"))
        data = rec.get("telemetry_data", rec)
        if r.error is not None or t is None or gpu is None or not isinstance(data, dict):
            p.quarantine.append((r.line, r.error or "not an AIPerf GPU telemetry record (timestamp_ns, gpu_index, "
                                 "telemetry_data)", r.raw))
            continue
        uuid = str(rec.get("gpu_uuid") or f"GPU {gpu}")
        host_name = machine.setdefault(uuid, str(rec.get("hostname") or ""))
        urls.setdefault(uuid, set()).add(str(rec.get("dcgm_url") or rec.get("telemetry_source_url") or ""))
        labels = {"gpu": str(gpu), "UUID": str(rec.get("gpu_uuid") or ""), "modelName": str(rec.get("gpu_model_name") or "")}
        if host_name:
            labels["Hostname"] = host_name
        for name, (metric, scale) in TELEMETRY.items():
            v = number(data.get(name))
            if v is not None:
                p.dcgm_labels.append((len(p.samples), labels))
                p.samples.append((t, gpu, "dcgm", metric, v * scale))
        p.parsed += 1
    p.lines = lines_in(text)
    twice = sorted(u for u, s in urls.items() if len(s - {""}) > 1)
    if twice:
        p.notes.append(f"{path.name}: {len(twice)} GPU(s) scraped by several DCGM exporters "
                       f"({shown(sorted(urls[twice[0]]), 4)} for {twice[0]}): one GPU, read as one series")
    p.notes.append(f"{path.name}: AIPerf's GPU telemetry (DCGM): its memory in GB (10^9 bytes) as bytes")
    return dcgm_hosts(p, path, host, instance)


# --- server metrics -------------------------------------------------------------------------------------
class ServerMetricsRecord(TypedDict, total=False):
    """One scrape of an endpoint's /metrics: each metric's series as ``{labels, value}`` (a histogram's
    as ``buckets`` or, in releases of 2025, ``histogram``, with ``sum`` and ``count``: not read)."""

    endpoint_url: str
    timestamp_ns: int
    metrics: dict[str, list[dict[str, Any]]]


_NOT_A_SERIES = ("model_name", "model", "__name__")


def _series_tags(recs: list[tuple[int, ServerMetricsRecord]]) -> tuple[dict[str, list[str]], list[str]]:
    """The labels that tell a vLLM metric's series apart in a file (labels that vary among them), by
    metric, and the endpoints scraped."""
    seen: dict[str, dict[str, set[str]]] = {}
    endpoints: list[str] = []
    for _, rec in recs:
        url = str(rec.get("endpoint_url") or "")
        if url not in endpoints:
            endpoints.append(url)
        for name, series in as_obj(rec.get("metrics")).items():
            for s in series if isinstance(series, list) else []:
                for k, v in as_obj(as_obj(s).get("labels")).items():
                    seen.setdefault(name, {}).setdefault(k, set()).add(str(v))
    return {m: sorted(k for k, vs in by.items() if len(vs) > 1 and k not in _NOT_A_SERIES) for m, by in seen.items()}, endpoints


@checks_values
def parse_server_metrics(path: Path, text: str) -> Parsed:
    """``server_metrics_export.jsonl``: an endpoint's scrape a line (or records printed over many lines),
    vLLM's metrics among them as 'vllm-metrics' samples (of several endpoints, each its own series,
    'vllm-metrics[endpoint=host:port]'); families of no bundle metric (histograms, Dynamo's) are named in a note."""
    p = Parsed(kind="aiperf-server-metrics")
    recs: list[tuple[int, ServerMetricsRecord]] = []
    for r in json_records(text):
        t = epoch_us(as_obj(r.value).get("timestamp_ns"), "ns")
        if r.error is not None or t is None or not isinstance(as_obj(r.value).get("metrics"), dict):
            p.quarantine.append((r.line, r.error or "not an AIPerf server-metrics record (timestamp_ns, metrics)", r.raw))
            continue
        recs.append((r.line, r.value))
        p.parsed += 1
    p.lines = lines_in(text)
    tags, endpoints = _series_tags(recs)
    others: set[str] = set()
    configs: set[tuple[tuple[str, str], ...]] = set()
    for line, rec in recs:
        t = epoch_us(rec["timestamp_ns"], "ns")
        url = str(rec.get("endpoint_url") or "")
        where = f"[endpoint={re.sub(r'^[a-z]+://|/metrics$', '', url)}]" if len(endpoints) > 1 else ""
        for name, series in rec["metrics"].items():
            own = vllm_name(name)
            if own == CACHE_CONFIG:
                for s in series if isinstance(series, list) else []:
                    said = tuple(sorted((str(k), str(v)) for k, v in as_obj(as_obj(s).get("labels")).items()))
                    if said not in configs:
                        configs.add(said)
                        p.events.append({"t": t, "kind": "kv_config", "line": line, "data": dict(said)})
                continue
            if own not in VLLM_METRICS:
                others.add(name)
                continue
            p.vllm_names.add(name)
            metric, scale = VLLM_METRICS[own]
            for s in series if isinstance(series, list) else []:
                v = number(as_obj(s).get("value"))
                if v is None:
                    continue
                labels = as_obj(as_obj(s).get("labels"))
                tag = ",".join(f"{k}={labels.get(k, '')}" for k in tags.get(name, []))
                p.samples.append((t, None, "vllm-metrics" + where + (f"[{tag}]" if tag else ""), metric, v * scale))
    if others:
        p.notes.append(f"{path.name}: {len(others)} metric families of no bundle metric ({shown(sorted(others))}): not read")
    if len(endpoints) > 1:
        p.notes.append(f"{path.name}: scrapes of {len(endpoints)} endpoints ({shown(endpoints)}): each its own series")
    return p


# --- the summary ------------------------------------------------------------------------------------------
def _avg(summary: dict[str, Any], name: str) -> float | None:
    return number(as_obj(summary.get(name)).get("avg"))


def parse_summary(path: Path, text: str, tz_offset_s: int = 0) -> Parsed:
    """``profile_export_aiperf.json``: the run's figures, as notes; its start and end are local times
    without a zone, placed with --tz (or, where the summary states its first request's epoch time,
    by that) and said so."""
    p = Parsed(kind="aiperf-summary")
    s = as_obj(json_value(path, text))
    p.lines = p.parsed = lines_in(text)
    cfg = as_obj(s.get("input_config"))
    models = as_obj(cfg.get("endpoint")).get("model_names") or [  # (0.13: models.items[].name)
        m.get("name") for m in as_list(as_obj(cfg.get("models")).get("items")) if isinstance(m, dict)]
    load = as_obj(cfg.get("loadgen")) or next((as_obj(ph) for ph in as_list(cfg.get("phases"))
                                               if as_obj(ph).get("kind") == "profiling"), {})
    records = as_obj(s.get("records")) or s  # (releases of 2025 nest the figures under 'records')
    n, errors = _avg(records, "request_count"), _avg(records, "error_request_count")
    what = [f"{int(n)} requests" if n is not None else "", f"{int(errors)} failed" if errors else "",
            f"model {', '.join(map(str, models))}" if models else "",
            f"concurrency {load['concurrency']}" if load.get("concurrency") is not None else "",
            f"request rate {load['request_rate']}/s" if load.get("request_rate") is not None else "",
            f"{load['type']} schedule" if isinstance(load.get("type"), str) else ""]
    p.notes.append(f"{path.name}: AIPerf's summary of a run ({', '.join(w for w in what if w) or 'no figures'}): "
                   "no per-request records (those are in its profile_export.jsonl)" + _span(s, records, tz_offset_s))
    return p


def _span(s: dict[str, Any], records: dict[str, Any], tz_offset_s: int) -> str:
    """When the run began and ended, as its summary says, and in which zone that is."""
    try:
        start, end = datetime.fromisoformat(str(s["start_time"])), datetime.fromisoformat(str(s["end_time"]))
    except (KeyError, ValueError):
        return ""
    if start.tzinfo is not None:
        return f"; run from {start.isoformat()} to {end.isoformat()}"
    first = epoch_us(_avg(records, "min_request_timestamp"), "ns")
    local_us = utc_us(start)
    if first is not None:  # (its first request's own epoch time: the zone, to the quarter hour)
        zone_s = round((local_us - first) / 1e6 / 900) * 900
        why = f"UTC{zone_s / 3600:+g} h, from its min_request_timestamp"
    else:
        zone_s = tz_offset_s
        why = f"UTC{tz_offset_s / 3600:+g} h, from --tz" if tz_offset_s else "read as UTC; --tz if it ran in another zone"
    utc = [datetime.fromtimestamp((utc_us(d) - zone_s * 1_000_000) / 1e6, tz=timezone.utc) for d in (start, end)]
    return (f"; its start_time and end_time are local times without a zone ({why}): the run from "
            f"{utc[0]:%Y-%m-%dT%H:%M:%S}Z to {utc[1]:%H:%M:%S}Z")


# --- as the registry reads them ------------------------------------------------------------------------
_RECORD = re.compile(r'\A\s*\{\s*"metadata"\s*:\s*\{[^\n]{0,2000}?"(?:x_request_id|request_start_ns|timestamp_ns)"')
_TELEMETRY = re.compile(r'\A\s*\{\s*"timestamp_ns"\s*:\s*\d+\s*,[^\n]{0,2000}?"gpu_index"[^\n]*"telemetry_data"\s*:')
_SERVER = re.compile(r'\A\s*\{\s*"endpoint_url"\s*:\s*"[^"]*"\s*,\s*"timestamp_ns"\s*:\s*\d+')
_SUMMARY = re.compile(r'\A\s*\{\s*(?:"records"\s*:\s*\{\s*)?"[a-z_]+"\s*:\s*\{\s*(?:"tag"\s*:\s*"[a-z_]+"\s*,\s*)?'
                      r'"unit"\s*:\s*"[^"]*"\s*,\s*(?:"header"\s*:\s*"[^"]*"\s*,\s*)?"avg"\s*:')


_VERSIONED = re.compile(r'\A\s*\{\s*(?:"schema_version"\s*:\s*"[^"]*"\s*,\s*)?"aiperf_version"\s*:')


def sniff_records(head: str) -> str | None:
    """A per-request record: its metadata, then its metrics (``profile_export_raw.jsonl``'s records, the
    requests and responses themselves, are not read: their requests are these)."""
    first = head.lstrip().split("\n", 1)[0]
    return "aiperf-records" if _RECORD.match(head) and '"metrics"' in head and '"request_headers"' not in first \
        and '"responses"' not in first else None


def sniff_telemetry(head: str) -> str | None:
    return "aiperf-gpu-telemetry" if _TELEMETRY.match(head) else None


def sniff_server_metrics(head: str) -> str | None:
    return "aiperf-server-metrics" if _SERVER.match(head) and '"metrics"' in head else None


def sniff_summary(head: str) -> str | None:
    """The summary: an object of AIPerf's metrics, each with its unit and average (under 'records' in
    releases of 2025), the request count among them."""
    return "aiperf-summary" if (_SUMMARY.match(head) or _VERSIONED.match(head)) and '"request_' in head else None


def _records(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_records(path, text)


def _telemetry(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_gpu_telemetry(path, text, opts.host, opts.gpu_instance)


def _server(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_server_metrics(path, text)


def _summary(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_summary(path, text, opts.tz_offset_s)


PARSERS: dict[str, Parser] = {"aiperf-records": _records, "aiperf-gpu-telemetry": _telemetry,
                              "aiperf-server-metrics": _server, "aiperf-summary": _summary}
