"""A CSV of vLLM's metrics one per column, as experiment scripts and harnesses dump them: a time column
first (absolute, an offset from the run's start, or a time of day: ``timecol``), then columns named
as vLLM names its metrics in any version, with or without 'vllm:' and with Prometheus labels
('gpu_cache_usage_perc', 'vllm:kv_cache_usage_perc{engine="0"}'), or by a harness's short names for
the same figures ('running', 'waiting', 'kv_pct': a percentage). Columns of anything else are left,
named in a note. A CSV whose first column is 'time…' and which names vLLM's metrics with their prefix
is Grafana's shape, and read as such, DCGM's columns too (``prometheus.parse_grafana_csv``).
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

from replay.engine.catalogue import load as load_catalogue
from replay.errors import ReplayError
from replay.metrics import RENAMED_PREFIXES, VLLM_METRICS, vllm_name
from replay.record import timecol
from replay.record.common import Parsed, Parser, checks_values, impossible, parse_time
from replay.record.options import RecordOptions
from replay.record.prometheus import series_tags

KIND = "vllm-metrics-csv"
SOURCE = "vllm-metrics"
# a harness's own short names for vLLM's figures (akamaslabs/vllm-benchmark's timeseries.csv: 'running',
# 'waiting', 'kv_pct' = 100 x vllm:kv_cache_usage_perc) -> (bundle metric, scale)
SHORT_NAMES: dict[str, tuple[str, float]] = {
    "running": ("requests_running", 1.0), "waiting": ("requests_waiting", 1.0), "swapped": ("requests_swapped", 1.0),
    "kv_pct": ("kv_usage_ratio", 0.01), "kv_cache_pct": ("kv_usage_ratio", 0.01), "kv_usage_pct": ("kv_usage_ratio", 0.01),
    "gpu_cache_pct": ("kv_usage_ratio", 0.01), "kv_cache_usage_pct": ("kv_usage_ratio", 0.01),
}
_ABSOLUTE_TIME_NAMES = ("date", "datetime", "ts", "_time", "time_utc", "timestamp_utc", "utc")
_NONE = ("", "nan", "NaN", "null", "None", "-")


@dataclass(frozen=True)
class Column:
    """A CSV column read as one of the bundle's metrics."""

    index: int
    header: str
    metric: str
    scale: float
    source: str
    vllm: str | None  # vLLM's own name of it ('vllm:num_requests_running'); None for a harness's short name


def _name_and_labels(header: str) -> tuple[str, dict[str, str]]:
    """A header cell's metric name and Prometheus labels ('vllm:x{a="1"}' -> 'vllm:x', {'a': '1'})."""
    name, brace, rest = header.strip().partition("{")
    labels = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', rest)) if brace else {}
    return name.strip(), labels


def own_name(name: str) -> str | None:
    """vLLM's own name (with 'vllm:') of a column's metric name, with its prefix, renamed or none at
    all, where vLLM has such a metric in some version (the version catalogue); else None."""
    named = vllm_name(name)
    if named is not None:
        return named
    bare = name
    for pre in ("vllm:", *RENAMED_PREFIXES):
        bare = bare.removeprefix(pre)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", bare):
        return None
    own = "vllm:" + bare
    return own if own in VLLM_METRICS or own in _catalogued() else None


@functools.lru_cache(maxsize=1)
def _catalogued() -> frozenset[str]:
    """Every sample name any catalogued release's /metrics can show (once: a lookup by release took
    a millisecond a column)."""
    cat = load_catalogue()
    return frozenset(n for v in cat.versions for n in cat.exposed_metric_names(v))


def time_header(header: str) -> bool:
    """Whether a first column's header names times (``timecol.time_column``, or an absolute one's name)."""
    return timecol.time_column(header) is not None or header.strip().lower() in _ABSOLUTE_TIME_NAMES


def _delimiter(first: str) -> str:
    return ";" if first.count(";") > first.count(",") else ("\t" if "\t" in first else ",")


def _header(first: str) -> list[str]:
    return [h.strip().strip('"') for h in next(csv.reader([first], delimiter=_delimiter(first)), [])]


def columns(header: list[str]) -> tuple[list[Column], list[str]]:
    """The columns after the first read as the bundle's metrics (series of one metric told apart by their
    labels), and the headers of those left (no metric the bundle holds)."""
    found: list[tuple[int, str, str, float, str | None, dict[str, str]]] = []
    left: list[str] = []
    for i, h in enumerate(header[1:], start=1):
        name, labels = _name_and_labels(h)
        own = own_name(name)
        if own in VLLM_METRICS:
            metric, scale = VLLM_METRICS[own]
            found.append((i, h, metric, scale, own, labels))
        elif own is None and name.lower() in SHORT_NAMES:
            metric, scale = SHORT_NAMES[name.lower()]
            found.append((i, h, metric, scale, None, labels))
        else:
            left.append(h)
    by_metric: dict[str, list[int]] = {}
    for k, f in enumerate(found):
        by_metric.setdefault(f[2], []).append(k)
    tags = [""] * len(found)
    for ks in by_metric.values():
        for k, tag in zip(ks, series_tags([found[k][5] for k in ks]) if len(ks) > 1 else [""], strict=True):
            tags[k] = tag or (f"[{found[k][1]}]" if len(ks) > 1 else "")  # (two columns alike: by their headers)
    return [Column(i, h, m, s, SOURCE + tag, own) for (i, h, m, s, own, _), tag in zip(found, tags, strict=True)], left


