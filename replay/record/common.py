"""What every evidence parser shares: ``Parsed`` (samples and events with absolute UTC epoch µs, or
``None`` where the evidence does not say, plus quarantined lines with reasons), the check that sets
aside values no device can have, and the reading of times.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, ParamSpec

import polars as pl

from replay.bundle import DEVICE_SOURCES, SAMPLES_SCHEMA
from replay.errors import ReplayError
from replay.record.events import ParsedEvent
from replay.record.options import RecordOptions
from replay.record.timecol import Unplaced, utc_text
from replay.units import MAX_GPU_INDEX, MiB

P = ParamSpec("P")


def renamed_note(path: Path, names: set[str]) -> list[str]:
    """A note for a file whose vLLM metrics (``names``, as the file has them) were renamed on their way."""
    odd = sorted(n for n in names if not n.startswith("vllm:"))
    if not odd:
        return []
    return [f"{path.name}: vLLM's metrics are renamed here ({', '.join(odd[:3])}{', …' if len(odd) > 3 else ''}; a "
            "collector or exporter on their way replaced 'vllm:'): read as vLLM's own"]


def lines_in(text: str) -> int:
    """How many lines ``text`` has, as an editor numbers them (a last line without its line end counts)."""
    return text.count("\n") + (not text.endswith("\n")) if text else 0


def a_gpu(index: int | None) -> bool:
    """Whether a sample's GPU index is one a machine can have (or none: a sample of no GPU)."""
    return index is None or 0 <= index <= MAX_GPU_INDEX


RequestStatus = Literal["ok", "error", "aborted", "unknown"]


@dataclass
class ParsedRequest:
    """One request as a benchmark harness states it: its times at absolute UTC epoch µs, each None
    where the file does not say; ``arrival_from`` says how an arrival was placed where the file gives
    no absolute time of its own (a client's monotonic clock)."""

    id: str
    line: int | None = None  # where in its file (None: a file of arrays, not of records)
    arrival_t: int | None = None  # when the client sent it
    first_token_t: int | None = None
    finish_t: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    max_tokens: int | None = None
    status: RequestStatus = "unknown"
    error: str | None = None
    arrival_from: str | None = None


@dataclass
class Parsed:
    """What a parser makes of one evidence file. Parsers that read a sample at a time list them in
    ``samples``; a vectorised lane hands whole frames (``frames``). ``frame`` gives them all as one."""

    kind: str
    samples: list[tuple[int | None, int | None, str, str, float]] = field(default_factory=list)
    frames: list[pl.DataFrame] = field(default_factory=list)  # samples as frames of SAMPLES_SCHEMA (epoch µs)
    events: list[ParsedEvent] = field(default_factory=list)
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
    requests: list[ParsedRequest] = field(default_factory=list)  # a harness's per-request records
    unplaced: Unplaced | None = None  # samples at offsets from the file's start, until placed (``timecol``)
    on_disk: pl.LazyFrame | None = None  # samples of SAMPLES_SCHEMA (epoch µs) a parser left in ``RecordOptions.spill``
    # as it read them, rather than hold a day of them; besides those of ``frames`` and ``samples``
    on_disk_filtered: bool = False  # whether rows were left out of ``on_disk`` (its scan then filters, and a slice
    # of it reads the whole: the recorder writes what is kept anew)

    def lazy_frames(self) -> list[pl.LazyFrame]:
        """The samples on disk and those of ``frames`` (not ``samples``), in that order, each as a lazy frame."""
        return [*([self.on_disk] if self.on_disk is not None else []), *(f.lazy() for f in self.frames)]

    def frame(self) -> pl.DataFrame:
        """Every sample but those on disk as one frame of SAMPLES_SCHEMA (epoch µs), those of ``frames`` first, and held
        so from then on (the list is emptied): as tuples, a day of samples took a gigabyte. A sample
        of a GPU index no machine has (more digits than the bundle's GPU column holds: a damaged or
        made-up line) is quarantined, not an internal error."""
        if not all(a_gpu(s[1]) for s in self.samples):
            counts: dict[tuple[Any, str, str], int] = {}
            for s in self.samples:
                if not a_gpu(s[1]):
                    counts[s[1], s[2], s[3]] = counts.get((s[1], s[2], s[3]), 0) + 1
            self.samples = [s for s in self.samples if a_gpu(s[1])]
            self.quarantine += [(None, f"GPU index {g} is no index a machine has: {n} sample(s) of {src} {metric} left out",
                                 f"{src} {metric} (GPU {g})") for (g, src, metric), n in counts.items()]
            self.gpus = {g: v for g, v in self.gpus.items() if a_gpu(g)}
        if self.samples or len(self.frames) != 1:
            listed = [pl.DataFrame(self.samples, schema=SAMPLES_SCHEMA, orient="row", strict=False)] if self.samples or not self.frames else []
            self.frames = [pl.concat([*self.frames, *listed], how="vertical_relaxed", rechunk=False).cast(SAMPLES_SCHEMA)]  # type: ignore[arg-type]
            self.samples = []  # (the frames' parts are kept as they are, not copied into one)
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


