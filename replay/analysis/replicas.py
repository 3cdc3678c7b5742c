"""Replicas: a fleet's vLLM logs in one bundle, each log (with its rotated files) one replica with an engine of its own.

A fleet's postmortem starts at the first domino: which replica went down first, and when the others
followed. Each vLLM log recorded into the bundle is one replica (its events keep the log they came
from: 'vllm-3.log:1234'), so its crashes, starts and timeline lane are its own, not the fleet's
mixed together: a start of replica 5 after a crash of replica 3 is no restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import polars as pl

from replay.analysis.memory import stated_gib
from replay.analysis.outages import DOWN_KINDS, Outage, engine_starts, outages
from replay.bundle import Bundle
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
    logs = b.samples.lazy().select(pl.col("source").unique()).filter(pl.col("source").str.starts_with(LOG_SERIES))
    return series_replicas(logs.collect()["source"].to_list(), names)


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


def export_ties(samples: pl.DataFrame, series: dict[str, str]) -> list[SeriesTie]:
    """Each export series of KV usage tied to the replica whose log's stats (``series``: a log series ->
    its replica) it matches: on average within TIE_KV over at least TIE_POINTS samples, and nearer than
    half way to any other replica's (two replicas idle alike tie nothing)."""
    if not series:
        return []
    kv = samples.lazy().filter((pl.col("metric") == "kv_usage_ratio") & (
        pl.col("source").str.starts_with(EXPORT_SERIES) | pl.col("source").is_in(list(series)))).select(
        pl.col("source").cast(pl.Utf8), "t_us", "value").collect()  # (one pass over a fleet's samples)
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
