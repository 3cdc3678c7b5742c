"""``replay record``: recognise each evidence file by content, parse it, align all sources on one UTC
timeline and write the incident bundle. Nothing is dropped: unparsed lines go to quarantine. A file
given twice is read once; logs that overlap (the same log saved at two times) give each fact once,
as one log would, and say so in their notes.

Which kind a file is, and the parser of each kind, are the registry's (``registry.py``). A recording
runs in phases: read and recognise each file (``FileRead``), infer the year of log lines, gather
every file's samples and events on one clock (``_Gathered``), make bundle.json's metadata, write (the
samples written and merged beside the request join, ``_write``)."""

from __future__ import annotations

import bisect
import contextlib
import functools
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar, cast

import polars as pl

from replay import malloc, processes
from replay.atomic import written_in_place
from replay.bundle import (
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    BundleMeta,
    BundleWriter,
    bundle_sha256,
    bundle_written,
    device_source,
    is_device_source,
    sample_names,
)
from replay.engine import catalogue
from replay.errors import EXIT_IO, ReplayError
from replay.filehash import (
    DECOMPRESS_ERRORS,
    compression,
    damaged,
    decompressed,
    file_sha256,
    nul_run,
    nul_run_note,
    read_past_nul_run,
    refuse_stream,
    text_bom,
)
from replay.lognames import rotation_stem
from replay.metrics import releases_exposing_all
from replay.parallel import background_removal
from replay.record import (
    access_log,
    common,
    engine_config,
    fastlog,
    request_join,
    timecol,
)
from replay.record.bundle_input import is_bundle, parse_bundle
from replay.record.events import GatheredEvent
from replay.record.exports import convert, export_kind, renumber
from replay.record.fastlog import FastFacts, parse_log_file, text_pieces
from replay.record.harness import request_rows
from replay.record.options import RecordOptions as RecordOptions
from replay.record.registry import KINDS as KINDS
from replay.record.registry import PARSERS, PIECEWISE, STREAMED
from replay.record.registry import detect_kind as detect_kind
from replay.record.request_ids import has_engine_ids, unify_bundle_requests
from replay.record.vllm_log import LogFact, LogParse, fact_time_us, parse_log, physical_lines
from replay.units import GiB, fraction, is_uint
from replay.versioning import version_key

# Log facts that become samples (metric, scale) or events.
STATS_SAMPLES = (("kv_usage_pct", "kv_usage_ratio", 0.01), ("running", "requests_running", 1.0),
                  ("waiting", "requests_waiting", 1.0), ("swapped", "requests_swapped", 1.0),
                  ("preemptions", "preemptions_total", 1.0), ("prefix_cache_hit_pct", "prefix_cache_hit_ratio", 0.01),
                  ("mm_cache_hit_pct", "mm_cache_hit_ratio", 0.01))


@dataclass
class FileReport:
    path: str
    kind: str
    lines: int = 0
    parsed: int = 0
    quarantined: int = 0
    t_first_us: int | None = None
    t_last_us: int | None = None
    sha256: str = ""
    notes: list[str] = field(default_factory=list)
    clock_offset_us: int = 0


GROUP_FROM = 6  # consecutive files of one kind, none quarantined, that the table shows as one row


def table_rows(reports: list[FileReport]) -> list[FileReport]:
    """The per-file table's rows: each file's report, but a run of GROUP_FROM or more consecutive files
    of one kind with nothing quarantined (a folder of scrapes) is one row of their sums and span,
    named by its count and its first and last file (the table of a day's scrapes was thousands of rows)."""
    rows: list[FileReport] = []
    run: list[FileReport] = []

    def close() -> None:
        if len(run) < GROUP_FROM:
            rows.extend(run)
        else:
            firsts = [r.t_first_us for r in run if r.t_first_us is not None]
            lasts = [r.t_last_us for r in run if r.t_last_us is not None]
            rows.append(FileReport(f"{len(run):,} files: {Path(run[0].path).name} … {Path(run[-1].path).name}", run[0].kind,
                                   sum(r.lines for r in run), sum(r.parsed for r in run), 0,
                                   min(firsts) if firsts else None, max(lasts) if lasts else None))
        run.clear()

    for r in reports:
        if run and (r.kind != run[0].kind or r.quarantined):
            close()
        if r.quarantined:
            rows.append(r)
        else:
            run.append(r)
    close()
    return rows


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise ReplayError(f"{path}: is a directory; pass the evidence files inside it")
    if path.is_symlink() and not path.exists():
        raise ReplayError(f"{path}: a link to {os.readlink(path)}, which leads nowhere (gone, or a loop of links)")
    if not path.exists():
        raise ReplayError(f"{path}: no such file")
    refuse_stream(path)


def _expand(paths: list[Path], out: Path) -> tuple[list[Path], set[Path]]:
    """The evidence files: a directory (an incident folder) stands for every file under it, in name
    order, leaving out hidden files and the bundle being written. Returns the files and which of
    them came from a folder (those may be skipped, with a note, where a named file is an error: a
    broken link or a pipe among them too, which are not files but are not left out unsaid)."""
    files: list[Path] = []
    found: set[Path] = set()
    for p in paths:
        if not p.is_dir() or is_bundle(p):  # (a bundle, a live recording say, is one piece of evidence)
            files.append(p)
            continue
        inside = sorted(f for f in p.rglob("*") if not f.is_dir() and not any(
            part.startswith(".") for part in f.relative_to(p).parts) and out.resolve() not in (f.parent.resolve() / f.name).parents)
        if not inside:
            raise ReplayError(f"{p}: a directory with no evidence files in it")
        files += inside
        found.update(inside)
    return files, found


def _read_text(path: Path, limit: int = -1) -> str:
    """The file's text, decompressed where it is compressed, or its first ``limit`` bytes; binary data
    (an archive among it) is refused with a clear message."""
    _check_file(path)
    kind = compression(path)
    try:
        with decompressed(path, kind, path) as fh:
            raw = read_past_nul_run(fh, limit)[1]  # (past a hole of NULs a copytruncate left)
    except DECOMPRESS_ERRORS as e:
        if kind is None:
            raise
        raise damaged(path, kind, e) from None
    bom = text_bom(raw)
    if bom is not None:  # UTF-8 with a mark, or UTF-16/32 (a cut at ``limit`` ends in U+FFFD at worst)
        return raw[bom[0]:].decode(bom[1], errors="replace")
    if b"\x00" in raw[:4096]:
        if raw[257:262] == b"ustar":  # (a tar header's mark)
            raise ReplayError(f"{path}: a tar archive; unpack it (tar xf {path}) and pass the files inside it")
        head = raw[:4096]
        for order, nuls, chars in (("LE", head[1::2], head[0::2]), ("BE", head[0::2], head[1::2])):
            # ASCII as UTF-16: every other byte NUL, the bytes between them not
            if len(nuls) > 8 and nuls.count(0) > 0.9 * len(nuls) and chars.count(0) < 0.1 * len(chars):
                raise ReplayError(f"{path}: UTF-16{order} text without a byte-order mark; convert it first: "
                                  f"iconv -f UTF-16{order} -t UTF-8 {path} > {path.stem}.utf8{path.suffix}")
        raise ReplayError(f"{path}: binary data, not a text log or export (NUL bytes in the first 4 KiB)")
    return raw.decode("utf-8", errors="replace")


def _text_lines(path: Path) -> Iterator[str]:
    """A text file's lines as editors number them (split at LF, a CR before it dropped), read in the
    log lane's bounded pieces: gzip decompressed, a byte-order mark honoured, bad bytes replaced."""
    for piece in text_pieces(path, 1 << 20, None, fastlog.MAX_LINE_BYTES):
        if isinstance(piece, fastlog.LongLine):  # (its head stands for it: a quarantine entry holds no more)
            yield piece.head.decode("utf-8", errors="replace")
            continue
        for ln in physical_lines(piece.decode("utf-8", errors="replace")):
            yield ln.removesuffix("\r")


