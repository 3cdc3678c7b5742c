"""The ``replay`` command line: one thin adapter per verb; the work lives in the pipeline modules.

record -> bundle -> run (replay) -> analyze -> report / postmortem / check.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import platform
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from replay.atomic import WRITE_WHY, unpart, write_error
from replay.errors import EXIT_CHECK_FAILED, EXIT_IO, EXIT_TERMINATED, ReplayError
from replay.text import console as _console
from replay.text import printable

if TYPE_CHECKING:
    from replay.engine.model import VisionTower

app = typer.Typer(
    name="replay", no_args_is_help=True, rich_markup_mode="rich", add_completion=False,
    pretty_exceptions_enable=False,
    help="Postmortem replay and forensics for vLLM out-of-memory incidents.\n\n"
    "Typical flow: [bold]replay record[/] the evidence into a bundle, [bold]replay run[/] the traffic "
    "through a real vLLM of the chosen version, [bold]replay report[/] the divergence between what vLLM "
    "reported and what was actually used.",
)
versions_app = typer.Typer(help="Manage the per-version vLLM environments (one virtualenv each).", no_args_is_help=True)
app.add_typer(versions_app, name="versions")
# (what they print has its control characters shown, not obeyed; off a terminal, lines are not wrapped)
out_console = _console()
err = _console(stderr=True)


def _bytes_progress(title: str) -> Progress:
    """A progress bar over the bytes of the input read, with rate and time left, gone when done (and
    not drawn where stderr is no terminal: it left a blank line before what followed)."""
    return Progress(TextColumn(title), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                    console=err, transient=True, disable=not err.is_terminal)


def _window(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    from replay.units import parse_duration_us
    a, _, b = text.partition(":")
    lo = parse_duration_us(a) if a else 0
    hi = parse_duration_us(b) if b else 2**62
    if lo is None or hi is None or hi <= lo:
        raise ReplayError(f"--window {text!r}: expected START:END such as 600s:1200s or 10m:20m", 2)
    return lo, hi


def _capacity_bytes(gib: float | None) -> int | None:
    if gib is None:
        return None
    if not math.isfinite(gib):  # (0 and below are refused with the run's other options)
        raise ReplayError(f"--capacity-gib: expected a limit above 0 GiB, got {gib}", 2)
    return int(gib * 2**30)


def _named_path(text: str) -> Path:
    """A path argument as given; an empty one (an unset variable, say) is refused, not read as the
    current folder: for evidence, that would record every file under it."""
    if not text:
        raise typer.BadParameter("an empty path (an unset shell variable?): name a file or folder, or '.' for this one")
    return Path(text)


def _file_out(path: Path, example: str, flag: str = "-o") -> Path:
    """An output file the user named: refused at once where a folder is in its place (it failed only
    when the work was done, as an internal error)."""
    if path.is_dir():
        raise ReplayError(f"{flag} {path}: is a folder; name a file to write, such as {path / example}", 2)
    return path


def _bundle_out(path: Path, force: bool = False) -> Path:
    """An output bundle: refused at once where a file is in its place, or a folder that is not a
    bundle and holds files (unless ``force``: it is written among them, which are kept); a file of a
    bundle's own name there is refused even so (``replay.bundle.check_out``)."""
    from replay.bundle import check_out
    check_out(path, force)
    return path


_OS_WHY = {errno.EISDIR: "is a folder", errno.ENOTDIR: "a part of the path is a file, not a folder",
           errno.ENOENT: "no such file or folder", errno.EACCES: "permission denied", errno.EPERM: "not permitted",
           errno.EROFS: "on a read-only file system", errno.ENOSPC: "no space left on the device",
           errno.EDQUOT: "over the disk quota", errno.EEXIST: "is in the way: a file where a folder is needed"}


def os_error_message(e: OSError) -> str:
    """What a failed read or write of a named path says to the user: the path (the target of a rename;
    the output, for the part file or partial bundle folder it is written through) and why, in words."""
    name = e.filename2 if e.filename2 is not None else e.filename
    path = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)
    why = _OS_WHY.get(e.errno or 0) or WRITE_WHY.get(e.errno or 0) or (e.strerror or str(e)).lower()
    path = re.sub(r"\.partial-\d+(?:-\d+)?(?=/|$)", "", path)  # (a bundle is written in OUT.partial-PID)
    return f"{unpart(path)}: {why}"  # (what is written goes to a part file first)


@app.command("import")
def import_cmd(
    fmt: Annotated[str, typer.Argument(help="Source format: azure, burstgpt, mooncake, vllm-timed-trace (vLLM bench's timed_trace: timestamps in seconds; auto tells it by its decimal timestamps), bailian, vidur, splitwise, vllm-bench, sharegpt (the conversations of vLLM's --dataset-name sharegpt, a JSON array or JSON lines: the first turn is the prompt, every request arrives at 0), servegen-offline (a batch job of Alibaba Model Studio: every request arrives at 0), or auto to tell it from the file's columns.")],
    src: Annotated[Path, typer.Argument(help="The public trace file (.csv, .jsonl, optionally gzip, bzip2 or xz).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Trace to write (replay-trace/1 JSONL).")] = Path("trace.jsonl"),
) -> None:
    """Import a public LLM serving trace into the replay-trace/1 format (lossless: unmapped columns kept)."""
    from replay.trace.importers import import_trace
    _file_out(out, "trace.jsonl")
    try:
        with _bytes_progress("[bold]import[/] {task.description}") as prog:
            task = prog.add_task("", total=None)
            r = import_trace(fmt, src, out, progress=lambda done, total, what: prog.update(
                task, completed=done, total=total, description=what))
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted[/]: nothing written; {escape(str(out))} is as it was")
        raise typer.Exit(130) from None
    err.print(f"[green]wrote[/] {escape(str(out))}: {r.rows_emitted} requests of {r.rows_read} rows"
              + (f" (read as {r.format})" if fmt == "auto" else "")
              + (f", [yellow]{r.quarantined} quarantined[/] -> {escape(str(r.quarantine_path))}" if r.quarantined else ""))


