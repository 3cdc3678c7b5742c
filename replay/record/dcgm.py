"""DCGM: dcgm-exporter's field lists (its -f file), ``dcgmi dmon`` output, and the hosts, pods and MIG
instances of DCGM samples read from Prometheus scrapes.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from replay.bundle import SAMPLES_SCHEMA, mig_source
from replay.record.common import Parsed, Parser, checks_values, lines_in, parse_time
from replay.record.options import RecordOptions
from replay.units import MiB, is_uint

DCGM_METRICS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_FB_USED": ("device_used_bytes", MiB),
    "DCGM_FI_DEV_FB_FREE": ("device_free_bytes", MiB),
    "DCGM_FI_DEV_FB_RESERVED": ("device_reserved_bytes", MiB),
    "DCGM_FI_DEV_FB_TOTAL": ("device_total_bytes", MiB),
}


def dcgm_gpu(labels: dict[str, str]) -> int | None:
    """The GPU index a DCGM series states ('gpu', or 'GPU' in older exporters); None where none."""
    g = (labels.get("gpu") or labels.get("GPU") or "").strip()
    return int(g) if is_uint(g) else None


# labels that name the machine a DCGM series comes from, in the order they are trusted: the exporter's
# own Hostname (the node), then what Prometheus or Kubernetes add ('instance' changes when the
# exporter's pod restarts, so it counts only where nothing better is there)
HOST_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "nodename", "host", "instance")


def _names_of_host(labels: dict[str, str]) -> set[str]:
    return {n for k in HOST_LABELS if (v := labels.get(k)) for n in (v, v.rsplit(":", 1)[0])}


def dcgm_hosts(p: Parsed, path: Path, host: str | None, instance: str | None = None) -> Parsed:
    """Tell apart DCGM series of several machines (a cluster-wide query or federation): GPU 0 of
    node-1 and GPU 0 of node-2 are not one series. Each host's samples get a source of their own
    ('dcgm[Hostname=node-2]'), except those of ``host`` (--host: the node vLLM ran on), which stay the
    bundle's device memory ('dcgm'). GPU names and UUIDs go into the bundle's GPUs only from series
    that stay 'dcgm'. With one host, nothing changes.

    A GPU split into MIG instances has a framebuffer series per instance (label GPU_I_ID), each of
    them the memory of a device of its own: where one GPU has several, each instance's samples get a
    source of their own too ('dcgm[GPU_I_ID=3]'), except those of ``instance`` (--gpu-instance: the
    one vLLM ran in, 'ID' of any GPU or 'GPU:ID'), which stay the bundle's device memory."""
    framed = len(p.dcgm_labels)  # (entries past it index frames: a series read as columns)
    series, p.dcgm_labels, p.dcgm_frames = p.dcgm_labels + p.dcgm_frames, [], []
    key = next((k for k in HOST_LABELS if any(k in labels for _, labels in series)), "")
    hosts = sorted({labels.get(key, "") for _, labels in series}) if key else []
    several = len(hosts) > 1
    chosen = [host is not None and host in _names_of_host(labels) for _, labels in series]
    split = _mig_split(series, key)

    def tag(i: int, k: int, tagged: str) -> None:
        if i >= framed:
            p.frames[k] = p.frames[k].with_columns(source=pl.lit(tagged))
        else:
            t, gpu, _, metric, value = p.samples[k]
            p.samples[k] = (t, gpu, tagged, metric, value)

    for i, ((k, labels), ours) in enumerate(zip(series, chosen, strict=True)):
        if several and not ours:
            tag(i, k, f"dcgm[{key}={labels.get(key, '')}]")
            continue
        gpu = dcgm_gpu(labels)
        gi = (labels.get("GPU_I_ID") or "").strip()
        if gpu is not None and (labels.get(key, ""), gpu) in split and instance not in (gi, f"{gpu}:{gi}"):
            tag(i, k, mig_source("dcgm", gi))  # (its GPU's name and UUID are the GPU's still)
        if gpu is not None:
            info = p.gpus.setdefault(gpu, {"index": gpu})
            info.update({k: v for k, v in (("uuid", labels.get("UUID") or labels.get("uuid")),
                                           ("name", labels.get("modelName")), ("host", labels.get(key))) if v})
    if several:
        mine = any(chosen)
        shown = ", ".join(hosts[:6]) + (", …" if len(hosts) > 6 else "")
        p.notes.append(f"{path.name}: DCGM series from {len(hosts)} hosts ({shown}): each host's GPUs are a series of "
                       f"their own (source 'dcgm[{key}=…]')" + (
                           f"; {host}'s are the bundle's device memory (source 'dcgm')" if mine else
                           f"; no series is from --host {host}" if host else
                           "; pass --host with the node vLLM ran on to make its series the bundle's device memory"))
    elif host is not None and hosts and not any(chosen):
        p.notes.append(f"{path.name}: --host {host}, but its DCGM series come from {hosts[0]} alone (kept as they are)")
    _dcgm_pods(p, path, series, framed, [not (several and not ours) for ours in chosen], key)
    for (_, gpu), ids in sorted(split.items()):
        picked = next((gi for gi in ids if instance in (gi, f"{gpu}:{gi}")), None)
        p.notes.append(f"{path.name}: GPU {gpu} is split into MIG instances (GPU_I_ID {', '.join(ids)}): each instance's "
                       "memory is a series of its own (source 'dcgm[GPU_I_ID=…]')" + (
                           f"; instance {picked}'s is the bundle's device memory (source 'dcgm')" if picked else
                           f"; none is --gpu-instance {instance}" if instance else
                           "; pass --gpu-instance with the one vLLM ran in to make its series the bundle's device memory"))
    return p


