"""Replicas: a fleet's vLLM logs in one bundle, each log (with its rotated files) one replica with an engine of its own.

A fleet's postmortem starts at the first domino: which replica went down first, and when the others
followed. Each vLLM log recorded into the bundle is one replica (its events keep the log they came
from: 'vllm-3.log:1234'), so its crashes, starts and timeline lane are its own, not the fleet's
mixed together: a start of replica 5 after a crash of replica 3 is no restart.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import polars as pl

from replay.analysis.memory import stated_gib
from replay.analysis.outages import (
    DOWN_KINDS,
    STOP_KINDS,
    UP_KINDS,
    Outage,
    engine_starts,
    outages,
    starts,
)
from replay.bundle import Bundle, Samples, device_source, sample_names, samples_where
from replay.lognames import rotation_stem
from replay.units import GiB

LOG_KINDS = ("vllm-log", "log-export")  # the inputs that are a replica's own log
LOG_SERIES = "vllm-log"  # the source of a log's stats samples; 'vllm-log[NAME]' where they run beside another's
_WHAT = {"oom": "a CUDA OOM", "engine_death": "its engine died", "emulated_oom": "an emulated OOM",
         "host_oom_killed": "killed for host memory", "container_killed": "its container was killed (SIGKILL)"}


@dataclass(frozen=True)
class ReplicaCrash:
    """A replica's first crash (``outages.DOWN_KINDS``), at µs since the bundle's start."""

    replica: str  # its log's file name
    t_us: int
    kind: str
    source: str | None  # 'file:line' where it is stated

    @property
    def what(self) -> str:
        return _WHAT.get(self.kind, self.kind)


@dataclass(frozen=True)
class Replicas:
    """The bundle's replicas (its vLLM logs, by file name, as recorded) and the first crash of each that
    crashed, earliest first."""

    names: tuple[str, ...]
    crashes: tuple[ReplicaCrash, ...]

    @property
    def first(self) -> ReplicaCrash | None:
        return self.crashes[0] if self.crashes else None

    def sentence(self) -> str | None:
        """Which replica crashed first and when the others followed, in words; None with fewer than two
        replicas or no crash."""
        if len(self.names) < 2 or self.first is None:
            return None
        f = self.first
        then = [f"{c.replica} {(c.t_us - f.t_us) / 1e6:.1f} s later ({c.what})" for c in self.crashes[1:]]
        spared = len(self.names) - len(self.crashes)
        return (f"{f.replica} crashed first ({f.what}, at {f.t_us / 1e6:.1f} s, {f.source})"
                + (f"; then {', '.join(then)}" if then else "")
                + (f"; {spared} of the {len(self.names)} replicas did not crash" if spared else
                   f"; every one of the {len(self.names)} replicas crashed"))

    def to_json(self) -> dict[str, Any]:
        return {"replicas": list(self.names), "sentence": self.sentence(),
                "crashes": [{"replica": c.replica, "s": round(c.t_us / 1e6, 3), "kind": c.kind, "source": c.source}
                            for c in self.crashes]}


def replica_names(inputs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The recorded vLLM logs' replicas, in the order they were recorded, each once: a log's file name
    less rotation's marks (``vllm-3.log.1`` is replica ``vllm-3.log``'s, rotated)."""
    names = [rotation_stem(PurePath(str(i.get("path"))).name) for i in inputs if i.get("kind") in LOG_KINDS]
    return tuple(dict.fromkeys(names))


def replica_of(source: str | None, names: tuple[str, ...]) -> str | None:
    """The replica an event's source ('vllm-3.log:1234', 'vllm-3.log.1:56') states it in; None where it is
    none's."""
    if not source:
        return None
    name, _, line = source.rpartition(":")
    name = rotation_stem(name if line.isdigit() else source)
    return name if name in names else None


def events_of(events: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str | None, list[dict[str, Any]]]:
    """The events of each replica (under None those of no replica: Kubernetes', the GPUs')."""
    out: dict[str | None, list[dict[str, Any]]] = {}
    for e in events:
        out.setdefault(replica_of(e.get("source"), names), []).append(e)
    return out