@app.command("export")
def export_cmd(
    src: Annotated[Path, typer.Argument(help="A replay-trace/1 file, or a bundle directory with --perfetto.")],
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="Trace export format: vllm-timed-trace (vLLM bench serve's timed_trace: arrival times kept), aiperf-mooncake (AIPerf's mooncake_trace: arrival times kept), vllm-bench (vLLM bench serve's custom dataset: prompts, no arrival times). hash_ids are synthesised per block where the trace has none, and said so.")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="File to write.")] = None,
    perfetto: Annotated[Path | None, typer.Option("--perfetto", help="Write the bundle's timeline as Chrome trace events.")] = None,
    window: Annotated[str | None, typer.Option(help="With --perfetto: only the slice START:END of the timeline (from its t0), e.g. 10m:20m.")] = None,
) -> None:
    """Export a trace to another tool's format, or a bundle's timeline to Perfetto."""
    if perfetto is not None:
        _file_out(perfetto, "timeline.json", "--perfetto")
        from replay.bundle import read_bundle
        from replay.report.perfetto import LARGE_BYTES, write_perfetto
        with err.status(f"writing {escape(str(perfetto))}"):
            n = write_perfetto(read_bundle(src), perfetto, _window(window))
        err.print(f"[green]wrote[/] {escape(str(perfetto))}: {n} trace events (open in ui.perfetto.dev)")
        size = perfetto.stat().st_size
        if size > LARGE_BYTES:
            err.print(f"[yellow]note:[/] {size >> 20} MiB is more than Perfetto's UI loads of a JSON trace; "
                      "export a slice of the timeline with --window START:END (e.g. --window 10m:20m)")
        return
    if window is not None:
        raise ReplayError("--window goes with --perfetto", 2)
    if fmt is None or out is None:
        raise ReplayError("give --format and -o for a trace export, or --perfetto FILE for a bundle", 2)
    from replay.trace.exporters import export_trace
    r = export_trace(fmt, src, _file_out(out, f"trace.{fmt}.jsonl"))
    err.print(f"[green]wrote[/] {escape(str(out))}: {r.requests} requests")
    for note in r.notes:
        err.print(f"[yellow]note:[/] {escape(note)}")