def _pod_of(labels: dict[str, str]) -> str | None:
    """The Kubernetes pod a DCGM series is attributed to ('namespace/pod'), as the exporter labels it
    ('exported_' first: what Prometheus renames when its own target labels clash); None where none."""
    pod = labels.get("exported_pod") or labels.get("pod")
    ns = labels.get("exported_namespace") or labels.get("namespace")
    return (f"{ns}/{pod}" if ns else pod) if pod else None


def _dcgm_pods(p: Parsed, path: Path, series: list[tuple[int, dict[str, str]]], framed: int, ours: list[bool],
               key: str) -> None:
    """The pods DCGM attributes each GPU to, into the bundle's GPUs ('pods'), and its framebuffer
    samples once each. DCGM's framebuffer figures are the whole device's: the pod label says which pod
    holds the GPU, not what that pod uses. Where several pods hold one device at the same time (MPS,
    time-slicing: the exporter repeats the device's series under each pod), the samples that repeat
    one another are one fact, and a note says the GPU was shared (its memory is every tenant's). Pods
    that follow one another on a GPU (a restart's new name) share nothing."""
    pods = [_pod_of(labels) for _, labels in series]
    devices: dict[tuple[str, int, str], set[str]] = {}
    for (_, labels), pod, mine in zip(series, pods, ours, strict=True):
        gpu = dcgm_gpu(labels)
        if gpu is None or pod is None:
            continue
        devices.setdefault((labels.get(key, "") if key else "", gpu, (labels.get("GPU_I_ID") or "").strip()), set()).add(pod)
        if mine:
            info = p.gpus.setdefault(gpu, {"index": gpu})
            info["pods"] = sorted({*info.get("pods", []), pod})
    if all(len(v) < 2 for v in devices.values()):
        return
    # each sample's pod, beside it: the listed samples' by their index, a framed series' for the whole frame
    listed: list[str | None] = [None] * len(p.samples)
    framed_pod: dict[int, str | None] = {}
    for i, ((k, _), pod) in enumerate(zip(series, pods, strict=True)):
        if i < framed:
            listed[k] = pod
        else:
            framed_pod[k] = pod
    parts = [f.with_columns(pod=pl.lit(framed_pod.get(k), pl.Utf8)) for k, f in enumerate(p.frames)]
    if p.samples:
        parts.append(pl.DataFrame(p.samples, schema=SAMPLES_SCHEMA, orient="row", strict=False).with_columns(
            pod=pl.Series(listed, dtype=pl.Utf8)))
    df = pl.concat(parts, how="vertical_relaxed")
    at = ["t_us", "gpu", "source", "metric"]
    dcgm = pl.col("source").str.starts_with("dcgm") & pl.col("pod").is_not_null()
    shared = (df.filter(dcgm).group_by(at).agg(pl.col("pod").unique()).filter(pl.col("pod").list.len() > 1)
              .group_by("gpu", "source").agg(pl.col("pod").list.explode().unique().sort()).sort("gpu", "source"))
    kept = df.filter(~dcgm | pl.struct(*at, "value").is_first_distinct()).drop("pod")
    p.frames, p.samples = [kept.cast(SAMPLES_SCHEMA)], []  # type: ignore[arg-type]
    for gpu, source, names in shared.iter_rows():
        if source == "dcgm" and gpu in p.gpus:  # (the bundle's own GPUs: the analysis makes a finding of it)
            p.gpus[gpu]["shared_by"] = sorted({*p.gpus[gpu].get("shared_by", []), *names})
        shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        where = f" ({source})" if source != "dcgm" else ""
        p.notes.append(f"{path.name}: GPU {gpu}{where} was shared by {len(names)} pods at once ({shown}; MPS or "
                       "time-slicing): its DCGM memory is the whole GPU's, every tenant's together, repeated under each pod")
    if df.height > kept.height:
        p.notes.append(f"{path.name}: DCGM samples repeating another's GPU, time and value under another pod's labels: "
                       f"{df.height - kept.height}, kept once")