def _stated_totals(p: Parsed, frames: list[pl.LazyFrame]) -> pl.DataFrame:
    """Each GPU's stated memory total (the largest), by GPU and machine (``_host_key``): its
    ``device_total_bytes`` samples that are themselves possible, and for this machine's own sources
    the total ``p.gpus`` states."""
    schema = {"gpu": pl.Int32, "host": pl.Utf8, "total": pl.Float64}
    said = [f.filter((pl.col("metric") == "device_total_bytes") & pl.col("gpu").is_not_null()
                     & pl.col("value").is_between(0, MAX_DEVICE_BYTES)).select(
        "gpu", host=_host_key(pl.col("source")), total="value").cast(schema) for f in frames]  # type: ignore[arg-type]
    own = [(g, src, float(info["total_bytes"])) for g, info in p.gpus.items()
           if a_gpu(g) and isinstance(info.get("total_bytes"), (int, float)) and 0 <= info["total_bytes"] <= MAX_DEVICE_BYTES
           for src in DEVICE_SOURCES]
    return (pl.concat([*said, pl.LazyFrame(own, schema=schema, orient="row")])
            .group_by("gpu", "host").agg(pl.col("total").max()).collect(engine="streaming"))


def _shown(t: int | None) -> str:
    if t is None:
        return "no time"
    try:
        return utc_text(t)
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
        df = pl.DataFrame([(t if t is None or -_I64 <= t < _I64 else None, g if a_gpu(g) else None, *rest)
                           for t, g, *rest in samples], schema=SAMPLES_SCHEMA, orient="row", strict=False)
    return df.with_row_index("_i")


def _all_within_bounds(f: pl.LazyFrame, least_total: float | None) -> bool:
    """Whether every value of ``f`` is within ``impossible``'s bounds, told by each metric's least and
    largest value alone (``least_total``: the least total stated of any GPU, or None where none is):
    most evidence holds no impossible value, and this spares its every row the join with its GPU's
    total and the row-wise test. False where it cannot tell so (then each row is tested)."""
    return all(within_bounds(metric, lo, hi, least_total) for metric, lo, hi in f.group_by("metric").agg(
        lo=pl.col("value").min(), hi=pl.col("value").max()).collect(engine="streaming").iter_rows())


def within_bounds(metric: str | None, lo: float | None, hi: float | None, least_total: float | None) -> bool:
    """Whether values of ``metric`` from ``lo`` to ``hi`` (NaN aside) are all within ``impossible``'s
    bounds whatever GPU they are of: memory within a total is bounded by the least one stated (the
    bound of a GPU with a total of its own is never below it, of one without, MAX_DEVICE_BYTES). Each
    bound is a range from 0, so ``impossible`` tells it by the two ends (finite: it lets an infinity pass)."""
    if metric is None or _BOUNDS.get(metric.split(":", 1)[0]) is None:
        return True
    if lo is None or hi is None:
        return False  # (nothing but nulls)
    return all(math.isfinite(v) and impossible(metric, v, least_total) is None for v in (lo, hi))


def set_aside_impossible_values(p: Parsed, path: Path) -> Parsed:
    """Quarantine every sample whose value no device can have (``impossible``; where a parser knew its
    line it has set it aside already, with that line), and note the times at which one GPU's metric from
    one source has two different values (two series run together: two exporters, two pods, merged
    scrapes); those stay, and the larger decides a peak. Once per ``p``."""
    if p.values_checked:
        return p
    p.values_checked = True
    listed = _listed_frame(p.samples) if p.samples else None
    frames = [*p.lazy_frames(), *([listed.drop("_i").lazy()] if listed is not None else [])]
    if not frames:
        return p
    totals = _stated_totals(p, frames)
    least_total = totals["total"].min()

    def odd(f: pl.LazyFrame) -> list[dict[str, Any]]:
        """The rows of ``f`` (with '_i') out of bounds, with the total that bounded them."""
        if _all_within_bounds(f, least_total if isinstance(least_total, float) else None):
            return []
        rows = f.with_columns(host=_host_key(pl.col("source"))).join(
            totals.lazy(), on=["gpu", "host"], how="left", nulls_equal=False, maintain_order="left").filter(maybe_impossible(pl.col("total"))).collect()
        return [r for r in rows.iter_rows(named=True) if impossible(r["metric"], r["value"], r["total"]) is not None]

    def without(f: pl.LazyFrame, bad: list[dict[str, Any]]) -> pl.LazyFrame:
        gone = pl.Series(sorted(r["_i"] for r in bad), dtype=pl.UInt32)
        return f.with_row_index("_i").filter(~pl.col("_i").is_in(gone.implode())).drop("_i")

    set_aside: list[dict[str, Any]] = []
    if p.on_disk is not None and (bad := odd(p.on_disk.with_row_index("_i"))):
        set_aside += bad
        p.on_disk, p.on_disk_filtered = without(p.on_disk, bad), True  # (still on disk: the rows left out as it is read)
    for k, f in enumerate(p.frames):
        if bad := odd(f.lazy().with_row_index("_i")):
            set_aside += bad
            p.frames[k] = without(f.lazy(), bad).collect()
    if listed is not None:
        bad = odd(listed.lazy())
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
    _note_conflicts(p, path, [f.select(*SAMPLES_SCHEMA) for f in (*p.lazy_frames(), *([listed.lazy()] if listed is not None else []))])
    return p


