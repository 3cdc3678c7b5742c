"""``replay export --perfetto``: the bundle's timeline as Chrome trace events (opens in ui.perfetto.dev
next to a torch profiler trace): memory counters, requests as slices, events as instants.

A day of log holds millions of requests: the events are rendered by polars and streamed to the file a
slice of rows at a time (as Python objects, 3.6M requests took 32 s and 4.9 GB), and ``window`` keeps
only a slice of the timeline, which is what Perfetto's UI can load of a large bundle.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import IO, Any

import polars as pl

from replay.analysis.outages import starts
from replay.analysis.replicas import events_of, replica_names, replica_of
from replay.atomic import written_in_place
from replay.bundle import Bundle

COUNTERS = ["device_used_bytes", "process_rss_bytes", "kv_usage_ratio", "requests_running", "requests_waiting"]
REQUEST_ARGS = ("input_tokens", "output_tokens", "prompt_logprobs", "status", "error")
SLICE_ROWS = 500_000  # rows rendered at once
LARGE_BYTES = 500 << 20  # about what Perfetto's UI loads of a JSON trace


def _counters(b: Bundle, window: tuple[int, int] | None) -> pl.LazyFrame:
    s = b.scan_samples().filter(pl.col("metric").is_in(COUNTERS))
    if window is not None:
        s = s.filter(pl.col("t_us").is_between(*window))
    gpu = pl.when(pl.col("gpu").is_null()).then(pl.lit("")).otherwise(pl.lit(" gpu") + pl.col("gpu").cast(pl.Utf8))
    return s.select(ph=pl.lit("C"), pid=pl.lit(1), ts="t_us",
                    name=pl.concat_str(pl.col("metric"), pl.lit(" ("), pl.col("source"), gpu, pl.lit(")")),
                    args=pl.struct(value="value"))


def _requests(b: Bundle, window: tuple[int, int] | None) -> pl.LazyFrame:
    """A slice per request from its send (or arrival) to its finish; one thread per request modulo 64,
    by its place among the bundle's requests."""
    start = pl.coalesce("sent_us", "arrival_us")
    r = b.scan_requests().with_row_index("i").with_columns(_start=start, _end=pl.coalesce("finish_us", start))
    r = r.filter(pl.col("_start").is_not_null())
    if window is not None:
        r = r.filter((pl.col("_start") <= window[1]) & (pl.col("_end") >= window[0]))
    return r.select(ph=pl.lit("X"), pid=pl.lit(2), tid=(pl.col("i") % 64).cast(pl.Int64), ts="_start",
                    dur=(pl.col("_end") - pl.col("_start")).clip(lower_bound=1), name="id",
                    args=pl.struct(*REQUEST_ARGS))


def _lanes(b: Bundle) -> dict[str | None, int]:
    """The events' thread of each replica (its vLLM log) where the bundle holds several: one engine a
    replica on the timeline; 0 for the rest (and for every event of a single engine's bundle)."""
    names = replica_names(b.meta.inputs)
    return {name: i + 1 for i, name in enumerate(names)} if len(names) > 1 else {}


def _events(b: Bundle, window: tuple[int, int] | None) -> list[dict[str, Any]]:
    named: dict[int, str] = {}  # an engine's start is 'engine start'; 'engine restart' only after a crash or a stop
    lanes = _lanes(b)  # (of that replica's own engine: another replica's crash makes no restart of this one)
    names = tuple(n for n in lanes if n is not None)
    for evs in events_of(b.events, names).values():
        for st in starts(evs):
            named[id(st.markers[0])] = f"engine {st.label}"
            named.update((id(m), "engine start marker") for m in st.markers[1:])
    return [{"ph": "i", "pid": 3, "tid": lanes.get(replica_of(e.get("source"), names), 0), "s": "t" if lanes else "g",
             "ts": e["t_us"], "name": named.get(id(e), e["kind"]), "args": {"source": e.get("source")}}
            for e in b.events if e.get("t_us") is not None and not str(e.get("kind")).startswith("request_")
            and (window is None or window[0] <= e["t_us"] <= window[1])]


class _Array:
    """The elements of a JSON array written as they come, a line each."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.n = fh, 0

    def add(self, objs: list[dict[str, Any]]) -> None:
        for o in objs:
            self.fh.write((b",\n" if self.n else b"") + json.dumps(o).encode())
            self.n += 1

    def add_frame(self, lf: pl.LazyFrame) -> None:
        df = lf.collect()
        for k in range(0, df.height, SLICE_ROWS):
            buf = io.BytesIO()  # (a JSON line's text never holds a raw line end: '\n' separates rows)
            part = df.slice(k, SLICE_ROWS)
            part.write_ndjson(buf)
            self.fh.write((b",\n" if self.n else b"") + buf.getvalue().rstrip(b"\n").replace(b"\n", b",\n"))
            self.n += part.height


def write_perfetto(b: Bundle, out: Path, window: tuple[int, int] | None = None) -> int:
    """Write the bundle's timeline (or the slice ``window`` of it, µs from t0, both ends included) as a
    Chrome trace; returns how many trace events it holds."""
    with written_in_place(out) as part, part.open("wb") as fh:
        fh.write(b'{"traceEvents": [\n')
        arr = _Array(fh)
        arr.add([{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
                 for pid, name in ((1, "memory"), (2, "requests"), (3, "events"))])
        arr.add([{"ph": "M", "pid": 3, "tid": tid, "name": "thread_name", "args": {"name": f"replica {name}"}}
                 for name, tid in _lanes(b).items()])
        arr.add_frame(_counters(b, window))
        arr.add_frame(_requests(b, window))
        arr.add(_events(b, window))
        fh.write(b"\n], " + json.dumps({"displayTimeUnit": "ms", "metadata": {
            "t0_utc": b.meta.t0_utc, "source": "replay", "window_us": list(window) if window else None}})[1:].encode())
    return arr.n