@app.command()
def synth(
    out: Annotated[Path, typer.Option("-o", "--out", help="Trace to write.")] = Path("synth.jsonl"),
    requests: Annotated[int | None, typer.Option(help="Number of requests (default 1000); with --servegen, the most to keep.")] = None,
    rate: Annotated[float, typer.Option(help="Mean arrival rate, requests/s.")] = 5.0,
    arrival: Annotated[str, typer.Option(help="poisson or bursty.")] = "poisson",
    context_len: Annotated[int, typer.Option(help="Model context length; prompt+output never exceed it.")] = 8192,
    input_median: Annotated[int, typer.Option(help="Median prompt tokens (lognormal).")] = 1024,
    output_median: Annotated[int, typer.Option(help="Median output tokens (lognormal).")] = 128,
    multimodal: Annotated[float, typer.Option(help="Share of requests with one image item (0-1).")] = 0.0,
    prompt_logprobs_share: Annotated[float, typer.Option(help="Share of requests asking for prompt_logprobs (0-1).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same file.")] = 0,
    servegen: Annotated[list[Path] | None, typer.Option(help="Draw the workload from real clients' characterisation instead: a ServeGen client (its chunk-N-trace.csv or chunk-N-dataset.json; the other must sit beside it) or a folder of them (repeatable). Each 600-s window gets its recorded number of arrivals, bursty as its fitted gap distribution, with lengths (and images, reasoning share) from its distributions.")] = None,
    start: Annotated[str | None, typer.Option(help="With --servegen: where in the clients' data to begin (e.g. 20h); default: the first window with traffic.")] = None,
    duration: Annotated[str, typer.Option(help="With --servegen: how much of the clients' data to generate (e.g. 30m, 2h).")] = "1h",
    rate_scale: Annotated[float, typer.Option(help="With --servegen: multiply every window's rate (2 = twice the traffic, same rhythm).")] = 1.0,
) -> None:
    """Generate a deterministic synthetic workload: Poisson or bursty arrivals with lognormal lengths, or, with --servegen, the recorded rhythm and lengths of real clients of Alibaba's Model Studio (ServeGen's data/language, data/multimodal, data/reason)."""
    from replay.trace.format import write_trace
    _file_out(out, "synth.jsonl")
    if servegen:
        from replay.trace.servegen import ServeGenSpec, synth_servegen
        from replay.units import parse_duration_us
        start_us = parse_duration_us(start) if start is not None else None
        dur_us = parse_duration_us(duration)
        if (start is not None and start_us is None) or dur_us is None:
            raise ReplayError("--start/--duration: use forms like 600s, 30m, 20h", 2)
        if requests is not None and requests <= 0:
            raise ReplayError("--requests must be positive", 2)
        with err.status("drawing the workload from the clients' windows"):
            h, rs = synth_servegen(ServeGenSpec(servegen, None if start_us is None else start_us / 1e6, dur_us / 1e6,
                                                rate_scale, requests, seed))
            write_trace(out, h, rs)
        err.print(f"[green]wrote[/] {escape(str(out))}: {len(rs)} requests over {rs[-1]['t_us'] / 1e6:.1f} s from "
                  f"{h.source['name']} (from {h.source['start_s']:g} s of its data)")
        return
    from replay.trace.synth import SynthSpec
    from replay.trace.synth import synth as make
    n = 1000 if requests is None else requests
    header, drawn = make(SynthSpec(n, rate, arrival, context_len, input_median, output_median, multimodal,
                                   prompt_logprobs_share, 20, seed))
    try:
        with Progress(TextColumn("[bold]synth[/]"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=err, transient=True) as prog:
            task = prog.add_task("synth", total=n)
            written, last_t = write_trace(out, header, drawn, progress=lambda k: prog.update(task, completed=k))
    except KeyboardInterrupt:
        err.print(f"[yellow]interrupted[/]: nothing written; {escape(str(out))} is as it was")
        raise typer.Exit(130) from None
    err.print(f"[green]wrote[/] {escape(str(out))}: {written} requests over {(last_t or 0) / 1e6:.1f} s")


def _at_specs(specs: list[str], evidence: list[Path], tz_offset_s: int) -> tuple[str | None, dict[str, str]]:
    """--at's values: the time for every file (TIME, at most once) and each named file's own (FILE=TIME)."""
    from replay.record.common import parse_time
    every: str | None = None
    files: dict[str, str] = {}
    for spec in specs:
        f, _, t = spec.rpartition("=")
        if parse_time(t, tz_offset_s) is None:  # (unread, it was as if not given)
            raise ReplayError(f"--at {spec!r}: expected a time such as 2025-06-01T10:00:00Z, or FILE=TIME (ISO 8601; "
                              "without a zone, --tz applies)", 2)
        if not f and every is not None:
            raise ReplayError(f"--at {spec!r}: a second time for every file (name the file: FILE=TIME)", 2)
        if f and not any(f in (str(p), p.name) for p in evidence):
            raise ReplayError(f"--at {spec!r}: {f} is not among the evidence files", 2)
        if f:
            files[f] = t
        else:
            every = t
    return every, files


@app.command()
def record(
    evidence: Annotated[list[Path] | None, typer.Argument(parser=_named_path, help="Evidence files, or folders of them: vLLM logs (plain, coloured, JSON, gzip/bzip2/xz; container, compose, shipper or journald envelopes; Google Cloud Logging, AWS CloudWatch Logs and Azure Monitor Logs exports), Prometheus/DCGM scrapes or exports (query_range JSON, promtool tsdb dump), Grafana CSV or JSON, dcgmi dmon, nvidia-smi (CSV queries, the default table, -q, dmon/pmon), gpustat, kubectl output (events and pods as JSON, YAML or the table printed; describe), kernel logs (dmesg -T, journalctl -k), benchmark harnesses' outputs (vLLM bench serve results, AIPerf's exports, GuideLLM's benchmarks.json).")] = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="Bundle directory to write.")] = Path("incident.bundle"),
    year: Annotated[int | None, typer.Option(help="Year of log lines that carry none (vLLM logs, journalctl's short form); unset, the year used is inferred and said.")] = None,
    tz: Annotated[str, typer.Option(help="UTC offset of naive local times, e.g. +02:00.")] = "+00:00",
    at: Annotated[list[str] | None, typer.Option(help="When evidence without times of its own was taken (ISO 8601; FILE=TIME for one file, repeatable): exposition scrapes, nvidia-smi snapshots, dcgmi dmon (its first row), kubectl describe and tables (event ages count back from it, pod states are as of it); for a CSV of times relative to its run's start ('time [s]', 'elapsed', times of day), when the run began (unset: the earliest time of the other evidence, and said so).")] = None,
    as_kind: Annotated[list[str] | None, typer.Option("--as", help="Force a kind (FILE=KIND, or KIND for all) when recognition by content fails: vllm-log, prometheus-text, prometheus-query-range, victoriametrics-export (/api/v1/export lines), grafana-csv, grafana-json (a panel's data frames), nvidia-smi (CSV queries), nvidia-smi-table, nvidia-smi-q (text, or XML with -x), nvidia-smi-dmon, dcgmi-dmon, k8s, k8s-describe, k8s-table (kubectl get events/pods as printed), kernel-log, log-export (a vLLM log as Google Cloud Logging, AWS CloudWatch Logs, Azure Monitor Logs, Grafana, Splunk or journalctl -o json-pretty export it), gpustat (printed or --json), dcgm-counters (dcgm-exporter's -f list of the fields it exports), aiperf-records, aiperf-gpu-telemetry, aiperf-server-metrics, aiperf-summary (AIPerf's profile_export.jsonl, gpu_telemetry_export.jsonl, server_metrics_export.jsonl, profile_export_aiperf.json), vllm-bench-result (vllm bench serve --save-result; a sweep's run), guidellm-report (GuideLLM's benchmarks.json), vllm-metrics-csv (a CSV of vLLM's metrics one per column, a time column first).")] = None,
    keep_prompts: Annotated[bool, typer.Option(help="Keep prompt text in the bundle (off: counts and hashes only).")] = False,
    keep_quarantine_text: Annotated[bool, typer.Option(help="Keep the text of quarantined lines (off: file, line, reason, length and sha256; --keep-prompts keeps it too).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Write the bundle into a folder that holds other files (they are kept).")] = False,
    nvsmi_columns: Annotated[str | None, typer.Option(help="Column list of a headerless nvidia-smi CSV.")] = None,
    host: Annotated[str | None, typer.Option(help="The node vLLM ran on, where DCGM evidence covers several (a cluster-wide query): its GPUs are the bundle's device memory; the others' are kept as series of their own.")] = None,
    gpu_instance: Annotated[str | None, typer.Option(help="The MIG instance vLLM ran in (DCGM's GPU_I_ID, or GPU:GPU_I_ID such as 0:4), where DCGM evidence covers several instances of one GPU: its memory is the bundle's device memory; the other instances' are kept as series of their own.")] = None,
    metric: Annotated[list[str] | None, typer.Option(help="Extra metric names you expect to read (checked against vLLM's real names).")] = None,
    clock_offset: Annotated[list[str] | None, typer.Option(help="FILE=+1.5s: that file's clock ran ahead of true time by this much (repeatable); its times are corrected.")] = None,
    live: Annotated[str | None, typer.Option(help="Record live from a vLLM server URL instead of files.")] = None,
    nvml: Annotated[bool, typer.Option(help="With --live: also sample NVML (read-only).")] = False,
    pid: Annotated[int | None, typer.Option(help="With --live: the vLLM server's process id; its process tree's resident memory is sampled (actual memory where NVML is absent: a CPU host).")] = None,
    interval: Annotated[str, typer.Option(help="With --live: sampling interval. With files: how far apart rows without times were taken (dcgmi dmon's -d), placed from --at.")] = "1s",
    duration: Annotated[str | None, typer.Option(help="With --live: stop after this long (default: Ctrl-C).")] = None,
) -> None:
    """Turn the evidence of an incident into one bundle on one UTC timeline, losing nothing.

    Give it everything at once, files or a folder: each file is recognised by its content. Logs of several ranks and restarts line up; a log saved twice over (kubectl logs at 10:00, then again at 10:30) gives each fact once; what cannot be read goes to the bundle's quarantine with its file and line. Then: replay inspect BUNDLE, replay report BUNDLE."""
    from replay import malloc
    from replay.units import parse_duration_us
    if not live:
        malloc.hold_freed_pages()  # (before polars is first imported: a recording frees pieces by the thousand)
    _bundle_out(out, force)
    if live:
        from replay.record.live import record_live
        iv = parse_duration_us(interval)
        dur = parse_duration_us(duration) if duration else None
        if iv is None or (duration and dur is None):
            raise ReplayError("--interval/--duration: use forms like 1s, 250ms, 10m", 2)
        if iv < 10_000:  # (a scrape takes milliseconds: faster polling measures the poller)
            raise ReplayError(f"--interval {interval!r}: expected 10ms or more between scrapes", 2)
        res = record_live(live, out, interval_s=iv / 1e6, duration_s=None if dur is None else dur / 1e6,
                          use_nvml=nvml, console=err, pid=pid)
        err.print(f"[green]wrote[/] {escape(str(out))}: {res['samples']} samples over {res['seconds']:.1f} s "
                  f"({res['metrics_errors']} failed scrapes)")
        for w in res["warnings"]:
            err.print(f"[yellow]{escape(w)}[/]")
        return
    if pid is not None:
        raise ReplayError("--pid: only with --live (a running server's process is sampled while recording)", 2)
    if not evidence:
        raise ReplayError("give evidence files, or --live URL", 2)
    rows_iv = parse_duration_us(interval)
    if not rows_iv:
        raise ReplayError("--interval: use forms like 1s, 250ms, 10m", 2)
    from replay.record.recorder import KINDS, RecordOptions
    from replay.record.recorder import record as do_record
    kinds: dict[str, str] = {}
    for a in as_kind or []:
        f, _, k = a.rpartition("=")
        if k not in KINDS:
            raise ReplayError(f"--as {a!r}: unknown kind {k!r}; choose one of: {', '.join(KINDS)}", 2)
        kinds[f or "*"] = k
    m = __import__("re").fullmatch(r"([+-])(\d\d):?(\d\d)", tz)
    if not m or int(m.group(3)) > 59 or int(m.group(2)) * 60 + int(m.group(3)) > 14 * 60:  # (zones: -12:00 to +14:00)
        raise ReplayError(f"--tz {tz!r}: expected an offset like +02:00 (from -14:00 to +14:00)", 2)
    off = (1 if m.group(1) == "+" else -1) * (int(m.group(2)) * 3600 + int(m.group(3)) * 60)
    if year is not None and not 1970 <= year <= 9999:
        raise ReplayError(f"--year {year}: expected a year from 1970 to 9999", 2)
    at_all, at_files = _at_specs(at or [], evidence, off)
    offsets: dict[str, int] = {}
    for spec in clock_offset or []:
        f, sep, d = spec.rpartition("=")
        us = parse_duration_us(d.lstrip("+-")) if sep and f else None
        if us is None:
            raise ReplayError(f"--clock-offset {spec!r}: expected FILE=+1.5s or FILE=-250ms", 2)
        offsets[f] = -us if d.startswith("-") else us
    unknown = [f for f in offsets if not any(f in (str(p), p.name) for p in evidence)]
    if unknown:
        raise ReplayError(f"--clock-offset names {', '.join(unknown)}, which is not among the evidence files", 2)
    opts = RecordOptions(year=year, tz_offset_s=off, at=at_all, at_files=at_files, as_kind=kinds, keep_prompts=keep_prompts,
                         keep_quarantine_text=keep_quarantine_text, nvsmi_columns=nvsmi_columns, metrics=metric or [], clock_offsets_us=offsets,
                         rows_interval_s=rows_iv / 1e6, host=host, gpu_instance=gpu_instance)
    total = sum(p.stat().st_size for p in evidence if p.is_file())
    with _bytes_progress("[bold]record[/] {task.description}") as prog:
        task = prog.add_task("", total=total or None)
        opts.progress = lambda n: prog.advance(task, n)
        opts.stage = lambda what: prog.update(task, description=escape(what))
        try:
            reports, summary = do_record(list(evidence), out, opts)
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted[/]: nothing written; {escape(str(out))} is as it was")
            raise typer.Exit(130) from None
    t = Table(title=escape(f"bundle {out}"))
    for c in ("file", "kind", "lines", "parsed", "quarantined", "time span"):
        t.add_column(c)
    from datetime import datetime, timezone
    def ts(u: int | None) -> str:
        return "—" if u is None else datetime.fromtimestamp(u / 1e6, tz=timezone.utc).strftime("%m-%d %H:%M:%S")
    from replay.record.recorder import table_rows
    for r in table_rows(reports):
        t.add_row(escape(Path(r.path).name), escape(r.kind), str(r.lines), str(r.parsed), str(r.quarantined),
                  f"{ts(r.t_first_us)} – {ts(r.t_last_us)}" if r.t_first_us else "—")
    err.print(t)
    for r in reports:  # (what each file's reading assumed or met: why a file of a folder was left out, a
        name = Path(r.path).name  # clock offset corrected, envelope times that were a copy's, lines Ray folded, …;
        own = [n for n in r.notes if not n.startswith(f"{name}: ")]  # those that name their file are the bundle's, below)
        if own:
            err.print(f"[yellow]note:[/] {escape(name)}: {escape('; '.join(own))}")
    for n in summary["notes"]:
        err.print(f"[yellow]note:[/] {escape(n)}")
    err.print(f"t0 {summary['t0_utc']}: {summary['samples']} samples, {summary['events']} events, "
              f"{summary['requests']} requests, {summary['quarantined']} quarantined lines")


