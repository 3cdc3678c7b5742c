"""The self-contained HTML report: plotly figures with plotly.js inlined, data embedded as JSON,
rendered from jinja2 templates. Everything from logs and prompts is escaped: by the templates'
autoescape in the page, by ``plotly_safe`` in the figures (plotly reads their text as markup, and a
``<span style=...url(...)>`` in a host or folder name would make the page fetch that URL), and inside
the page's scripts by ``_safe_json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import numpy.typing as npt
import plotly.graph_objects as go
import polars as pl
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from replay import __version__
from replay.analysis.cache import analysis_of
from replay.analysis.memory import stacked_parts, unchosen
from replay.analysis.multimodal import image_tokens_in_flight, mm_cache_hit_ratio
from replay.analysis.outages import DOWN_KINDS, Start, crash_line, starts
from replay.analysis.pipeline import OOM_STATED, Analysis, crash_summary
from replay.analysis.replicas import (
    Replicas,
    events_of,
    replica_kv_pools,
    replica_of,
    replica_series,
    replicas,
)
from replay.analysis.verdict import (
    Alignment,
    TraceClock,
    Verdict,
    align,
    first_arrival,
    trace_clock,
    trace_hms,
    verdict_lines,
    verdicts_of,
)
from replay.atomic import written_in_place
from replay.bundle import Samples, samples_where
from replay.report.downsample import LANE_MARKS, lane_marks, minmax, points_each, thin_marks
from replay.report.escape import plotly_safe
from replay.units import GiB

# the hover of a line of GiB named by its trace's meta (evidence: a source, a host; never put in the
# template itself, which plotly reads as markup: ``plotly_safe`` escapes meta)
_GIB_HOVER = "%{meta}: %{y:.2f} GiB<extra></extra>"

# the events drawn in the timeline's crash lane: what took the engine down, and the GPU errors behind it
CRASH_LANE = (*DOWN_KINDS, "gpu_xid", "cuda_error", "collective_timeout")
LANES = ("startup", "preemption", "crash / OOM", "start", "restart", "k8s")  # the events row's lanes, bottom up
_LANE_COLORS = {"crash / OOM": "#d62728", "preemption": "#ff7f0e"}
TIMELINE_PX = 900
LANE_PX = 24  # a replica's lane in a fleet's events row
# a replica's series in one colour (none of them the crash's red)
REPLICA_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f", "#393b79"]

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("replay.report", "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined)


def _safe_json(obj: Any) -> str:
    """JSON for inside <script>: '<', '>' and '&' escaped so no data can close the script tag."""
    return json.dumps(obj, sort_keys=True, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _xy(values: pl.Series) -> npt.NDArray[np.float64]:
    """A series as a trace's numbers: an array of floats, a null as NaN (a gap, as plotly draws a
    missing value). Plotly takes an array as it is and writes it as typed binary data (base64: no
    smaller than the numbers as text); a list it checks and copies value by value, most of the 2.3-2.7 s
    a fleet's timeline took."""
    return values.cast(pl.Float64).to_numpy()


def _s(us: int | float | None) -> float | None:
    return None if us is None else us / 1e6


@dataclass(frozen=True)
class FleetView:
    """A bundle of several replicas (a vLLM log each) as the timeline draws it apart: a lane of events for
    each replica, its stats series in its own colour and named by it, and the fleet's first crash."""

    reps: Replicas
    series: dict[str, str]  # a stats series' source -> its replica
    pools: dict[str, float | None]  # each replica's KV pool, bytes, as its log states it
    exports: dict[str, str] = field(default_factory=dict)  # an export's vLLM series -> the replica it ties to

    def lane(self, rep: str) -> str:
        """The replica's lane of events, and the legend group of its series."""
        return f"replica {rep}"

    def lanes(self) -> list[str]:
        return [self.lane(n) for n in self.reps.names]

    def lane_of(self, e: dict[str, Any]) -> str | None:
        rep = replica_of(e.get("source"), self.reps.names)
        return None if rep is None else self.lane(rep)

    def color(self, rep: str) -> str:
        return REPLICA_COLORS[self.reps.names.index(rep) % len(REPLICA_COLORS)]

    def attributed(self, sources: list[str]) -> list[tuple[str, str]]:
        """(source, replica) of the sources that are a replica's, in the replicas' order."""
        return sorted(((s, self.series[s]) for s in sources if s in self.series),
                      key=lambda p: (self.reps.names.index(p[1]), p[0]))

    def ordered(self, sources: list[str]) -> list[str]:
        """The replicas' sources in their order, then the others by name."""
        return [s for s, _ in self.attributed(sources)] + sorted(s for s in sources if s not in self.series)

    def is_first(self, e: dict[str, Any]) -> bool:
        f = self.reps.first
        return f is not None and (e.get("t_us"), e.get("kind"), e.get("source")) == (f.t_us, f.kind, f.source)


def fleet_of(a: Analysis) -> FleetView | None:
    """The analysed bundle's replicas drawn apart (its export series by the replica the analysis tied each
    to); None where it holds one vLLM log or none."""
    b = a.bundle
    r = replicas(b)
    if len(r.names) < 2:
        return None
    exports = {t.source: t.replica for t in a.series_ties if t.replica is not None}
    return FleetView(r, replica_series(b, r.names), replica_kv_pools(b, r.names), exports)


