"""The report of a fleet: 64 GPUs and 8 replicas' vLLM metrics, downsampled to a bounded size with every
series' peaks, troughs and the divergence's peak kept."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from replay.analysis.pipeline import analyze_bundle
from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.report.downsample import FIGURE_POINTS, LANE_MARKS, minmax, points_each, thin_marks
from replay.report.html import write_report
from replay.units import GiB
from tests.unit.report_helpers import page_specs

GPUS, REPLICAS = 64, 8
PREEMPTIONS = 20_000
SECONDS = 3 * 3600  # at 1 s: 0.7 M samples of device memory (a fleet's day is 5.5 M)


def _fleet_bundle(path: Path) -> Path:
    meta = BundleMeta(kind="production", t0_utc="2026-05-01T00:00:00Z", engine_args={"gpu_memory_utilization": 0.9},
                      gpus=[{"index": i, "total_bytes": 141 * 2**30} for i in range(GPUS)])
    w = BundleWriter(path, meta)
    t = pl.int_range(0, SECONDS, eager=True).cast(pl.Int64) * 1_000_000
    for g in range(GPUS):
        wave = 90 * 2**30 + ((t // 1_000_000 * (13 + g)) % 7919) * 2**20  # (each GPU its own ripple)
        if g == 5:  # one GPU's spike and another's trough: single samples that averaging would lose
            wave = pl.select(pl.when(t == 9_876_000_000).then(139 * 2**30).otherwise(wave)).to_series()
        if g == 9:
            wave = pl.select(pl.when(t == 777_000_000).then(1 * 2**30).otherwise(wave)).to_series()
        w.samples_frame(pl.DataFrame({"t_us": t, "gpu": [g] * SECONDS, "source": ["dcgm"] * SECONDS,
                                      "metric": ["device_used_bytes"] * SECONDS, "value": wave.cast(pl.Float64)}))
    tk = pl.int_range(0, SECONDS // 15, eager=True).cast(pl.Int64) * 15_000_000
    for r in range(REPLICAS):
        n = tk.len()
        for metric, values in (("kv_usage_ratio", ((tk // 15_000_000 * (7 + r)) % 100) / 100),
                               ("requests_running", ((tk // 15_000_000 + r) % 40).cast(pl.Float64)),
                               ("requests_waiting", ((tk // 15_000_000 * 3 + r) % 9).cast(pl.Float64))):
            w.samples_frame(pl.DataFrame({"t_us": tk, "gpu": [None] * n, "source": [f"vllm-metrics[instance=vllm-{r}]"] * n,
                                          "metric": [metric] * n, "value": values}, schema_overrides={"gpu": pl.Int64}))
    w.event({"t_us": 0, "kind": "memory_profile", "weights_gib": 40.0, "non_torch_gib": 1.0,
             "activation_peak_gib": 4.0, "kv_cache_gib": 80.0, "source": "vllm-0.log:1"})
    for i in range(PREEMPTIONS):  # (a busy fleet's preemption warnings, and three engines' deaths)
        w.event({"t_us": i * (SECONDS * 1_000_000 // PREEMPTIONS), "kind": "preemption", "source": f"vllm-{i % REPLICAS}.log:{i}",
                 "mode": "RECOMPUTE", "cumulative": i})
    for r in (1, 4, 6):
        w.event({"t_us": (3000 + r) * 1_000_000, "kind": "engine_death", "source": f"vllm-{r}.log:9", "message": "EngineDeadError"})
    w.close()
    return path


def _traces(html: str) -> list[dict[str, Any]]:
    return [t for spec in page_specs(html) for t in spec["data"]]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("fleet")
    bundle = _fleet_bundle(root / "fleet.bundle")
    size = write_report(bundle, [], root / "fleet.html")
    html = (root / "fleet.html").read_text()
    assert size == len(html.encode())
    return bundle, html, _traces(html)


def test_a_fleets_report_stays_small(fleet: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """64 GPUs' series and 8 replicas' metrics: the figures hold FIGURE_POINTS points or so in
    all, whatever the number of series; the page (plotly.js is 4.6 MB of it) stays under 15 MB."""
    _, html, traces = fleet
    assert len(html.encode()) < 15_000_000
    assert all(isinstance(t.get("x", []), list) for t in traces)  # (plotly's typed arrays read as lists)
    drawn = sum(len(t.get("x", [])) for t in traces)
    assert 0.5 * FIGURE_POINTS < drawn < 1.3 * FIGURE_POINTS, drawn
    assert sum(1 for t in traces if str(t.get("name", "")).startswith("actual")) == GPUS


def test_every_series_keeps_its_peak_and_trough(fleet: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """Each GPU's highest and lowest sample (a one-second spike to 139 GiB, a dip to 1 GiB), each
    replica's KV usage and running requests at their extremes, and the divergence's peak moment are
    in the drawn points, at their times."""
    bundle, _, traces = fleet
    a = analyze_bundle(read_bundle(bundle))
    by_name = {t["name"]: t for t in traces if "name" in t}
    for (gpu,), part in a.gap.partition_by("gpu", as_dict=True).items():
        t = by_name[f"actual ({a.actual_source}) GPU {gpu}"]
        for pick in (pl.col("actual_bytes").arg_max(), pl.col("actual_bytes").arg_min()):
            row = part.row(int(part.select(pick).item()), named=True)
            at = t["x"].index(row["t_us"] / 1e6)
            assert t["y"][at] == pytest.approx(row["actual_bytes"] / GiB), (gpu, row)
    assert max(by_name[f"actual ({a.actual_source}) GPU 5"]["y"]) == pytest.approx(139.0)
    assert min(by_name[f"actual ({a.actual_source}) GPU 9"]["y"]) == pytest.approx(1.0)
    assert a.div.max_gap_us is not None
    peak_gpu = int(a.gap.filter(pl.col("t_us") == a.div.max_gap_us)["gpu"][0])
    assert a.div.max_gap_us / 1e6 in by_name[f"actual ({a.actual_source}) GPU {peak_gpu}"]["x"]
    s = read_bundle(bundle).samples
    for name, metric, scale in (("KV usage % (vllm-metrics[instance=vllm-3])", "kv_usage_ratio", 100),
                                ("requests running", "requests_running", 1)):
        src = "vllm-metrics[instance=vllm-3]" if metric == "kv_usage_ratio" else "vllm-metrics[instance=vllm-0]"
        col = s.filter((pl.col("metric") == metric) & (pl.col("source") == src))["value"]
        ys = by_name[name]["y"]
        assert max(ys) == pytest.approx(col.max() * scale) and min(ys) == pytest.approx(col.min() * scale)


def test_a_lane_of_many_marks_is_thinned_and_crashes_never(fleet: tuple[Path, str, list[dict[str, Any]]]) -> None:
    """20,000 preemptions are drawn as at most LANE_MARKS marks that count them all; each engine's death
    is drawn."""
    _, _, traces = fleet
    ev = next(t for t in traces if t.get("name") == "events")
    lanes = [(y, txt) for y, txt in zip(ev["y"], ev["text"], strict=True)]
    pre = [txt for y, txt in lanes if y == "preemption"]
    assert len(pre) <= LANE_MARKS
    assert sum(1 + int(m.group(1)) if (m := re.search(r"and (\d+) more", txt)) else 1 for txt in pre) == PREEMPTIONS
    assert sorted(txt for y, txt in lanes if y == "crash / OOM") == [f"engine_death @ vllm-{r}.log:9" for r in (1, 4, 6)]


def test_thin_marks_keeps_the_first_of_each_stretch() -> None:
    assert thin_marks([1.0, 2.0, 3.0], most=5) == [(0, 1), (1, 1), (2, 1)]
    got = thin_marks([float(i) for i in range(100)], most=10)
    assert len(got) == 10 and sum(n for _, n in got) == 100 and got[0] == (0, 10)


def test_points_each_shares_the_figures_budget() -> None:
    assert points_each(1) == 4000 and points_each(64 * 3) * 64 * 3 <= FIGURE_POINTS
    assert points_each(10_000) >= 200  # (a floor: a series is never a handful of points)


def test_minmax_keeps_each_buckets_extremes_and_the_marks() -> None:
    n = 50_000
    df = pl.DataFrame({"t": list(range(n)), "v": [float((i * 7919) % 1000) for i in range(n)]})
    d = minmax(df, "t", "v", max_points=500, keep=[31_337])
    assert d.height <= 520 and 31_337 in d["t"].to_list()
    assert d["v"].max() == df["v"].max() and d["v"].min() == df["v"].min()
    assert d["t"].is_sorted() and d["t"][0] == 0 and d["t"][-1] == n - 1
