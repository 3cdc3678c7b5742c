"""Parsers for the evidence besides vLLM's own logs: Prometheus (text or OpenMetrics scrapes,
`promtool tsdb dump` output, query_range JSON, Grafana CSV and data frames), DCGM (exporter scrapes,
`dcgmi dmon`), nvidia-smi (query-gpu CSV, query-compute-apps, the default table, -q, dmon, pmon),
Kubernetes (events, pod status, describe) and kernel logs (OOM killer, Xid).

Every parser returns ``Parsed``: samples and events with absolute UTC epoch µs (or ``None`` when
the evidence does not say), plus quarantined lines with reasons. Metric names are mapped to the
bundle's names across vLLM versions here, in one table.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, ParamSpec
from xml.etree import ElementTree

import polars as pl
import yaml
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from replay.bundle import DEVICE_SOURCES, SAMPLES_SCHEMA, mig_source
from replay.errors import ReplayError
from replay.record.vllm_log import ANSI
from replay.units import MAX_GPU_INDEX, MiB, is_uint, parse_size_bytes

P = ParamSpec("P")

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
}
DCGM_METRICS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_FB_USED": ("device_used_bytes", MiB),
    "DCGM_FI_DEV_FB_FREE": ("device_free_bytes", MiB),
    "DCGM_FI_DEV_FB_RESERVED": ("device_reserved_bytes", MiB),
    "DCGM_FI_DEV_FB_TOTAL": ("device_total_bytes", MiB),
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


def renamed_note(path: Path, names: set[str]) -> list[str]:
    """A note for a file whose vLLM metrics (``names``, as the file has them) were renamed on their way."""
    odd = sorted(n for n in names if not n.startswith("vllm:"))
    if not odd:
        return []
    return [f"{path.name}: vLLM's metrics are renamed here ({', '.join(odd[:3])}{', …' if len(odd) > 3 else ''}; a "
            "collector or exporter on their way replaced 'vllm:'): read as vLLM's own"]


NEVER_EXISTED_METRICS = {
    "vllm_gpu_memory_usage_bytes": "vllm_gpu_memory_usage_bytes has never existed in any vLLM version "
    "(0.6-0.33): no vLLM metric reports GPU memory bytes. A monitor that scraped it read nothing, not "
    "zero. Device memory comes from DCGM (DCGM_FI_DEV_FB_USED) or NVML; vLLM's own view is "
    "vllm:kv_cache_usage_perc (the fill of its KV pool, not device memory).",
}
NEVER_EXISTED_METRICS["vllm:gpu_memory_usage_bytes"] = NEVER_EXISTED_METRICS["vllm_gpu_memory_usage_bytes"]


def _a_gpu(index: int | None) -> bool:
    """Whether a sample's GPU index is one a machine can have (or none: a sample of no GPU)."""
    return index is None or 0 <= index <= MAX_GPU_INDEX


@dataclass
class Parsed:
    """What a parser makes of one evidence file. Parsers that read a sample at a time list them in
    ``samples``; a vectorised lane hands whole frames (``frames``). ``frame`` gives them all as one."""

    kind: str
    samples: list[tuple[int | None, int | None, str, str, float]] = field(default_factory=list)
    frames: list[pl.DataFrame] = field(default_factory=list)  # samples as frames of SAMPLES_SCHEMA (epoch µs)
    events: list[dict[str, Any]] = field(default_factory=list)
    quarantine: list[tuple[int | None, str, str]] = field(default_factory=list)
    lines: int = 0
    parsed: int = 0
    notes: list[str] = field(default_factory=list)
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    naive_local_times: bool = False
    dcgm_labels: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (sample index, labels) of
    # the DCGM samples, until ``dcgm_hosts`` has told their hosts apart
    vllm_names: set[str] = field(default_factory=set)  # the names read as vLLM's metrics, as the file has them
    dcgm_frames: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # (frame index, labels) likewise
    values_checked: bool = False  # whether ``set_aside_impossible_values`` has been over it

    def frame(self) -> pl.DataFrame:
        """Every sample as one frame of SAMPLES_SCHEMA (epoch µs), those of ``frames`` first, and held
        so from then on (the list is emptied): as tuples, a day of samples took a gigabyte. A sample
        of a GPU index no machine has (more digits than the bundle's GPU column holds: a damaged or
        made-up line) is quarantined, not an internal error."""
        if not all(_a_gpu(s[1]) for s in self.samples):
            counts: dict[tuple[Any, str, str], int] = {}
            for s in self.samples:
                if not _a_gpu(s[1]):
                    counts[s[1], s[2], s[3]] = counts.get((s[1], s[2], s[3]), 0) + 1
            self.samples = [s for s in self.samples if _a_gpu(s[1])]
            self.quarantine += [(None, f"GPU index {g} is no index a machine has: {n} sample(s) of {src} {metric} left out",
                                 f"{src} {metric} (GPU {g})") for (g, src, metric), n in counts.items()]
            self.gpus = {g: v for g, v in self.gpus.items() if _a_gpu(g)}
        if self.samples or len(self.frames) != 1:
            listed = pl.DataFrame(self.samples, schema=SAMPLES_SCHEMA, orient="row", strict=False)
            self.frames = [pl.concat([*self.frames, listed], how="vertical_relaxed").cast(SAMPLES_SCHEMA)  # type: ignore[arg-type]
                           if self.frames else listed]
            self.samples = []
        return self.frames[0]


# --- values no device can have ------------------------------------------------------------------
MAX_DEVICE_BYTES = 16 << 40  # more memory than any GPU or host holds: past it, where no total is stated, a
# figure is damage (a stray 1e30, a unit applied twice)
_WITHIN_TOTAL = ("device_used_bytes", "device_free_bytes", "device_reserved_bytes", "process_used_bytes")
_BOUNDS: dict[str, str] = {  # the bundle's metric (before any ':' suffix) -> what bounds its values
    **dict.fromkeys((*_WITHIN_TOTAL, "device_total_bytes", "anon_rss_bytes"), "memory"),
    "kv_usage_ratio": "ratio", "cpu_kv_usage_ratio": "ratio", "util_gpu_pct": "percent", "util_mem_pct": "percent",
    **dict.fromkeys(("requests_running", "requests_waiting", "requests_swapped", "preemptions_total",
                     "prompt_tokens_total", "generation_tokens_total"), "count"),
}
_I64 = 1 << 63
IMPOSSIBLE = "impossible value"  # (how each such quarantine entry's reason opens)


def _mib(v: float) -> str:
    return f"{v / MiB:.6g} MiB"


def impossible(metric: str, value: float, total: float | None = None) -> str | None:
    """Why ``value`` of the bundle's ``metric`` cannot be, as a quarantine reason; None where it can. Memory
    is never negative nor more than the device's stated ``total`` (a MiB of rounding allowed), or where no
    total is stated, than MAX_DEVICE_BYTES; a KV cache's usage is a fraction 0-1, a utilisation 0-100 %, a
    count never negative. A NaN is no value (nvidia-smi's for a process whose memory it cannot see) and
    passes, and so does an infinity (no measurement either: the bundle leaves both out, and says how many);
    so does any metric not the bundle's own."""
    base = metric.split(":", 1)[0]
    kind = _BOUNDS.get(base)
    if kind is None or not math.isfinite(value):
        return None
    if kind == "memory":
        if value < 0:
            return f"{IMPOSSIBLE}: negative memory ({metric} = {_mib(value)})"
        if total is not None and base in _WITHIN_TOTAL and value > total + MiB:
            return f"{IMPOSSIBLE}: more memory than the GPU's stated total of {_mib(total)} ({metric} = {_mib(value)})"
        if value > MAX_DEVICE_BYTES:
            return (f"{IMPOSSIBLE}: more memory than any device holds (over 16 TiB"
                    f"{'' if base == 'device_total_bytes' else ', and no total stated'}; {metric} = {_mib(value)})")
        return None
    if kind == "ratio" and not 0 <= value <= 1:
        return f"{IMPOSSIBLE}: a KV cache usage outside 0-1 ({metric} = {value:g})"
    if kind == "percent" and not 0 <= value <= 100:
        return f"{IMPOSSIBLE}: a percentage outside 0-100 ({metric} = {value:g})"
    if kind == "count" and value < 0:
        return f"{IMPOSSIBLE}: a negative count ({metric} = {value:g})"
    return None


def maybe_impossible(total: pl.Expr, metric: pl.Expr | None = None, value: pl.Expr | None = None) -> pl.Expr:
    """``impossible``'s bounds as one vectorised test of ``metric`` and ``value`` (columns 'metric' and
    'value' unless given; ``total``: the GPU's stated total, or null): true where a row is out of them
    (its reason is then ``impossible``'s)."""
    base = (pl.col("metric") if metric is None else metric).str.replace(r":.*$", "")
    kind = base.replace_strict(list(_BOUNDS), list(_BOUNDS.values()), default=None, return_dtype=pl.Utf8)
    v = pl.col("value") if value is None else value
    limit = pl.when(base.is_in(list(_WITHIN_TOTAL)) & total.is_not_null()).then(
        pl.min_horizontal(total + MiB, pl.lit(float(MAX_DEVICE_BYTES)))).otherwise(pl.lit(float(MAX_DEVICE_BYTES)))
    out = (pl.when(kind == "memory").then((v < 0) | (v > limit))
           .when(kind == "ratio").then((v < 0) | (v > 1))
           .when(kind == "percent").then((v < 0) | (v > 100))
           .when(kind == "count").then(v < 0)
           .otherwise(False))
    return (out & v.is_finite()).fill_null(False)


def _host_key(source: pl.Expr) -> pl.Expr:
    """A source without its MIG instance's tag: the samples of one machine's GPU ('dcgm[GPU_I_ID=3]' is
    'dcgm'; 'dcgm[Hostname=b]' stays another machine's)."""
    return source.str.replace(r"\[GPU_I_ID=[^\]]*\]", "")


