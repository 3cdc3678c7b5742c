"""``replay record``: recognise each evidence file by content, parse it, align all sources on one UTC
timeline and write the incident bundle. Nothing is dropped: unparsed lines go to quarantine. A file
given twice is read once; logs that overlap (the same log saved at two times) give each fact once,
as one log would, and say so in their notes."""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from replay.atomic import written_in_place
from replay.bundle import (
    REQUESTS_SCHEMA,
    SAMPLES_SCHEMA,
    BundleMeta,
    BundleWriter,
    bundle_sha256,
    bundle_written,
    device_source,
)
from replay.errors import ReplayError
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
from replay.parallel import background_removal, ordered_map
from replay.record import (
    access_log,
    common,
    dcgm,
    engine_config,
    fastlog,
    fastsmi,
    gpustat,
    k8s,
    kernel,
    nvidia_smi,
    prometheus,
)
from replay.record.bundle_input import is_bundle, parse_bundle
from replay.record.exports import convert, export_kind, renumber
from replay.record.fastlog import FastFacts, buckets_for, parse_log_file, text_pieces
from replay.record.request_ids import unify_bundle_requests
from replay.record.vllm_log import ANSI, LogParse, fact_time_us, physical_lines
from replay.units import GiB, fraction, is_uint
from replay.versioning import version_key

KINDS = ("vllm-log", "prometheus-text", "prometheus-query-range", "victoriametrics-export", "grafana-csv", "grafana-json", "nvidia-smi",
         "nvidia-smi-table", "nvidia-smi-q", "nvidia-smi-dmon", "dcgmi-dmon", "k8s", "k8s-describe", "k8s-table",
         "kernel-log", "log-export", "gpustat", "dcgm-counters")

# Log facts that become samples (metric, scale) or events.
STATS_SAMPLES = (("kv_usage_pct", "kv_usage_ratio", 0.01), ("running", "requests_running", 1.0),
                  ("waiting", "requests_waiting", 1.0), ("swapped", "requests_swapped", 1.0),
                  ("preemptions", "preemptions_total", 1.0))


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
    logged = (pl.lit(f"{year}-") + pl.col("ts")).str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us", strict=False)
    return lf.with_columns(t=pl.coalesce(pl.col("t_exact"), logged.dt.epoch("us") - tz_offset_s * 1_000_000) - clock_offset_us)


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


def _requests_from_logs(logs: list[_LogFacts], t0: int, keep_prompts: bool, sink: Callable[[pl.DataFrame], None],
                        spill: Path, remove: Callable[[Path], None], stage: Callable[[str], None] | None = None) -> None:
    """One row per request id seen in the logs: arrival (received/added), finish, abort, and the
    memory-relevant parameters of its 'Received request' line. The prompt itself is kept only with
    --keep-prompts; otherwise its length and sha256 (of the prompt as logged) stand in for it. A
    request whose arrival is not in the log (it was in flight when the log starts) still has a row,
    with its finish and no arrival. An id in several logs (captures that overlap) is one request, its
    first arrival that of the first log that has one.

    Memory stays bounded however long the log: the request facts are split into buckets by a 64-bit
    hash of the id, and each bucket (at most BUCKET_FACTS facts) is joined on its own and handed to
    ``sink`` before the next is read. Within a bucket rows are in log order; across buckets in bucket
    order. The split reads the spilled facts a group of pieces at a time (a streaming query over all
    of them measured twice the memory). The spilled request facts are handed to ``remove`` as soon as
    they are read for the last time."""
    owner = {f: i for i, log in enumerate(logs) for f in log.ff.requests}  # (slow_requests are among them)
    names = [log.name for log in logs]

    def facts_of(files: list[Path]) -> pl.LazyFrame:
        frames = [  # (a fact's place: its log, then its line)
            logs[owner[f]].timed(logs[owner[f]].ff.requests_frame([f])).select(
                "request_id", "rh", "kind", "t", *fastlog.REQUEST_DETAILS,
                line=pl.col("line") + (owner[f] << POS_SHIFT)).rename({"rh": "h"})
            for f in files]
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.LazyFrame(schema={
            "request_id": pl.Utf8, "h": pl.UInt64, "kind": fastlog.REQUEST_KINDS, "t": pl.Int64, **fastlog.REQUEST_DETAILS,
            "line": pl.Int64})

    kind = pl.col("kind")
    every = [f for log in logs for f in log.ff.requests]
    if not every:
        return
    aborted = facts_of([f for log in logs for f in log.ff.slow_requests]).filter(kind == "request_aborted").select(
        h=pl.col("request_id").str.split(",").list.eval(pl.element().str.strip_chars().hash(seed=fastlog.ID_SEED))
    ).explode("h").unique().collect()["h"]  # ('Aborted request(s) a, b, c': few)
    sizes = [int(pl.scan_ipc(f).select(pl.len()).collect().item()) for f in every]  # from the files' footers
    n_facts = sum(sizes)
    nb = buckets_for(n_facts)
    if stage is not None:
        stage(f"joining {n_facts:,} request lines" + (f" in {nb} parts" if nb > 1 else ""))
    if nb == 1:
        sink(_request_bucket(facts_of(every).filter(kind != "request_aborted"), aborted, names, t0, keep_prompts))
        return
    groups: list[list[Path]] = [[]]
    held = 0
    for f, n in zip(every, sizes, strict=True):
        if held + n > fastlog.BUCKET_FACTS and groups[-1]:
            groups.append([])
            held = 0
        groups[-1].append(f)
        held += n
    def split(g: int) -> None:
        facts = facts_of(groups[g]).filter(kind != "request_aborted").collect()
        for f in groups[g]:
            remove(f)
        # (fast-lane facts have no details: their null columns cost a fifth of the join below)
        facts = facts.drop([c for c in fastlog.REQUEST_DETAILS if facts[c].null_count() == facts.height])
        df = _partials(facts).with_columns(bucket=pl.col("h") % nb)
        for (b,), part in df.partition_by("bucket", as_dict=True, include_key=False).items():
            part.write_ipc_stream(Path(tmp) / f"b{b:05d}.g{g:05d}.arrows")  # (an IPC stream: a third cheaper
            # to write than an IPC file, half as costly to read back whole)

    def bucket(b: int) -> pl.DataFrame | None:
        files = sorted(Path(tmp).glob(f"b{b:05d}.*"))
        if not files:
            return None
        partials = pl.concat([pl.read_ipc_stream(f) for f in files], how="diagonal_relaxed")
        for f in files:
            remove(f)
        partials = partials.with_columns(**{c: pl.lit(None, dtype=t) for c, t in fastlog.REQUEST_DETAILS.items()
                                            if c not in partials.columns})
        return _request_rows(_merge(partials), aborted, names, t0, keep_prompts)

    # two groups, then two buckets, side by side (eager polars work is mostly single-threaded)
    spill.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=spill, prefix="requests-")
    try:
        for _ in ordered_map(split, range(len(groups)), workers=2, ahead=2):
            pass
        for b, out in enumerate(ordered_map(bucket, range(nb), workers=2, ahead=2)):  # two buckets in the works at most
            if out is not None:
                sink(out)
            if stage is not None:
                stage(f"joining {n_facts:,} request lines: part {b + 1} of {nb} done")
    finally:
        remove(Path(tmp))