def replicas(b: Bundle) -> Replicas:
    """Each replica's first crash, earliest first (ties by the order of the logs)."""
    names = replica_names(b.meta.inputs)
    firsts: dict[str, ReplicaCrash] = {}
    for e in sorted((e for e in b.events if e.get("kind") in DOWN_KINDS and e.get("t_us") is not None),
                    key=lambda e: int(e["t_us"])):
        name = replica_of(e.get("source"), names)
        if name is not None and name not in firsts:
            firsts[name] = ReplicaCrash(name, int(e["t_us"]), str(e["kind"]), e.get("source"))
    return Replicas(names, tuple(sorted(firsts.values(), key=lambda c: (c.t_us, names.index(c.replica)))))


def replica_outages(b: Bundle) -> list[Outage]:
    """The outages of each replica's own engine, in time order (a start of one replica ends no outage of
    another); the events of no replica (Kubernetes', the GPUs') are an engine of their own. With one
    log or none, the bundle's outages as one engine's."""
    names = replica_names(b.meta.inputs)
    if len(names) < 2:
        return outages(b.events)
    return sorted((o for evs in events_of(b.events, names).values() for o in outages(evs)), key=lambda o: o.down_us)


def replica_engine_starts(b: Bundle) -> int:
    """How many times the replicas' engines started, each replica's starts counted on its own (two
    replicas started within a minute of each other are two starts, not one)."""
    names = replica_names(b.meta.inputs)
    if len(names) < 2:
        return engine_starts(b.events)
    return sum(engine_starts(evs) for evs in events_of(b.events, names).values())


def series_replicas(sources: list[str], names: tuple[str, ...]) -> dict[str, str]:
    """The replica of each vLLM log stats series among ``sources``: 'vllm-log[replica-2.log]' (and its
    data-parallel engines', 'vllm-log[replica-2.log][Engine 001]') is replica-2.log's; 'vllm-log', the
    series of the first log recorded, is the replica's that has no series of its own, where exactly one
    has none. Series of no known replica (a Prometheus export's, 'vllm-log' where two logs' stats
    never overlapped) are left out."""
    own = {s: _named(s, names) for s in sources if s.startswith(LOG_SERIES)}
    unnamed = [n for n in names if n not in own.values()]
    first = unnamed[0] if len(unnamed) == 1 else None
    return {s: name for s, name in ((s, n or first) for s, n in own.items()) if name is not None}


def replica_series(b: Bundle, names: tuple[str, ...]) -> dict[str, str]:
    """``series_replicas`` of the bundle's own vLLM log stats series."""
    return series_replicas([s for s in sample_names(b.scan_samples()) if s.startswith(LOG_SERIES)], names)


def _named(source: str, names: tuple[str, ...]) -> str | None:
    """The replica a stats series names ('vllm-log[replica-2.log]…'), None where it names none."""
    inner = source.removeprefix(LOG_SERIES).removeprefix("[")
    ends = [i for i, c in enumerate(inner) if c == "]"]  # (the log's name may hold ']' itself)
    return next((rotation_stem(inner[:i]) for i in ends if rotation_stem(inner[:i]) in names), None)


def replica_kv_pools(b: Bundle, names: tuple[str, ...]) -> dict[str, float | None]:
    """Each replica's KV cache pool in bytes, as its own log states it (None where it states none)."""
    evs = events_of(b.events, names)
    pools = {n: stated_gib(evs.get(n, []), "kv_cache_gib") for n in names}
    return {n: None if gib is None else gib * GiB for n, gib in pools.items()}


EXPORT_SERIES = "vllm-metrics"  # the source of a metrics export's or scrape's vLLM series ('vllm-metrics[instance=…]')
TIE_KV = 0.02  # an export's KV usage within this of a log's, on average, is that log's replica's
TIE_POINTS = 5  # samples of the two at one time (within TIE_NEAR_US) needed to tie them
TIE_NEAR_US = 15_000_000


@dataclass(frozen=True)
class SeriesTie:
    """An export's vLLM series (a Prometheus instance's) and the replica whose log states the same KV
    usage at the same times: the export names an instance, the log a file, and only their values tie them."""

    source: str
    replica: str | None  # None: no replica's log matches it, or two match alike
    points: int  # samples compared with the nearest log's
    mean_abs_diff: float | None  # of KV usage (a ratio), against the nearest log's