def timeline_figure(a: Analysis) -> go.Figure:
    b = a.bundle
    samples = b.scan_samples()
    img, hits = image_tokens_in_flight(b.scan_requests()), mm_cache_hit_ratio(samples)
    images = bool(img.height or hits.height)  # (a lane of its own where the bundle has images)
    fleet = fleet_of(a)
    heights, height_px = _row_heights(images, len(fleet.reps.names) if fleet else 0)
    fig = make_subplots(rows=5 if images else 4, cols=1, shared_xaxes=True, vertical_spacing=0.03, row_heights=heights,
                        specs=[[{}], [{}], [{}], [{}], *([[{"secondary_y": True}]] if images else [])],
                        subplot_titles=("Memory: actual vs vLLM's accounting", "KV cache usage (vLLM's view)",
                                        "Requests running / waiting", "Events",
                                        *(["Images: tokens in flight, vLLM's multimodal cache hits"] if images else [])))
    keep = [x for x in (a.div.onset_us, a.oom_us, a.div.max_gap_us) if x is not None]
    parts = stacked_parts(a.acc)
    part_colors = ["#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c"]
    multi = len(b.meta.gpus) > 1
    each = points_each(_timeline_series(a, fleet))  # (the figure's points, shared: a fleet has hundreds of series)
    for gpu, part in a.gap.partition_by("gpu", as_dict=True, maintain_order=True).items() if a.gap.height else []:
        d = minmax(part, "t_us", "actual_bytes", max_points=each, keep=keep)
        xs = _xy(d["t_us"] / 1e6)
        suffix = f" GPU {gpu[0]}" if multi else ""
        # vLLM's accounting, stacked part by part (the parts it logged at startup)
        for i, (name, val) in enumerate(parts):
            fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[val / GiB] * 2, name=f"accounted: {name}{suffix}", mode="lines",
                                     stackgroup=f"acc{gpu[0]}", line={"width": 0.5, "color": part_colors[i % 6]},
                                     legendgroup="accounted", meta=name, hovertemplate=_GIB_HOVER),
                          row=1, col=1)
        if a.acc.accounted_bytes is not None:
            acc = a.acc.accounted_bytes / GiB
            fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[acc] * 2, name="accounted by vLLM" + (" (estimated)" if a.acc.estimated else ""),
                                     mode="lines", line={"color": "#1f77b4", "dash": "dash" if a.acc.estimated else "solid"}), row=1, col=1)
            fig.add_trace(go.Scatter(x=xs, y=np.maximum(_xy(d["actual_bytes"] / GiB), acc), name="gap (unaccounted)",
                                     mode="lines", line={"width": 0}, fill="tonexty", fillcolor="rgba(214,39,40,0.25)",
                                     showlegend=True, hoverinfo="skip"), row=1, col=1)
        label = f"actual ({a.actual_source})" + suffix
        fig.add_trace(go.Scatter(x=xs, y=_xy(d["actual_bytes"] / GiB), name=label,
                                 mode="lines", line={"color": "#d62728", "width": 2.5}), row=1, col=1)
        # the other measured layers of actual memory (torch reserved/allocated, this process, other processes)
        lay = a.layers.filter(pl.col("gpu") == gpu[0]) if a.layers.height else a.layers
        for j, (layer, lp) in enumerate(lay.partition_by("layer", as_dict=True, maintain_order=True).items() if lay.height else []):
            src = f"{lp['source'][0]}:{lp['layer'][0]}"
            if a.actual_source and a.actual_source.split(":")[0] == lp["source"][0] and layer[0] in ("device used", "engine process tree (RSS)"):
                continue  # already drawn as "actual"
            ld = minmax(lp.sort("t_us"), "t_us", "value_bytes", max_points=each, keep=keep)
            fig.add_trace(go.Scatter(x=_xy(ld["t_us"] / 1e6), y=_xy(ld["value_bytes"] / GiB),
                                     name=f"measured: {layer[0]}{suffix}", mode="lines",
                                     line={"dash": ["dot", "dashdot", "longdash", "dash"][j % 4], "width": 1.5},
                                     meta=src, hovertemplate=_GIB_HOVER), row=1, col=1)
    # device memory of several machines, none of them chosen as the bundle's: each drawn, none called actual
    for j, ((series,), mp) in enumerate(a.machines.partition_by("series", as_dict=True, maintain_order=True).items()
                                        if a.machines_total else []):
        md = minmax(mp, "t_us", "value_bytes", max_points=each, keep=keep)
        fig.add_trace(go.Scatter(x=_xy(md["t_us"] / 1e6), y=_xy(md["value_bytes"] / GiB),
                                 name=f"device used, {series}", mode="lines", legendgroup="machines",
                                 line={"width": 1.5, "dash": ["solid", "dot", "dash", "dashdot"][j % 4]},
                                 meta=series, hovertemplate=_GIB_HOVER), row=1, col=1)
    drawn = a.machines["series"].n_unique() if a.machines_total else 0
    if a.machines_total > drawn:
        what, option = unchosen(list(a.machines["series"].unique(maintain_order=True)))
        fig.add_annotation(x=0, y=1.0, xref="x domain", yref="y domain", showarrow=False, xanchor="left",
                           text=f"{drawn} of {a.machines_total} {what}' series drawn "
                                f"(highest peaks); record with {option} to choose vLLM's", row=1, col=1)
    kvu = a.kv.filter(pl.col("kv_used_bytes").is_not_null()) if a.kv.height else a.kv
    names = [n for n, _ in parts]
    if kvu.height and "KV pool" in names:
        below = sum(v for _, v in parts[:names.index("KV pool")])  # the KV band starts here in the stack
        if fleet is not None:
            _fleet_kv_in_use(fig, a.kv, fleet, below, each)
        else:
            d = minmax(kvu.sort("t_us"), "t_us", "kv_used_bytes", max_points=each)
            fig.add_trace(go.Scatter(x=_xy(d["t_us"] / 1e6), y=_xy((d["kv_used_bytes"] + below) / GiB),
                                     name="KV in use (inside the pool)", mode="lines", line={"color": "#08306b", "dash": "dot"}),
                          row=1, col=1)
    for line_name, level, color in (("budget", a.acc.budget_bytes, "#2ca02c"), ("capacity", a.acc.total_bytes, "#000000")):
        if level is not None and level != a.acc.accounted_bytes:
            fig.add_hline(y=level / GiB, line_dash="dot", line_color=color, annotation_text=line_name, row=1, col=1)
    if fleet is not None:
        _fleet_kv_usage(fig, a.kv, fleet, each)
    for kv_src, part in a.kv.partition_by("source", as_dict=True).items() if a.kv.height and fleet is None else []:
        d = minmax(part.sort("t_us"), "t_us", "kv_usage_ratio", max_points=each)
        fig.add_trace(go.Scatter(x=_xy(d["t_us"] / 1e6), y=_xy(d["kv_usage_ratio"] * 100),
                                 name=f"KV usage % ({kv_src[0]})", mode="lines"), row=2, col=1)
    _requests(fig, samples, each, fleet)
    _event_lane(fig, b.events, fleet)
    _crash_lines(fig, a, fleet)
    if images:
        _image_lane(fig, img, hits, each)
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_yaxes(title_text="%", row=2, col=1)
    fig.update_xaxes(title_text=f"seconds from t0 ({b.meta.t0_utc or 'unknown'})", row=5 if images else 4, col=1)
    fig.update_layout(height=height_px, hovermode="x unified", legend={"orientation": "h", "y": -0.08},
                      margin={"l": 60, "r": 20, "t": 40, "b": 40}, template="plotly_white")
    return plotly_safe(fig)