POS_SHIFT = 40  # a request fact's place in the logs: the log's index above its line number


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


def _keep_config(meta: BundleMeta, configs: list[engine_config.EngineConfig], events: list[dict[str, Any]]) -> None:
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


def _request_bucket(facts: pl.LazyFrame, aborted: pl.Series, names: list[str], t0: int, keep_prompts: bool) -> pl.DataFrame:
    """The requests.parquet rows of one bucket of request facts (all facts of its ids)."""
    return _request_rows(_partials(facts.collect()), aborted, names, t0, keep_prompts)


def _partials(facts: pl.DataFrame) -> pl.DataFrame:
    """One row per request id (by its hash ``h``) of some of its facts: the first arrival (time, line,
    id and the details its line gave, of those among ``facts``' columns) and the finishes (earliest
    time, first line). A request's facts mostly fall in one group of pieces, so a group's rows are half
    as many as its facts; rows of the same id from other groups are joined by ``_merge``."""
    kind = pl.col("kind")  # (in no particular order: ``_request_rows`` sorts; an id's facts share their id)
    details = [c for c in fastlog.REQUEST_DETAILS if c in facts.columns]
    # (a request's details may come on several lines: V1 at DEBUG states its token ids on 'Request … details:'
    # and its SamplingParams on the 'Received request' line after it; each detail is its first stated value)
    arrivals = facts.filter(kind != "request_finished").sort("line").group_by("h").agg(
        id=pl.col("request_id").first(), arrival_t=pl.col("t").first(), line=pl.col("line").first(),
        **{c: pl.col(c).drop_nulls().first() for c in details})
    finished = facts.filter(kind == "request_finished").group_by("h").agg(
        finish_t=pl.col("t").min(), fid=pl.col("request_id").first(), fline=pl.col("line").min())
    return arrivals.join(finished, on="h", how="full", coalesce=True).with_columns(id=pl.coalesce("id", "fid")).drop("fid")


def _merge(partials: pl.DataFrame) -> pl.DataFrame:
    """Partial rows (``_partials``) of the same id as one: its first arrival, earliest finish, first
    finish line."""
    dup = partials["h"].is_duplicated()
    if not dup.any():
        return partials
    many = partials.filter(dup)
    arrivals = many.filter(pl.col("line").is_not_null()).sort("line").group_by("h").agg(
        pl.col("id", "arrival_t", "line").first(),
        *(pl.col(c).drop_nulls().first() for c in many.columns if c not in ("h", "id", "arrival_t", "line", "finish_t", "fline")))
    finished = many.filter(pl.col("fline").is_not_null()).group_by("h").agg(
        finish_t=pl.col("finish_t").min(), fid=pl.col("id").first(), fline=pl.col("fline").min())
    merged = arrivals.join(finished, on="h", how="full", coalesce=True).with_columns(id=pl.coalesce("id", "fid"))
    return pl.concat([partials.filter(~dup), merged.select(partials.columns)])