@app.command()
def inspect(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the fixed-key JSON summary.")] = False,
) -> None:
    """Summarise what a bundle says (null where the evidence is silent)."""
    from replay.bundle import read_bundle
    from replay.record.inspect import inspect_bundle
    b = read_bundle(bundle)  # (the summary states no request's facts: their rows are never read)
    d = inspect_bundle(b)
    if as_json:
        print(json.dumps(d, indent=2))
        return
    t = Table(title=escape(str(bundle)), show_header=False)
    for k, v in d.items():
        if k == "engine_args":  # (a table of its own, below)
            continue
        s = json.dumps(v) if not isinstance(v, str) else v
        t.add_row(k, escape(s if len(s) < 120 else s[:117] + "..."))
    out_console.print(t)
    if d["engine_args"]:
        args = Table("production's engine argument", "value", "stated at", box=None)
        for k, v in d["engine_args"].items():
            val = json.dumps(v["value"]) if not isinstance(v["value"], str) else v["value"]
            args.add_row(k, escape(val if len(val) < 80 else val[:77] + "..."), escape(", ".join(v["sources"][:3])))
        out_console.print(args)
    from replay.analysis.memory import accounting
    from replay.analysis.outages import crash_line
    from replay.record.inspect import accounting_line
    line = accounting_line(accounting(b))
    if line:
        out_console.print(f"vLLM's accounting: {line}", markup=False)
    crash = crash_line(b.events)
    if crash:
        out_console.print(f"When its engine failed, vLLM reported: {crash}", markup=False)
    for n in b.meta.notes:  # (what the recorder assumed or could not read: the year, a scrape's time, …)
        out_console.print(f"note: {n}", markup=False)