def _mig_split(series: list[tuple[int, dict[str, str]]], key: str) -> dict[tuple[str, int], list[str]]:
    """The GPUs (host, index) whose DCGM series are of several MIG instances, with their GPU_I_IDs."""
    ids: dict[tuple[str, int], set[str]] = {}
    for _, labels in series:
        gpu, gi = dcgm_gpu(labels), (labels.get("GPU_I_ID") or "").strip()
        if gpu is not None and gi:
            ids.setdefault((labels.get(key, "") if key else "", gpu), set()).add(gi)
    return {g: instance_order(v) for g, v in ids.items() if len(v) > 1}


def instance_order(ids: set[str]) -> list[str]:
    """MIG instance ids (GPU_I_ID) in number order, as text: '3', '5', '13'."""
    return sorted(ids, key=lambda x: (len(x), x))


# `dcgmi dmon -e …` columns by the short names it prints (fields 250-252, 203-204), MiB and percent
DCGMI_COLUMNS = {"FBTTL": ("device_total_bytes", MiB), "FBFRE": ("device_free_bytes", MiB),
                 "FBUSD": ("device_used_bytes", MiB), "GPUTL": ("util_gpu_pct", 1.0), "MCUTL": ("util_mem_pct", 1.0)}


# dcgm-exporter's counters file (its -f): 'DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).'
DCGM_COUNTER_LINE = re.compile(r"^\s*(?P<field>DCGM_(?:FI|EXP)_[A-Z0-9_]+)\s*,\s*(?P<type>gauge|counter|label)\s*,"
                               r"\s*(?P<help>.*)$", re.I)


def parse_dcgm_counters(path: Path, text: str) -> Parsed:
    """dcgm-exporter's counters file: not samples, but which fields its scrapes can hold. What it says
    about device memory is noted (a field left out, such as FB_RESERVED in its older default list, is
    absent from every scrape, not zero); a line of another shape is quarantined."""
    p = Parsed(kind="dcgm-counters")
    p.lines = lines_in(text)
    fields: list[str] = []
    for i, ln in enumerate(text.splitlines(), start=1):
        s = ln.strip()
        m = DCGM_COUNTER_LINE.match(s)
        if m:
            fields.append(m["field"].upper())
        elif s and not s.startswith("#"):
            p.quarantine.append((i, "not a counters line ('DCGM_FI_…, gauge|counter|label, help') or a comment", ln))
            continue
        p.parsed += 1
    memory = [f.removeprefix("DCGM_FI_DEV_") for f in DCGM_METRICS if f in fields]
    missing = [f.removeprefix("DCGM_FI_DEV_") for f in DCGM_METRICS if f not in fields]
    p.notes.append(f"dcgm-exporter's counters file: {len(fields)} fields it exports (no samples); device memory: "
                   + (", ".join(memory) if memory else "none")
                   + (f"; not exported, so absent from its scrapes: {', '.join(missing)}" if missing else ""))
    return p