def export_ties(samples: Samples, series: dict[str, str]) -> list[SeriesTie]:
    """Each export series of KV usage tied to the replica whose log's stats (``series``: a log series ->
    its replica) it matches: on average within TIE_KV over at least TIE_POINTS samples, and nearer than
    half way to any other replica's (two replicas idle alike tie nothing)."""
    if not series:
        return []
    exported = [s for s in sample_names(samples) if s.startswith(EXPORT_SERIES)]
    if not exported:
        return []
    kv = samples_where(samples, (pl.col("metric") == "kv_usage_ratio") & pl.col("source").is_in([*exported, *series])
                       ).select(pl.col("source").cast(pl.Utf8), "t_us", "value")  # (one pass over a fleet's samples)
    frames = {str(k[0]): part.drop("source").sort("t_us") for k, part in kv.partition_by("source", as_dict=True).items()}
    exports = sorted(s for s in frames if s.startswith(EXPORT_SERIES))
    if not exports:
        return []
    out = []
    for e in exports:
        by_rep: dict[str, tuple[int, float]] = {}
        for log, rep in series.items():
            if log not in frames:
                continue
            n, mad = _kv_distance(frames[e], frames[log])
            if n >= TIE_POINTS and (rep not in by_rep or mad < by_rep[rep][1]):
                by_rep[rep] = (n, mad)
        ranked = sorted(by_rep.items(), key=lambda kv_: kv_[1][1])
        if not ranked:
            out.append(SeriesTie(e, None, 0, None))
            continue
        rep, (n, mad) = ranked[0]
        clear = mad <= TIE_KV and (len(ranked) < 2 or ranked[1][1][1] >= 2 * mad + TIE_KV / 4)
        out.append(SeriesTie(e, rep if clear else None, n, mad))
    return out


def _kv_distance(export: pl.DataFrame, log: pl.DataFrame) -> tuple[int, float]:
    """(samples of ``export`` with a ``log`` sample within TIE_NEAR_US, their mean |difference|)."""
    j = export.join_asof(log.rename({"value": "log"}), on="t_us", strategy="nearest",
                         tolerance=TIE_NEAR_US).drop_nulls("log")
    if not j.height:
        return 0, float("inf")
    return j.height, float(j.select((pl.col("value") - pl.col("log")).abs().mean()).item())


def tie_sentence(ties: list[SeriesTie]) -> str:
    """The ties in words: which export series is which replica's, and which tie to none."""
    said = [f"{t.source} is {t.replica}'s (its KV usage within {t.mean_abs_diff * 100:.1f} points of the log's over "
            f"{t.points} samples)" for t in ties if t.replica is not None and t.mean_abs_diff is not None]
    none = [t.source + ("" if t.mean_abs_diff is None or t.mean_abs_diff == float("inf") else
                        f" (nearest log {t.mean_abs_diff * 100:.1f} points off)" if t.mean_abs_diff > TIE_KV else
                        " (as near two replicas' logs)") for t in ties if t.replica is None]
    return "; ".join(said + ([f"no replica's log matches {', '.join(none)}"] if none else [])) + "."


# --- which GPUs served which replica, by when their memory was taken and given back ----------------

GPU_LOW, GPU_HIGH = 0.10, 0.50  # of a GPU's total: a free GPU holds under GPU_LOW, one an engine serves from over GPU_HIGH
LINE_FLOOR_BYTES = 4 * GiB  # a series' own peak stands in for an unknown total, but no GPU an engine serves holds less
STEP_WITHIN_US = 300_000_000  # under GPU_LOW to over GPU_HIGH (or back) within this is one step: an engine loads its
# weights, compiles and profiles before it takes its KV cache
STEP_NEAR_US = 120_000_000  # a step that began within this after a replica's start or end line is that moment's
CLOCK_SLACK_US = 5_000_000  # a step seen complete this much before its line still counts (a log's times are whole seconds)
END_KINDS = (*DOWN_KINDS, *STOP_KINDS, "engine_stop")  # what gives an engine's GPU memory back: a crash, a stop
END_LINES_US = 120_000_000  # end lines this close, with no start between, are one end (a death and its traceback's lines)
_END_WORD = {"oom": "its OOM", "engine_death": "its engine's death", "emulated_oom": "its emulated OOM",
             "host_oom_killed": "its host OOM kill", "container_killed": "its kill (SIGKILL)",
             "engine_shutdown": "its stop", "engine_stop": "its stop"}

