"""The vectorised fast lane for the high-volume lines of a vLLM log.

A day of production log is gigabytes, nearly all of it three line shapes: the periodic stats line,
request Added/Finished lines, and HTTP access lines (at DEBUG level, chatter that states no fact).
Parsing those one by one in Python made ingestion the slow step of a postmortem, and holding their
facts as Python objects made memory grow with the file. This module reads a log in bounded pieces,
recognises those shapes with polars string expressions (request lines with their parameters and
prompt included; a line whose message holds none of the words the reference's patterns need is
counted parsed, with no fact), and spills their facts as columnar files. A line takes the fast
lane only when it is clean (no colour codes, no glued second message; a container runtime's or
kubectl's time and prefix in front are taken off, as the reference parser takes them off) and the
next line opens a new message, so nothing could attach to it; every other line (startup
accounting, OOM messages, tracebacks, wrapped or unusually prefixed lines) goes, in file order, to
``vllm_log.LogParser``, which remains the reference for what a line means. Tests check that both
routes give the same facts.

Before any of that, a piece of vLLM's own lines (not JSON, not opened by an envelope) goes through
the template scanner (``scan.PieceScanner``): the lines equal to a template, byte for byte but for
their time, client address or request id's hex, are read at that template's offsets (an Added or
Finished line's id, time and repeat key; an access or fact-less line only counted), and only the
others (the stats lines, the rare shapes, each piece's last line) are classified in polars. A
template is used only where this lane would read its line the same way (``_shape``), and its lines
are counted in ``FastFacts.template_lines``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import itertools
import os
import re
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload

import polars as pl

from replay.filehash import (
    DECOMPRESS_ERRORS,
    HashingReader,
    compression,
    damaged,
    decompressed,
    text_bom,
    utf8_chunks,
)
from replay.parallel import ordered_map
from replay.record.vllm_log import (
    AFTER_TS_BODY,
    ANSI,
    BARE_SGR,
    BOX,
    BOX_CLOSE,
    BOX_OPEN,
    COMPOSE_PREFIX,
    DUMP_HEAD_CHARS,
    INVISIBLE,
    ISO_CLOSE,
    ISO_OPEN,
    ISO_TIME,
    KUBECTL_PREFIX,
    LEVEL_TIME,
    MM_HIT,
    NBSP,
    OTEL_LEVELS,
    PREFIX_HIT,
    PROC_BODY,
    R_DP,
    R_IMAGE,
    R_PARAM,
    R_PROMPT,
    R_RECEIVED,
    R_TOKEN_IDS,
    RAY_FOLD_MARK,
    REALTIME_US,
    SHIPPED_TEXT,
    SHIPPED_TIME,
    SLURM_LABEL,
    STATS_V0,
    STATS_V1,
    SYSLOG_BSD_PREFIX,
    THROUGHPUT,
    WEB_HEAD,
    LogFact,
    LogParse,
    LogParser,
    dump_head,
    fact_time_us,
    image_tokens,
    physical_lines,
    split_line,
)

if TYPE_CHECKING:  # (``scan`` reads this module's INERT_UNLESS: imported where it is used, as numpy is, which
    # only template reading needs: 0.2 s of every command's start)
    import numpy as np
    import numpy.typing as npt

    from replay.record.scan import PieceClasses, PieceScanner, Template

_PROC = r"\((?P<proc>" + PROC_BODY + r")\) *"
# the strict shape of a fast-lane line: single spaces, so that plain splitting finds its fields; the
# call site in brackets ('[loggers.py:271] ', vLLM 0.8 on) or with only the closing one
# ('metrics.py:351] ', vLLM 0.6 and 0.7)
_STRICT = (r"^(?:\(" + PROC_BODY + r"\) )?INFO \d\d-\d\d "
           r"\d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+\.py:\d+\] ")
ACCESS = r'^(?:' + _PROC + r')?(?:INFO|WARNING|ERROR):\s+[\d.:]+ - "[A-Z]+ [^"\s]* HTTP/[\d.]+" \d+(?: [A-Za-z ]*)?$'
OPENS = (r'^(?:' + _PROC + r'|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s'
         r'|(?:INFO|WARNING|ERROR):\s+[\d.:]+ - ")')
# a second message glued onto the line (copy-paste): the reference parser splits those
_GLUED = LEVEL_TIME
# the same strict shape at any level: the lines that say nothing the reference parser would keep (and
# how ``recorder.detect_kind`` knows a log that holds nothing else)
STRICT_ANY = _STRICT.replace(")?INFO ", ")?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
# Words (any case) without which a message gives ``vllm_log.extract`` no fact and tells
# ``LogParser.observe`` nothing about version or engine from its text: each of their patterns needs
# one of them. (What the process and call site say is read from one line per kind, as for the other
# fast lines.) A test holds every real log line to this; a pattern added there needs its word here.
INERT_UNLESS = ("kv cache", "blocks", "memory", "model weights", "took", "maximum concurrency", "preempt",
                "received request", "added request", "finished request", "aborted request", " details: ",
                "serve at least one request", "enginedead", "engine background", "engine core proc", "enginecore",
                "engine process", "engine loop", "worker proc", "engine core init", "engine terminated", "llm engine", "async_llm_engine",
                *(f"engine {d}" for d in range(10)), "fatal", "version", "non-default args", "worker.py:267",
                "scheduler.py:1558", "pending:", "kv_cache_utils.py:86", "loggers.py:", "default since", "apiserver", "args: namespace(",
                "waiting:", "gpu_model_runner", "[shutdown]", "shutting down", "gracefully stopping", "sigterm", "vllmworker", "swapped:", "dumping ", "_alloc_failed", "cuda error", "hip error", "watchdog caught", "torch.compile",
                 "died unexpectedly", RAY_FOLD_MARK)


def inert(msg: pl.Expr) -> pl.Expr:
    """Whether a message (the text after a strict prefix) gives the reference parser no fact and no
    clue: it holds no INERT_UNLESS word and no second, glued message."""
    return ~msg.str.contains_any(list(INERT_UNLESS), ascii_case_insensitive=True) & ~msg.str.contains(_GLUED)


# what `srun --label`, syslog, `docker compose logs [-t]`, `kubectl logs --prefix --timestamps`, a CRI
# node log, journald or `docker logs -t` puts in front of the line vLLM wrote, in the order
# ``vllm_log._strip`` takes it off (of its pieces): task label, syslog head, compose service, pod, ISO
# time, then a CRI flag or journald's host and process
ENVELOPE = ("^(?P<env>(?:" + SLURM_LABEL + ")?(?:" + SYSLOG_BSD_PREFIX + ")?(?:" + COMPOSE_PREFIX + ")?(?:"
            + KUBECTL_PREFIX + ")?(?:" + ISO_OPEN + "(?P<iso>" + ISO_TIME + ")" + ISO_CLOSE + r"\s+(?:" + AFTER_TS_BODY + ")?)?)")

ESC_CHARS = ("\x1b", "^[", "#033")  # how a colour code opens: the byte, its caret notation, rsyslog's escape of it
# (``vllm_log.ESC_OPEN``)
CHUNK_BYTES = 16 << 20  # a piece pays a fixed ~20 ms of polars calls (8 MiB pieces spent about a quarter
# of their time on them)
TEMPLATE_MIN_BYTES = 256 << 20  # a smaller file's lines are not read by templates: the scanner's fixed cost
# (compiling its patterns, learning a log's templates: ~0.5 s) is more than they save it (~6 s a GiB of INFO
# log, less where long request lines or DEBUG lines of many ranks are most of it)
WORKERS = 2  # pieces prepared side by side (polars releases the GIL); one more is read ahead
BUCKET_FACTS = 350_000  # request or repeat-key facts held in memory at once


def buckets_for(n_facts: int) -> int:
    """How many hash buckets keep each bucket of ``n_facts`` facts under BUCKET_FACTS."""
    return max(1, -(-n_facts // BUCKET_FACTS))

# Spilled fact tables (the repeat-key hash ``h`` and ``repeatable`` are dropped once repeats are gone).
_STATS_COLS = {"line": pl.Int64, "rank": pl.Utf8, "ts": pl.Utf8, "t_exact": pl.Int64, "engine": pl.Utf8, "dp": pl.Utf8,
               "h": pl.UInt64, "repeatable": pl.Boolean, "running": pl.Float64, "waiting": pl.Float64,
               "swapped": pl.Float64, "preemptions": pl.Float64, "kv_usage_pct": pl.Float64,
               "cpu_kv_usage_pct": pl.Float64, "prompt_tps": pl.Float64, "gen_tps": pl.Float64,
               "prefix_cache_hit_pct": pl.Float64, "mm_cache_hit_pct": pl.Float64}
REQUEST_DETAILS = {"input_tokens": pl.Int64, "max_tokens": pl.Int64, "prompt_logprobs": pl.Int64, "logprobs": pl.Int64,
                   "n": pl.Int64, "best_of": pl.Int64, "prompt_chars": pl.Int64, "prompt_sha256": pl.Utf8,
                   "prompt": pl.Utf8, "mm_items": pl.Int64, "image_tokens": pl.Int64}
# a request fact's kind, spilled as an enum: as text it was a fifth of every request file's bytes, and
# comparing it was most of the time it took to read them back (its repeat key hashes the text)
REQUEST_KINDS = pl.Enum(["request_received", "request_added", "request_finished", "request_aborted"])
_REQUEST_COLS: dict[str, pl.DataType | type[pl.DataType]] = {
    "line": pl.Int64, "rank": pl.Utf8, "ts": pl.Utf8, "t_exact": pl.Int64, "kind": REQUEST_KINDS, "h": pl.UInt64,
    "repeatable": pl.Boolean, "request_id": pl.Utf8, "rh": pl.UInt64, **REQUEST_DETAILS}
ID_SEED = 11  # every hash of a request id (``rh``, aborted ids): requests are joined on it, bucket by bucket
ID_HASH = pl.col("request_id").hash(seed=ID_SEED)
STATS_SCHEMA = {k: v for k, v in _STATS_COLS.items() if k not in ("h", "repeatable")}
REQUEST_SCHEMA = {k: v for k, v in _REQUEST_COLS.items() if k not in ("h", "repeatable")}


TimeEnds = tuple[str | None, str | None, int | None, int | None, int | None, int | None]


def time_ends(facts: pl.DataFrame | pl.LazyFrame) -> TimeEnds:
    """Of facts' times (``ts``, ``t_exact``): the least and the greatest logged time of those with no exact
    one, the fewest and most bytes of those, the least and the greatest exact time (each None where
    there is none): within a year, 'MM-DD HH:MM:SS' sorts as time does."""
    logged, exact = pl.col("ts").filter(pl.col("t_exact").is_null()), pl.col("t_exact")
    row = facts.lazy().select(logged.min().alias("lo"), logged.max().alias("hi"), logged.str.len_bytes().min().alias("shortest"),
                              logged.str.len_bytes().max().alias("longest"), exact.min().alias("x_lo"),
                              exact.max().alias("x_hi")).collect().row(0)
    return cast(TimeEnds, row)


def joined_ends(ends: list[TimeEnds]) -> TimeEnds:
    """``time_ends`` of several sets of facts, from each one's."""
    def known(i: int) -> list[Any]:
        return [e[i] for e in ends if e[i] is not None]

    def least(i: int) -> Any:
        return min(known(i), default=None)

    def most(i: int) -> Any:
        return max(known(i), default=None)
    return least(0), most(1), least(2), most(3), least(4), most(5)


