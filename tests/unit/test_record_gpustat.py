"""The recorder on gpustat's output, printed and --json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from replay.bundle import read_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA


def test_gpustat_printed_and_json(tmp_path: Path) -> None:
    """GIVEN gpustat's own expected outputs (`gpustat -a -cupf`, then plain `gpustat`) under its
    headers, and the same figures as `gpustat --json -i` writes them (a document per query, its time
    local and naive) WHEN recorded with --tz THEN each GPU's used and total memory (MiB) and each
    process's memory (where its pid shows) are NVML samples at the header's time, the GPUs are named
    with their totals, and the -f tree lines count as read (the file was of no known kind); coloured
    (--color) alike."""
    MiB = 2**20
    text = (DATA / "gpustat_cup_and_default.txt").read_text()
    docs = [{"hostname": "gpu-node-1", "driver_version": "415.27.mock", "query_time": f"2025-11-05T20:16:3{6 + k}.000000",
             "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": f"GeForce GTX TITAN {i}", "temperature.gpu": 80,
                       "utilization.gpu": None if i == 2 else 76, "memory.used": used, "memory.total": total,
                       "processes": None if i == 2 else [{"username": "u", "command": "python", "full_command": ["python"],
                                                          "gpu_memory_usage": mem, "cpu_percent": 1.0,
                                                          "cpu_memory_usage": 1, "pid": pid} for pid, mem in procs if k == 0]}
                      for i, (used, total, procs) in enumerate([(8000, 12287, [(48448, 4000), (153223, 4000)]),
                                                                (9000, 12189, [(192453, 3000), (194826, 6000)]),
                                                                (0, 12189, [])])]} for k in range(2)]
    (tmp_path / "gpustat.json").write_text("".join(json.dumps(d, indent=4) + "\n" for d in docs))
    # (--color, as gpustat colours index, name and memory on a terminal)
    (tmp_path / "color.txt").write_text(re.sub(r"(\[\d+\])|(\d+)( / )(\d+)( MB)", lambda m: f"\x1b[1m{m[1]}\x1b[0m" if m[1]
                                                else f"\x1b[33m{m[2]}\x1b[0m{m[3]}\x1b[33m{m[4]}\x1b[0m{m[5]}", text))
    for name, src in (("printed", DATA / "gpustat_cup_and_default.txt"), ("json", tmp_path / "gpustat.json"),
                      ("color", tmp_path / "color.txt")):
        reps, _ = record([src], tmp_path / name, RecordOptions(tz_offset_s=-5 * 3600))
        b = read_bundle(tmp_path / name)
        assert reps[0].kind == "gpustat" and reps[0].quarantined == 0 and reps[0].parsed == reps[0].lines, name
        assert b.meta.t0_utc == "2025-11-06T01:16:36Z", name  # (20:16:36 at UTC-5)
        used = b.samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us", "gpu")
        assert used["value"].to_list() == [v * MiB for v in (8000, 9000, 0)] * 2 and used["t_us"].to_list() == [0] * 3 + [10**6] * 3
        procs = b.samples.filter(pl.col("metric").cast(pl.Utf8).str.starts_with("process_used_bytes:")).sort("gpu", "metric")
        assert procs.select("gpu", "metric", "value").rows() == [
            (0, "process_used_bytes:153223", 4000.0 * MiB), (0, "process_used_bytes:48448", 4000.0 * MiB),
            (1, "process_used_bytes:192453", 3000.0 * MiB), (1, "process_used_bytes:194826", 6000.0 * MiB)]
        assert [(g["index"], g["name"], g["total_bytes"]) for g in b.meta.gpus] == [
            (0, "GeForce GTX TITAN 0", 12287 * MiB), (1, "GeForce GTX TITAN 1", 12189 * MiB), (2, "GeForce GTX TITAN 2", 12189 * MiB)]
    assert text.count("├─") + text.count("└─") == 4


def test_gpustat_header_with_a_time_that_is_none_is_quarantined(tmp_path: Path) -> None:
    """A gpustat header whose time cannot be one (second 67, a digit garbled on its way here) ended the
    record with an internal error; it goes to the quarantine, and the rows under it have no time."""
    text = (DATA / "gpustat_cup_and_default.txt").read_text()
    first = text.splitlines()[0]
    assert "20:16:36 2025" in first
    src = tmp_path / "gpustat.txt"
    src.write_text(text.replace(first, first.replace("20:16:36", "20:16:67"), 1))
    good, _ = record([DATA / "gpustat_cup_and_default.txt"], tmp_path / "good", RecordOptions())
    reports, _ = record([src], tmp_path / "b", RecordOptions())
    assert reports[0].kind == "gpustat" and reports[0].quarantined == good[0].quarantined + 1
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in q if "header" in r["reason"]] == [
        (1, "gpustat header time 'Wed Nov  5 20:16:67 2025' is not a time")]