def _stated_totals(p: Parsed, frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Each GPU's stated memory total (the largest), by GPU and machine (``_host_key``): its
    ``device_total_bytes`` samples that are themselves possible, and for this machine's own sources
    the total ``p.gpus`` states."""
    said = [f.filter((pl.col("metric") == "device_total_bytes") & pl.col("gpu").is_not_null()
                     & pl.col("value").is_between(0, MAX_DEVICE_BYTES)).select(
        "gpu", host=_host_key(pl.col("source")), total="value") for f in frames]
    own = [(g, src, float(info["total_bytes"])) for g, info in p.gpus.items()
           if _a_gpu(g) and isinstance(info.get("total_bytes"), (int, float)) and 0 <= info["total_bytes"] <= MAX_DEVICE_BYTES
           for src in DEVICE_SOURCES]
    schema = {"gpu": pl.Int32, "host": pl.Utf8, "total": pl.Float64}
    return (pl.concat([*(f.cast(schema) for f in said), pl.DataFrame(own, schema=schema, orient="row")])  # type: ignore[arg-type]
            .group_by("gpu", "host").agg(pl.col("total").max()))


def _shown(t: int | None) -> str:
    if t is None:
        return "no time"
    try:
        return datetime.fromtimestamp(t / 1e6, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, OSError, ValueError):
        return f"{t} µs since 1970"


def _value_shown(metric: str, v: float) -> str:
    return _mib(v) if _BOUNDS.get(metric.split(":", 1)[0]) == "memory" else f"{v:g}"


def _listed_frame(samples: list[tuple[int | None, int | None, str, str, float]]) -> pl.DataFrame:
    """Listed samples as a frame, with their index ('_i'); a time or GPU index past what the frame holds
    is null here (others set those aside: ``frame``, the recorder's impossible times)."""
    try:
        df = pl.DataFrame(samples, schema=SAMPLES_SCHEMA, orient="row", strict=False)
    except (OverflowError, pl.exceptions.PolarsError):
        df = pl.DataFrame([(t if t is None or -_I64 <= t < _I64 else None, g if _a_gpu(g) else None, *rest)
                           for t, g, *rest in samples], schema=SAMPLES_SCHEMA, orient="row", strict=False)
    return df.with_row_index("_i")


def set_aside_impossible_values(p: Parsed, path: Path) -> Parsed:
    """Quarantine every sample whose value no device can have (``impossible``; where a parser knew its
    line it has set it aside already, with that line), and note the times at which one GPU's metric from
    one source has two different values (two series run together: two exporters, two pods, merged
    scrapes); those stay, and the larger decides a peak. Once per ``p``."""
    if p.values_checked:
        return p
    p.values_checked = True
    listed = _listed_frame(p.samples) if p.samples else None
    frames = [*p.frames, *([listed.drop("_i")] if listed is not None else [])]
    if not frames:
        return p
    totals = _stated_totals(p, frames)

    def odd(f: pl.DataFrame) -> list[dict[str, Any]]:
        """The rows of ``f`` (with '_i') out of bounds, with the total that bounded them."""
        rows = f.with_columns(host=_host_key(pl.col("source"))).join(
            totals, on=["gpu", "host"], how="left", nulls_equal=False).filter(maybe_impossible(pl.col("total")))
        return [r for r in rows.iter_rows(named=True) if impossible(r["metric"], r["value"], r["total"]) is not None]

    set_aside: list[dict[str, Any]] = []
    for k, f in enumerate(p.frames):
        bad = odd(f.with_row_index("_i"))
        if bad:
            set_aside += bad
            gone = pl.Series([r["_i"] for r in bad], dtype=pl.UInt32)
            p.frames[k] = f.with_row_index("_i").filter(~pl.col("_i").is_in(gone.implode())).drop("_i")
    if listed is not None:
        bad = odd(listed)
        if bad:
            set_aside += bad
            gone_i = {r["_i"] for r in bad}
            kept = {old: new for new, old in enumerate(i for i in range(len(p.samples)) if i not in gone_i)}
            p.samples = [x for i, x in enumerate(p.samples) if i not in gone_i]
            p.dcgm_labels = [(kept[i], labels) for i, labels in p.dcgm_labels if i in kept]
            listed = listed.filter(~pl.col("_i").is_in(pl.Series(sorted(gone_i), dtype=pl.UInt32).implode()))
    for r in set_aside:
        why = impossible(r["metric"], r["value"], r["total"]) or IMPOSSIBLE
        p.quarantine.append((None, why, f"{r['source']} {r['metric']} (GPU {r['gpu']}) = {_value_shown(r['metric'], r['value'])} "
                                        f"at {_shown(r['t_us'])}"))
    _note_conflicts(p, path, [*(f.select(*SAMPLES_SCHEMA) for f in p.frames),
                              *([listed.select(*SAMPLES_SCHEMA)] if listed is not None else [])])
    return p


def _note_conflicts(p: Parsed, path: Path, parts: list[pl.DataFrame]) -> None:
    """A note of the times at which one GPU's metric from one source has several values (``parts``: the
    samples, as frames)."""
    at = ["t_us", "gpu", "source", "metric"]
    df = pl.concat(parts, how="vertical_relaxed").filter(pl.col("t_us").is_not_null() & ~pl.col("value").is_nan())
    df = df.filter(pl.struct(at).hash().is_duplicated())  # (a cheap sieve: a key twice, or a hash's collision)
    clash = df.group_by(at).agg(pl.col("value").unique().sort()).filter(pl.col("value").list.len() > 1)
    if not clash.height:
        return
    t, gpu, source, metric, values = clash.sort(at, nulls_last=True).row(0)
    shown = " and ".join(_value_shown(metric, v) for v in values[:3]) + (", …" if len(values) > 3 else "")
    p.notes.append(f"{path.name}: {clash.height} time(s) at which one GPU's metric from one source has different values "
                   f"(first: {source} {metric}, GPU {gpu}, at {_shown(t)}: {shown}): conflicting series, such as two "
                   "exporters of one GPU or scrapes merged; all are kept, the largest decides a peak")


def _checks_values(parse: Callable[P, Parsed]) -> Callable[P, Parsed]:
    """A parser whose every result has been through ``set_aside_impossible_values`` (its first argument
    is the file's path)."""
    @functools.wraps(parse)
    def checked(*args: P.args, **kwargs: P.kwargs) -> Parsed:
        path = args[0] if args else kwargs["path"]
        assert isinstance(path, Path)
        return set_aside_impossible_values(parse(*args, **kwargs), path)
    return checked


def _utc(dt: datetime, tz_offset_s: int = 0) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc) - timedelta(seconds=tz_offset_s)
    return int(dt.timestamp() * 1_000_000)


def parse_time(s: str, tz_offset_s: int = 0) -> int | None:
    """ISO, 'YYYY/MM/DD HH:MM:SS.fff' (nvidia-smi), epoch seconds -> epoch µs; naive = host local. Go's zero
    time, which Kubernetes writes for a time it does not know ('0001-01-01T00:00:00Z', 'Mon, 01 Jan 0001
    00:00:00 +0000': a container the kubelet could not find), is no time: None."""
    s = s.strip().strip('"')
    if GO_ZERO_TIME.search(s):
        return None
    if re.fullmatch(r"\d{9,10}(\.\d+)?", s):
        return int(float(s) * 1_000_000)
    if re.fullmatch(r"\d{12,13}", s):
        return int(s) * 1000
    t = s.replace("/", "-").replace("Z", "+00:00")
    try:
        return _utc(datetime.fromisoformat(t), tz_offset_s)
    except ValueError:
        pass
    try:  # RFC 1123, as kubectl describe prints times: 'Thu, 01 May 2025 10:05:00 +0000'
        return _utc(datetime.strptime(s, "%a, %d %b %Y %H:%M:%S %z"), tz_offset_s)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%a %b %d %H:%M:%S %Y"):
        try:
            return _utc(datetime.strptime(t, fmt), tz_offset_s)
        except ValueError:
            continue
    return None


GO_ZERO_TIME = re.compile(r"^0001-01-01[T ]00:00:00|\b01 Jan 0001 00:00:00\b")


# --- Prometheus exposition (vLLM /metrics, DCGM exporter) ----------------------------------------
SCRAPED_AT = re.compile(r"^#\s*scraped[_ ]at[:=]?\s*(\S+(?: \S+)?)\s*$", re.I | re.M)
NAME_TS = re.compile(r"(\d{4}-?\d\d-?\d\d[T_]\d\d[:-]?\d\d[:-]?\d\d(?:Z)?)|(?<!\d)(\d{10}(?:\.\d+)?)(?!\d)")


def scrape_time(path: Path, text: str, at: str | None, tz_offset_s: int) -> tuple[int | None, str]:
    if at:
        t = parse_time(at, tz_offset_s)
        if t is not None:
            return t, "--at"
    m = SCRAPED_AT.search(text)
    if m:
        t = parse_time(m.group(1), tz_offset_s)
        if t is not None:
            return t, "# scraped_at line"
    m2 = NAME_TS.search(path.name)
    if m2:
        raw = m2.group(1) or m2.group(2)
        if m2.group(1):
            d = re.sub(r"[^0-9]", "", raw)
            raw = f"{d[0:4]}-{d[4:6]}-{d[6:8]}T{d[8:10]}:{d[10:12]}:{d[12:14]}" + ("Z" if raw.endswith("Z") else "")
        t = parse_time(raw, tz_offset_s)
        if t is not None:
            return t, "file name"
    return None, "none"


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


# a sample line: name, labels, value, a timestamp (ms in the text format, seconds in OpenMetrics) and an
# OpenMetrics exemplar ('# {trace_id="…"} 1.0 [ts]')
_SAMPLE_LINE = re.compile(r"^[a-zA-Z_:][\w:]*(\{.*\})?\s+\S+(\s+-?\d+(?:\.\d+)?)?(\s+#\s+\{.*\}\s+\S+(\s+\S+)?)?\s*$")


# a line of `promtool tsdb dump`: the metric's name is one of its labels, and labels sort before it
# where they begin with a capital ('{Hostname="n1", __name__="DCGM_FI_DEV_FB_USED", gpu="0"} 1234 1700000000000')
_DUMP_LINE = re.compile(r'^\{((?:[^"{}]|"(?:[^"\\]|\\.)*")*)\}(.*)$')
_DUMP_NAME = re.compile(r'(?:^|,)\s*__name__\s*=\s*"([a-zA-Z_:][\w:]*)"\s*(?=,|$)')


def dump_line(line: str) -> str:
    """A line of `promtool tsdb dump` as the text format writes it ('name{labels} value ms'); any
    other line as it is."""
    m = _DUMP_LINE.match(line.strip()) if line.startswith("{") else None
    name = _DUMP_NAME.search(m.group(1)) if m else None
    if m is None or name is None:
        return line
    labels = (m.group(1)[:name.start()] + m.group(1)[name.end():]).strip().strip(",").strip()
    return f"{name.group(1)}{{{labels}}}{m.group(2)}"


@_checks_values
def parse_exposition(path: Path, text: str, *, at: str | None = None, tz_offset_s: int = 0,
                     want: list[str] | None = None, host: str | None = None,
                     instance: str | None = None) -> Parsed:
    """One scrape (or several in one file, each after its own '# scraped_at' line, as a loop of
    ``echo "# scraped_at $(date -Is)"; curl /metrics`` writes them): vLLM and DCGM samples at the
    scrape time, or at their own timestamps where the lines carry them."""
    marks = [m.start() for m in SCRAPED_AT.finditer(text)]
    if len(marks) < 2:
        return dcgm_hosts(_parse_scrape(path, text, at, tz_offset_s, want, 0), path, host, instance)
    whole = Parsed(kind="prometheus-text", lines=text.count("\n") + (0 if text.endswith("\n") else 1))
    if marks[0] > 0 and text[:marks[0]].strip():  # lines before the first mark: a scrape of its own
        marks.insert(0, 0)
    for a, b in zip(marks, [*marks[1:], len(text)], strict=True):
        seg = text[a:b]  # (--at can place only lines before the first mark)
        one = _parse_scrape(path, seg, None if SCRAPED_AT.search(seg) else at, tz_offset_s, want, text.count("\n", 0, a))
        whole.kind = one.kind if one.kind != "prometheus-text" else whole.kind
        whole.dcgm_labels += [(k + len(whole.samples), labels) for k, labels in one.dcgm_labels]
        whole.samples += one.samples
        whole.events += one.events
        whole.quarantine += one.quarantine
        whole.parsed += one.parsed
        whole.gpus.update(one.gpus)
        whole.vllm_names |= one.vllm_names
        whole.notes += [n for n in one.notes if n not in whole.notes and "scrape time from" not in n]
    whole.notes.append(f"{path.name}: {len(marks)} scrapes, each at the time of its '# scraped_at' line")
    return dcgm_hosts(whole, path, host, instance)


SECONDS_NEVER = 1e11  # an OpenMetrics sample time this large, in seconds, is the year 5138: milliseconds
MS_AS_SECONDS_BEFORE = 1e9  # a text-format time that, read as milliseconds, falls before 2001 while it
# is a time since as seconds was written in seconds


def _parse_scrape(path: Path, text: str, at: str | None, tz_offset_s: int, want: list[str] | None,
                  line0: int) -> Parsed:
    """One scrape's text (its first line is file line ``line0 + 1``)."""
    p = Parsed(kind="prometheus-text")
    p.lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    t, how = scrape_time(path, text, at, tz_offset_s)
    # OpenMetrics (what /metrics sends when asked for it): '# EOF' at the end, timestamps in seconds,
    # exemplars after '#'; the text format has timestamps in milliseconds
    openmetrics = re.search(r"^# EOF\s*$", text, re.M) is not None
    for name in want or []:
        if name in NEVER_EXISTED_METRICS:
            p.notes.append(NEVER_EXISTED_METRICS[name])
    lines = text.splitlines()
    clean, bad = [], []
    numbered: list[tuple[int, str]] = []  # the sample lines, to read one by one if the whole will not read
    for i, orig in enumerate(lines, start=line0 + 1):
        ln = dump_line(orig)
        s = ln.strip()
        if not s or s.startswith("#"):
            p.parsed += 1
            clean.append(ln)
            continue
        if not _SAMPLE_LINE.match(s):
            bad.append((i, "not a Prometheus exposition sample line", orig))
            continue
        clean.append(ln)
        numbered.append((i, ln))
        p.parsed += 1
    p.quarantine += bad
    read = openmetrics_families if openmetrics else text_string_to_metric_families
    try:
        families = list(read("\n".join(clean) + "\n"))
        lines_of: list[int] | None = [i for i, _ in numbered]  # (the parser gives a sample a line, in order)
    except (ValueError, TypeError, IndexError):
        # a line the parser refuses (a native histogram's '{count:…}' value, a broken escape) would lose
        # the whole scrape: read each sample line alone and set aside only those it refuses
        families, lines_of = [], []
        for i, ln in numbered:
            try:
                one = list(read(ln + ("\n# EOF\n" if openmetrics else "\n")))
            except (ValueError, TypeError, IndexError) as e:
                p.quarantine.append((i, f"not a sample the exposition parser can read: {e}", lines[i - line0 - 1]))
                p.parsed -= 1
                continue
            families += one
            lines_of += [i] * sum(len(f.samples) for f in one)
    if lines_of is not None and len(lines_of) != sum(len(f.samples) for f in families):
        lines_of = None  # (not a line a sample: no line is told rather than a wrong one)
    sample_line: list[int | None] = []  # each sample's line, beside ``p.samples``
    is_dcgm = False
    vllm_series: list[tuple[int, str, dict[str, str]]] = []  # (sample index, name, labels), to tell series apart
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    repeats = 0
    other_unit = 0  # sample times written in the other format's unit (read in the unit that makes them a time)
    for j, smp in enumerate(smp for fam in families for smp in fam.samples):
        name, labels, value = smp.name, smp.labels, smp.value
        if not smp.timestamp:  # the same series twice at one scrape time: several scrapes run together
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                repeats += 1
                continue
            seen.add(key)
        ts_s = float(smp.timestamp) if smp.timestamp else None
        if ts_s is not None and (ts_s >= SECONDS_NEVER if openmetrics else ts_s < MS_AS_SECONDS_BEFORE <= ts_s * 1000):
            ts_s = ts_s / 1000 if openmetrics else ts_s * 1000
            other_unit += 1
        ts = int(ts_s * 1_000_000) if ts_s is not None else t
        if name in DCGM_METRICS:
            is_dcgm = True
            metric, scale = DCGM_METRICS[name]
            gpu = dcgm_gpu(labels)
            p.dcgm_labels.append((len(p.samples), labels))
            p.samples.append((ts, gpu, "dcgm", metric, float(value) * scale))
            sample_line.append(lines_of[j] if lines_of else None)
        elif name in NEVER_EXISTED_METRICS:
            p.notes.append(NEVER_EXISTED_METRICS[name])
        elif (own := vllm_name(name)) == CACHE_CONFIG:
            p.events.append({"t": ts, "kind": "kv_config", "data": dict(labels), "line": None})
            p.vllm_names.add(name)
        elif own is not None:
            metric, scale = VLLM_METRICS[own]
            vllm_series.append((len(p.samples), name, labels))
            p.vllm_names.add(name)
            p.samples.append((ts, None, "vllm-metrics", metric, float(value) * scale))
            sample_line.append(lines_of[j] if lines_of else None)
    for (k, _, _), tag in zip(vllm_series, vllm_series_tags([(n, labels) for _, n, labels in vllm_series]), strict=True):
        if tag:
            st, sg, _, sm, sv = p.samples[k]
            p.samples[k] = (st, sg, "vllm-metrics" + tag, sm, sv)
    _set_aside_scraped(p, sample_line, lambda i: lines[i - line0 - 1])
    if is_dcgm:
        p.kind = "dcgm"
    elif any(s[2].startswith("vllm-metrics") for s in p.samples):
        p.kind = "vllm-metrics"
    if other_unit:
        p.notes.append(f"{path.name}: {other_unit} sample times are in " + (
            "milliseconds, where OpenMetrics (its '# EOF') has seconds: read as milliseconds" if openmetrics else
            "seconds, where the text format has milliseconds: read as seconds") + " (the other unit puts them in "
            + ("the year 5000 or later)" if openmetrics else "1970)"))
    if repeats:
        p.notes.append(f"{path.name}: series repeat without times of their own, as when several scrapes are saved "
                       "in one file: only the first of each is kept; put a '# scraped_at TIME' line before each scrape")
        p.quarantine.append((None, f"{repeats} repeated samples of scrapes run together without '# scraped_at' lines", ""))
    n = sum(1 for s in p.samples if s[0] is None)
    if n:  # (samples with timestamps of their own need no scrape time)
        p.notes.append(f"{path}: no scrape time found (file name, '# scraped_at' line or --at); "
                       f"its {n} samples without timestamps are quarantined, not placed on the timeline")
        p.quarantine.append((None, f"{n} samples without a scrape time", ""))
        kept = {k: j for j, k in enumerate(k for k, s in enumerate(p.samples) if s[0] is not None)}
        p.dcgm_labels = [(kept[k], labels) for k, labels in p.dcgm_labels if k in kept]
        p.samples = [s for s in p.samples if s[0] is not None]
    elif t is not None and p.samples:
        p.notes.append(f"{path.name}: scrape time from {how}")
    return p


def _set_aside_scraped(p: Parsed, sample_line: list[int | None], text_of: Callable[[int], str]) -> None:
    """A scrape's samples whose value no device can have (``impossible``), each quarantined with its line:
    a DCGM series' memory is bounded by the total its own labels state (DCGM_FI_DEV_FB_TOTAL)."""
    labels_of = dict(p.dcgm_labels)
    totals: dict[tuple[tuple[str, str], ...], float] = {}
    for k, (_, _, _, metric, v) in enumerate(p.samples):
        if metric == "device_total_bytes" and k in labels_of and impossible(metric, v) is None:
            key = tuple(sorted(labels_of[k].items()))
            totals[key] = max(totals.get(key, v), v)
    gone: dict[int, str] = {}
    for k, (_, _, _, metric, v) in enumerate(p.samples):
        total = totals.get(tuple(sorted(labels_of[k].items()))) if totals and k in labels_of else None
        why = impossible(metric, v, total)
        if why is not None:
            gone[k] = why
    if not gone:
        return
    for k, why in gone.items():
        line = sample_line[k]
        p.quarantine.append((line, why, text_of(line) if line is not None else ""))
        p.parsed -= line is not None
    kept = {old: new for new, old in enumerate(k for k in range(len(p.samples)) if k not in gone)}
    p.dcgm_labels = [(kept[k], labels) for k, labels in p.dcgm_labels if k in kept]
    p.samples = [x for k, x in enumerate(p.samples) if k not in gone]


def _obj(x: Any) -> dict[str, Any]:
    """``x`` where it is an object (a mapping), else an empty one: a field of the wrong type reads as absent."""
    return x if isinstance(x, dict) else {}


def _list(x: Any) -> list[Any]:
    """``x`` where it is a list, else an empty one (as ``_obj`` for objects)."""
    return x if isinstance(x, list) else []


def dcgm_gpu(labels: dict[str, str]) -> int | None:
    """The GPU index a DCGM series states ('gpu', or 'GPU' in older exporters); None where none."""
    g = (labels.get("gpu") or labels.get("GPU") or "").strip()
    return int(g) if is_uint(g) else None


# labels that name the machine a DCGM series comes from, in the order they are trusted: the exporter's
# own Hostname (the node), then what Prometheus or Kubernetes add ('instance' changes when the
# exporter's pod restarts, so it counts only where nothing better is there)
HOST_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "nodename", "host", "instance")


