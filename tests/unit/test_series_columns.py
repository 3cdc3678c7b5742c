"""Exported series (a query_range export, VictoriaMetrics' export, Grafana's data frames) of the usual
shape are read as columns, with the same samples, quarantine and notes as point by point; a cluster's
export records alike by either route, each node's GPUs a series of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import read_bundle
from replay.record import common, dcgm, prometheus
from replay.record.recorder import RecordOptions, _set_aside_impossible_times, record

_POINTS = st.one_of(
    st.tuples(st.integers(1_700_000_000, 1_800_000_000), st.integers(0, 10**6).map(str)).map(list),
    st.tuples(st.floats(1.7e9, 1.8e9), st.sampled_from(["1", "2.5", "-0", ".5", "5.", "1e3", "+5", "1E-2"])).map(list),
    st.tuples(st.integers(1_700_000_000, 1_800_000_000), st.floats(0, 1e12) | st.integers(0, 10**12)),
    st.sampled_from([[1.7e9, None], [1.7e9, "NaN"], [1.7e9, "+Inf"], ["1.7e9", "1"], [True, "1"], [1.7e9], [1.7e9, "1_000"],
                     [1.7e9, " 5"], [1e300, "1"], [float("inf"), "1"], [1.7e9, "1e400"], [1.7e9, True], "ab", None,
                     [1.7e9, 10**400], [2**70, "1"], (1.7e9, "2"), [1.7e9, float("nan")], [-1.7e9, "3"]]))


@settings(max_examples=300, deadline=None)
@example([[1.7e9, None]], 1000, True, "DCGM_FI_DEV_FB_USED")  # (gaps alone: no sample, and no GPU told of)
@given(st.lists(_POINTS, max_size=40), st.sampled_from([1000, 1_000_000]), st.booleans(),
       st.sampled_from(["DCGM_FI_DEV_FB_USED", "vllm:num_requests_running", "node_memory", ""]))
def test_an_exported_series_reads_alike_as_columns_and_point_by_point(points: list, us_per_unit: int, gaps: bool,
                                                                      name: str) -> None:
    """GIVEN any points of an exported series (Prometheus' [time, "value"] pairs, Grafana's numbers with
    gaps, and every damaged shape) WHEN read as columns THEN the samples, quarantine and notes are those
    of the point-by-point reading (a series of another shape is read point by point)."""
    got = []
    for at_once in (1, 1 << 62):
        p = common.Parsed(kind="x")
        was, prometheus.SERIES_AT_ONCE = prometheus.SERIES_AT_ONCE, at_once
        try:
            prometheus._series_points(p, "series 0", name, {"gpu": "1", "Hostname": "node-1"}, "", points, us_per_unit,
                              others=True, gaps=gaps)
        finally:
            prometheus.SERIES_AT_ONCE = was
        dcgm.dcgm_hosts(p, Path("qr.json"), None)
        _set_aside_impossible_times(p)  # (as the recorder does: a time past 64 bits is quarantined)
        got.append((repr(p.frame().rows()), p.quarantine, p.notes, p.gpus))
    assert got[0] == got[1]


def cluster_export(nodes: int = 3, gpus: int = 2, points: int = 600) -> dict:
    """A cluster-wide query_range export of DCGM framebuffer use (the labels dcgm-exporter gives) and a
    vLLM series, every 15 s."""
    series = [{"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": str(g), "UUID": f"GPU-{n}{g}", "modelName": "NVIDIA H200",
                          "Hostname": f"node-{n}", "instance": f"10.0.0.{n}:9400"},
               "values": [[1783072800 + i * 15, str(20000 + (i * 7 + n * 13 + g) % 60000)] for i in range(points)]}
              for n in range(nodes) for g in range(gpus)]
    series.append({"metric": {"__name__": "vllm:num_requests_running", "engine": "0"},
                   "values": [[1783072800 + i * 15, str(i % 9)] for i in range(points)] + [[1783072800, "NaN"]]})
    return {"status": "success", "data": {"resultType": "matrix", "result": series}}


@pytest.mark.parametrize("host", [None, "node-1"])
def test_a_cluster_wide_export_records_alike_by_either_route(host: str | None, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a cluster-wide query_range export (3 nodes of 2 GPUs, 600 points a series, and a vLLM series
    with a NaN) WHEN recorded with its series as columns and point by point THEN the two bundles hold
    the same samples, GPUs and notes; each node's GPUs stay series of their own, --host's the bundle's."""
    f = tmp_path / "qr.json"
    f.write_text(json.dumps(cluster_export()))
    got = []
    for name, at_once in (("columns", 1), ("points", 1 << 62)):
        monkeypatch.setattr(prometheus, "SERIES_AT_ONCE", at_once)
        record([f], tmp_path / name, RecordOptions(host=host))
        b = read_bundle(tmp_path / name)
        got.append((sorted(b.samples.rows(), key=repr), b.meta.gpus, b.meta.notes))
    assert got[0] == got[1]
    sources = {r[2] for r in got[0][0]}
    assert sources == ({"dcgm[Hostname=node-0]", "dcgm[Hostname=node-1]", "dcgm[Hostname=node-2]", "vllm-metrics"} if host is None
                       else {"dcgm[Hostname=node-0]", "dcgm", "dcgm[Hostname=node-2]", "vllm-metrics"})
    assert len(got[0][0]) == 7 * 600 and (host is None) == (got[0][1] == [])
