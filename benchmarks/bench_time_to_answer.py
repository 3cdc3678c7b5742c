"""Time to answer at fleet scale: a fleet's day of evidence → bundle → analysis → report → postmortem.

Builds, under a temporary folder, what an SRE has the morning after: the logs of 8 vLLM replicas
(each ``1.2 GiB × --scale``, from ``bench_record``'s real line shapes: engine lifetimes with requests,
stats, preemptions and an OOM; six in V1's INFO format, one in V0's request logging, one at DEBUG),
nvidia-smi polling of 64 GPUs (8 nodes, one CSV each, every second for ``24 h × --scale``), and a
Prometheus query_range export of the vLLM metrics of all 8 replicas (KV-cache usage, running and
waiting requests, every 15 s for the same span). Then runs the CLI as a user does (``replay record``,
``analyze``, ``report``, ``postmortem``, each a subprocess) and prints each stage's wall time and peak
anonymous RSS (sampled; the page cache of the inputs is not the tool's memory), the report's size
and the seconds headless Chromium takes to open and draw it. The same at a tenth of the scale gives
the ratio of peak memory (bounded means close to 1).

With ``--scanners GIB``, first times the log line classifiers the fast lane could use on a log of
GIB GiB against ``grep -c`` on the same file: replay's template scanner (``scan.scan_lines_file``,
grep's and its best of three, taken in turns), replay's Hyperscan scanner (``scan.scan``),
and, where installed, google-re2's Set (line by line), ahocorasick-rs (literals over the whole
buffer) and polars (lines read, one multi-literal pass). Each is timed by wall clock and CPU time
(this machine is shared: CPU time is the steadier ratio).

With ``--repeat N``, ``record`` runs N times at each scale and its median run is shown (and the ratio of
peaks taken from the medians): one run's peak on this machine moves by ±10 % from run to run. With
``--keep DIR``, evidence kept there by an earlier run at the same scale is used again.

Usage: python benchmarks/bench_time_to_answer.py [--scale 0.02] [--full] [--scanners 1.0] [--keep DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from bench_record import build, lifetime  # noqa: E402

REPLICAS = 8
NODES, GPUS_PER_NODE = 8, 8
LOG_GIB = 1.2  # a replica's log at --scale 1
DAY_S = 24 * 3600
PROM_STEP_S = 15
T0 = datetime(2026, 5, 1)  # the generator's logs start on 05-01


# --- the fleet's evidence ---------------------------------------------------------------------------

def _replica_block(k: int, j: int, requests: int) -> str:
    return lifetime(k, requests, debug=j == 7, v0=j == 6).replace("pid=3646", f"pid={3646 + j}").replace(
        "cmpl-", f"cmpl-r{j}")


def replica_log(path: Path, j: int, gib: float) -> int:
    """Replica ``j``'s log: its own process ids and request ids (each replica served its own traffic),
    in V0's request logging for replica 6 and at DEBUG for replica 7 (several versions' formats); the
    last lifetime is cut short to the size asked."""
    target, written, k = int(gib * 2**30), 0, 0
    per_request = len(_replica_block(0, j, 200)) / 200
    with path.open("w") as fh:
        while written < target:
            block = _replica_block(k, j, max(50, min(20_000, int((target - written) / per_request))))
            fh.write(block)
            written += len(block)
            k += 1
    return written


def nvidia_smi_node(path: Path, node: int, hours: float) -> int:
    """`nvidia-smi --query-gpu=... --format=csv -l 1` on one node's 8 H200s for ``hours``."""
    with path.open("w") as fh:
        fh.write("timestamp, index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]\n")
        for s in range(int(hours * 3600)):
            ts = (T0 + timedelta(seconds=s, milliseconds=s * 7919 % 1000)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
            fh.writelines(f"{ts}, {g}, NVIDIA H200, 143771 MiB, {(u := 20000 + (s * 13 + g * 977 + node * 331) % 100000)} MiB, "
                          f"{143771 - u} MiB, {(s + g) % 101} %\n" for g in range(GPUS_PER_NODE))
    return path.stat().st_size


def prometheus_export(path: Path, hours: float) -> int:
    """A query_range export of the vLLM metrics of every replica (``instance`` tells them apart)."""
    start = int(T0.timestamp())
    n = int(hours * 3600 // PROM_STEP_S)
    result = []
    for j in range(REPLICAS):
        for name, f in (("vllm:gpu_cache_usage_perc", lambda i, j=j: f"{((i * 7 + j * 13) % 100) / 100:.2f}"),
                        ("vllm:num_requests_running", lambda i, j=j: str((i + j) % 40)),
                        ("vllm:num_requests_waiting", lambda i, j=j: str((i * 3 + j) % 9))):
            result.append({"metric": {"__name__": name, "instance": f"vllm-{j}:8000", "model_name": "m"},
                           "values": [[start + i * PROM_STEP_S, f(i)] for i in range(n)]})
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    return path.stat().st_size


def fleet(root: Path, scale: float) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for j in range(REPLICAS):
        files.append(root / f"vllm-{j}.log")
        replica_log(files[-1], j, LOG_GIB * scale)
    hours = 24 * scale
    for node in range(NODES):
        files.append(root / f"smi-node{node}.csv")
        nvidia_smi_node(files[-1], node, hours)
    files.append(root / "vllm-metrics.json")
    prometheus_export(files[-1], hours)
    return files


# --- measuring the CLI ----------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    secs: float
    peak_bytes: int
    cpu_s: float


def _anon_bytes(p: psutil.Process) -> int:
    try:
        with open(f"/proc/{p.pid}/status") as fh:
            return sum(int(x.split()[1]) * 1024 for x in fh if x.startswith("RssAnon"))
    except OSError:
        return 0


def measured(name: str, argv: list[str]) -> Stage:
    """Run ``argv``, sampling the anonymous RSS of it and its children every 10 ms (its children looked for
    every 250 ms: walking /proc for them at each sample took a fifth of a core from the run measured)."""
    env = {**os.environ, "COLUMNS": "400"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        p = psutil.Process(proc.pid)
        kids: list[psutil.Process] = []
        looked = 0.0
        while not done.is_set():
            if time.perf_counter() - looked > 0.25:
                with contextlib.suppress(psutil.Error):
                    kids = p.children(recursive=True)
                looked = time.perf_counter()
            peak[0] = max(peak[0], _anon_bytes(p) + sum(_anon_bytes(c) for c in kids))  # (a process gone: 0)
            time.sleep(0.01)
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    out, err = proc.communicate()
    secs = time.perf_counter() - t
    done.set()
    th.join()
    if proc.returncode not in (0, 1):  # (exit 1: a finding, not a failure, for some commands)
        sys.exit(f"{name} failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Stage(name, secs, peak[0], cpu)


def chromium_open_s(html: Path, scratch: Path) -> tuple[float, float, bool] | None:
    """Seconds headless Chromium takes to load and draw the report (every figure rendered, no error),
    and to load a blank page (its own start)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={scratch}", "--dump-dom"]
    subprocess.run([chromium, *flags, "about:blank"], capture_output=True, text=True, timeout=300)  # (its first
    t = time.perf_counter()  # start in a new profile folder is slower than any after it)
    r = subprocess.run([chromium, *flags, html.as_uri()], capture_output=True, text=True, timeout=300)
    secs = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([chromium, *flags, "about:blank"], capture_output=True, text=True, timeout=300)
    blank = time.perf_counter() - t
    body = next((ln for ln in r.stdout.splitlines() if "<body" in ln), "")
    exp = body.split('data-figures-expected="')[1].split('"')[0] if "data-figures-expected" in body else "?"
    return secs, blank, 'data-errors="0"' in body and f'data-figures-rendered="{exp}"' in body


def evidence(root: Path, scale: float) -> list[Path]:
    """The fleet's evidence at ``scale`` under ``root``: built, or the files a run before this one built
    there (with --keep; a marker says they are whole and of which scale)."""
    marker = root / "evidence" / ".complete"
    if marker.exists() and marker.read_text() == f"{scale:g}":
        return sorted(p for p in (root / "evidence").iterdir() if not p.name.startswith("."))
    files = fleet(root / "evidence", scale)
    os.sync()
    marker.write_text(f"{scale:g}")
    return files


def median_stage(runs: list[Stage]) -> Stage:
    """The stage's median run: wall time, CPU time and peak each the median of the runs' own."""
    def mid(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]
    return Stage(runs[0].name, mid([r.secs for r in runs]), int(mid([r.peak_bytes for r in runs])),
                 mid([r.cpu_s for r in runs]))


def pipeline(root: Path, scale: float, repeat: int = 1) -> tuple[list[Stage], list[Stage], int, int]:
    """Build the fleet's evidence at ``scale`` (or reuse it) and run the four stages, ``record``
    ``repeat`` times; (stages, the record's runs, evidence bytes, report bytes). With repeats, the
    record's stage is its median run (this machine's runs of one record differ by 10-20 %)."""
    files = evidence(root, scale)
    size = sum(f.stat().st_size for f in files)
    bundle, html, pm = root / "fleet.bundle", root / "fleet.html", root / "postmortem.md"
    replay = [sys.executable, "-m", "replay"]
    runs = []
    for _ in range(repeat):
        shutil.rmtree(bundle, ignore_errors=True)
        runs.append(measured("record", [*replay, "record", *map(str, files), "-o", str(bundle), "--year", "2026"]))
    stages = [median_stage(runs),
              measured("analyze", [*replay, "analyze", str(bundle)]),
              measured("report", [*replay, "report", str(bundle), "-o", str(html)]),
              measured("postmortem", [*replay, "postmortem", str(bundle), "-o", str(pm)])]
    return stages, runs, size, html.stat().st_size


# --- scanner candidates ---------------------------------------------------------------------------

def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _grep_s(log: Path) -> tuple[float, float]:
    """Wall and CPU seconds of ``grep -c`` over the log."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(["grep", "-c", "KV cache usage", str(log)], capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _best(times: list[tuple[float, float]]) -> tuple[float, float]:
    return min(w for w, _ in times), min(c for _, c in times)


def scanners(gib: float) -> None:
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / "big.log"
        build(log, gib)
        os.sync()
        subprocess.run(["cat", str(log)], stdout=subprocess.DEVNULL)  # (in the page cache for every candidate)
        from replay.record import scan
        scan.database()
        # grep and the template scanner in turns, the best of three each (this machine is shared: a run
        # beside another's is slower, the best is the closest to the machine's own)
        grep_t: list[tuple[float, float]] = []
        lines_t: list[tuple[float, float]] = []
        got: list[scan.LineClasses] = []
        for _ in range(3):
            grep_t.append(_grep_s(log))
            lines_t.append(_timed(lambda: got.append(scan.scan_lines_file(log))))
        grep_s, grep_cpu = _best(grep_t)
        size = log.stat().st_size
        print(f"scanners on a {size / 2**30:.2f} GiB log: grep -c {grep_s:.2f} s wall, {grep_cpu:.2f} s CPU (best of 3)")
        w, c = _best(lines_t)
        counts = got[-1].counts()
        print(f"  {'templates: every line (replay scan_lines)':<44} {w:6.2f} s wall x{w / grep_s:5.1f}, {c:6.2f} s CPU "
              f"x{c / grep_cpu:5.1f} of grep  (best of 3; {len(got[-1].codes):,} lines, {counts['reference']:,} left to "
              f"the reference)")
        with log.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            _scanner_rows(mm, size, grep_s, grep_cpu)


def _scanner_rows(mm: mmap.mmap, size: int, grep_s: float, grep_cpu: float) -> None:
    def row(name: str, wall: float, cpu: float, part: float = 1.0, note: str = "") -> None:
        wall, cpu = wall / part, cpu / part
        print(f"  {name:<44} {wall:6.2f} s wall x{wall / grep_s:5.1f}, {cpu:6.2f} s CPU x{cpu / grep_cpu:5.1f} of grep"
              + (f"  ({note})" if note else ""))

    from replay.record import scan
    scan.database()
    got: list[scan.LineClasses] = []
    w, c = _timed(lambda: got.append(scan.scan(mm)))
    row("hyperscan: every line's class (replay)", w, c, note=f"{len(got[0].codes):,} lines, {got[0].counts()['reference']:,} left to the reference")
    head = mm[: min(size, 64 << 20)]
    head = head[: head.rfind(b"\n") + 1]
    part = len(head) / size  # (the slower candidates run on the first 64 MiB: their time is scaled up)
    try:
        import re2  # type: ignore[import-not-found]
        s = re2.Set.SearchSet()
        for _, p in scan.PATTERNS:
            s.Add(p)
        s.Compile()
        lines = head.split(b"\n")
        w, c = _timed(lambda: [s.Match(ln) for ln in lines])
        row("google-re2 Set, line by line", w, c, part, "first 64 MiB, scaled")
    except ImportError:
        print("  google-re2: not installed")
    try:
        import ahocorasick_rs  # type: ignore[import-not-found]
        ac = ahocorasick_rs.BytesAhoCorasick([b"Added request ", b"Finished request ", b"KV cache usage", b' - "',
                                              *(w.encode() for w in scan.INERT_UNLESS)])
        w, c = _timed(lambda: ac.find_matches_as_indexes(head))
        row("ahocorasick-rs: literals over the buffer", w, c, part, "first 64 MiB, scaled; literal hits, no classes")
    except ImportError:
        print("  ahocorasick-rs: not installed")
    from replay.record import fastlog
    with tempfile.TemporaryDirectory() as td:
        piece = Path(td) / "head.log"
        piece.write_bytes(head)
        got_ff: list[fastlog.FastFacts] = []
        w, c = _timed(lambda: got_ff.append(fastlog.parse_log_file(piece, Path(td) / "spill", templates=True)[1]))
        row("fastlog: the fast lane's whole parse", w, c, part,
            f"first 64 MiB, scaled; facts and all; {got_ff[0].template_lines:,} of {got_ff[0].lines:,} fast lines by templates")
        w, c = _timed(lambda: fastlog.parse_log_file(piece, Path(td) / "spill-polars", templates=False))
        row("fastlog without templates (polars alone)", w, c, part, "first 64 MiB, scaled; facts and all")
    import polars as pl

    def polars_pass() -> None:
        raw = pl.read_csv(head, has_header=False, separator="\x01", quote_char=None, new_columns=["raw"],
                          infer_schema=False, comment_prefix=None)["raw"]
        raw.str.contains_any(["Added request ", "Finished request ", "KV cache usage", ' - "', *scan.INERT_UNLESS])
    w, c = _timed(polars_pass)
    row("polars: lines read, one multi-literal pass", w, c, part, "first 64 MiB, scaled; one pass of fastlog's dozen")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=0.02, help="of a fleet's day: 1 is 8 × 1.2 GiB of logs and 24 h of 64 GPUs")
    ap.add_argument("--full", action="store_true", help="the issue's full size (--scale 1)")
    ap.add_argument("--scanners", type=float, default=0.0, help="GiB of log to time the line classifiers on (0: none)")
    ap.add_argument("--keep", type=Path, help="keep the evidence, bundle and report here (and reuse evidence kept before)")
    ap.add_argument("--repeat", type=int, default=1, help="record this many times at each scale; its median is shown")
    a = ap.parse_args()
    if a.scanners:
        scanners(a.scanners)
    scale = 1.0 if a.full else a.scale
    peaks = {}
    for s in (scale / 10, scale):
        root = (a.keep / f"scale-{s:g}") if a.keep else Path(tempfile.mkdtemp(prefix="fleet-"))
        try:
            stages, runs, size, report = pipeline(root, s, a.repeat)
            shot = chromium_open_s(root / "fleet.html", root / "chromium")
        finally:
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
        total = sum(st.secs for st in stages)
        peaks[s] = max(st.peak_bytes for st in stages)
        print(f"scale {s:g}: {size / 2**30:.2f} GiB of evidence -> postmortem in {total:.1f} s "
              f"(target < 60 s at scale 1); peak anon RSS {peaks[s] / 2**20:.0f} MiB; report {report / 2**20:.1f} MB")
        for st in stages:
            print(f"  {st.name:<10} {st.secs:7.2f} s  (CPU {st.cpu_s:6.2f} s)  peak anon RSS {st.peak_bytes / 2**20:6.0f} MiB"
                  + (" (median of runs below)" if st.name == "record" and len(runs) > 1 else ""))
        if len(runs) > 1:
            print("  record runs: " + "; ".join(f"{r.secs:.1f} s, {r.peak_bytes / 2**20:.0f} MiB" for r in runs))
        if shot is not None:
            print(f"  chromium   {shot[0]:7.2f} s to open and draw the report ({'every figure drawn' if shot[2] else 'NOT every figure drawn'}; "
                  f"{shot[1]:.2f} s of it Chromium's own start, a blank page's)")
    print(f"peak memory ratio, scale {scale:g} vs {scale / 10:g}: {peaks[scale] / peaks[scale / 10]:.2f} (bounded: within 0.8-1.2)")


if __name__ == "__main__":
    main()