def _fingerprint(path: Path, size: int) -> tuple[int, str]:
    """Size and a hash of the first and last MiB: files that differ here differ. Two files alike here
    are hashed whole before either is taken as a copy of the other."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        h.update(fh.read(1 << 20))
        if size > 2 << 20:
            fh.seek(size - (1 << 20))
            h.update(fh.read())
    return size, h.hexdigest()


def _timed(lf: pl.LazyFrame, year: int, tz_offset_s: int, clock_offset_us: int = 0,
           turns: list[tuple[int, int]] | None = None) -> pl.LazyFrame:
    """Add ``t`` (epoch µs) to log facts: ``t_exact`` where the line had an ISO container timestamp,
    else the logged 'MM-DD HH:MM:SS' in ``year`` (the rules of ``vllm_log.fact_time_us``), or in the
    year ``turns`` give its line (a log that runs through New Year, see ``year_turns``), corrected by
    the source's clock offset (how far its clock ran ahead of true time)."""
    if turns:
        state = pl.DataFrame(turns, schema={"line": pl.Int64, "_state": pl.Int64}, orient="row").lazy()
        month = pl.col("ts").str.slice(0, 2).cast(pl.Int64, strict=False)
        st = pl.col("_state").fill_null(turns[0][1])
        d = month - 1 - st % 12
        lf = lf.sort("line").join_asof(state, on="line").with_columns(
            _year=pl.lit(year) + st // 12 + pl.when(d <= -TURN_MONTHS).then(1).when(d >= TURN_MONTHS).then(-1).otherwise(0))
        logged = (pl.col("_year").cast(pl.Utf8) + "-" + pl.col("ts")).str.to_datetime(
            "%Y-%m-%d %H:%M:%S", time_unit="us", strict=False)
        return lf.with_columns(t=pl.coalesce(pl.col("t_exact"), logged.dt.epoch("us") - tz_offset_s * 1_000_000)
                               - clock_offset_us).drop("_state", "_year")
    logged = _by_runs(pl.col("ts"), lambda ts: (pl.lit(f"{year}-") + ts).str.to_datetime(
        "%Y-%m-%d %H:%M:%S", time_unit="us", strict=False).dt.epoch("us"))
    return lf.with_columns(t=pl.coalesce(pl.col("t_exact"), logged - tz_offset_s * 1_000_000) - clock_offset_us)


def _by_runs(col: pl.Expr, f: Callable[[pl.Expr], pl.Expr]) -> pl.Expr:
    """``f`` of ``col``, worked out once for each run of equal values (``f`` maps a value alone). A log's
    facts come in its order, dozens to a logged second: the year joined to each time before parsing it
    was most of the parse (a replica's 844k request facts: 36 CPU-ms a fact at a time, 23 a run at a time)."""
    run = col.rle_id()
    return f(col.filter((run != run.shift(1)).fill_null(True))).gather(run)


TURN_MONTHS = 9  # a log's dates falling back this many months or more turn to a new year (Dec -> Jan is
# 11; a smaller fall is lines out of order, such as runs months apart pasted into one file, not a turn)


def _year_near(month: int, state: int) -> int:
    """The year (0: the log's first) that puts ``month`` (1-12) nearest the log's progress ``state``
    (years × 12 + month - 1): a line of December just after the log turned to January is the old
    year's; one of January just before a probe saw the turn is already the new year's."""
    d = month - 1 - state % 12
    return state // 12 + (1 if d <= -TURN_MONTHS else -1 if d >= TURN_MONTHS else 0)


def _logged_month(ts: str | None) -> int:
    """The month of a logged 'MM-DD …' time; 0 for anything else (an ISO time, which is exact)."""
    return int(ts[:2]) if ts and is_uint(ts[:2]) and ts[2:3] == "-" else 0


def _year_at(turns: list[tuple[int, int]], line: int, ts: str | None) -> int:
    """The year (0: the log's first) of a fact at ``line`` logged at ``ts`` ('MM-DD …'), by ``turns``."""
    month = _logged_month(ts)
    if not turns or not month:
        return 0
    k = bisect.bisect_right(turns, (line, 1 << 62)) - 1
    return _year_near(month, turns[max(k, 0)][1])


def _year_probes(lp: LogParse, ff: FastFacts) -> list[tuple[int, str]]:
    """(line, logged time) of a log's facts, enough to see where it turns to a new year: every fact
    of the line-by-line parser and every stats fact (few), and the first and last request fact of
    each piece (noted as the piece was spilled: the request facts are not read again)."""
    probes = [(f.line, f.key_ts) for f in lp.facts if f.logged_ts and f.key_ts]
    probes += ff.stats_frame().select("line", "ts").collect().rows()
    return [(int(ln), str(ts)) for ln, ts in probes if ts is not None] + ff.request_ends


def year_turns(probes: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """Where a log without years runs into a new year: from (line, 'MM-DD …') probes of its facts, the
    lines where its progress (``_year_near``'s state) moves on, as (line, state); empty when the log
    stays in one year (the common case, which then costs nothing more)."""
    out: list[tuple[int, int]] = []
    state: int | None = None
    for line, ts in sorted(probes):
        m = _logged_month(ts)
        if not 1 <= m <= 12:
            continue  # (an ISO time: exact, no year to find)
        cand = m - 1 if state is None else _year_near(m, state) * 12 + m - 1
        if state is None or cand > state:
            state = cand
            out.append((line, state))
    return out if out and out[-1][1] >= 12 else []


@dataclass
class _LogFacts:
    """The columnar facts of one log file, how its times are read, and the repeat keys of the stats
    facts of the logs before it (``earlier``: a later capture of the same log repeats them)."""

    name: str
    ff: FastFacts
    timed: Callable[[pl.LazyFrame], pl.LazyFrame]
    earlier: pl.Series
    series: str = "vllm-log"  # the source of its stats samples: its own where it runs alongside another log's
    access: list[access_log.AccessLine] | None = None  # its uvicorn access lines, where it states no request


def stats_samples(data: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """The samples (metric, value) one stats line states (a fact of kind 'stats', as ``vllm_log`` reads it)."""
    for key, metric, scale in STATS_SAMPLES:
        if data.get(key) is not None:
            yield metric, data[key] * scale


def log_event(f: LogFact, t: int | None, name: str) -> GatheredEvent:
    """A fact of the log ``name`` as an event at ``t`` (epoch µs; None where it has no time), stated at
    'name:line' (and an OOM its rank stated again, at each place)."""
    data = dict(f.data)
    if "restated_lines" in data:  # (the same OOM stated again by its rank: one OOM, stated where)
        data["restated_at"] = [f"{name}:{n}" for n in data.pop("restated_lines")]
    return {"t": t, "kind": f.kind, "data": data, "source": f"{name}:{f.line}", "rank": f.rank}


def bundle_event(e: GatheredEvent, t0: int | None) -> dict[str, Any]:
    """An event as ``events.jsonl`` holds it: at µs since ``t0``, its fields beside its kind."""
    t = e["t"]
    t_us = t - t0 if (t is not None and t0 is not None) else None
    return {"t_us": t_us, "kind": e["kind"], "source": e["source"], "rank": e.get("rank"), **e["data"]}


def write_log_facts(w: BundleWriter, log: Path, year: int, t0_us: int,
                    kind_of: Callable[[str, int | None], str] | None = None) -> LogParse:
    """The facts of one small vLLM log (a replay's server log), read whole by the reference parser,
    into ``w`` at µs since ``t0_us``: its stats lines as 'vllm-log' samples, every other fact as an
    event (its kind as ``kind_of`` names it, given the kind and the time, where given). Returns what
    the log states of itself (version, engine)."""
    lp = parse_log(physical_lines(log.read_bytes().decode("utf-8", errors="replace")))
    for f in lp.facts:
        t = fact_time_us(f.ts, year)
        if f.kind == "stats" and t is not None:
            for metric, value in stats_samples(f.data):
                w.sample(t - t0_us, None, "vllm-log", metric, value)
        if f.kind == "stats":
            continue
        e = bundle_event(log_event(f, t, log.name), t0_us)
        if kind_of is not None:
            e["kind"] = kind_of(e["kind"], e["t_us"])
        w.event(e)
    return lp


def _write_stats(w: BundleWriter, log: _LogFacts, t0: int) -> int:
    """A log's stats facts -> samples, streamed, less those already read from an earlier log; returns
    how many had no time."""
    st = log.timed(log.ff.stats_frame(drop=log.earlier))
    untimed = int(st.select(pl.col("t").is_null().sum()).collect().item())
    st = st.filter(pl.col("t").is_not_null())
    # (with data parallelism each engine's stats are a series of their own: 'vllm-log[Engine 001]')
    source = pl.when(pl.col("dp").is_null() | (pl.col("dp") == "Engine 000")).then(pl.lit(log.series)).otherwise(
        pl.concat_str([pl.lit(log.series + "["), pl.col("dp"), pl.lit("]")]))
    for key, metric, scale in STATS_SAMPLES:
        w.samples_lazy(st.select(t_us=pl.col("t") - t0, gpu=pl.lit(None, dtype=pl.Int64), source=source,
                                 metric=pl.lit(metric), value=pl.col(key) * scale))
    return untimed


def _launch_config(path: Path, kind: engine_config.Kind) -> tuple[engine_config.EngineConfig | None, str]:
    """A launch configuration file's settings, and what to say of it: what it holds, or (its settings
    None) why none could be read, naming its line; the file is then quarantined, not the recording."""
    try:
        cfg = engine_config.read_config(path, kind, path.name)
    except ReplayError as e:
        return None, f"a vLLM launch configuration ({kind}) without one that can be read: {e.message}"
    n = len({s.name for s in cfg.settings})
    return cfg, f"the {kind} that starts vLLM: {n} arguments" + (f", {len(cfg.env)} environment settings" if cfg.env else "")


def _an_argument(s: engine_config.ArgSetting) -> bool:
    """Whether a statement is of an argument as production gave it: any a command, manifest or the server's
    parsed arguments state; of the engine's own config line and a scrape's labels, the plain values of
    arguments (not 'compilation_config={…}' as the engine resolved it, nor 'num_gpu_blocks')."""
    if s.form not in ("engine_config", "cache_config_info"):
        return True
    plain = isinstance(s.value, (int, float, bool)) or isinstance(s.value, str) and "(" not in s.value
    return s.name in engine_config.ENGINE_ARGS and plain


def _keep_config(meta: BundleMeta, configs: list[engine_config.EngineConfig], events: list[GatheredEvent]) -> None:
    """Production's configuration into bundle.json: the engine's and the server's arguments under vLLM's
    names (typed), where each is stated, the environment, the model; two sources that disagree, in the
    notes. A scrape's vllm:cache_config_info labels count among them."""
    for e in events:
        if e["kind"] == "kv_config":
            labels = {k: str(v) for k, v in e["data"].items() if v is not None}
            configs.append(engine_config.EngineConfig(settings=engine_config.from_cache_config_info(labels, e["source"])))
    if not configs:
        return
    every = engine_config.merge(configs)
    cfg = engine_config.EngineConfig(settings=[s for s in every.settings if _an_argument(s)], env=every.env)
    resolved = {s.name: s.value for s in every.settings if not _an_argument(s)}
    if resolved:  # (what the engine made of its arguments, for the record: not arguments to give a replay)
        meta.extra["engine_config_resolved"] = resolved
    meta.engine_args.update({k: v for k, v in cfg.engine_args().items() if v is not None})
    meta.server_args = {k: v for k, v in cfg.server_args().items() if v is not None}
    meta.engine_args_sources = {k: v for k, v in cfg.sources().items() if k in meta.engine_args or k in meta.server_args}
    meta.engine_env = {k: {"value": v, "source": src} for k, (v, src) in cfg.env.items()}
    model = meta.engine_args.get("model")
    if isinstance(model, str) and meta.model is None:
        meta.model = model
    served = meta.server_args.get("served_model_name")
    if served is not None:
        meta.extra["served_model_name"] = served
    meta.notes += [f"production's configuration is stated twice, differently: {d}" for d in cfg.disagreements()]


def _states_requests(ff: FastFacts) -> bool:
    """Whether a parsed log holds request lines of vLLM's own (their facts spilled by the fast lane)."""
    return any(pl.scan_ipc(f).select(pl.len()).collect().item() for f in ff.requests)


def _requests_from_access_lines(requests: Path, logs: list[_LogFacts], t0: int,
                                stage: Callable[[str], None] | None) -> dict[str, int]:
    """Rows for the inference calls in the access lines of each log that states no request of its own,
    added to the written ``requests.parquet`` (rewritten whole, beside, then renamed); returns how many
    per log."""
    frames: dict[str, pl.DataFrame] = {}
    for log in logs:
        if not log.access:
            continue
        if stage is not None:
            stage(f"placing the access lines of {log.name}")
        frames[log.name] = access_log.rows(log.access, log.name, log.timed, t0)
    if not frames:
        return {}
    old = pl.read_parquet(requests) if requests.exists() else pl.DataFrame(schema=REQUESTS_SCHEMA)
    merged = pl.concat([old, *frames.values()], how="diagonal_relaxed")
    with written_in_place(requests) as part:
        merged.write_parquet(part, compression_level=2)
    return {k: v.height for k, v in frames.items()}


def _fits_columns(head: str, columns: str | None) -> str | None:
    """'nvidia-smi' for rows that nothing else recognises and that have as many fields as the column
    list given for headerless nvidia-smi CSV (a query without timestamps has nothing else to tell it by)."""
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return "nvidia-smi" if columns and first.count(",") == columns.count(",") else None


NEWEST_KNOWN = version_key(catalogue.load().versions[-1])[:2]  # the newest vLLM the catalogue was built from


def _contradiction(lo: str, hi: str, whose: str, where: str) -> str:
    """The note for line formats of versions that never coexisted (some of ``lo`` or later, some of
    ``hi`` or earlier), for which no version is inferred."""
    return (f"{whose} line formats contradict each other (some are of vLLM {lo} or later, some of {hi} or earlier): "
            f"logs of several versions {where}, or a build of its own; no version is inferred")


def version_notes(stated: str | None, inferred: str | None) -> list[str]:
    """What to say about the vLLM version: one newer than the recorder knows (its changed lines may be
    missed), and one stated that its line formats contradict (a fork or nightly with other line numbers,
    or lines pasted in from another log)."""
    out = []
    newest = stated or (inferred.split("..")[-1] if inferred else None)
    if newest and version_key(newest)[:2] > NEWEST_KNOWN:
        out.append(f"vLLM {newest} is newer than the versions this recorder knows (0.6-{'.'.join(map(str, NEWEST_KNOWN))}): "
                   "facts on lines whose format changed may be missed")
    if stated and inferred:
        lo, _, hi = inferred.partition("..")
        lo_key, hi_key, key = version_key(lo), version_key(hi or lo), version_key(stated)
        if not (lo_key <= key and key[:len(hi_key)] <= hi_key):  # ('0.21.0.post1' is within '..0.21.0')
            out.append(f"the log states vLLM {stated}, but its line formats and call sites match {inferred}: a build "
                       "with other line numbers (a fork or nightly), or lines from another log; the stated version is used")
    return out


APART_US = 24 * 3600 * 1_000_000  # an incident's evidence is hours apart, not days


def merge_file_notes(notes: list[str], names: set[str]) -> list[str]:
    """``notes`` with those that say the same of several files ('<file>: <what>') said once, naming how
    many files and the first and last of them: a folder of a day's scrapes gave thousands of notes that
    each said 'scrape time from file name'. Each stands where its first one stood."""
    said: dict[str, dict[str, None]] = {}  # what -> the files it is said of, in order
    order: list[tuple[bool, str]] = []
    for n in notes:
        name, sep, what = n.partition(": ")
        if not sep or name not in names:
            order.append((False, n))
            continue
        if what not in said:
            said[what] = {}
            order.append((True, what))
        said[what][name] = None
    out = []
    for merged, text in order:
        if not merged:
            out.append(text)
            continue
        files = list(said[text])
        who = ", ".join(files) if len(files) < 3 else f"{len(files):,} files ({files[0]} … {files[-1]})"
        out.append(f"{who}: {text}")
    return out


def far_apart(spans: list[tuple[str, int, int]]) -> str | None:
    """A note where the files' time spans (name, first, last µs) fall into groups more than a day apart:
    a wrong --year, --tz or --at, or a file from another incident, puts evidence where it cannot line up
    with the rest (the bundle's timeline then starts at the earliest). None where they do not."""
    if len(spans) < 2:
        return None
    spans = sorted(spans, key=lambda x: x[1])
    end = spans[0][2]
    for name, first, last in spans[1:]:
        if first - end > APART_US:
            before = [n for n, _, e in spans if e <= end]
            def day(us: int) -> str:
                return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
            return (f"the evidence falls into times {(first - end) / APART_US:.0f} days apart: {', '.join(before)} "
                    f"end by {day(end)} UTC, {name} starts {day(first)} UTC; check --year, --tz and --at, or leave "
                    "out files from another incident")
        end = max(end, last)
    return None


def _another_machine(known: dict[int, dict[str, Any]], new: dict[int, dict[str, Any]]) -> str | None:
    """Where a file's GPU of some index is not the GPU of that index the files before it describe (its
    UUID, host or PCI bus differ: a machine numbers its GPUs the same way every time), what differs;
    None where nothing does."""
    for gi, info in sorted(new.items()):
        for key in ("uuid", "host", "pci_bus_id"):
            was, now = known.get(gi, {}).get(key), info.get(key)
            if was and now and was != now:
                return f"GPU {gi} is {now} here, {was} before"
    return None


def _device_rows() -> pl.Expr:
    return device_source(pl.col("source")) & pl.col("gpu").is_not_null() & pl.col("t_us").is_not_null()


def _beside_same_index(g: _Gathered, path: Path, frame: pl.LazyFrame) -> str | None:
    """Where a file's GPU of some index has device samples over the same times as that index's samples of
    the same source in an earlier file (two times or more each), and they are not the same samples (a
    capture saved twice), what says so: one GPU is not sampled twice over, so the two are two
    machines' (nvidia-smi's CSV of each node of a fleet names no host; its GPUs are 0-7 on every
    node). None where none; this file's spans are kept for the files after it."""
    spans = (frame.lazy().filter(_device_rows()).group_by("gpu", "source")  # (no copy of the file's rows)
             .agg(lo=pl.col("t_us").min(), hi=pl.col("t_us").max()).sort("gpu").collect())
    said = None
    for gi, source, lo, hi in spans.iter_rows():
        for name, fi, a, b in g.gpu_spans.get((gi, source), []):
            if said is None and name != str(path) and lo <= b and a <= hi:
                said = _two_machines(frame, g.sample_frames[fi], gi, source, (max(lo, a), min(hi, b)), name)
        g.gpu_spans.setdefault((gi, source), []).append((str(path), len(g.sample_frames), lo, hi))
    return said


def _two_machines(mine: pl.LazyFrame, theirs: pl.DataFrame | pl.LazyFrame, gi: int, source: str,
                  span: tuple[int, int], name: str) -> str | None:
    """Why GPU ``gi``'s samples of two files over ``span`` are two machines'; None where they may be one's."""
    def within(df: pl.DataFrame | pl.LazyFrame, lo: int, hi: int) -> pl.LazyFrame:  # (one filter: no copy of a day's rows)
        return df.lazy().filter((pl.col("gpu") == gi) & (pl.col("source") == source) & pl.col("t_us").is_between(lo, hi))
    head = within(mine, *span).head(1000).collect()
    there = within(theirs, int(head["t_us"].min()), int(head["t_us"].max())).collect() if head.height else head  # type: ignore[arg-type]
    if min(head["t_us"].n_unique(), there["t_us"].n_unique()) < 2:
        return None  # (a snapshot taken while another file polled: one machine's)
    if not head.join(there, on=list(head.columns), how="anti").height:
        return None  # (the same samples: one capture saved twice)
    return (f"GPU {gi}'s samples run over the same times as GPU {gi}'s of {Path(name).name}, and no UUID, "
            "host or bus tells the two apart: one GPU is not sampled twice over")


SAMPLES_AT_ONCE = 1 << 19  # the evidence's samples are written in frames of about this many


def _scrape_named_at(kind: str | None, path: Path, head: str, opts: RecordOptions) -> int | None:
    """When a Prometheus scrape was taken, where only its name says so (None otherwise). Files of the
    same bytes named at different times are scrapes of their own, not one file given twice: an idle
    server's /metrics reads the same scrape after scrape."""
    if kind != "prometheus-text" or opts.at:
        return None
    t, how = common.scrape_time(path, head, None, opts.tz_offset_s)
    return t if how == "file name" else None


def _t_span(frame: pl.DataFrame | pl.LazyFrame) -> tuple[int | None, int | None]:
    """The first and last time of a samples frame (None where it has none)."""
    lo, hi = frame.lazy().select(pl.col("t_us").min().alias("lo"), pl.col("t_us").max().alias("hi")).collect().row(0)
    return lo, hi


def _batches(frames: list[pl.DataFrame | pl.LazyFrame], rows: int) -> Iterator[pl.DataFrame]:
    """``frames`` joined into frames of ``rows`` or more (the last may hold fewer), each frame emptied
    from the list as it is joined (and a lazy one read only then, ``rows`` at a time: a node's day of
    nvidia-smi read whole, then filtered and cast, was the recording's peak): a part file a scrape made
    thousands of files."""
    held: list[pl.DataFrame] = []
    n = 0
    frames.reverse()
    while frames:
        f = frames.pop()
        for piece in _slices(f, rows) if isinstance(f, pl.LazyFrame) else [f]:
            held.append(piece)
            n += piece.height
            if n >= rows:
                yield pl.concat(held)
                held, n = [], 0
    if held:
        yield pl.concat(held)


def _slices(lf: pl.LazyFrame, rows: int) -> Iterator[pl.DataFrame]:
    """``lf`` (a spilled file's scan, its columns changed but no row left out) read ``rows`` at a time,
    each slice pushed down to the scan. ``collect_batches`` ran ahead of the writer: a node's day of
    nvidia-smi (2.8M samples) held ~220 MiB where slices held ~80."""
    at = 0
    while True:
        piece = lf.slice(at, rows).collect()
        if piece.height:
            yield piece
        if piece.height < rows:
            return
        at += rows


LATEST_US = int(datetime(2200, 1, 1, tzinfo=timezone.utc).timestamp() * 1_000_000)


def _set_aside_impossible_times(r: common.Parsed) -> None:
    """Samples and events dated before 1970 or after 2200 (a corrupt or mistyped timestamp: seconds
    written as milliseconds twice over, a stray 1e20) go to quarantine with their time: one of them
    would move the bundle's start by centuries, or past what a 64-bit time can hold."""
    def bad(t: int | None) -> bool:
        return t is not None and not 0 <= t < LATEST_US

    odd = [x for x in r.samples if bad(x[0])]  # (before they are a frame: a time can be past 64 bits)
    if odd:  # (rare: the samples are gone over again only then)
        r.samples = [x for x in r.samples if not bad(x[0])]
    past = (pl.col("t_us") < 0) | (pl.col("t_us") >= LATEST_US)
    if r.on_disk is not None and any(bad(t) for t in r.on_disk.select(  # (its times' ends first: one column read)
            pl.col("t_us").min().alias("lo"), pl.col("t_us").max().alias("hi")).collect(engine="streaming").row(0)):
        odd += r.on_disk.filter(past).collect(engine="streaming").iter_rows()
        r.on_disk, r.on_disk_filtered = r.on_disk.filter(~past.fill_null(False)), True  # (still on disk: left out as it is read)
    for i, f in enumerate(r.frames):  # (a vectorised lane's)
        odd += f.filter(past).iter_rows()
        r.frames[i] = f.filter(~past.fill_null(False))
    for t, gpu, source, metric, value in odd:
        r.quarantine.append((None, f"{source} {metric} (GPU {gpu}) = {value:g} at an impossible time ({t} µs since "
                                   "1970): not placed", ""))
    for e in [e for e in r.events if bad(e.get("t"))]:
        r.quarantine.append((e.get("line"), f"{e['kind']} event at an impossible time ({e['t']} µs since 1970): "
                                            "not placed", ""))
    r.events = [e for e in r.events if not bad(e.get("t"))]


def record(paths: list[Path], out: Path, opts: RecordOptions) -> tuple[list[FileReport], dict[str, Any]]:
    """Record ``paths`` into the bundle ``out``; see the module docstring. The bundle is written beside
    ``out`` and swapped in whole once complete: interrupted or failed, it leaves ``out`` as it was and
    nothing of its own behind (no spilled pieces, no half-written bundle)."""
    with bundle_written(out) as into:
        return _record(paths, out, opts, into)


def _record(paths: list[Path], out: Path, opts: RecordOptions, into: Path) -> tuple[list[FileReport], dict[str, Any]]:
    if not paths:
        raise ReplayError("no evidence files given", 2)
    spill_root = into / ".spill"
    files, launches = _read_files(paths, out, opts, spill_root)
    year, year_note = _log_year(files, opts)
    g = _Gathered(year=year, notes=[year_note] if any(f.log is not None for f in files) else [])
    for f in files:
        _gather(g, f, opts)
    _place_relative(g, files)
    apart = far_apart([(Path(f.report.path).name, f.report.t_first_us, f.report.t_last_us) for f in files
                       if f.report.t_first_us is not None and f.report.t_last_us is not None])
    if apart:
        g.notes.append(apart)
    if g.log_samples:
        g.sample_frames.append(pl.DataFrame(g.log_samples, schema=SAMPLES_SCHEMA, orient="row"))
    t0 = g.t0()
    meta = _bundle_meta(g, files, launches, t0, opts)
    return [f.report for f in files], _write(into, meta, g, t0, opts, spill_root)


# --- read and recognise ------------------------------------------------------------------------------
@dataclass
class LogRead:
    """A vLLM log as read: what its lines state one by one (the reference parser's), its columnar
    facts (the fast lane's), and its uvicorn access lines where it states no request."""

    parse: LogParse
    facts: FastFacts
    access: list[access_log.AccessLine] | None = None


@dataclass
class FileRead:
    """One evidence file as read: its report, and what it states: a log's facts or a parser's samples
    and events; neither for a file set aside (skipped, a duplicate, empty, a launch configuration, or
    of no known kind: its lines are quarantined when the bundle is written)."""

    path: Path
    report: FileReport
    log: LogRead | None = None
    parsed: common.Parsed | None = None
    samples: pl.LazyFrame | None = None  # the parser's samples where they wait on disk (``_spill_samples``)

    def sample_frame(self) -> pl.LazyFrame:
        """The parser's samples (SAMPLES_SCHEMA, epoch µs), on disk or in memory."""
        assert self.parsed is not None
        return self.samples if self.samples is not None else self.parsed.frame().lazy()


@dataclass
class _Seen:
    """What the files read so far tell of the next."""

    hashes: dict[str, str] = field(default_factory=dict)  # sha256 -> the first file of those bytes
    scrape_times: dict[str, set[int | None]] = field(default_factory=dict)  # the times in the names of
    # scrapes of the same bytes
    fingerprints: dict[tuple[int, str], list[Path]] = field(default_factory=dict)
    launches: list[engine_config.EngineConfig] = field(default_factory=list)  # the launch configurations
    workers: processes.Workers | None = None  # where large logs are read, side by side (``_read_log_apart``)
    pending: dict[Path, Callable[[], None]] = field(default_factory=dict)  # logs read there: each one's
    # taking of what its worker gives back (its facts; its hash, which a later look-alike is checked against)
    apart: list[Path] = field(default_factory=list)  # the logs handed to the workers, in order

    def take(self, paths: list[Path]) -> None:
        """What the workers give back for ``paths`` (those among them read apart), taken now."""
        for path in paths:
            if (taken := self.pending.pop(path, None)) is not None:
                taken()


def _read_files(paths: list[Path], out: Path, opts: RecordOptions,
                spill_root: Path) -> tuple[list[FileRead], list[engine_config.EngineConfig]]:
    """Every file read and recognised, in order, and the launch configurations among them."""
    paths, from_folder = _expand(paths, out)
    seen = _Seen()
    malloc.give_back_large_blocks()
    read: dict[int, FileRead] = {}
    with processes.workers(LOG_PROCESSES, opts.progress) as workers:
        # (workers, where two files are large, or two would be read apart: large captures read in parts too)
        cost = {i: c for i, p in enumerate(paths) if (c := _cost_apart(p, opts)) is not None} if _cores() >= 2 else {}
        if len(cost) >= 2 or (cost and sum(1 for p in paths if _size(p) >= APART_MIN_BYTES) >= 2):
            seen.workers = workers
        else:
            cost = {}
        # the files the workers read (large logs, and large captures read in parts) are handed to them first,
        # the costliest first (a costly log left for last kept one core waiting on it; the captures, a few
        # seconds each, end the queue), a file like one before it (a copy, whose reading waits on that one's
        # hash) after the others; then the other files are read here, once few wait (``_own_turn``; in order
        # otherwise: files of the same bytes are of the same size and cost, so which is read first holds)
        prints = {i: _fingerprint(paths[i], paths[i].stat().st_size) for i in cost}
        like = {i for i in cost if any(prints[j] == prints[i] for j in cost if j < i)}
        order = sorted(range(len(paths)), key=lambda i: (i not in cost, i in like, -cost.get(i, 0)))
        own = [i for i in order if i not in cost]
        for i in order:
            if own and i == own[0]:
                _own_turn(seen, {paths[j]: c for j, c in cost.items()}, sum(_size(paths[j]) for j in own) * OWN_BYTE_COST)
            read[i] = _read_file(paths[i], paths[i] in from_folder, opts, seen, spill_root / str(i))
            malloc.trim()  # (what reading it freed: file after file, the heaps kept it)
        seen.take(paths)
    return [read[i] for i in range(len(paths))], seen.launches


def _own_turn(seen: _Seen, cost: dict[Path, float], own: float) -> None:
    """Wait, before this process reads the files the workers do not, until the logs that no worker has
    begun cost no more than those files (``own``, in the logs' cost): then both end about together. Read
    at once, beside the two workers' costliest logs, a fleet's day of nvidia-smi took their cores while
    logs still waited, and its memory met theirs: the record's peak was 1.25 times a tenth of the fleet's
    (728 / 581 MiB, ``bench_time_to_answer``); so, 1.12 (688 / 616 MiB), in the same time (78-81 s)."""
    if seen.workers is None:
        return
    while sum(cost.get(seen.apart[k], 0.0) for k in seen.workers.waiting()) > own:  # (every call a file of ``apart``)
        seen.workers.wait_for_one(OWN_TURN_POLL_S)


OWN_BYTE_COST = 5.0  # what a byte of the files read here costs beside a byte of a log at INFO: a node's day of
# nvidia-smi (55 MB) took 2.3 CPU-s, a 1.2 GiB log 9-10 (a file read line by line in Python costs more:
# begun later than it could be, it never waits on more than the logs left)
OWN_TURN_POLL_S = 0.5  # (a wait that a signal's handler may interrupt)


def _size(path: Path) -> int:
    """A file's size (0: not a file, or not there: said when it is read)."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _cost_apart(path: Path, opts: RecordOptions) -> float | None:
    """What reading ``path`` costs, where a worker reads it (by its size and its head): a vLLM log
    (``_read_log_apart``), or a capture read in parts (``_read_parsed_apart``: OWN_BYTE_COST a byte);
    else None. A log's bytes cost alike, but for 'Received request' and DEBUG lines (``_byte_cost``),
    whose share of the bytes is taken from the head and, in a plain file, from the middle (a log's head
    may be its start's output)."""
    try:
        if not (path.is_file() and (size := path.stat().st_size) >= min(APART_MIN_BYTES, PARSED_APART_MIN_BYTES)):
            return None
        head = _read_text(path, 1 << 16)
        kind = _kind(path, head, opts)
    except ReplayError:
        return None  # (read in its turn, where what is wrong with it is said)
    if kind in PIECEWISE:
        return size * OWN_BYTE_COST if size >= PARSED_APART_MIN_BYTES else None
    if kind != "vllm-log" or size < APART_MIN_BYTES:
        return None
    per_byte = _byte_cost(head)
    if compression(path) is None:
        with path.open("rb") as fh:
            fh.seek(size // 2)
            per_byte = max(per_byte, _byte_cost(fh.read(1 << 16).decode("utf-8", errors="replace")))
    return size * per_byte


def _byte_cost(text: str) -> float:
    """What a byte of ``text`` costs to read, a byte of INFO lines costing 1: more in 'Received request'
    lines (V0's request logging, whose prompts and token ids are read by regular expressions) and in DEBUG
    lines (each asked whether it opens a message, as the line after a templated line)."""
    received = debug = 0
    for ln in text.splitlines():
        if "Received request" in ln:
            received += len(ln)
        elif ln.startswith("DEBUG ") or " DEBUG " in ln:
            debug += len(ln)
    return 1 + (RECEIVED_COST * received + DEBUG_COST * debug) / max(1, len(text))


RECEIVED_COST = 0.7  # what reading a log all of 'Received request' lines costs beyond another: V0's request
# logging (~0.95 of its bytes) took 6.1 CPU-s a 400 MB, V1's lines at INFO 3.7
DEBUG_COST = 0.45  # the same of DEBUG lines: a fleet's log at DEBUG (0.54 of its bytes) took 11.3-14.6 CPU-s a
# 1.2 GiB, one at INFO 9.2-11.4. Judged as INFO, it was read last, by one worker while the other's core idled
# (by the logs' costs ~10 s at a fleet's day; with it read second, ~6 s, and the reading ends ~2 s sooner)


def _cores() -> int:
    """The cores this process may run on (one core: two workers would take turns, and hold twice the memory)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


LOG_PROCESSES = 2  # large logs read side by side, each in a process of its own (``replay.processes``)
APART_MIN_BYTES = 64 << 20  # a log this large is read apart where there are two such files, or two files read
# apart in all (a worker's start: ~1 s, its imports)
PARSED_APART_MIN_BYTES = 16 << 20  # a capture read in parts (``PIECEWISE``) this large is read apart too,
# where there are workers: handed on after the logs, the smallest calls last (a fleet's day: 8 nodes'
# nvidia-smi, 55 MB each, read here beside the workers' last logs ended ~5 s after the other core idled)


def _done(opts: RecordOptions, size: int) -> None:
    if opts.progress is not None:
        opts.progress(size)


def _read_file(path: Path, in_folder: bool, opts: RecordOptions, seen: _Seen, spill: Path) -> FileRead:
    if is_bundle(path):
        bundled = parse_bundle(path)
        rep = FileReport(str(path), "bundle", sha256=bundle_sha256(path), notes=list(bundled.notes))
        rep.lines, rep.parsed = bundled.lines, bundled.parsed
        return FileRead(path, rep, parsed=bundled)
    try:
        head, size = _read_text(path, 1 << 16), path.stat().st_size  # enough to recognise it
    except ReplayError as e:
        if not in_folder:
            raise
        return FileRead(path, FileReport(str(path), "skipped",  # (not hashed: a core dump or weights file can be gigabytes)
                                         notes=[f"skipped: {e.message.removeprefix(f'{path}: ')}"]))
    kind = _kind(path, head, opts)
    launch = _read_launch(path, head, kind, opts, seen)
    if launch is not None:
        _done(opts, size)
        return launch
    fp = _fingerprint(path, size)
    alike = seen.fingerprints.setdefault(fp, [])
    seen.take(alike)  # (a look-alike's hash: this one may be a copy of it)
    # a log with no look-alike is hashed while it is parsed (one read); anything else now
    hash_later = kind in STREAMED and not alike and size > (1 << 16)
    alike.append(path)
    rep = FileReport(str(path), kind or "unknown", sha256="" if hash_later else file_sha256(path))
    if (nuls := nul_run(path)):
        rep.notes.append(nul_run_note(path.name, nuls))
    if _a_duplicate(path, head, kind, rep, seen, opts):
        _done(opts, size)
        return FileRead(path, rep)
    if not head.strip() and size < (1 << 16):
        rep.kind = "empty"
        rep.notes.append("empty file")
        _done(opts, size)
        return FileRead(path, rep)
    if opts.stage is not None:
        opts.stage(f"reading {path.name}")
    if kind == "vllm-log" and seen.workers is not None and size >= APART_MIN_BYTES:
        return _read_log_apart(path, rep, hash_later, opts, seen, spill)
    if kind in STREAMED:
        return FileRead(path, rep, log=_read_log(path, head, kind, rep, hash_later, opts, seen, spill))
    if kind not in PARSERS:  # streamed into quarantine when the bundle is written, never held whole
        rep.kind = "unknown"
        rep.lines = sum(1 for _ in _text_lines(path))
        rep.notes.append("content not recognised; whole file quarantined (use --as KIND)")
        _done(opts, size)
        return FileRead(path, rep)
    own = replace(opts.for_file(path), spill=spill)
    if kind in PIECEWISE and seen.workers is not None and size >= PARSED_APART_MIN_BYTES:
        return _read_parsed_apart(path, kind, size, rep, own, seen)
    parsed, samples = _read_parsed(path, kind, own)
    rep.kind = parsed.kind
    rep.notes += parsed.notes
    _done(opts, size)  # (read whole: done at once)
    return FileRead(path, rep, parsed=parsed, samples=samples)


def _read_parsed(path: Path, kind: str, own: RecordOptions) -> tuple[common.Parsed, pl.LazyFrame | None]:
    """A file of a kind a parser reads, here or (one read in parts, ``PIECEWISE``) in a worker process: what
    it states, its samples spilled to ``own.spill`` where they are many (``_spill_samples``)."""
    assert own.spill is not None
    parsed = (PIECEWISE[kind](path, lambda: _read_text(path), own) if kind in PIECEWISE
              else PARSERS[kind](path, _read_text(path), own))
    _set_aside_impossible_times(parsed)
    parsed.notes += common.renamed_note(path, parsed.vllm_names)
    return parsed, _spill_samples(parsed, own.spill)


def _read_parsed_apart(path: Path, kind: str, size: int, rep: FileReport, own: RecordOptions, seen: _Seen) -> FileRead:
    """A capture read in parts handed to a worker process (``_read_parsed``), as a log is
    (``_read_log_apart``); what it gives back is taken into the file read (``seen.take``)."""
    assert seen.workers is not None
    progress = own.progress
    pending = seen.workers.submit(_read_parsed, path, kind, replace(own, progress=None, stage=None))
    seen.apart.append(path)
    read = FileRead(path, rep)

    def take() -> None:
        read.parsed, read.samples = _from_worker(pending, path)
        rep.kind = read.parsed.kind
        rep.notes += read.parsed.notes
        if progress is not None:
            progress(size)
    seen.pending[path] = take
    return read


def _kind(path: Path, head: str, opts: RecordOptions) -> str | None:
    """The kind of evidence ``path`` is: as --as says, else as its ``head`` shows."""
    return opts.as_kind.get(str(path)) or opts.as_kind.get("*") or detect_kind(head) or _fits_columns(head, opts.nvsmi_columns)


SPILL_SAMPLES_FROM = 1 << 20  # a file's samples past this many wait on disk until the bundle is written


def _spill_samples(parsed: common.Parsed, spill: Path) -> pl.LazyFrame | None:
    """A file's samples, written to ``spill`` and scanned from there where they are many (None where
    they stay in ``parsed``): every file is read before any is written (the year and the bundle's start
    come from all of them), and a fleet's day of nvidia-smi held in memory was 1.8 GiB. Those the parser
    left there itself (``Parsed.on_disk``) stay where they are, the others' after them."""
    on_disk, parsed.on_disk = parsed.on_disk, None
    held = sum(f.height for f in parsed.frames) + len(parsed.samples)
    if on_disk is None and held < SPILL_SAMPLES_FROM:
        return None
    spill.mkdir(parents=True, exist_ok=True)
    if on_disk is not None and parsed.on_disk_filtered:  # (what is kept written anew, a morsel at a time: ``_slices``
        on_disk.sink_ipc(spill / "kept.arrow")  # reads a slice of a plain scan, but the whole of a filtered one)
        on_disk, parsed.on_disk_filtered = pl.scan_ipc(spill / "kept.arrow"), False
    if not held:
        return on_disk
    parsed.frame().write_ipc(spill / "samples.arrow")
    parsed.frames = []
    written = pl.scan_ipc(spill / "samples.arrow")
    return written if on_disk is None else pl.concat([on_disk, written])


def _read_launch(path: Path, head: str, kind: str | None, opts: RecordOptions, seen: _Seen) -> FileRead | None:
    """A command, compose file or manifest that starts vLLM: its configuration kept, the file set
    aside (a pod's status is evidence too: that is read on)."""
    forced = str(path) in opts.as_kind or "*" in opts.as_kind
    launch = None if forced else engine_config.sniff(head)
    if launch is None:
        return None
    cfg, why = _launch_config(path, launch)
    if cfg is not None:
        seen.launches.append(cfg)
    if kind in ("k8s", "k8s-describe"):
        return None
    rep = FileReport(str(path), "launch-config" if cfg is not None else "unknown", sha256=file_sha256(path))
    rep.lines = rep.parsed = sum(1 for _ in _text_lines(path))
    rep.notes.append(why)
    return FileRead(path, rep)


def _a_duplicate(path: Path, head: str, kind: str | None, rep: FileReport, seen: _Seen, opts: RecordOptions) -> bool:
    """Whether the file is one read before (then its report says so); a scrape of the same bytes that
    its name dates at another time is a scrape of its own."""
    sha = rep.sha256
    named = _scrape_named_at(kind, path, head, opts) if sha in seen.hashes else None
    if named is not None and named not in seen.scrape_times.setdefault(
            sha, {_scrape_named_at(kind, Path(seen.hashes[sha]), head, opts)}):
        seen.scrape_times[sha].add(named)
        rep.notes.append(f"the same bytes as {Path(seen.hashes[sha]).name}, but its name dates it at another time: "
                         "a scrape of its own")
    elif sha and sha in seen.hashes:
        rep.kind = "duplicate"
        rep.notes.append(f"identical to {seen.hashes[sha]}; counted once")
        return True
    if sha:
        seen.hashes[sha] = str(path)
    return False


def _read_log(path: Path, head: str, kind: str, rep: FileReport, hash_later: bool, opts: RecordOptions, seen: _Seen,
              spill: Path) -> LogRead:
    """A vLLM log, or one as a logging service exports it (its entries as log lines, then its facts at
    the export's lines), read in pieces."""
    if kind != "log-export":
        read, sha = _read_plain_log(path, spill, opts.keep_prompts, hash_later, opts.progress, fastlog.WORKERS)
        _keep_hash(rep, seen, path, sha)
        return read
    hasher = hashlib.sha256() if hash_later else None
    which = export_kind(head) or ("aws" if head.lstrip().startswith("{") else "gcp")
    spill.mkdir(parents=True, exist_ok=True)
    log_path = spill / "export.log"
    conv = convert(path, which, log_path, opts.progress, hasher)  # (the export is hashed as it is read)
    rep.notes += conv.notes(path.name, which)
    lp, ff = parse_log_file(log_path, spill, keep_prompts=opts.keep_prompts, request_repeats=False)
    read = LogRead(lp, ff)
    if not _states_requests(ff):  # (its access lines stand in for them: read while it is at hand)
        read.access = access_log.scan(_text_lines(log_path), conv.lines)
    renumber(lp, ff, conv)
    if lp.container_year is None and conv.year is not None:
        lp.container_year = conv.year  # (the export's own dates, which have no zone)
    _keep_hash(rep, seen, path, None if hasher is None else hasher.hexdigest())
    return read


def _keep_hash(rep: FileReport, seen: _Seen, path: Path, sha: str | None) -> None:
    """A log's sha256 where it was hashed as it was read (None: it was hashed before)."""
    if sha is not None:
        rep.sha256 = sha
        seen.hashes[sha] = str(path)


def _read_log_apart(path: Path, rep: FileReport, hashed: bool, opts: RecordOptions, seen: _Seen, spill: Path) -> FileRead:
    """A plain vLLM log handed to a worker process (``_read_plain_log``); what it gives back is taken into
    the file read (``seen.take``) before the next look-alike is checked, and once every file is read."""
    assert seen.workers is not None
    pending = seen.workers.submit(_read_plain_log, path, spill, opts.keep_prompts, hashed, processes.report, 1)
    seen.apart.append(path)
    # (one thread: two logs at once keep the cores busy, and a second thread a worker held 90 MiB more
    # for 5 % less time)
    read = FileRead(path, rep)

    def take() -> None:
        if opts.stage is not None:
            opts.stage(f"reading {path.name}")
        read.log, sha = _from_worker(pending, path)
        _keep_hash(rep, seen, path, sha)
    seen.pending[path] = take
    return read


_R = TypeVar("_R")


def _from_worker(pending: processes.Pending[_R], path: Path) -> _R:
    """What a worker gave back for ``path``; a clear error where the worker was killed before."""
    try:
        return pending.get()
    except processes.WorkerDied:
        raise ReplayError(f"{path}: the process that read it ended before it was done (killed: out of "
                          "memory?); nothing written", EXIT_IO) from None


def _read_plain_log(path: Path, spill: Path, keep_prompts: bool, hashed: bool, progress: Callable[[int], None] | None,
                    workers: int) -> tuple[LogRead, str | None]:
    """A plain vLLM log, here or in a worker process: its facts, its uvicorn access lines where it states
    no request, and, with ``hashed``, its sha256 (the file hashed as it is read)."""
    hasher = hashlib.sha256() if hashed else None
    lp, ff = parse_log_file(path, spill, keep_prompts=keep_prompts, progress=progress, hasher=hasher,
                            request_repeats=False, workers=workers)
    read = LogRead(lp, ff)
    if not _states_requests(ff):  # (its access lines stand in for them: read while it is at hand)
        read.access = access_log.scan(_text_lines(path), None)
    return read, None if hasher is None else hasher.hexdigest()


# --- infer the year and the clocks -------------------------------------------------------------------
def _log_year(files: list[FileRead], opts: RecordOptions) -> tuple[int, str]:
    """The year of log lines (they carry none), and where it comes from: --year, else a dated source
    in the bundle, else now."""
    if opts.year:
        return opts.year, f"log year {opts.year} from --year"
    for f in files:
        if f.log is not None and f.log.parse.container_year:
            year = f.log.parse.container_year
            return year, f"log year {year} from the times a container runtime or log shipper put on its lines"
    if any(f.log is not None for f in files):  # (only log lines need a year)
        dated = [t for f in files if f.parsed is not None
                 if (t := _t_span(f.sample_frame().filter(pl.col("t_us") != 0))[0]) is not None]
        dated += [t for f in files if f.parsed is not None for e in f.parsed.events if (t := e.get("t"))]
        dated += [t for f in files if f.parsed is not None for q in f.parsed.requests if (t := q.arrival_t)]
        if dated:
            year = datetime.fromtimestamp(min(dated) / 1e6, tz=timezone.utc).year
            return year, f"log year {year} taken from another dated source in the bundle"
    year = datetime.now(timezone.utc).year
    return year, f"log lines carry no year and no other source dates them: assumed {year} (set --year)"


# --- gather and rebase -------------------------------------------------------------------------------
@dataclass
class _Gathered:
    """What the files state, gathered on one clock (epoch µs, each file's clock offset corrected)."""

    year: int
    notes: list[str]
    sample_frames: list[pl.DataFrame | pl.LazyFrame] = field(default_factory=list)  # the evidence's samples, a
    # frame a file (those of a file spilled on disk: scanned)
    lows: list[int] = field(default_factory=list)  # each frame's first time
    log_samples: list[tuple[int, int, str, str, float]] = field(default_factory=list)  # the GPU totals that
    # logs' OOM messages state
    events: list[GatheredEvent] = field(default_factory=list)
    quarantine: list[tuple[str, int | None, str, str]] = field(default_factory=list)
    unknown: list[Path] = field(default_factory=list)  # files of no known kind: every line quarantined
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_spans: dict[tuple[int, str], list[tuple[str, int, int, int]]] = field(default_factory=dict)  # each GPU
    # index's device samples of a source, a file at a time: (file, its frame in sample_frames, first, last µs)
    versions: list[str] = field(default_factory=list)
    ranges: list[tuple[str, str]] = field(default_factory=list)
    metric_ranges: list[tuple[str, str]] = field(default_factory=list)  # the releases each scrape's names allow
    engines: list[str] = field(default_factory=list)
    configs: list[engine_config.EngineConfig] = field(default_factory=list)  # what the logs state (what the
    # server parsed: it comes first)
    logs: list[_LogFacts] = field(default_factory=list)  # stats and request facts of logs, never Python objects
    # Logs captured twice over (kubectl logs saved at 10:00 and again at 10:30) repeat lines: a fact with a
    # logged time seen in an earlier log is the same fact, read once (request ids are merged likewise), unless
    # that log is another replica's (``_log_series``' 'beside'): the logs that state each fact
    fact_seen: dict[tuple[str, str, str, str], list[str]] = field(default_factory=dict)
    stats_keys: list[pl.Series] = field(default_factory=list)
    stats_spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # each log's stats, first and last time
    stats_series: dict[str, str] = field(default_factory=dict)  # each log's stats series, of those that have stats
    col_span: list[tuple[int, int]] = field(default_factory=list)
    request_frames: list[pl.DataFrame] = field(default_factory=list)  # benchmark harnesses' requests (epoch µs)

    def t0(self) -> int | None:
        """The bundle's start: the first time of anything gathered."""
        all_t = self.lows + [t for t, *_ in self.log_samples]
        all_t += [t for e in self.events if (t := e["t"]) is not None]
        all_t += [lo for lo, _ in self.col_span]
        return min(all_t) if all_t else None


def _gather(g: _Gathered, f: FileRead, opts: RecordOptions) -> None:
    rep = f.report
    off = opts.clock_offset_us(f.path)
    rep.clock_offset_us = off
    if off:
        rep.notes.append(f"clock offset {off / 1e6:+.3f} s corrected (--clock-offset)")
    if f.log is not None:
        _gather_log(g, f.path, f.log, rep, off, opts)
    elif f.parsed is not None:
        _gather_parsed(g, f.path, f.parsed, f.sample_frame(), rep, off)
    elif rep.kind == "unknown":
        rep.quarantined = rep.lines
        g.unknown.append(f.path)


def _log_notes(g: _Gathered, path: Path, lp: LogParse, rep: FileReport, opts: RecordOptions) -> None:
    """What a log's reading says of it: counts, versions, engines, envelopes, Ray's folding."""
    rep.lines, rep.parsed, rep.quarantined = lp.lines_read, lp.lines_parsed + lp.continuation_lines, len(lp.quarantine)
    if lp.version:
        g.versions.append(lp.version)
    if lp.version_range:
        g.ranges.append(lp.version_range)
    if lp.version_conflict:
        rep.notes.append(_contradiction(lp.version_conflict[0], lp.version_conflict[1], "its", "in one file"))
    if lp.engine:
        g.engines.append(lp.engine)
    if lp.envelope_dump:
        env_s, own_s = lp.envelope_dump
        rep.notes.append(f"the times in front of its lines span {env_s:.1f} s where vLLM's own times on the same "
                         f"lines span {own_s:.0f} s (its first lines): they are when the log was copied out (a CI "
                         "job's print of a log file, a shipper's batch), not when its lines were written, so its "
                         "lines are placed at vLLM's own times (a line without one has none)"
                         + (f" (UTC{opts.tz_offset_s / 3600:+g} h, from --tz)" if opts.tz_offset_s else " (as UTC; "
                            "--tz if vLLM's clock was another zone's)") + ", the year from the envelopes")
    if lp.ray_folded:
        rep.notes.append(f"Ray folded {lp.ray_folded} lines into '[repeated Nx across cluster]' summaries: a "
                         "summary's facts are kept once, with 'repeated' in their events; the folded lines' "
                         "own numbers are lost (RAY_DEDUP_LOGS=0 keeps every line)")
    for no, reason, raw in lp.quarantine:
        g.quarantine.append((str(path), no, reason, raw))


def _gather_log(g: _Gathered, path: Path, read: LogRead, rep: FileReport, off: int, opts: RecordOptions) -> None:
    lp, ff = read.parse, read.facts
    _log_notes(g, path, lp, rep, opts)
    turns = year_turns(_year_probes(lp, ff))
    if turns:
        rep.notes.append(f"the log runs into a new year (its dates turn back to January): lines from "
                         f"{path.name}:{next(ln for ln, st in turns if st >= 12)} on are dated {g.year + 1} or later")
    log = _LogFacts(path.name, ff, functools.partial(_timed, year=g.year, tz_offset_s=opts.tz_offset_s,
                                                     clock_offset_us=off, turns=turns),
                    pl.concat(g.stats_keys) if g.stats_keys else pl.Series("h", [], dtype=pl.UInt64))
    log.access = read.access
    stats_repeated, beside = _log_series(g, log, rep)
    also_in = _log_events(g, path, lp, turns, off, opts, beside)
    g.logs.append(log)
    repeated = stats_repeated + sum(also_in.values())
    if repeated:
        rep.notes.append(f"{repeated} facts ({stats_repeated} stats lines) also in "
                         f"{', '.join(also_in) or 'an earlier log'}, with the same "
                         "process, time and text: counted once, as for an overlapping capture of one log")
    _log_span(g, path, log, lp, rep, turns, off, opts)


def _log_series(g: _Gathered, log: _LogFacts, rep: FileReport) -> tuple[int, set[str]]:
    """The series of a log's stats (its own where they run alongside an earlier log's, or follow one whose
    name it is no rotation of: another replica or engine; what is left once an overlapping capture's
    repeats are gone); returns how many of its stats facts an earlier log holds, and the earlier logs its
    own stats run alongside (other replicas or engines: no capture of theirs)."""
    mine = log.ff.stats_keys()
    stats_repeated = int(mine.is_in(log.earlier.implode()).sum()) if log.earlier.len() else 0
    own = log.timed(log.ff.stats_frame(drop=log.earlier)).select(lo=pl.col("t").min(), hi=pl.col("t").max()).collect()
    lo, hi = own["lo"][0], own["hi"][0]
    beside = [name for name, (a, b) in g.stats_spans.items() if lo is not None and lo < b and a < hi]
    turn = [series for name, series in g.stats_series.items()  # (its own server's earlier logs, not beside it)
            if rotation_stem(name) == rotation_stem(log.name) and not any(g.stats_series[n] == series for n in beside)]
    others = [name for name in g.stats_series if rotation_stem(name) != rotation_stem(log.name)]
    if turn:
        log.series = turn[-1]
    elif beside:
        log.series = f"vllm-log[{log.name}]"
        rep.notes.append(f"its stats run alongside those of {', '.join(beside)}: another replica or engine, so "
                         f"they are a series of their own ({log.series})")
    elif lo is not None and others:
        log.series = f"vllm-log[{log.name}]"
        rep.notes.append(f"its stats follow those of {', '.join(others)} without overlap, but its name is no rotation "
                         f"of theirs: another replica, so they are a series of their own ({log.series})")
    if lo is not None:
        g.stats_spans[log.name] = (lo, hi)
        g.stats_series[log.name] = log.series
    g.stats_keys.append(mine)
    return stats_repeated, set(beside)


def _log_events(g: _Gathered, path: Path, lp: LogParse, turns: list[tuple[int, int]], off: int,
                opts: RecordOptions, apart: set[str]) -> dict[str, int]:
    """A log's facts -> events (engine configurations and the GPU totals of OOM messages apart); returns
    the facts repeated from an earlier log, by its name. A fact is a repeat of one in an earlier log that
    is not among ``apart`` (other replicas': two replicas' unprefixed OOM lines alike, in one second, are
    two OOMs)."""
    also_in: dict[str, int] = {}
    for f in lp.facts:
        if f.key_ts is not None:  # (two logs of one name in two folders are two logs)
            stated = g.fact_seen.setdefault((f.rank, f.key_ts, f.kind, f.text), [])
            first = next((p for p in stated if p != str(path) and Path(p).name not in apart), None)
            if str(path) not in stated:
                stated.append(str(path))
            if first is not None:
                also_in[Path(first).name] = also_in.get(Path(first).name, 0) + 1
                continue
        t = fact_time_us(f.ts, g.year + _year_at(turns, f.line, f.ts), opts.tz_offset_s)
        t = None if t is None else t - off
        if f.kind == "engine_config":  # (kept in bundle.json's engine arguments, each with its line)
            settings = engine_config.settings_of(f.data["settings"], f"{path.name}:{f.line}")
            g.configs.append(engine_config.EngineConfig(settings=settings))
            continue
        g.events.append(log_event(f, t, path.name))
        if f.kind == "oom" and t is not None and f.data.get("gpu_total_bytes") and f.data.get("gpu") is not None:
            gpu = int(f.data["gpu"])
            g.log_samples.append((t, gpu, "vllm-log", "oom_gpu_total_bytes", float(f.data["gpu_total_bytes"])))
    return also_in


def _log_span(g: _Gathered, path: Path, log: _LogFacts, lp: LogParse, rep: FileReport, turns: list[tuple[int, int]],
              off: int, opts: RecordOptions) -> None:
    """A log's first and last time: of its facts, its columns and its first and last timed lines."""
    span = _columns_span(log, bool(turns))
    if span is not None:
        g.col_span.append(span)
    times = [t for e in g.events if (t := e["t"]) and str(e["source"]).split(":")[0] == path.name]
    times += list(span or ())
    for line, ts in lp.timed_ends:  # (its first and last timed lines, facts or not)
        t = fact_time_us(ts, g.year + _year_at(turns, line, ts), opts.tz_offset_s)
        if t is not None:
            times.append(t - off)
    if times:
        rep.t_first_us, rep.t_last_us = min(times), max(times)


def _columns_span(log: _LogFacts, turns: bool) -> tuple[int, int] | None:
    """The first and last time of a log's columnar facts. Within a year, 'MM-DD HH:MM:SS' sorts as time
    does: only the least and the greatest are timed (timing each of a fleet's day's request facts took
    1.8 s), unless the log turns to a new year or a time is of another shape or none."""
    frame = pl.concat([f.select("line", "ts", "t_exact") for f in (log.ff.stats_frame(), log.ff.requests_frame())])
    if not turns:
        lo, hi, shortest, longest, x_lo, x_hi = _time_ends(log.ff, frame)
        if shortest is None or shortest == longest == len("MM-DD HH:MM:SS"):
            t = log.timed(pl.LazyFrame({"ts": [lo, hi, None, None], "t_exact": [None, None, x_lo, x_hi]},
                                       schema={"ts": pl.Utf8, "t_exact": pl.Int64})).collect()["t"]
            if t[:2].null_count() == (lo is None) * 2:  # (else a time of its shape that is none: all are timed)
                return None if t.null_count() == 4 else (cast(int, t.min()), cast(int, t.max()))
    span = log.timed(frame).select(lo=pl.col("t").min(), hi=pl.col("t").max()).collect()
    return None if span["lo"][0] is None else (int(span["lo"][0]), int(span["hi"][0]))


def _time_ends(ff: FastFacts, facts: pl.LazyFrame) -> fastlog.TimeEnds:
    """``fastlog.time_ends`` of a log's stats and request facts (``facts``): the request files' as their
    reader told them, where it told every one (a fleet's day's 55M request facts read for them took 0.9 s)."""
    told = [ff.request_times.get(f) for f in ff.requests]
    if not told or any(t is None for t in told):
        return fastlog.time_ends(facts)
    return fastlog.joined_ends([fastlog.time_ends(ff.stats_frame()), *cast(list[fastlog.TimeEnds], told)])


def _gather_parsed(g: _Gathered, path: Path, r: common.Parsed, frame: pl.LazyFrame, rep: FileReport,
                   off: int) -> None:
    elsewhere = _another_machine(g.gpus, r.gpus) or _beside_same_index(g, path, frame)
    if elsewhere:  # (its GPUs stay out of bundle.json's, its samples are a series of their own)
        frame = _own_series(frame, path.name)
        r.gpus = {}
        rep.notes.append(f"{path.name}: another machine's GPUs ({elsewhere}): its samples are series of their "
                         f"own (source '…[{path.name}]'), not those of the GPUs the files before it describe")
    rep.lines, rep.parsed, rep.quarantined = r.lines, r.parsed, len(r.quarantine)
    for no, reason, raw in r.quarantine:
        g.quarantine.append((str(path), no, reason, raw))
    frame = frame.with_columns(pl.col("t_us") - off) if off else frame
    g.sample_frames.append(frame)  # (lazy: a spilled file's samples stay on disk until written)
    r.frames = []  # (held once: the list lets them go as they are written)
    for pe in r.events:
        t = pe.get("t")
        g.events.append({"t": None if t is None else t - off, "kind": pe["kind"], "data": pe["data"],
                         "source": f"{path.name}:{pe['line']}" if pe.get("line") else path.name, "rank": None})
    for gi, info in r.gpus.items():
        have = g.gpus.setdefault(gi, {"index": gi})
        pods = {k: sorted({*have.get(k, []), *info.get(k, [])}) for k in ("pods", "shared_by")}  # (every file's)
        have.update(info)
        have.update({k: v for k, v in pods.items() if v})
    g.notes += r.notes
    if r.vllm_names and (span := releases_exposing_all(r.vllm_names)):
        g.metric_ranges.append(span)
    # (its own samples and events: those of every file so far, told apart by name, were read for
    # each file, and two files of one name in two folders took each other's times)
    times = [t - off for pe in r.events if (t := pe.get("t")) is not None]
    lo, hi = _t_span(frame)
    g.lows += [lo] if lo is not None else []
    times += [x for x in (lo, hi) if x is not None]
    if times:
        rep.t_first_us, rep.t_last_us = min(times), max(times)
    _gather_requests(g, path, r, rep, off)


def _own_series(frame: pl.LazyFrame, name: str) -> pl.LazyFrame:
    """``frame`` with its device sources tagged with the file's ``name`` (a MIG instance's too:
    'nvidia-smi[GPU_I_ID=3][smi-b.txt]'; under its own name it was one series with this machine's
    instance of that id). The names are looked up row by row, so that a slice of the frame reads only
    its rows: a test on the column's distinct names in the query made each of ``_slices``' reads
    tag every row of the file (a node's day of nvidia-smi read six times over, ~150 MiB each)."""
    tagged = {s: f"{s}[{name}]" for s in sample_names(frame) if is_device_source(s)}
    return frame.with_columns(pl.col("source").cast(pl.Utf8).replace(tagged)) if tagged else frame


def _place_relative(g: _Gathered, files: list[FileRead]) -> None:
    """Samples at times relative to their run's start that no --at placed (``timecol``): at the earliest
    absolute time of the other evidence, and said so; where there is none, quarantined with their count."""
    dated = [(r.t_first_us, Path(r.path).name) for f in files if (r := f.report).t_first_us is not None]
    for f in files:
        u = f.parsed.unplaced if f.parsed is not None else None
        if u is None:
            continue
        rep = f.report
        if not dated:
            g.notes.append(timecol.unplaced_note(f.path, u))
            g.quarantine.append((str(f.path), None, timecol.unplaced_reason(u), ""))
            rep.quarantined += 1
            continue
        start, name = min(dated)
        frame = u.placed(start)
        g.sample_frames.append(frame)
        lo, hi = _t_span(frame)
        g.lows += [lo] if lo is not None else []
        rep.t_first_us, rep.t_last_us = lo, hi
        g.notes.append(timecol.placed_note(f.path, u, start, f"the earliest time of the other evidence, {name}'s"))


_TIMES = ("arrival_us", "first_token_us", "finish_us")


def _gather_requests(g: _Gathered, path: Path, r: common.Parsed, rep: FileReport, off: int) -> None:
    """A benchmark harness's requests (``Parsed.requests``) as rows, on the clock of the rest, their
    times in the file's span."""
    if not r.requests:
        return
    df = request_rows(path.name, r.requests).with_columns(pl.col(c) - off for c in _TIMES)
    r.requests = []
    g.request_frames.append(df)
    lo, hi = df.select(lo=pl.min_horizontal(pl.col(_TIMES).min()), hi=pl.max_horizontal(pl.col(_TIMES).max())).row(0)
    if lo is not None:
        g.lows.append(lo)
        rep.t_first_us = lo if rep.t_first_us is None else min(rep.t_first_us, lo)
        rep.t_last_us = hi if rep.t_last_us is None else max(rep.t_last_us, hi)


def _access_beside_harness(g: _Gathered, notes: list[str]) -> None:
    """Where a benchmark harness's requests are at least as many as the inference calls of the logs'
    access lines, those calls are the harness's, seen by the server without their lengths: they are
    not made requests again (each request once), and a note says so; where they are more, both stay."""
    calls = sum(len(log.access or []) for log in g.logs)
    harness = sum(df.height for df in g.request_frames)
    if not calls or not harness:
        return
    if calls > harness:
        notes.append(f"{calls} inference calls in uvicorn's access lines beside {harness} requests of benchmark "
                     "harnesses: both kept (other clients' calls among them; some may be the harness's again)")
        return
    for log in g.logs:
        log.access = None
    notes.append(f"{calls} inference calls in uvicorn's access lines are not made requests: the benchmark "
                 f"harnesses' {harness} requests stand for them (the same calls, seen by the client, with their "
                 "lengths and times)")


# --- bundle metadata ---------------------------------------------------------------------------------
def _version_inferred(g: _Gathered) -> str | None:
    """The vLLM versions the logs' formats allow, together, narrowed by the metric names the scrapes
    show (None where they never coexisted: noted)."""
    if not g.ranges and not g.metric_ranges:
        return None
    lo, hi = _within(g.ranges) if g.ranges else ("0.0.0", "99.0.0")
    if version_key(lo) > version_key(hi):  # (formats of versions that never coexisted)
        g.notes.append(_contradiction(lo, hi, "the logs'", "together"))
        return None
    if g.metric_ranges:
        mlo, mhi = _within(g.metric_ranges)
        both = _within([(lo, hi), (mlo, mhi)])
        if version_key(both[0]) > version_key(both[1]):
            g.notes.append(f"the scrapes' vLLM metric names are of vLLM {mlo}..{mhi}, by the version catalogue, "
                           + (f"the logs' line formats of {lo}..{hi}: not one server's evidence, or a build of its own; "
                              "the logs' range is kept" if g.ranges else "but not all of one release"))
        else:
            lo, hi = both
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def _within(ranges: list[tuple[str, str]]) -> tuple[str, str]:
    """The versions every one of ``ranges`` holds (lo > hi where they do not meet)."""
    return max((a for a, _ in ranges), key=version_key), min((b for _, b in ranges), key=version_key)


def _gpu_totals(g: _Gathered) -> None:
    """The GPU totals that logs state (an OOM message's, the memory budget's), where no file gave one."""
    for ge in g.events:
        if ge["kind"] == "oom" and ge["data"].get("gpu_total_bytes") and ge["data"].get("gpu") is not None:
            gpu = g.gpus.setdefault(int(ge["data"]["gpu"]), {"index": int(ge["data"]["gpu"])})
            gpu.setdefault("total_bytes", ge["data"]["gpu_total_bytes"])
        if ge["kind"] in ("memory_budget", "memory_profile") and ge["data"].get("total_gpu_gib"):
            gpu = g.gpus.setdefault(0, {"index": 0})
            gpu.setdefault("total_bytes", int(ge["data"]["total_gpu_gib"] * GiB))


def _bundle_meta(g: _Gathered, files: list[FileRead], launches: list[engine_config.EngineConfig], t0: int | None,
                 opts: RecordOptions) -> BundleMeta:
    t0_utc = datetime.fromtimestamp(t0 / 1e6, tz=timezone.utc).isoformat().replace("+00:00", "Z") if t0 is not None else None
    version = g.versions[0] if g.versions else None
    inferred = _version_inferred(g)
    g.notes += version_notes(version, inferred)
    engine = max(set(g.engines), key=g.engines.count) if g.engines else None
    _gpu_totals(g)
    meta = BundleMeta(kind="production", t0_utc=t0_utc, vllm_version=version, vllm_version_inferred=inferred,
                      engine=engine, gpus=[g.gpus[k] for k in sorted(g.gpus)], keep_prompts=opts.keep_prompts,
                      notes=merge_file_notes([n for n in g.notes if n], {f.path.name for f in files}))
    _keep_config(meta, g.configs + launches, g.events)
    # (a log states it as a number, a scrape's vllm:cache_config_info as a label's text: '0.92')
    util = next((u for e in g.events if (u := fraction(e["data"].get("gpu_memory_utilization"))) is not None), None)
    if util is not None:
        meta.engine_args.setdefault("gpu_memory_utilization", util)
    meta.inputs = [{"path": r.path, "kind": r.kind, "sha256": r.sha256, "lines_read": r.lines,
                    "parsed": r.parsed, "quarantined": r.quarantined, "notes": r.notes,
                    "clock_offset_us": r.clock_offset_us} for r in (f.report for f in files)]
    return meta


# --- write -------------------------------------------------------------------------------------------
def _write(into: Path, meta: BundleMeta, g: _Gathered, t0: int | None, opts: RecordOptions,
           spill_root: Path) -> dict[str, Any]:
    w = BundleWriter(into, meta, quarantine_text=opts.keep_prompts or opts.keep_quarantine_text)
    ids = _EngineIds()
    with background_removal() as remove, ThreadPoolExecutor(1, thread_name_prefix="samples") as beside:
        # (the samples written and merged beside the request join, which keeps ~1.7 of 2 cores busy: a fleet's
        # day's record 2-4 s sooner in 2 of 3 runs taken in turns, 1.1 s later in the third; its peak as low)
        stop = threading.Event()
        samples = beside.submit(_write_samples, w, g, t0 or 0, remove, stop)
        try:
            if any(log.ff.requests for log in g.logs):  # (the joined rows encoded as they come)
                joined = request_join.requests_from_logs(g.logs, t0 or 0, opts.keep_prompts, spill_root, remove, opts.stage)
                with contextlib.closing(joined) as rows:  # (its spill removed here, whatever befalls)
                    w.requests_stream(ids.seen_in(rows), request_join.request_extras(opts.keep_prompts))
        except BaseException:
            stop.set()  # (the samples' thread ends at its next step; the pool's end waits for it)
            raise
        untimed = samples.result()
        remove(spill_root)
        for df in ids.seen_in(g.request_frames):  # (a harness's)
            w.requests_frame(df.with_columns(pl.col(c) - (t0 or 0) for c in _TIMES))
        _access_beside_harness(g, meta.notes)
        _write_events(w, g, t0)
        if untimed:
            meta.notes.append(f"{untimed} samples had no time and are not on the timeline")
        if opts.stage is not None:
            opts.stage("writing the bundle")
        w.close(remove)
    _requests_after(into, meta, w, g, t0, opts, ids.suffixed)
    return {"t0_utc": meta.t0_utc, "samples": w.counts["samples"], "events": w.counts["events"],
            "requests": _rows(into / "requests.parquet"), "quarantined": w.counts["quarantined"], "notes": meta.notes}


def _write_samples(w: BundleWriter, g: _Gathered, t0: int, remove: Callable[[Path], None], stop: threading.Event) -> int:
    """Every sample gathered and every log's stats written to the bundle, and merged in time order; how
    many had no time. Once ``stop`` is set (the bundle will not be), nothing more is written."""
    untimed = 0
    for df in _batches(g.sample_frames, SAMPLES_AT_ONCE):
        if stop.is_set():
            return untimed
        untimed += df["t_us"].null_count()
        w.samples_frame(df.filter(pl.col("t_us").is_not_null()).with_columns(pl.col("t_us") - t0))
    for log in g.logs:
        if stop.is_set():
            return untimed
        untimed += _write_stats(w, log, t0)
    if not stop.is_set():
        w.merge_samples(remove)
    return untimed


def _rows(path: Path) -> int:
    """A written parquet file's rows, from its metadata (0: no such file)."""
    return pl.scan_parquet(path).select(pl.len()).collect().item() if path.exists() else 0


def _write_events(w: BundleWriter, g: _Gathered, t0: int | None) -> None:
    """Events at times since t0, then quarantine: each file's lines set aside, and the whole of each
    file of no known kind."""
    for we in g.events:
        w.event(bundle_event(we, t0))
    for f, line, reason, raw in g.quarantine:
        w.quarantine(f, line, reason, raw)
    for path in g.unknown:
        for i, ln in enumerate(_text_lines(path), start=1):
            w.quarantine(str(path), i, "unrecognised file kind", ln)


@dataclass
class _EngineIds:
    """Whether any request row written holds an engine's id (the front end's with a suffix), noted as the
    rows pass on their way to the bundle: where none does, there is nothing to fold, and the written ids
    are not read back to find out (a fleet's day's 27M ids: 0.5 s)."""

    suffixed: bool = False

    def seen_in(self, frames: Iterable[pl.DataFrame]) -> Iterator[pl.DataFrame]:
        for df in frames:
            self.suffixed = self.suffixed or has_engine_ids(df)
            yield df


def _requests_after(into: Path, meta: BundleMeta, w: BundleWriter, g: _Gathered, t0: int | None,
                    opts: RecordOptions, suffixed: bool) -> None:
    """What the written requests gain: uvicorn's access lines where a log states no request, and the
    engine's ids folded into the front end's (looked for where ``suffixed``: some row written has one, or
    where rows of access lines were added)."""
    added = _requests_from_access_lines(into / "requests.parquet", g.logs, t0 or 0, opts.stage)
    if added:
        meta.notes.append(f"{sum(added.values())} requests from uvicorn's access lines of {', '.join(added)}, which "
                          "has no request lines of vLLM's own: no id, no prompt length and no time of their own (each "
                          "placed between the nearest timed lines: when its response began, not when it arrived)")
    folded = unify_bundle_requests(into / "requests.parquet") if suffixed or added else 0
    if folded:
        meta.notes.append(f"{folded} requests were logged under the engine's id (the front end's id with a suffix: "
                          "'Added request cmpl-x-0-a120baa9') as well as the front end's: one row each, under the "
                          "front end's id, the engine's kept as engine_id")
    if added or folded:
        w.write_meta()