StepKind = Literal["rise", "fall"]
Confidence = Literal["high", "medium", "low"]


@dataclass(frozen=True)
class Step:
    """A GPU's memory taken (a rise: from under GPU_LOW of its total to over GPU_HIGH) or given back (a fall),
    between two of its samples at µs since the bundle's start."""

    kind: StepKind
    from_us: int  # its last sample on the side it left
    to_us: int  # its first sample on the side it reached


@dataclass(frozen=True)
class Moment:
    """A replica's engine start or end and the step of a GPU's memory that lines up with it."""

    step: StepKind  # a rise for a start, a fall for an end
    step_us: int  # when the step was seen complete (its ``Step.to_us``)
    event: str  # the line's kind: 'engine_start', 'oom', 'engine_death', 'engine_stop', …
    event_us: int
    source: str | None  # 'file:line' of the line

    @property
    def delay_s(self) -> float:
        return (self.step_us - self.event_us) / 1e6


@dataclass(frozen=True)
class GpuTie:
    """A GPU (a device series: its source and index) and the replica whose engine it served, tied by its
    memory taken at the replica's starts and given back at its ends: nothing in the evidence names the GPU
    a replica ran on, and a fleet's logs and device series come apart."""

    source: str  # the device series' source ('nvidia-smi', 'nvidia-smi[smi-node3.csv]', 'dcgm[Hostname=n2]')
    gpu: int | None
    replica: str | None  # None: no replica's moments fit it, or two replicas' fit it alike
    moments: tuple[Moment, ...]  # the tied replica's, or (tied to none) those of the replicas in ``alike``
    confidence: Confidence  # high: two or more moments (a start and an end); medium: one; low: tied to none
    why: str  # in words, for the finding
    alike: tuple[str, ...] = ()  # the replicas whose moments fit it equally (tied to none for that)

    @property
    def series(self) -> str:
        return self.source if self.gpu is None else f"{self.source} GPU {self.gpu}"


@dataclass(frozen=True)
class _Line:
    """A replica's start or end line."""

    step: StepKind
    kind: str
    t_us: int
    source: str | None


def gpu_ties(samples: Samples, events: list[dict[str, Any]], names: tuple[str, ...]) -> list[GpuTie]:
    """Each device series of memory used (a GPU of a node) tied to the replica it served: its rises after
    that replica's start lines, its falls at or soon after its crashes and stops (each within
    STEP_NEAR_US), at least one such moment, and more of them than any other replica's; where moments
    match alike, fewer of that replica's lines are belied by the GPU (held through its crash or start).
    Tensor parallelism ties several GPUs to one replica. Series in order of source and GPU."""
    lines = {n: _lines(evs) for n, evs in events_of(events, names).items() if n is not None}
    return [_tie(source, gpu, runs, lines) for (source, gpu), runs in _device_runs(samples).items()]


def _lines(events: list[dict[str, Any]]) -> list[_Line]:
    """A replica's starts (``outages.starts``: its markers of one start as one) and ends (END_KINDS; those
    within END_LINES_US of the one before, no start between, as one), in time order."""
    out = [_Line("rise", "engine_start", s.t_us, s.markers[0].get("source")) for s in starts(events)]
    last_end: int | None = None
    for e in sorted((e for e in events if e.get("t_us") is not None and e.get("kind") in (*UP_KINDS, *END_KINDS)),
                    key=lambda e: int(e["t_us"])):
        t = int(e["t_us"])
        if e.get("kind") in UP_KINDS:
            last_end = None
            continue
        if last_end is None or t - last_end > END_LINES_US:
            out.append(_Line("fall", str(e["kind"]), t, e.get("source")))
        last_end = t
    return sorted(out, key=lambda x: x.t_us)


RUN_ROWS = 500_000  # samples of memory used read at once for the GPUs' runs (a fleet's day: 5.5M)


