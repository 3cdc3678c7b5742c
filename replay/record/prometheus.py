"""Prometheus and what holds its samples: text or OpenMetrics scrapes, `promtool tsdb dump` output,
query_range JSON, VictoriaMetrics exports, Grafana CSV and data frames.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from replay.errors import ReplayError
from replay.metrics import CACHE_CONFIG, NEVER_EXISTED_METRICS, VLLM_METRICS, vllm_name
from replay.record import timecol
from replay.record.common import (
    SCRAPED_AT,
    Parsed,
    Parser,
    a_gpu,
    as_list,
    as_obj,
    checks_values,
    impossible,
    json_value,
    lines_in,
    parse_time,
    scrape_time,
)
from replay.record.dcgm import DCGM_METRICS, dcgm_gpu, dcgm_hosts
from replay.record.options import RecordOptions
from replay.units import parse_size_bytes

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


@checks_values
def parse_exposition(path: Path, text: str, *, at: str | None = None, tz_offset_s: int = 0,
                     want: list[str] | None = None, host: str | None = None,
                     instance: str | None = None) -> Parsed:
    """One scrape (or several in one file, each after its own '# scraped_at' line, as a loop of
    ``echo "# scraped_at $(date -Is)"; curl /metrics`` writes them): vLLM and DCGM samples at the
    scrape time, or at their own timestamps where the lines carry them."""
    marks = [m.start() for m in SCRAPED_AT.finditer(text)]
    if len(marks) < 2:
        return dcgm_hosts(_parse_scrape(path, text, at, tz_offset_s, want, 0), path, host, instance)
    whole = Parsed(kind="prometheus-text", lines=lines_in(text))
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
    p.lines = lines_in(text)
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
        if frame is not None and a_gpu(gpu):  # (a series of the usual shape, as columns:
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


@checks_values
def parse_query_range(path: Path, obj: dict[str, Any], want: list[str] | None = None,
                      host: str | None = None, instance: str | None = None) -> Parsed:
    p = Parsed(kind="prometheus-query-range")
    data = as_obj(as_obj(obj).get("data"))
    refused = as_obj(obj).get("status") == "error"
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
    results = as_list(data.get("result"))
    metrics = [{str(k): str(v) for k, v in as_obj(as_obj(r).get("metric")).items()} for r in results]
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
    if as_obj(obj).get("status") not in (None, "success"):
        p.notes.append(f"{path}: query status {obj.get('status')!r}: {obj.get('error')}")
    return dcgm_hosts(p, path, host, instance)


@checks_values
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


@checks_values
def parse_grafana_csv(path: Path, text: str, tz_offset_s: int = 0, host: str | None = None,
                      instance: str | None = None, at: str | None = None) -> Parsed:
    """Grafana 'Inspect -> Data -> Download CSV': Time + one column per series ('series joined by
    time', the default), or one row per point under 'Series', 'Time', 'Value' ('series as rows', as
    older Grafana wrote it); ';' or ',' delimiter. Joined by time, its first column may hold offsets
    from a run's start or times of day (a script's CSV of this shape): placed as ``timecol`` says."""
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
    clock = timecol.RowClock(header[0], timecol.time_column(header[0]), lambda c: parse_time(c, tz_offset_s))
    for i, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        t, why = clock.read(row[0].strip())
        if t is None:
            p.quarantine.append((i, "unparseable time" if why is None or why.startswith("unparseable") else why,
                                 delim.join(row)))
            continue
        p.parsed += 1
        for ser, cell in zip(series, row[1:]):
            _grafana_cell(p, i, t, ser, cell, delim, row)
    p = dcgm_hosts(p, path, host, instance)
    if clock.form in ("offset", "time of day"):  # (a script's CSV of Grafana's shape: 'time [s]', times of day)
        timecol.hold(p, header[0], clock.form, tz_offset_s)
    return timecol.settle(p, path, parse_time(at, tz_offset_s) if at else None)


def _frames(obj: Any) -> list[dict[str, Any]]:
    """The data frames of a Grafana JSON export, whichever wrapping it has: a list of frames (the
    panel inspector's 'DataFrame JSON'), panel data ('series'), a query response ('results' by refId,
    each with 'frames'), or one frame."""
    if isinstance(obj, list):
        return [f for f in obj if isinstance(f, dict)]
    if not isinstance(obj, dict):
        return []
    if isinstance(obj.get("results"), dict):
        return [f for r in obj["results"].values() for f in as_list(as_obj(r).get("frames")) if isinstance(f, dict)]
    for key in ("series", "frames", "dataFrames", "data"):
        if isinstance(obj.get(key), list):
            return [f for f in obj[key] if isinstance(f, dict)]
    return [obj]


def _frame_fields(frame: dict[str, Any]) -> list[tuple[dict[str, Any], list[Any]]]:
    """(field, its values) of a frame: values inline (panel data) or in 'data.values' (frame JSON)."""
    fields = frame["schema"].get("fields") if isinstance(frame.get("schema"), dict) else frame.get("fields")
    if not isinstance(fields, list):
        return []
    columns = as_obj(frame.get("data")).get("values")
    out = []
    for i, f in enumerate(fields):
        if not isinstance(f, dict):
            continue
        vals = f.get("values") if "values" in f else (columns[i] if isinstance(columns, list) and i < len(columns) else None)
        out.append((f, vals if isinstance(vals, list) else []))
    return out


@checks_values
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
            labels = {str(a): str(b) for a, b in as_obj(f.get("labels")).items()}
            config = as_obj(f.get("config"))
            legend = _series_name(str(config.get("displayNameFromDS") or config.get("displayName") or ""))
            schema = as_obj(frame.get("schema"))
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


# --- as the registry reads them ---------------------------------------------------------------------
def sniff_query_range(head: str) -> str | None:
    """query_range's JSON (or the API's answer to a query it refused)."""
    s = head.lstrip()
    if s.startswith("{") and ('"resultType"' in head or re.match(r'\{\s*"status"\s*:\s*"error"', s) and '"errorType"' in head):
        return "prometheus-query-range"
    return None


def sniff_vm_export(head: str) -> str | None:
    return "victoriametrics-export" if VM_EXPORT_LINE.match(head.lstrip().split("\n", 1)[0]) else None


def sniff_grafana_json(head: str) -> str | None:
    """A Grafana panel's data frames."""
    s = head.lstrip()
    if s.startswith(("{", "[")) and re.search(r'"fields"\s*:', head) and re.search(r'"type"\s*:\s*"time"', head):
        return "grafana-json"
    return None