def _names_of_host(labels: dict[str, str]) -> set[str]:
    return {n for k in HOST_LABELS if (v := labels.get(k)) for n in (v, v.rsplit(":", 1)[0])}


def dcgm_hosts(p: Parsed, path: Path, host: str | None, instance: str | None = None) -> Parsed:
    """Tell apart DCGM series of several machines (a cluster-wide query or federation): GPU 0 of
    node-1 and GPU 0 of node-2 are not one series. Each host's samples get a source of their own
    ('dcgm[Hostname=node-2]'), except those of ``host`` (--host: the node vLLM ran on), which stay the
    bundle's device memory ('dcgm'). GPU names and UUIDs go into the bundle's GPUs only from series
    that stay 'dcgm'. With one host, nothing changes.

    A GPU split into MIG instances has a framebuffer series per instance (label GPU_I_ID), each of
    them the memory of a device of its own: where one GPU has several, each instance's samples get a
    source of their own too ('dcgm[GPU_I_ID=3]'), except those of ``instance`` (--gpu-instance: the
    one vLLM ran in, 'ID' of any GPU or 'GPU:ID'), which stay the bundle's device memory."""
    framed = len(p.dcgm_labels)  # (entries past it index frames: a series read as columns)
    series, p.dcgm_labels, p.dcgm_frames = p.dcgm_labels + p.dcgm_frames, [], []
    key = next((k for k in HOST_LABELS if any(k in labels for _, labels in series)), "")
    hosts = sorted({labels.get(key, "") for _, labels in series}) if key else []
    several = len(hosts) > 1
    chosen = [host is not None and host in _names_of_host(labels) for _, labels in series]
    split = _mig_split(series, key)

    def tag(i: int, k: int, tagged: str) -> None:
        if i >= framed:
            p.frames[k] = p.frames[k].with_columns(source=pl.lit(tagged))
        else:
            t, gpu, _, metric, value = p.samples[k]
            p.samples[k] = (t, gpu, tagged, metric, value)

    for i, ((k, labels), ours) in enumerate(zip(series, chosen, strict=True)):
        if several and not ours:
            tag(i, k, f"dcgm[{key}={labels.get(key, '')}]")
            continue
        gpu = dcgm_gpu(labels)
        gi = (labels.get("GPU_I_ID") or "").strip()
        if gpu is not None and (labels.get(key, ""), gpu) in split and instance not in (gi, f"{gpu}:{gi}"):
            tag(i, k, mig_source("dcgm", gi))  # (its GPU's name and UUID are the GPU's still)
        if gpu is not None:
            info = p.gpus.setdefault(gpu, {"index": gpu})
            info.update({k: v for k, v in (("uuid", labels.get("UUID") or labels.get("uuid")),
                                           ("name", labels.get("modelName")), ("host", labels.get(key))) if v})
    if several:
        mine = any(chosen)
        shown = ", ".join(hosts[:6]) + (", …" if len(hosts) > 6 else "")
        p.notes.append(f"{path.name}: DCGM series from {len(hosts)} hosts ({shown}): each host's GPUs are a series of "
                       f"their own (source 'dcgm[{key}=…]')" + (
                           f"; {host}'s are the bundle's device memory (source 'dcgm')" if mine else
                           f"; no series is from --host {host}" if host else
                           "; pass --host with the node vLLM ran on to make its series the bundle's device memory"))
    elif host is not None and hosts and not any(chosen):
        p.notes.append(f"{path.name}: --host {host}, but its DCGM series come from {hosts[0]} alone (kept as they are)")
    _dcgm_pods(p, path, series, framed, [not (several and not ours) for ours in chosen], key)
    for (_, gpu), ids in sorted(split.items()):
        picked = next((gi for gi in ids if instance in (gi, f"{gpu}:{gi}")), None)
        p.notes.append(f"{path.name}: GPU {gpu} is split into MIG instances (GPU_I_ID {', '.join(ids)}): each instance's "
                       "memory is a series of its own (source 'dcgm[GPU_I_ID=…]')" + (
                           f"; instance {picked}'s is the bundle's device memory (source 'dcgm')" if picked else
                           f"; none is --gpu-instance {instance}" if instance else
                           "; pass --gpu-instance with the one vLLM ran in to make its series the bundle's device memory"))
    return p


def _pod_of(labels: dict[str, str]) -> str | None:
    """The Kubernetes pod a DCGM series is attributed to ('namespace/pod'), as the exporter labels it
    ('exported_' first: what Prometheus renames when its own target labels clash); None where none."""
    pod = labels.get("exported_pod") or labels.get("pod")
    ns = labels.get("exported_namespace") or labels.get("namespace")
    return (f"{ns}/{pod}" if ns else pod) if pod else None


def _dcgm_pods(p: Parsed, path: Path, series: list[tuple[int, dict[str, str]]], framed: int, ours: list[bool],
               key: str) -> None:
    """The pods DCGM attributes each GPU to, into the bundle's GPUs ('pods'), and its framebuffer
    samples once each. DCGM's framebuffer figures are the whole device's: the pod label says which pod
    holds the GPU, not what that pod uses. Where several pods hold one device at the same time (MPS,
    time-slicing: the exporter repeats the device's series under each pod), the samples that repeat
    one another are one fact, and a note says the GPU was shared (its memory is every tenant's). Pods
    that follow one another on a GPU (a restart's new name) share nothing."""
    pods = [_pod_of(labels) for _, labels in series]
    devices: dict[tuple[str, int, str], set[str]] = {}
    for (_, labels), pod, mine in zip(series, pods, ours, strict=True):
        gpu = dcgm_gpu(labels)
        if gpu is None or pod is None:
            continue
        devices.setdefault((labels.get(key, "") if key else "", gpu, (labels.get("GPU_I_ID") or "").strip()), set()).add(pod)
        if mine:
            info = p.gpus.setdefault(gpu, {"index": gpu})
            info["pods"] = sorted({*info.get("pods", []), pod})
    if all(len(v) < 2 for v in devices.values()):
        return
    # each sample's pod, beside it: the listed samples' by their index, a framed series' for the whole frame
    listed: list[str | None] = [None] * len(p.samples)
    framed_pod: dict[int, str | None] = {}
    for i, ((k, _), pod) in enumerate(zip(series, pods, strict=True)):
        if i < framed:
            listed[k] = pod
        else:
            framed_pod[k] = pod
    parts = [f.with_columns(pod=pl.lit(framed_pod.get(k), pl.Utf8)) for k, f in enumerate(p.frames)]
    if p.samples:
        parts.append(pl.DataFrame(p.samples, schema=SAMPLES_SCHEMA, orient="row", strict=False).with_columns(
            pod=pl.Series(listed, dtype=pl.Utf8)))
    df = pl.concat(parts, how="vertical_relaxed")
    at = ["t_us", "gpu", "source", "metric"]
    dcgm = pl.col("source").str.starts_with("dcgm") & pl.col("pod").is_not_null()
    shared = (df.filter(dcgm).group_by(at).agg(pl.col("pod").unique()).filter(pl.col("pod").list.len() > 1)
              .group_by("gpu", "source").agg(pl.col("pod").list.explode().unique().sort()).sort("gpu", "source"))
    kept = df.filter(~dcgm | pl.struct(*at, "value").is_first_distinct()).drop("pod")
    p.frames, p.samples = [kept.cast(SAMPLES_SCHEMA)], []  # type: ignore[arg-type]
    for gpu, source, names in shared.iter_rows():
        if source == "dcgm" and gpu in p.gpus:  # (the bundle's own GPUs: the analysis makes a finding of it)
            p.gpus[gpu]["shared_by"] = sorted({*p.gpus[gpu].get("shared_by", []), *names})
        shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        where = f" ({source})" if source != "dcgm" else ""
        p.notes.append(f"{path.name}: GPU {gpu}{where} was shared by {len(names)} pods at once ({shown}; MPS or "
                       "time-slicing): its DCGM memory is the whole GPU's, every tenant's together, repeated under each pod")
    if df.height > kept.height:
        p.notes.append(f"{path.name}: DCGM samples repeating another's GPU, time and value under another pod's labels: "
                       f"{df.height - kept.height}, kept once")


def _mig_split(series: list[tuple[int, dict[str, str]]], key: str) -> dict[tuple[str, int], list[str]]:
    """The GPUs (host, index) whose DCGM series are of several MIG instances, with their GPU_I_IDs."""
    ids: dict[tuple[str, int], set[str]] = {}
    for _, labels in series:
        gpu, gi = dcgm_gpu(labels), (labels.get("GPU_I_ID") or "").strip()
        if gpu is not None and gi:
            ids.setdefault((labels.get(key, "") if key else "", gpu), set()).add(gi)
    return {g: instance_order(v) for g, v in ids.items() if len(v) > 1}


def instance_order(ids: set[str]) -> list[str]:
    """MIG instance ids (GPU_I_ID) in number order, as text: '3', '5', '13'."""
    return sorted(ids, key=lambda x: (len(x), x))


def series_tags(label_sets: list[dict[str, str]]) -> list[str]:
    """What tells apart several series of one vLLM metric (data-parallel engines, replicas): for each,
    '[label=value,…]' of the labels whose values differ among them; '' for a lone series. The tag
    goes into the samples' source ('vllm-metrics[engine=1]'), so that the series stay apart."""
    keys = sorted({k for labels in label_sets for k in labels if k != "__name__"})
    vary = [k for k in keys if len({labels.get(k) for labels in label_sets}) > 1] if len(label_sets) > 1 else []
    if not vary:
        return [""] * len(label_sets)
    return ["[" + ",".join(f"{k}={labels.get(k, '')}" for k in vary) + "]" for labels in label_sets]


def vllm_series_tags(series: list[tuple[str, dict[str, str]]]) -> list[str]:
    """For each (metric name, labels), the ``series_tags`` tag that tells it apart from the other
    series of the same bundle metric (vLLM's names of every version map to one); '' for a lone series
    and for a series that is not vLLM's."""
    by_metric: dict[str, list[int]] = {}
    for i, (name, _) in enumerate(series):
        if (own := vllm_name(name)) in VLLM_METRICS:
            by_metric.setdefault(VLLM_METRICS[own][0], []).append(i)
    out = [""] * len(series)
    for idx in by_metric.values():
        for i, tag in zip(idx, series_tags([series[i][1] for i in idx]), strict=True):
            out[i] = tag
    return out


SERIES_AT_ONCE = 256  # a series of this many points or more is read as columns where it has the usual shape
_DECIMAL = r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$"  # (a value as text that Python's float reads alike)


def _series_frame(points: list[Any], us_per_unit: int, gaps: bool) -> pl.DataFrame | None:
    """A series' (time, value) pairs as columns 't_us' and 'value' (unscaled), exactly as the loop in
    ``_series_points`` reads them, one by one; None where a point is not of the usual shape (a pair
    with a number for time and a decimal or number for value, no gap unless ``gaps``), for the loop."""
    # (the checks a point at a time cost more than the reading: the builtins map over the whole list)
    if not set(map(type, points)) <= {list, tuple} or set(map(len, points)) - {2}:
        return None
    times = [pt[0] for pt in points]
    if not set(map(type, times)) <= {int, float}:
        return None
    try:
        ts = pl.Series(times, dtype=pl.Float64, strict=False)
        vs = pl.Series([pt[1] for pt in points])
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):  # (mixed kinds of value)
        return None
    kept = vs.is_not_null() if gaps else None  # (a gap is no sample)
    if vs.dtype == pl.String:
        decimal = vs.str.contains(_DECIMAL).fill_null(False)
        if not (decimal if kept is None else decimal.filter(kept)).all():
            return None
        vs = vs.cast(pl.Float64, strict=False)
    elif vs.dtype.is_numeric():  # (not a Boolean: no number to polars, as True is none to the loop's float)
        vs = vs.cast(pl.Float64)
    elif vs.dtype != pl.Null or not gaps:
        return None
    df = pl.DataFrame({"t": ts * us_per_unit, "value": vs})
    df = df if kept is None else df.filter(kept)
    if df.null_count().sum_horizontal().item() or not df["t"].is_finite().all() or not df["value"].is_finite().all():
        return None
    if df.height and df["t"].abs().max() >= 2.0 ** 62:  # type: ignore[operator]
        return None
    return df.select(t_us=pl.col("t").cast(pl.Int64), value="value")


def _series_points(p: Parsed, what: str, name: str, labels: dict[str, str], tag: str, points: Any, us_per_unit: int,
                   others: bool = False, gaps: bool = False, line: int | None = None) -> None:
    """The samples of one exported series of ``name``: (time, value) pairs, times in units of
    ``us_per_unit`` µs, under the bundle's metric for DCGM's or vLLM's name (``tag`` tells several
    series of one vLLM metric apart), under its own with ``others``; a null value is a gap with
    ``gaps``, and a point that is no number is quarantined."""
    if name in NEVER_EXISTED_METRICS:
        p.notes.append(NEVER_EXISTED_METRICS[name])
        return
    own = vllm_name(name)
    if name in DCGM_METRICS:
        (metric, scale), source, gpu = DCGM_METRICS[name], "dcgm", dcgm_gpu(labels)
    elif own in VLLM_METRICS:
        (metric, scale), source, gpu = VLLM_METRICS[own], "vllm-metrics" + tag, None
        p.vllm_names.add(name)
    elif others:
        metric, scale, source, gpu = name or what, 1.0, "prometheus", None
    else:
        return  # (a panel's other series: not the recorder's)
    if isinstance(points, list) and len(points) >= SERIES_AT_ONCE:
        frame = _series_frame(points, us_per_unit, gaps)
        if frame is not None and not frame.height:  # (gaps alone: no sample, and no GPU or host told of)
            return
        if frame is not None and _a_gpu(gpu):  # (a series of the usual shape, as columns:
            # a cluster's export is millions of points; a GPU index no machine has takes the loop, which quarantines it)
            p.frames.append(frame.select("t_us", gpu=pl.lit(gpu, pl.Int32), source=pl.lit(source), metric=pl.lit(metric),
                                         value=pl.col("value").cast(pl.Float64) * scale))
            if source == "dcgm":
                p.dcgm_frames.append((len(p.frames) - 1, labels))
            return
    for point in points if isinstance(points, list) else []:
        try:
            t, v = point
            if v is None and gaps:
                continue
            sample = (int(float(t) * us_per_unit), gpu, source, metric, float(v) * scale)
        except (TypeError, ValueError, OverflowError):  # (not a pair; a time of inf or 1e300)
            p.quarantine.append((line, f"{what} ({name}): bad point {point!r}", ""))
            continue
        if source == "dcgm":
            p.dcgm_labels.append((len(p.samples), labels))
        p.samples.append(sample)