def _request_rows(partials: pl.DataFrame, aborted: pl.Series, names: list[str], t0: int, keep_prompts: bool) -> pl.DataFrame:
    """requests.parquet rows, one per partial row of distinct ids: requests in the order of their first
    arrival, then those with only a finish in the order of their first finish; ``names`` are the logs'."""
    pos = pl.coalesce("line", "fline")
    out = partials.sort(["line", "fline"], nulls_last=True).select(
        "id", arrival_us=pl.col("arrival_t") - t0, **{c: c for c in fastlog.REQUEST_DETAILS},
        finish_us=pl.col("finish_t") - t0,
        source=pl.concat_str((pos // (1 << POS_SHIFT)).replace_strict(range(len(names)), names, return_dtype=pl.Utf8),
                             pl.lit(":"), (pos % (1 << POS_SHIFT)).cast(pl.Utf8)),
        status=pl.when(pl.col("finish_t").is_not_null()).then(pl.lit("ok"))
        .when(pl.col("h").is_in(aborted.implode())).then(pl.lit("aborted")).otherwise(pl.lit("unknown")))
    return out if keep_prompts else out.drop("prompt")


def _fits_columns(head: str, columns: str | None) -> str | None:
    """'nvidia-smi' for rows that nothing else recognises and that have as many fields as the column
    list given for headerless nvidia-smi CSV (a query without timestamps has nothing else to tell it by)."""
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    return "nvidia-smi" if columns and first.count(",") == columns.count(",") else None


NEWEST_KNOWN = (0, 33)  # the newest vLLM whose log formats the recorder was built from


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


SAMPLES_AT_ONCE = 1 << 20  # the evidence's samples are written in frames of about this many


def _scrape_named_at(kind: str | None, path: Path, head: str, opts: RecordOptions) -> int | None:
    """When a Prometheus scrape was taken, where only its name says so (None otherwise). Files of the
    same bytes named at different times are scrapes of their own, not one file given twice: an idle
    server's /metrics reads the same scrape after scrape."""
    if kind != "prometheus-text" or opts.at:
        return None
    t, how = common.scrape_time(path, head, None, opts.tz_offset_s)
    return t if how == "file name" else None


def _t_span(frame: pl.DataFrame) -> tuple[int | None, int | None]:
    """The first and last time of a samples frame (None where it has none)."""
    lo, hi = frame.select(pl.col("t_us").min().alias("lo"), pl.col("t_us").max().alias("hi")).row(0)
    return lo, hi


def _batches(frames: list[pl.DataFrame], rows: int) -> Iterator[pl.DataFrame]:
    """``frames`` joined into frames of ``rows`` or more (the last may hold fewer), each frame emptied
    from the list as it is joined: a part file a scrape made thousands of files."""
    held: list[pl.DataFrame] = []
    n = 0
    frames.reverse()
    while frames:
        held.append(frames.pop())
        n += held[-1].height
        if n >= rows or not frames:
            yield pl.concat(held)
            held, n = [], 0


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


def _json(path: Path, text: str) -> Any:
    """A JSON file's value, or an error naming its line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ReplayError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


# a line as vLLM's logger writes it, at any level: '(process) LEVEL MM-DD HH:MM:SS [file.py:N] '
_VLLM_LINE = re.compile(fastlog.STRICT_ANY, re.M)


def detect_kind(text: str) -> str | None:
    head = text[:20000].replace("\u00a0", " ")  # (a copy from a web page: no-break spaces for its spaces)
    s = head.lstrip()
    if s.startswith("{") and ('"resultType"' in head or re.match(r'\{\s*"status"\s*:\s*"error"', s) and '"errorType"' in head):
        return "prometheus-query-range"  # (or the API's answer to a query it refused)
    if prometheus.VM_EXPORT_LINE.match(s.split("\n", 1)[0]):
        return "victoriametrics-export"
    if export_kind(head):
        return "log-export"  # (a vLLM log as a logging service or tool exports it)
    if s.startswith(("{", "[")) and re.search(r'"fields"\s*:', head) and re.search(r'"type"\s*:\s*"time"', head):
        return "grafana-json"  # (a panel's data frames)
    if re.match(r'\{[^\n]*\b__name__\s*=\s*"', s):
        return "prometheus-text"  # (`promtool tsdb dump`: the name among the labels)
    if s.startswith(("{", "[", "---", "apiVersion", "kind:", "status:", "lastState:", "items:", "metadata:")) and (
            "containerStatuses" in head or "lastState" in head or '"Event"' in head or "kind: Event" in head
            or "involvedObject" in head or "regarding" in head or re.search(r'(?m)^kind:\s*Pod\s*$|"kind"\s*:\s*"Pod"', head)):
        return "k8s"
    if k8s.EVENTS_TABLE_HEADER.match(s) or k8s.PODS_TABLE_HEADER.match(s):
        return "k8s-table"
    if "Events:" in head and ("Reason" in head and "Message" in head) or head.startswith("Name:") or (
            k8s.DESCRIBE_TERMINATED.match(s) and "Exit Code:" in head):
        return "k8s-describe"  # (or a container's terminated state pasted alone)
    if re.match(r"#Entity\s+\w", s):
        return "dcgmi-dmon"
    fields = [ln for ln in head.splitlines()[:200] if ln.strip() and not ln.lstrip().startswith("#")][:50]
    matched = sum(1 for ln in fields if dcgm.DCGM_COUNTER_LINE.match(ln.strip()))
    if matched >= 3 and matched >= 0.8 * len(fields):
        return "dcgm-counters"  # (dcgm-exporter's -f file: which fields it exports; a stray line is quarantined)
    if re.search(r"^#\s*(?:date\s+time\s+)?gpu\b", head, re.M | re.I) and re.search(r"^#.*\bidx\b", head, re.M | re.I):
        return "nvidia-smi-dmon"  # (dmon or pmon, with -o DT or without)
    if kernel.kernel_log_head(head):
        return "kernel-log"
    if re.search(r"^\[\d+\] .*\|.*\d+ / \d+ MB", ANSI.sub("", head), re.M) or (
            '"query_time"' in head and '"gpus"' in head and '"memory.used"' in head):
        return "gpustat"  # (printed, its colours taken off, or --json)
    if "Memory-Usage" in head and "|" in head or re.search(r"^\|.*\d+MiB\s*/\s*\d+MiB\s*\|", head, re.M):
        return "nvidia-smi-table"
    if re.search(r"^\s*FB Memory Usage\s*$", head, re.M) or "<nvidia_smi_log" in head:
        return "nvidia-smi-q"  # (as text, or as XML with -x)
    first = head.splitlines()[0] if head else ""
    if ("memory.used" in first or "memory.total" in first or "used_gpu_memory" in first or
            ("NVIDIA" in first or "Tesla" in first) and " MiB" in first):
        return "nvidia-smi"
    if (first.lower().lstrip('"').startswith("time") or re.match(r'"?series"?[;,\t]"?time"?[;,\t]"?value"?\s*$', first, re.I)) \
            and ("," in first or ";" in first or "\t" in first):
        return "grafana-csv"  # (series joined by time, or series as rows)
    if any(x in head for x in ("# TYPE ", "# HELP ")) or ("DCGM_FI_" in head and "{" in head) or "vllm:" in first \
            or re.search(r"^vllm[:_.]\w+(?:\{[^}]*\})? \S+$", head, re.M):  # (a grep of /metrics has no TYPE lines)
        return "prometheus-text"
    if any(k in head for k in ("INFO ", "WARNING ", "ERROR ", "vllm", "KV cache", "CUDA out of memory",
                               "GPU blocks", "Memory profiling", "preempted", "model weights take",
                               "OutOfMemoryError", "(raylet)", "memory usage threshold")) \
            or _VLLM_LINE.search(head):  # (an excerpt of a DEBUG-level log may hold nothing else)
        return "vllm-log"
    return None


@dataclass
class RecordOptions:
    year: int | None = None
    tz_offset_s: int = 0
    at: str | None = None
    as_kind: dict[str, str] = field(default_factory=dict)
    keep_prompts: bool = False
    keep_quarantine_text: bool = False  # the text of lines quarantined (a request line's prompt, say); with keep_prompts too
    nvsmi_columns: str | None = None
    rows_interval_s: float = 1.0  # how far apart rows without times were taken (dcgmi dmon's -d)
    host: str | None = None  # the node vLLM ran on, where GPU evidence covers several
    gpu_instance: str | None = None  # the MIG instance vLLM ran in (DCGM's GPU_I_ID, or GPU:GPU_I_ID)
    metrics: list[str] = field(default_factory=list)
    clock_offsets_us: dict[str, int] = field(default_factory=dict)  # file (path or name) -> its clock ahead by
    progress: Callable[[int], None] | None = None  # called with the size of each piece of log read
    stage: Callable[[str], None] | None = None  # told what the recorder does once the evidence is read

    def clock_offset_us(self, path: Path) -> int:
        return self.clock_offsets_us.get(str(path), self.clock_offsets_us.get(path.name, 0))


def record(paths: list[Path], out: Path, opts: RecordOptions) -> tuple[list[FileReport], dict[str, Any]]:
    """Record ``paths`` into the bundle ``out``; see the module docstring. The bundle is written beside
    ``out`` and swapped in whole once complete: interrupted or failed, it leaves ``out`` as it was and
    nothing of its own behind (no spilled pieces, no half-written bundle)."""
    with bundle_written(out) as into:
        return _record(paths, out, opts, into)


def _record(paths: list[Path], out: Path, opts: RecordOptions, into: Path) -> tuple[list[FileReport], dict[str, Any]]:
    if not paths:
        raise ReplayError("no evidence files given", 2)
    parsed_items: list[tuple[Path, str, Any, FileReport]] = []
    seen_hashes: dict[str, str] = {}
    scrape_times: dict[str, set[int | None]] = {}  # the times in the names of scrapes of the same bytes
    notes: list[str] = []
    spill_root = into / ".spill"
    fingerprints: dict[tuple[int, str], list[Path]] = {}
    paths, from_folder = _expand(paths, out)
    access_found: dict[Path, list[access_log.AccessLine]] = {}  # a log's access lines, where it states no request
    launches: list[engine_config.EngineConfig] = []  # the launch configurations among the files
    configs: list[engine_config.EngineConfig] = []  # what the logs state (what the server parsed: it comes first)
    for path in paths:
        if is_bundle(path):
            bundled = parse_bundle(path)
            rep = FileReport(str(path), "bundle", sha256=bundle_sha256(path), notes=list(bundled.notes))
            rep.lines, rep.parsed = bundled.lines, bundled.parsed
            parsed_items.append((path, "bundle", bundled, rep))
            continue
        try:
            head, size = _read_text(path, 1 << 16), path.stat().st_size  # enough to recognise it
        except ReplayError as e:
            if path not in from_folder:
                raise
            rep = FileReport(str(path), "skipped",  # (not hashed: a core dump or weights file can be gigabytes)
                             notes=[f"skipped: {e.message.removeprefix(f'{path}: ')}"])
            parsed_items.append((path, "skipped", None, rep))
            continue
        kind = opts.as_kind.get(str(path)) or opts.as_kind.get("*") or detect_kind(head) \
            or _fits_columns(head, opts.nvsmi_columns)
        forced = str(path) in opts.as_kind or "*" in opts.as_kind
        launch = None if forced else engine_config.sniff(head)
        if launch is not None:  # (a command, compose file or manifest that starts vLLM; a pod's status is evidence too)
            cfg, why = _launch_config(path, launch)
            if cfg is not None:
                launches.append(cfg)
            if kind not in ("k8s", "k8s-describe"):
                rep = FileReport(str(path), "launch-config" if cfg is not None else "unknown", sha256=file_sha256(path))
                rep.lines = rep.parsed = sum(1 for _ in _text_lines(path))
                rep.notes.append(why)
                parsed_items.append((path, rep.kind, None, rep))
                if opts.progress is not None:
                    opts.progress(size)
                continue
        fp = _fingerprint(path, size)
        alike = fingerprints.setdefault(fp, [])
        # a log with no look-alike is hashed while it is parsed (one read); anything else now
        hash_later = kind in ("vllm-log", "log-export") and not alike and size > (1 << 16)
        alike.append(path)
        sha = "" if hash_later else file_sha256(path)
        rep = FileReport(str(path), kind or "unknown", sha256=sha)
        if (nuls := nul_run(path)):
            rep.notes.append(nul_run_note(path.name, nuls))
        named = _scrape_named_at(kind, path, head, opts) if sha in seen_hashes else None
        if named is not None and named not in scrape_times.setdefault(
                sha, {_scrape_named_at(kind, Path(seen_hashes[sha]), head, opts)}):
            scrape_times[sha].add(named)
            rep.notes.append(f"the same bytes as {Path(seen_hashes[sha]).name}, but its name dates it at another time: "
                             "a scrape of its own")
        elif sha and sha in seen_hashes:
            rep.kind = "duplicate"
            rep.notes.append(f"identical to {seen_hashes[sha]}; counted once")
            parsed_items.append((path, "duplicate", None, rep))
            if opts.progress is not None:
                opts.progress(size)
            continue
        if sha:
            seen_hashes[sha] = str(path)
        if not head.strip() and size < (1 << 16):
            rep.kind = "empty"
            rep.notes.append("empty file")
            parsed_items.append((path, "empty", None, rep))
            if opts.progress is not None:
                opts.progress(size)
            continue
        result: Any
        if opts.stage is not None:
            opts.stage(f"reading {path.name}")
        if kind in ("vllm-log", "log-export"):
            hasher = hashlib.sha256() if hash_later else None
            spill, log_path, progress, conv = spill_root / str(len(parsed_items)), path, opts.progress, None
            if kind == "log-export":  # its entries as log lines, then its facts at the export's lines
                which = export_kind(head) or ("aws" if head.lstrip().startswith("{") else "gcp")
                spill.mkdir(parents=True, exist_ok=True)
                log_path, progress = spill / "export.log", None
                conv = convert(path, which, log_path, opts.progress, hasher)  # (the export is hashed as it is read)
                rep.notes += conv.notes(path.name, which)
            result = parse_log_file(log_path, spill, keep_prompts=opts.keep_prompts, progress=progress,
                                    hasher=hasher if conv is None else None, request_repeats=False)
            if not _states_requests(result[1]):  # (its access lines stand in for them: read while it is at hand)
                access_found[path] = access_log.scan(_text_lines(log_path), None if conv is None else conv.lines)
            if conv is not None:
                renumber(result[0], result[1], conv)
                if result[0].container_year is None and conv.year is not None:
                    result[0].container_year = conv.year  # (the export's own dates, which have no zone)
            if hasher is not None:
                rep.sha256 = hasher.hexdigest()
                seen_hashes[rep.sha256] = str(path)
            parsed_items.append((path, kind, result, rep))
            continue
        if kind not in KINDS:  # streamed into quarantine when the bundle is written, never held whole
            rep.kind = "unknown"
            rep.lines = sum(1 for _ in _text_lines(path))
            rep.notes.append("content not recognised; whole file quarantined (use --as KIND)")
            parsed_items.append((path, "unknown", None, rep))
            if opts.progress is not None:
                opts.progress(size)
            continue
        text = _read_text(path)
        if kind == "prometheus-text":
            result = prometheus.parse_exposition(path, text, at=opts.at, tz_offset_s=opts.tz_offset_s, want=opts.metrics,
                                          host=opts.host, instance=opts.gpu_instance)
        elif kind == "prometheus-query-range":
            result = prometheus.parse_query_range(path, _json(path, text), want=opts.metrics, host=opts.host,
                                          instance=opts.gpu_instance)
        elif kind == "victoriametrics-export":
            result = prometheus.parse_vm_export(path, text, want=opts.metrics, host=opts.host, instance=opts.gpu_instance)
        elif kind == "grafana-csv":
            result = prometheus.parse_grafana_csv(path, text, opts.tz_offset_s, opts.host, opts.gpu_instance)
        elif kind == "grafana-json":
            result = prometheus.parse_grafana_frames(path, _json(path, text), opts.host, opts.gpu_instance)
        elif kind == "nvidia-smi":
            result = fastsmi.parse_nvidia_smi_csv(path, text, opts.tz_offset_s, opts.nvsmi_columns, opts.at)
        elif kind == "nvidia-smi-table":
            result = nvidia_smi.parse_nvidia_smi_table(path, text, opts.tz_offset_s, opts.at)
        elif kind == "nvidia-smi-q":
            result = (nvidia_smi.parse_nvidia_smi_xml if "<nvidia_smi_log" in text[:20000] else nvidia_smi.parse_nvidia_smi_q)(
                path, text, opts.tz_offset_s, opts.at)
        elif kind == "kernel-log":
            result = kernel.parse_kernel_log(path, text, opts.tz_offset_s, opts.year)
        elif kind == "nvidia-smi-dmon":
            result = nvidia_smi.parse_dmon(path, text, opts.tz_offset_s)
        elif kind == "gpustat":
            result = gpustat.parse_gpustat(path, text, opts.tz_offset_s)
        elif kind == "dcgm-counters":
            result = dcgm.parse_dcgm_counters(path, text)
        elif kind == "dcgmi-dmon":
            result = dcgm.parse_dcgmi_dmon(path, text, opts.at, opts.rows_interval_s, opts.tz_offset_s)
        elif kind == "k8s":
            result = k8s.parse_k8s(path, text)
        elif kind == "k8s-table":
            result = k8s.parse_kubectl_table(path, text, opts.at, opts.tz_offset_s)
        else:  # k8s-describe (a kind outside KINDS was set aside above)
            result = k8s.parse_describe(path, text, opts.at, opts.tz_offset_s)
        if isinstance(result, common.Parsed):
            _set_aside_impossible_times(result)
            result.notes += common.renamed_note(path, result.vllm_names)
            rep.kind = result.kind
            rep.notes += result.notes
        parsed_items.append((path, kind, result, rep))
        if opts.progress is not None:  # (read whole: done at once)
            opts.progress(size)

    # Year for log lines (they carry none): --year, else a dated source in the bundle, else now.
    year = opts.year
    year_note = f"log year {year} from --year" if year else None
    if year is None:
        for _, _, r, _ in parsed_items:
            if isinstance(r, tuple) and r[0].container_year:
                year = r[0].container_year
                year_note = f"log year {year} from the times a container runtime or log shipper put on its lines"
                break
    logged = any(isinstance(r, tuple) for _, _, r, _ in parsed_items)
    if year is None and logged:  # (only log lines need a year)
        dated = [t for _, _, r, _ in parsed_items if isinstance(r, common.Parsed)
                 if (t := _t_span(r.frame().filter(pl.col("t_us") != 0))[0]) is not None]
        dated += [e["t"] for _, _, r, _ in parsed_items if isinstance(r, common.Parsed) for e in r.events if e.get("t")]
        if dated:
            year = datetime.fromtimestamp(min(dated) / 1e6, tz=timezone.utc).year
            year_note = f"log year {year} taken from another dated source in the bundle"
    if year is None:
        year = datetime.now(timezone.utc).year
        year_note = f"log lines carry no year and no other source dates them: assumed {year} (set --year)"
    if logged:
        notes.append(year_note or "")

    # Collect absolute-time items, then rebase on t0.
    sample_frames: list[pl.DataFrame] = []  # the evidence's samples, a frame a file (epoch µs, offsets corrected)
    lows: list[int] = []  # each frame's first time
    log_samples: list[tuple[int, int, str, str, float]] = []  # the GPU totals that logs' OOM messages state
    events: list[dict[str, Any]] = []
    quarantine: list[tuple[str, int | None, str, str]] = []
    unknown: list[Path] = []  # files of no known kind: every line quarantined
    gpus: dict[int, dict[str, Any]] = {}
    versions: list[str] = []
    ranges: list[tuple[str, str]] = []
    engines: list[str] = []
    logs: list[_LogFacts] = []  # stats and request facts of logs, never Python objects
    # Logs captured twice over (kubectl logs saved at 10:00 and again at 10:30) repeat lines: a fact with a
    # logged time seen in an earlier log is the same fact, read once (request ids are merged likewise)
    fact_seen: dict[tuple[str, str, str, str], str] = {}
    stats_keys: list[pl.Series] = []
    stats_spans: dict[str, tuple[int, int]] = {}  # each log's stats, first and last time
    col_span: list[tuple[int, int]] = []
    for path, kind, r, rep in parsed_items:
        off = opts.clock_offset_us(path)
        rep.clock_offset_us = off
        if off:
            rep.notes.append(f"clock offset {off / 1e6:+.3f} s corrected (--clock-offset)")
        if kind in ("duplicate", "empty", "skipped", "launch-config"):
            continue
        if kind == "unknown":
            rep.quarantined = rep.lines
            unknown.append(path)
            continue
        if isinstance(r, tuple):
            lp, ff = r
            rep.lines, rep.parsed, rep.quarantined = lp.lines_read, lp.lines_parsed + lp.continuation_lines, len(lp.quarantine)
            if lp.version:
                versions.append(lp.version)
            if lp.version_range:
                ranges.append(lp.version_range)
            if lp.version_conflict:
                rep.notes.append(_contradiction(lp.version_conflict[0], lp.version_conflict[1], "its", "in one file"))
            if lp.engine:
                engines.append(lp.engine)
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
                quarantine.append((str(path), no, reason, raw))
            turns = year_turns(_year_probes(lp, ff))
            if turns:
                rep.notes.append(f"the log runs into a new year (its dates turn back to January): lines from "
                                 f"{path.name}:{next(ln for ln, st in turns if st >= 12)} on are dated {year + 1} or later")
            log = _LogFacts(path.name, ff, functools.partial(_timed, year=year, tz_offset_s=opts.tz_offset_s,
                                                             clock_offset_us=off, turns=turns),
                            pl.concat(stats_keys) if stats_keys else pl.Series("h", [], dtype=pl.UInt64))
            log.access = access_found.pop(path, None)
            mine = ff.stats_keys()
            stats_repeated = int(mine.is_in(log.earlier.implode()).sum()) if log.earlier.len() else 0
            # a log whose stats run alongside an earlier log's (what is left once an overlapping capture's
            # repeats are gone) is another replica or engine: its stats are a series of their own
            own = log.timed(ff.stats_frame(drop=log.earlier)).select(lo=pl.col("t").min(), hi=pl.col("t").max()).collect()
            lo, hi = own["lo"][0], own["hi"][0]
            beside = [name for name, (a, b) in stats_spans.items() if lo is not None and lo < b and a < hi]
            if beside:
                log.series = f"vllm-log[{path.name}]"
                rep.notes.append(f"its stats run alongside those of {', '.join(beside)}: another replica or engine, so "
                                 f"they are a series of their own ({log.series})")
            if lo is not None:
                stats_spans[path.name] = (lo, hi)
            stats_keys.append(mine)
            also_in: dict[str, int] = {}  # facts repeated from an earlier log, by its name
            for f in lp.facts:
                if f.key_ts is not None:  # (two logs of one name in two folders are two logs)
                    first = fact_seen.setdefault((f.rank, f.key_ts, f.kind, f.text), str(path))
                    if first != str(path):
                        also_in[Path(first).name] = also_in.get(Path(first).name, 0) + 1
                        continue
                t = fact_time_us(f.ts, year + _year_at(turns, f.line, f.ts), opts.tz_offset_s)
                t = None if t is None else t - off
                src = f"{path.name}:{f.line}"
                data = dict(f.data)
                if "restated_lines" in data:  # (the same OOM stated again by its rank: one OOM, stated where)
                    data["restated_at"] = [f"{path.name}:{n}" for n in data.pop("restated_lines")]
                if f.kind == "engine_config":  # (kept in bundle.json's engine arguments, each with its line)
                    configs.append(engine_config.EngineConfig(settings=engine_config.settings_of(data["settings"], src)))
                    continue
                events.append({"t": t, "kind": f.kind, "data": data, "source": src, "rank": f.rank})
                if f.kind == "oom" and t is not None and f.data.get("gpu_total_bytes") and f.data.get("gpu") is not None:
                    gpu = int(f.data["gpu"])
                    log_samples.append((t, gpu, "vllm-log", "oom_gpu_total_bytes", float(f.data["gpu_total_bytes"])))
            logs.append(log)
            repeated = stats_repeated + sum(also_in.values())
            if repeated:
                rep.notes.append(f"{repeated} facts ({stats_repeated} stats lines) also in "
                                 f"{', '.join(also_in) or 'an earlier log'}, with the same "
                                 "process, time and text: counted once, as for an overlapping capture of one log")
            span = pl.concat([log.timed(ff.stats_frame()).select("t"), log.timed(ff.requests_frame()).select("t")]).select(
                pl.col("t").min().alias("lo"), pl.col("t").max().alias("hi")).collect()
            col_lo, col_hi = span["lo"][0], span["hi"][0]
            if col_lo is not None:
                col_span.append((col_lo, col_hi))
            times = [e["t"] for e in events if e.get("t") and str(e["source"]).split(":")[0] == path.name]
            times += [x for x in (col_lo, col_hi) if x is not None]
            for line, ts in lp.timed_ends:  # (its first and last timed lines, facts or not)
                t = fact_time_us(ts, year + _year_at(turns, line, ts), opts.tz_offset_s)
                if t is not None:
                    times.append(t - off)
            if times:
                rep.t_first_us, rep.t_last_us = min(times), max(times)
            continue
        else:
            assert isinstance(r, common.Parsed)
            frame = r.frame()
            elsewhere = _another_machine(gpus, r.gpus)
            if elsewhere:  # (its GPUs stay out of bundle.json's, its samples are a series of their own)
                source = pl.col("source")  # (a MIG instance's too: 'nvidia-smi[GPU_I_ID=3][smi-b.txt]'; under its
                # own name it was one series with this machine's instance of that id)
                frame = frame.with_columns(source=pl.when(device_source(source)).then(source + f"[{path.name}]")
                                           .otherwise(source))
                r.gpus = {}
                rep.notes.append(f"{path.name}: another machine's GPUs ({elsewhere}): its samples are series of their "
                                 f"own (source '…[{path.name}]'), not those of the GPUs the files before it describe")
            rep.lines, rep.parsed, rep.quarantined = r.lines, r.parsed, len(r.quarantine)
            for no, reason, raw in r.quarantine:
                quarantine.append((str(path), no, reason, raw))
            frame = frame.with_columns(pl.col("t_us") - off) if off else frame
            sample_frames.append(frame)
            r.frames = []  # (held once: the list lets them go as they are written)
            for pe in r.events:
                events.append({"t": None if pe.get("t") is None else pe["t"] - off, "kind": pe["kind"], "data": pe["data"],
                               "source": f"{path.name}:{pe['line']}" if pe.get("line") else path.name, "rank": None})
            for gi, info in r.gpus.items():
                have = gpus.setdefault(gi, {"index": gi})
                pods = {k: sorted({*have.get(k, []), *info.get(k, [])}) for k in ("pods", "shared_by")}  # (every file's)
                have.update(info)
                have.update({k: v for k, v in pods.items() if v})
            notes += r.notes
            # (its own samples and events: those of every file so far, told apart by name, were read for
            # each file, and two files of one name in two folders took each other's times)
            times = [pe["t"] - off for pe in r.events if pe.get("t") is not None]
            lo, hi = _t_span(frame)
            lows += [lo] if lo is not None else []
            times += [x for x in (lo, hi) if x is not None]
            if times:
                rep.t_first_us, rep.t_last_us = min(times), max(times)
            del frame

    apart = far_apart([(Path(rep.path).name, rep.t_first_us, rep.t_last_us) for _, _, _, rep in parsed_items
                       if rep.t_first_us is not None and rep.t_last_us is not None])
    if apart:
        notes.append(apart)
    if log_samples:
        sample_frames.append(pl.DataFrame(log_samples, schema=SAMPLES_SCHEMA, orient="row"))
    all_t = lows + [t for t, *_ in log_samples]
    all_t += [e["t"] for e in events if e.get("t") is not None]
    all_t += [lo for lo, _ in col_span]
    t0 = min(all_t) if all_t else None
    t0_utc = datetime.fromtimestamp(t0 / 1e6, tz=timezone.utc).isoformat().replace("+00:00", "Z") if t0 is not None else None

    # Facts for bundle.json
    version = versions[0] if versions else None
    inferred = None
    if ranges:
        lo = max((a for a, _ in ranges), key=version_key)
        hi = min((b for _, b in ranges), key=version_key)
        inferred = f"{lo}" if lo == hi else f"{lo}..{hi}"
        if version_key(lo) > version_key(hi):  # (formats of versions that never coexisted)
            inferred = None
            notes.append(_contradiction(lo, hi, "the logs'", "together"))
    notes += version_notes(version, inferred)
    engine = max(set(engines), key=engines.count) if engines else None
    for ge in events:
        if ge["kind"] == "oom" and ge["data"].get("gpu_total_bytes") and ge["data"].get("gpu") is not None:
            g = gpus.setdefault(int(ge["data"]["gpu"]), {"index": int(ge["data"]["gpu"])})
            g.setdefault("total_bytes", ge["data"]["gpu_total_bytes"])
        if ge["kind"] in ("memory_budget", "memory_profile") and ge["data"].get("total_gpu_gib"):
            g = gpus.setdefault(0, {"index": 0})
            g.setdefault("total_bytes", int(ge["data"]["total_gpu_gib"] * GiB))
    meta = BundleMeta(kind="production", t0_utc=t0_utc, vllm_version=version, vllm_version_inferred=inferred,
                      engine=engine, gpus=[gpus[k] for k in sorted(gpus)], keep_prompts=opts.keep_prompts,
                      notes=merge_file_notes([n for n in notes if n], {path.name for path, *_ in parsed_items}))
    _keep_config(meta, configs + launches, events)
    # (a log states it as a number, a scrape's vllm:cache_config_info as a label's text: '0.92')
    util = next((u for e in events if (u := fraction(e["data"].get("gpu_memory_utilization"))) is not None), None)
    if util is not None:
        meta.engine_args.setdefault("gpu_memory_utilization", util)
    reports = [rep for _, _, _, rep in parsed_items]
    meta.inputs = [{"path": r.path, "kind": r.kind, "sha256": r.sha256, "lines_read": r.lines,
                    "parsed": r.parsed, "quarantined": r.quarantined, "notes": r.notes,
                    "clock_offset_us": r.clock_offset_us} for r in reports]
    w = BundleWriter(into, meta, quarantine_text=opts.keep_prompts or opts.keep_quarantine_text)
    untimed = 0
    for df in _batches(sample_frames, SAMPLES_AT_ONCE):
        untimed += df["t_us"].null_count()
        w.samples_frame(df.filter(pl.col("t_us").is_not_null()).with_columns(pl.col("t_us") - (t0 or 0)))
    for log in logs:
        untimed += _write_stats(w, log, t0 or 0)
    with background_removal() as remove:  # (the spill goes while the bundle is written)
        if logs:
            _requests_from_logs(logs, t0 or 0, opts.keep_prompts, w.requests_frame, spill_root, remove, opts.stage)
        remove(spill_root)
        for we in events:
            t_us = we["t"] - t0 if (we.get("t") is not None and t0 is not None) else None
            w.event({"t_us": t_us, "kind": we["kind"], "source": we["source"], "rank": we.get("rank"), **we["data"]})
        for f, line, reason, raw in quarantine:
            w.quarantine(f, line, reason, raw)
        for path in unknown:
            for i, ln in enumerate(_text_lines(path), start=1):
                w.quarantine(str(path), i, "unrecognised file kind", ln)
        if untimed:
            meta.notes.append(f"{untimed} samples had no time and are not on the timeline")
        if opts.stage is not None:
            opts.stage("writing the bundle")
        w.close(remove)
    added = _requests_from_access_lines(into / "requests.parquet", logs, t0 or 0, opts.stage)
    if added:
        meta.notes.append(f"{sum(added.values())} requests from uvicorn's access lines of {', '.join(added)}, which "
                          "has no request lines of vLLM's own: no id, no prompt length and no time of their own (each "
                          "placed between the nearest timed lines: when its response began, not when it arrived)")
    folded = unify_bundle_requests(into / "requests.parquet")
    if folded:
        meta.notes.append(f"{folded} requests were logged under the engine's id (the front end's id with a suffix: "
                          "'Added request cmpl-x-0-a120baa9') as well as the front end's: one row each, under the "
                          "front end's id, the engine's kept as engine_id")
    if added or folded:
        w.write_meta()
    summary = {"t0_utc": t0_utc, "samples": w.counts["samples"], "events": w.counts["events"],
               "quarantined": w.counts["quarantined"], "notes": meta.notes}
    return reports, summary
