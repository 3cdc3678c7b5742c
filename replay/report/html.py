"""The self-contained HTML report: plotly figures with plotly.js inlined, data embedded as JSON,
rendered from jinja2 templates. Everything from logs and prompts is escaped."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jinja2
import plotly.graph_objects as go
import polars as pl
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from replay import __version__
from replay.analysis.memory import stacked_parts, unchosen
from replay.analysis.outages import DOWN_KINDS, crash_line
from replay.analysis.pipeline import Analysis, analyze_bundle
from replay.bundle import read_bundle
from replay.report.downsample import minmax
from replay.units import GiB

# the events drawn in the timeline's crash lane: what took the engine down, and the GPU errors behind it
CRASH_LANE = (*DOWN_KINDS, "gpu_xid", "cuda_error", "collective_timeout")

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("replay.report", "templates"),
                          autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined)


def _safe_json(obj: Any) -> str:
    """JSON for inside <script>: '<', '>' and '&' escaped so no data can close the script tag."""
    return json.dumps(obj, sort_keys=True, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _s(us: int | float | None) -> float | None:
    return None if us is None else us / 1e6


def timeline_figure(a: Analysis) -> go.Figure:
    b = a.bundle
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        row_heights=[0.5, 0.17, 0.17, 0.16],
                        subplot_titles=("Memory: actual vs vLLM's accounting", "KV cache usage (vLLM's view)",
                                        "Requests running / waiting", "Events"))
    keep = [x for x in (a.div.onset_us, a.oom_us, a.div.max_gap_us) if x is not None]
    parts = stacked_parts(a.acc)
    part_colors = ["#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c"]
    multi = len(b.meta.gpus) > 1
    for gpu, part in a.gap.partition_by("gpu", as_dict=True, maintain_order=True).items() if a.gap.height else []:
        d = minmax(part, "t_us", "actual_bytes", keep=keep)
        xs = (d["t_us"] / 1e6).to_list()
        suffix = f" GPU {gpu[0]}" if multi else ""
        # vLLM's accounting, stacked part by part (the parts it logged at startup)
        for i, (name, val) in enumerate(parts):
            fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[val / GiB] * 2, name=f"accounted: {name}{suffix}", mode="lines",
                                     stackgroup=f"acc{gpu[0]}", line={"width": 0.5, "color": part_colors[i % 6]},
                                     legendgroup="accounted", hovertemplate=f"{name}: %{{y:.2f}} GiB<extra></extra>"),
                          row=1, col=1)
        if a.acc.accounted_bytes is not None:
            acc = a.acc.accounted_bytes / GiB
            fig.add_trace(go.Scatter(x=xs, y=[acc] * len(xs), name="accounted by vLLM" + (" (estimated)" if a.acc.estimated else ""),
                                     mode="lines", line={"color": "#1f77b4", "dash": "dash" if a.acc.estimated else "solid"}), row=1, col=1)
            fig.add_trace(go.Scatter(x=xs, y=[max(v, acc) for v in (d["actual_bytes"] / GiB).to_list()], name="gap (unaccounted)",
                                     mode="lines", line={"width": 0}, fill="tonexty", fillcolor="rgba(214,39,40,0.25)",
                                     showlegend=True, hoverinfo="skip"), row=1, col=1)
        label = f"actual ({a.actual_source})" + suffix
        fig.add_trace(go.Scatter(x=xs, y=(d["actual_bytes"] / GiB).to_list(), name=label,
                                 mode="lines", line={"color": "#d62728", "width": 2.5}), row=1, col=1)
        # the other measured layers of actual memory (torch reserved/allocated, this process, other processes)
        lay = a.layers.filter(pl.col("gpu") == gpu[0]) if a.layers.height else a.layers
        for j, (layer, lp) in enumerate(lay.partition_by("layer", as_dict=True, maintain_order=True).items() if lay.height else []):
            src = f"{lp['source'][0]}:{lp['layer'][0]}"
            if a.actual_source and a.actual_source.split(":")[0] == lp["source"][0] and layer[0] in ("device used", "engine process tree (RSS)"):
                continue  # already drawn as "actual"
            ld = minmax(lp.sort("t_us"), "t_us", "value_bytes", keep=keep)
            fig.add_trace(go.Scatter(x=(ld["t_us"] / 1e6).to_list(), y=(ld["value_bytes"] / GiB).to_list(),
                                     name=f"measured: {layer[0]}{suffix}", mode="lines",
                                     line={"dash": ["dot", "dashdot", "longdash", "dash"][j % 4], "width": 1.5},
                                     hovertemplate=f"{src}: %{{y:.2f}} GiB<extra></extra>"), row=1, col=1)
    # device memory of several machines, none of them chosen as the bundle's: each drawn, none called actual
    for j, ((series,), mp) in enumerate(a.machines.partition_by("series", as_dict=True, maintain_order=True).items()
                                        if a.machines_total else []):
        md = minmax(mp, "t_us", "value_bytes", keep=keep)
        fig.add_trace(go.Scatter(x=(md["t_us"] / 1e6).to_list(), y=(md["value_bytes"] / GiB).to_list(),
                                 name=f"device used, {series}", mode="lines", legendgroup="machines",
                                 line={"width": 1.5, "dash": ["solid", "dot", "dash", "dashdot"][j % 4]},
                                 hovertemplate=f"{series}: %{{y:.2f}} GiB<extra></extra>"), row=1, col=1)
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
        d = minmax(kvu.sort("t_us"), "t_us", "kv_used_bytes")
        fig.add_trace(go.Scatter(x=(d["t_us"] / 1e6).to_list(), y=((d["kv_used_bytes"] + below) / GiB).to_list(),
                                 name="KV in use (inside the pool)", mode="lines", line={"color": "#08306b", "dash": "dot"}),
                      row=1, col=1)
    for line_name, level, color in (("budget", a.acc.budget_bytes, "#2ca02c"), ("capacity", a.acc.total_bytes, "#000000")):
        if level is not None and level != a.acc.accounted_bytes:
            fig.add_hline(y=level / GiB, line_dash="dot", line_color=color, annotation_text=line_name, row=1, col=1)
    for kv_src, part in a.kv.partition_by("source", as_dict=True).items() if a.kv.height else []:
        d = minmax(part, "t_us", "kv_usage_ratio")
        fig.add_trace(go.Scatter(x=(d["t_us"] / 1e6).to_list(), y=(d["kv_usage_ratio"] * 100).to_list(),
                                 name=f"KV usage % ({kv_src[0]})", mode="lines"), row=2, col=1)
    s = b.samples
    for metric, color in (("requests_running", "#9467bd"), ("requests_waiting", "#8c564b")):
        d = s.filter(pl.col("metric") == metric)
        if d.height:
            src = d["source"][0]
            d = minmax(d.filter(pl.col("source") == src).sort("t_us"), "t_us", "value")
            fig.add_trace(go.Scatter(x=(d["t_us"] / 1e6).to_list(), y=d["value"].to_list(), name=metric.replace("_", " "),
                                     mode="lines", line={"shape": "hv", "color": color}), row=3, col=1)
    lanes = {"startup": 0, "preemption": 1, "oom": 2, "restart": 3, "k8s": 4}
    ev_x, ev_y, ev_t, ev_c = [], [], [], []
    for e in b.events:
        if e.get("t_us") is None:
            continue
        k = e["kind"]
        lane = ("oom" if k in CRASH_LANE else
                "preemption" if k == "preemption" else "restart" if k in ("engine_start", "restart_count") else
                "k8s" if k.startswith("k8s") else "startup")
        if k.startswith("request_"):
            continue
        ev_x.append(e["t_us"] / 1e6)
        ev_y.append(lane)
        ev_t.append(f"{k} @ {e.get('source')}")
        ev_c.append({"oom": "#d62728", "preemption": "#ff7f0e"}.get(lane, "#7f7f7f"))
    if ev_x:
        fig.add_trace(go.Scatter(x=ev_x, y=ev_y, mode="markers", marker={"size": 9, "color": ev_c, "symbol": "diamond"},
                                 text=ev_t, hovertemplate="%{text}<extra></extra>", name="events"), row=4, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=list(lanes), row=4, col=1)
    for x, label, color in ((a.div.onset_us, "onset", "#ff7f0e"), (a.oom_us, "OOM", "#d62728")):
        if x is not None:
            fig.add_vline(x=x / 1e6, line_dash="dash", line_color=color)
            fig.add_annotation(x=x / 1e6, y=1.02, yref="paper", text=label, showarrow=False, font={"color": color})
    fig.update_yaxes(title_text="GiB", row=1, col=1)
    fig.update_yaxes(title_text="%", row=2, col=1)
    fig.update_xaxes(title_text=f"seconds from t0 ({b.meta.t0_utc or 'unknown'})", row=4, col=1)
    fig.update_layout(height=900, hovermode="x unified", legend={"orientation": "h", "y": -0.08},
                      margin={"l": 60, "r": 20, "t": 40, "b": 40}, template="plotly_white")
    return fig


def swimlane_figure(a: Analysis) -> go.Figure | None:
    rows = a.bundle.scan_requests()
    if rows.select(pl.len()).collect().item() == 0:
        return None
    highlight = {i for at in a.attributions[:1] for i in at.near_ids}
    # (the first 300 as a query on the columns drawn: sorting the whole frame copied a day of log's
    # millions of requests, every column, to keep 300)
    lf = rows.select("id", "input_tokens", "prompt_logprobs", "status", start=pl.coalesce("sent_us", "arrival_us"),
                         end=pl.coalesce("finish_us", "sent_us", "arrival_us"))
    if a.div.onset_us is not None:
        lo, hi = a.div.onset_us - 30_000_000, a.div.onset_us + 30_000_000
        lf = lf.filter((pl.col("end") >= lo) & (pl.col("start") <= hi))
    r = lf.sort("start", maintain_order=True).head(300).collect()
    fig = go.Figure()
    for attributed in (False, True):
        d = r.filter(pl.col("id").is_in(list(highlight)) if attributed else ~pl.col("id").is_in(list(highlight)))
        if d.height == 0:
            continue
        fig.add_trace(go.Bar(
            y=d["id"].to_list(), x=((d["end"] - d["start"]).clip(1000) / 1e6).to_list(), base=(d["start"] / 1e6).to_list(),
            orientation="h", name="attributed to the onset" if attributed else "other requests",
            marker={"color": "#d62728" if attributed else "#aec7e8"},
            customdata=list(zip(d["input_tokens"].to_list(), d["prompt_logprobs"].to_list(), d["status"].to_list())),
            hovertemplate="%{y}: in %{customdata[0]} tok, prompt_logprobs %{customdata[1]}, %{customdata[2]}<extra></extra>"))
    if a.div.onset_us is not None:
        fig.add_vline(x=a.div.onset_us / 1e6, line_dash="dash", line_color="#ff7f0e")
    fig.update_layout(height=max(300, 14 * r.height + 120), barmode="overlay", template="plotly_white",
                      xaxis_title="seconds from t0", margin={"l": 120, "r": 20, "t": 30, "b": 40},
                      yaxis={"autorange": "reversed"})
    return fig


def compare_figure(analyses: list[Analysis]) -> go.Figure:
    fig = go.Figure()
    for a in analyses:
        first = _first_arrival(a)
        d = minmax(a.gap, "t_us", "actual_bytes") if a.gap.height else a.gap
        if d.height:
            fig.add_trace(go.Scatter(x=((d["t_us"] - first) / 1e6).to_list(), y=(d["actual_bytes"] / GiB).to_list(),
                                     mode="lines", name=_label(a)))
    fig.update_layout(height=420, template="plotly_white", xaxis_title="trace time (s, aligned on the first request)",
                      yaxis_title="actual memory (GiB)", margin={"l": 60, "r": 20, "t": 30, "b": 40})
    return fig


def _label(a: Analysis) -> str:
    m = a.bundle.meta
    args = ", ".join(f"{k}={v}" for k, v in sorted(m.engine_args.items()) if k in ("gpu_memory_utilization", "kv_cache_memory_bytes", "max_num_seqs"))
    return f"{a.bundle.path.name}: vLLM {m.vllm_version or m.vllm_version_inferred or '?'}" + (f" ({args})" if args else "")


def _first_arrival(a: Analysis) -> int:
    v = a.bundle.scan_requests().select(pl.col("arrival_us").min()).collect().item()
    return int(v) if v is not None else 0


def compare_rows(analyses: list[Analysis]) -> list[dict[str, Any]]:
    """One row per run, aligned on trace time (the first request), differences against the first run."""
    rows: list[dict[str, Any]] = []
    for a in analyses:
        s = a.summary()
        peak, gap = s["peak_actual_gib"], s["max_gap_gib"]
        base = rows[0] if rows else {"peak_gib": peak, "max_gap_gib": gap}
        kinds = sorted({str(e.get("kind")) for e in a.ooms})
        onset = a.div.onset_us
        rows.append({"label": _label(a), "peak_gib": peak, "max_gap_gib": gap,
                     "delta_peak_gib": None if peak is None or base["peak_gib"] is None else round(peak - base["peak_gib"], 3),
                     "delta_gap_gib": None if gap is None or base["max_gap_gib"] is None else round(gap - base["max_gap_gib"], 3),
                     "oomed": bool(a.ooms), "oom_label": ("yes: " + ", ".join(kinds)) if kinds else "no",
                     "onset_s": s["onset_s"],
                     "onset_trace_s": None if onset is None else round((onset - _first_arrival(a)) / 1e6, 3),
                     "outcome": a.bundle.meta.extra.get("outcome")})
    return rows


def render(analyses: list[Analysis]) -> str:
    main = analyses[0]
    b = main.bundle
    figs: list[tuple[str, str, go.Figure]] = [("timeline", "Memory timeline", timeline_figure(main))]
    sw = swimlane_figure(main)
    if sw is not None:
        figs.append(("swimlane", "Requests around the onset", sw))
    if len(analyses) > 1:
        figs.append(("compare", "Comparison across versions / configs", compare_figure(analyses)))
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

    tmpl = _ENV.get_template("report.html")
    return tmpl.render(
        title=f"replay report: {b.path.name}", version=__version__, meta=b.meta, summary=main.summary(),
        findings=main.findings,
        inputs=[{"path": i.get("path"), "kind": i.get("kind"), "sha256": i.get("sha256") or "",
                 "lines": i.get("lines_read", i.get("requests")), "parsed": i.get("parsed"),
                 "quarantined": i.get("quarantined"), "notes": i.get("notes") or []} for i in b.meta.inputs],
        quarantine=b.quarantine_count,
        figures=[(fid, title, _safe_json(json.loads(f.to_json()))) for fid, title, f in figs],
        plotly_js=get_plotlyjs(), compare=compare_rows(analyses) if len(analyses) > 1 else None,
        utc=utc, events=[e for e in b.events if not str(e.get("kind", "")).startswith("request_")][:400],
        at_crash=crash_line(b.events),
        generated=datetime.now().astimezone().isoformat(timespec="seconds"),
    )


def write_report(bundle: Path, compare: list[Path], out: Path) -> int:
    analyses = [analyze_bundle(read_bundle(p)) for p in [bundle, *compare]]
    html = render(analyses)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return len(html.encode())