def _row_heights(images: bool, replicas: int) -> tuple[list[float], int]:
    """The timeline's rows' shares of its height, and its height in px: a fleet's events row grows by a
    lane for each replica, the other rows keep their height."""
    heights = [0.44, 0.14, 0.14, 0.14, 0.14] if images else [0.5, 0.17, 0.17, 0.16]
    if not replicas:
        return heights, TIMELINE_PX
    px = TIMELINE_PX + LANE_PX * replicas
    rows = [h * TIMELINE_PX / px for h in heights]
    rows[3] += LANE_PX * replicas / px
    return rows, px


def _requests(fig: go.Figure, samples: Samples, each: int, fleet: FleetView | None = None) -> None:
    """Row 3: the requests running and waiting; of each replica where the bundle holds several (in the
    replica's colour, waiting dotted), else of the first series that states them."""
    s = samples_where(samples, pl.col("metric").is_in(["requests_running", "requests_waiting"]))
    for metric, color, dash in (("requests_running", "#9467bd", "solid"), ("requests_waiting", "#8c564b", "dot")):
        d = s.filter(pl.col("metric") == metric)
        if not d.height:
            continue
        mine: list[tuple[str, str | None]] = list(fleet.attributed(d["source"].unique().to_list())) if fleet else []
        for src, rep in mine or [(d["source"][0], None)]:
            dd = minmax(d.filter(pl.col("source") == src).sort("t_us"), "t_us", "value", max_points=each)
            label = metric.replace("_", " ")
            style = {"legendgroup": fleet.lane(rep), "line": {"shape": "hv", "color": fleet.color(rep), "dash": dash}} \
                if fleet and rep else {"line": {"shape": "hv", "color": color}}
            fig.add_trace(go.Scatter(x=_xy(dd["t_us"] / 1e6), y=_xy(dd["value"]), mode="lines",
                                     name=f"{rep}: {label}" if rep else label, **style), row=3, col=1)


def _fleet_kv_usage(fig: go.Figure, kv: pl.DataFrame, fleet: FleetView, each: int) -> None:
    """Row 2 of a fleet: vLLM's KV cache usage, each replica's series in its colour and named by it (a
    series of no known replica by its source; an export's series tied to a replica by its values, dashed in
    the replica's colour)."""
    for src in fleet.ordered(kv["source"].unique().to_list()) if kv.height else []:
        rep, tied = fleet.series.get(src), fleet.exports.get(src)
        d = minmax(kv.filter(pl.col("source") == src).sort("t_us"), "t_us", "kv_usage_ratio", max_points=each)
        style = {"legendgroup": fleet.lane(rep), "line": {"color": fleet.color(rep)}} if rep else \
            {"legendgroup": fleet.lane(tied), "line": {"color": fleet.color(tied), "dash": "dash"}} if tied else {}
        name = f"{rep}: KV usage %" if rep else f"{tied}: KV usage % ({src})" if tied else f"KV usage % ({src})"
        fig.add_trace(go.Scatter(x=_xy(d["t_us"] / 1e6), y=_xy(d["kv_usage_ratio"] * 100), mode="lines",
                                 name=name, **style), row=2, col=1)


