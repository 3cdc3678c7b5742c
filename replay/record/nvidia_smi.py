"""nvidia-smi: the query-gpu and query-compute-apps CSV (the reference for its fast lane,
``fastsmi``), the default table, -q as text or XML, dmon and pmon.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from xml.etree import ElementTree

from replay.bundle import mig_source
from replay.record import timecol
from replay.record.common import Parsed, Parser, checks_values, impossible, parse_time, scrape_time
from replay.record.dcgm import instance_order
from replay.record.options import RecordOptions
from replay.units import MiB, is_uint

# --- nvidia-smi ----------------------------------------------------------------------------------
NVSMI_GPU_FIELDS = {
    "memory.used": "device_used_bytes", "memory.free": "device_free_bytes",
    "memory.total": "device_total_bytes", "memory.reserved": "device_reserved_bytes",
    "utilization.gpu": "util_gpu_pct", "utilization.memory": "util_mem_pct",
}


_NVSMI_MIB_FIELDS = ("memory.used", "memory.free", "memory.total", "memory.reserved", "used_gpu_memory", "used_memory")


NV_UNKNOWN = ("[N/A]", "N/A", "[Not Supported]")  # what nvidia-smi writes for a value it has not
NV_NUMBER = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(MiB|GiB|KiB|%|W|MHz|C)?$")  # (a number: not '.' or '1.2.3')
_NV_UNITS = ("", "MiB", "GiB", "KiB", "%", "W", "MHz", "C")
NV_SCALE = {"MiB": MiB, "GiB": 1 << 30, "KiB": 1024}


def _nv_unknown(c: str) -> bool:
    """Whether a (stripped) cell is nvidia-smi's word for a value it has not: NV_UNKNOWN, any other
    bracketed word ('[Unknown Error]', '[GPU requires reset]'), '-' or nothing."""
    return c in NV_UNKNOWN or c in ("-", "") or (c.startswith("[") and c.endswith("]"))


def _nv_value(cell: str, header: str) -> float | None:
    """A value of nvidia-smi's CSV in its base unit (bytes for memory). Memory fields are MiB in every
    nvidia-smi: a bare number is MiB whether the header says so ('memory.used [MiB]', as nvidia-smi
    writes it, nounits or not) or not (a column list typed for --nvsmi-columns)."""
    c = cell.strip()
    num, _, unit = c.partition(" ")  # (the common shapes, '40000 MiB' and '40000', without a pattern)
    if num.isdigit() and num.isascii() and unit in _NV_UNITS:
        v = float(num)
    else:
        if _nv_unknown(c):
            return None
        m = NV_NUMBER.match(c)
        if not m:
            return None
        v, unit = float(m.group(1)), m.group(2) or ""
    v *= NV_SCALE.get(unit or nv_default_unit(header), 1)
    return v if math.isfinite(v) else None  # (hundreds of digits: no memory, a damaged cell)


@functools.lru_cache(maxsize=256)
def nv_default_unit(header: str) -> str:
    """The unit of a bare number under ``header``: MiB for memory fields, none otherwise."""
    return "MiB" if "[MiB]" in header or header.split(" [")[0].strip() in _NVSMI_MIB_FIELDS else ""


@checks_values
def parse_nvidia_smi_csv(path: Path, text: str, tz_offset_s: int = 0, columns: str | None = None,
                         at: str | None = None) -> Parsed:
    """``nvidia-smi --query-gpu`` or ``--query-compute-apps`` CSV (any columns, units or not). A query
    without the timestamp field is usually one snapshot taken after the incident: it is placed at
    ``--at`` (or a time in the file name), and said so; rows without times that repeat a GPU are a
    loop, which cannot be placed. A time column of offsets from the run's start ('time [s]',
    'elapsed', a 'timestamp' of small numbers) or of times of day is placed from ``--at`` (when the run
    began), else held for the recorder to place by the other evidence (``timecol``)."""
    p = _place_snapshot(nvidia_smi_rows(path, text, tz_offset_s, columns), path, text, at, tz_offset_s,
                        "add timestamp to the --query-gpu list next time")
    return timecol.settle(p, path, parse_time(at, tz_offset_s) if at else None)


def _place_snapshot(p: Parsed, path: Path, text: str, at: str | None, tz_offset_s: int, hint: str) -> Parsed:
    """Samples without a time: one snapshot (no GPU metric twice) is placed at ``--at`` or a time in the
    file name, and said so; repeated rows without times (a loop) cannot be placed."""
    timeless = [s for s in p.samples if s[0] is None]
    if not timeless:
        return p
    keys = [(s[1], s[3]) for s in timeless]
    if len(set(keys)) < len(keys):
        p.notes.append(f"{path.name}: rows without times repeat a GPU (a loop): they cannot be placed on the "
                       f"timeline; {hint}")
        return p
    t, how = scrape_time(path, text, at, tz_offset_s)
    if t is None:
        p.notes.append(f"{path.name}: a snapshot with no time: pass --at with when it was taken to place it")
        return p
    p.samples = [(t if s[0] is None else s[0], *s[1:]) for s in p.samples]
    p.notes.append(f"{path.name}: a snapshot with no time of its own, placed at its time from {how}")
    return p


# --- nvidia-smi's own text: the default table and `-q` ------------------------------------------------
_SMI_TIME = re.compile(r"^(?:Timestamp\s*:\s*)?((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4})\s*$")
_SMI_GPU = re.compile(r"^\|\s+(?P<idx>\d+)\s+(?P<name>\S.*?)\s+(?:On|Off)\s+\|\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)")
_SMI_MEM = re.compile(r"\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|")
_SMI_PROC = re.compile(r"^\|\s+(?P<gpu>\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(?P<pid>\d+)\s+(?P<type>[CGM+]+)\s+"
                       r"(?P<name>.*?)\s+(?P<mem>\d+MiB|N/A)\s*\|$")
# a MIG instance's row in the table's 'MIG devices:' part: GPU, GPU instance, compute instance, MIG device,
# then its own Memory-Usage (the row under it is its BAR1-Usage)
_SMI_MIG = re.compile(r"^\|\s+(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)\s+\|\s*(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB\s*\|")
_Q_LINE = re.compile(r"^(?P<indent> *)(?P<key>\S[^:]*?)\s*(?::\s*(?P<value>.*?))?\s*$")
_Q_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)$")
_Q_FB = {"Total": "device_total_bytes", "Reserved": "device_reserved_bytes", "Used": "device_used_bytes",
         "Free": "device_free_bytes"}


def _smi_mig(p: Parsed, path: Path, split: dict[int, set[str]]) -> None:
    """Note the GPUs nvidia-smi showed split into MIG instances, whose memory ``split`` kept apart."""
    for g_i, ids in sorted(split.items()):
        p.notes.append(f"{path.name}: GPU {g_i} is split into MIG instances (GPU_I_ID "
                       f"{', '.join(instance_order(ids))}): each instance's memory is a series of its "
                       "own (source 'nvidia-smi[GPU_I_ID=…]'); the GPU's own is all of them")


NO_MEMORY = "nvidia-smi states no memory for GPU"


def note_no_memory(p: Parsed, path: Path, gpus: set[int]) -> None:
    """Note the GPUs whose memory nvidia-smi says it has not ('Not Supported', '[N/A]' in every row)."""
    for g_i in sorted(gpus):
        name = p.gpus.get(g_i, {}).get("name")
        p.notes.append(f"{path.name}: {NO_MEMORY} {g_i}{f' ({name})' if name else ''}: a "
                       "unified-memory device (DGX Spark's GB10; a Grace Hopper or Grace Blackwell running with unified "
                       "memory) has no framebuffer of its own, and its memory is the host's; its actual memory is not in "
                       "this file: record the host's (/proc/meminfo), or each process's (--query-compute-apps=pid,"
                       "used_memory)")


@checks_values
def parse_nvidia_smi_table(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """The default ``nvidia-smi`` table, the evidence most often pasted into a postmortem, once or
    repeated (``nvidia-smi -l``, ``watch``): per GPU the used and total memory of its Memory-Usage cell
    (used excludes the driver's reserve, as memory.used does), per process its GPU memory. Each table
    is placed at the time line nvidia-smi prints above it (host local time), a table without one at
    ``--at``. Old layouts (no GI/CI columns) read the same. The instances of a GPU split by MIG (the
    table's 'MIG devices:' part) each hold memory of their own: a series per instance
    ('nvidia-smi[GPU_I_ID=3]'), beside their GPU's row, which counts them all."""
    p = Parsed(kind="nvidia-smi-table")
    lines = text.splitlines()
    p.lines = len(lines)
    t: int | None = None
    gpu: int | None = None
    split: dict[int, set[str]] = {}  # GPU -> its MIG instances (GPU_I_ID)
    unsupported: set[int] = set()  # GPUs whose Memory-Usage cell says 'Not Supported'
    for i, ln in enumerate(lines, start=1):
        s = ln.rstrip()
        m = _SMI_TIME.match(s.strip())
        if m:
            t = parse_time(m.group(1), tz_offset_s)
            p.naive_local_times = True
            p.parsed += 1
            continue
        mig = _SMI_MIG.match(s)
        if mig:
            src = mig_source("nvidia-smi", mig["gi"])
            g_i = int(mig["gpu"])
            split.setdefault(g_i, set()).add(mig["gi"])
            p.samples += [(t, g_i, src, "device_used_bytes", float(int(mig["used"]) * MiB)),
                          (t, g_i, src, "device_total_bytes", float(int(mig["total"]) * MiB))]
            p.parsed += 1
            continue
        g = _SMI_GPU.match(s)
        mem = _SMI_MEM.search(s)
        pr = _SMI_PROC.match(s)
        if g:
            gpu = int(g["idx"])
            p.gpus.setdefault(gpu, {"index": gpu}).update(name=g["name"].strip(), pci_bus_id=g["bus"])
        elif mem and gpu is not None:  # the second row of a GPU's cell
            total = int(mem["total"]) * MiB
            p.samples += [(t, gpu, "nvidia-smi", "device_used_bytes", float(int(mem["used"]) * MiB)),
                          (t, gpu, "nvidia-smi", "device_total_bytes", float(total))]
            p.gpus.setdefault(gpu, {"index": gpu})["total_bytes"] = total
            gpu = None
        elif gpu is not None and "| Not Supported" in s:  # (its memory cell, on a unified-memory device)
            unsupported.add(gpu)
            gpu = None
        elif pr:
            if pr["mem"] != "N/A":  # (N/A: the driver does not say, as under some containers)
                p.samples.append((t, int(pr["gpu"]), "nvidia-smi", f"process_used_bytes:{pr['pid']}",
                                  float(int(pr["mem"][:-3]) * MiB)))
        elif s.strip() and not s.lstrip().startswith(("|", "+")):
            p.quarantine.append((i, "not part of an nvidia-smi table", ln))
            continue
        p.parsed += 1  # a data row, or the table's frame and headings
    _smi_mig(p, path, split)
    note_no_memory(p, path, unsupported - {g for _, g, _, m, _ in p.samples if m == "device_used_bytes"})
    return _place_snapshot(p, path, text, at, tz_offset_s, "keep the time line nvidia-smi prints above each table")


@checks_values
def parse_nvidia_smi_q(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """``nvidia-smi -q`` (whole or ``-d MEMORY``, or an excerpt): per GPU its framebuffer Total,
    Reserved, Used and Free (Used excludes Reserved: they and Free add up to Total), and per process
    its used GPU memory. GPUs are numbered in the order their sections appear. The FB memory of a MIG
    instance (a 'MIG Device' block of 'MIG Devices') is a series of its own ('nvidia-smi[GPU_I_ID=3]')."""
    p = Parsed(kind="nvidia-smi-q")
    split: dict[int, set[str]] = {}  # GPU -> its MIG instances (GPU_I_ID)
    mig_gi = "?"  # the GPU Instance ID of the MIG Device block the line is in
    lines = text.splitlines()
    p.lines = len(lines)
    t: int | None = None
    gpu, pid = 0, None
    section: list[tuple[int, str]] = []  # (indent, heading) of the blocks the line is in
    seen_gpu = False
    for i, ln in enumerate(lines, start=1):
        if not ln.strip() or set(ln.strip()) <= {"=", "-"}:
            p.parsed += 1
            continue
        m = _Q_LINE.match(ln.rstrip())
        if m is None:  # (a line indented with tabs, say: -q indents with spaces)
            p.quarantine.append((i, "not an nvidia-smi -q line", ln))
            continue
        indent, key, value = len(m["indent"]), m["key"], m["value"]
        bus = _Q_GPU.match(ln.strip())
        if bus:  # a GPU's section ('GPU 00000000:83:00.0': its colons are not a key's)
            key, value = ln.strip(), None
        while section and section[-1][0] >= indent:
            section.pop()
        p.parsed += 1
        if value is None:  # a block heading ('FB Memory Usage', 'GPU 00000000:83:00.0', 'Processes')
            if bus:
                gpu = gpu + 1 if seen_gpu else 0
                seen_gpu = True
                p.gpus.setdefault(gpu, {"index": gpu})["pci_bus_id"] = bus.group(1)
            section.append((indent, key))
            if key == "MIG Device":
                mig_gi = "?"
            continue
        heads = [h for _, h in section]
        in_mig = "MIG Device" in heads
        if key == "Timestamp":
            t = parse_time(value, tz_offset_s)
            p.naive_local_times = True
        elif key == "Product Name":
            p.gpus.setdefault(gpu, {"index": gpu})["name"] = value
        elif key == "GPU Instance ID" and in_mig:
            mig_gi = value.strip() or "?"
        elif heads and heads[-1] == "FB Memory Usage" and key in _Q_FB:
            v = _nv_value(value, "")
            if v is not None and in_mig:
                split.setdefault(gpu, set()).add(mig_gi)
                p.samples.append((t, gpu, mig_source("nvidia-smi", mig_gi), _Q_FB[key], v))
            elif v is not None:
                p.samples.append((t, gpu, "nvidia-smi", _Q_FB[key], v))
                if key == "Total":
                    p.gpus.setdefault(gpu, {"index": gpu})["total_bytes"] = int(v)
        elif key == "Process ID" and is_uint(value):
            pid = value
        elif key == "Used GPU Memory" and pid is not None:
            v = _nv_value(value, "")
            if v is not None:
                p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{pid}", v))
    _smi_mig(p, path, split)
    return _place_snapshot(p, path, text, at, tz_offset_s, "keep the Timestamp line of nvidia-smi -q")


_XML_DOC = re.compile(r"<nvidia_smi_log\b.*?(?:</nvidia_smi_log>|\Z)", re.S)
_XML_FB = {k.lower(): v for k, v in _Q_FB.items()}  # (-q's fields, as -x names them)


@checks_values
def parse_nvidia_smi_xml(path: Path, text: str, tz_offset_s: int = 0, at: str | None = None) -> Parsed:
    """``nvidia-smi -q -x`` (one document, or one per interval with ``-l``): what ``-q`` says, as XML:
    per GPU its framebuffer total, reserved, used and free, its name, UUID and bus, and per process its
    used memory, at the document's timestamp (local). A document that is not well-formed (a file cut
    while nvidia-smi wrote it) is quarantined line by line."""
    p = Parsed(kind="nvidia-smi-q")
    p.lines = len(text.splitlines())
    split: dict[int, set[str]] = {}  # GPU -> its MIG instances (<gpu_instance_id>)
    covered, pos, no = 0, 0, 1  # lines inside documents read; where the line count stands
    for m in _XML_DOC.finditer(text):
        no, pos = no + text.count("\n", pos, m.start()), m.start()  # (counted on from the last document)
        n_lines = m.group(0).count("\n") + 1
        try:
            doc = ElementTree.fromstring(m.group(0))
        except ElementTree.ParseError as e:  # (every line of it, each with its number)
            why = f"nvidia-smi -x document not well-formed XML ({e})"
            p.quarantine += [(no + k, why if k == 0 else f"{why} (the document of line {no})", ln)
                             for k, ln in enumerate(m.group(0).split("\n"))]
            continue
        covered += n_lines
        stamp = (doc.findtext("timestamp") or "").strip()
        t = parse_time(stamp, tz_offset_s) if stamp else None
        p.naive_local_times = p.naive_local_times or t is not None
        for gpu, g in enumerate(doc.findall("gpu")):
            info = p.gpus.setdefault(gpu, {"index": gpu})
            for key, tag in (("name", "product_name"), ("uuid", "uuid")):
                if value := (g.findtext(tag) or "").strip():
                    info[key] = value
            if g.get("id"):
                info["pci_bus_id"] = g.get("id")
            for tag, metric in _XML_FB.items():
                v = _nv_value(g.findtext(f"fb_memory_usage/{tag}") or "", "")
                if v is not None:
                    p.samples.append((t, gpu, "nvidia-smi", metric, v))
                    if tag == "total":
                        info["total_bytes"] = int(v)
            for mig in g.findall("mig_devices/mig_device"):  # (a MIG instance's memory: a series of its own)
                gi = (mig.findtext("gpu_instance_id") or "").strip() or "?"
                for tag, metric in _XML_FB.items():
                    v = _nv_value(mig.findtext(f"fb_memory_usage/{tag}") or "", "")
                    if v is not None:
                        split.setdefault(gpu, set()).add(gi)
                        p.samples.append((t, gpu, mig_source("nvidia-smi", gi), metric, v))
            for proc in g.findall("processes/process_info"):
                pid, used = (proc.findtext("pid") or "").strip(), _nv_value(proc.findtext("used_memory") or "", "")
                if is_uint(pid) and used is not None:
                    p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{pid}", used))
    p.parsed = p.lines - len(p.quarantine)  # (the XML declaration and doctype around the documents are read)
    if not covered and not p.quarantine:
        p.quarantine += [(k, "no nvidia-smi -x document (<nvidia_smi_log>) in the file", ln)
                         for k, ln in enumerate(text.splitlines(), start=1)]
        p.parsed = 0
    _smi_mig(p, path, split)
    return _place_snapshot(p, path, text, at, tz_offset_s, "keep the <timestamp> of nvidia-smi -q -x")


NVSMI_HEADER_WORDS = ("name", "timestamp", "index", "gpu_name", "pid")  # (a line whose first two cells open
# with one of these, and which holds no date, is a header; so is one of nothing but --query-gpu property
# names, at least one of them dotted or with its unit: 'memory.total [MiB], memory.used [MiB], temperature.gpu')
NVSMI_FIELD = r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*(?: \[[^\],]*\])?"
NVSMI_FIELDS_LINE = re.compile(r"^[ \t]*" + NVSMI_FIELD + r"(?:[ \t]*,[ \t]*" + NVSMI_FIELD + r")*[ \t]*$")


def nvsmi_header(line: str, cells: list[str]) -> bool:
    """Whether an nvidia-smi CSV line is its header (``NVSMI_HEADER_WORDS``, a time column's name first,
    ``NVSMI_FIELDS_LINE``)."""
    if re.search(r"\d{4}/\d\d/\d\d", line):
        return False
    return any(c.startswith(NVSMI_HEADER_WORDS) for c in cells[:2]) or timecol.time_column(cells[0]) is not None or (
        ("." in line or "[" in line) and NVSMI_FIELDS_LINE.match(line) is not None)


def csv_cells(line: str) -> list[str]:
    """An nvidia-smi CSV line's cells, stripped."""
    return [c.strip() for c in line.split(",")]


def named_columns(header: list[str]) -> tuple[list[str], dict[str, str]]:
    """A CSV header's fields without their units ('memory.used [MiB]' -> 'memory.used'), and each one's
    header cell."""
    names = [h.split(" [")[0] for h in header]
    return names, dict(zip(names, header))


def row_clock(names: list[str], units: dict[str, str]) -> str | None:
    """The time column of a query CSV: its 'timestamp', else the first column named as a time relative
    to a start ('time [s]', 'elapsed', 't', ``timecol.time_column``)."""
    if "timestamp" in names:
        return "timestamp"
    return next((n for n in names if timecol.time_column(units.get(n, n)) is not None), None)


def _clock(names: list[str], units: dict[str, str], tz_offset_s: int) -> timecol.RowClock | None:
    name = row_clock(names, units)
    if name is None:
        return None
    return timecol.RowClock(name, timecol.time_column(units.get(name, name)),
                            lambda cell: parse_time(cell, tz_offset_s))


def nvidia_smi_rows(path: Path, text: str, tz_offset_s: int, columns: str | None) -> Parsed:
    p = Parsed(kind="nvidia-smi")
    lines = text.splitlines()
    p.lines = len(lines)
    header: list[str] | None = csv_cells(columns) if columns else None
    names, units = named_columns(header or [])
    bus_to_idx: dict[str, int] = {}
    by_bus = False
    clock = _clock(names, units, tz_offset_s)  # (a header line below may name another)
    unstated: set[int] = set()  # GPUs whose memory fields said none ('[N/A]')
    rows = 0
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            p.parsed += 1
            continue
        cells = csv_cells(ln)
        if nvsmi_header(ln, cells):
            header = cells  # (repeated) header line
            names, units = named_columns(header)
            if clock is None or clock.name != row_clock(names, units):
                clock = _clock(names, units, tz_offset_s)
            p.parsed += 1
            continue
        rows += 1
        if header is None:
            p.quarantine.append((i, HEADERLESS, ln))
            continue
        if len(cells) != len(header):
            p.quarantine.append((i, f"expected {len(header)} fields, found {len(cells)}", ln))
            continue
        row = dict(zip(names, cells))
        t, why = clock.read(row[clock.name]) if clock is not None else (None, None)
        if why is not None:
            p.quarantine.append((i, why, ln))
            continue
        p.naive_local_times |= clock is not None and clock.form == "absolute"
        if "pid" in row:  # --query-compute-apps
            p.kind = "nvidia-smi-apps"
            used = _nv_value(row.get("used_gpu_memory", ""), units.get("used_gpu_memory", ""))
            bus = row.get("gpu_bus_id", "")
            gpu = bus_to_idx.setdefault(bus, len(bus_to_idx))
            why = None if used is None else impossible("process_used_bytes", used)
            if why is not None:
                p.quarantine.append((i, why, ln))
                continue
            p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{row['pid']}", used if used is not None else float("nan")))
            p.parsed += 1
            continue
        if "index" in row and is_uint(row["index"]):
            gpu = int(row["index"])
        else:  # (numbered in order of appearance here, in nvidia-smi's order below)
            bus = row.get("pci.bus_id", row.get("uuid", ""))
            gpu = bus_to_idx.setdefault(bus, len(bus_to_idx))
            by_bus = "pci.bus_id" in row
        info = p.gpus.setdefault(gpu, {"index": gpu})
        for k_src, k in (("name", "name"), ("uuid", "uuid"), ("pci.bus_id", "pci_bus_id"), ("hostname", "host")):
            if row.get(k_src) and row[k_src] not in NV_UNKNOWN:
                info[k] = row[k_src]
        values = {metric: _nv_value(row[k_src], units[k_src]) for k_src, metric in NVSMI_GPU_FIELDS.items() if k_src in row}
        garbled = next((k for k, metric in NVSMI_GPU_FIELDS.items()
                        if k in row and values[metric] is None and not _nv_unknown(row[k])), None)
        if garbled is not None:  # (neither a value nor nvidia-smi's word for none: damaged on its way here)
            p.quarantine.append((i, f"{garbled}: {row[garbled]!r} is not a number", ln))
            continue
        total = values.get("device_total_bytes")  # (the row's own: what bounds its memory)
        why = next((w for metric, v in values.items() if v is not None and (w := impossible(metric, v, total))), None)
        if why is not None:  # (a figure no GPU can show: the row is damaged, as a garbled one)
            p.quarantine.append((i, why, ln))
            continue
        for metric, v in values.items():
            if v is not None:
                p.samples.append((t, gpu, "nvidia-smi", metric, v))
                if metric == "device_total_bytes":
                    info["total_bytes"] = int(v)
        if "device_used_bytes" in values and values["device_used_bytes"] is None:
            unstated.add(gpu)
        p.parsed += 1
    if clock is not None and clock.form in ("offset", "time of day"):
        timecol.hold(p, units.get(clock.name, clock.name), clock.form, tz_offset_s)
    if by_bus and p.kind == "nvidia-smi":
        _index_by_bus(p, bus_to_idx)  # (renumbers the GPUs: the ones without memory are told by their samples below)
    if unstated:
        note_no_memory(p, path, set(p.gpus) - {g for _, g, _, m, _ in p.samples if m == "device_used_bytes"})
    headerless = sum(1 for q in p.quarantine if q[1] == HEADERLESS)
    if headerless:
        p.notes.append(f"{path.name}: {headerless} rows without a header line: pass --nvsmi-columns with the --query-gpu "
                       "list they were logged with, e.g. 'timestamp, index, memory.total [MiB], memory.used [MiB]'")
    if header is not None and not rows and not columns:
        p.notes.append(header_only_note(path, "pid" in names))
    return p


def header_only_note(path: Path, apps: bool) -> str:
    """The note for an nvidia-smi CSV of a header and no rows."""
    if apps:
        return (f"{path.name}: a --query-compute-apps header and no rows: no process held GPU memory when it was "
                "queried (or the output was cut before its first row)")
    return (f"{path.name}: an nvidia-smi CSV header and no rows: no sample; nvidia-smi stopped, or the file was cut, "
            "before its first poll was written")


HEADERLESS = "headerless nvidia-smi CSV: pass --nvsmi-columns with the --query-gpu list"


def _index_by_bus(p: Parsed, bus_to_idx: dict[str, int]) -> None:
    """Rows without an index column are told apart by PCI bus id; nvidia-smi numbers GPUs in PCI bus
    order, so that order (not the order in which a poll happened to list them) gives their index."""
    order = {old: new for new, (_, old) in enumerate(sorted(bus_to_idx.items()))}
    if all(k == v for k, v in order.items()):
        return
    p.samples = [(t, None if g is None else order.get(g, g), src, m, v) for t, g, src, m, v in p.samples]
    p.gpus = {order[g]: {**info, "index": order[g]} for g, info in p.gpus.items()}


@checks_values
def parse_dmon(path: Path, text: str, tz_offset_s: int = 0) -> Parsed:
    """``nvidia-smi dmon`` and ``pmon``: columns from the two '#' header lines (they change across
    drivers); no times unless -o T/D was used, so rows are placed only when a time column exists. In
    pmon a row is a process, not a GPU: its fb column is that process's memory (``-s m``)."""
    p = Parsed(kind="nvidia-smi-dmon")
    lines = text.splitlines()
    p.lines = len(lines)
    cols: list[str] = []
    for i, ln in enumerate(lines, start=1):
        s = ln.strip()
        if not s:
            p.parsed += 1
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if toks and toks[0].lower() in ("gpu", "date", "time"):
                cols = [t.lower() for t in toks]
                if "pid" in cols:
                    p.kind = "nvidia-smi-pmon"
            p.parsed += 1
            continue
        vals = s.split()
        if p.kind == "nvidia-smi-pmon" and len(vals) > len(cols) and cols and cols[-1] == "command":
            vals = vals[:len(cols) - 1] + [" ".join(vals[len(cols) - 1:])]  # a command name with spaces
        if len(vals) != len(cols):
            p.quarantine.append((i, f"expected {len(cols)} fields, found {len(vals)}", ln))
            continue
        row = dict(zip(cols, vals))
        t = None
        if "date" in row and "time" in row:
            t = parse_time(f"{row['date'][:4]}-{row['date'][4:6]}-{row['date'][6:]} {row['time']}", tz_offset_s)
            p.naive_local_times = True
        try:
            gpu = int(row.get("gpu", row.get("idx", "0")) or 0)
            if p.kind == "nvidia-smi-pmon":
                if row.get("pid", "-") != "-" and row.get("fb", "-") != "-":  # ('-': no process on this GPU)
                    p.samples.append((t, gpu, "nvidia-smi", f"process_used_bytes:{row['pid']}", float(row["fb"]) * MiB))
                p.parsed += 1
                continue
            got = [(metric, float(row[c]) * scale) for c, metric, scale in (("fb", "device_used_bytes", MiB),
                                                                           ("mem", "util_mem_pct", 1.0))
                   if c in row and row[c] != "-"]
        except ValueError:  # (a row under another listing's header, a value that is no number)
            p.quarantine.append((i, f"not a row of the {' '.join(cols)} columns above it", ln))
            continue
        p.samples += [(t, gpu, "nvidia-smi", metric, value) for metric, value in got]
        p.parsed += 1
    if p.kind == "nvidia-smi-pmon" and "fb" not in cols:
        p.notes.append(f"{path.name}: pmon without its fb column holds no memory figures (use `nvidia-smi pmon -s um -o DT`)")
    if p.samples and all(s[0] is None for s in p.samples):
        p.notes.append(f"{path.name}: {p.kind[11:]} rows carry no time (use `nvidia-smi {p.kind[11:]} -o DT`); "
                       f"{len(p.samples)} values quarantined")
        p.quarantine.append((None, f"{len(p.samples)} dmon values without time", ""))
        p.samples = []
    return p


# --- as the registry reads them ---------------------------------------------------------------------
def sniff_dmon(head: str) -> str | None:
    """dmon or pmon, with -o DT or without."""
    if re.search(r"^#\s*(?:date\s+time\s+)?gpu\b", head, re.M | re.I) and re.search(r"^#.*\bidx\b", head, re.M | re.I):
        return "nvidia-smi-dmon"
    return None


def sniff_table(head: str) -> str | None:
    if "Memory-Usage" in head and "|" in head or re.search(r"^\|.*\d+MiB\s*/\s*\d+MiB\s*\|", head, re.M):
        return "nvidia-smi-table"
    return None


def sniff_q(head: str) -> str | None:
    """-q, as text or as XML with -x."""
    return "nvidia-smi-q" if re.search(r"^\s*FB Memory Usage\s*$", head, re.M) or "<nvidia_smi_log" in head else None


def sniff_csv(head: str) -> str | None:
    """The query CSV, by its header (a headerless one is known from --nvsmi-columns)."""
    first = head.splitlines()[0] if head else ""
    if ("memory.used" in first or "memory.total" in first or "used_gpu_memory" in first or
            ("NVIDIA" in first or "Tesla" in first) and " MiB" in first):
        return "nvidia-smi"
    return None


def _table(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_nvidia_smi_table(path, text, opts.tz_offset_s, opts.at)


def _q(path: Path, text: str, opts: RecordOptions) -> Parsed:
    parse = parse_nvidia_smi_xml if "<nvidia_smi_log" in text[:20000] else parse_nvidia_smi_q
    return parse(path, text, opts.tz_offset_s, opts.at)


def _dmon(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_dmon(path, text, opts.tz_offset_s)


PARSERS: dict[str, Parser] = {"nvidia-smi-table": _table, "nvidia-smi-q": _q, "nvidia-smi-dmon": _dmon}
# (its query CSV is read through its fast lane: ``fastsmi.PARSERS``)