def scan_facts(files: list[Path]) -> pl.LazyFrame:
    """Spilled fact files as one frame. The fast lane's request files leave out the columns that only
    'Received request' lines fill (REQUEST_DETAILS): they were two fifths of every file written and
    read again. Columns a file lacks read as nulls."""
    return pl.concat([pl.scan_ipc(f) for f in files], how="diagonal_relaxed")


def scan_requests(files: list[Path]) -> pl.LazyFrame:
    """Request fact files, slim and full alike, with every REQUEST_SCHEMA column: nulls where no file
    has one (the details when every request line of the log ran fast; the rank when, besides, their
    repeats were kept)."""
    lf = scan_facts(files)
    have = lf.collect_schema().names()
    return lf.with_columns(**{c: pl.lit(None, dtype=t) for c, t in REQUEST_SCHEMA.items() if c not in have})


@dataclass
class FastFacts:
    """Columnar facts of the fast lane, spilled to Arrow IPC files (one per piece of the log)."""

    stats: list[Path] = field(default_factory=list)
    requests: list[Path] = field(default_factory=list)
    slow_requests: list[Path] = field(default_factory=list)  # those of the reference parser: only they
    # can hold 'Aborted request' facts
    request_ends: list[tuple[int, str]] = field(default_factory=list)  # (line, ts) of each file's first and
    # last request fact: enough to see where a log turns to a new year without reading them
    request_rows: dict[Path, int] = field(default_factory=dict)  # each request file's facts as spilled (one
    # rewritten since, not there: its footer tells)
    request_times: dict[Path, TimeEnds] = field(default_factory=dict)  # each request file's ``time_ends`` as
    # spilled (one rewritten since, not there)
    lines: int = 0
    template_lines: int = 0  # of ``lines``: read by their template's fixed shape (``_templated``)

    def stats_frame(self, drop: pl.Series | None = None) -> pl.LazyFrame:
        """The stats facts (few: one per 10 s of log), less those whose repeat key is in ``drop``."""
        if not self.stats:
            return pl.LazyFrame(schema=STATS_SCHEMA)
        lf = pl.scan_ipc(self.stats)
        if drop is not None and drop.len():
            lf = lf.filter(~(pl.col("repeatable") & pl.col("h").is_in(drop.implode())))
        return lf.select(list(STATS_SCHEMA)).sort("line")

    def stats_keys(self) -> pl.Series:
        """The repeat keys of the stats facts a repeated line would repeat (those with a logged time)."""
        if not self.stats:
            return pl.Series("h", [], dtype=pl.UInt64)
        return pl.scan_ipc(self.stats).filter("repeatable").select("h").collect()["h"]

    def requests_frame(self, files: list[Path] | None = None) -> pl.LazyFrame:
        """The request facts of all pieces, or of ``files`` among them."""
        files = self.requests if files is None else files
        if not files:
            return pl.LazyFrame(schema=REQUEST_SCHEMA)
        return scan_requests(files).select(list(REQUEST_SCHEMA))


@dataclass(frozen=True)
class LongLine:
    """A line longer than a reader's bound, in place of its text: its length and its first bytes."""

    n_bytes: int
    head: bytes
    bound: int  # the reader's: the most bytes a line it hands on may have

    def note(self) -> str:
        most = f"{self.bound / 2**20:g} MiB" if self.bound >= 1 << 20 else f"{self.bound:,} bytes"
        return f"a line of {self.n_bytes:,} bytes, longer than the {most} a log line may have: not parsed (its text is kept only with --keep-prompts or --keep-quarantine-text)"


MAX_LINE_BYTES = 16 << 20  # a log's longest line: a longer one (a blob without line ends, say) is quarantined
# unread, which keeps memory bounded and spares the line-by-line parser, whose patterns take seconds on it
LONG_LINE_HEAD = 1024  # the bytes of such a line kept for its quarantine entry


@overload
def text_pieces(path: Path, chunk_bytes: int, hasher: Any = None, max_line: None = None) -> Iterator[bytes]: ...


@overload
def text_pieces(path: Path, chunk_bytes: int, hasher: Any, max_line: int) -> Iterator[bytes | LongLine]: ...


def text_pieces(path: Path, chunk_bytes: int, hasher: Any = None,
                max_line: int | None = None) -> Iterator[bytes | LongLine]:
    """The file's text as UTF-8 in pieces that end at a line end (decompressing gzip, bzip2 or xz and
    transcoding UTF-16 as it goes); with ``hasher``, every byte of the file as given goes into it.
    With ``max_line``, a line longer than that (and than ``chunk_bytes``, which a line within one
    read never is) comes as a LongLine, between the pieces before and after it, and is never held
    whole."""
    kind = compression(path)
    raw = HashingReader(path, hasher)
    try:
        fh: Any = decompressed(cast(Any, raw), kind, path)
    except BaseException:
        raw.close()
        raise
    bound = None if max_line is None else max(max_line, chunk_bytes)
    try:
        with contextlib.closing(raw), contextlib.closing(fh):
            if kind is None and _plain_head(raw):  # (the common case: each piece read whole, as it is cut)
                at = yield from exact_pieces(raw, chunk_bytes, hasher, bound)
                if at is None:
                    return
                raw.raw.seek(at)  # (a line too long for the window: read on as below, from its start)
                chunks: Iterator[bytes] = iter(functools.partial(fh.read, chunk_bytes), b"")
            else:
                chunks = utf8_chunks(fh, chunk_bytes, past_nul_run=True)  # (a hole a copytruncate left: skipped)
            held: list[bytes | memoryview] = []  # the start of the line the last read ended in (joined once it ends:
            size = 0  # joining at every read was quadratic in the line's length)
            long_head: bytes | None = None  # (the head of a line over the bound, whose rest is skipped)
            while True:  # one copy per piece: the rest of the last read joined to this read's lines
                chunk = next(chunks, b"")
                if not chunk:
                    raw.rest()  # bytes after the gzip stream belong to the file's hash too
                    if long_head is not None:
                        yield LongLine(size, long_head, bound or 0)  # (set only with a bound)
                    elif held:
                        yield b"".join(held)
                    return
                first = chunk.find(b"\n")
                if bound is not None and (long_head is not None or size + (len(chunk) if first < 0 else first) > bound):
                    if long_head is None:
                        long_head, held = b"".join(held)[:LONG_LINE_HEAD], []
                    if len(long_head) < LONG_LINE_HEAD:
                        long_head += chunk[:min(len(chunk) if first < 0 else first, LONG_LINE_HEAD - len(long_head))]
                    if first < 0:
                        size += len(chunk)
                        continue
                    yield LongLine(size + first, long_head, bound)
                    long_head, size = None, 0
                    chunk = chunk[first + 1:]
                    if not chunk:
                        continue
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:
                    held.append(chunk)
                    size += len(chunk)
                    continue
                held.append(memoryview(chunk)[:cut])
                piece = b"".join(held)
                held, size = [chunk[cut:]] if cut < len(chunk) else [], len(chunk) - cut
                yield piece
    except DECOMPRESS_ERRORS as e:
        if kind is None:
            raise
        raise damaged(path, kind, e) from None


TAIL_BYTES = 1 << 16  # where a piece read whole looks for its last line end: the end of its window


def _plain_head(raw: HashingReader) -> bool:
    """Whether an uncompressed file opens as plain UTF-8 text: no byte-order mark, no run of NULs."""
    head = os.pread(raw.raw.fileno(), 4, 0)
    return len(head) == 4 and text_bom(head) is None and not head.startswith(b"\x00")


def exact_pieces(raw: HashingReader, chunk_bytes: int, hasher: Any,
                 bound: int | None = None) -> Generator[bytes, None, int | None]:
    """The pieces of a plain, uncompressed file, as ``text_pieces`` cuts them (each ends at the last line
    end before the next multiple of ``chunk_bytes``), each read once into a bytes of its own: the end of
    its window is looked at first. Reading a window whole and joining the line it ended in to the next
    read cost a copy and a new block's page faults a piece. Returns None at the end of the file, or the
    offset from which the caller reads on: where a window's end holds no line end, the line across a
    window's start is longer than ``bound``, or the file changed while it was read."""
    fd, at, end = raw.raw.fileno(), 0, 0
    while True:
        was, end = end, end + chunk_bytes  # (the window after the one the last piece ended in)
        look = max(at, end - TAIL_BYTES)
        tail = os.pread(fd, end - look, look)
        last = len(tail) < end - look  # (the file ends in this window: the rest is the last piece)
        if last:
            piece = os.pread(fd, end - at, at)
            if len(piece) == end - at:
                return at
        else:
            cut = tail.rfind(b"\n")
            if cut < 0:
                return at
            piece = os.pread(fd, look + cut + 1 - at, at)
            if len(piece) != look + cut + 1 - at or not piece.endswith(b"\n"):
                return at
        if bound is not None and _line_across(piece, was - at) > bound:
            return at
        if hasher is not None:
            hasher.update(piece)
        if last:
            cut = piece.rfind(b"\n") + 1
            if 0 < cut < len(piece):  # (a last line that no line end ends: a piece of its own)
                yield piece[:cut]
                piece = piece[cut:]
            if piece:
                yield piece
            return None
        at += len(piece)
        yield piece


def _line_across(piece: bytes, k: int) -> int:
    """The length of the line of ``piece`` that holds its offset ``k`` (0 if none): the only one that can
    be longer than a window."""
    if not 0 <= k < len(piece):
        return 0
    stop = piece.find(b"\n", k)
    return (len(piece) if stop < 0 else stop) - (piece.rfind(b"\n", 0, k) + 1)


def _lines(piece: bytes, has_cr: bool = True) -> tuple[pl.Series, bool]:
    """The piece's lines without their LF, as ``vllm_log.physical_lines`` cuts them (an empty one may
    be null: filling them all would copy every line, and only the slow lane needs them filled), and
    whether they were cut natively (each line's bytes exactly those between its LFs: ``_line_ends``).

    Polars' CSV reader, told that a line is one unquoted field, cuts lines natively at memory
    speed; the Python split it replaces cost more than all the parsing. It is used only where it
    cannot differ from the reference: valid UTF-8 (no replacement characters to count), no CR (which
    it may take for a line end) and every byte accounted for (checked: the lines' bytes and one LF
    between each two add up to the piece, and no line holds an LF; a byte that acted as its field
    separator, or a line it dropped, would be missing). The check runs in polars, without the GIL:
    counting the LFs in Python held it for 12 ms a piece, a tenth of the parse."""
    exact = None if has_cr else _lf_lines(piece)
    if exact is not None:
        return exact, True
    return pl.Series("raw", physical_lines(piece.decode("utf-8", errors="replace")), dtype=pl.Utf8), False