def _note_conflicts(p: Parsed, path: Path, parts: list[pl.LazyFrame]) -> None:
    """A note of the times at which one GPU's metric from one source has several values (``parts``: the
    samples, as frames, read as they are needed)."""
    at = ["t_us", "gpu", "source", "metric"]
    df = pl.concat(parts, how="vertical_relaxed")
    timed = pl.col("t_us").is_not_null() & ~pl.col("value").is_nan()
    if _keys_once(df, at, timed):
        return
    df = df.filter(timed).filter(pl.struct(at).hash().is_duplicated())  # (a cheap sieve: a key twice, or a hash's collision)
    clash = df.group_by(at).agg(pl.col("value").unique().sort()).filter(pl.col("value").list.len() > 1).collect()
    if not clash.height:
        return
    t, gpu, source, metric, values = clash.sort(at, nulls_last=True).row(0)
    shown = " and ".join(_value_shown(metric, v) for v in values[:3]) + (", …" if len(values) > 3 else "")
    p.notes.append(f"{path.name}: {clash.height} time(s) at which one GPU's metric from one source has different values "
                   f"(first: {source} {metric}, GPU {gpu}, at {_shown(t)}: {shown}): conflicting series, such as two "
                   "exporters of one GPU or scrapes merged; all are kept, the largest decides a peak")


def _keys_once(df: pl.LazyFrame, at: list[str], where: pl.Expr) -> bool:
    """Whether no two rows of ``df`` for which ``where`` holds share their ``at`` columns, told by a
    hash of each row's (its columns' own hashes, each seeded apart, combined): counting distinct
    hashes is a quarter of the time of marking the duplicated ones, and evidence seldom holds any.
    False where two rows share a hash (the same key, or a collision: the caller looks at the keys
    themselves)."""
    key = functools.reduce(lambda a, b: a ^ b, (pl.col(c).hash(seed) for seed, c in enumerate(at, start=1)))
    keys = df.select(key=key.filter(where)).collect(engine="streaming")["key"]  # (the samples read a morsel at a time, but
    # for their keys: a day of a node's nvidia-smi, 2.8M samples, on disk, took 231 MiB so at once, 107 so)
    return bool(keys.n_unique() == keys.len())


def checks_values(parse: Callable[P, Parsed]) -> Callable[P, Parsed]:
    """A parser whose every result has been through ``set_aside_impossible_values`` (its first argument
    is the file's path)."""
    @functools.wraps(parse)
    def checked(*args: P.args, **kwargs: P.kwargs) -> Parsed:
        path = args[0] if args else kwargs["path"]
        assert isinstance(path, Path)
        return set_aside_impossible_values(parse(*args, **kwargs), path)
    return checked


def utc_us(dt: datetime, tz_offset_s: int = 0) -> int:
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
        return utc_us(datetime.fromisoformat(t), tz_offset_s)
    except ValueError:
        pass
    try:  # RFC 1123, as kubectl describe prints times: 'Thu, 01 May 2025 10:05:00 +0000'
        return utc_us(datetime.strptime(s, "%a, %d %b %Y %H:%M:%S %z"), tz_offset_s)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%a %b %d %H:%M:%S %Y"):
        try:
            return utc_us(datetime.strptime(t, fmt), tz_offset_s)
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


def as_obj(x: Any) -> dict[str, Any]:
    """``x`` where it is an object (a mapping), else an empty one: a field of the wrong type reads as absent."""
    return x if isinstance(x, dict) else {}


def as_list(x: Any) -> list[Any]:
    """``x`` where it is a list, else an empty one (as ``as_obj`` for objects)."""
    return x if isinstance(x, list) else []


# --- what the registry reads of each family -------------------------------------------------------
Sniffer = Callable[[str], "str | None"]  # the start of a file (20,000 characters) -> the kind it is, else None
Parser = Callable[[Path, str, RecordOptions], Parsed]  # a file of a kind the family reads, whole -> what it states
PieceParser = Callable[[Path, Callable[[], str], RecordOptions], Parsed]  # a file read from its path in parts, given
# how to read its text whole where it must (its reading so gives it) -> what it states, as its kind's Parser


def json_value(path: Path, text: str) -> Any:
    """A JSON file's value, or an error naming its line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReplayError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