class _OutOfOrder(Exception):
    """Samples of a query not in time order (a bundle's file is written in it)."""


def _device_runs(samples: Samples, rows: int = RUN_ROWS) -> dict[tuple[str, int | None], list[tuple[bool, int, int]]]:
    """Each device series of memory used (by source and GPU, in that order), as its runs of samples free
    (under GPU_LOW of its line: its total, else its own peak, no less than LINE_FLOOR_BYTES) and taken
    (over GPU_HIGH), those between left out: (taken, first µs, last µs), in time order; a series never
    under nor over is there with no runs. The samples of memory used (a fleet's day is millions) are read
    in time order ``rows`` at a time, each batch's runs joined to the last batch's: grouping them whole
    took 500 MiB. Samples not in time order (not a bundle's file) are put in it first; numpy finds each
    batch's runs."""
    key = ["source", "gpu"]
    lf = samples.lazy()
    metrics = ("device_used_bytes", "device_total_bytes")  # (both in one pass over the samples: a third less)
    highs = lf.filter(pl.col("metric").is_in(metrics)).group_by(*key, "metric").agg(pl.col("value").max()).collect(
        engine="streaming")
    peaks, totals = (highs.filter(pl.col("metric") == m).drop("metric") for m in metrics)
    lines = peaks.join(totals, on=key, how="left", nulls_equal=True, suffix="_total").filter(
        device_source(pl.col("source"))).select(pl.col("source").cast(pl.Utf8), "gpu", line=pl.max_horizontal(
            pl.coalesce("value_total", "value"), pl.lit(float(LINE_FLOOR_BYTES))))
    order = list(lines.sort("source", "gpu", nulls_last=True).select(key).iter_rows())
    # (the names as the file has them: cast to text in the query, a bundle's categories held ~60 MiB more)
    used = lf.filter((pl.col("metric") == "device_used_bytes") & pl.col("t_us").is_not_null()
                     & pl.col("source").is_in(lines["source"].unique().implode())).select("source", "gpu", "t_us", "value")
    try:
        runs = _runs_of(used.collect_batches(chunk_size=rows), lines, order)
    except _OutOfOrder:
        whole = used.collect().sort("t_us", maintain_order=True)
        runs = _runs_of((whole.slice(at, rows) for at in range(0, whole.height, rows)), lines, order)
    return runs


def _runs_of(batches: Iterable[pl.DataFrame], lines: pl.DataFrame,
             order: list[tuple[Any, ...]]) -> dict[tuple[str, int | None], list[tuple[bool, int, int]]]:
    """``_device_runs`` of samples of memory used coming in time order in ``batches`` (``_OutOfOrder`` where
    they do not), each series against its ``lines``; the series in ``order``."""
    key = ["source", "gpu"]
    runs: dict[tuple[str, int | None], list[tuple[bool, int, int]]] = {(str(s), g): [] for s, g in order}
    line_of = {(str(s), g): v for s, g, v in lines.select(*key, "line").iter_rows()}
    last_us: int | None = None
    for batch in batches:
        if not batch.height:
            continue
        t = batch["t_us"]
        if not t.is_sorted() or (last_us is not None and t[0] < last_us):
            raise _OutOfOrder
        last_us = t[-1]
        # (each series' samples, then its line's bounds in numpy: a join of every sample to its line took most of the time)
        part = batch.group_by(key, maintain_order=True).agg("t_us", "value")
        for (s, g), t_us, value in zip(part.select(key).iter_rows(), part["t_us"], part["value"], strict=True):
            line = line_of.get((str(s), g))
            if line is None:
                continue
            v = value.to_numpy()
            taken, free = v > GPU_HIGH * line, v < GPU_LOW * line
            kept = taken | free
            _extend(runs[(str(s), g)], t_us.to_numpy()[kept], taken[kept])
    return runs