def sniff(head: str) -> str | None:
    """A metrics CSV: a time column first and a column of vLLM's metrics, where Grafana's reading would
    not do (a name without vLLM's prefix, or a harness's short name; or a first column Grafana's
    sniffer does not take, such as 'elapsed' or 't')."""
    lines = head.splitlines()
    if len(lines) < 2 or not any(d in lines[0] for d in ",;\t"):
        return None
    header = _header(lines[0])
    if len(header) < 2 or not time_header(header[0]):
        return None
    cols, _ = columns(header)
    if not cols:
        return None
    shorts = [c for c in cols if c.vllm is None]
    if shorts and len(shorts) < 2 and len(shorts) == len(cols):
        return None  # (one column called 'running' is not enough to call a file vLLM's)
    grafana_reads_it = header[0].lower().startswith("time") and all(
        vllm_name(_name_and_labels(c.header)[0]) is not None for c in cols)  # (and DCGM's columns beside them)
    return None if grafana_reads_it else KIND


@checks_values
def parse_metrics_csv(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """See the module docstring. A row whose time cannot be read, or of another form than the first
    row's, is quarantined; so is a cell that is no number (its column named), and a value no vLLM can
    have (a KV cache usage over 1)."""
    p = Parsed(kind=KIND)
    lines = text.splitlines()
    if not lines:
        return p
    delim = _delimiter(lines[0])
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), delimiter=delim))
    except csv.Error as e:
        raise ReplayError(f"{path}: not a CSV that can be read ({e})") from None
    header = [h.strip().strip('"') for h in rows[0]]
    cols, left = columns(header)
    clock = timecol.RowClock(header[0], timecol.time_column(header[0]), lambda c: parse_time(c, tz_offset_s))
    p.lines, p.parsed = len(rows), 1
    for no, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            p.parsed += 1
            continue
        _row(p, no, row, cols, clock, delim, len(header))
    p.vllm_names |= {c.vllm for c in cols if c.vllm is not None}
    p.notes.append(_read_note(path, cols, left))
    if clock.form in ("offset", "time of day"):
        timecol.hold(p, header[0], clock.form, tz_offset_s)
    else:
        p.naive_local_times = clock.form == "absolute"
    return timecol.settle(p, path, parse_time(at, tz_offset_s) if at else None)


def _row(p: Parsed, no: int, row: list[str], cols: list[Column], clock: timecol.RowClock, delim: str,
         width: int) -> None:
    """One row's samples, or the row quarantined."""
    raw = delim.join(row)
    if len(row) != width:
        p.quarantine.append((no, f"expected {width} fields, found {len(row)}", raw))
        return
    t, why = clock.read(row[0].strip())
    if why is not None:
        p.quarantine.append((no, why, raw))
        return
    p.parsed += 1
    for c in cols:
        cell = row[c.index].strip()
        if cell in _NONE:
            continue
        try:
            v = float(cell.replace(",", ".") if delim == ";" else cell) * c.scale
        except ValueError:
            p.quarantine.append((no, f"{c.header}: {cell!r} is not a number", raw))
            continue
        bad = impossible(c.metric, v) if math.isfinite(v) else f"{c.header}: {cell!r} is no value"
        if bad is not None:
            p.quarantine.append((no, f"{c.header}: {bad}", raw))
            continue
        p.samples.append((t, None, c.source, c.metric, v))


def _read_note(path: Path, cols: list[Column], left: list[str]) -> str:
    said = ", ".join(f"{c.header} as {c.metric}" + (f" (x{c.scale:g})" if c.scale != 1 else "") for c in cols)
    shorts = [c.header for c in cols if c.vllm is None]
    note = f"{path.name}: a CSV of vLLM's metrics, one per column: read {said}"
    if shorts:
        note += f" ({', '.join(shorts)}: a harness's short names for vLLM's figures)"
    if left:
        note += f"; not read (no metric the bundle holds): {', '.join(left[:16])}{', …' if len(left) > 16 else ''}"
    return note


def _parse(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_metrics_csv(path, text, opts.tz_offset_s, opts.at)


PARSERS: dict[str, Parser] = {KIND: _parse}