def _is_bundle(path: Path) -> bool:
    return path.is_dir() and (path / "bundle.json").exists()


def _before_crash(text: str | None) -> int | None:
    if not text:
        return None
    from replay.units import parse_duration_us
    d = parse_duration_us(text)
    if d is None or d <= 0:
        raise ReplayError(f"--before-crash {text!r}: expected a duration such as 10m, 90s or 1h", 2)
    return d


@app.command("trace")
def trace_cmd(
    bundle: Annotated[Path, typer.Argument(help="A production bundle (from `replay record`).")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Trace to write (replay-trace/1 JSONL).")] = Path("trace.jsonl"),
    window: Annotated[str | None, typer.Option(help="Cut to START:END of the bundle's timeline, e.g. 10m:20m.")] = None,
    before_crash: Annotated[str | None, typer.Option(help="Cut to the DURATION before the first crash, e.g. 10m.")] = None,
) -> None:
    """Turn a recorded incident's requests into a replay trace: production ids, arrival times, prompt lengths,
    max_tokens and sampling, production's engine arguments, model and GPU in the header.

    What the evidence states is kept as observed; what had to be inferred (a prompt length from the
    metrics' token counters, times spread within a logged second) the header says, field by field.
    """
    from replay.trace.from_bundle import trace_of_bundle
    _file_out(out, "trace.jsonl")
    if window and before_crash:
        raise ReplayError("--window and --before-crash both cut the trace: give one", 2)
    bt = trace_of_bundle(bundle, out, window_us=_window(window), before_crash_us=_before_crash(before_crash))
    for n in bt.notes:
        err.print(f"note: {n}", markup=False)
    fields = bt.header.fields or {}
    said = ", ".join(f"{k} {v['inferred']} inferred" for k, v in fields.items() if v.get("inferred"))
    err.print(f"[green]wrote[/] {escape(str(out))}: {len(bt.requests)} requests"
              + (f" ({escape(said)})" if said else ""))


@app.command()
def run(
    trace: Annotated[Path, typer.Argument(help="A replay-trace/1 file, or a production bundle (its requests become the trace: see `replay trace`).")],
    vllm: Annotated[str, typer.Option(help="vLLM version: 0.32 = newest 0.32.x, 0.32.0 pins it.")] = "0.32",
    out: Annotated[Path, typer.Option("-o", "--out", help="Bundle directory to write.")] = Path("replay.bundle"),
    speed: Annotated[float, typer.Option(help="Time scale: 2 = twice as fast as recorded.")] = 1.0,
    window: Annotated[str | None, typer.Option(help="Replay a slice START:END of trace time (of the bundle's timeline for a bundle), e.g. 10m:20m.")] = None,
    before_crash: Annotated[str | None, typer.Option(help="With a bundle: replay the DURATION before its first crash, e.g. 10m.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Cap outstanding requests (turns the open loop closed; off by default).")] = None,
    engine_args: Annotated[Path | None, typer.Option(help='JSON file of engine arguments: an object such as {"max_model_len": 8192}.')] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override an engine argument: key=value.")] = None,
    model: Annotated[Path | None, typer.Option(help="A real model directory (GPU hosts); default: the tiny local Llama.")] = None,
    model_config: Annotated[Path | None, typer.Option(help="Production's model config.json folder (and tokenizer): on a GPU host its architecture with dummy weights; on CPU the tiny model at its vocabulary.")] = None,
    constraints: Annotated[Path | None, typer.Option(help="A pip constraints file (production's `pip freeze`): the engine env is resolved within it, an env of its own.")] = None,
    vocab: Annotated[int, typer.Option(help="Vocabulary of the tiny model (prompt_logprobs cost grows with it).")] = 131072,
    interval: Annotated[float, typer.Option(help="Sampling interval in seconds.")] = 0.25,
    kv_cache_gib: Annotated[float, typer.Option(help="KV cache size on the CPU engine (VLLM_CPU_KVCACHE_SPACE).")] = 1.0,
    capacity_gib: Annotated[float | None, typer.Option(help="Emulated capacity: an actual-memory limit that ends the run as an emulated OOM.")] = None,
    emulate_capacity: Annotated[bool, typer.Option(help="On a bigger GPU than production's: hold the difference in a ballast and scale gpu_memory_utilization.")] = False,
    torch_history: Annotated[bool, typer.Option(help="Record allocation history in the engine so the OOM snapshot shows stacks (slower).")] = False,
    seed: Annotated[int, typer.Option(help="Seed for synthesised prompts.")] = 0,
    vision_patch: Annotated[int | None, typer.Option(help="With --vllm X+vision: the tiny Qwen2-VL's patch, in pixels (default 14).")] = None,
    vision_merge: Annotated[int | None, typer.Option(help="With --vllm X+vision: patches a side merged into one image token (default 2).")] = None,
    vision_max_pixels: Annotated[int | None, typer.Option(help="With --vllm X+vision: the largest image the tower takes, in pixels; larger ones are resized down (default 3211264 = 1792 x 1792, 4,096 tokens). Image tokens, and their memory, grow with resolution up to it.")] = None,
    warmup: Annotated[int | None, typer.Option(help="Plain requests sent before the trace, so the server's first allocations are behind it (not in the bundle's requests). Default: with a bundle cut by --window or --before-crash, as many as production had served before it, up to 3; else none. 0: none.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (version env, engine arguments after translation, model, requests, window, notes) and start nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Write the bundle into a folder that holds other files (they are kept).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: the plan as one JSON object.")] = False,
) -> None:
    """Replay a trace, or a recorded incident's own traffic, through a real vLLM server at recorded times,
    measuring reported and actual memory.

    Given a production bundle, its requests are replayed at production's engine configuration translated
    to the chosen version (renamed arguments renamed, removed ones dropped, each said in the notes).

    Exit codes: 0 completed, 10 the engine died or the capacity guard fired (OOM reproduced),
    130 interrupted; a valid bundle is written in every case.
    """
    from replay.drive.runner import RunOptions
    from replay.drive.runner import plan as do_plan
    from replay.drive.runner import run as do_run
    if as_json and not dry_run:
        raise ReplayError("--json: only with --dry-run (a run prints its progress, and writes its bundle)", 2)
    opts = RunOptions(vllm=vllm, out=_bundle_out(out, force), speed=speed, window=None, concurrency=concurrency,
                      engine_args_file=engine_args, set_args=set_ or [], model=model, model_config=model_config,
                      constraints=constraints,
                      vocab=vocab, seed=seed, interval_s=interval, kv_cache_gib=kv_cache_gib,
                      capacity_bytes=_capacity_bytes(capacity_gib),
                      emulate_capacity=emulate_capacity, torch_history=torch_history, warmup=warmup,
                      tower=_tower(vision_patch, vision_merge, vision_max_pixels))
    trace_path, opts.window = _trace_for_run(trace, out, dry_run, window, before_crash)
    if dry_run:
        try:
            p = do_plan(trace_path, opts, err)
            _print_plan(p.to_json(), as_json)
        finally:
            if trace_path != trace:  # (a bundle's trace, made in a temporary folder of its own)
                shutil.rmtree(trace_path.parent, ignore_errors=True)
        return
    res = do_run(trace_path, opts, err)
    gib = 2**30
    err.print(f"[bold]{res.outcome}[/]: {res.sent} sent, {res.ok} ok, {res.failed} failed, {res.aborted} aborted; "
              f"memory at ready {(res.baseline_rss_bytes or 0) / gib:.2f} GiB, peak {(res.peak_rss_bytes or 0) / gib:.2f} GiB")
    if res.engine_cpu_s:
        err.print(f"overhead: replay process CPU {res.replay_cpu_s:.2f} s = "
                  f"{100 * res.replay_cpu_s / res.engine_cpu_s:.1f}% of the engine's {res.engine_cpu_s:.1f} s "
                  f"(sampler {res.sampler_cpu_s:.2f} s)")
    err.print(f"bundle: {res.bundle}", markup=False)
    raise typer.Exit(res.exit_code)


def _tower(patch: int | None, merge: int | None, max_pixels: int | None) -> VisionTower | None:
    """The tiny Qwen2-VL's tower the options ask for (None: the default one, none asked)."""
    asked = {k: v for k, v in (("patch", patch), ("merge", merge), ("max_pixels", max_pixels)) if v is not None}
    if not asked:
        return None
    from replay.engine.model import VisionTower
    return dataclasses.replace(VisionTower(), **asked)


def _trace_for_run(given: Path, out: Path, dry_run: bool, window: str | None,
                   before_crash: str | None) -> tuple[Path, tuple[int, int] | None]:
    """The trace a run replays and the window of it to replay: the file given, or a bundle's requests made
    into one, cut to the window there (kept in the replay bundle as trace.jsonl; in a temporary folder
    for a dry run)."""
    if not _is_bundle(given):
        if before_crash:
            raise ReplayError("--before-crash: only for a bundle (a trace has no crash on it); use --window", 2)
        return given, _window(window)
    import tempfile

    from replay.trace.from_bundle import trace_of_bundle
    if window and before_crash:
        raise ReplayError("--window and --before-crash both cut the trace: give one", 2)
    where = Path(tempfile.mkdtemp(prefix="replay-plan-")) if dry_run else out
    path = where / "trace.jsonl"
    trace_of_bundle(given, path, window_us=_window(window), before_crash_us=_before_crash(before_crash))
    return path, None


def _print_plan(plan: dict[str, object], as_json: bool) -> None:
    if as_json:
        out_console.print_json(json.dumps(plan, default=str))
        return
    v = plan["vllm"]
    assert isinstance(v, dict)
    out_console.print(f"vLLM {v['version']} ({v['dist']}, {v['device']}){'' if v['installed'] else ' - not installed yet'}",
                      markup=False)
    m = plan["model"]
    assert isinstance(m, dict)
    out_console.print(f"model: {m['kind']} {m['path']}" + (f" (production: {m['production']})" if m.get("production") else ""),
                      markup=False)
    out_console.print(f"requests: {plan['requests']}" + (f", window {plan['window_us']} µs of production's timeline"
                                                          if plan.get("window_us") else ""), markup=False)
    t = Table("engine argument", "value", box=None)
    ea = plan["engine_args"]
    assert isinstance(ea, dict)
    for k, val in sorted(ea.items()):
        t.add_row(k, escape(json.dumps(val) if not isinstance(val, str) else val))
    out_console.print(t)
    notes = plan["notes"]
    assert isinstance(notes, list)
    for n in notes:
        out_console.print(f"note: {n}", markup=False)


@versions_app.command("list")
def versions_list() -> None:
    """Installed environments and the versions this host can run."""
    from replay.engine import envs
    dev = "cuda" if envs.has_nvidia_gpu() else "cpu"
    inst = envs.installed()
    out_console.print(f"host: {dev}; environments under {envs.replay_home() / 'envs'}", markup=False)
    for s in inst:
        out_console.print(f"  installed  {s.name}", markup=False)
    cuda = envs.cuda_releases()
    out_console.print("runnable here: " + ", ".join(cuda if dev == "cuda" else envs.CPU_RELEASES_LOCAL), markup=False)
    outside = envs.releases_outside_python(cuda)
    out_console.print(f"CUDA builds: {len(cuda)} releases, {cuda[0]} to {cuda[-1]}"
                      + ("" if dev == "cuda" else " (REPLAY_DEVICE=cuda installs one here for `versions check`)"), markup=False)
    py = platform.python_version()
    out_console.print(f"  for Python {py}: " + (f"{len(outside)} state a Requires-Python it is outside: {', '.join(outside)}"
                                              if outside else "every release's Requires-Python takes it"), markup=False)


@versions_app.command("install")
def versions_install(
    versions: Annotated[list[str], typer.Argument(help="one or more: 0.32 0.31.0")],
    constraints: Annotated[Path | None, typer.Option(help="A pip constraints file (production's `pip freeze`): the env is resolved within it, an env of its own.")] = None,
) -> None:
    """Create the environment for each vLLM version given (reused by every later run).

    A CUDA build's dependencies are pinned as of the version's release day; the lock is kept in the
    env as replay-lock.txt (see `replay versions doctor`)."""
    from replay.engine import envs
    specs = [envs.resolve(v, constraints=constraints) for v in versions]  # refuse an impossible version before building any
    for spec in specs:
        envs.adopt_existing(spec)
        with err.status(f"installing {spec.dist}=={spec.version}"):
            spec = envs.install(spec, log=lambda m: err.print(m, markup=False))
        err.print(f"[green]ready[/] {escape(str(spec.path))}")


@versions_app.command("remove")
def versions_remove(version: Annotated[str, typer.Argument(help="0.32 or 0.32.0")]) -> None:
    """Delete an installed environment."""
    from replay.engine import envs
    spec = envs.resolve(version)
    err.print(f"removed {spec.path}" if envs.remove(spec) else f"{spec.path} was not installed", markup=False)


@versions_app.command("doctor")
def versions_doctor(
    start: Annotated[bool, typer.Option(help="Also start each server once and check /health.")] = True,
) -> None:
    """For each installed environment: vLLM, torch, transformers, its lock, device, and whether a server starts."""
    from replay.drive.runner import CPU_DEFAULT_ARGS
    from replay.engine import envs
    from replay.engine.args import known_args, to_argv
    from replay.engine.model import ensure_tiny_model
    from replay.engine.server import EngineServer
    t = Table()
    for c in ("env", "vllm", "torch", "transformers", "lock", "device", "server"):
        t.add_column(c)
    locks: list[str] = []
    for spec in envs.installed():
        info = envs.env_info(spec)
        lk = envs.lock_info(spec)
        if lk is None:
            lock_cell = "none"
        else:
            lock_cell = (f"as of {lk['release_day']}" if lk.get("release_day") else str(lk["how"])) + f", {lk['packages']} pkgs"
            locks.append(f"lock {spec.name}: {lk['path']}")
        status = "not checked"
        if start and spec.device == "cuda" and not envs.device_present():
            status = "no GPU here (replay versions check loads it without one)"
        elif start:
            try:
                m = ensure_tiny_model(spec)
                argv = to_argv(CPU_DEFAULT_ARGS if spec.device == "cpu" else {}, known_args(spec), spec.version)
                s = EngineServer(spec, m, argv, envs.replay_home() / "doctor" / f"{spec.name}.log",
                                 env={"VLLM_CPU_KVCACHE_SPACE": "1"})
                with err.status(f"starting {spec.name}"):
                    s.start()
                    s.stop()
                status = "[green]starts[/]"
            except ReplayError as e:
                status = f"[red]fails[/]: {escape(e.message.splitlines()[0])}"
        t.add_row(escape(spec.name), escape(info.get("vllm") or "?"), escape(info.get("torch") or "?"),
                  escape(info.get("transformers") or "?"), escape(lock_cell), spec.device, status)
    out_console.print(t)
    for line in locks:
        out_console.print(line, markup=False)


@versions_app.command("check")
def versions_check(
    version: Annotated[str, typer.Argument(help="0.6.3, or 0.6 for the newest 0.6.x")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="An engine argument to validate: key=value.")] = None,
    engine_args: Annotated[Path | None, typer.Option(help='JSON file of engine arguments to validate: {"max_model_len": 8192}.')] = None,
    constraints: Annotated[Path | None, typer.Option(help="A pip constraints file the env is resolved within (an env of its own).")] = None,
    vocab: Annotated[int, typer.Option(help="Vocabulary of the tiny model.")] = 131072,
    start: Annotated[bool | None, typer.Option("--start/--no-start", help="Also start the server once (default: only on a GPU host).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The result as one JSON object.")] = False,
) -> None:
    """Install VERSION's env if missing, then load that version's own config loader, tokenizer
    (get_tokenizer), API server argument parser and model class on the tiny model and validate the
    engine arguments, without a GPU (REPLAY_DEVICE=cuda checks the CUDA build on a CPU host). On a
    GPU host the server is also started once.

    Exit 0 when all load; 1 with the first failure in one line; 4 when the env cannot be installed."""
    from replay.drive.runner import RunOptions, user_engine_args
    from replay.engine import envs
    from replay.engine.args import to_argv
    from replay.engine.check import check, raise_on_failure
    from replay.engine.model import ensure_tiny_model
    spec = envs.resolve(version, constraints=constraints)
    argv = to_argv(user_engine_args(RunOptions(vllm=version, engine_args_file=engine_args, set_args=set_ or [])),
                   None, spec.version)
    do_start = envs.device_present() if start is None else start
    if do_start and spec.device == "cuda" and not envs.device_present():
        raise ReplayError("--start: this host has no GPU to start the CUDA build on (the checks without one run with --no-start)", 2)
    envs.adopt_existing(spec)
    if not envs.is_installed(spec):
        with err.status(f"installing {spec.dist}=={spec.version}"):
            spec = envs.install(spec, log=lambda m: err.print(m, markup=False))
    with err.status(f"building the tiny model for {spec.name}"):
        model = ensure_tiny_model(spec, vocab)
    with err.status(f"checking {spec.name}"):
        res = check(spec, model, argv, start=do_start)
    if as_json:
        out_console.print_json(json.dumps(res.to_json()))
    else:
        for s in res.stages:
            mark = "[green]ok[/]  " if s.ok else "[red]FAIL[/]" if s.ok is False else "[yellow]skip[/]"
            why = "" if s.ok is not None else "needs a GPU, not counted: "
            err.print(f"{mark} {s.name:<13} {s.seconds:6.2f} s  {why}{escape(s.detail)}", soft_wrap=True)
        if res.ok:
            err.print(f"[green]vLLM {escape(spec.version)} loads[/] ({spec.dist}, model {escape(str(model))}, "
                      f"{res.seconds:.1f} s)", soft_wrap=True)
    raise_on_failure(res, EXIT_CHECK_FAILED)