def _extend(runs: list[tuple[bool, int, int]], t_us: npt.NDArray[np.int64], taken: npt.NDArray[np.bool_]) -> None:
    """A series' runs (``_device_runs``) extended by its next samples, free or taken, in time order."""
    if not len(t_us):
        return
    edges = np.flatnonzero(taken[1:] != taken[:-1]) + 1
    firsts, lasts = np.r_[0, edges], np.r_[edges - 1, len(t_us) - 1]
    more = list(zip(taken[firsts].tolist(), t_us[firsts].tolist(), t_us[lasts].tolist(), strict=True))
    if runs and runs[-1][0] == more[0][0]:  # (the run the last slice ended goes on)
        runs[-1] = (runs[-1][0], runs[-1][1], more.pop(0)[2])
    runs += more


def _steps(runs: list[tuple[bool, int, int]]) -> list[Step]:
    """A series' rises and falls: a run free then one taken (or the reverse) within STEP_WITHIN_US."""
    return [Step("rise" if b[0] else "fall", a[2], b[1]) for a, b in zip(runs, runs[1:])
            if b[1] - a[2] <= STEP_WITHIN_US]


def _fit(steps: dict[StepKind, list[Step]], held: list[tuple[int, int]], lines: list[_Line]) -> tuple[list[Moment], int]:
    """A replica's lines against a GPU's steps (of each kind, in time order): the moments that fit (each line's
    nearest step of its kind seen complete at or after it, begun within STEP_NEAR_US; a step fits one line),
    and how many lines the GPU belies (held from before the line to STEP_NEAR_US after it: no engine
    started or ended on it then). Looked up by bisection: a restart loop is hundreds of lines."""
    done = {k: [s.to_us for s in v] for k, v in steps.items()}
    held_from = [first for first, _ in held]
    moments, used, belied = [], set(), 0
    for ln in lines:
        near = steps[ln.step][bisect_left(done[ln.step], ln.t_us - CLOCK_SLACK_US):
                              bisect_right(done[ln.step], ln.t_us + STEP_NEAR_US + STEP_WITHIN_US)]
        fits = [s for s in near if s not in used and s.from_us <= ln.t_us + STEP_NEAR_US]
        if fits:
            s = min(fits, key=lambda s: abs(s.to_us - ln.t_us))
            used.add(s)
            moments.append(Moment(s.kind, s.to_us, ln.kind, ln.t_us, ln.source))
            continue
        i = bisect_right(held_from, ln.t_us) - 1  # (the held run the line falls in, if any: runs do not overlap)
        if i >= 0 and held[i][1] >= ln.t_us + STEP_NEAR_US:
            belied += 1
    return moments, belied


def _tie(source: str, gpu: int | None, runs: list[tuple[bool, int, int]], lines: dict[str, list[_Line]]) -> GpuTie:
    """One GPU tied to the replica whose lines it fits best (``_fit``): most moments, then fewest belied."""
    steps = _steps(runs)
    held = [(first, last) for tk, first, last in runs if tk]
    kinds: dict[StepKind, list[Step]] = {"rise": [s for s in steps if s.kind == "rise"],
                                         "fall": [s for s in steps if s.kind == "fall"]}
    fits = {n: _fit(kinds, held, ls) for n, ls in lines.items()}
    ranked = sorted(((len(m), -b, n) for n, (m, b) in fits.items() if m), key=lambda x: (-x[0], -x[1]))
    if not ranked:
        return GpuTie(source, gpu, None, (), "low", _unfit(runs, steps))
    alike = tuple(n for k, b, n in ranked if (k, b) == ranked[0][:2])
    if len(alike) > 1:
        k = ranked[0][0]
        return GpuTie(source, gpu, None, tuple(m for n in alike for m in fits[n][0]), "low",
                      f"{_and(list(alike))} fit it alike, {k} moment{'s' if k > 1 else ''} each: they started or "
                      "ended together", alike)
    rep = alike[0]
    moments = tuple(fits[rep][0])
    spare = len(steps) - len(moments)
    return GpuTie(source, gpu, rep, moments, "high" if len(moments) >= 2 else "medium",
                  _some([_moment_words(m) for m in moments], "; ")
                  + (f"; {spare} more rise{'s' if spare > 1 else ''} or fall{'s' if spare > 1 else ''} fit no replica"
                     if spare else ""))