def _fleet_kv_in_use(fig: go.Figure, kv: pl.DataFrame, fleet: FleetView, below: float, each: int) -> None:
    """Row 1 of a fleet: each replica's KV cache in use (its usage of its own pool, as its log states the
    pool), inside the stack's KV band; a replica whose log states no pool is not drawn."""
    for src, rep in fleet.attributed(kv["source"].unique().to_list()):
        pool = fleet.pools.get(rep)
        if pool is None:
            continue
        part = kv.filter(pl.col("source") == src).sort("t_us").with_columns(used=pl.col("kv_usage_ratio") * pool)
        d = minmax(part, "t_us", "used", max_points=each)
        fig.add_trace(go.Scatter(x=_xy(d["t_us"] / 1e6), y=_xy((d["used"] + below) / GiB), mode="lines",
                                 name=f"{rep}: KV in use (inside the pool)", legendgroup=fleet.lane(rep),
                                 line={"color": fleet.color(rep), "dash": "dot"}, meta=f"{rep}: KV in use",
                                 hovertemplate=_GIB_HOVER), row=1, col=1)


def _lane_of(kind: str) -> str:
    return ("crash / OOM" if kind in CRASH_LANE else "preemption" if kind == "preemption" else
            "k8s" if kind.startswith("k8s") or kind == "restart_count" else "startup")


@dataclass
class _Marks:
    """The events row's marks: time (s), lane, hover text, colour, and whether it is the fleet's first crash."""

    x: list[float] = field(default_factory=list)
    y: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    color: list[str] = field(default_factory=list)
    first: list[bool] = field(default_factory=list)

    def add(self, x: float, lane: str, text: str, color: str, first: bool = False) -> None:
        self.x.append(x)
        self.y.append(lane)
        self.text.append(text)
        self.color.append(color)
        self.first.append(first)


def _event_lane(fig: go.Figure, events: list[dict[str, Any]], fleet: FleetView | None) -> None:
    """Row 4: the events, a lane for each class of them (``LANES``); in a fleet a lane for each replica,
    with that replica's own events and starts (its engine's: another replica's crash makes no restart of
    it), and its first crash a star where it is the fleet's first."""
    m = _Marks()
    by_lane: dict[tuple[str, str], list[tuple[float, str, bool]]] = {}
    for e in events:
        k = str(e.get("kind"))
        if e.get("t_us") is None or k.startswith("request_") or k == "engine_start":  # (starts: one mark per start, below)
            continue
        cls = _lane_of(k)
        at = (fleet.lane_of(e) if fleet else None) or cls
        by_lane.setdefault((at, cls), []).append((e["t_us"] / 1e6, f"{k} @ {e.get('source')}", bool(fleet and fleet.is_first(e))))
    shared = lane_marks(len(fleet.reps.names)) if fleet else LANE_MARKS  # (a replica's lane: LANE_MARKS shared)
    for (lane, cls), marks in by_lane.items():  # (a lane of many marks, a fleet's day of preemptions, is thinned;
        marks.sort(key=lambda mk: mk[0])  # crashes and OOMs never are)
        most = shared if lane != cls else LANE_MARKS
        for i, n in thin_marks([x for x, *_ in marks], most) if cls != "crash / OOM" else [(i, 1) for i in range(len(marks))]:
            x, text, first = marks[i]
            m.add(x, lane, ("the fleet's first crash: " if first else "") + text
                  + (f" (and {n - 1} more {cls} marks after it, to the next mark)" if n > 1 else ""),
                  _LANE_COLORS.get(cls, "#7f7f7f"), first)
    for own, st in _lane_starts(events, fleet):  # (an engine's start is a start; a restart only after a crash or a stop)
        m.add(st.t_us / 1e6, own or st.label, f"engine {st.label}" + (f" after {st.after}" if st.after else "") + ": "
              + "; ".join(f"{mk.get('marker')} @ {mk.get('source')}" for mk in st.markers), "#2ca02c" if not st.restart else "#9467bd")
    marker: dict[str, Any] = {"size": 9, "color": m.color, "symbol": "diamond"}
    if fleet is not None:
        marker |= {"size": [16 if f else 9 for f in m.first], "symbol": ["star" if f else "diamond" for f in m.first]}
    if m.x:
        fig.add_trace(go.Scatter(x=m.x, y=m.y, mode="markers", marker=marker, text=m.text,
                                 hovertemplate="%{text}<extra></extra>", name="events"), row=4, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=[*LANES, *(fleet.lanes()[::-1] if fleet else [])], row=4, col=1)


def _lane_starts(events: list[dict[str, Any]], fleet: FleetView | None) -> list[tuple[str | None, Start]]:
    """The engines' starts, each with its replica's lane (None: the start or restart lane)."""
    if fleet is None:
        return [(None, st) for st in starts(events)]
    return [(fleet.lane(rep) if rep else None, st) for rep, evs in events_of(events, fleet.reps.names).items()
            for st in starts(evs)]