@_checks_values
def parse_query_range(path: Path, obj: dict[str, Any], want: list[str] | None = None,
                      host: str | None = None, instance: str | None = None) -> Parsed:
    p = Parsed(kind="prometheus-query-range")
    data = _obj(_obj(obj).get("data"))
    refused = _obj(obj).get("status") == "error"
    if refused or data.get("resultType") in ("scalar", "string"):
        # (an error answer holds no data; a scalar or string result is one value with no metric name)
        p.lines = 1
        why = (f"the Prometheus API answered with an error ({obj.get('errorType')}: {str(obj.get('error'))[:200]})"
               if refused else f"a {data['resultType']} result: one value with no metric name")
        p.quarantine.append((1, why + ", not series", json.dumps(obj)[:300]))
        p.notes.append(f"{path.name}: {why}: it holds no samples; " + (
            "correct the query and export it again" if refused
            else "export a query that returns series (a range or instant vector)"))
        return p
    results = _list(data.get("result"))
    metrics = [{str(k): str(v) for k, v in _obj(_obj(r).get("metric")).items()} for r in results]
    tags = vllm_series_tags([(m.get("__name__", ""), m) for m in metrics])  # (several series of one vLLM metric)
    p.lines = len(results)
    for name in want or []:
        if name in NEVER_EXISTED_METRICS:
            p.notes.append(NEVER_EXISTED_METRICS[name])
    for i, (series, labels) in enumerate(zip(results, metrics, strict=True)):
        if not isinstance(series, dict):
            p.quarantine.append((None, f"series {i}: not a series (an object with 'metric' and 'values')", str(series)[:300]))
            continue
        name = labels.get("__name__", "")
        vals = series.get("values") or ([series["value"]] if "value" in series else [])
        _series_points(p, f"series {i}", name, labels, tags[i], vals, 1_000_000, others=True)
        p.parsed += 1
    if _obj(obj).get("status") not in (None, "success"):
        p.notes.append(f"{path}: query status {obj.get('status')!r}: {obj.get('error')}")
    return dcgm_hosts(p, path, host, instance)


@_checks_values
def parse_vm_export(path: Path, text: str, want: list[str] | None = None, host: str | None = None,
                    instance: str | None = None) -> Parsed:
    """VictoriaMetrics' ``/api/v1/export`` (what ``vmctl`` and a VictoriaMetrics-backed Grafana users
    download): a series a line, '{"metric": {labels}, "values": [...], "timestamps": [ms, ...]}'. Its
    series are read as a query_range export's are; a line that is not one is quarantined."""
    p = Parsed(kind="victoriametrics-export")
    series: list[tuple[int, dict[str, str], list[Any]]] = []
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        p.lines = no
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        ok = isinstance(obj, dict) and isinstance(obj.get("metric"), dict) and isinstance(obj.get("values"), list) \
            and isinstance(obj.get("timestamps"), list) and len(obj["values"]) == len(obj["timestamps"])
        if not ok:
            p.quarantine.append((no, "not a series of VictoriaMetrics' export (metric, and as many values as "
                                     "timestamps)", line[:300]))
            continue
        assert isinstance(obj, dict)
        labels = {str(k): str(v) for k, v in obj["metric"].items()}
        series.append((no, labels, [[t, v] for t, v in zip(obj["timestamps"], obj["values"], strict=True)]))
    p.lines = max(p.lines, len(text.splitlines()))
    for name in want or []:
        if name in NEVER_EXISTED_METRICS:
            p.notes.append(NEVER_EXISTED_METRICS[name])
    tags = vllm_series_tags([(labels.get("__name__", ""), labels) for _, labels, _ in series])
    for (no, labels, points), tag in zip(series, tags, strict=True):
        _series_points(p, f"line {no}", labels.get("__name__", ""), labels, tag, points, 1000, others=True, line=no)
        p.parsed += 1
    return dcgm_hosts(p, path, host, instance)


VM_EXPORT_LINE = re.compile(r'^\{\s*"metric"\s*:\s*\{.*"timestamps"\s*:\s*\[')  # (how its every line looks)


def _series_name(header: str) -> tuple[str, dict[str, str]]:
    """A Grafana column's metric name and labels, where its legend is Prometheus' default
    ('DCGM_FI_DEV_FB_USED{Hostname="node-1", gpu="0"}'); no labels for any other legend."""
    name, brace, rest = header.partition("{")
    labels = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', rest)) if brace else {}
    return name.strip(), labels


_GrafanaSeries = tuple[dict[str, str], str, float, str, "int | None"]  # labels, metric, scale, source, gpu


def _grafana_series(p: Parsed, headers: list[str]) -> list[_GrafanaSeries]:
    """What each Grafana series (named by its legend) is: the bundle's metric for vLLM's or DCGM's name
    (series of one vLLM metric told apart by their labels), else its own name."""
    series: list[_GrafanaSeries] = []
    named = [_series_name(h) for h in headers]
    for h, (key, labels), tag in zip(headers, named, vllm_series_tags(named), strict=True):
        own = vllm_name(key)
        m = VLLM_METRICS.get(own or "") or DCGM_METRICS.get(key)
        src = "dcgm" if key in DCGM_METRICS else "vllm-metrics" + tag if own in VLLM_METRICS else "grafana"
        series.append((labels, m[0] if m else h, m[1] if m else 1.0, src, dcgm_gpu(labels) if src == "dcgm" else None))
        if own in VLLM_METRICS:
            p.vllm_names.add(key)
        if key in NEVER_EXISTED_METRICS:
            p.notes.append(NEVER_EXISTED_METRICS[key])
    return series


def _grafana_cell(p: Parsed, no: int, t: int, series: _GrafanaSeries, cell: str, delim: str, row: list[str]) -> None:
    """One Grafana value of ``series`` at time ``t``: a sample, nothing for an empty cell, or quarantined."""
    labels, metric, scale, src, gpu = series
    c = cell.strip()
    if c in ("", "null", "NaN", "-"):
        return
    if delim == ";" and "," in c and "." not in c:
        c = c.replace(",", ".")  # locale decimal comma
    v = _grafana_value(c, scale)
    if v is None:
        p.quarantine.append((no, f"unparseable value {cell!r}", delim.join(row)))
        return
    why = impossible(metric, v)
    if why is not None:
        p.quarantine.append((no, why, delim.join(row)))
        return
    if src == "dcgm":
        p.dcgm_labels.append((len(p.samples), labels))
    p.samples.append((t, gpu, src, metric, v))


@_checks_values
def parse_grafana_csv(path: Path, text: str, tz_offset_s: int = 0, host: str | None = None,
                      instance: str | None = None) -> Parsed:
    """Grafana 'Inspect -> Data -> Download CSV': Time + one column per series ('series joined by
    time', the default), or one row per point under 'Series', 'Time', 'Value' ('series as rows', as
    older Grafana wrote it); ';' or ',' delimiter."""
    p = Parsed(kind="grafana-csv")
    first = text.splitlines()[0] if text else ""
    delim = ";" if first.count(";") > first.count(",") else ("\t" if "\t" in first else ",")
    try:  # (newline="": a line break inside a quoted field is the field's, as csv wants)
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delim))
    except csv.Error as e:
        raise ReplayError(f"{path}: not a CSV that can be read as Grafana's ({e})") from None
    p.lines = len(rows)
    if not rows:
        return p
    header = [h.strip().strip('"') for h in rows[0]]
    p.parsed = 1
    if [h.lower() for h in header] == ["series", "time", "value"]:
        names = list(dict.fromkeys(r[0].strip() for r in rows[1:] if len(r) == 3))
        by_name = dict(zip(names, _grafana_series(p, names), strict=True))
        for i, row in enumerate(rows[1:], start=2):
            if not row:
                continue
            t = parse_time(row[1], tz_offset_s) if len(row) == 3 else None
            if t is None:
                p.quarantine.append((i, "unparseable time" if len(row) == 3 else f"{len(row)} fields, not 3",
                                     delim.join(row)))
                continue
            p.parsed += 1
            _grafana_cell(p, i, t, by_name[row[0].strip()], row[2], delim, row)
        return dcgm_hosts(p, path, host, instance)
    series = _grafana_series(p, header[1:])
    for i, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        t = parse_time(row[0], tz_offset_s)
        if t is None:
            p.quarantine.append((i, "unparseable time", delim.join(row)))
            continue
        p.parsed += 1
        for ser, cell in zip(series, row[1:]):
            _grafana_cell(p, i, t, ser, cell, delim, row)
    return dcgm_hosts(p, path, host, instance)


def _frames(obj: Any) -> list[dict[str, Any]]:
    """The data frames of a Grafana JSON export, whichever wrapping it has: a list of frames (the
    panel inspector's 'DataFrame JSON'), panel data ('series'), a query response ('results' by refId,
    each with 'frames'), or one frame."""
    if isinstance(obj, list):
        return [f for f in obj if isinstance(f, dict)]
    if not isinstance(obj, dict):
        return []
    if isinstance(obj.get("results"), dict):
        return [f for r in obj["results"].values() for f in _list(_obj(r).get("frames")) if isinstance(f, dict)]
    for key in ("series", "frames", "dataFrames", "data"):
        if isinstance(obj.get(key), list):
            return [f for f in obj[key] if isinstance(f, dict)]
    return [obj]


def _frame_fields(frame: dict[str, Any]) -> list[tuple[dict[str, Any], list[Any]]]:
    """(field, its values) of a frame: values inline (panel data) or in 'data.values' (frame JSON)."""
    fields = frame["schema"].get("fields") if isinstance(frame.get("schema"), dict) else frame.get("fields")
    if not isinstance(fields, list):
        return []
    columns = _obj(frame.get("data")).get("values")
    out = []
    for i, f in enumerate(fields):
        if not isinstance(f, dict):
            continue
        vals = f.get("values") if "values" in f else (columns[i] if isinstance(columns, list) and i < len(columns) else None)
        out.append((f, vals if isinstance(vals, list) else []))
    return out


@_checks_values
def parse_grafana_frames(path: Path, obj: Any, host: str | None = None, instance: str | None = None) -> Parsed:
    """Grafana's JSON of a panel's data (panel inspector: 'DataFrame JSON', 'Panel data', or the query
    response): per frame a time field (epoch ms) and value fields, named by their '__name__' label, or
    their own name or legend where that is a metric's name."""
    p = Parsed(kind="grafana-json")
    frames = _frames(obj)
    p.lines = len(frames)
    named: list[tuple[str, dict[str, str]]] = []
    columns: list[tuple[int, list[Any], list[Any]]] = []  # (frame, times, values) per value field
    for k, frame in enumerate(frames):
        fields = _frame_fields(frame)
        times = next((v for f, v in fields if f.get("type") == "time"), None)
        if times is None:
            p.quarantine.append((None, f"frame {k}: no time field", json.dumps(frame)[:300]))
            continue
        p.parsed += 1
        for f, vals in fields:
            if f.get("type") == "time":
                continue
            labels = {str(a): str(b) for a, b in _obj(f.get("labels")).items()}
            config = _obj(f.get("config"))
            legend = _series_name(str(config.get("displayNameFromDS") or config.get("displayName") or ""))
            schema = _obj(frame.get("schema"))
            candidates = [labels.get("__name__", ""), str(f.get("name") or ""), legend[0], str(schema.get("name") or frame.get("name") or "")]
            name = next((c for c in candidates if vllm_name(c) or c in DCGM_METRICS or c in NEVER_EXISTED_METRICS), candidates[1] or candidates[0])
            named.append((name, {**legend[1], **{a: b for a, b in labels.items() if a != "__name__"}}))
            columns.append((k, times, vals))
    for (name, labels), tag, (k, times, vals) in zip(named, vllm_series_tags(named), columns, strict=True):
        _series_points(p, f"frame {k}", name, labels, tag, list(zip(times, vals, strict=False)), 1000, gaps=True)
    return dcgm_hosts(p, path, host, instance)


_GRAFANA_CELL = re.compile(r"^(-?[\d,]*\.?\d+(?:e[+-]?\d+)?)\s*(%|[KMGTP]i?B|B|[KMBT])?$", re.I)
_SI = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _grafana_value(cell: str, scale: float) -> float | None:
    """A Grafana cell, raw or formatted ('Formatted data' on): '0.853', '85.3%' (a 0-1 ratio shown in
    percent, as vLLM's dashboards show KV usage), '70.5 GiB' or '75.7 GB' (bytes, whatever the
    metric's raw unit), '1.2K' (Grafana's short SI suffixes). The raw number is scaled as the metric
    is; None when it is none of these."""
    m = _GRAFANA_CELL.match(cell)
    if not m:
        return None
    num, unit = float(m.group(1).replace(",", "")), m.group(2) or ""
    if not unit:
        return num * scale
    if unit == "%":
        return num / 100 * scale
    if unit.upper() in _SI:  # (before bytes: 'B' alone is Grafana's billion)
        return num * _SI[unit.upper()] * scale
    size = parse_size_bytes(f"{num} {unit}")
    return None if size is None else float(size)


# --- nvidia-smi ----------------------------------------------------------------------------------
NVSMI_GPU_FIELDS = {
    "memory.used": "device_used_bytes", "memory.free": "device_free_bytes",
    "memory.total": "device_total_bytes", "memory.reserved": "device_reserved_bytes",
    "utilization.gpu": "util_gpu_pct", "utilization.memory": "util_mem_pct",
}


_NVSMI_MIB_FIELDS = ("memory.used", "memory.free", "memory.total", "memory.reserved", "used_gpu_memory", "used_memory")


NV_UNKNOWN = ("[N/A]", "N/A", "[Not Supported]")  # what nvidia-smi writes for a value it has not
_NV_NUMBER = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(MiB|GiB|KiB|%|W|MHz|C)?$")  # (a number: not '.' or '1.2.3')
_NV_UNITS = ("", "MiB", "GiB", "KiB", "%", "W", "MHz", "C")
_NV_SCALE = {"MiB": MiB, "GiB": 1 << 30, "KiB": 1024}


def _nv_unknown(c: str) -> bool:
    """Whether a (stripped) cell is nvidia-smi's word for a value it has not: NV_UNKNOWN, any other
    bracketed word ('[Unknown Error]', '[GPU requires reset]'), '-' or nothing."""
    return c in NV_UNKNOWN or c in ("-", "") or (c.startswith("[") and c.endswith("]"))