def sniff_tsdb_dump(head: str) -> str | None:
    """`promtool tsdb dump`: the name among the labels."""
    return "prometheus-text" if re.match(r'\{[^\n]*\b__name__\s*=\s*"', head.lstrip()) else None


def sniff_grafana_csv(head: str) -> str | None:
    """Series joined by time, or series as rows."""
    first = head.splitlines()[0] if head else ""
    if (first.lower().lstrip('"').startswith("time") or re.match(r'"?series"?[;,\t]"?time"?[;,\t]"?value"?\s*$', first, re.I)) \
            and ("," in first or ";" in first or "\t" in first):
        return "grafana-csv"
    return None


def sniff_text(head: str) -> str | None:
    """A scrape (a grep of /metrics has no TYPE lines)."""
    first = head.splitlines()[0] if head else ""
    if any(x in head for x in ("# TYPE ", "# HELP ")) or ("DCGM_FI_" in head and "{" in head) or "vllm:" in first \
            or re.search(r"^vllm[:_.]\w+(?:\{[^}]*\})? \S+$", head, re.M):
        return "prometheus-text"
    return None


def _text(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_exposition(path, text, at=opts.at, tz_offset_s=opts.tz_offset_s, want=opts.metrics, host=opts.host,
                            instance=opts.gpu_instance)


def _query_range(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_query_range(path, json_value(path, text), want=opts.metrics, host=opts.host, instance=opts.gpu_instance)


def _vm_export(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_vm_export(path, text, want=opts.metrics, host=opts.host, instance=opts.gpu_instance)


def _grafana_csv(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_grafana_csv(path, text, opts.tz_offset_s, opts.host, opts.gpu_instance, opts.at)


def _grafana_json(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_grafana_frames(path, json_value(path, text), opts.host, opts.gpu_instance)


PARSERS: dict[str, Parser] = {"prometheus-text": _text, "prometheus-query-range": _query_range,
                              "victoriametrics-export": _vm_export, "grafana-csv": _grafana_csv,
                              "grafana-json": _grafana_json}