def _crash_lines(fig: go.Figure, a: Analysis, fleet: FleetView | None) -> None:
    """The onset, the first OOM and a first crash of no stated cause, each a dashed line; in a fleet the
    first crash's line names its replica (and what else falls at its time)."""
    crash = crash_summary(a.first_crash, a.bundle.events)
    unstated = None  # the first crash, where no OOM is stated before it: named as what it is, not 'OOM'
    if crash is not None and crash["t_us"] is not None and not crash["oom"] and (a.oom_us is None or crash["t_us"] < a.oom_us):
        unstated = crash["t_us"]
    lines = [(a.div.onset_us, "onset", "#ff7f0e"), (a.oom_us, "OOM", "#d62728"),
             (unstated, f"{crash['kind'] if crash else ''} (cause unstated)", "#8c564b")]
    first = fleet.reps.first if fleet else None
    if first is not None:
        with_it = [label for x, label, _ in lines if x == first.t_us]
        lines = [ln for ln in lines if ln[0] != first.t_us]
        lines.append((first.t_us, "; ".join([*with_it, f"first crash: {first.replica} ({first.what})"]), "#d62728"))
    for x, label, color in lines:
        if x is not None:
            fig.add_vline(x=x / 1e6, line_dash="dash", line_color=color)
            fig.add_annotation(x=x / 1e6, y=1.02, yref="paper", text=label, showarrow=False, font={"color": color})


def _image_lane(fig: go.Figure, img: pl.DataFrame, hits: pl.DataFrame, each: int) -> None:
    """The timeline's last lane: the image tokens in flight (the requests' images, a step at each send and
    finish), and vLLM's multimodal processor cache hits as a share of its queries (right axis)."""
    if img.height:
        d = minmax(img, "t_us", "image_tokens", max_points=each)
        fig.add_trace(go.Scatter(x=_xy(d["t_us"] / 1e6), y=_xy(d["image_tokens"]), name="image tokens in flight",
                                 mode="lines", line={"shape": "hv", "color": "#e377c2"}, fill="tozeroy"), row=5, col=1)
        fig.update_yaxes(title_text="tokens", row=5, col=1, secondary_y=False)
    for (src,), part in hits.partition_by("source", as_dict=True, maintain_order=True).items():
        d = minmax(part, "t_us", "hit_ratio", max_points=each)
        fig.add_trace(go.Scatter(x=_xy(d["t_us"] / 1e6), y=_xy(d["hit_ratio"] * 100),
                                 name=f"MM cache hits % ({src})", mode="lines", line={"color": "#17becf", "dash": "dot"}),
                      row=5, col=1, secondary_y=True)
    if hits.height:
        fig.update_yaxes(title_text="% hits", range=[0, 100], row=5, col=1, secondary_y=True)


def _timeline_series(a: Analysis, fleet: FleetView | None = None) -> int:
    """How many downsampled series the timeline draws (a GPU's actual memory counts twice where the gap
    to vLLM's accounting is drawn under it; a fleet's replicas each draw their KV in use and requests)."""
    gpus = a.gap["gpu"].n_unique() if a.gap.height else 0
    layers = a.layers.select("gpu", "layer").unique().height if a.layers.height else 0
    machines = a.machines["series"].n_unique() if a.machines_total else 0
    kv = a.kv["source"].n_unique() + 1 if a.kv.height else 0
    requests = 2
    if fleet is not None:
        kv_sources = a.kv["source"].unique().to_list() if a.kv.height else []
        kv = len(kv_sources) + len(fleet.attributed(kv_sources))
        requests = 2 * max(1, len(set(fleet.series.values())))
    return gpus * (2 if a.acc.accounted_bytes is not None else 1) + layers + machines + kv + requests


SWIMLANE_ROWS = 300  # requests drawn: the first to start (in the minute around the onset, where there is one)


def _swimlane_rows(rows: pl.LazyFrame, onset_us: int | None) -> pl.DataFrame:
    """The first SWIMLANE_ROWS requests to start (in file order among equal starts), the columns drawn.
    A day of a fleet's log holds tens of millions: the time of the last one kept is found on the time
    columns alone, then only rows that may start by it are read (a test on the columns themselves, which
    the Parquet reader checks against each row group's statistics), so no other id is read."""
    start, end = pl.coalesce("sent_us", "arrival_us"), pl.coalesce("finish_us", "sent_us", "arrival_us")
    window = pl.lit(True) if onset_us is None else (end >= onset_us - 30_000_000) & (start <= onset_us + 30_000_000)
    last = rows.filter(window).select(s=start).drop_nulls().bottom_k(SWIMLANE_ROWS, by="s").select(
        pl.col("s").max()).collect(engine="streaming").item()
    def drawn(lf: pl.LazyFrame) -> pl.LazyFrame:
        return lf.select("id", "input_tokens", "prompt_logprobs", "status", start=start, end=end)
    if last is None:
        return drawn(rows).clear().collect()
    maybe = (pl.col("sent_us") <= last) | (pl.col("arrival_us") <= last)  # (every row whose start is by ``last``)
    return drawn(rows.filter(maybe).filter(window & (start <= last))).collect().sort("start", maintain_order=True).head(SWIMLANE_ROWS)