@checks_values
def parse_dcgmi_dmon(path: Path, text: str, at: str | None = None, interval_s: float = 1.0, tz_offset_s: int = 0) -> Parsed:
    """``dcgmi dmon -e …``: a '#Entity' header of field short names, a units line ('ID … W C'), then
    one row per entity ('GPU 0', 'GPU-I 1') per sample. Its rows carry no time: with ``at`` (when it
    started) the n-th sample of an entity is placed n × ``interval_s`` later (dcgmi's -d, 1000 ms by
    default), else the values are quarantined, said in a note, as for nvidia-smi dmon."""
    p = Parsed(kind="dcgmi-dmon")
    lines = text.splitlines()
    p.lines = len(lines)
    cols: list[str] = []
    seen: dict[str, int] = {}  # entity -> samples so far
    start = parse_time(at, tz_offset_s) if at else None
    for i, ln in enumerate(lines, start=1):
        s = ln.strip()
        m = re.match(r"^(GPU(?:-I|-CI)?)\s+(\d+)\s+(.*)$", s)
        if not m and (not s or s.startswith(("#Entity", "ID"))):  # (blank, the header, its units line)
            cols = s.split()[1:] if s.startswith("#Entity") else cols
            p.parsed += 1
            continue
        vals = m.group(3).split() if m else []
        if not m or not cols or len(vals) != len(cols):
            p.quarantine.append((i, f"not a dcgmi dmon row of {len(cols)} fields" if cols else "a row before the #Entity header", ln))
            continue
        entity = f"{m.group(1)} {m.group(2)}"
        n = seen.get(entity, 0)
        seen[entity] = n + 1
        t = None if start is None else start + round(n * interval_s * 1_000_000)
        gpu = int(m.group(2)) if m.group(1) == "GPU" else None  # (a MIG instance is not a GPU index)
        bad = []
        for c, v in zip(cols, vals, strict=True):
            if c in DCGMI_COLUMNS and v not in ("N/A", "-"):
                try:
                    val = float(v)
                except ValueError:
                    bad.append(f"{c}: not a number ({v!r})")
                    continue
                metric, scale = DCGMI_COLUMNS[c]
                p.samples.append((t, gpu, "dcgm", metric if gpu is not None else f"{metric}:{entity}", val * scale))
        if bad:  # (its other values are kept; the line is counted once, as quarantined)
            p.quarantine.append((i, "; ".join(bad), ln))
        else:
            p.parsed += 1
    if cols and not any(c in DCGMI_COLUMNS for c in cols):
        p.notes.append(f"{path.name}: dcgmi dmon without memory fields ({' '.join(cols)}); use `dcgmi dmon -e 250,251,252`")
    if p.samples and start is None:
        p.notes.append(f"{path.name}: dcgmi dmon rows carry no time; give --at (when it started) to place them, "
                       f"{len(p.samples)} values quarantined")
        p.quarantine.append((None, f"{len(p.samples)} dcgmi dmon values without time", ""))
        p.samples = []
    elif p.samples:
        p.notes.append(f"{path.name}: dcgmi dmon rows carry no time: placed from --at every {interval_s:g} s "
                       "(dcgmi's -d; give --interval if it ran with another)")
    return p


# --- as the registry reads them ---------------------------------------------------------------------
def sniff_dmon(head: str) -> str | None:
    return "dcgmi-dmon" if re.match(r"#Entity\s+\w", head.lstrip()) else None


def sniff_counters(head: str) -> str | None:
    """dcgm-exporter's -f file: which fields it exports (a stray line is quarantined)."""
    fields = [ln for ln in head.splitlines()[:200] if ln.strip() and not ln.lstrip().startswith("#")][:50]
    matched = sum(1 for ln in fields if DCGM_COUNTER_LINE.match(ln.strip()))
    return "dcgm-counters" if matched >= 3 and matched >= 0.8 * len(fields) else None


def _counters(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_dcgm_counters(path, text)


def _dmon(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_dcgmi_dmon(path, text, opts.at, opts.rows_interval_s, opts.tz_offset_s)


PARSERS: dict[str, Parser] = {"dcgmi-dmon": _dmon, "dcgm-counters": _counters}