def _nv_value(cell: str, header: str) -> float | None:
    """A value of nvidia-smi's CSV in its base unit (bytes for memory). Memory fields are MiB in every
    nvidia-smi: a bare number is MiB whether the header says so ('memory.used [MiB]', as nvidia-smi
    writes it, nounits or not) or not (a column list typed for --nvsmi-columns)."""
    c = cell.strip()
    num, _, unit = c.partition(" ")  # (the common shapes, '40000 MiB' and '40000', without a pattern)
    if num.isdigit() and num.isascii() and unit in _NV_UNITS:
        v = float(num)
    else:
        if _nv_unknown(c):
            return None
        m = _NV_NUMBER.match(c)
        if not m:
            return None
        v, unit = float(m.group(1)), m.group(2) or ""
    v *= _NV_SCALE.get(unit or _nv_default_unit(header), 1)
    return v if math.isfinite(v) else None  # (hundreds of digits: no memory, a damaged cell)


@functools.lru_cache(maxsize=256)
def _nv_default_unit(header: str) -> str:
    """The unit of a bare number under ``header``: MiB for memory fields, none otherwise."""
    return "MiB" if "[MiB]" in header or header.split(" [")[0].strip() in _NVSMI_MIB_FIELDS else ""


@_checks_values
def parse_nvidia_smi_csv(path: Path, text: str, tz_offset_s: int = 0, columns: str | None = None,
                         at: str | None = None) -> Parsed:
    """``nvidia-smi --query-gpu`` or ``--query-compute-apps`` CSV (any columns, units or not). A query
    without the timestamp field is usually one snapshot taken after the incident: it is placed at
    ``--at`` (or a time in the file name), and said so; rows without times that repeat a GPU are a
    loop, which cannot be placed."""
    return _place_snapshot(_nvidia_smi_rows(path, text, tz_offset_s, columns), path, text, at, tz_offset_s,
                           "add timestamp to the --query-gpu list next time")


def _place_snapshot(p: Parsed, path: Path, text: str, at: str | None, tz_offset_s: int, hint: str) -> Parsed:
    """Samples without a time: one snapshot (no GPU metric twice) is placed at ``--at`` or a time in the
    file name, and said so; repeated rows without times (a loop) cannot be placed."""
    timeless = [s for s in p.samples if s[0] is None]
    if not timeless:
        return p
    keys = [(s[1], s[3]) for s in timeless]
    if len(set(keys)) < len(keys):
        p.notes.append(f"{path.name}: rows without times repeat a GPU (a loop): they cannot be placed on the "
                       f"timeline; {hint}")
        return p
    t, how = scrape_time(path, text, at, tz_offset_s)
    if t is None:
        p.notes.append(f"{path.name}: a snapshot with no time: pass --at with when it was taken to place it")
        return p
    p.samples = [(t if s[0] is None else s[0], *s[1:]) for s in p.samples]
    p.notes.append(f"{path.name}: a snapshot with no time of its own, placed at its time from {how}")
    return p


# --- nvidia-smi's own text: the default table and `-q` ------------------------------------------------
_SMI_TIME = re.compile(r"^(?:Timestamp\s*:\s*)?((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4})\s*$")
_SMI_GPU = re.compile(r"^\|\s+(?P<idx>\d+)\s+(?P<name>\S.*?)\s+(?:On|Off)\s+\|\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)")
_SMI_MEM = re.compile(r"\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|")
_SMI_PROC = re.compile(r"^\|\s+(?P<gpu>\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(?P<pid>\d+)\s+(?P<type>[CGM+]+)\s+"
                       r"(?P<name>.*?)\s+(?P<mem>\d+MiB|N/A)\s*\|$")
# a MIG instance's row in the table's 'MIG devices:' part: GPU, GPU instance, compute instance, MIG device,
# then its own Memory-Usage (the row under it is its BAR1-Usage)
_SMI_MIG = re.compile(r"^\|\s+(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)\s+\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|")
_Q_LINE = re.compile(r"^(?P<indent> *)(?P<key>\S[^:]*?)\s*(?::\s*(?P<value>.*?))?\s*$")
_Q_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)$")
_Q_FB = {"Total": "device_total_bytes", "Reserved": "device_reserved_bytes", "Used": "device_used_bytes",
         "Free": "device_free_bytes"}


def _smi_mig(p: Parsed, path: Path, split: dict[int, set[str]]) -> None:
    """Note the GPUs nvidia-smi showed split into MIG instances, whose memory ``split`` kept apart."""
    for g_i, ids in sorted(split.items()):
        p.notes.append(f"{path.name}: GPU {g_i} is split into MIG instances (GPU_I_ID "
                       f"{', '.join(instance_order(ids))}): each instance's memory is a series of its "
                       "own (source 'nvidia-smi[GPU_I_ID=…]'); the GPU's own is all of them")


NO_MEMORY = "nvidia-smi states no memory for GPU"


def _no_memory(p: Parsed, path: Path, gpus: set[int]) -> None:
    """Note the GPUs whose memory nvidia-smi says it has not ('Not Supported', '[N/A]' in every row)."""
    for g_i in sorted(gpus):
        name = p.gpus.get(g_i, {}).get("name")
        p.notes.append(f"{path.name}: {NO_MEMORY} {g_i}{f' ({name})' if name else ''}: a "
                       "unified-memory device (DGX Spark's GB10; a Grace Hopper or Grace Blackwell running with unified "
                       "memory) has no framebuffer of its own, and its memory is the host's; its actual memory is not in "
                       "this file: record the host's (/proc/meminfo), or each process's (--query-compute-apps=pid,"
                       "used_memory)")