def _unfit(runs: list[tuple[bool, int, int]], steps: list[Step]) -> str:
    """Why no replica's start or end fits a GPU, in words."""
    if steps:
        return f"its {len(steps)} rise{'s' if len(steps) > 1 else ''} or fall{'s' if len(steps) > 1 else ''} fit no replica's start or end"
    if not runs:
        return f"between {GPU_LOW:.0%} and {GPU_HIGH:.0%} of its memory throughout: neither free nor an engine's"
    if all(tk for tk, _, _ in runs):
        return "held throughout, never freed: in use before the evidence begins, and to its end"
    if not any(tk for tk, _, _ in runs):
        return f"never over {GPU_HIGH:.0%} of its memory: no engine ran on it in the evidence"
    return f"its memory was taken and given back only over more than {STEP_WITHIN_US // 1_000_000} s: no engine's start or end"


def _step_words(step: StepKind, event: str) -> tuple[str, str]:
    """What a GPU's step did and the line it followed, in words: ('taken', 'its start'), ('given back', 'its OOM')."""
    if step == "rise":
        return "taken", "its start"
    return "given back", _END_WORD.get(event, f"its {event}")


def _moment_words(m: Moment) -> str:
    done, what = _step_words(m.step, m.event)
    return f"{done} {m.delay_s:.0f} s after {what} at {m.event_us / 1e6:.1f} s ({m.source})"


MOMENTS_SAID = 4  # of a replica's moments (a restart loop's are hundreds), those said in words


def _some(words: list[str], sep: str = ", ") -> str:
    """The first MOMENTS_SAID of ``words``, and how many more."""
    more = len(words) - MOMENTS_SAID
    return sep.join(words[:MOMENTS_SAID]) + (f"{sep}and {more} more" if more > 0 else "")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def gpus_named(ties: list[GpuTie]) -> str:
    """The ties' GPUs in words, a source's indices together: 'nvidia-smi GPUs 0-1 and nvidia-smi[n2.csv] GPU 3'."""
    by: dict[str, list[int | None]] = {}
    for t in ties:
        by.setdefault(t.source, []).append(t.gpu)
    said = []
    for source, gpus in by.items():
        known = sorted(g for g in gpus if g is not None)
        if len(known) < len(gpus):
            said.append(source)
        if known:
            said.append(f"{source} GPU{'s' if len(known) > 1 else ''} {_indices(known)}")
    return _and(said)


def _indices(gpus: list[int]) -> str:
    """'0-3, 5': consecutive indices as a range."""
    spans: list[list[int]] = []
    for g in gpus:
        if spans and g == spans[-1][1] + 1:
            spans[-1][1] = g
        else:
            spans.append([g, g])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def gpu_tie_sentence(ties: list[GpuTie]) -> str:
    """The ties in words: which GPUs served which replica (when their memory was taken and given back), and
    which tie to none and why; GPUs that say the same, together."""
    tied: dict[str, list[GpuTie]] = {}
    none: dict[str, list[GpuTie]] = {}
    for t in ties:
        if t.replica is not None:
            tied.setdefault(t.replica, []).append(t)
        else:
            none.setdefault(t.why, []).append(t)
    said = [f"{rep} ran on {gpus_named(ts)} ({_moments_said(ts)})" for rep, ts in tied.items()]
    if none:
        said.append("tied to none: " + ", ".join(f"{gpus_named(ts)} ({why})" for why, ts in none.items()))
    return "; ".join(said) + "."


def _moments_said(ties: list[GpuTie]) -> str:
    """The moments of one replica's GPUs, each line once, with the longest its GPUs took to follow it."""
    slowest: dict[tuple[str, int, str | None, StepKind], float] = {}
    for t in ties:
        for m in t.moments:
            k = (m.event, m.event_us, m.source, m.step)
            slowest[k] = max(slowest.get(k, m.delay_s), m.delay_s)
    words = []
    for (event, event_us, source, step), delay in sorted(slowest.items(), key=lambda kv: kv[0][1]):
        done, what = _step_words(step, event)
        words.append(f"{done} within {max(delay, 0):.0f} s of {what} at "
                     f"{event_us / 1e6:.1f} s ({source})")
    conf = max((t.confidence for t in ties), key=("high", "medium", "low").index)  # (the weakest of its GPUs')
    return f"{conf}: " + _some(words)