def swimlane_figure(a: Analysis) -> go.Figure | None:
    rows = a.bundle.scan_requests()
    if rows.select(pl.len()).collect().item() == 0:
        return None
    r = _swimlane_rows(rows, a.div.onset_us)
    highlight = {i for at in a.attributions[:1] for i in at.near_ids}
    fig = go.Figure()
    for attributed in (False, True):
        d = r.filter(pl.col("id").is_in(list(highlight)) if attributed else ~pl.col("id").is_in(list(highlight)))
        if d.height == 0:
            continue
        fig.add_trace(go.Bar(
            y=d["id"].to_list(), x=_xy((d["end"] - d["start"]).clip(1000) / 1e6), base=_xy(d["start"] / 1e6),
            orientation="h", name="attributed to the onset" if attributed else "other requests",
            marker={"color": "#d62728" if attributed else "#aec7e8"},
            customdata=list(zip(d["input_tokens"].to_list(), d["prompt_logprobs"].to_list(), d["status"].to_list())),
            hovertemplate="%{y}: in %{customdata[0]} tok, prompt_logprobs %{customdata[1]}, %{customdata[2]}<extra></extra>"))
    if a.div.onset_us is not None:
        fig.add_vline(x=a.div.onset_us / 1e6, line_dash="dash", line_color="#ff7f0e")
    fig.update_layout(height=max(300, 14 * r.height + 120), barmode="overlay", template="plotly_white",
                      xaxis_title="seconds from t0", margin={"l": 120, "r": 20, "t": 30, "b": 40},
                      yaxis={"autorange": "reversed"})
    return plotly_safe(fig)