@_checks_values
def parse_nvidia_smi_table(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """The default ``nvidia-smi`` table, the evidence most often pasted into a postmortem, once or
    repeated (``nvidia-smi -l``, ``watch``): per GPU the used and total memory of its Memory-Usage cell
    (used excludes the driver's reserve, as memory.used does), per process its GPU memory. Each table
    is placed at the time line nvidia-smi prints above it (host local time), a table without one at
    ``--at``. Old layouts (no GI/CI columns) read the same. The instances of a GPU split by MIG (the
    table's 'MIG devices:' part) each hold memory of their own: a series per instance
    ('nvidia-smi[GPU_I_ID=3]'), beside their GPU's row, which counts them all."""
    p = Parsed(kind="nvidia-smi-table")
    lines = text.splitlines()
    p.lines = len(lines)
    t: int | None = None
    gpu: int | None = None
    split: dict[int, set[str]] = {}  # GPU -> its MIG instances (GPU_I_ID)
    unsupported: set[int] = set()  # GPUs whose Memory-Usage cell says 'Not Supported'
    for i, ln in enumerate(lines, start=1):
        s = ln.rstrip()
        m = _SMI_TIME.match(s.strip())
        if m:
            t = parse_time(m.group(1), tz_offset_s)
            p.naive_local_times = True
            p.parsed += 1
            continue
        mig = _SMI_MIG.match(s)
        if mig:
            src = mig_source("nvidia-smi", mig["gi"])
            g_i = int(mig["gpu"])
            split.setdefault(g_i, set()).add(mig["gi"])
            p.samples += [(t, g_i, src, "device_used_bytes", float(int(mig["used"]) * MiB)),
                          (t, g_i, src, "device_total_bytes", float(int(mig["total"]) * MiB))]
            p.parsed += 1
            continue
        g = _SMI_GPU.match(s)
        mem = _SMI_MEM.search(s)
        pr = _SMI_PROC.match(s)
        if g:
            gpu = int(g["idx"])
            p.gpus.setdefault(gpu, {"index": gpu}).update(name=g["name"].strip(), pci_bus_id=g["bus"])
        elif mem and gpu is not None:  # the second row of a GPU's cell
            total = int(mem["total"]) * MiB
            p.samples += [(t, gpu, "nvidia-smi", "device_used_bytes", float(int(mem["used"]) * MiB)),
                          (t, gpu, "nvidia-smi", "device_total_bytes", float(total))]
            p.gpus.setdefault(gpu, {"index": gpu})["total_bytes"] = total
            gpu = None
        elif gpu is not None and "| Not Supported" in s:  # (its memory cell, on a unified-memory device)
            unsupported.add(gpu)
            gpu = None
        elif pr:
            if pr["mem"] != "N/A":  # (N/A: the driver does not say, as under some containers)
                p.samples.append((t, int(pr["gpu"]), "nvidia-smi", f"process_used_bytes:{pr['pid']}",
                                  float(int(pr["mem"][:-3]) * MiB)))
        elif s.strip() and not s.lstrip().startswith(("|", "+")):
            p.quarantine.append((i, "not part of an nvidia-smi table", ln))
            continue
        p.parsed += 1  # a data row, or the table's frame and headings
    _smi_mig(p, path, split)
    _no_memory(p, path, unsupported - {g for _, g, _, m, _ in p.samples if m == "device_used_bytes"})
    return _place_snapshot(p, path, text, at, tz_offset_s, "keep the time line nvidia-smi prints above each table")


@_checks_values
def parse_nvidia_smi_q(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """``nvidia-smi -q`` (whole or ``-d MEMORY``, or an excerpt): per GPU its framebuffer Total,
    Reserved, Used and Free (Used excludes Reserved: they and Free add up to Total), and per process
    its used GPU memory. GPUs are numbered in the order their sections appear. The FB memory of a MIG
    instance (a 'MIG Device' block of 'MIG Devices') is a series of its own ('nvidia-smi[GPU_I_ID=3]')."""
    p = Parsed(kind="nvidia-smi-q")
    split: dict[int, set[str]] = {}  # GPU -> its MIG instances (GPU_I_ID)
    mig_gi = "?"  # the GPU Instance ID of the MIG Device block the line is in
    lines = text.splitlines()
    p.lines = len(lines)
    t: int | None = None
    gpu, pid = 0, None
    section: list[tuple[int, str]] = []  # (indent, heading) of the blocks the line is in
    seen_gpu = False
    for i, ln in enumerate(lines, start=1):
        if not ln.strip() or set(ln.strip()) <= {"=", "-"}:
            p.parsed += 1
            continue
        m = _Q_LINE.match(ln.rstrip())
        if m is None:  # (a line indented with tabs, say: -q indents with spaces)
            p.quarantine.append((i, "not an nvidia-smi -q line", ln))
            continue
        indent, key, value = len(m["indent"]), m["key"], m["value"]
        bus = _Q_GPU.match(ln.strip())
        if bus:  # a GPU's section ('GPU 00000000:83:00.0': its colons are not a key's)
            key, value = ln.strip(), None
        while section and section[-1][0] >= indent:
            section.pop()
        p.parsed += 1
        if value is None:  # a block heading ('FB Memory Usage', 'GPU 00000000:83:00.0', 'Processes')
            if bus:
                gpu = gpu + 1 if seen_gpu else 0
                seen_gpu = True
                p.gpus.setdefault(gpu, {"index": gpu})["pci_bus_id"] = bus.group(1)
            section.append((indent, key))
            if key == "MIG Device":
                mig_gi = "?"
            continue
        heads = [h for _, h in section]
        in_mig = "MIG Device" in heads
        if key == "Timestamp":
            t = parse_time(value, tz_offset_s)
            p.naive_local_times = True
        elif key == "Product Name":
            p.gpus.setdefault(gpu, {"index": gpu})["name"] = value
        elif key == "GPU Instance ID" and in_mig:
            mig_gi = value.strip() or "?"
        elif heads and heads[-1] == "FB Memory Usage" and key in _Q_FB:
            v = _nv_value(value, "")
            if v is not None and in_mig:
                split.setdefault(gpu, set()).add(mig_gi)
                p.samples.append((t, gpu, mig_source("nvidia-smi", mig_gi), _Q_FB[key], v))
            elif v is not None:
                p.samples.append((t, gpu, "nvidia-smi", _Q_FB[key], v))
                if key == "Total":
                    p.gpus.setdefault(gpu, {"index": gpu})["total_bytes"] = int(v)
        elif key == "Process ID" and is_uint(value):
            pid = value
        elif key == "Used GPU Memory" and pid is not None:
            v = _nv_value(value, "")
            if v is not None:
                p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{pid}", v))
    _smi_mig(p, path, split)
    return _place_snapshot(p, path, text, at, tz_offset_s, "keep the Timestamp line of nvidia-smi -q")


_XML_DOC = re.compile(r"<nvidia_smi_log\b.*?(?:</nvidia_smi_log>|\Z)", re.S)
_XML_FB = {k.lower(): v for k, v in _Q_FB.items()}  # (-q's fields, as -x names them)


@_checks_values
def parse_nvidia_smi_xml(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """``nvidia-smi -q -x`` (one document, or one per interval with ``-l``): what ``-q`` says, as XML:
    per GPU its framebuffer total, reserved, used and free, its name, UUID and bus, and per process its
    used memory, at the document's timestamp (local). A document that is not well-formed (a file cut
    while nvidia-smi wrote it) is quarantined line by line."""
    p = Parsed(kind="nvidia-smi-q")
    p.lines = len(text.splitlines())
    split: dict[int, set[str]] = {}  # GPU -> its MIG instances (<gpu_instance_id>)
    covered, pos, no = 0, 0, 1  # lines inside documents read; where the line count stands
    for m in _XML_DOC.finditer(text):
        no, pos = no + text.count("\n", pos, m.start()), m.start()  # (counted on from the last document)
        n_lines = m.group(0).count("\n") + 1
        try:
            doc = ElementTree.fromstring(m.group(0))
        except ElementTree.ParseError as e:  # (every line of it, each with its number)
            why = f"nvidia-smi -x document not well-formed XML ({e})"
            p.quarantine += [(no + k, why if k == 0 else f"{why} (the document of line {no})", ln)
                             for k, ln in enumerate(m.group(0).split("\n"))]
            continue
        covered += n_lines
        stamp = (doc.findtext("timestamp") or "").strip()
        t = parse_time(stamp, tz_offset_s) if stamp else None
        p.naive_local_times = p.naive_local_times or t is not None
        for gpu, g in enumerate(doc.findall("gpu")):
            info = p.gpus.setdefault(gpu, {"index": gpu})
            for key, tag in (("name", "product_name"), ("uuid", "uuid")):
                if value := (g.findtext(tag) or "").strip():
                    info[key] = value
            if g.get("id"):
                info["pci_bus_id"] = g.get("id")
            for tag, metric in _XML_FB.items():
                v = _nv_value(g.findtext(f"fb_memory_usage/{tag}") or "", "")
                if v is not None:
                    p.samples.append((t, gpu, "nvidia-smi", metric, v))
                    if tag == "total":
                        info["total_bytes"] = int(v)
            for mig in g.findall("mig_devices/mig_device"):  # (a MIG instance's memory: a series of its own)
                gi = (mig.findtext("gpu_instance_id") or "").strip() or "?"
                for tag, metric in _XML_FB.items():
                    v = _nv_value(mig.findtext(f"fb_memory_usage/{tag}") or "", "")
                    if v is not None:
                        split.setdefault(gpu, set()).add(gi)
                        p.samples.append((t, gpu, mig_source("nvidia-smi", gi), metric, v))
            for proc in g.findall("processes/process_info"):
                pid, used = (proc.findtext("pid") or "").strip(), _nv_value(proc.findtext("used_memory") or "", "")
                if is_uint(pid) and used is not None:
                    p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{pid}", used))
    p.parsed = p.lines - len(p.quarantine)  # (the XML declaration and doctype around the documents are read)
    if not covered and not p.quarantine:
        p.quarantine += [(k, "no nvidia-smi -x document (<nvidia_smi_log>) in the file", ln)
                         for k, ln in enumerate(text.splitlines(), start=1)]
        p.parsed = 0
    _smi_mig(p, path, split)
    return _place_snapshot(p, path, text, at, tz_offset_s, "keep the <timestamp> of nvidia-smi -q -x")


NVSMI_HEADER_WORDS = ("name", "timestamp", "index", "gpu_name", "pid")  # (a line whose first two cells open
# with one of these, and which holds no date, is a header; so is one of nothing but --query-gpu property
# names, at least one of them dotted or with its unit: 'memory.total [MiB], memory.used [MiB], temperature.gpu')
NVSMI_FIELD = r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*(?: \[[^\],]*\])?"
NVSMI_FIELDS_LINE = re.compile(r"^[ \t]*" + NVSMI_FIELD + r"(?:[ \t]*,[ \t]*" + NVSMI_FIELD + r")*[ \t]*$")


def nvsmi_header(line: str, cells: list[str]) -> bool:
    """Whether an nvidia-smi CSV line is its header (``NVSMI_HEADER_WORDS``, ``NVSMI_FIELDS_LINE``)."""
    if re.search(r"\d{4}/\d\d/\d\d", line):
        return False
    return any(c.startswith(NVSMI_HEADER_WORDS) for c in cells[:2]) or (
        ("." in line or "[" in line) and NVSMI_FIELDS_LINE.match(line) is not None)


def csv_cells(line: str) -> list[str]:
    """An nvidia-smi CSV line's cells, stripped."""
    return [c.strip() for c in line.split(",")]


def _named(header: list[str]) -> tuple[list[str], dict[str, str]]:
    """A CSV header's fields without their units ('memory.used [MiB]' -> 'memory.used'), and each one's
    header cell."""
    names = [h.split(" [")[0] for h in header]
    return names, dict(zip(names, header))


def _nvidia_smi_rows(path: Path, text: str, tz_offset_s: int, columns: str | None) -> Parsed:
    p = Parsed(kind="nvidia-smi")
    lines = text.splitlines()
    p.lines = len(lines)
    header: list[str] | None = csv_cells(columns) if columns else None
    names, units = _named(header or [])
    bus_to_idx: dict[str, int] = {}
    by_bus = False
    last_ts: tuple[str | None, int | None] = (None, None)
    unstated: set[int] = set()  # GPUs whose memory fields said none ('[N/A]')
    rows = 0
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            p.parsed += 1
            continue
        cells = csv_cells(ln)
        if nvsmi_header(ln, cells):
            header = cells  # (repeated) header line
            names, units = _named(header)
            p.parsed += 1
            continue
        rows += 1
        if header is None:
            p.quarantine.append((i, HEADERLESS, ln))
            continue
        if len(cells) != len(header):
            p.quarantine.append((i, f"expected {len(header)} fields, found {len(cells)}", ln))
            continue
        row = dict(zip(names, cells))
        if "timestamp" in row and row["timestamp"] != last_ts[0]:  # (a poll's rows share their time)
            last_ts = (row["timestamp"], parse_time(row["timestamp"], tz_offset_s))
        t = last_ts[1] if "timestamp" in row else None
        if "timestamp" in row and t is None:
            p.quarantine.append((i, f"unparseable timestamp {row['timestamp']!r}", ln))
            continue
        if "timestamp" in row:
            p.naive_local_times = True
        if "pid" in row:  # --query-compute-apps
            p.kind = "nvidia-smi-apps"
            used = _nv_value(row.get("used_gpu_memory", ""), units.get("used_gpu_memory", ""))
            bus = row.get("gpu_bus_id", "")
            gpu = bus_to_idx.setdefault(bus, len(bus_to_idx))
            why = None if used is None else impossible("process_used_bytes", used)
            if why is not None:
                p.quarantine.append((i, why, ln))
                continue
            p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{row['pid']}", used if used is not None else float("nan")))
            p.parsed += 1
            continue
        if "index" in row and is_uint(row["index"]):
            gpu = int(row["index"])
        else:  # (numbered in order of appearance here, in nvidia-smi's order below)
            bus = row.get("pci.bus_id", row.get("uuid", ""))
            gpu = bus_to_idx.setdefault(bus, len(bus_to_idx))
            by_bus = "pci.bus_id" in row
        info = p.gpus.setdefault(gpu, {"index": gpu})
        for k_src, k in (("name", "name"), ("uuid", "uuid"), ("pci.bus_id", "pci_bus_id"), ("hostname", "host")):
            if row.get(k_src) and row[k_src] not in NV_UNKNOWN:
                info[k] = row[k_src]
        values = {metric: _nv_value(row[k_src], units[k_src]) for k_src, metric in NVSMI_GPU_FIELDS.items() if k_src in row}
        garbled = next((k for k, metric in NVSMI_GPU_FIELDS.items()
                        if k in row and values[metric] is None and not _nv_unknown(row[k])), None)
        if garbled is not None:  # (neither a value nor nvidia-smi's word for none: damaged on its way here)
            p.quarantine.append((i, f"{garbled}: {row[garbled]!r} is not a number", ln))
            continue
        total = values.get("device_total_bytes")  # (the row's own: what bounds its memory)
        why = next((w for metric, v in values.items() if v is not None and (w := impossible(metric, v, total))), None)
        if why is not None:  # (a figure no GPU can show: the row is damaged, as a garbled one)
            p.quarantine.append((i, why, ln))
            continue
        for metric, v in values.items():
            if v is not None:
                p.samples.append((t, gpu, "nvidia-smi", metric, v))
                if metric == "device_total_bytes":
                    info["total_bytes"] = int(v)
        if "device_used_bytes" in values and values["device_used_bytes"] is None:
            unstated.add(gpu)
        p.parsed += 1
    if by_bus and p.kind == "nvidia-smi":
        _index_by_bus(p, bus_to_idx)  # (renumbers the GPUs: the ones without memory are told by their samples below)
    if unstated:
        _no_memory(p, path, set(p.gpus) - {g for _, g, _, m, _ in p.samples if m == "device_used_bytes"})
    headerless = sum(1 for q in p.quarantine if q[1] == HEADERLESS)
    if headerless:
        p.notes.append(f"{path.name}: {headerless} rows without a header line: pass --nvsmi-columns with the --query-gpu "
                       "list they were logged with, e.g. 'timestamp, index, memory.total [MiB], memory.used [MiB]'")
    if header is not None and not rows and not columns:
        p.notes.append(header_only_note(path, "pid" in names))
    return p


def header_only_note(path: Path, apps: bool) -> str:
    """The note for an nvidia-smi CSV of a header and no rows."""
    if apps:
        return (f"{path.name}: a --query-compute-apps header and no rows: no process held GPU memory when it was "
                "queried (or the output was cut before its first row)")
    return (f"{path.name}: an nvidia-smi CSV header and no rows: no sample; nvidia-smi stopped, or the file was cut, "
            "before its first poll was written")


HEADERLESS = "headerless nvidia-smi CSV: pass --nvsmi-columns with the --query-gpu list"


def _index_by_bus(p: Parsed, bus_to_idx: dict[str, int]) -> None:
    """Rows without an index column are told apart by PCI bus id; nvidia-smi numbers GPUs in PCI bus
    order, so that order (not the order in which a poll happened to list them) gives their index."""
    order = {old: new for new, (_, old) in enumerate(sorted(bus_to_idx.items()))}
    if all(k == v for k, v in order.items()):
        return
    p.samples = [(t, None if g is None else order.get(g, g), src, m, v) for t, g, src, m, v in p.samples]
    p.gpus = {order[g]: {**info, "index": order[g]} for g, info in p.gpus.items()}


@_checks_values
def parse_dmon(path: Path, text: str, tz_offset_s: int = 0) -> Parsed:
    """``nvidia-smi dmon`` and ``pmon``: columns from the two '#' header lines (they change across
    drivers); no times unless -o T/D was used, so rows are placed only when a time column exists. In
    pmon a row is a process, not a GPU: its fb column is that process's memory (``-s m``)."""
    p = Parsed(kind="nvidia-smi-dmon")
    lines = text.splitlines()
    p.lines = len(lines)
    cols: list[str] = []
    for i, ln in enumerate(lines, start=1):
        s = ln.strip()
        if not s:
            p.parsed += 1
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if toks and toks[0].lower() in ("gpu", "date", "time"):
                cols = [t.lower() for t in toks]
                if "pid" in cols:
                    p.kind = "nvidia-smi-pmon"
            p.parsed += 1
            continue
        vals = s.split()
        if p.kind == "nvidia-smi-pmon" and len(vals) > len(cols) and cols and cols[-1] == "command":
            vals = vals[:len(cols) - 1] + [" ".join(vals[len(cols) - 1:])]  # a command name with spaces
        if len(vals) != len(cols):
            p.quarantine.append((i, f"expected {len(cols)} fields, found {len(vals)}", ln))
            continue
        row = dict(zip(cols, vals))
        t = None
        if "date" in row and "time" in row:
            t = parse_time(f"{row['date'][:4]}-{row['date'][4:6]}-{row['date'][6:]} {row['time']}", tz_offset_s)
            p.naive_local_times = True
        try:
            gpu = int(row.get("gpu", row.get("idx", "0")) or 0)
            if p.kind == "nvidia-smi-pmon":
                if row.get("pid", "-") != "-" and row.get("fb", "-") != "-":  # ('-': no process on this GPU)
                    p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{row['pid']}", float(row["fb"]) * MiB))
                p.parsed += 1
                continue
            got = [(metric, float(row[c]) * scale) for c, metric, scale in (("fb", "device_used_bytes", MiB),
                                                                           ("mem", "util_mem_pct", 1.0))
                   if c in row and row[c] != "-"]
        except ValueError:  # (a row under another listing's header, a value that is no number)
            p.quarantine.append((i, f"not a row of the {' '.join(cols)} columns above it", ln))
            continue
        p.samples += [(t, gpu, "nvidia-smi", metric, value) for metric, value in got]
        p.parsed += 1
    if p.kind == "nvidia-smi-pmon" and "fb" not in cols:
        p.notes.append(f"{path.name}: pmon without its fb column holds no memory figures (use `nvidia-smi pmon -s um -o DT`)")
    if p.samples and all(s[0] is None for s in p.samples):
        p.notes.append(f"{path.name}: {p.kind[11:]} rows carry no time (use `nvidia-smi {p.kind[11:]} -o DT`); "
                       f"{len(p.samples)} values quarantined")
        p.quarantine.append((None, f"{len(p.samples)} dmon values without time", ""))
        p.samples = []
    return p


# `dcgmi dmon -e …` columns by the short names it prints (fields 250-252, 203-204), MiB and percent
DCGMI_COLUMNS = {"FBTTL": ("device_total_bytes", MiB), "FBFRE": ("device_free_bytes", MiB),
                 "FBUSD": ("device_used_bytes", MiB), "GPUTL": ("util_gpu_pct", 1.0), "MCUTL": ("util_mem_pct", 1.0)}


# dcgm-exporter's counters file (its -f): 'DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).'
DCGM_COUNTER_LINE = re.compile(r"^\s*(?P<field>DCGM_(?:FI|EXP)_[A-Z0-9_]+)\s*,\s*(?P<type>gauge|counter|label)\s*,"
                               r"\s*(?P<help>.*)$", re.I)


def parse_dcgm_counters(path: Path, text: str) -> Parsed:
    """dcgm-exporter's counters file: not samples, but which fields its scrapes can hold. What it says
    about device memory is noted (a field left out, such as FB_RESERVED in its older default list, is
    absent from every scrape, not zero); a line of another shape is quarantined."""
    p = Parsed(kind="dcgm-counters")
    p.lines = text.count("\n") + (not text.endswith("\n"))
    fields: list[str] = []
    for i, ln in enumerate(text.splitlines(), start=1):
        s = ln.strip()
        m = DCGM_COUNTER_LINE.match(s)
        if m:
            fields.append(m["field"].upper())
        elif s and not s.startswith("#"):
            p.quarantine.append((i, "not a counters line ('DCGM_FI_…, gauge|counter|label, help') or a comment", ln))
            continue
        p.parsed += 1
    memory = [f.removeprefix("DCGM_FI_DEV_") for f in DCGM_METRICS if f in fields]
    missing = [f.removeprefix("DCGM_FI_DEV_") for f in DCGM_METRICS if f not in fields]
    p.notes.append(f"dcgm-exporter's counters file: {len(fields)} fields it exports (no samples); device memory: "
                   + (", ".join(memory) if memory else "none")
                   + (f"; not exported, so absent from its scrapes: {', '.join(missing)}" if missing else ""))
    return p


# gpustat (NVML's figures, memory in MiB): a header per query, 'host  Wed Nov 19 20:16:36 2025  550.54.15'
# (the C locale's date and time, local), then a line per GPU, '[0] NVIDIA H100 80GB HBM3 | 45°C, 100 % |
# 78123 / 81559 MB | root(78000M) python3/12345(…M)'; or `gpustat --json` (one document per query)
_GPUSTAT_HEAD = re.compile(r"^(?P<host>\S+)\s+(?P<t>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d "
                           r"\d\d:\d\d:\d\d \d{4})(?:\s+\S+)?\s*$")
_GPUSTAT_GPU = re.compile(r"^\[(?P<idx>\d+)\]\s+(?P<name>[^|]*?)\s*\|[^|]*\|\s*(?P<used>\d+)\s*/\s*(?P<total>\d+)\s*MB\s*"
                          r"(?:\|(?P<procs>.*))?$")
_SPACE = re.compile(r"\s*")
_GPUSTAT_PROC = re.compile(r"(?:^|\s)(?:[^\s/(]+?:)?[^\s/(]*/(?P<pid>\d+)\((?P<mem>\d+)M\)")  # ('user:cmd/pid(mem)', -cup)


@_checks_values
def parse_gpustat(path: Path, text: str, tz_offset_s: int = 0) -> Parsed:
    """``gpustat`` (``-i`` repeats it) as printed or as ``--json``: each GPU's used and total memory
    (MiB) at the query's time, a local time (``--tz``), and each process's memory where its pid shows
    (``-p``). Its figures are NVML's, so the samples are the nvml source's."""
    p = Parsed(kind="gpustat")
    p.lines = text.count("\n") + (not text.endswith("\n"))
    if text.lstrip().startswith("{"):
        return _gpustat_json(text, tz_offset_s, p)
    t: int | None = None
    for i, ln in enumerate(text.splitlines(), start=1):
        s = ANSI.sub("", ln).rstrip()  # (gpustat colours its output on a terminal, --color)
        if not s.strip():
            p.parsed += 1
            continue
        m = _GPUSTAT_HEAD.match(s)
        if m:
            try:
                t = _utc(datetime.strptime(" ".join(m["t"].split()), "%a %b %d %H:%M:%S %Y"), tz_offset_s)
            except ValueError:  # (a header of the shape whose time is none, 'Wed Nov 5 20:16:67': its rows have none)
                t = None
                p.quarantine.append((i, f"gpustat header time {m['t'].strip()!r} is not a time", ln))
                continue
            p.naive_local_times = True
            p.parsed += 1
            continue
        if s.lstrip().startswith(("├─", "└─")):  # (-f: a process's host CPU and memory, not the GPU's)
            p.parsed += 1
            continue
        g = _GPUSTAT_GPU.match(s)
        if g is None:
            p.quarantine.append((i, "not a gpustat header or GPU line", ln))
            continue
        idx = int(g["idx"])
        p.gpus.setdefault(idx, {"index": idx, "name": g["name"], "total_bytes": int(g["total"]) * MiB})
        p.samples += [(t, idx, "nvml", "device_used_bytes", float(int(g["used"]) * MiB)),
                      (t, idx, "nvml", "device_total_bytes", float(int(g["total"]) * MiB))]
        p.samples += [(t, idx, "nvml", f"process_used_bytes:{pm['pid']}", float(int(pm["mem"]) * MiB))
                      for pm in _GPUSTAT_PROC.finditer(g["procs"] or "")]
        p.parsed += 1
    return p


def _gpustat_json(text: str, tz_offset_s: int, p: Parsed) -> Parsed:
    """``gpustat --json`` documents, one after another (``-i``)."""
    dec, pos = json.JSONDecoder(), 0
    while True:
        m = _SPACE.match(text, pos)
        pos = m.end() if m else pos
        if pos >= len(text):
            p.parsed = p.lines - len({q[0] for q in p.quarantine})
            return p
        line = text.count("\n", 0, pos) + 1
        try:
            doc, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            p.quarantine.append((line, f"not valid JSON ({e.msg}); the rest of the file is not read", text[pos:pos + 200]))
            p.parsed = line - 1 - len({q[0] for q in p.quarantine[:-1]})
            return p
        q = _obj(doc).get("query_time")
        t = parse_time(q, tz_offset_s) if isinstance(q, str) else None
        p.naive_local_times = p.naive_local_times or (isinstance(q, str) and not re.search(r"(?:Z|[+-]\d\d:?\d\d)$", q))
        gpus = [g for g in _list(_obj(doc).get("gpus")) if isinstance(g, dict)]
        if not gpus:
            p.quarantine.append((line, "a gpustat document without GPUs", json.dumps(doc)[:200]))
            continue
        for g in gpus:
            idx, used, total = g.get("index"), g.get("memory.used"), g.get("memory.total")
            if not is_uint(str(idx)) or not isinstance(used, (int, float)) or isinstance(used, bool):
                p.quarantine.append((line, "a GPU without index or memory.used", json.dumps(g)[:200]))
                continue
            gi = int(str(idx))
            info = {"index": gi, "name": g.get("name"), "uuid": g.get("uuid")}
            if isinstance(total, (int, float)) and not isinstance(total, bool):
                info["total_bytes"] = int(total * MiB)
                p.samples.append((t, gi, "nvml", "device_total_bytes", float(total * MiB)))
            p.gpus.setdefault(gi, {k: v for k, v in info.items() if v is not None})
            p.samples.append((t, gi, "nvml", "device_used_bytes", float(used * MiB)))
            for pr in _list(g.get("processes")):
                pid, mem = _obj(pr).get("pid"), _obj(pr).get("gpu_memory_usage")
                if is_uint(str(pid)) and isinstance(mem, (int, float)) and not isinstance(mem, bool):
                    p.samples.append((t, gi, "nvml", f"process_used_bytes:{pid}", float(mem * MiB)))



@_checks_values
def parse_dcgmi_dmon(path: Path, text: str, at: str | None = None, interval_s: float = 1.0, tz_offset_s: int = 0) -> Parsed:
    """``dcgmi dmon -e …``: a '#Entity' header of field short names, a units line ('ID … W C'), then
    one row per entity ('GPU 0', 'GPU-I 1') per sample. Its rows carry no time: with ``at`` (when it
    started) the n-th sample of an entity is placed n × ``interval_s`` later (dcgmi's -d, 1000 ms by
    default), else the values are quarantined, said in a note, as for nvidia-smi dmon."""
    p = Parsed(kind="dcgmi-dmon")
    lines = text.splitlines()
    p.lines = len(lines)
    cols: list[str] = []
    seen: dict[str, int] = {}  # entity -> samples so far
    start = parse_time(at, tz_offset_s) if at else None
    for i, ln in enumerate(lines, start=1):
        s = ln.strip()
        m = re.match(r"^(GPU(?:-I|-CI)?)\s+(\d+)\s+(.*)$", s)
        if not m and (not s or s.startswith(("#Entity", "ID"))):  # (blank, the header, its units line)
            cols = s.split()[1:] if s.startswith("#Entity") else cols
            p.parsed += 1
            continue
        vals = m.group(3).split() if m else []
        if not m or not cols or len(vals) != len(cols):
            p.quarantine.append((i, f"not a dcgmi dmon row of {len(cols)} fields" if cols else "a row before the #Entity header", ln))
            continue
        entity = f"{m.group(1)} {m.group(2)}"
        n = seen.get(entity, 0)
        seen[entity] = n + 1
        t = None if start is None else start + round(n * interval_s * 1_000_000)
        gpu = int(m.group(2)) if m.group(1) == "GPU" else None  # (a MIG instance is not a GPU index)
        bad = []
        for c, v in zip(cols, vals, strict=True):
            if c in DCGMI_COLUMNS and v not in ("N/A", "-"):
                try:
                    val = float(v)
                except ValueError:
                    bad.append(f"{c}: not a number ({v!r})")
                    continue
                metric, scale = DCGMI_COLUMNS[c]
                p.samples.append((t, gpu, "dcgm", metric if gpu is not None else f"{metric}:{entity}", val * scale))
        if bad:  # (its other values are kept; the line is counted once, as quarantined)
            p.quarantine.append((i, "; ".join(bad), ln))
        else:
            p.parsed += 1
    if cols and not any(c in DCGMI_COLUMNS for c in cols):
        p.notes.append(f"{path.name}: dcgmi dmon without memory fields ({' '.join(cols)}); use `dcgmi dmon -e 250,251,252`")
    if p.samples and start is None:
        p.notes.append(f"{path.name}: dcgmi dmon rows carry no time; give --at (when it started) to place them, "
                       f"{len(p.samples)} values quarantined")
        p.quarantine.append((None, f"{len(p.samples)} dcgmi dmon values without time", ""))
        p.samples = []
    elif p.samples:
        p.notes.append(f"{path.name}: dcgmi dmon rows carry no time: placed from --at every {interval_s:g} s "
                       "(dcgmi's -d; give --interval if it ran with another)")
    return p


# --- Kubernetes ----------------------------------------------------------------------------------
OOMKILLED_MEANING = ("the container was killed for host/cgroup memory (OOMKilled, exit 137); "
                     "a CUDA OOM is an application error and does not show up as OOMKilled")
SIGKILL_MEANING = ("the container was killed with SIGKILL (exit 137) and Kubernetes did not say OOMKilled: the "
                   "node's kernel OOM killer outside the container's cgroup (a host OOM the kubelet does not name), "
                   "or a kill after the grace period (a failed liveness probe, an eviction, a delete); the node's "
                   "kernel log ('Out of memory: Killed process') tells which. A CUDA OOM exits on its own, not with 137")


def terminated_kind(reason: Any, exit_code: Any) -> tuple[str, str | None]:
    """The event of a terminated container: a host OOM kill where Kubernetes says OOMKilled (whatever
    the exit code), a SIGKILL of unstated cause for exit 137 under another reason ('Error'), else a
    plain termination."""
    if reason == "OOMKilled":
        return "host_oom_killed", OOMKILLED_MEANING
    if exit_code == 137:
        return "container_killed", SIGKILL_MEANING
    return "container_terminated", None


def _walk_container_statuses(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        if "lastState" in obj or "state" in obj and "restartCount" in obj:
            out.append(obj)
        for v in obj.values():
            out += _walk_container_statuses(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _walk_container_statuses(v)
    return out


def _walk_pods(obj: Any) -> list[dict[str, Any]]:
    """The Pods in a Kubernetes document (a list's items among them)."""
    if isinstance(obj, list):
        return [p for o in obj for p in _walk_pods(o)]
    if isinstance(obj, dict):
        if obj.get("kind") == "Pod" or "kind" not in obj and isinstance(obj.get("status"), dict) and "phase" in obj["status"]:
            return [obj]
        return [p for o in _list(obj.get("items")) for p in _walk_pods(o)]
    return []


class _YamlLoader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML is untyped here)
    """YAML's safe loader, with times left as the text they are: the readers parse them as they parse
    JSON's, and a time out of range ('hour 25') is then an unreadable time, not a file that cannot be read."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _k8s_documents(text: str) -> list[Any]:
    """Every object in the text: one JSON value, JSON objects one after another (what
    ``kubectl get events -w -o json`` streams), or YAML documents ('---' between them)."""
    if not text.lstrip().startswith(("{", "[")):
        return [d for d in yaml.load_all(text, Loader=_YamlLoader) if d is not None]
    dec, i = json.JSONDecoder(), 0
    docs: list[Any] = []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        obj, i = dec.raw_decode(text, i)
        docs.append(obj)


def _is_event(o: Any) -> bool:
    """A Kubernetes Event: by its kind, or, where an exporter leaves the kind out (an event exporter's
    JSON lines), by what only an event has: the object it is about and a reason."""
    return isinstance(o, dict) and (o.get("kind") == "Event" or "kind" not in o and "reason" in o and (
        isinstance(o.get("involvedObject"), dict) or isinstance(o.get("regarding"), dict)))


def _k8s_event(ev: dict[str, Any]) -> dict[str, Any]:
    """A core/v1 Event, or an events.k8s.io/v1 one ('note', 'regarding', 'series'), as a bundle event."""
    t = None
    for k in ("lastTimestamp", "eventTime", "deprecatedLastTimestamp", "firstTimestamp"):
        if ev.get(k):
            t = parse_time(str(ev[k]))
            break
    series, meta = _obj(ev.get("series")), _obj(ev.get("metadata"))
    if t is None and series.get("lastObservedTime"):
        t = parse_time(str(series["lastObservedTime"]))
    if t is None and meta.get("creationTimestamp"):
        t = parse_time(str(meta["creationTimestamp"]))
    inv = _obj(ev.get("involvedObject") or ev.get("regarding"))
    count = ev.get("count") or ev.get("deprecatedCount") or series.get("count")
    return _k8s_fact(t, None, {"reason": ev.get("reason"), "type": ev.get("type"),
                               "message": ev.get("message") or ev.get("note"),
                               "object": f"{inv.get('kind')}/{inv.get('name')}", "count": count})


def _k8s_fact(t: int | None, line: int | None, data: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes event as a bundle event: a k8s_event, except node-problem-detector's OOMKilling,
    which reports the kernel's OOM kill on the node and is the kernel log's fact (a host OOM kill,
    with its pid, process and memory), its event fields kept beside."""
    message = str(data.get("message") or "")
    oom = _K_OOM.search(message) if data.get("reason") == "OOMKilling" else None
    if oom:
        return {"t": t, "kind": "host_oom_killed", "line": line, "data": data | _host_oom(oom, message)}
    ev = _EVICTED.search(message) if data.get("reason") == "Evicted" else None
    if ev and ev["resource"] == "memory":  # the kubelet evicted the pod for the node's memory: killed for host memory too
        return {"t": t, "kind": "host_oom_killed", "line": line, "data": data | {
            "container": ev["container"], "used": ev["used"], "text": message.strip()[:300],
            "meaning": "the kubelet evicted the pod because the node ran low on memory (host memory, not the GPU's); "
                       "a CUDA OOM is an application error and never shows up here"}}
    if data.get("reason") == "Evicted":  # (for the node's disk, its inodes, its process ids: no memory at all)
        res = ev["resource"] if ev else None
        return {"t": t, "kind": "container_killed", "line": line, "data": data | {
            "container": ev["container"] if ev else None, "used": ev["used"] if ev else None, "evicted": res or "unstated",
            "text": message.strip()[:300],
            "meaning": f"the kubelet evicted the pod because the node ran low on {res or 'a resource it does not name'}"
                       + (" (its disk: model weights downloaded into the container, logs, compile caches)"
                          if res == "ephemeral-storage" else "") + ", which is no memory and no OOM"}}
    kill = _PROBE_KILL.search(message) if data.get("reason") == "Killing" else None
    if kill:  # the kubelet killed the container for a failed probe: SIGKILL after the grace period
        return {"t": t, "kind": "container_killed", "line": line, "data": data | {
            "container": kill["container"], "probe": kill["probe"], "meaning": PROBE_KILL_MEANING.format(kill["probe"])}}
    return {"t": t, "kind": "k8s_event", "line": line, "data": data}


# the kubelet's kill of a container whose liveness (or startup) probe failed ('Container vllm failed
# liveness probe, will be restarted', reason Killing)
_PROBE_KILL = re.compile(r"Container (?P<container>\S+) failed (?P<probe>liveness|startup) probe")
PROBE_KILL_MEANING = ("the kubelet killed the container because its {} probe failed (SIGKILL after the grace period, "
                      "exit 137): the engine did not answer its health check in time, which is no OOM")

# the kubelet's eviction for node memory pressure ('The node was low on resource: memory. … Container vllm
# was using 61Gi, request is 0, has larger consumption of memory.')
_EVICTED = re.compile(r"low on resource: (?P<resource>[\w.-]+)\.(?:.*?Container (?P<container>\S+)\s+was using (?P<used>\S+?),)?",
                      re.S)


def parse_k8s(path: Path, text: str) -> Parsed:
    """``kubectl get events`` (a list, a single event, or the stream ``-w -o json`` writes; core/v1
    and events.k8s.io/v1; or as Google Cloud Logging exports GKE's, each in an entry's jsonPayload)
    and ``kubectl get pod`` (lastState: OOMKilled/exit 137 vs a CUDA OOM), JSON or YAML."""
    p = Parsed(kind="k8s")
    p.lines = len(text.splitlines())
    try:
        docs = _k8s_documents(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        line = getattr(e, "lineno", None) or (mark.line + 1 if mark else None)
        p.quarantine.append((line, f"not valid JSON/YAML: {str(e).splitlines()[0]}", ""))
        return p
    objs: list[Any] = []
    for d in docs:  # lists of objects (EventList, PodList, List) stand for their items
        items = d.get("items") if isinstance(d, dict) and isinstance(d.get("items"), list) else None
        objs += items if items is not None else (d if isinstance(d, list) else [d])
    # Google Cloud Logging's entries stand for the object they carry (GKE keeps a cluster's events
    # there: the API server forgets them after an hour)
    objs = [o["jsonPayload"] if isinstance(o, dict) and isinstance(o.get("jsonPayload"), dict)
            and ("logName" in o or "insertId" in o) else o for o in objs]
    events = [o for o in objs if _is_event(o)]
    obj: Any = [o for o in objs if not _is_event(o)]
    if events:
        p.kind = "k8s-events"
        p.events += [_k8s_event(ev) for ev in events]
        p.parsed = p.lines
        if not obj:
            return p
    statuses = _walk_container_statuses(obj)
    p.kind = "k8s-pod" if not events else p.kind
    evicted = [o for o in _walk_pods(obj) if _obj(o.get("status")).get("reason") == "Evicted"]
    for pod in evicted:  # (the pod's own status: what the kubelet's event said, kept where the event is gone)
        st = _obj(pod.get("status"))
        seen = [str(c["lastTransitionTime"]) for c in _list(st.get("conditions")) if _obj(c).get("lastTransitionTime")]
        p.events.append(_k8s_fact(parse_time(max(seen)) if seen else None, None, {
            "reason": "Evicted", "message": st.get("message"), "object": f"Pod/{_obj(pod.get('metadata')).get('name')}"}))
    for st in statuses:
        term = _obj(_obj(st.get("lastState")).get("terminated"))
        if term:
            reason = term.get("reason")
            code = term.get("exitCode")
            t = parse_time(str(term["finishedAt"])) if term.get("finishedAt") else None
            kind, meaning = terminated_kind(reason, code)
            p.events.append({"t": t, "kind": kind, "line": None, "data": {
                "container": st.get("name"), "reason": reason, "exit_code": code,
                "restart_count": st.get("restartCount"), "meaning": meaning}})
        if st.get("restartCount"):
            p.events.append({"t": None, "kind": "restart_count", "line": None,
                             "data": {"container": st.get("name"), "restart_count": st.get("restartCount")}})
    p.parsed = p.lines if statuses or events or evicted else 0  # (an evicted pod's status is read: not a pod without any)
    if not statuses and not events and not evicted:
        p.quarantine.append((None, "Kubernetes object without container statuses or events", ""))
    return p


DESCRIBE_TERMINATED = re.compile(r"^\s*(?:Last )?State:\s+Terminated\b")  # (how a container's ended state opens)
DESCRIBE_EV = re.compile(r"^\s+(Normal|Warning)\s+(\S+)\s+(\S+(?: \(x\d+ over \S+\))?)\s+(\S+(?:, \S+)*)\s+(.*)$")


# --- kernel log: dmesg -T, dmesg, journalctl -k -----------------------------------------------------
_K_CTIME = re.compile(r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?")
_K_UPTIME = re.compile(r"^\[\s*\d+\.\d+\] ?")
_K_JOURNAL = re.compile(r"^(?:(\d{4}-\d\d-\d\dT\S+)|([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)) \S+ kernel: ")
def _host_oom(oom: re.Match[str], text: str) -> dict[str, Any]:
    """What the kernel's OOM kill message says (the kernel log's, or node-problem-detector's event)."""
    return {"pid": int(oom["pid"]), "process": oom["name"], "cgroup": bool(oom["memcg"]),
            "anon_rss_bytes": int(oom["rss"]) * 1024 if oom["rss"] else None, "text": text.strip()[:300],
            "meaning": ("the kernel killed the process for host memory" + (" (its memory cgroup's limit: a "
                        "container limit)" if oom["memcg"] else "") + "; a CUDA OOM is an application error "
                        "and never shows up here")}


_K_OOM = re.compile(r"(?P<memcg>Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (?P<pid>\d+) \((?P<name>[^)]*)\)"
                    r"(?:.*?anon-rss:(?P<rss>\d+)kB)?")
_K_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, pid=['\"]?(?P<pid>\d+|<unknown>)['\"]?)?"
                    r"(?:, name=['\"]?(?P<name>[^,'\"]*)['\"]?)?,? ?(?P<msg>.*)$")
# what the common Xid codes mean (NVIDIA's Xid catalogue), for the timeline and the findings
XID_MEANING = {
    13: "graphics engine exception (often the application's own fault)",
    31: "GPU memory page fault (often an illegal address in the application)",
    43: "GPU stopped processing", 45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC memory error", 63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error",
}


def kernel_log_head(head: str) -> bool:
    """Whether a text's head is a kernel log: most of its lines carry a dmesg or journalctl -k prefix."""
    lines = [ln for ln in head.splitlines()[:200] if ln.strip()]
    hits = sum(1 for ln in lines if _K_CTIME.match(ln) or _K_UPTIME.match(ln) or _K_JOURNAL.match(ln))
    return bool(lines) and hits >= 0.6 * len(lines)


def parse_kernel_log(path: Path, text: str, tz_offset_s: int = 0, year: int | None = None) -> Parsed:
    """A kernel log (``dmesg -T``, ``dmesg``, ``journalctl -k`` in short or short-iso form): the host
    OOM killer (global or a memory cgroup's: a container's memory limit, not a CUDA OOM) and NVIDIA
    Xid GPU errors (79: fell off the bus, 48/95: ECC, 31: page fault ...), which end an engine without
    any CUDA OOM. Other kernel lines are read and left out; lines without a kernel prefix are
    quarantined."""
    p = Parsed(kind="kernel-log")
    lines = text.splitlines()
    p.lines = len(lines)
    uptime_only = bsd = 0
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            p.parsed += 1
            continue
        t: int | None = None
        m = _K_CTIME.match(ln)
        if m:
            t = parse_time(m.group(1), tz_offset_s)
            p.naive_local_times = True
        elif (m := _K_JOURNAL.match(ln)) is not None:
            if m.group(1):
                t = parse_time(m.group(1), tz_offset_s)
            else:  # 'May 01 10:05:00': journald's short form has no year
                bsd += 1
                try:
                    t = _utc(datetime.strptime(f"{m.group(2)} {year or datetime.now(timezone.utc).year}",
                                               "%b %d %H:%M:%S %Y"), tz_offset_s)
                except ValueError:  # (Feb 29 in a year without one)
                    t = None
                p.naive_local_times = True
        elif (m := _K_UPTIME.match(ln)) is not None:
            uptime_only += 1
        else:
            p.quarantine.append((i, "not a kernel log line", ln))
            continue
        p.parsed += 1
        msg = ln[m.end():]
        oom = _K_OOM.search(msg)
        xid = _K_XID.search(msg)
        if oom:
            p.events.append({"t": t, "kind": "host_oom_killed", "line": i, "data": _host_oom(oom, msg)})
        elif xid:
            code = int(xid["xid"])
            p.events.append({"t": t, "kind": "gpu_xid", "line": i, "data": {
                "xid": code, "pci": xid["pci"], "pid": int(xid["pid"]) if is_uint(xid["pid"] or "") else None,
                "process": xid["name"] or None, "message": xid["msg"].strip()[:300],
                "meaning": XID_MEANING.get(code, "see NVIDIA's Xid catalogue")}})
    if uptime_only:
        p.notes.append(f"{path.name}: {uptime_only} lines carry only seconds since boot (plain dmesg): their events "
                       "have no time; `dmesg -T` or `journalctl -k -o short-iso` gives wall-clock times")
    if bsd and year is None:
        p.notes.append(f"{path.name}: journalctl's short form has no year: the current year was assumed (--year sets it)")
    return p


_AGE = re.compile(r"(\d+)([dhms])")
_AGE_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def _age_s(age: str) -> int | None:
    """kubectl's ages ('45s', '4m53s', '3h45m', '2d3h') in seconds; None for '<unknown>' and the like."""
    parts = _AGE.findall(age)
    if not parts or "".join(n + u for n, u in parts) != age:
        return None
    return sum(int(n) * _AGE_S[u] for n, u in parts)


EVENTS_TABLE_HEADER = re.compile(r"^(?:NAMESPACE\s+)?LAST SEEN\s+(?:TYPE|FIRST SEEN)\s")
PODS_TABLE_HEADER = re.compile(r"^(?:NAMESPACE\s+)?NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE\b")
_COLUMN = re.compile(r"[A-Z]+(?: (?:SEEN|NODE|GATES))?")  # (kubectl's two-word column names)
_RESTARTS = re.compile(r"^(\d+)(?: \((\w+) ago\))?$")


def _cells(ln: str, cols: list[tuple[str, int]]) -> dict[str, str]:
    """A table row's cells, cut where the header's names start; a row that does not line up with its
    header (a hand-edited paste, tabs turned to spaces) is split at runs of two or more spaces
    (or tabs) instead, when that gives one cell per column (kubectl pads columns with three: a cut
    after a single space is inside a cell, between a message's words say)."""
    cut = {name: ln[start:cols[k + 1][1] if k + 1 < len(cols) else None].strip() for k, (name, start) in enumerate(cols)}
    if all(start >= len(ln) or ln[start - 2:start] == "  " for _, start in cols[1:]):
        return cut
    parts = re.split(r"\s*\t\s*|\s{2,}", ln.strip(), maxsplit=len(cols) - 1)
    return dict(zip([c for c, _ in cols], parts, strict=True)) if len(parts) == len(cols) else cut


def parse_kubectl_table(path: Path, text: str, at: str | None = None, tz_offset_s: int = 0) -> Parsed:
    """``kubectl get events`` / ``kubectl events`` and ``kubectl get pods`` as the tables they print
    (plain, ``-A``, ``-o wide``, old kubectl's event columns), columns cut where the header's names
    start (kubectl pads them so). Event ages are placed at ``--at`` minus the age, as for ``kubectl
    describe``; a pod's status is what it was at ``--at``: OOMKilled there is a host OOM kill, seen
    by then (since its last restart, when the table says how long ago that was)."""
    p = Parsed(kind="k8s-table")
    lines = text.splitlines()
    p.lines = len(lines)
    taken = parse_time(at, tz_offset_s) if at else None
    cols: list[tuple[str, int]] = []
    pods = False
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            p.parsed += 1
            continue
        if EVENTS_TABLE_HEADER.match(ln) or PODS_TABLE_HEADER.match(ln):  # (a header again: another listing)
            cols = [(m.group(0), m.start()) for m in _COLUMN.finditer(ln)]
            pods = bool(PODS_TABLE_HEADER.match(ln))
            p.parsed += 1
            continue
        if not cols:
            p.quarantine.append((i, "a row before the table's header", ln))
            continue
        row = _cells(ln, cols)
        if pods:
            m = _RESTARTS.match(row.get("RESTARTS", ""))
            if not row.get("NAME") or not row.get("STATUS") or not m:
                p.quarantine.append((i, "a pods row without its name, status or restarts", ln))
                continue
            restarts, ago = int(m.group(1)), _age_s(m.group(2)) if m.group(2) else None
            data = {"pod": row["NAME"], "namespace": row.get("NAMESPACE"), "ready": row.get("READY"),
                    "status": row["STATUS"], "restart_count": restarts, "last_restart_ago_s": ago, "age": row.get("AGE")}
            p.events.append({"t": taken, "kind": "k8s_pod_status", "line": i, "data": data})
            if "OOMKilled" in row["STATUS"]:
                p.events.append({"t": taken, "kind": "host_oom_killed", "line": i, "data": {
                    "container": row["NAME"], "reason": "OOMKilled", "exit_code": None, "restart_count": restarts,
                    "seen": "pod status at --at" + (f", within {ago} s of its last restart" if ago is not None else ""),
                    "meaning": OOMKILLED_MEANING}})
            p.parsed += 1
            continue
        if not row.get("REASON") or not row.get("LAST SEEN"):
            p.quarantine.append((i, "an events row without its reason or age", ln))
            continue
        age = _age_s(row["LAST SEEN"])
        count = row.get("COUNT", "")
        p.events.append(_k8s_fact(taken - age * 1_000_000 if taken is not None and age is not None else None, i, {
            "type": row.get("TYPE") or None, "reason": row["REASON"], "object": row.get("OBJECT") or row.get("NAME"),
            "message": row.get("MESSAGE") or None, "age": row["LAST SEEN"],
            "count": int(count) if is_uint(count) else None, "namespace": row.get("NAMESPACE")}))
        p.parsed += 1
    if any(e["t"] is None for e in p.events):
        p.notes.append(f"{path.name}: a kubectl table gives ages and states, not times; pass --at with when it was "
                       "taken to place them")
    elif p.events:
        p.notes.append(f"{path.name}: event times are --at minus their ages (to the second kubectl rounds to); pod "
                       "states are as of --at")
    return p


def parse_describe(path: Path, text: str, at: str | None = None, tz_offset_s: int = 0) -> Parsed:
    """``kubectl describe pod``: its Events (ages, placed at ``--at`` minus the age when --at says
    when the describe was taken) and each container's terminated State or Last State (OOMKilled/exit
    137, at the time it finished)."""
    p = Parsed(kind="k8s-describe")
    lines = text.splitlines()
    p.lines = len(lines)
    taken = parse_time(at, tz_offset_s) if at else None
    in_events = False
    container: str | None = None
    last: dict[str, Any] | None = None  # the terminated State or Last State block being read
    pod: dict[str, Any] = {}  # the pod's own Name, Reason and Message (its header: an eviction stays there
    # after its event has expired)

    def close_last() -> None:
        nonlocal last
        kind, meaning = terminated_kind(last.get("reason"), last.get("exit_code")) if last is not None else ("", None)
        if last is not None and meaning is not None:
            p.events.append({"t": last.get("t"), "kind": kind, "line": last["line"], "data": {
                "container": container, "reason": last.get("reason"), "exit_code": last.get("exit_code"),
                "meaning": meaning}})
        last = None

    for i, ln in enumerate(lines, start=1):
        p.parsed += 1  # every describe line is read; prose is kept in the input hash, not as a fact
        if ln.startswith("Events:"):
            close_last()
            in_events = True
            continue
        m = DESCRIBE_EV.match(ln) if in_events else None
        if m and m.group(2) != "------":
            age = _age_s(m.group(3).split(" ")[0])
            p.events.append(_k8s_fact(taken - age * 1_000_000 if taken is not None and age is not None else None, i, {
                "type": m.group(1), "reason": m.group(2), "age": m.group(3), "from": m.group(4), "message": m.group(5)}))
            continue
        if in_events:
            continue
        head = re.match(r"^  ([\w.-]+):\s*$", ln)  # a container's block ('  vllm:')
        if head:
            close_last()
            container = head.group(1)
            continue
        kv = re.match(r"^\s*([A-Z][\w ]*?):\s+(.*?)\s*$", ln)  # (unindented: a container's block pasted alone)
        if kv and not ln[:1].isspace() and container is None and last is None and kv.group(1) in ("Name", "Reason", "Message"):
            pod[kv.group(1)] = (kv.group(2), i)
        elif kv and kv.group(1) in ("State", "Last State") and kv.group(2).startswith("Terminated"):
            close_last()
            last = {"line": i}
        elif kv and last is not None and kv.group(1) in ("Reason", "Exit Code", "Finished"):
            key, value = kv.group(1), kv.group(2)
            if key == "Reason":
                last["reason"] = value
            elif key == "Exit Code":
                last["exit_code"] = int(value) if is_uint(value) else None
            elif key == "Finished":
                last["t"] = parse_time(value, tz_offset_s)
        elif kv and last is not None and kv.group(1) in ("Ready", "Restart Count"):
            close_last()
    close_last()
    if pod.get("Reason", ("",))[0] == "Evicted" and not any(e["data"].get("reason") == "Evicted" for e in p.events):
        # (when: not in the header; its event, where it has not expired, says it, and more)
        p.events.append(_k8s_fact(None, pod["Reason"][1], {"reason": "Evicted", "message": pod.get("Message", ("",))[0],
                                                          "object": f"Pod/{pod.get('Name', ('?',))[0]}"}))
    if any("age" in e["data"] and e["t"] is None for e in p.events):
        p.notes.append(f"{path.name}: describe output gives event ages, not times; pass --at with when it was "
                       "taken to place them")
    elif any("age" in e["data"] for e in p.events):
        p.notes.append(f"{path.name}: event times are --at minus their ages (to the second kubectl rounds to)")
    return p
