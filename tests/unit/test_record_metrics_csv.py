"""CSVs of vLLM's metrics one per column, as experiment scripts dump them: a harness's real
timeseries.csv (times of day, short names), and CSVs of vLLM's own names of any version, with or
without the prefix, labelled or not, at absolute or relative times."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import polars as pl
import pytest

from replay.bundle import read_bundle
from replay.record import metrics_csv
from replay.record.recorder import RecordOptions, record
from replay.record.registry import detect_kind
from tests.conftest import DATA

AKAMAS = DATA / "akamas_timeseries_l40s_gemma4_smoke.csv"
LOG = DATA / "v017_v1_stats_kv_ramp.log"  # (five stats lines, 03-17 15:38:10 to 15:38:50)
# the log's own five stats lines (Running, Waiting, GPU KV cache usage) as a script would dump them:
# no real CSV of vLLM's bare names was found, so these are built from the real log's figures
STATS = [(10, 90, 0.193), (16, 84, 0.309), (22, 78, 0.425), (28, 72, 0.542), (34, 66, 0.654)]


def _csv(header: str, times: list[str]) -> str:
    return header + "\n" + "".join(f"{t},{k},{r},{w}\n" for t, (r, w, k) in zip(times, STATS, strict=True))


def test_the_real_harness_timeseries_is_read_at_the_day_at_gives(tmp_path: Path) -> None:
    """GIVEN akamaslabs/vllm-benchmark's real timeseries.csv (CRLF; 't' as UTC times of day 09:59:00 to
    10:07:00, 30 s apart; running, waiting, kv_pct = 100 x kv_cache_usage_perc, and eleven columns of
    other figures) and --at with the run's start from its times.txt WHEN recorded THEN its 17 rows are
    51 samples on 2026-10-06, kv_pct as a fraction, and notes say what was read, what was not, and how
    the times were dated."""
    assert detect_kind(AKAMAS.read_text()) == "vllm-metrics-csv"
    record([AKAMAS], tmp_path / "b", RecordOptions(at_files={AKAMAS.name: "2026-10-06T09:49:17Z"}))
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2026-10-06T09:59:00Z"
    s = b.samples
    assert s.height == 51 and set(s["source"]) == {"vllm-metrics"}
    assert sorted(s["t_us"].unique()) == [k * 30_000_000 for k in range(17)]
    last = {m: v for _, _, _, m, v in s.filter(pl.col("t_us") == 16 * 30_000_000).rows()}
    assert last == {"requests_running": 187.0, "requests_waiting": 1245.0, "kv_usage_ratio": pytest.approx(0.9995469578217731)}
    assert b.meta.inputs[0]["kind"] == "vllm-metrics-csv" and b.meta.inputs[0]["quarantined"] == 0
    assert (f"{AKAMAS.name}: a CSV of vLLM's metrics, one per column: read running as requests_running, waiting as "
            "requests_waiting, kv_pct as kv_usage_ratio (x0.01) (running, waiting, kv_pct: a harness's short names for "
            "vLLM's figures); not read (no metric the bundle holds): total_tok_s, gen_tok_s, req_s, ttft_p95_ms, "
            "itl_p95_ms, preempt_s, cpu_vllm, cpu_aiperf, gpu_util_pct, gpu_power_w") in b.meta.notes
    assert (f"{AKAMAS.name}: its 't' column holds times of day without a date: 51 samples, dated by "
            "2026-10-06T09:49:17.000Z, its first row at 2026-10-06T09:59:00.000Z (from --at)") in b.meta.notes


def test_the_real_harness_timeseries_alone_is_quarantined_with_its_count(tmp_path: Path) -> None:
    """Times of day alone say no date: without --at or other evidence its 51 samples are one quarantine
    entry and a note, never put on the timeline at a guessed date."""
    reports, summary = record([AKAMAS], tmp_path / "b", RecordOptions())
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert summary["samples"] == 0 and reports[0].quarantined == 1
    assert [e["reason"] for e in q] == ["51 samples at times relative to the run's start ('t'), which nothing placed"]


@pytest.mark.parametrize(("header", "names"), [
    ("timestamp,gpu_cache_usage_perc,num_requests_running,num_requests_waiting",
     {"vllm:gpu_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"}),  # (bare, V0/V1 <0.11)
    ("time,kv_cache_usage_perc,vllm_num_requests_running,vllm:num_requests_waiting",
     {"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"}),  # (newer, mixed prefixes)
])
def test_bare_names_of_any_version_at_absolute_times_are_vllms_metrics(tmp_path: Path, header: str,
                                                                       names: set[str]) -> None:
    """GIVEN the log's five stats figures dumped with vLLM's names bare (gpu_cache_usage_perc of older
    versions, kv_cache_usage_perc of newer ones, or a pipeline's 'vllm_' prefix) at ISO times WHEN recorded
    beside the log THEN its 15 samples lie at the log's own stats times with the log's values, as the
    metrics of vLLM's own names (which narrow its version)."""
    times = [f"2025-03-17T15:38:{s}0Z" for s in range(1, 6)]
    (tmp_path / "m.csv").write_text(_csv(header, times))
    assert detect_kind((tmp_path / "m.csv").read_text()) == "vllm-metrics-csv"
    p = metrics_csv.parse_metrics_csv(tmp_path / "m.csv", (tmp_path / "m.csv").read_text())
    assert p.vllm_names == names and p.quarantine == [] and p.unplaced is None
    record([LOG, tmp_path / "m.csv"], tmp_path / "b", RecordOptions(year=2025))
    s = read_bundle(tmp_path / "b").samples
    csv_kv = s.filter((pl.col("source") == "vllm-metrics") & (pl.col("metric") == "kv_usage_ratio")).sort("t_us")
    log_kv = s.filter((pl.col("source") == "vllm-log") & (pl.col("metric") == "kv_usage_ratio")).sort("t_us")
    assert s.filter(pl.col("source") == "vllm-metrics").height == 15
    assert csv_kv["t_us"].to_list() == log_kv["t_us"].to_list() == [0, 10_000_000, 20_000_000, 30_000_000, 40_000_000]
    assert csv_kv["value"].to_list() == pytest.approx(log_kv["value"].to_list())


def test_labelled_columns_of_one_metric_are_series_of_their_own_at_offsets_placed_by_the_log(tmp_path: Path) -> None:
    """GIVEN Prometheus-style headers with labels (two engines' num_requests_running) and an 'elapsed_s'
    column of offsets WHEN recorded beside the log, without --at THEN each engine is a series of its own
    ('vllm-metrics[engine=0]'), placed from the log's first time, and said so."""
    with (tmp_path / "m.csv").open("w", newline="") as fh:  # (csv quotes the headers: their labels hold commas)
        w = csv.writer(fh)
        w.writerow(["elapsed_s", 'vllm:num_requests_running{engine="0",model_name="m"}',
                    'vllm:num_requests_running{engine="1",model_name="m"}'])
        w.writerows([k * 10, r, wait] for k, (r, wait, _) in enumerate(STATS))
    assert detect_kind((tmp_path / "m.csv").read_text()) == "vllm-metrics-csv"
    record([LOG, tmp_path / "m.csv"], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    s = b.samples.filter(pl.col("source").cast(pl.Utf8).str.starts_with("vllm-metrics"))
    assert sorted(set(s["source"])) == ["vllm-metrics[engine=0]", "vllm-metrics[engine=1]"]
    assert s.filter(pl.col("source") == "vllm-metrics[engine=1]").sort("t_us").rows() == [
        (k * 10_000_000, None, "vllm-metrics[engine=1]", "requests_running", float(w)) for k, (_, w, _) in enumerate(STATS)]
    assert ("m.csv: its 'elapsed_s' column holds offsets from the start of the run: 10 samples, its zero placed at "
            "2025-03-17T15:38:10.000Z (the earliest time of the other evidence, v017_v1_stats_kv_ramp.log's)") in b.meta.notes


def test_damaged_rows_and_values_no_vllm_has_are_quarantined_by_line() -> None:
    """A time of another form than the first row's, a cell that is no number, a KV cache usage over 1,
    and a row of too few fields: each quarantined with its line and why; the rest read."""
    text = ("time_s,kv_cache_usage_perc,num_requests_running\n0,0.5,3\n1,0.6,x\n2025-01-01T00:00:00Z,0.7,4\n"
            "3,1.7,5\n4,0.8\n5,,6\n")
    p = metrics_csv.parse_metrics_csv(Path("m.csv"), text)
    assert [(no, why) for no, why, _ in p.quarantine] == [
        (3, "num_requests_running: 'x' is not a number"),
        (4, "a time of another form than the first row's (offset): '2025-01-01T00:00:00Z'"),
        (5, "kv_cache_usage_perc: impossible value: a KV cache usage outside 0-1 (kv_usage_ratio = 1.7)"),
        (6, "expected 3 fields, found 2")]
    assert p.unplaced is not None
    assert sorted(p.unplaced.frame.select("t_us", "metric", "value").rows()) == [
        (0, "kv_usage_ratio", 0.5), (0, "requests_running", 3.0), (1_000_000, "kv_usage_ratio", 0.6),
        (3_000_000, "requests_running", 5.0), (5_000_000, "requests_running", 6.0)]


@pytest.mark.parametrize(("text", "kind"), [
    ("time,vllm:num_requests_running\n2025-01-01T00:00:00Z,3\n", "grafana-csv"),  # (Grafana's shape: Grafana's reader)
    ("time,running\n0,3\n", "grafana-csv"),  # (one short name: not enough to call a file vLLM's)
    ("time,total_tok_s,gpu_power_w\n0,3,100\n", "grafana-csv"),
    ("host,num_requests_running\nnode-1,3\n", None),  # (no time column first)
])
def test_what_is_not_a_metrics_csv_is_left_to_its_own_reader(text: str, kind: str | None) -> None:
    assert metrics_csv.sniff(text) is None and detect_kind(text) == kind