_COMPARE_HELP = "Replay bundles of the same incident to set beside it (repeat --compare, or list them after one)."


def _compared(compare: list[Path] | None, more: list[Path] | None) -> list[Path]:
    """``--compare A B``: typer takes A as the option's and B as a further argument; both are compared."""
    return [*(compare or []), *(more or [])]


def _verdicts(bundle: Path, compare: list[Path]) -> list[Any]:
    from replay.analysis.cache import analysis_of
    from replay.analysis.verdict import verdicts_of
    return verdicts_of(analysis_of(bundle), [analysis_of(p) for p in compare]) if compare else []


@app.command()
def analyze(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory.")],
    more: Annotated[list[Path] | None, typer.Argument(help="More bundles to compare (after --compare).", show_default=False)] = None,
    compare: Annotated[list[Path] | None, typer.Option(help=_COMPARE_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis as JSON.")] = False,
) -> None:
    """Where reported and actual memory diverged: gap, onset, attribution, findings; with --compare, whether
    each replay reproduced production (OOM or divergence onset, at which request, on trace time)."""
    from replay.analysis.cache import analysis_of
    from replay.analysis.verdict import verdict_lines
    a = analysis_of(bundle)
    vs = _verdicts(bundle, _compared(compare, more))
    s = a.summary()
    if as_json:
        print(json.dumps({**s, "verdicts": [v.to_json() for v in vs]} if vs else s, indent=2, default=str))
        return
    def shown(v: object, unit: str) -> str:
        return "unknown" if v is None else f"{v} {unit}"
    crash = s.get("crash") or {}
    ended = (f", OOM {shown(s['oom_s'], 's')}" if s["oom_s"] is not None else
             f", crash at {crash['s']} s ({crash['what']}; its cause not stated)" if crash else ", no crash")
    out_console.print(f"[bold]{escape(str(bundle))}[/]: peak actual {shown(s['peak_actual_gib'], 'GiB')}, accounted "
                      f"{shown(s['accounted_gib'], 'GiB')}, max gap {shown(s['max_gap_gib'], 'GiB')}, onset "
                      f"{shown(s['onset_s'], 's')}{escape(ended)}")
    for f in s["findings"]:
        out_console.print(f"- ({f['confidence']}) {f['title']}: {f['detail']}", markup=False)
    for u in s.get("unjudged") or []:
        out_console.print(f"- cannot judge {u['what']}: {u['why']}; would settle it: {u['settle']}", markup=False)
    for line in verdict_lines(vs, evidence=True):
        out_console.print(line, markup=False)


@app.command()
def report(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory (production's, to set its replays beside it).")],
    more: Annotated[list[Path] | None, typer.Argument(help="More bundles to compare (after --compare).", show_default=False)] = None,
    compare: Annotated[list[Path] | None, typer.Option(help=_COMPARE_HELP)] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="HTML file (default reports/<bundle>.html).")] = None,
) -> None:
    """Write a self-contained HTML report: memory timeline, divergence, requests, findings, evidence; with
    --compare, production and its replays on one trace-aligned timeline and a verdict for each replay."""
    from replay.report.html import write_report
    path = _file_out(out or Path("reports") / f"{bundle.name.removesuffix('.bundle')}.html", "report.html")
    with err.status("rendering report"):
        size = write_report(bundle, _compared(compare, more), path)
    err.print(f"[green]wrote[/] {escape(str(path))} ({size / 1e6:.1f} MB)")


@app.command()
def postmortem(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory.")],
    more: Annotated[list[Path] | None, typer.Argument(help="More bundles to compare (after --compare).", show_default=False)] = None,
    compare: Annotated[list[Path] | None, typer.Option(help=_COMPARE_HELP)] = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="Markdown file.")] = Path("postmortem.md"),
    report_link: Annotated[str | None, typer.Option(help="Link to the HTML report.")] = None,
) -> None:
    """Draft a postmortem (Google SRE shape) prefilled with what the evidence shows; with --compare, the
    replays' verdict (reproduced at which version, at which request) in its summary."""
    from replay.report.postmortem import write_postmortem
    extra = _compared(compare, more)
    write_postmortem(bundle, _file_out(out, "postmortem.md"), report_link, extra or None)
    err.print(f"[green]wrote[/] {escape(str(out))}")


