"""gpustat: its printed table (colours taken off) and --json.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from replay.record.common import (
    Parsed,
    Parser,
    as_list,
    as_obj,
    checks_values,
    lines_in,
    parse_time,
    utc_us,
)
from replay.record.options import RecordOptions
from replay.record.vllm_log import ANSI
from replay.units import MiB, is_uint

# gpustat (NVML's figures, memory in MiB): a header per query, 'host  Wed Nov 19 20:16:36 2025  550.54.15'
# (the C locale's date and time, local), then a line per GPU, '[0] NVIDIA H100 80GB HBM3 | 45°C, 100 % |
# 78123 / 81559 MB | root(78000M) python3/12345(…M)'; or `gpustat --json` (one document per query)
_GPUSTAT_HEAD = re.compile(r"^(?P<host>\S+)\s+(?P<t>(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d "
                           r"\d\d:\d\d:\d\d \d{4})(?:\s+\S+)?\s*$")
_GPUSTAT_GPU = re.compile(r"^\[(?P<idx>\d+)\]\s+(?P<name>[^|]*?)\s*\|[^|]*\|\s*(?P<used>\d+)\s*/\s*(?P<total>\d+)\s*MB\s*"
                          r"(?:\|(?P<procs>.*))?$")
_SPACE = re.compile(r"\s*")
_GPUSTAT_PROC = re.compile(r"(?:^|\s)(?:[^\s/(]+?:)?[^\s/(]*/(?P<pid>\d+)\((?P<mem>\d+)M\)")  # ('user:cmd/pid(mem)', -cup)


@checks_values
def parse_gpustat(path: Path, text: str, tz_offset_s: int = 0) -> Parsed:
    """``gpustat`` (``-i`` repeats it) as printed or as ``--json``: each GPU's used and total memory
    (MiB) at the query's time, a local time (``--tz``), and each process's memory where its pid shows
    (``-p``). Its figures are NVML's, so the samples are the nvml source's."""
    p = Parsed(kind="gpustat")
    p.lines = lines_in(text)
    if text.lstrip().startswith("{"):
        return _gpustat_json(text, tz_offset_s, p)
    t: int | None = None
    for i, ln in enumerate(text.splitlines(), start=1):
        s = ANSI.sub("", ln).rstrip()  # (gpustat colours its output on a terminal, --color)
        if not s.strip():
            p.parsed += 1
            continue
        m = _GPUSTAT_HEAD.match(s)
        if m:
            try:
                t = utc_us(datetime.strptime(" ".join(m["t"].split()), "%a %b %d %H:%M:%S %Y"), tz_offset_s)
            except ValueError:  # (a header of the shape whose time is none, 'Wed Nov 5 20:16:67': its rows have none)
                t = None
                p.quarantine.append((i, f"gpustat header time {m['t'].strip()!r} is not a time", ln))
                continue
            p.naive_local_times = True
            p.parsed += 1
            continue
        if s.lstrip().startswith(("├─", "└─")):  # (-f: a process's host CPU and memory, not the GPU's)
            p.parsed += 1
            continue
        g = _GPUSTAT_GPU.match(s)
        if g is None:
            p.quarantine.append((i, "not a gpustat header or GPU line", ln))
            continue
        idx = int(g["idx"])
        p.gpus.setdefault(idx, {"index": idx, "name": g["name"], "total_bytes": int(g["total"]) * MiB})
        p.samples += [(t, idx, "nvml", "device_used_bytes", float(int(g["used"]) * MiB)),
                      (t, idx, "nvml", "device_total_bytes", float(int(g["total"]) * MiB))]
        p.samples += [(t, idx, "nvml", f"process_used_bytes:{pm['pid']}", float(int(pm["mem"]) * MiB))
                      for pm in _GPUSTAT_PROC.finditer(g["procs"] or "")]
        p.parsed += 1
    return p


def _gpustat_json(text: str, tz_offset_s: int, p: Parsed) -> Parsed:
    """``gpustat --json`` documents, one after another (``-i``)."""
    dec, pos = json.JSONDecoder(), 0
    while True:
        m = _SPACE.match(text, pos)
        pos = m.end() if m else pos
        if pos >= len(text):
            p.parsed = p.lines - len({q[0] for q in p.quarantine})
            return p
        line = text.count("\n", 0, pos) + 1
        try:
            doc, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            p.quarantine.append((line, f"not valid JSON ({e.msg}); the rest of the file is not read", text[pos:pos + 200]))
            p.parsed = line - 1 - len({q[0] for q in p.quarantine[:-1]})
            return p
        q = as_obj(doc).get("query_time")
        t = parse_time(q, tz_offset_s) if isinstance(q, str) else None
        p.naive_local_times = p.naive_local_times or (isinstance(q, str) and not re.search(r"(?:Z|[+-]\d\d:?\d\d)$", q))
        gpus = [g for g in as_list(as_obj(doc).get("gpus")) if isinstance(g, dict)]
        if not gpus:
            p.quarantine.append((line, "a gpustat document without GPUs", json.dumps(doc)[:200]))
            continue
        for g in gpus:
            idx, used, total = g.get("index"), g.get("memory.used"), g.get("memory.total")
            if not is_uint(str(idx)) or not isinstance(used, (int, float)) or isinstance(used, bool):
                p.quarantine.append((line, "a GPU without index or memory.used", json.dumps(g)[:200]))
                continue
            gi = int(str(idx))
            info = {"index": gi, "name": g.get("name"), "uuid": g.get("uuid")}
            if isinstance(total, (int, float)) and not isinstance(total, bool):
                info["total_bytes"] = int(total * MiB)
                p.samples.append((t, gi, "nvml", "device_total_bytes", float(total * MiB)))
            p.gpus.setdefault(gi, {k: v for k, v in info.items() if v is not None})
            p.samples.append((t, gi, "nvml", "device_used_bytes", float(used * MiB)))
            for pr in as_list(g.get("processes")):
                pid, mem = as_obj(pr).get("pid"), as_obj(pr).get("gpu_memory_usage")
                if is_uint(str(pid)) and isinstance(mem, (int, float)) and not isinstance(mem, bool):
                    p.samples.append((t, gi, "nvml", f"process_used_bytes:{pid}", float(mem * MiB)))


# --- as the registry reads it -----------------------------------------------------------------------
def sniff(head: str) -> str | None:
    """Printed (its colours taken off) or --json."""
    if re.search(r"^\[\d+\] .*\|.*\d+ / \d+ MB", ANSI.sub("", head), re.M) or (
            '"query_time"' in head and '"gpus"' in head and '"memory.used"' in head):
        return "gpustat"
    return None


def _parse(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_gpustat(path, text, opts.tz_offset_s)


PARSERS: dict[str, Parser] = {"gpustat": _parse}
