"""Kernel logs: the OOM killer and NVIDIA Xid messages, from dmesg, journald or syslog.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from replay.record.common import Parsed, Parser, parse_time, utc_us
from replay.record.options import RecordOptions
from replay.units import is_uint

# --- kernel log: dmesg -T, dmesg, journalctl -k -----------------------------------------------------
_K_CTIME = re.compile(r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\] ?")
_K_UPTIME = re.compile(r"^\[\s*\d+\.\d+\] ?")
_K_JOURNAL = re.compile(r"^(?:(\d{4}-\d\d-\d\dT\S+)|([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)) \S+ kernel: ")
def host_oom(oom: re.Match[str], text: str) -> dict[str, Any]:
    """What the kernel's OOM kill message says (the kernel log's, or node-problem-detector's event)."""
    return {"pid": int(oom["pid"]), "process": oom["name"], "cgroup": bool(oom["memcg"]),
            "anon_rss_bytes": int(oom["rss"]) * 1024 if oom["rss"] else None, "text": text.strip()[:300],
            "meaning": ("the kernel killed the process for host memory" + (" (its memory cgroup's limit: a "
                        "container limit)" if oom["memcg"] else "") + "; a CUDA OOM is an application error "
                        "and never shows up here")}


K_OOM = re.compile(r"(?P<memcg>Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (?P<pid>\d+) \((?P<name>[^)]*)\)"
                    r"(?:.*?anon-rss:(?P<rss>\d+)kB)?")
_K_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, pid=['\"]?(?P<pid>\d+|<unknown>)['\"]?)?"
                    r"(?:, name=['\"]?(?P<name>[^,'\"]*)['\"]?)?,? ?(?P<msg>.*)$")
# what the common Xid codes mean (NVIDIA's Xid catalogue), for the timeline and the findings
XID_MEANING = {
    13: "graphics engine exception (often the application's own fault)",
    31: "GPU memory page fault (often an illegal address in the application)",
    43: "GPU stopped processing", 45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC memory error", 63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error",
}


def kernel_log_head(head: str) -> bool:
    """Whether a text's head is a kernel log: most of its lines carry a dmesg or journalctl -k prefix."""
    lines = [ln for ln in head.splitlines()[:200] if ln.strip()]
    hits = sum(1 for ln in lines if _K_CTIME.match(ln) or _K_UPTIME.match(ln) or _K_JOURNAL.match(ln))
    return bool(lines) and hits >= 0.6 * len(lines)


def parse_kernel_log(path: Path, text: str, tz_offset_s: int = 0, year: int | None = None) -> Parsed:
    """A kernel log (``dmesg -T``, ``dmesg``, ``journalctl -k`` in short or short-iso form): the host
    OOM killer (global or a memory cgroup's: a container's memory limit, not a CUDA OOM) and NVIDIA
    Xid GPU errors (79: fell off the bus, 48/95: ECC, 31: page fault ...), which end an engine without
    any CUDA OOM. Other kernel lines are read and left out; lines without a kernel prefix are
    quarantined."""
    p = Parsed(kind="kernel-log")
    lines = text.splitlines()
    p.lines = len(lines)
    uptime_only = bsd = 0
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            p.parsed += 1
            continue
        t: int | None = None
        m = _K_CTIME.match(ln)
        if m:
            t = parse_time(m.group(1), tz_offset_s)
            p.naive_local_times = True
        elif (m := _K_JOURNAL.match(ln)) is not None:
            if m.group(1):
                t = parse_time(m.group(1), tz_offset_s)
            else:  # 'May 01 10:05:00': journald's short form has no year
                bsd += 1
                try:
                    t = utc_us(datetime.strptime(f"{m.group(2)} {year or datetime.now(timezone.utc).year}",
                                               "%b %d %H:%M:%S %Y"), tz_offset_s)
                except ValueError:  # (Feb 29 in a year without one)
                    t = None
                p.naive_local_times = True
        elif (m := _K_UPTIME.match(ln)) is not None:
            uptime_only += 1
        else:
            p.quarantine.append((i, "not a kernel log line", ln))
            continue
        p.parsed += 1
        msg = ln[m.end():]
        oom = K_OOM.search(msg)
        xid = _K_XID.search(msg)
        if oom:
            p.events.append({"t": t, "kind": "host_oom_killed", "line": i, "data": host_oom(oom, msg)})
        elif xid:
            code = int(xid["xid"])
            p.events.append({"t": t, "kind": "gpu_xid", "line": i, "data": {
                "xid": code, "pci": xid["pci"], "pid": int(xid["pid"]) if is_uint(xid["pid"] or "") else None,
                "process": xid["name"] or None, "message": xid["msg"].strip()[:300],
                "meaning": XID_MEANING.get(code, "see NVIDIA's Xid catalogue")}})
    if uptime_only:
        p.notes.append(f"{path.name}: {uptime_only} lines carry only seconds since boot (plain dmesg): their events "
                       "have no time; `dmesg -T` or `journalctl -k -o short-iso` gives wall-clock times")
    if bsd and year is None:
        p.notes.append(f"{path.name}: journalctl's short form has no year: the current year was assumed (--year sets it)")
    return p


# --- as the registry reads it -----------------------------------------------------------------------
def sniff(head: str) -> str | None:
    return "kernel-log" if kernel_log_head(head) else None


def _parse(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_kernel_log(path, text, opts.tz_offset_s, opts.year)


PARSERS: dict[str, Parser] = {"kernel-log": _parse}