@app.command()
def check(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory.")],
    max_discrepancy: Annotated[float, typer.Option(help="Max gap between actual and accounted memory, % of accounted.")] = 3.0,
    max_gap_bytes: Annotated[int | None, typer.Option(help="Max absolute gap in bytes.")] = None,
    no_oom: Annotated[bool, typer.Option("--no-oom", help="Fail when the bundle holds an OOM (real or emulated).")] = False,
) -> None:
    """CI gate: exit non-zero when reported and actual memory disagree beyond the thresholds."""
    from replay.report.check import run_check
    failures, lines = run_check(bundle, max_discrepancy, max_gap_bytes, no_oom)
    for ln in lines:
        out_console.print(ln, markup=False)
    if failures:
        raise typer.Exit(EXIT_CHECK_FAILED)


def _register_matrix() -> None:
    from replay.matrix.commands import bisect_cmd, matrix_cmd
    app.command("matrix")(matrix_cmd)
    app.command("bisect")(bisect_cmd)


_register_matrix()


def main() -> None:
    from replay import signals
    signals.install()
    try:
        app()
    except ReplayError as e:
        err.print(f"[red]error:[/] {escape(e.message)}")
        sys.exit(e.exit_code)
    except OSError as e:
        full = write_error(e, "") if e.filename is None else None  # (a full disk, where no path was named)
        if e.filename is None and full is None:  # (not about a path the user can act on: a bug's, or the system's)
            _internal(e)
        err.print(f"[red]error:[/] {escape(os_error_message(e) if full is None else WRITE_WHY[full.errno or 0])}")
        sys.exit(EXIT_IO)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        sys.exit(signals.stopped() or 130)
    except SystemExit as e:
        if signals.stopped() == EXIT_TERMINATED and e.code == 130:  # (the command's own 'interrupted', for SIGTERM)
            sys.exit(EXIT_TERMINATED)
        raise
    except GeneratorExit:
        raise
    except BaseException as e:  # a bug, not bad input (a library's panic is a BaseException)
        if (code := signals.stopped()) is not None:  # (an interrupt a library turned into an error of its own)
            err.print("[yellow]interrupted[/]")
            sys.exit(code)
        full = write_error(e, "")  # (a full disk inside a library that names no file: still no bug)
        if full is not None:
            err.print(f"[red]error:[/] {escape(WRITE_WHY[full.errno or 0])}")
            sys.exit(EXIT_IO)
        _internal(e)


def _internal(e: BaseException) -> NoReturn:
    """Say so in one line (REPLAY_DEBUG=1 for the traceback)."""
    if os.environ.get("REPLAY_DEBUG"):
        raise e
    what = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")  # (a library's message runs to lines)
    what = what if len(what) <= 300 else what[:297] + "..."
    err.print(f"[red]internal error:[/] {type(e).__name__}: {escape(printable(what))} (set REPLAY_DEBUG=1 for the traceback)")
    sys.exit(70)