RUN_COLORS = ["#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


def aligned(analyses: list[Analysis]) -> tuple[TraceClock, list[Alignment]]:
    """The trace clock of the first bundle (production, or the first run) and each bundle's alignment onto it."""
    main = analyses[0].bundle
    others = [a.bundle for a in analyses[1:]]
    clock = trace_clock(main, [b for b in others if b.meta.kind == "replay"])
    return clock, [align(main, b) for b in [main, *others]]


def _trace_x(t: pl.Series, al: Alignment, clock: TraceClock, own_first: int | None) -> npt.NDArray[np.float64]:
    """Times of a run's clock as trace seconds; a run that cannot be aligned has its first request at 0."""
    if al.offset_us is None:
        return _xy((t - (own_first or 0)) / 1e6)
    return _xy((t.cast(pl.Float64) * al.scale + al.offset_us - clock.origin_us) / 1e6)


def _trace_s(us: int | None, al: Alignment, clock: TraceClock, own_first: int | None) -> float | None:
    if us is None:
        return None
    if al.offset_us is None:
        return (us - (own_first or 0)) / 1e6
    return (al.scale * us + al.offset_us - clock.origin_us) / 1e6


def _short(a: Analysis) -> str:
    m = a.bundle.meta
    return f"{a.bundle.path.name}" + ("" if m.kind == "replay" else f" ({m.kind})")


def compare_figure(analyses: list[Analysis], clock: TraceClock | None = None, aligns: list[Alignment] | None = None) -> go.Figure:
    """Every run on one trace-aligned timeline: its actual memory (solid), what vLLM accounted for (dashed)
    and the KV cache in use (dotted, where the pool's size is known); vLLM's KV usage; and each run's OOMs,
    crashes, onset and starts on a lane of its own. Replays on a scale far from production's (a CPU host's
    process memory beside a GPU's) get an axis of their own, on the right."""
    if clock is None or aligns is None:
        clock, aligns = aligned(analyses)
    has_kv = any(a.kv.height for a in analyses)  # (vLLM's KV usage: a row where any run has it)
    ev_row = 3 if has_kv else 2
    fig = make_subplots(rows=ev_row, cols=1, shared_xaxes=True, vertical_spacing=0.05,
                        row_heights=[0.6, 0.2, 0.2] if has_kv else [0.75, 0.25],
                        specs=[[{"secondary_y": True}], *([[{}]] if has_kv else []), [{}]],
                        subplot_titles=("Memory on trace time: actual (solid), vLLM's accounting (dashed), KV in use (dotted)",
                                        *(["KV cache usage (vLLM's view)"] if has_kv else []), "OOMs, crashes, onsets and starts"))
    peaks = [float(a.gap["actual_bytes"].max()) if a.gap.height else None for a in analyses]  # type: ignore[arg-type]
    main_peak, other = peaks[0], [p for p in peaks[1:] if p]
    split = bool(main_peak and other and analyses[0].bundle.meta.kind == "production"
                 and (max(other) * 8 < main_peak or max(other) > 8 * main_peak))
    lane: list[str] = []
    span: list[float] = []  # (the trace times of memory, crashes and onsets: the view opens on them, not on starts)
    each = points_each(sum(2 + (a.kv["source"].n_unique() if a.kv.height else 0) for a in analyses))
    for i, (a, al) in enumerate(zip(analyses, aligns)):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        first = first_arrival(a.bundle) if al.offset_us is None else None
        name = _short(a) + ("" if al.offset_us is not None else " (not aligned: its first request at 0)")
        lane.append(name)
        right = split and i > 0
        if a.gap.height:
            per_t = a.gap.group_by("t_us").agg(pl.col("actual_bytes").max()).sort("t_us")  # (the fullest GPU)
            keep = [x for x in (a.div.onset_us, a.div.max_gap_us, a.oom_us) if x is not None]
            d = minmax(per_t, "t_us", "actual_bytes", max_points=each, keep=keep)
            xs = _trace_x(d["t_us"], al, clock, first)
            span += [xs[0], xs[-1]]
            fig.add_trace(go.Scatter(x=xs, y=_xy(d["actual_bytes"] / GiB), mode="lines", legendgroup=name,
                                     name=f"{name}: actual ({a.actual_source})", line={"color": color, "width": 2}),
                          row=1, col=1, secondary_y=right)
            if a.acc.accounted_bytes is not None:
                fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[a.acc.accounted_bytes / GiB] * 2, mode="lines", legendgroup=name,
                                         name=f"{name}: accounted by vLLM" + (" (estimated)" if a.acc.estimated else ""),
                                         line={"color": color, "dash": "dash", "width": 1.5}), row=1, col=1, secondary_y=right)
        kvu = a.kv.filter(pl.col("kv_used_bytes").is_not_null()) if a.kv.height else a.kv
        if kvu.height:
            d = minmax(kvu.sort("t_us"), "t_us", "kv_used_bytes", max_points=each)
            fig.add_trace(go.Scatter(x=_trace_x(d["t_us"], al, clock, first), y=_xy(d["kv_used_bytes"] / GiB),
                                     mode="lines", legendgroup=name, name=f"{name}: KV in use (vLLM)",
                                     line={"color": color, "dash": "dot", "width": 1}), row=1, col=1, secondary_y=right)
        for src, part in a.kv.partition_by("source", as_dict=True).items() if a.kv.height else []:
            d = minmax(part.sort("t_us"), "t_us", "kv_usage_ratio", max_points=each)
            fig.add_trace(go.Scatter(x=_trace_x(d["t_us"], al, clock, first), y=_xy(d["kv_usage_ratio"] * 100),
                                     mode="lines", legendgroup=name, showlegend=False, name=f"{name}: KV usage % ({src[0]})",
                                     line={"color": color, "width": 1}), row=2, col=1)
        marks: list[tuple[int, str, str, str]] = []  # (t, what, symbol, marker colour)
        for e in a.bundle.events:
            if e.get("t_us") is not None and e.get("kind") in (*DOWN_KINDS, *OOM_STATED):
                stated = e["kind"] in OOM_STATED
                marks.append((e["t_us"], f"{e['kind']} @ {e.get('source')}" + ("" if stated else " (no OOM stated)"),
                              "x" if stated else "square", "#d62728" if stated else "#8c564b"))
        if a.div.onset_us is not None:
            marks.append((a.div.onset_us, "divergence onset", "triangle-up", "#ff7f0e"))
        span += [x for x in (_trace_s(t, al, clock, first) for t, *_ in marks) if x is not None]
        marks += [(st.t_us, f"engine {st.label}" + (f" after {st.after}" if st.after else ""), "circle",
                   "#9467bd" if st.restart else "#2ca02c") for st in starts(a.bundle.events)]
        if marks:
            fig.add_trace(go.Scatter(x=[_trace_s(t, al, clock, first) for t, *_ in marks], y=[name] * len(marks),
                                     mode="markers", showlegend=False, name=name, text=[w for _, w, *_ in marks],
                                     marker={"symbol": [m for *_, m, _ in marks], "color": [c for *_, c in marks], "size": 10,
                                             "line": {"width": 1, "color": color}},
                                     meta=name, hovertemplate="%{text}<extra>%{meta}</extra>"), row=ev_row, col=1)
    fig.update_yaxes(title_text="GiB" + (f", {analyses[0].bundle.path.name}" if split else ""), row=1, col=1, secondary_y=False)
    if split:
        fig.update_yaxes(title_text="GiB, replays", row=1, col=1, secondary_y=True)
    if has_kv:
        fig.update_yaxes(title_text="%", row=2, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=lane[::-1], row=ev_row, col=1)
    fig.update_xaxes(title_text=f"trace time (s): {clock.note}", row=ev_row, col=1)
    if span and max(span) > min(span):
        pad = 0.03 * (max(span) - min(span))
        fig.update_xaxes(range=[min(span) - pad, max(span) + pad])
    fig.update_layout(height=720, template="plotly_white", hovermode="closest", legend={"orientation": "h", "y": -0.15},
                      margin={"l": 60, "r": 60, "t": 40, "b": 40})
    return plotly_safe(fig)


def _label(a: Analysis) -> str:
    m = a.bundle.meta
    args = ", ".join(f"{k}={v}" for k, v in sorted(m.engine_args.items()) if k in ("gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs"))
    return f"{a.bundle.path.name}: vLLM {m.vllm_version or m.vllm_version_inferred or '?'}" + (f" ({args})" if args else "")


