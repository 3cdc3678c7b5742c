"""The verdict: production beside its replays. Did a replay of the incident's trace reproduce it, at which
request, and when on the trace against production's own crash or divergence?

A replay sends the trace's requests under their production ids, on its own clock. ``align`` maps a
replay's time onto production's through the requests both hold: the median of their arrival offsets
(arrivals in the replay are the trace's times, scaled by the replay's speed). Without a shared id it
falls back to the trace's window start (where in production the trace's t=0 lies, as the replay's
bundle states it) or to the first requests of both, and says which it used. Trace time is production
time less the trace's t=0 (``TraceClock``).

A replay reproduced the incident when it ended in an OOM (torch's or vLLM's OOM line, the capacity
guard), its engine died, or its memory diverged from vLLM's accounting (an onset). It did not when it
ran the trace past production's crash or onset with none of these, its memory measured. Where the
production side has no crash and no memory evidence to compare with, there is no verdict: the
replay's outcome is stated and ``reproduced`` is None.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

import polars as pl

from replay.analysis.attribution import attribute
from replay.analysis.pipeline import OOM_STATED, Analysis, analyze_bundle, cause_of
from replay.bundle import Bundle
from replay.errors import EXIT_USAGE, ReplayError
from replay.units import GiB

AlignMethod = Literal["reference", "request_ids", "window", "first_request", "none"]
How = Literal["oom", "divergence", "engine_death", "none", "unknown"]
OriginBasis = Literal["window", "first_request", "t0"]


@dataclass(frozen=True)
class TraceClock:
    """Where on production's clock (µs from its t0) the trace's t=0 lies, and how that is known."""

    origin_us: int
    basis: OriginBasis
    note: str

    def trace_us(self, production_us: int | None) -> int | None:
        return None if production_us is None else production_us - self.origin_us


@dataclass(frozen=True)
class Alignment:
    """How a run's time maps onto the reference's (production's): ``reference_us = scale * run_us + offset_us``.
    ``scale`` is the run's replay speed (a run at twice the speed covers a trace second in half a second)."""

    run: str
    method: AlignMethod
    offset_us: int | None  # None: the run cannot be placed on the reference's clock
    scale: float = 1.0
    shared: int = 0  # requests both hold (method request_ids)
    spread_us: int | None = None  # median absolute deviation of the shared requests' offsets
    note: str = ""

    def to_reference(self, run_us: int | None) -> int | None:
        if run_us is None or self.offset_us is None:
            return None
        return int(round(self.scale * run_us)) + self.offset_us


@dataclass
class Verdict:
    run: str
    version: str | None
    reproduced: bool | None  # None: cannot judge (the reason is the first evidence line)
    how: How
    at_request: str | None  # the request in flight at the replay's OOM / death / onset (``at_request``)
    trace_time_us: int | None  # the replay's OOM / death / onset on trace time
    production_trace_time_us: int | None  # production's crash or onset it is compared with, on trace time
    delta_s: float | None  # trace_time - production_trace_time, seconds (> 0: the replay's came later)
    evidence: list[str] = field(default_factory=list)
    alignment: Alignment | None = None
    production_what: str | None = None  # what production's time is of: 'OOM', 'engine death', 'divergence onset'
    after_request_s: float | None = None  # from at_request's arrival to the replay's event, replay seconds
    same_request: bool | None = None  # whether at_request is production's own at its crash / onset
    replay_what: str | None = None  # what the replay's time is of: 'OOM', 'emulated OOM (capacity guard)', ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _speed(b: Bundle) -> float:
    if b.meta.kind != "replay":
        return 1.0
    try:
        v = float(b.meta.extra.get("speed") or 1.0)
    except (TypeError, ValueError):
        return 1.0
    return v if v > 0 else 1.0


def _iso(v: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")) if isinstance(v, str) else None
    except ValueError:
        return None


def _us(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def window_start(production: Bundle, replay: Bundle) -> int | None:
    """Where the replay's trace's t=0 lies on production's clock, as the replay's bundle states it
    (``extra.trace.offset_us``, else the start of ``extra.trace.window_us``: µs from the t0 the trace
    was cut at; moved onto this production bundle's t0 where the two differ); None where it states neither."""
    tr = replay.meta.extra.get("trace")
    if not isinstance(tr, dict):
        return None
    w = tr.get("window_us")
    start = _us(tr.get("offset_us"))
    if start is None and isinstance(w, (list, tuple)) and len(w) == 2:
        start = _us(w[0])
    if start is None:
        return None
    t0_trace, t0_prod = _iso(tr.get("production_t0_utc")), _iso(production.meta.t0_utc)
    if t0_trace is not None and t0_prod is not None:
        d = t0_trace - t0_prod
        start += (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds
    return start


def _run_slice_us(replay: Bundle) -> int:
    """The start of the slice of its trace that ``replay run --window`` replayed (its times start there at 0)."""
    w = replay.meta.extra.get("window_us")
    return int(w[0]) if isinstance(w, (list, tuple)) and len(w) == 2 and isinstance(w[0], (int, float)) else 0


def _arrivals(b: Bundle) -> pl.LazyFrame:
    return (b.scan_requests().select("id", t=pl.coalesce("arrival_us", "sent_us")).drop_nulls()
            .group_by("id").agg(pl.col("t").min()))


def first_arrival(b: Bundle) -> int | None:
    v = b.scan_requests().select(pl.coalesce("arrival_us", "sent_us").min()).collect().item()
    return None if v is None else int(v)


def _name(b: Bundle) -> str:
    return b.path.name


def trace_clock(production: Bundle, replays: list[Bundle]) -> TraceClock:
    """The trace's t=0 on production's clock: the window start the first replay that states one gives,
    else production's first request, else production's t0."""
    if production.meta.kind == "production":
        for r in replays:
            w = window_start(production, r)
            if w is not None:
                return TraceClock(w, "window", f"trace time 0 is the start of the trace's window in production "
                                              f"({w / 1e6:.3f} s from production's t0, as {_name(r)} states it)")
    first = first_arrival(production)
    if first is not None:
        return TraceClock(first, "first_request", f"trace time 0 is {_name(production)}'s first request "
                                                  f"({first / 1e6:.3f} s from its t0)")
    return TraceClock(0, "t0", f"trace time 0 is {_name(production)}'s t0 (it holds no request)")


def align(reference: Bundle, run: Bundle) -> Alignment:
    """Map ``run``'s time onto ``reference``'s: by the requests both hold (the median offset of their
    arrivals), else by the trace's window start (a replay of a production bundle that states it), else
    by the first request of each; ``method`` says which, ``note`` what it assumed."""
    name = _name(run)
    if run is reference:
        return Alignment(name, "reference", 0, 1.0, note="the reference itself")
    scale = _speed(run) / _speed(reference)
    j = (_arrivals(reference).rename({"t": "r"}).join(_arrivals(run).rename({"t": "o"}), on="id")
         .select("r", d=pl.col("r").cast(pl.Float64) - scale * pl.col("o").cast(pl.Float64)).collect())
    if j.height:
        med = float(j["d"].median())  # type: ignore[arg-type]
        spread = float((j["d"] - med).abs().median())  # type: ignore[arg-type]
        # (a log that gives whole seconds gives every arrival at the same fraction of a second)
        whole = j.height >= 3 and (j["r"] % 1_000_000).n_unique() == 1
        return Alignment(name, "request_ids", int(round(med)), scale, j.height, int(round(spread)),
                         f"aligned on {j.height} request id(s) both hold: {name}'s time"
                         + (f" x {scale:g}" if scale != 1 else "") + f" + {med / 1e6:.3f} s is {_name(reference)}'s; "
                         f"their offsets agree within {spread / 1e3:.1f} ms (median deviation)"
                         + (f"; {_name(reference)}'s arrivals are whole seconds (its log's), so trace times agree to "
                            "about a second" if whole else ""))
    first_run = first_arrival(run)
    if first_run is None:
        return Alignment(name, "none", None, scale, note=f"{name} holds no request arrival to place it by")
    w = window_start(reference, run) if reference.meta.kind == "production" else None
    if w is not None:
        start = w + _run_slice_us(run)
        return Alignment(name, "window", int(round(start - scale * first_run)), scale,
                         note=f"no request id in common: aligned by the trace's window start ({start / 1e6:.3f} s in "
                              f"{_name(reference)}), taking {name}'s first request as the trace's t=0")
    first_ref = first_arrival(reference)
    if first_ref is not None:
        return Alignment(name, "first_request", int(round(first_ref - scale * first_run)), scale,
                         note="no request id in common and no window start stated: aligned by the first request of "
                              "each, assumed to be the same request")
    return Alignment(name, "none", None, scale, note=f"{_name(reference)} holds no request and {name} states no window "
                                                     "start: the two cannot be placed on one clock")


def trace_hms(us: int | None) -> str:
    """Trace time as HH:MM:SS (tenths where there are any); '?' where unknown."""
    if us is None:
        return "?"
    sign, us = ("-", -us) if us < 0 else ("", us)
    tenths = int(round(us / 100_000))
    s, t = divmod(tenths, 10)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{sign}{h:02d}:{m:02d}:{sec:02d}" + (f".{t}" if t else "")


Picked = Literal["attributed", "in_flight", "last"]


def _pick(b: Bundle, t_us: int, attributed: Sequence[str] = ()) -> tuple[str, int, Picked] | None:
    t = pl.coalesce("sent_us", "arrival_us")
    lf = b.scan_requests().select("id", t=t, finish="finish_us").filter(pl.col("t") <= t_us)
    flying = lf.filter(pl.col("finish").is_null() | (pl.col("finish") >= t_us))
    picked, flown, last = pl.collect_all([
        flying.filter(pl.col("id").is_in(list(attributed))).sort("t", "id").tail(1),
        flying.sort("t", "id").tail(1), lf.sort("t", "id").tail(1)])
    for row, why in ((picked, "attributed"), (flown, "in_flight"), (last, "last")):
        if row.height:
            return str(row["id"][0]), int(row["t"][0]), why  # type: ignore[return-value]
    return None


def at_request(b: Bundle, t_us: int, attributed: Sequence[str] = ()) -> tuple[str, int] | None:
    """The request at ``t_us`` (an OOM, a death, an onset), with its arrival: of the requests arrived by
    then and still in flight (their finish not known to be before it), the last to arrive among those the
    traffic attribution points to (``attributed``: a long prompt_logprobs prefill that runs for seconds),
    else the last to arrive; where every request arrived by then had finished, the last arrived."""
    got = _pick(b, t_us, attributed)
    return None if got is None else (got[0], got[1])


def _request_at(b: Bundle, t_us: int) -> tuple[tuple[str, int] | None, str]:
    """``at_request`` at ``t_us``, with the traffic attribution there; and how it was picked, in words. (A
    replay's driver saw every request it sent: one with no finish was still running when it ended.)"""
    rows = b.scan_requests()
    if b.meta.kind == "replay":
        rows = rows.with_columns(finish_us=pl.coalesce("finish_us", pl.lit(2**62, dtype=pl.Int64)))
    attrs = attribute(rows, t_us)
    top = attrs[0] if attrs else None
    got = _pick(b, t_us, top.near_ids if top else ())
    if got is None:
        return None, ""
    rid, t, why = got
    words = (f"arrived {(t_us - t) / 1e6:.1f} s before it" + (
        f", in flight, among the traffic the attribution points to ({top.feature.replace('_', ' ')})"
        if why == "attributed" and top is not None else ", the last to arrive of those in flight" if why == "in_flight"
        else ", the last to arrive (none was in flight)"))
    return (rid, t), words


@dataclass(frozen=True)
class _Mark:
    """An incident's moment: its time on the bundle's clock, what it is, where the evidence states it."""

    t_us: int
    what: str  # 'OOM', 'engine death', 'divergence onset', ...
    how: How
    source: str | None


def _stated_oom(a: Analysis) -> dict[str, Any] | None:
    return min((e for e in a.bundle.events if e.get("kind") in OOM_STATED and e.get("t_us") is not None),
               key=lambda e: e["t_us"], default=None)


_WHAT = {"oom": "OOM", "emulated_oom": "emulated OOM (capacity guard)", "host_oom_killed": "host OOM kill",
         "torch_oom": "OOM", "engine_death": "engine death", "container_killed": "container kill (SIGKILL)"}


def _crash_mark(a: Analysis) -> _Mark | None:
    """The first OOM the evidence states, else its first crash (of a cause unstated: not called an OOM)."""
    oom, crash = _stated_oom(a), a.first_crash
    if crash is not None and (oom is None or crash["t_us"] < oom["t_us"]):
        cause = cause_of(crash, a.bundle.events)
        if cause is None or cause.get("kind") not in OOM_STATED:  # (a death whose OOM is logged after it)
            return _Mark(int(crash["t_us"]), _WHAT.get(str(crash.get("kind")), str(crash.get("kind"))), "engine_death",
                         crash.get("source"))
        oom = cause if oom is None or cause["t_us"] < oom["t_us"] else oom
    if oom is not None:
        return _Mark(int(oom["t_us"]), _WHAT.get(str(oom.get("kind")), "OOM"), "oom", oom.get("source"))
    return None


def _onset_mark(a: Analysis) -> _Mark | None:
    return None if a.div.onset_us is None else _Mark(a.div.onset_us, "divergence onset", "divergence", a.actual_source)


def _said(m: _Mark, at: str) -> str:
    return f"{m.what} at {at}" + (f" ({m.source})" if m.source and m.source != "replay" else "")


def judge(production: Analysis, replay: Analysis, clock: TraceClock, alignment: Alignment) -> Verdict:
    """One replay's verdict against production (both analysed), on the trace clock ``clock``."""
    rb = replay.bundle
    version = rb.meta.vllm_version or rb.meta.vllm_version_inferred
    ev: list[str] = []
    p_crash, p_onset = _crash_mark(production), _onset_mark(production)
    r_crash, r_onset = _crash_mark(replay), _onset_mark(replay)

    def trace(m: _Mark | None, run: bool) -> int | None:
        if m is None:
            return None
        return clock.trace_us(alignment.to_reference(m.t_us) if run else m.t_us)

    # production's side: what there is to reproduce, and whether it can be judged at all
    prod_ref_note = None
    if p_crash is None and p_onset is None:
        if production.memory_judged:
            prod_ref_note = (f"production ({production.bundle.path.name}) shows neither a crash nor a divergence "
                             f"(actual memory {production.actual_source} stayed with vLLM's accounting): nothing to reproduce")
        else:
            missing = ("no memory measured" if production.actual_source is None
                       else f"actual memory measured ({production.actual_source}) but not vLLM's accounting")
            prod_ref_note = (f"production ({production.bundle.path.name}) has no crash and no memory evidence to "
                             f"compare with ({missing}); what would settle it: an nvidia-smi, DCGM or NVML series "
                             "of the incident, the engine's log from its start, torch's OOM message")
    # the replay's outcome
    mark: _Mark | None = r_crash if r_crash is not None else r_onset
    how: How
    if mark is not None:
        how = mark.how
    elif rb.meta.extra.get("outcome") == "interrupted":
        how = "unknown"
    elif replay.memory_judged or p_crash is not None:
        how = "none"  # (no crash: that much is known without a memory series)
    else:
        how = "unknown"
    # production's moment to compare with: its crash for a crash, its onset for an onset
    p_mark = ((p_crash or p_onset) if how in ("oom", "engine_death", "none", "unknown") else (p_onset or p_crash))
    t_trace = trace(mark, True)
    p_trace = trace(p_mark, False)
    ev.append(alignment.note)
    if alignment.method != "request_ids":
        ev.append(clock.note)
    # the replay's own evidence
    at: tuple[str, int] | None = None
    if mark is not None:
        where = f"{mark.t_us / 1e6:.1f} s of the replay, trace {trace_hms(t_trace)}"
        if how == "engine_death":
            ev.append(f"replay: {_said(mark, where)}, of a cause the replay's evidence does not state (no OOM line)")
        elif how == "divergence":
            ev.append(f"replay: {_said(mark, where)}: the gap grew from {(replay.div.baseline_bytes or 0) / GiB:.2f} GiB to "
                      f"{(replay.div.max_gap_bytes or 0) / GiB:.2f} GiB (accounting: {replay.acc.basis})")
        else:
            ev.append(f"replay: {_said(mark, where)}")
        if how != "divergence" and r_onset is not None:
            ev.append(f"replay: its memory diverged first, at {r_onset.t_us / 1e6:.1f} s "
                      f"({(mark.t_us - r_onset.t_us) / 1e6:.1f} s before its {mark.what})")
        at, words = _request_at(rb, mark.t_us)
        if at is not None:
            ev.append(f"replay: request {at[0]} {words}")
    else:
        span = replay.end_us / 1e6
        measured = (f"actual memory measured ({replay.actual_source}) against vLLM's accounting" if replay.memory_judged
                    else "its memory not measured against vLLM's accounting: a divergence could not be seen"
                    if replay.actual_source is None or replay.acc.accounted_bytes is None else "")
        ev.append(f"replay: no OOM, no engine death and no divergence over {span:.1f} s ({measured})"
                  + (f"; its outcome: {rb.meta.extra['outcome']}" if rb.meta.extra.get("outcome") else ""))
    # production's evidence
    p_at: tuple[str, int] | None = None
    if p_mark is not None:
        words = _said(p_mark, f"trace {trace_hms(p_trace)} ({p_mark.t_us / 1e6:.1f} s from its t0)")
        if p_mark.how == "engine_death":
            words += ", of a cause its evidence does not state (no OOM line near it): a crash, not an OOM"
        ev.append(f"production: {words}")
        p_at, words = _request_at(production.bundle, p_mark.t_us)
        if p_at is not None:
            ev.append(f"production: request {p_at[0]} {words}")
        if production.actual_source is None:
            ev.append("production: no memory measured (no nvidia-smi, DCGM or NVML series): its memory cannot be compared")
    # the verdict
    reproduced: bool | None
    if prod_ref_note is not None:
        reproduced = None
        ev.insert(0, prod_ref_note)
    elif how == "unknown":
        reproduced = None
        ev.insert(0, "the replay was interrupted before it ended" if rb.meta.extra.get("outcome") == "interrupted" else
                  "the replay's memory was not measured against vLLM's accounting, and production's incident is a "
                  "divergence, not a crash: whether the replay diverged cannot be seen")
    elif how == "none":
        last = _last_arrival_trace(rb, alignment, clock)
        if p_trace is not None and last is not None and last < p_trace:
            reproduced, how = None, "unknown"
            ev.insert(0, f"the replay's requests end at trace {trace_hms(last)}, before production's {p_mark.what if p_mark else ''} "
                         f"at trace {trace_hms(p_trace)}: it did not run the part of the trace that failed")
        else:
            reproduced = False
    else:
        reproduced = True
    delta = None if t_trace is None or p_trace is None else round((t_trace - p_trace) / 1e6, 3)
    same = None if at is None or p_at is None else at[0] == p_at[0]
    if same:
        ev.append(f"request {at[0] if at else ''} is the one production's {p_mark.what if p_mark else ''} came at too")
    return Verdict(_name(rb), version, reproduced, how, at[0] if at else None, t_trace, p_trace, delta, ev, alignment,
                   p_mark.what if p_mark else None,
                   None if at is None or mark is None else round((mark.t_us - at[1]) / 1e6, 3), same,
                   mark.what if mark else None)


def _last_arrival_trace(b: Bundle, alignment: Alignment, clock: TraceClock) -> int | None:
    v = b.scan_requests().select(pl.coalesce("arrival_us", "sent_us").max()).collect().item()
    return None if v is None else clock.trace_us(alignment.to_reference(int(v)))


def verdicts_of(production: Analysis, replays: list[Analysis]) -> list[Verdict]:
    """The verdicts of analysed replays against analysed production (``verdicts`` with the analyses at hand)."""
    if production.bundle.meta.kind != "production":
        raise ReplayError(f"{production.bundle.path}: a {production.bundle.meta.kind} bundle; the verdict holds replays "
                          "against a production bundle (from `replay record`)", EXIT_USAGE)
    for r in replays:
        if r.bundle.meta.kind != "replay":
            raise ReplayError(f"{r.bundle.path}: a {r.bundle.meta.kind} bundle, not a replay (from `replay run`): "
                              "a verdict compares replays with production", EXIT_USAGE)
    clock = trace_clock(production.bundle, [r.bundle for r in replays])
    return [judge(production, r, clock, align(production.bundle, r.bundle)) for r in replays]


def verdicts(production: Bundle, replays: list[Bundle]) -> list[Verdict]:
    """Each replay's verdict against production: reproduced or not (None: cannot judge), how, at which
    request, and when on the trace against production's crash or onset, with the evidence."""
    return verdicts_of(analyze_bundle(production), [analyze_bundle(r) for r in replays])


def _at(v: Verdict, versions: list[str | None]) -> str:
    ver = v.version or "an unknown version"
    return f"at {ver}" + (f" ({v.run})" if v.version is None or versions.count(v.version) > 1 else "")


def _against(v: Verdict) -> str:
    if v.production_trace_time_us is None or v.production_what is None:
        return "production has no moment on this trace to compare with" if v.production_what is None else \
            f"production's {v.production_what} cannot be placed on the replay's trace time"
    there = f"production's {v.production_what} at trace {trace_hms(v.production_trace_time_us)}"
    if v.delta_s is None:
        return f"not placed against {there}"
    if abs(v.delta_s) < 0.05:
        return f"at the same trace time as {there}"
    return f"{abs(v.delta_s):.1f} s {'after' if v.delta_s > 0 else 'before'} {there}"


def verdict_lines(verdicts: list[Verdict], *, evidence: bool = False) -> list[str]:
    """The verdicts in words, a line each ('reproduced at 0.6.3: OOM at request r0042, 2.1 s after
    production's OOM at trace 00:01:12'); with ``evidence``, each followed by its evidence, indented."""
    versions = [v.version for v in verdicts]
    out: list[str] = []
    for v in verdicts:
        at = _at(v, versions)
        req = f" at request {v.at_request}" if v.at_request else ""
        same = " (the same request as production's)" if v.same_request else ""
        if v.reproduced is None:
            line = f"cannot judge {at}: {v.evidence[0] if v.evidence else 'no evidence'}"
            if v.how in ("oom", "engine_death", "divergence"):
                line += f" (the replay: {_event_words(v)}{req})"
        elif v.reproduced:
            if v.how == "divergence":
                after = (f" {v.after_request_s:.1f} s after request {v.at_request}" if v.at_request and v.after_request_s is not None
                         else "")
                line = f"reproduced {at}: the divergence began{after}{same}, {_against(v)}"
            else:
                line = f"reproduced {at}: {_event_words(v)}{req}{same}, {_against(v)}"
        else:
            line = (f"not reproduced {at}: no OOM, no engine death and no divergence"
                    + (f" (production: {v.production_what} at trace {trace_hms(v.production_trace_time_us)})"
                       if v.production_what and v.production_trace_time_us is not None else ""))
        out.append(line)
        if evidence:
            out += [f"  - {e}" for e in v.evidence]
    return out


def _event_words(v: Verdict) -> str:
    if v.how == "oom":
        return v.replay_what or "OOM"
    if v.how == "engine_death":
        return f"{v.replay_what or 'engine death'} (cause unstated)"
    return {"divergence": "divergence"}.get(v.how, v.how)