def _lf_lines(piece: bytes) -> pl.Series | None:
    """``_lines`` of a piece without CR (the caller's check: the reader may take one for a line end), cut
    natively, each line's bytes exactly those between its LFs (an empty one null); None where that cannot
    be so (a piece that is not UTF-8, or that the reader would cut elsewhere)."""
    try:  # strict UTF-8: invalid bytes take the reference route, which replaces them as Python does
        raw = pl.read_csv(piece, has_header=False, separator="\x01", quote_char=None, new_columns=["raw"],
                          infer_schema=False, comment_prefix=None, encoding="utf8")["raw"]
    except (pl.exceptions.PolarsError, OSError):  # anything the reader refuses takes the reference route (a
        # piece that opens as a compressed stream would, 'x^' a zlib header, is read by it as one: 'corrupt
        # deflate stream')
        return None
    ends = len(raw) - (0 if piece.endswith(b"\n") else 1)
    held = raw.str.len_bytes().sum() + ends
    if held == len(piece) and not raw.str.contains("\n", literal=True).any():
        return raw  # (an empty line reads as null: filled where the slow lane takes it)
    return None


def _strict_heads(lines: pl.Series, at: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which of ``_lf_lines``' lines ``at`` open with vLLM's strict head (``scan.STRICT_HEAD_RS``; their bytes are
    the piece's, so that it is what the scanner's own pattern finds in them)."""
    from replay.record.scan import STRICT_HEAD_RS
    return lines.gather(at).str.contains(STRICT_HEAD_RS).fill_null(False).to_numpy()


def _line_ends(lines: pl.Series) -> npt.NDArray[np.int64]:
    """Where each of ``_lf_lines``' lines ends in its piece: its LF, or the piece's end for a last line without one."""
    return ((lines.str.len_bytes().fill_null(0).cast(pl.Int64) + 1).cum_sum() - 1).to_numpy()


def iso_us(col: pl.Expr) -> pl.Expr:
    """Epoch µs of ISO container times (any fraction digits, Z, +hh:mm, +hhmm or none for UTC), as
    ``vllm_log.fact_time_us`` gives them one by one; null where that gives None."""
    g = col.str.extract_groups("^" + ISO_TIME + "$")
    base = g.struct.field("dt").str.to_datetime("%Y-%m-%dT%H:%M:%S", time_unit="us", strict=False).dt.epoch("us")
    frac = g.struct.field("frac").str.slice(0, 6).str.pad_end(6, "0").cast(pl.Int64).fill_null(0)
    zone = g.struct.field("zone")
    off_s = (pl.when(zone.str.starts_with("-")).then(-1).otherwise(1)
             * (zone.str.slice(1, 2).cast(pl.Int64) * 3600 + zone.str.slice(-2).cast(pl.Int64) * 60))
    return base + frac - pl.when(zone.is_null() | (zone == "Z")).then(0).otherwise(off_s) * 1_000_000


def _num(col: pl.Expr) -> pl.Expr:
    return col.str.replace_all(",", "", literal=True).cast(pl.Float64, strict=False)


def _prefix_fields(df: pl.DataFrame) -> pl.DataFrame:
    """Split strictly shaped lines into prefix fields and message without regex captures (slow)."""
    has_proc = pl.col("raw").str.starts_with("(")
    pp = pl.col("raw").str.splitn(") ", 2)
    df = df.with_columns(
        proc=pl.when(has_proc).then(pp.struct.field("field_0").str.slice(1)),
        rest=pl.when(has_proc).then(pp.struct.field("field_1")).otherwise(pl.col("raw")),
    )
    parts = pl.col("rest").str.splitn(" ", 5)
    return df.with_columns(
        md=parts.struct.field("field_1"), hms=parts.struct.field("field_2").str.slice(0, 8),
        fl=parts.struct.field("field_3").str.strip_prefix("[").str.strip_suffix("]"),
        msg=parts.struct.field("field_4"),
    ).drop("rest")


def _fields(df: pl.DataFrame, shape: str = _STRICT) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The strictly shaped lines among ``df``'s, with their message, and their prefix fields (proc,
    fl, rank, ts) as a table of prefixes that the lines' ``pid`` indexes. A strict prefix ('(proc)
    INFO date time [file:line]') ends at the line's first '] ' (neither process nor call site can hold
    one), so the shape is a property of the prefix; the lines of a piece come in runs that share a
    prefix, so each run's prefix is matched and split once, and its fields are copied only onto the
    lines that end up as facts (``_heads``). The shape is matched to the end of the prefix."""
    # (one split in two: a third cheaper than a search and two slices; a line without '] ' is a prefix)
    df = df.select(pl.exclude("raw"), pl.col("raw").str.splitn("] ", 2).struct.rename_fields(["prefix", "msg"])
                   .alias("_cut")).unnest("_cut")
    # consecutive lines mostly share their prefix: number the runs and split the first line of each
    starts = (pl.col("prefix") != pl.col("prefix").shift(1)).fill_null(True)
    df = df.with_columns(pid=starts.cast(pl.UInt32).cum_sum() - 1)
    heads = df.filter(starts).select(raw=pl.col("prefix") + "] ")
    strict = heads["raw"].str.contains(shape + "$").fill_null(False)
    heads = _prefix_fields(heads).with_columns(rank=pl.col("proc").fill_null("main"),
                                               ts=pl.concat_str(["md", "hms"], separator=" "))
    # (a paste padded to a width, or a glued piece's trailing blank: the reference strips a prefixed
    # line's trailing blanks, and its repeat key hashes the message without them)
    lines = df.drop("prefix").filter(strict.gather(df["pid"])).with_columns(pl.col("msg").str.strip_chars_end(" \t"))
    return lines, heads.select("proc", "fl", "rank", "ts")


def _heads(df: pl.DataFrame, heads: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the prefix fields of its lines."""
    return df.with_columns(heads.get_columns()[i].gather(df["pid"]) for i in range(heads.width))


KEY_SEEDS = {"rank": 7, "ts": 8, "kind": 9, "msg": 10}  # the repeat key's hash of each of its fields


def _key(rank_ts: pl.Expr | None = None) -> pl.Expr:
    """The repeat key of a fact: a hash of (rank, key_ts, kind, msg), the same from either lane. It is
    the four fields' own hashes combined, so that a run of lines sharing a prefix can hash its rank and
    time once (``rank_ts``); a struct hash costs as much as hashing every field twice over."""
    if rank_ts is None:
        rank_ts = pl.col("rank").hash(seed=KEY_SEEDS["rank"]).xor(pl.col("key_ts").hash(seed=KEY_SEEDS["ts"]))
    return rank_ts.xor(pl.col("kind").hash(seed=KEY_SEEDS["kind"])).xor(pl.col("msg").hash(seed=KEY_SEEDS["msg"]))


_KEY = _key()


RECEIVED_SLICE_BYTES = 2 << 20  # of 'Received request' messages read at a time (each step copies its prompts)


def _received_by_slices(rv: pl.DataFrame, keep_prompts: bool) -> pl.DataFrame:
    """``_received`` of a few MiB of lines at a time: over a whole piece of V0's request logging, its
    copies of the prompts and id lists held 80 MiB a worker at once."""
    slices = -(-int(rv["msg"].str.len_bytes().sum() or 0) // RECEIVED_SLICE_BYTES)
    if slices <= 1:
        return _received(rv, keep_prompts)
    rows = -(-rv.height // slices)
    return pl.concat([_received(rv.slice(at, rows), keep_prompts) for at in range(0, rv.height, rows)])


def _received(rv: pl.DataFrame, keep_prompts: bool) -> pl.DataFrame:
    """'Received request <id>: prompt: '…', params: SamplingParams(…), prompt_token_ids: […]' lines as
    request facts with their details, as ``vllm_log.request_details`` reads them one by one: the
    parameters after the last 'params: ', the token count of the id list (null when it was cut
    short with '...'), and the prompt as logged, kept only as its length and sha256 unless
    --keep-prompts. The repeat key uses the first 2,000 characters, as the reference's facts do."""
    msg = pl.col("msg")  # (the reference's own patterns, so that both lanes read the same)
    rv = rv.with_columns(request_id=msg.str.extract("^" + R_RECEIVED.pattern, 1)).filter(
        pl.col("request_id").is_not_null())
    rest = msg.str.slice(pl.col("request_id").str.len_chars() + len("Received request :"))
    # (over a prompt of kilobytes, a regex's capture groups cost some 20 times its match: the prompt and
    # the id list are taken as whole matches and cut, the parameters after the last 'params: ' by a
    # split; each once, as a column, for the expressions that use them)
    rv = rv.with_columns(_rest=rest).with_columns(
        _params=pl.when(pl.col("_rest").str.contains("params: ", literal=True)).then(
            pl.lit("params: ") + pl.col("_rest").str.split("params: ").list.last()).otherwise(pl.col("_rest")),
        _ids=_first_match(pl.col("_rest"), _IDS_AT),  # 'prompt_token_ids: [1, 2' then ']' or '...'
        _prompt=_first_match(pl.col("_rest"), _PROMPT_AT))
    rv = _matched_again(rv, "_ids", _IDS_AT)
    rv = _matched_again(rv, "_prompt", _PROMPT_AT).with_columns(pl.col("_prompt").str.slice(len("prompt: ")))
    ids, prompt = pl.col("_ids"), pl.col("_prompt")
    cut_short = ids.str.ends_with("...")
    head = len("prompt_token_ids: [")
    listed = ids.str.slice(head, ids.str.len_chars() - head - pl.when(cut_short).then(3).otherwise(1))
    rv = rv.with_columns(
        **{k: pl.col("_params").str.extract(rx.pattern, 1).cast(pl.Int64, strict=False) for k, rx in R_PARAM.items()
           if k in REQUEST_DETAILS},
        input_tokens=pl.when(ids.is_not_null() & ~cut_short).then(
            pl.when(listed.str.strip_chars() == "").then(0).otherwise(listed.str.count_matches(",", literal=True) + 1)),
        prompt=pl.when(prompt != "None").then(prompt),
        kind=pl.lit("request_received"), key_ts=pl.col("ts"), msg=msg.str.slice(0, 2000),
    ).drop("_params", "_prompt", "_rest").with_columns(h=_KEY, prompt_chars=pl.col("prompt").str.len_chars(),
                                              mm_items=_images(pl.col("prompt")))
    rv = _image_tokens(rv).drop("_ids")
    sha = [None if t is None else hashlib.sha256(t.encode()).hexdigest() for t in rv["prompt"].to_list()]
    rv = rv.with_columns(prompt_sha256=pl.Series(sha, dtype=pl.Utf8))
    return rv if keep_prompts else rv.with_columns(prompt=pl.lit(None, dtype=pl.Utf8))


@dataclass(frozen=True)
class _MatchAt:
    """A pattern of the reference (``pattern``, whose every match begins with ``literal``), and the same
    pattern from the literal's first place on (``after``: anchored, its classes ASCII): where that matches,
    it is the reference's first match, read by one forward scan of ASCII bytes; a text where it does not,
    though it holds the literal, is searched again by ``pattern`` (``_matched_again``). On a fleet's V0
    request lines the two took three fifths of what the reference's patterns alone took."""

    literal: str
    after: str
    pattern: str


_IDS_AT = _MatchAt("prompt_token_ids: [", r"^[0-9, ]*(?:\]|\.\.\.)", R_TOKEN_IDS.pattern)  # (a run of ASCII
# digits, commas and spaces ending in ']' or '...' is the run of \d, ',' and \s the reference takes there)
_PROMPT_AT = _MatchAt("prompt: ", r"""^(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|None)""", R_PROMPT.pattern)


def _first_match(text: pl.Expr, m: _MatchAt) -> pl.Expr:
    """The first match of ``m`` in ``text``, tried where its literal first is; null where none is there."""
    after = text.str.splitn(m.literal, 2).struct.field("field_1")
    return pl.lit(m.literal) + after.str.extract_all(m.after).list.first()


def _matched_again(rv: pl.DataFrame, col: str, m: _MatchAt) -> pl.DataFrame:
    """``rv`` with ``col`` searched again by the reference's own pattern in the rows where the first place
    of its literal held no match (a later place may: a prompt that quotes 'prompt_token_ids: [x')."""
    again = rv.select(pl.col(col).is_null() & pl.col("_rest").str.contains(m.literal, literal=True)).to_series().arg_true()
    if not again.len():
        return rv
    found = rv["_rest"].gather(again).str.extract_all(m.pattern).list.first()
    return rv.with_columns(rv[col].scatter(again, found))


def _image_tokens(rv: pl.DataFrame) -> pl.DataFrame:
    """``image_tokens`` of the requests whose prompts held images, from their complete id lists (``_ids``:
    'prompt_token_ids: [1, 2' then ']' or '...'), by ``vllm_log.image_tokens``: in Python, only those rows
    (a regex with a back-reference)."""
    imaged = rv.select(pl.arg_where(pl.col("mm_items").is_not_null() & pl.col("_ids").str.ends_with("]"))).to_series()
    head = len("prompt_token_ids: [")
    got = [image_tokens(ids[head:-1], n) for ids, n in zip(rv["_ids"].gather(imaged).to_list(),
                                                           rv["mm_items"].gather(imaged).to_list(), strict=True)]
    col = pl.Series("image_tokens", [None] * rv.height, dtype=pl.Int64)
    if imaged.len():
        col = col.scatter(imaged, pl.Series(got, dtype=pl.Int64))
    return rv.with_columns(col)


def _images(prompt: pl.Expr) -> pl.Expr:
    """The images a logged prompt's placeholders hold (``vllm_log.R_IMAGE``); null where it holds none."""
    n = prompt.str.count_matches(R_IMAGE.pattern).cast(pl.Int64)
    return pl.when(n > 0).then(n)


_MAYBE_ENVELOPE = (r"^(?:\[|\d{4}-\d\d-\d\dT|[A-Z][a-z]{2} [ \d]\d |" + SLURM_LABEL + "|" + COMPOSE_PREFIX
                   + ")")  # how an envelope opens
_ENVELOPED = re.compile("^(?:" + SLURM_LABEL + "|" + SYSLOG_BSD_PREFIX + "|" + COMPOSE_PREFIX + "|" + KUBECTL_PREFIX + "|" + ISO_OPEN
                        + ISO_TIME + ISO_CLOSE + r"\s)")  # (a line that opens with one)


def _strip_envelopes(df: pl.DataFrame, at: pl.Series) -> pl.DataFrame:
    """``df`` with the envelopes of lines ``at`` taken off ``raw`` and their time in ``iso``."""
    env = df["raw"].gather(at).str.extract_groups(ENVELOPE)
    cut = env.struct.field("env").str.len_chars()  # (slices count characters)
    if not (cut > 0).any():
        return df
    iso = env.struct.field("iso")  # (an envelope without a time keeps the time Docker's JSON gave)
    return df.with_columns(iso=df["iso"].scatter(at, iso.fill_null(df["iso"].gather(at)) if df["iso"].null_count() < df.height else iso),
                           raw=pl.col("raw").str.slice(pl.zeros(df.height, pl.UInt32, eager=True).scatter(at, cut)))




_OTEL = r'^\{\s*"timestamp"\s*:\s*"'  # vLLM's JSON logging (its OTel formatter) opens a record so
# a body the reference would read differently: cut into lines by Python (its line breaks), or with
# white space at an end (Python's strip takes \x1c-\x1f too)
_ODD_BODY = r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]|^[\s\x1c-\x1f]|[\s\x1c-\x1f]$|^$"


def _unotel(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the records of vLLM's JSON logging as the lines its text formatter would have
    written ('LEVEL MM-DD HH:MM:SS body') and their exact times, as ``vllm_log._otel`` reads them.
    A record with an exception, a body of several lines or an odd one takes the line-by-line parser."""
    at = df["raw"].str.contains(_OTEL).arg_true()
    if not at.len():
        return df
    rows = df["raw"].gather(at)
    body, t, exc = (rows.str.json_path_match(f"$.{k}") for k in ("body", "timestamp", "exception"))
    level = rows.str.json_path_match("$.severity_text").str.to_uppercase().replace_strict(
        list(OTEL_LEVELS), list(OTEL_LEVELS.values()), default="INFO")
    ok = (body.is_not_null() & ~body.str.contains(_ODD_BODY).fill_null(True) & exc.is_null()
          & rows.str.contains(r'"body"\s*:\s*"') & t.str.contains("^" + ISO_TIME + "$").fill_null(False))
    at, body, t, level = at.filter(ok), body.filter(ok), t.filter(ok), level.filter(ok)
    # (with a stand-in call site: the strict shape cuts the prefix there; no fact carries a call site)
    text = pl.select(pl.concat_str([level, t.str.slice(5, 5), t.str.slice(11, 8), pl.lit("[json.py:0]"), body],
                                   separator=" ")).to_series()
    return df.with_columns(raw=df["raw"].scatter(at, text), iso=df["iso"].scatter(at, t))


def _key_at(rows: pl.Series, key: str) -> tuple[pl.Series, pl.Series, pl.Series]:
    """For JSON records: how often ``key`` names a field anywhere in each (quotes inside strings are
    escaped, so only fields count), its top-level value as text, and whether that value is a string."""
    k = re.escape(key)
    return (rows.str.count_matches(f'"{k}"\\s*:'), rows.str.json_path_match(f"$['{key}']"),
            rows.str.contains(f'"{k}"\\s*:\\s*"'))


_DOCKER = r'^\{\s*"log"\s*:\s*"'  # how Docker's json-file driver opens every line it writes ('{"log":"')
# the other shippers' field names: a Docker line naming none of them is read by its two fields alone
_NOT_DOCKER = [f'"{k}"' for k in (*SHIPPED_TEXT, *SHIPPED_TIME, "__REALTIME_TIMESTAMP") if k not in ("log", "time")]


def _docker_lines(rows: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """Of Docker's json-file lines, which read here, their text ('log') and time ('time', where ISO)."""
    log, t = rows.str.json_path_match("$.log"), rows.str.json_path_match("$.time")
    return (log.is_not_null() & (t.is_null() | t.str.contains("^" + ISO_TIME + "$"))).fill_null(False), log, t


def _shipped_lines(rows: pl.Series) -> tuple[pl.Series, pl.Series, pl.Series]:
    """Of other shippers' records, which read here (one text field and at most one time field, each
    named once and a string; an ISO time, or journald's µs digits), their text and time."""
    none = pl.Series([None] * len(rows), dtype=pl.Utf8)
    n_text, n_time, text, t = pl.zeros(len(rows), pl.UInt32, eager=True), pl.zeros(len(rows), pl.UInt32, eager=True), none, none
    ok = ~rows.str.contains('"asctime"', literal=True)  # (Python logging's records: the line-by-line parser's)
    for key in (*SHIPPED_TEXT, *SHIPPED_TIME, "__REALTIME_TIMESTAMP"):
        n, v, is_str = _key_at(rows, key)
        ok = ok & ((n == 0) | (v.is_not_null() & is_str))
        if key in SHIPPED_TEXT:
            n_text, text = n_text + n, pl.select(pl.coalesce(text, v)).to_series()
            continue
        if key == "__REALTIME_TIMESTAMP":
            ok = ok & ((n == 0) | v.str.contains(REALTIME_US.pattern).fill_null(False))
            v = pl.select(pl.from_epoch(v.cast(pl.Int64, strict=False), "us").dt.strftime("%Y-%m-%dT%H:%M:%S.%6fZ")).to_series()
        else:
            ok = ok & ((n == 0) | v.str.contains("^" + ISO_TIME + "$").fill_null(False))
        n_time, t = n_time + n, pl.select(pl.coalesce(t, v)).to_series()
    return (ok & (n_text == 1) & (n_time <= 1)).fill_null(False), text, t


def _unship(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with the records of log shippers (Docker's json-file, logcli, journald, Vector: one JSON
    object a line) as their text, its line ends taken off, and their time in ``iso``, as
    ``vllm_log._shipped`` reads them. Docker's lines take a cheap path (two fields); the others are
    read here where they name one text field and at most one time field, each once: any other
    record takes the line-by-line parser, which picks among several by its order."""
    at = df["raw"].str.starts_with("{").arg_true()
    if not at.len():
        return df
    rows = df["raw"].gather(at)
    docker = (rows.str.contains(_DOCKER) & ~rows.str.contains_any(_NOT_DOCKER)).fill_null(False)
    parts = [(at.filter(docker), *_docker_lines(rows.filter(docker)))] if docker.any() else []
    if not docker.all():
        parts.append((at.filter(~docker), *_shipped_lines(rows.filter(~docker))))
    at = pl.concat([a.filter(ok) for a, ok, _, _ in parts])
    if not at.len():
        return df
    text, t = pl.concat([x.filter(ok) for _, ok, x, _ in parts]), pl.concat([y.filter(ok) for _, ok, _, y in parts])
    return df.with_columns(raw=df["raw"].scatter(at, text.str.strip_chars_end("\n")), iso=df["iso"].scatter(at, t))


def _take_out(df: pl.DataFrame, char: str, pattern: str, literal: bool) -> pl.DataFrame:
    """``df`` with ``pattern`` taken out of ``raw`` on the lines that hold ``char``."""
    at = df["raw"].str.contains(char, literal=True).arg_true()
    if not at.len():
        return df
    return df.with_columns(raw=df["raw"].scatter(at, df["raw"].gather(at).str.replace_all(pattern, "", literal=literal)))


def _unweb(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with what a copy from a web page put in its lines taken out, as ``vllm_log.unweb`` does."""
    r = df["raw"]
    at = r.str.contains(_WEB_CHARS).fill_null(False).arg_true()  # (one pass; few lines hold one)
    if not at.len():
        return df
    rows = r.gather(at).str.strip_chars_start("".join(INVISIBLE))
    rows = pl.select(pl.when(rows.str.starts_with(BOX)).then(
        rows.str.replace("^" + BOX_OPEN.pattern, "").str.strip_chars_end("\n").str.replace(BOX_CLOSE.pattern, ""))
        .otherwise(rows)).to_series()
    rows = pl.select(pl.when(rows.str.slice(0, WEB_HEAD).str.contains(NBSP, literal=True))
                     .then(rows.str.replace_all(NBSP, " ", literal=True)).otherwise(rows)).to_series()
    return df.with_columns(raw=r.scatter(at, rows))


WEB_BYTES = tuple(c.encode() for c in (NBSP, *INVISIBLE, BOX))
_WEB_CHARS = "[" + NBSP + "".join(INVISIBLE) + BOX + "]"  # (one class: 5 ms over a DEBUG log's piece, where
# ``contains_any``'s automaton took 30 ms)


def _take_out_bare_codes(df: pl.DataFrame, at: pl.Series) -> pl.DataFrame:
    """``df`` with the colour codes that lost their ESC taken out of those of lines ``at`` that open
    with one, as ``vllm_log._strip_envelopes`` takes them out."""
    at = at.filter(df["raw"].gather(at).str.contains("^" + BARE_SGR))
    if not at.len():
        return df
    return df.with_columns(raw=df["raw"].scatter(at, df["raw"].gather(at).str.replace_all(BARE_SGR, "")))


def _marks(df: pl.DataFrame, esc: bool = True) -> pl.DataFrame:
    """Cheap tests of every line (literal searches, one anchored match), side by side in one lazy plan
    so that both cores work: whether it opens a message, holds a colour code (without ``esc``, none
    can; an empty line, which the search leaves unmarked, is marked, which keeps it off the fast lane
    alike), may be a stats or request line (one literal finds the three verbs: 'Adde|Finishe|Receive'
    + 'd request '), or an access line."""
    raw = pl.col("raw")
    return df.lazy().select(
        opens=raw.str.contains(OPENS), esc=raw.str.contains_any(list(ESC_CHARS)) if esc else raw.is_null(),
        want=raw.str.contains("KV cache usage", literal=True) | raw.str.contains("d request ", literal=True),
        ac=raw.str.contains(' - "', literal=True),
    ).collect()


def _classify(lines: pl.Series, first_no: int, has_cr: bool = True, keep_prompts: bool = False,
              has_esc: bool = True, json_lines: bool = True, request_keys: bool = True, web: bool = True,
              logged_first: bool = False, known: _Templated | None = None,
              ) -> tuple[pl.DataFrame, pl.Series, pl.DataFrame, pl.DataFrame, list[tuple[str, int]], list[tuple[int, str]]]:
    """All lines with their numbers, which of them take the fast lane, that lane's stats and request
    facts (spill schemas), representative lines for version inference, and the first and last fast
    line that states a time (``_timed_ends``). With ``known``, only the lines its templates left (its
    ``rest_raw``, one piece's or several's; ``lines`` is not read; the frame, flags and facts returned
    are theirs: the template lines' own request facts are spilled as they are read, ``_prepare``).

    Cheap tests (literal searches, anchored matches) run on every line, side by side in one lazy
    plan so that both cores work; the costly splits and extractions run only on the candidates."""
    raw = pl.col("raw")
    if known is None:
        df = pl.DataFrame({"raw": lines}).with_row_index("i").with_columns(line=pl.col("i").cast(pl.Int64) + first_no).drop("i")
    else:
        df = pl.DataFrame({"raw": known.rest_raw, "line": known.rest_no})
    # 'orig' is the line as the file has it (for the line-by-line parser and version clues), 'raw' the
    # line vLLM wrote, without a container runtime's or kubectl's envelope, and 'iso' that envelope's time
    df = df.with_columns(orig=raw, iso=pl.lit(None, dtype=pl.Utf8))
    if web:  # (a piece holds a no-break space, a zero-width space or a byte-order mark)
        df = _unweb(df)
    if json_lines:  # Docker's json-file log, vLLM's JSON logging (inside Docker's or not): the text inside
        df = _unotel(_unship(df))  # first (CRs and colour codes may come out of their escapes)
    # then, as the reference takes them out, every CR (a CRLF's, a progress bar's inside a line) and the
    # colour codes (vLLM colours its prefix on a terminal)
    if has_cr or json_lines:
        df = _take_out(df, "\r", "\r", literal=True)
    esc = has_esc or json_lines  # (whether any line can hold a colour code)
    if esc:
        for char in ESC_CHARS:
            df = _take_out(df, char, ANSI.pattern, literal=False)
    # an envelope never opens a message: on a plain log only the few lines that open none can hold one,
    # and they are read after the marks (then marked again, stripped); a piece that begins with one (a
    # runtime's own log file) is stripped whole first and marked once. So with colour codes that lost their
    # ESC (a line that opens with one opens no message: where a runtime's time comes first, the
    # line-by-line parser reads it)
    first = df["raw"][0] if df.height and known is None else None  # (with ``known``, the piece's first line has none)
    if first is not None and _ENVELOPED.match(first):
        df = _strip_envelopes(df, pl.int_range(0, df.height, dtype=pl.UInt32, eager=True))
        marks = _marks(df, esc)
    else:
        marks = _marks(df, esc)
        at = marks["opens"].not_().fill_null(False).arg_true()
        at = at.filter(df["raw"].gather(at).str.contains(_MAYBE_ENVELOPE))
        if at.len():
            df = _strip_envelopes(_take_out_bare_codes(df, at), at)
            again = _marks(df[at], esc)
            marks = marks.with_columns(marks[c].scatter(at, again[c]) for c in marks.columns)
    opens_next = marks["opens"].shift(-1).fill_null(False)
    if known is not None:  # (the next line may be a template's, which opens a message, or none of these)
        opens_next = (opens_next & known.adjacent) | known.before_classed
    clean = opens_next & ~marks["esc"]
    # (the frames below stay narrow: every filter copies every column; a line as the file has it is
    # fetched by its number for the few that represent the rest)
    cand, heads = _fields(df.select("line", "raw", "iso").filter(clean & marks["want"]))
    msg, unglued = pl.col("msg"), ~pl.col("msg").str.contains(_GLUED)  # (a request id is one word: never glued)
    folded = msg.str.contains(RAY_FOLD_MARK, literal=True)  # (Ray's '[repeated Nx …]': the reference's)
    st = _heads(cand.filter(msg.str.contains("KV cache usage", literal=True)).filter(unglued & ~folded),
                heads)  # (filtered in turn: an expression runs on every row it is given)
    st = st.lazy().with_columns(v0=msg.str.extract_groups(STATS_V0), v1=msg.str.extract_groups(STATS_V1),
                                tp=msg.str.extract_groups(THROUGHPUT)).collect()
    v0 = pl.col("v0").struct.field("kv").is_not_null()
    v1 = pl.col("v1").struct.field("kv").is_not_null()

    def pick(field: str) -> pl.Expr:
        return pl.when(v0).then(pl.col("v0").struct.field(field)).otherwise(pl.col("v1").struct.field(field))

    st = st.filter(v0 | v1).with_columns(
        kind=pl.lit("stats"), key_ts=pl.col("ts"), engine=pl.when(v0).then(pl.lit("v0")).otherwise(pl.lit("v1")),
        shape=pl.when(v0).then(pl.lit("stats_v0")).otherwise(pl.lit("stats_v1")),
    ).with_columns(h=_KEY)
    # a fact's time: the envelope's exact one where there is one (key_ts, for repeats, stays vLLM's own)
    # (vLLM's own, where the envelopes are a copy's: ``vllm_log.envelope_dump``)
    ts_exact = ({"ts": pl.col("ts"), "t_exact": pl.lit(None, dtype=pl.Int64)} if df["iso"].null_count() == df.height
                or logged_first else {"ts": pl.coalesce("iso", "ts"), "t_exact": iso_us(pl.col("iso"))})
    stats = st.select(
        "line", "rank", **ts_exact, engine="engine", h="h", repeatable=pl.lit(True),
        dp=pl.when(~v0).then(msg.str.extract(R_DP.pattern, 1)),
        running=pick("running").cast(pl.Float64), waiting=pick("waiting").cast(pl.Float64),
        swapped=pl.when(v0).then(pl.col("v0").struct.field("swapped")).cast(pl.Float64),
        preemptions=pl.when(~v0).then(pl.col("v1").struct.field("pre")).cast(pl.Float64),
        kv_usage_pct=_num(pick("kv")), cpu_kv_usage_pct=_num(pl.when(v0).then(pl.col("v0").struct.field("cpu_kv"))),
        prompt_tps=_num(pl.col("tp").struct.field("ptps")), gen_tps=_num(pl.col("tp").struct.field("gtps")),
        prefix_cache_hit_pct=_num(msg.str.extract(PREFIX_HIT, 1)), mm_cache_hit_pct=_num(msg.str.extract(MM_HIT, 1)))
    # Added / Finished lines (split, not matched: a capture per line is slow); the id is one word after
    # the verb, without its full stop
    added, rid = msg.str.starts_with("Added request "), pl.col("request_id")
    off = pl.when("added").then(14).otherwise(17)  # (one slice: cut at the full stop too)
    rq = cand.lazy().filter(added | msg.str.starts_with("Finished request ")).with_columns(added=added).with_columns(
        request_id=msg.str.slice(off, msg.str.len_chars() - off - msg.str.ends_with(".").cast(pl.Int64)),
    ).filter(rid != "").collect()
    # no white space in the id (Python's \s has \x1c-\x1f too): in an ASCII id, one of these bytes (a
    # third of the cost of the Unicode class, which only the others need)
    ids = rq["request_id"]
    spaced = ids.str.contains(r"(?-u)[\t-\r\x1c- ]")
    wide = ids.str.len_bytes() != ids.str.len_chars()
    if wide.any():
        spaced = spaced | (wide & ids.str.contains(r"[\s\x1c-\x1f]"))
    if spaced.any():
        rq = rq.filter(~spaced)
    kind = pl.when("added").then(pl.lit("request_added")).otherwise(pl.lit("request_finished"))
    # (request facts' repeat keys, and the rank that only they need)
    keyed = {"rank": pl.col("rank"), "h": pl.col("h"), "repeatable": pl.lit(True)} if request_keys else {}
    if request_keys:
        head_key = heads.select(pl.col("rank").hash(seed=KEY_SEEDS["rank"]).xor(pl.col("ts").hash(seed=KEY_SEEDS["ts"])))[:, 0]
        rq = _heads(rq, heads.select("rank", "ts")).with_columns(kind=kind)
        rq = rq.with_columns(h=_key(pl.lit(head_key.gather(rq["pid"]))))
    else:
        rq = _heads(rq, heads.select("ts")).with_columns(kind=kind)
    requests = rq.select("line", **ts_exact, kind=pl.col("kind").cast(REQUEST_KINDS), **keyed,
                         request_id="request_id", rh=ID_HASH)  # no REQUEST_DETAILS
    # (a prompt that quotes a stats line makes the reference read a stats fact there, and nothing else)
    rv = cand.filter(msg.str.starts_with("Received request "))
    rv = _received_by_slices(_heads(rv.filter(unglued & ~folded & ~pl.col("line").is_in(st["line"].implode())), heads),
                             keep_prompts) \
        if rv.height else rv.select("line", proc=pl.lit(None, dtype=pl.Utf8), fl=pl.lit(None, dtype=pl.Utf8))
    if rv.height:  # (their details: the pieces without them keep the slim schema)
        requests = pl.concat([requests, rv.select("line", **ts_exact, kind=pl.col("kind").cast(REQUEST_KINDS), **keyed,
                                                   request_id="request_id", rh=ID_HASH, **{k: k for k in REQUEST_DETAILS})],
                             how="diagonal_relaxed").sort("line")
    ac = df.select("line", "raw", "iso").filter(clean & marks["ac"])
    ac = ac.filter(pl.col("raw").str.contains(ACCESS))
    lines_fast = pl.concat([st["line"], rq["line"], rv["line"], ac["line"]])
    is_fast = pl.zeros(df.height, pl.Boolean, eager=True).scatter(_rows(df, lines_fast, first_no, known), True)
    # every other clean, strictly shaped line whose message can say nothing (startup chatter, DEBUG
    # logging): parsed, with no fact
    gen = df.select("line", "raw", "iso").filter(clean & ~is_fast)
    if gen.height:
        gen, gheads = _fields(gen, STRICT_ANY)
        gen = gen.filter(inert(pl.col("msg")))
        is_fast = is_fast.scatter(_rows(df, gen["line"], first_no, known), True)
    ends = _timed_ends([st, rq, rv, ac.filter(pl.col("iso").is_not_null()),
                        _heads(gen[[0, -1]], gheads.select("ts")) if gen.height else gen,
                        *([known.timed] if known is not None else [])], logged_first)
    # one row per (process, call site, shape) of this piece, with its first line and how many lines it
    # stands for; the many request and access lines are counted per prefix or process first (a piece
    # pays a fixed cost for every operation, so the shapes it lacks are skipped)
    reps: list[pl.DataFrame] = [known.reps] if known is not None and known.reps.height else []
    if st.height:
        reps.append(st.group_by("proc", "fl", kind="shape", msg=pl.col("msg").str.slice(0, 7)).agg(
            pl.col("line").first(), pl.len().alias("n")))
    if rq.height:
        by_prefix = rq.group_by("pid", "added").agg(pl.col("line").first(), pl.len().alias("n"))
        reps.append(_heads(by_prefix, heads).group_by("proc", "fl", "added").agg(pl.col("line").first(), pl.col("n").sum())
                    .select("proc", "fl", "line", "n", msg=pl.lit(""),
                            kind=pl.when("added").then(pl.lit("Added")).otherwise(pl.lit("Finished"))))
    if ac.height:
        opened = ac["raw"].str.starts_with("(")  # (a process prefix is read only where there is one)
        by_proc = [ac.filter(opened).group_by(proc=pl.col("raw").str.extract(r"^\(([^)]*)\)", 1)).agg(
            pl.col("line").first(), pl.len().alias("n"))] if opened.any() else []
        if not opened.all():
            by_proc.append(pl.DataFrame({"proc": [None], "line": [ac.filter(~opened)["line"][0]], "n": [(~opened).sum()]},
                                        schema={"proc": pl.Utf8, "line": pl.Int64, "n": pl.UInt32}))
        reps += [g.with_columns(fl=pl.lit(None, dtype=pl.Utf8), kind=pl.lit("access"), msg=pl.lit("")) for g in by_proc]
    if rv.height:
        reps.append(rv.group_by("proc", "fl", "kind").agg(pl.col("line").first(), pl.len().alias("n")).with_columns(msg=pl.lit("")))
    if gen.height:
        reps.append(_heads(gen.group_by("pid").agg(pl.col("line").first(), pl.len().alias("n")), gheads)
                    .group_by("proc", "fl").agg(pl.col("line").first(), pl.col("n").sum())
                    .with_columns(kind=pl.lit("inert"), msg=pl.lit("")))
    if not reps:
        return df, is_fast, stats, requests, [], ends
    g = pl.concat(reps, how="diagonal_relaxed")
    if df.height:  # (each the line as the file has it; a template's carries its own)
        own = pl.lit(df["orig"].gather(df["line"].search_sorted(g["line"]).clip(0, df.height - 1)))
        g = g.with_columns(orig=pl.coalesce("orig", own) if "orig" in g.columns else own)
    return df, is_fast, stats, requests, _representatives(g), ends


@dataclass(frozen=True)
class _Shape:
    """How the fast lane reads every line equal to a template: what their prefix says, and where the
    parts that vary sit (character offsets; -1 where a line has no such part)."""

    code: int  # the template's class (``scan``'s)
    kind: str  # its representatives' kind ('Added', 'Finished', 'access', 'inert')
    proc: str | None
    fl: str | None
    rank: str
    ts_at: int  # vLLM's 'MM-DD HH:MM:SS'
    msg_at: int
    msg_len: int
    id_at: int  # a request line's id
    id_len: int


TS_CHARS = len("05-19 10:13:01")


@functools.lru_cache(maxsize=4096)
def _shape(t: Template) -> _Shape | None:
    """How the lines equal to ``t`` read, where this lane reads its line as the scanner classes it (a
    fact-less line, an access line, an Added or Finished line with its id); else None (its lines are
    classified as any other)."""
    from replay.record import scan
    try:
        text = t.text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(c in text for c in (*ESC_CHARS, NBSP, *INVISIBLE, BOX, "\r")):  # (what this lane takes out of a line first)
        return None
    one = pl.Series("raw", [text])
    if t.code == scan.ACCESS:
        if not one.str.contains(ACCESS)[0]:
            return None
        return _Shape(t.code, "access", one.str.extract(r"^\(([^)]*)\)", 1)[0], None, "", -1, -1, -1, -1, -1)
    if t.code not in (scan.INERT, scan.ADDED, scan.FINISHED):
        return None
    lines, heads = _fields(pl.DataFrame({"line": [0], "raw": one, "iso": pl.Series([None], dtype=pl.Utf8)}),
                           STRICT_ANY if t.code == scan.INERT else _STRICT)
    head = scan._HEAD_TIME.match(t.text)
    if not lines.height or head is None:
        return None
    msg, (proc, fl, rank, ts) = str(lines["msg"][0]), heads.row(int(lines["pid"][0]))
    ts_at, msg_at = len(t.text[:head.start(1)].decode()), text.find("] ") + 2
    if text[ts_at:ts_at + TS_CHARS] != ts or text[msg_at:msg_at + len(msg)] != msg:
        return None
    kind = {scan.INERT: "inert", scan.ADDED: "Added", scan.FINISHED: "Finished"}[t.code]
    shape = _Shape(t.code, kind, proc, fl, rank, ts_at, msg_at, len(msg), -1, -1)
    if t.code == scan.INERT:
        return shape if pl.select(inert(pl.lit(msg))).item() else None
    verb = "Added request " if t.code == scan.ADDED else "Finished request "
    rid = msg[len(verb):len(msg) - msg.endswith(".")]
    if not msg.startswith(verb) or not rid or any(c.isspace() or "\x1c" <= c <= "\x1f" for c in rid):
        return None
    return dataclasses.replace(shape, id_at=msg_at + len(verb), id_len=len(rid))


@dataclass(frozen=True)
class _Templated:
    """A piece's lines that equal a template this lane reads by its shape (``_Shape``), what they say,
    and where the other lines (``rest``, classified as before) sit among them."""

    classed: pl.Series  # per line of the piece: read by its template
    rest: pl.Series  # the others' places in the piece
    rest_raw: pl.Series  # the others' text (an empty line may be null, as ``_lines`` gives it)
    rest_no: pl.Series  # the others' line numbers
    adjacent: pl.Series  # per rest line: the next line is the next rest line
    before_classed: pl.Series  # per rest line: the next line is a template's (which opens a message)
    requests: pl.DataFrame  # their request facts (spill schema)
    reps: pl.DataFrame  # a representative line a template, with its count and its text (``orig``)
    timed: pl.DataFrame  # line, ts, iso of the first and the last of them that state a time
    n: int

    @staticmethod
    def joined(parts: list[_Templated]) -> _Templated:
        """Consecutive pieces' as one (their lines one after another), less their request facts (spilled
        a piece at a time: ``_Partial``)."""
        at = itertools.accumulate((len(p.classed) for p in parts[:-1]), initial=0)
        return _Templated(
            classed=pl.concat([p.classed for p in parts]),
            rest=pl.concat([p.rest + int(o) for p, o in zip(parts, at, strict=True)]),
            rest_raw=pl.concat([p.rest_raw for p in parts]), rest_no=pl.concat([p.rest_no for p in parts]),
            adjacent=pl.concat([p.adjacent for p in parts]), before_classed=pl.concat([p.before_classed for p in parts]),
            requests=parts[0].requests.clear(), reps=pl.concat([p.reps for p in parts]),
            timed=pl.concat([p.timed for p in parts]), n=sum(p.n for p in parts))


def _templated(lines: pl.Series, pc: PieceClasses, first_no: int, request_keys: bool) -> _Templated:
    """What the lines of a piece that equal a template (``pc``) say, read at their shape's offsets."""
    import numpy as np

    from replay.record import scan
    shapes = [_shape(t) for t in pc.templates]
    usable = np.array([s is not None for s in shapes] + [False], dtype=bool)  # (a line of no template: -1, the last)
    classed = usable[pc.which]
    rest, at = np.flatnonzero(~classed), np.flatnonzero(classed)
    w, codes = pc.which[at], pc.codes[at]
    count = np.bincount(w, minlength=len(shapes))
    first = np.zeros(len(shapes), np.int64)
    first[w[::-1]] = at[::-1]  # (the last write of a place is its first line)
    used = [cast(_Shape, shapes[k]) for k in np.flatnonzero(count)]
    reps = pl.DataFrame({"proc": [s.proc for s in used], "fl": [s.fl for s in used],
                         "line": first[count > 0] + first_no, "n": count[count > 0].astype(np.uint32),
                         "kind": [s.kind for s in used], "msg": [""] * len(used),
                         "orig": lines.gather(pl.Series(first[count > 0], dtype=pl.UInt32))},
                        schema={"proc": pl.Utf8, "fl": pl.Utf8, "line": pl.Int64, "n": pl.UInt32, "kind": pl.Utf8, "msg": pl.Utf8,
                                "orig": pl.Utf8})
    timed_at = at[codes != scan.ACCESS][[0, -1]] if (codes != scan.ACCESS).any() else at[:0]
    ts = [str(lines[int(i)])[cast(_Shape, shapes[pc.which[i]]).ts_at:][:TS_CHARS] for i in timed_at]
    rq = np.isin(codes, (scan.ADDED, scan.FINISHED))
    rest_at = pl.Series(rest, dtype=pl.UInt32)
    return _Templated(
        classed=pl.Series(classed), rest=rest_at, rest_raw=lines.gather(rest_at),
        rest_no=pl.Series(rest.astype(np.int64) + first_no, dtype=pl.Int64),
        adjacent=pl.Series(np.append(np.diff(rest) == 1, False)), before_classed=pl.Series(np.append(classed[1:], False)[rest]),
        requests=_template_requests(lines, at[rq], w[rq], shapes, first_no, request_keys),
        reps=reps, timed=pl.DataFrame({"line": timed_at.astype(np.int64) + first_no, "ts": ts, "iso": [None] * len(ts)},
                                      schema={"line": pl.Int64, "ts": pl.Utf8, "iso": pl.Utf8}),
        n=len(at))


def _template_requests(lines: pl.Series, at: npt.NDArray[np.intp], w: npt.NDArray[np.int32], shapes: list[_Shape | None],
                       first_no: int, request_keys: bool) -> pl.DataFrame:
    """The request facts of Added and Finished lines (``at`` in the piece, of templates ``w``) read at their
    template's offsets, as ``_classify`` gives them (the repeat key's rank and kind hashed once a template)."""
    import numpy as np

    def per(f: str) -> npt.NDArray[np.int64]:
        return np.array([getattr(s, f) if s is not None else -1 for s in shapes], np.int64)[w]
    kinds = [("request_added" if s.kind == "Added" else "request_finished") if s is not None else "request_added" for s in shapes]
    ranks = pl.Series([s.rank if s is not None else "" for s in shapes], dtype=pl.Utf8)
    rank_kind = (ranks.hash(seed=KEY_SEEDS["rank"]) ^ pl.Series(kinds).hash(seed=KEY_SEEDS["kind"])).to_numpy()
    ws = pl.Series(w, dtype=pl.UInt32)
    s = pl.col("s")
    rq = pl.DataFrame({"line": at.astype(np.int64) + first_no, "s": lines.gather(pl.Series(at, dtype=pl.UInt32)),
                       **{f: per(f) for f in ("ts_at", "id_at", "id_len", *(("msg_at", "msg_len") if request_keys else ()))}})
    rq = rq.with_columns(ts=s.str.slice("ts_at", TS_CHARS), request_id=s.str.slice("id_at", "id_len"),
                         **({"msg": s.str.slice("msg_at", "msg_len")} if request_keys else {}))  # (the message: for the key alone)
    keyed: dict[str, pl.Expr | pl.Series] = {"rank": ranks.gather(ws), "h": pl.lit(pl.Series(rank_kind[w])).xor(
        pl.col("ts").hash(seed=KEY_SEEDS["ts"])).xor(pl.col("msg").hash(seed=KEY_SEEDS["msg"])), "repeatable": pl.lit(True)} if request_keys else {}
    return rq.select("line", "ts", t_exact=pl.lit(None, dtype=pl.Int64), kind=pl.Series(kinds, dtype=REQUEST_KINDS).gather(ws),
                     **keyed, request_id="request_id", rh=ID_HASH)


def _rows(df: pl.DataFrame, lines: pl.Series, first_no: int, known: _Templated | None) -> pl.Series:
    """The rows of ``df`` (a piece's lines, or with ``known`` the rest of them) that hold ``lines``."""
    return lines - first_no if known is None else df["line"].search_sorted(lines)


def _timed_ends(frames: list[pl.DataFrame], logged_first: bool = False) -> list[tuple[int, str]]:
    """(line, time) of the first and the last line of ``frames`` (fast lines, each frame in line order)
    that states a time: an envelope's, else vLLM's own, as a fact of the line would take it (vLLM's own
    alone, ``logged_first``, where the envelopes are a copy's)."""
    got: list[tuple[int, str]] = []
    for f in frames:
        if f.height:
            when = (pl.col("ts") if "ts" in f.columns else pl.lit(None, dtype=pl.Utf8)) if logged_first else (
                pl.coalesce("iso", "ts") if "ts" in f.columns else pl.col("iso"))
            t = f.select("line", t=when).drop_nulls()
            if t.height:
                got += [(int(t["line"][0]), str(t["t"][0])), (int(t["line"][-1]), str(t["t"][-1]))]
    return [min(got, key=lambda e: e[0]), max(got, key=lambda e: e[0])] if got else []


def _representatives(g: pl.DataFrame) -> list[tuple[str, int]]:
    """One real line per (process kind, call site, shape) with its count, for version inference."""
    if g.height == 0:
        return []
    g = g.group_by(pl.col("proc").str.replace_all(r"\d+", "0"), "fl", "kind", "msg").agg(pl.col("orig").first(), pl.col("n").sum())
    return [(str(r), int(n)) for r, n in g.select("orig", "n").iter_rows()]


@dataclass
class _Piece:
    """What the vectorised lane makes of one piece, before the line-by-line parser sees the rest."""

    slow: pl.DataFrame  # line, raw, prev (the line before took the fast lane; null for the first)
    last_fast: bool
    fast_lines: int
    files: list[_Spilled]  # this piece's fast-lane stats and request facts
    representatives: list[tuple[str, int]]
    long_line: LongLine | None = None  # the piece is this one line, too long to read
    timed_ends: list[tuple[int, str]] = field(default_factory=list)  # of its fast lines (``_timed_ends``)
    template_lines: int = 0  # of ``fast_lines``: read by their template's shape


@dataclass
class _Partial:
    """A piece whose lines that equal a template are read (their request facts spilled), the others
    (``known.rest``: a stats line, a piece's last line, a start's chatter; a few hundred of 160,000) not
    yet classified: they are, with those of the pieces after it (``_rest_piece``). Classifying them a
    piece at a time cost ~23 ms a piece whatever their number, a fifth of a log's reading; 8 pieces'
    at once cost 4 ms a piece."""

    known: _Templated
    files: _Spilled  # the template lines' request facts
    has_cr: bool  # what the piece holds, as ``_classify`` is told it
    esc: bool
    web: bool
    rest_bytes: int  # what the lines left to classify hold: their text, and REST_LINE_BYTES a line


REST_PIECES = 8  # pieces whose other lines are classified at once (their templated lines are spilled as read),
REST_BYTES = CHUNK_BYTES  # as long as those lines hold no more than a piece (a log of V0's request lines leaves
# most of each piece, and a run of empty lines all of it: such a piece is classified alone, as before, in the
# memory a piece took)
REST_LINE_BYTES = 32  # a line's own cost in the frames it is classified in (its place, number and marks)


def _prepare(piece: bytes, start: Future[int], end: Future[int], tag: str, spill: Path,
             keep_prompts: bool = False, request_keys: bool = True, logged_first: bool = False,
             scanner: PieceScanner | None = None) -> tuple[_Piece | _Partial, int, int]:
    """The vectorised lane's work on one piece (in a worker thread): cut its lines, number them from
    the line after the last piece's (``start``, which this publishes in ``end`` for the next as soon
    as it has cut them), classify, spill the fast facts. Returns the piece, its first line number and
    its lines. With ``scanner``, a plain piece's lines that equal a template are read by its shape,
    and the others are left to be classified with the next pieces' (a ``_Partial``)."""
    try:
        has_cr = b"\r" in piece
        lines, exact = _lines(piece, has_cr)
        first_no = start.result()
    except BaseException as e:  # the pieces after this one learn of it instead of waiting forever
        end.set_exception(e)
        raise
    end.set_result(first_no + len(lines))
    # a log of JSON lines (Docker's json-file, vLLM's JSON logging) is one from its first line: a search
    # for a longer string than a byte costs as much as a pass over the lines (JSON lines among text
    # lines take the line-by-line parser)
    second = piece.find(b"\n") + 1
    json_lines = piece.startswith(b"{") or piece.startswith(b"{", second)
    # (so are colour codes and a web page's spaces looked for: by a byte, at memory speed, which most
    # pieces lack: the ESC, a caret, the first byte of each character; the lines that hold them are told
    # apart in polars, without the GIL; an ASCII piece holds none of those characters)
    esc = b"\x1b" in piece or b"^" in piece or (b"#" in piece and b"#033[" in piece)
    web = not piece.isascii() and any(c[:1] in piece for c in WEB_BYTES)
    known = None
    if scanner is not None and not json_lines and not _ENVELOPED.match(lines[0] or ""):  # (the scanner reads vLLM's own lines)
        pc = scanner.classify(piece, *((_line_ends(lines), functools.partial(_strict_heads, lines)) if exact
                                       else (None, None)))  # (its LFs found again otherwise, its heads one by one)
        if len(pc.codes) == len(lines):
            known = _templated(lines, pc, first_no, request_keys)
            files = _write_facts((pl.DataFrame(), known.requests), f"{tag}.t", spill)
            return (_Partial(dataclasses.replace(known, requests=known.requests.clear()), files, has_cr, esc, web,
                             int(known.rest_raw.str.len_bytes().sum() or 0) + REST_LINE_BYTES * known.rest.len()),
                    first_no, len(lines))
    df, is_fast, st, rq, reps, ends = _classify(lines, first_no, has_cr, keep_prompts, esc, json_lines, request_keys, web,
                                                logged_first)
    slow = df.select("line", raw="orig").with_columns(prev=is_fast.shift(1)).filter(~is_fast).with_columns(
        pl.col("raw").fill_null(""))
    return (_Piece(slow, bool(is_fast[-1]), int(is_fast.sum()), [_write_facts((st, rq), f"{tag}.a", spill)], reps,
                   timed_ends=ends), first_no, len(lines))


def _rest_piece(parts: list[_Partial], tag: str, spill: Path, keep_prompts: bool, request_keys: bool,
                logged_first: bool) -> _Piece:
    """Consecutive pieces' lines left by their templates, classified at once (``_classify``), and the
    pieces as one (a colour code, a CR or a web page's space in one is looked for in all: each is taken
    out only of the lines that hold it)."""
    known = _Templated.joined([p.known for p in parts])
    df, is_fast, st, rq, reps, ends = _classify(known.rest_raw, int(known.rest_no[0]) if known.rest_no.len() else 0,
                                                any(p.has_cr for p in parts), keep_prompts, any(p.esc for p in parts),
                                                False, request_keys, any(p.web for p in parts), logged_first, known)
    every = known.classed.scatter(known.rest, is_fast)  # (each line of the pieces)
    slow = df.select("line", raw="orig").with_columns(prev=every.shift(1).gather(known.rest)).filter(~is_fast).with_columns(
        pl.col("raw").fill_null(""))
    return _Piece(slow, bool(every[-1]), int(every.sum()), [*(p.files for p in parts), _write_facts((st, rq), f"{tag}.a", spill)],
                  reps, timed_ends=ends, template_lines=known.n)


def parse_log_file(path: Path, spill: Path, chunk_bytes: int | None = None, keep_prompts: bool = False,
                   progress: Callable[[int], None] | None = None, hasher: Any = None,
                   request_repeats: bool = True, templates: bool | None = None,
                   workers: int = WORKERS) -> tuple[LogParse, FastFacts]:
    """Parse a vLLM log file in bounded pieces. Stats and request facts of both lanes end up in the
    returned FastFacts (columnar, on disk under ``spill``), every other fact and the file's counts,
    version and engine in the LogParse.

    Repeated lines are dropped as the reference parser drops them. With ``request_repeats`` False,
    request facts keep theirs (and ``duplicates`` does not count them): a request's row takes its
    first arrival and earliest finish, which repeats do not change, and finding them is a pass over
    every request fact of the log, its slowest after parsing. The vectorised lane's request facts
    then leave out their repeat key and rank (nothing reads them): hashing every request line's
    message and spilling 25 bytes more a fact.

    The vectorised lane prepares the next pieces in worker threads (polars releases the GIL) while
    this thread feeds the line-by-line parser and spills the piece before them, in order: at most
    ``workers`` + 2 pieces are in memory, and the lines their templates left of up to REST_PIECES
    pieces before them (while those hold REST_BYTES or less), which this thread classifies at once. With ``hasher``, the file as given is hashed as it is read. Lines
    are read by templates where ``templates`` says, else in a file of TEMPLATE_MIN_BYTES or more."""
    spill.mkdir(parents=True, exist_ok=True)
    parser = LogParser(defer_repeats=True)
    ff = FastFacts()
    from replay.record.scan import PieceScanner
    big = path.stat().st_size >= TEMPLATE_MIN_BYTES
    scanner = PieceScanner() if (big if templates is None else templates) else None
    prev_fast = False
    seen = 0  # res.facts before this index hold no stats or request facts

    def numbered() -> Iterator[tuple[bytes | LongLine, Future[int], Future[int]]]:
        """Each piece with the future of its first line number and of the next piece's; the first tells,
        before any is prepared, whether the envelopes' times are a copy's (``envelope_dump``)."""
        start: Future[int] = Future()
        start.set_result(1)
        for piece in _head_read(text_pieces(path, chunk_bytes or CHUNK_BYTES, hasher, MAX_LINE_BYTES), parser):
            end: Future[int] = Future()
            yield piece, start, end
            start = end

    def prepare(item: tuple[int, tuple[bytes | LongLine, Future[int], Future[int]]]) -> tuple[_Piece | _Partial, int, int, int]:
        k, (piece, start, end) = item
        if isinstance(piece, LongLine):
            try:
                no = start.result()
            except BaseException as e:
                end.set_exception(e)
                raise
            end.set_result(no + 1)
            return (_Piece(pl.DataFrame(), False, 0, [], [], piece), no, 1,
                    piece.n_bytes + 1)
        return (*_prepare(piece, start, end, f"{k:06d}", spill, keep_prompts, request_repeats, parser.logged_first,
                          scanner), len(piece))

    def take(p: _Piece, first_no: int, n: int, tag: str) -> None:
        """A piece's (or pieces') lines given to the line-by-line parser in order, its facts to ``ff``."""
        nonlocal prev_fast, seen
        if p.long_line is not None:  # (it ends any message open before it, as a fast line does)
            parser.barrier()
            parser.res.quarantine.append((first_no, p.long_line.note(),
                                          p.long_line.head.decode("utf-8", errors="replace")))
            parser.res.lines_read = max(parser.res.lines_read, first_no)
            prev_fast = True
            return
        # the line-by-line parser gets every other line, in order, with a barrier after fast ones
        for no, raw, after_fast in p.slow.iter_rows():
            if after_fast if after_fast is not None else prev_fast:
                parser.barrier()
            parser.feed(int(no), str(raw))
        prev_fast = p.last_fast
        if prev_fast:
            parser.barrier()
        if p.fast_lines:
            ff.lines += p.fast_lines
            ff.template_lines += p.template_lines
            parser.res.lines_parsed += p.fast_lines
            parser.res.lines_read = max(parser.res.lines_read, first_no + n - 1)
            for raw, weight in p.representatives:
                for ln in split_line(0, raw):
                    parser.observe(ln, weight)
            parser.res.timed_ends += p.timed_ends
        for files in p.files:
            _add_files(ff, files)
        _add_files(ff, _write_facts(_slow_frames(parser.res, keep_prompts, seen), f"{tag}.b", spill), slow=True)
        seen = max(0, len(parser.res.facts) - 8)  # the last few facts may still take continuation lines

    held: list[tuple[_Partial, int, int]] = []  # pieces whose other lines wait to be classified with the next ones'

    def take_held(tag: str) -> None:
        if held:
            take(_rest_piece([p for p, _, _ in held], tag, spill, keep_prompts, request_repeats, parser.logged_first),
                 held[0][1], sum(n for _, _, n in held), tag)
            held.clear()

    # (closed as the loop is left, an error's way too: its threads end before the error's cleanup removes the
    # spill they write into; left to the collector, a piece spilled after that cleanup was left behind)
    with contextlib.closing(ordered_map(prepare, enumerate(numbered()), workers=workers, ahead=workers + 1)) as prepared:
        for k, (p, first_no, n, size) in enumerate(prepared):
            if progress is not None:
                progress(size)
            if isinstance(p, _Partial):
                if held and sum(q.rest_bytes for q, _, _ in held) + p.rest_bytes > REST_BYTES:
                    take_held(f"{k:06d}.h")
                held.append((p, first_no, n))
                if len(held) == REST_PIECES:
                    take_held(f"{k:06d}")
                continue
            take_held(f"{k:06d}.h")
            take(p, first_no, n, f"{k:06d}")
    take_held("last")
    res = parser.finish()
    ends = res.timed_ends  # (of both lanes; the parts of a line glued from several messages, in their order)
    res.timed_ends = [min(ends, key=lambda e: e[0]), max(reversed(ends), key=lambda e: e[0])] if ends else []
    _add_files(ff, _write_facts(_slow_frames(res, keep_prompts, seen), "end", spill), slow=True)
    _drop_repeats(ff, res, ("stats", "requests") if request_repeats else ("stats",))
    return res, ff


def _head_read(pieces: Iterator[bytes | LongLine], parser: LogParser) -> Iterator[bytes | LongLine]:
    """``pieces``, once the parser has read the log's head (``LogParser.head``): the first pieces are held
    until they hold the head's characters whatever their bytes (4 bytes a character at most), or a line
    too long to read ends them."""
    held: list[bytes | LongLine] = []
    size = 0
    for piece in pieces:
        held.append(piece)
        size += len(piece) if isinstance(piece, bytes) else DUMP_HEAD_CHARS * 4
        if size >= DUMP_HEAD_CHARS * 4:
            break
    head = bytearray()  # (the head's bytes alone: a whole first piece is 16 MiB)
    for p in held:
        if not isinstance(p, bytes) or len(head) >= DUMP_HEAD_CHARS * 4:
            break
        head += p[:DUMP_HEAD_CHARS * 4 - len(head)]
    parser.head(dump_head(head.decode("utf-8", errors="replace").split("\n")))
    yield from held
    yield from pieces


def _exact(ts: str | None) -> int | None:
    """Epoch µs for an ISO container timestamp (exact, no year needed); None for a logged 'MM-DD' time."""
    return fact_time_us(ts, 1970) if ts and "T" in ts else None


def _slow_frames(res: LogParse, keep_prompts: bool = False, start: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Take the reference parser's stats and request facts out of ``res.facts[start:]`` as frames."""
    tail = res.facts[start:]
    st = [f for f in tail if f.kind == "stats"]
    rq = [f for f in tail if f.kind.startswith("request_")]
    if not st and not rq:
        return pl.DataFrame(schema=_STATS_COLS), pl.DataFrame(schema=_REQUEST_COLS)
    res.facts[start:] = [f for f in tail if f.kind != "stats" and not f.kind.startswith("request_")]

    def base(fs: list[LogFact]) -> dict[str, list[Any]]:
        return {"line": [f.line for f in fs], "rank": [f.rank for f in fs], "ts": [f.ts for f in fs],
                "t_exact": [_exact(f.ts) for f in fs], "key_ts": [f.key_ts for f in fs], "kind": [f.kind for f in fs],
                "msg": [f.text for f in fs], "repeatable": [f.logged_ts or f.kind != "stats" for f in fs]}

    keys = ("engine", "dp", "running", "waiting", "swapped", "preemptions", "kv_usage_pct", "cpu_kv_usage_pct",
            "prompt_tps", "gen_tps", "prefix_cache_hit_pct", "mm_cache_hit_pct")
    sdf = pl.DataFrame({**base(st), **{k: [f.data.get(k) for f in st] for k in keys}},
                       schema_overrides={**_STATS_COLS, "key_ts": pl.Utf8, "msg": pl.Utf8, "kind": pl.Utf8})
    for f in rq:  # the prompt leaves the parser only as its length and hash, unless --keep-prompts
        text = f.data.get("prompt")
        if text is not None:
            f.data["prompt_chars"] = len(text)
            f.data["prompt_sha256"] = hashlib.sha256(text.encode()).hexdigest()
            if not keep_prompts:
                f.data["prompt"] = None
    rdf = pl.DataFrame({**base(rq), "request_id": [f.data["request_id"] for f in rq],
                        **{k: [f.data.get(k) for f in rq] for k in REQUEST_DETAILS}},
                       schema_overrides={**{k: v for k, v in _REQUEST_COLS.items() if k != "rh"}, "kind": pl.Utf8, "key_ts": pl.Utf8,
                                         "msg": pl.Utf8})
    return (sdf.with_columns(h=_KEY).select(list(_STATS_COLS)), rdf.with_columns(h=_KEY, rh=ID_HASH).select(list(_REQUEST_COLS))
            .with_columns(pl.col("kind").cast(REQUEST_KINDS)))


@dataclass
class _Spilled:
    stats: Path | None
    requests: Path | None
    request_ends: list[tuple[int, str]]  # (line, ts) of its first and last request fact
    request_rows: int = 0
    request_times: TimeEnds | None = None


def _write_facts(frames: tuple[pl.DataFrame, pl.DataFrame], tag: str, spill: Path) -> _Spilled:
    """Write stats and request facts (each in line order) to their own files; None where there are none.
    A request file leaves out ``t_exact`` where no line had a time of a container runtime's (most logs:
    8 of each fact's ~110 bytes), which then reads as nulls (``scan_requests``)."""
    out: list[Path | None] = []
    for name, df in zip(("stats", "requests"), frames, strict=True):
        f = spill / f"{name}.{tag}.arrow"
        if name == "requests" and df.height and df["t_exact"].null_count() == df.height:
            df = df.drop("t_exact")
        if df.height:
            df.write_ipc(f)
        out.append(f if df.height else None)
    rq = frames[1]
    ends = [(int(rq["line"][i]), str(rq["ts"][i])) for i in (0, -1) if rq["ts"][i] is not None] if rq.height else []
    return _Spilled(out[0], out[1], ends, rq.height, time_ends(rq) if rq.height else None)


def _add_files(ff: FastFacts, files: _Spilled, slow: bool = False) -> None:
    if files.stats is not None:
        ff.stats.append(files.stats)
    if files.requests is not None:
        ff.requests.append(files.requests)
        ff.request_ends += files.request_ends
        ff.request_rows[files.requests] = files.request_rows
        if files.request_times is not None:
            ff.request_times[files.requests] = files.request_times
        if slow:
            ff.slow_requests.append(files.requests)


def _repeats(facts: pl.DataFrame) -> pl.DataFrame:
    """The places (fid, row) of the repeats among ``facts`` (line, h, row, fid): each fact whose key hash
    a fact before it (by line, then place) has. Only the facts whose hash comes twice are sorted by line,
    found from their hashes alone sorted (a sort of every fact by line was the most of this pass's time)."""
    hs = facts["h"].sort()
    twice = hs.filter(hs == hs.shift(1))
    if not twice.len():
        return facts.select("fid", "row").clear()
    return (facts.filter(pl.col("h").is_in(twice.implode())).sort("line", "fid", "row")
            .filter(~pl.col("h").is_first_distinct()).select("fid", "row"))


def _drop_repeats(ff: FastFacts, res: LogParse, names: tuple[str, ...] = ("stats", "requests")) -> None:
    """A line repeated identically within a rank (overlapping pastes) is one fact: keep the first.
    Only each fact's line, key hash and place (file, row) are held in memory for this, never the
    facts, and only a bucket of them (by hash) at a time, so memory does not grow with the log. (A
    place, not a line, names the copy to drop: a message glued twice onto one line keeps one copy,
    and the two copies may sit in two files.)"""
    for name in names:
        files: list[Path] = getattr(ff, name)
        if not files:
            continue
        keys = pl.concat([pl.scan_ipc(f).with_row_index("row").filter("repeatable").select(
            "line", "h", "row", fid=pl.lit(i, dtype=pl.UInt32)) for i, f in enumerate(files)])
        nb = buckets_for(int(keys.select(pl.len()).collect().item()) * 3 // 16)  # 24 bytes a fact
        drop = pl.concat([  # repeats share their key hash, so each bucket of hashes is judged on its own
            _repeats((keys.filter(pl.col("h") % nb == b) if nb > 1 else keys).collect()) for b in range(nb)])
        res.duplicates += drop.height
        for (i,), rows in drop.partition_by("fid", as_dict=True).items() if drop.height else []:
            f = files[int(i)]  # rewrite only the pieces that hold a repeat
            tmp = f.with_suffix(".tmp")
            pl.scan_ipc(f).with_row_index("row").join(rows.lazy().select("row"), on="row", how="anti",
                                                      maintain_order="left").drop("row").sink_ipc(tmp)
            tmp.replace(f)
            ff.request_rows.pop(f, None)
            ff.request_times.pop(f, None)