def compare_rows(analyses: list[Analysis], clock: TraceClock | None = None, aligns: list[Alignment] | None = None) -> list[dict[str, Any]]:
    """One row per run, on trace time (each run aligned onto the first bundle: ``aligned``), differences
    against the first run. A crash without an OOM line is said to be a crash, not an OOM."""
    if clock is None or aligns is None:
        clock, aligns = aligned(analyses)
    rows: list[dict[str, Any]] = []
    for a, al in zip(analyses, aligns):
        s = a.summary()
        peak, gap = s["peak_actual_gib"], s["max_gap_gib"]
        base = rows[0] if rows else {"peak_gib": peak, "max_gap_gib": gap}
        first = first_arrival(a.bundle) if al.offset_us is None else None

        def trace(us: int | None, al: Alignment = al, first: int | None = first) -> str | None:
            t = _trace_s(us, al, clock, first)
            return None if t is None else trace_hms(int(round(t * 1e6)))
        kinds = sorted({str(e.get("kind")) for e in a.bundle.events if e.get("kind") in OOM_STATED})
        crash = s["crash"]
        if kinds:
            oom_label = f"yes: {', '.join(kinds)}, first at trace {trace(a.oom_us)}"
        elif crash is not None:
            oom_label = (f"no OOM stated; {crash['what']} at trace {trace(crash['t_us'])}"
                         + ("" if crash["cause_stated"] else " (cause unstated)"))
        else:
            oom_label = "no"
        rows.append({"label": _label(a), "peak_gib": peak, "max_gap_gib": gap,
                     "delta_peak_gib": None if peak is None or base["peak_gib"] is None else round(peak - base["peak_gib"], 3),
                     "delta_gap_gib": None if gap is None or base["max_gap_gib"] is None else round(gap - base["max_gap_gib"], 3),
                     "oomed": bool(kinds), "oom_label": oom_label,
                     "onset_s": s["onset_s"], "onset_trace": trace(a.div.onset_us),
                     "onset_trace_s": None if a.div.onset_us is None else round(_trace_s(a.div.onset_us, al, clock, first) or 0.0, 3),
                     "aligned": al.method.replace("_", " ") if al.method != "reference" else "(reference)",
                     "aligned_note": al.note, "outcome": a.bundle.meta.extra.get("outcome")})
    return rows


def verdict_rows(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """The verdicts as the report's rows: the run, its verdict in words, and its evidence."""
    lines = verdict_lines(verdicts)
    return [{"run": v.run, "version": v.version, "line": line, "evidence": v.evidence,
             "cls": "high" if v.reproduced else "low" if v.reproduced is None else "medium"}
            for v, line in zip(verdicts, lines)]


def render(analyses: list[Analysis]) -> str:
    main = analyses[0]
    b = main.bundle
    figs: list[tuple[str, str, go.Figure]] = [("timeline", "Memory timeline", timeline_figure(main))]
    sw = swimlane_figure(main)
    if sw is not None:
        figs.append(("swimlane", "Requests around the onset", sw))
    clock, aligns = aligned(analyses) if len(analyses) > 1 else (None, None)
    if len(analyses) > 1:
        title = ("Production beside its replays, on trace time" if b.meta.kind == "production"
                 and any(a.bundle.meta.kind == "replay" for a in analyses[1:]) else "Comparison across versions / configs")
        figs.append(("compare", title, compare_figure(analyses, clock, aligns)))
    replays = [a for a in analyses[1:] if a.bundle.meta.kind == "replay"]
    verdicts = verdicts_of(main, replays) if b.meta.kind == "production" and replays else []
    t0 = None
    if b.meta.t0_utc:
        try:
            t0 = datetime.fromisoformat(b.meta.t0_utc.replace("Z", "+00:00"))
        except ValueError:
            t0 = None

    def utc(us: int | None) -> str:
        if us is None:
            return "—"
        return (t0 + timedelta(microseconds=us)).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" if t0 else f"{us / 1e6:.3f} s"

    fleet = replicas(b)  # (a bundle of several replicas: which crashed first, in the summary)
    tmpl = _ENV.get_template("report.html")
    return tmpl.render(
        title=f"replay report: {b.path.name}", version=__version__, meta=b.meta, summary=main.summary(),
        findings=main.findings, fleet=fleet if len(fleet.names) > 1 else None,
        inputs=[{"path": i.get("path"), "kind": i.get("kind"), "sha256": i.get("sha256") or "",
                 "lines": i.get("lines_read", i.get("requests")), "parsed": i.get("parsed"),
                 "quarantined": i.get("quarantined"), "notes": i.get("notes") or []} for i in b.meta.inputs],
        quarantine=b.quarantine_count,
        figures=[(fid, title, _safe_json(json.loads(f.to_json()))) for fid, title, f in figs],
        plotly_js=get_plotlyjs(), compare=compare_rows(analyses, clock, aligns) if len(analyses) > 1 else None,
        verdicts=verdict_rows(verdicts), unjudged=main.unjudged,
        utc=utc, events=[e for e in b.events if not str(e.get("kind", "")).startswith("request_")][:400],
        at_crash=crash_line(b.events),
        generated=datetime.now().astimezone().isoformat(timespec="seconds"),
    )


def part_size(path: Path) -> int:
    return path.stat().st_size


def write_report(bundle: Path, compare: list[Path], out: Path) -> int:
    analyses = [analysis_of(p) for p in [bundle, *compare]]
    html = render(analyses)
    with written_in_place(out) as part:  # (the last report stays whole until this one is)
        # (a file name that is not UTF-8 reaches the text as surrogates: written as escapes, not a failure)
        part.write_text(html, encoding="utf-8", errors="backslashreplace")
    return part_size(out)
