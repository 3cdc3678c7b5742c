"""Importers from public trace formats to ``replay-trace/1``.

Each importer maps columns by name (never by position), keeps every unmapped column in ``extra``,
keeps the raw timestamp in ``src_ts``, and sends rows that cannot be parsed to a quarantine file
next to the output (``<out>.quarantine.jsonl``) with their line numbers. Work is done with lazy
polars queries streamed to disk, so a 10-million-row CSV does not become 10 million Python objects.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import itertools
import json
import re
import tempfile
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from replay.atomic import part_of
from replay.errors import ReplayError, where
from replay.filehash import (
    DECOMPRESS_ERRORS,
    HashingReader,
    compression,
    damaged,
    decompressed,
    file_sha256,
    refuse_stream,
    text_bom,
    utf8_chunks,
)
from replay.parallel import in_order, ordered_map
from replay.trace.format import TraceHeader

FORMATS: dict[str, str] = {
    "azure": "Azure LLM inference 2023/2024 and Azure multimodal 2025 CSV (TIMESTAMP, ContextTokens, GeneratedTokens[, NumImages])",
    "burstgpt": "BurstGPT v1/v2 CSV (Timestamp, [Session ID, Elapsed time,] Model, Request tokens, Response tokens, ...)",
    "mooncake": "Mooncake/Kimi JSONL (timestamp ms, input_length, output_length, hash_ids)",
    "vllm-timed-trace": "vLLM bench's timed_trace JSONL (timestamp s, input_length, output_length, hash_ids of 16 "
                        "tokens each); auto tells it from Mooncake's by its timestamps written as decimals",
    "bailian": "Alibaba Qwen-Bailian JSONL/CSV (chat_id, parent_chat_id, timestamp s, input_length, output_length, type, turn, hash_ids)",
    "vidur": "Vidur processed-trace CSV (arrived_at s, num_prefill_tokens, num_decode_tokens)",
    "splitwise": "splitwise-sim CSV (request_id, arrival_timestamp s, prompt_size, token_size, ...)",
    "vllm-bench": "vLLM benchmark custom dataset JSONL (prompt, output_tokens[, timestamp])",
    "sharegpt": "ShareGPT conversations, the dataset of vLLM's benchmarks (--dataset-name sharegpt): a JSON array (or JSON "
                "lines) of {id, conversations: [{from, value}, ...]}; the first turn is the prompt, as text (its tokens unknown)",
    "servegen-offline": "Alibaba ServeGen offline batch-job JSONL (request_id, type, input_length, then output_length and "
                        "duration ms, or hash_ids and img_ids); a batch is submitted at once, so every request arrives at 0",
}


@dataclass
class ImportResult:
    out: Path
    rows_read: int
    rows_emitted: int
    quarantined: int
    quarantine_path: Path | None
    input_tokens_sum: int
    format: str = ""  # the format read (what ``auto`` found)


def _materialise(src: Path, tmpdir: Path, progress: Progress | None = None) -> Path:
    """Check the source exists and is a non-empty file. A gzip, bzip2 or xz file (by content: a compressed
    export is often saved without its suffix) is decompressed, with a clear truncation error, and text that starts with a
    byte-order mark (Excel's 'CSV UTF-8', UTF-16 from Windows tools) is copied as plain UTF-8: the
    readers take UTF-8 without a mark. ``progress`` is told how much of the source is read."""
    if src.is_dir():
        raise ReplayError(f"{src}: is a directory, expected a trace file")
    if not src.exists():
        raise ReplayError(f"{src}: no such file")
    refuse_stream(src)
    total = src.stat().st_size
    if total == 0:
        raise ReplayError(f"{src}: empty file")
    kind = compression(src)
    if kind is None:
        with src.open("rb") as fh:
            if text_bom(fh.read(4)) is None:
                return src
    out = tmpdir / (src.stem if kind is not None and src.suffix.lower() in (".gz", ".bz2", ".xz") else src.name)
    try:
        with src.open("rb") as raw, decompressed(raw, kind, src) as fin, out.open("wb") as fout:
            for chunk in utf8_chunks(fin, 1 << 20):
                fout.write(chunk)
                if progress is not None:
                    progress(raw.tell(), total, "decompressing" if kind else "copying as UTF-8")
    except DECOMPRESS_ERRORS as e:
        if kind is None:
            raise
        raise damaged(src, kind, e) from None
    if out.stat().st_size == 0:
        raise ReplayError(f"{src}: empty after decompression")
    return out


_JSON_CONSTANTS = (b"NaN", b"Infinity")  # (what Python's json writes for a float that is no number, and
# JSON has not: polars' reader refuses the whole file for one of them)


def _json_lines_without_constants(path: Path, tmpdir: Path) -> Path:
    """JSON lines in which a value is NaN or ±Infinity (a trace written by Python's json from a float
    that was no number) copied with such values as null, line for line: polars' reader refused the whole
    file for one, with an internal error; now only the rows whose required value it was are quarantined,
    each with its line. Any other file as it is."""
    with path.open("rb") as fh:
        head = fh.read(1 << 16).lstrip()
        if not head.startswith(b"{"):
            return path
        fh.seek(0)
        found, tail = False, b""
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            if any(c in tail + chunk for c in _JSON_CONSTANTS):
                found = True
                break
            tail = chunk[-8:]
    if not found:
        return path
    out = tmpdir / f"finite-{path.name}"
    seen: list[str] = []

    def constant(name: str) -> None:
        seen.append(name)  # (and the value is null)

    with path.open("rb") as fin, out.open("wb") as fout:
        for line in fin:
            if any(c in line for c in _JSON_CONSTANTS):  # (or in a string: such a line stays as it is)
                seen.clear()
                try:
                    obj = json.loads(line, parse_constant=constant)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    seen.clear()  # (not JSON at all: the reader says where)
                if seen:
                    line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + (
                        b"\n" if line.endswith(b"\n") else b"")
            fout.write(line)
    return out


def separator_of(header: str) -> str:
    """A CSV's field separator, told from its header: ',' unless the header has none and has ';' (a
    spreadsheet in a locale whose decimal mark is a comma saves so) or a tab (a TSV)."""
    if "," in header:
        return ","
    return ";" if ";" in header else "\t" if "\t" in header else ","


def _separator(path: Path) -> str:
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        return separator_of(fh.readline())


def _csv_columns(path: Path, label: Path) -> list[str]:
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        first = fh.readline()
    if not first.strip():
        raise ReplayError(f"{where(label, 1)}: no header row")
    return next(csv.reader([first], delimiter=separator_of(first)))


def _find_bad_csv_line(path: Path, label: Path, n_cols: int) -> str:
    """Where a CSV the reader refused goes wrong: the first row (by the line it starts on) with the
    wrong number of fields, or that Python's reader cannot read either (a field over its 128 KiB
    limit: most often a quote that never closes, which makes the rest of the file one field)."""
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        sep = separator_of(fh.readline())
        fh.seek(0)
        rows = csv.reader(fh, delimiter=sep)
        start = 1
        try:
            for row in rows:
                if row and len(row) != n_cols:
                    return f"{where(label, start)}: expected {n_cols} fields, found {len(row)}"
                start = rows.line_num + 1
        except csv.Error as e:
            why = "a field over 128 KiB, or a quote that opens a field and never closes" if "field limit" in str(e) else e
            return f"{where(label, start)}: cannot be read as CSV ({why})"
    return f"{label}: the CSV could not be parsed"


def _require(cols: list[str], need: list[str], label: Path, fmt: str) -> None:
    missing = [c for c in need if c not in cols]
    if missing:
        raise ReplayError(
            f"{where(label, 1)}: not {'an' if fmt[0] in 'aeiou' else 'a'} {fmt} file: missing column(s) {', '.join(missing)}; "
            f"found {', '.join(cols) or 'none'}. Expected: {FORMATS[fmt]}"
        )


@dataclass(frozen=True)
class _Parse:
    """A column parser with a cheap ``fast`` form for the common shape and a ``full`` form for the rest.

    The import stages every row through ``fast``; only if that leaves nulls does it stage again with
    ``full`` (whitespace, thousands separators, time-zone suffixes), so clean files pay for one cheap
    parse and messy files still lose nothing.
    """

    fast: pl.Expr
    full: pl.Expr
    reads_as: tuple[str, Any] | None = None  # (column, dtype): a CSV block may read that column as this
    # dtype for the fast form (its cast is then a no-op); a block the reader refuses so is read as text


_Col = pl.Expr | _Parse
Block = Callable[[], pl.LazyFrame]  # a piece of the input, parsed when called (in a worker thread)
# told (bytes read so far, bytes to read, what the pass does) as an import reads its file: a CSV block
# by block, any other format once it is read whole
Progress = Callable[[int, int, str], None]


# an Azure time: date, ' ' or 'T', time, up to 9 fraction digits, and no zone, 'Z' or ±hh:mm (the 2023
# traces have none, the 2024 ones '+00:00', the 2025 multimodal one 'T…Z')
_AZURE_TIME = re.compile(r"^\d{4}-\d\d-\d\d([ T])\d\d:\d\d:\d\d(?:\.\d{1,9})?(Z|[+-]\d\d:\d\d)?$")


def _first_value(path: Path, col: str) -> str | None:
    """The first data row's value of ``col`` in a CSV (None when there is none)."""
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        sep = separator_of(fh.readline())
        fh.seek(0)
        for row in csv.DictReader(fh, delimiter=sep):
            return row.get(col)
    return None


def _parse_timestamp_us(col: str, sample: str | None = None) -> _Parse:
    """Parse Azure-style datetimes in any of their shapes to epoch µs (UTC where a zone is stated).

    The cheap form takes the shape of ``sample`` (the file's first time): its separator and its zone
    (none, 'Z', or that very ±hh:mm). Whole seconds repeat from row to row, so they are parsed
    through the parser's cache and the fraction and zone added as integers (several times faster
    than strptime on the whole string); a row of any other shape is null there and goes to the full
    parser."""
    c = pl.col(col)
    m = _AZURE_TIME.match(sample) if sample else None
    sep, zone = (m.group(1), m.group(2) or "") if m else (" ", "")
    zone_rx = {"": "", "Z": "Z"}.get(zone, r"[+-]\d\d:\d\d")
    if len(zone) == 6:  # (the sample's own zone: a file states one, and reading each row's cost two fifths of the
        zone_rx = re.escape(zone)  # parse; a row in another zone is null here, which sends the file to the full parser)
    shape = c.str.contains(r"^\d{4}-\d\d-\d\d" + sep + r"\d\d:\d\d:\d\d(?:\.\d{1,9})?" + zone_rx + "$")
    whole = c.str.slice(0, 19).str.to_datetime(f"%Y-%m-%d{sep}%H:%M:%S", time_unit="us", strict=False, cache=True)
    digits = ((c.str.len_bytes() - len(zone)) if zone else c.str.len_bytes()).clip(20, 26) - 20  # fraction digits
    # that count (µs: at most 6)
    frac_text = c.str.slice(20, 6) if not zone else c.str.slice(20, digits)
    fast_us = whole.dt.epoch("us") + (frac_text.cast(pl.Int64, strict=False) * pl.lit(10, pl.Int64).pow(6 - digits)).fill_null(0)
    if len(zone) == 6:  # local time at ±hh:mm: UTC is that much earlier (+) or later (-)
        off_s = (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * (-1 if zone[0] == "-" else 1)
        if off_s:
            fast_us = fast_us - off_s * 1_000_000
    fast = pl.when(shape).then(fast_us)
    s = pl.col(col).str.strip_chars()
    zm = s.str.extract_groups(r"([+-])(\d\d):?(\d\d)$")
    off_min = zm.struct.field("2").cast(pl.Int64, strict=False) * 60 + zm.struct.field("3").cast(pl.Int64, strict=False)
    sign = pl.when(zm.struct.field("1") == "-").then(-1).otherwise(1)
    body = s.str.replace(r"(Z|[+-]\d\d:?\d\d)$", "").str.replace("T", " ")
    dt = body.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="us", strict=False)
    return _Parse(fast, dt.dt.epoch("us") - (sign * off_min.fill_null(0) * 60_000_000))


def _count(x: pl.Expr) -> pl.Expr:
    """A count (tokens, items) as an integer: null, so that its row is quarantined, where it is
    negative or has a fraction (a trace reader refuses the first, and the second was cut to an
    integer unsaid)."""
    return pl.when((x >= 0) & (x == x.floor())).then(x).cast(pl.Int64, strict=False)


def _int(col: str) -> _Parse:
    fast = pl.col(col).cast(pl.Int64, strict=False)
    return _Parse(
        pl.when(fast >= 0).then(fast),
        _count(pl.col(col).str.strip_chars().str.replace_all(",", "").cast(pl.Float64, strict=False)),
        (col, pl.Int64),
    )


_US_MAX = 2.0 ** 62  # (µs: 146,000 years either way of 1970; past it a time is damage, and its differences overflow)


def _us(x: pl.Expr) -> pl.Expr:
    """A time or duration in µs (a float) as an integer: null, so that its row is quarantined, where it is
    NaN, infinite or too large for one (a stray 1e20), not a conversion error that stops the import."""
    return pl.when(x.abs() < _US_MAX).then(x.round(0)).cast(pl.Int64, strict=False)


def _seconds_us(col: str, decimal_comma: bool = False) -> pl.Expr:
    """Seconds (a decimal number) as integer µs; with ``decimal_comma`` (a ';'-separated file, saved by a
    spreadsheet in such a locale) '12,5' is 12.5."""
    c = pl.col(col).str.strip_chars()
    c = c.str.replace(",", ".", literal=True) if decimal_comma else c
    return _us(c.cast(pl.Float64, strict=False) * 1_000_000)


@dataclass
class _Plan:
    """A lazy frame with ``src_row`` plus parsed columns, and the rules for a valid row."""

    lf: pl.LazyFrame
    abs_us: _Col  # arrival in µs on the source's own axis (absolute or relative)
    required: dict[str, _Col]  # name -> parser; null means unparseable
    fields: dict[str, pl.Expr]  # trace field -> expression
    extra_cols: list[str]
    time: dict[str, Any]
    prefix: dict[str, Any]
    line_offset: int  # file line of src_row 0
    blocks: Callable[..., Generator[Block, None, None]] | None = None  # the file in bounded pieces (CSV)
    blocks_are_source: bool = False  # the blocks read the source file as given (not a decompressed copy)


def _typed_columns(plan: _Plan) -> dict[str, Any]:
    """The columns the plan's cheap parsers may read as numbers (column -> dtype)."""
    return dict(c.reads_as for c in [plan.abs_us, *plan.required.values()] if isinstance(c, _Parse) and c.reads_as)


def _form(c: _Col, fast: bool) -> pl.Expr:
    if isinstance(c, _Parse):
        return c.fast if fast else c.full
    return c


def _header_room(header: TraceHeader) -> int:
    """Bytes to reserve for the header line: the header with every count at its widest, plus slack."""
    wide = json.dumps(header.to_json()).replace("null", "0" * 20)
    return len(wide.encode()) + 20 * 8 + 64


def _fill_header(out: Path, header: TraceHeader, room: int) -> None:
    """Write the final header into the reserved first line, padded with spaces (valid JSON)."""
    line = json.dumps(header.to_json()).encode()
    if len(line) + 1 > room:  # cannot happen with _header_room's slack; fail loudly rather than corrupt
        raise ReplayError(f"{out}: internal error: header ({len(line)} bytes) exceeds reserved {room} bytes", 70)
    with out.open("r+b") as fo:
        fo.write(line + b" " * (room - 1 - len(line)) + b"\n")


_UNPARSEABLE = {"_abs_us": "arrival time unparseable",  # (why a row's required value is null)
                **{k: f"{k} unparseable as a count (an integer >= 0)" for k in ("input_tokens", "output_tokens")}}
_STATS_SUM = ("n", "bad", "backwards", "in_sum")
CSV_BLOCK_BYTES = 3 << 20  # CSV imports stream the file in pieces of this size
CSV_CARRY_BYTES = 64 << 20  # the most a block may grow to hold a row that has not ended (a quoted field with
# line ends in it): past this, an unbalanced quote is the likelier reading, and the import stops there
BLOCK_WORKERS = 2  # blocks parsed side by side while a thread of its own writes the ones before them
BLOCKS_AHEAD = BLOCK_WORKERS  # blocks in the works at once (one more was as fast, and held 10-20 MiB more
# at 10M rows, taking the 10M/1M peak memory ratio from 1.1-1.3 up to 1.3-1.5)
WRITES_AHEAD = 1  # parsed blocks waiting to be written, at most (writing them in the thread that reads
# the file made that thread the one the workers waited for: 10M rows took 3.0-3.2 s so, 2.5-2.9 s now; two
# waiting blocks were no faster, and their memory took the ratio up to 1.5 too)


def _one_pass(plan: _Plan, src: Path, fmt: str, fast: bool, t_first: int | None, out: Path, room: int,
              q_path: Path, hasher: Any = None, progress: Callable[[int, int], None] | None = None,
              blocks_read: Iterator[Block] | None = None) -> dict[str, Any]:
    """Parse once and, in the same streaming query, write body and quarantine and compute the counts.

    With ``t_first`` (the first good row's arrival) the body is written in file order relative to it,
    block by block where the format allows, so memory does not grow with the file; the caller checks
    the counts (``t_min``, ``backwards``) and redoes the import sorted when the file was out of order.
    Without ``t_first`` the body is sorted, which needs the rows in memory. With ``blocks_read`` (and
    ``t_first``), the blocks are those, of a read the caller began (to find ``t_first``), hashing and
    telling ``progress`` as it goes.
    """
    parsed = {"_abs_us": _form(plan.abs_us, fast), **{k: _form(v, fast) for k, v in plan.required.items()}}
    keys = list(parsed)
    bad = pl.any_horizontal([pl.col(k).is_null() for k in keys])
    good_t = pl.col("_abs_us").filter(~bad)
    reasons = [
        pl.when(pl.col(k).is_null()).then(pl.lit(_UNPARSEABLE.get(k, f"{k} unparseable"))).otherwise(None)
        for k in keys
    ]
    raw_cols = [c for c in plan.lf.collect_schema().names() if c != "src_row"]
    cols = [plan.fields[k].alias(k) for k in plan.fields]
    if plan.extra_cols:
        cols.append(pl.struct([pl.col(c) for c in plan.extra_cols]).alias("extra"))
    whole: Block = functools.partial(_same, plan.lf)
    # the fast form reads integer columns as integers: a row it quarantines is redone in text (see caller)
    typed = _typed_columns(plan) if fast else {}
    blocks = plan.blocks if t_first is not None else None
    pieces = (blocks_read or blocks(hasher, typed, progress)) if blocks is not None else iter([whole])
    total: dict[str, Any] = {"n": 0, "bad": 0, "backwards": 0, "in_sum": 0, "t_min": None,
                             **{f"null:{k}": 0 for k in keys}}
    last_t: int | None = None
    def run(piece: Block) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
        """One block parsed: its body and quarantine rows, and its counts. They are rendered by the
        writing thread, straight into the files (rendering to in-memory buffers here measured slower:
        every block's fresh megabytes cost page faults)."""
        lf = piece().with_columns(**parsed)
        stats = lf.select(
            pl.len().alias("n"), bad.sum().alias("bad"),
            good_t.min().alias("t_min"), good_t.first().alias("t_first"), good_t.last().alias("t_last"),
            (good_t.diff() < 0).sum().alias("backwards"),
            *[pl.col(k).null_count().alias(f"null:{k}") for k in keys],
            *([pl.col("input_tokens").filter(~bad).sum().alias("in_sum")] if "input_tokens" in plan.required else []),
        )
        quarantine = lf.filter(bad).select(
            pl.lit(str(src)).alias("file"),
            (pl.col("src_row") + plan.line_offset).alias("line"),
            pl.when(pl.all_horizontal([pl.col(c).is_null() for c in raw_cols])).then(pl.lit("empty row (a blank line, or no values)"))
            .otherwise(pl.concat_str(reasons, separator="; ", ignore_nulls=True)).alias("reason"),
            pl.struct(raw_cols).alias("raw"),
        )
        good = lf.filter(~bad)
        if t_first is None:
            good = good.sort(["_abs_us", "src_row"]).with_columns(t_us=pl.col("_abs_us") - pl.col("_abs_us").min())
        else:
            good = good.with_columns(t_us=pl.col("_abs_us") - t_first)
        res = pl.collect_all([good.select(cols), quarantine, stats])
        return res[0], res[1], res[-1].row(0, named=True)

    def write(body: pl.DataFrame, qb: pl.DataFrame) -> None:
        body.write_ndjson(fo)
        if qb.height:
            qb.write_ndjson(fq)

    with out.open("wb") as fo, q_path.open("wb") as fq:
        fo.write(b" " * (room - 1) + b"\n")  # the header goes here once the counts are known
        try:  # blocks are parsed side by side and written in order, by a thread of their own
            with in_order(ahead=WRITES_AHEAD) as writer:
                for body, qb, st in ordered_map(run, pieces, workers=BLOCK_WORKERS, ahead=BLOCKS_AHEAD):
                    writer(functools.partial(write, body, qb))
                    for k, v in st.items():
                        if k in _STATS_SUM or k.startswith("null:"):
                            total[k] += int(v or 0)
                    if st["t_min"] is not None:
                        total["t_min"] = st["t_min"] if total["t_min"] is None else min(total["t_min"], st["t_min"])
                    if st["t_first"] is not None:
                        if last_t is not None and st["t_first"] < last_t:
                            total["backwards"] += 1  # a step back across the block boundary
                        last_t = st["t_last"]
        except pl.exceptions.PolarsError as e:
            raise ReplayError(f"{src}: cannot be read as {fmt}: {str(e).splitlines()[0]}") from None
    if progress is not None and blocks is None:  # (read whole: done at once)
        size = src.stat().st_size
        progress(size, size)
    return total


def _csv_blocks(path: Path, label: Path, cols: list[str], separator: str,
                block_bytes: int | None = None) -> Callable[..., Generator[Block, None, None]]:
    """The CSV body in pieces of about ``block_bytes`` cut at line ends (never inside quotes), so the
    import holds a few pieces at a time: memory stays flat however long the file is.

    Every piece is parsed by the worker that calls it. Its first row number is the row after the
    previous piece's last, which that piece's worker publishes as soon as its reader has counted its
    rows: pieces wait on each other only for that number, never for each other's parsing."""

    def read(body: bytes, typed: dict[str, Any] | None) -> pl.DataFrame:
        if typed:  # numbers read as numbers (cheaper than text cast later); a block with any other value
            try:  # in those columns is read as text, as every block is without ``typed``
                return pl.read_csv(body, has_header=False, new_columns=cols, infer_schema=False, separator=separator,
                                   quote_char='"', schema_overrides=typed)
            except pl.exceptions.PolarsError:
                pass
        try:
            return pl.read_csv(body, has_header=False, new_columns=cols, infer_schema=False, separator=separator,
                               quote_char='"')
        except pl.exceptions.PolarsError:
            raise ReplayError(_find_bad_csv_line(path, label, len(cols))) from None

    def parse(buf: bytes, start: Future[int], end: Future[int], typed: dict[str, Any] | None) -> pl.LazyFrame:
        try:
            body = buf.lstrip(b"\r\n")  # the reader cannot start on a blank line; those are rows of nulls
            lead = buf.count(b"\n", 0, len(buf) - len(body))
            df = read(body, typed) if body else pl.DataFrame(schema=dict.fromkeys(cols, pl.String))
            if lead:
                df = pl.concat([pl.DataFrame({c: [None] * lead for c in cols}, schema=df.schema), df])
            row0 = start.result()
        except BaseException as e:  # the pieces after this one learn of it instead of waiting forever
            end.set_exception(e)
            raise
        end.set_result(row0 + df.height)
        return df.with_row_index("src_row", offset=row0).with_columns(pl.col("src_row").cast(pl.UInt32)).lazy()

    def gen(hasher: Any = None, typed: dict[str, Any] | None = None,
            progress: Callable[[int, int], None] | None = None) -> Generator[Block, None, None]:
        """The blocks; with ``hasher``, every byte of the file read goes into it too (the file is then
        read once); with ``typed`` (column -> dtype), those columns read as that dtype where every value
        of a block parses; with ``progress``, told (bytes read, the file's size) as each block is handed
        on."""
        size = block_bytes or CSV_BLOCK_BYTES
        total = path.stat().st_size
        start: Future[int] = Future()
        start.set_result(0)
        with HashingReader(path, hasher) as fh:
            done = len(fh.readline())
            held: list[bytes] = []  # read, not handed on: a line not ended yet, or rows with a quoted field
            held_bytes = quotes = 0  # open (joined once they end: joining at every read was quadratic)
            while True:  # one copy per block: the rest of the last read joined to this read's lines
                chunk = fh.read(size)
                while 0 < len(chunk) < size and (more := fh.read(size - len(chunk))):  # (a short read need not be the end)
                    chunk += more
                end_of_file = len(chunk) < size  # (the last block holds the rest: a file that does not end
                done += len(chunk)  # in a line end would otherwise leave its last row a block of its own)
                if progress is not None:
                    progress(done, total)
                if not end_of_file:
                    cut = chunk.rfind(b"\n") + 1
                    quoted = b'"' in chunk  # (a search, ten times faster than a count: most files quote nothing)
                    if cut == 0 or (quotes + (chunk.count(b'"', 0, cut) if quoted else 0)) % 2:  # no line end yet, or the cut
                        held.append(chunk)  # falls inside a quoted field
                        held_bytes += len(chunk)
                        quotes += chunk.count(b'"')
                        if held_bytes > CSV_CARRY_BYTES:  # (a quote that never closes: the rest of the file
                            raise ReplayError(_find_bad_csv_line(path, label, len(cols)))  # would be one field)
                        continue
                    buf = b"".join((*held, memoryview(chunk)[:cut]))
                    held = [chunk[cut:]] if cut < len(chunk) else []
                    held_bytes, quotes = len(chunk) - cut, chunk.count(b'"', cut) if quoted else 0
                else:
                    buf, held = b"".join((*held, chunk)), []
                    if not buf or buf.isspace():  # only blank space after the last line
                        return
                end: Future[int] = Future()
                yield functools.partial(parse, buf, start, end, typed)
                start = end
                if end_of_file:
                    return

    return gen


def _same(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf


def _run_plan(plan: _Plan, src: Path, out: Path, fmt: str, progress: Progress | None = None) -> ImportResult:
    """Import through part files renamed into place at the end: a failed or interrupted import leaves
    the trace and quarantine of the last good import as they were."""
    part = part_of(out)
    q_part = part_of(out.with_name(out.name + ".quarantine.jsonl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _import_into(plan, src, out, part, fmt, q_part, progress)
    finally:
        part.unlink(missing_ok=True)
        q_part.unlink(missing_ok=True)


def _import_into(plan: _Plan, src: Path, out: Path, part: Path, fmt: str, q_part: Path,
                 progress: Progress | None = None) -> ImportResult:
    """Import into ``part`` and ``q_part`` (renamed to ``out`` and its quarantine file on success):
    usually one streaming pass over the file."""

    def told(what: str) -> Callable[[int, int], None] | None:
        return None if progress is None else lambda done, total: progress(done, total, what)

    q_path = out.with_name(out.name + ".quarantine.jsonl")
    # a plain CSV is hashed as its blocks are read; anything else (gzip, JSON lines) beforehand
    hasher = hashlib.sha256() if plan.blocks is not None and plan.blocks_are_source else None
    sha = "0" * 64 if hasher is not None else file_sha256(src)
    room = _header_room(TraceHeader(source={"format": fmt, "path": str(src), "sha256": sha},
                                    time={**plan.time, "sorted": False, "backwards_steps": None, "t0_src_us": None},
                                    prefix=plan.prefix,
                                    import_counts={"rows_read": None, "rows_emitted": None, "quarantined": None,
                                                   "quarantine_file": q_path.name}))
    keys = ["_abs_us", *plan.required]
    has_full = {k for k, c in [("_abs_us", plan.abs_us), *plan.required.items()] if isinstance(c, _Parse)}
    fast = True
    # the first good row's time, from the first block of the pass (parsed once, for both), not a scan
    pieces = plan.blocks(hasher, _typed_columns(plan), told("reading")) if plan.blocks is not None else None
    block = next(pieces, None) if pieces is not None else None
    first = functools.cache(block) if block is not None else None
    try:
        probe = (first() if first is not None else plan.lf).head(4096).with_columns(
            _abs_us=_form(plan.abs_us, fast), **{k: _form(v, fast) for k, v in plan.required.items()})
        try:
            t_first = probe.filter(pl.all_horizontal([pl.col(k).is_not_null() for k in keys])).select(pl.col("_abs_us").first()).collect().item()
        except pl.exceptions.PolarsError as e:
            raise ReplayError(f"{src}: cannot be read as {fmt}: {str(e).splitlines()[0]}") from None
        stats = _one_pass(plan, src, fmt, fast, t_first, part, room, q_part, hasher, told("reading"),
                          None if first is None or pieces is None else itertools.chain([first], pieces))
    finally:
        if pieces is not None:
            pieces.close()  # (unread when no row was good: the pass then scans the whole file)
    if hasher is not None:
        sha = hasher.hexdigest() if t_first is not None else file_sha256(src)  # (no blocks were read without it)
    # the cheap parser missed rows, or quarantined rows whose numbers it read as numbers (their raw
    # values go to the quarantine as text): use the full one
    if any(stats[f"null:{k}"] for k in has_full) or (_typed_columns(plan) and plan.blocks is not None and stats["bad"]):
        fast = False
        stats = _one_pass(plan, src, fmt, fast, t_first, part, room, q_part,
                          progress=told("reading again (times or numbers in other shapes)"))
    if stats["t_min"] is not None and (t_first is None or stats["backwards"] or stats["t_min"] < t_first):
        stats = _one_pass(plan, src, fmt, fast, None, part, room, q_part,  # out of order
                          progress=told("sorting (rows out of time order)"))
    n, n_bad = int(stats["n"]), int(stats["bad"])
    if n == 0:
        raise ReplayError(f"{src}: no data rows")
    t_min = stats["t_min"]
    if t_min is None:  # the reasons go beside the output, which stays as the last good import left it
        rejected = out.with_name(out.name + ".rejected.jsonl")
        q_part.replace(rejected)
        raise ReplayError(f"{src}: every row was quarantined ({n_bad}); see {rejected}")
    backwards = int(stats["backwards"])
    header = TraceHeader(
        source={"format": fmt, "path": str(src), "sha256": sha},
        time={**plan.time, "sorted": backwards == 0, "backwards_steps": backwards, "t0_src_us": int(t_min)},
        prefix=plan.prefix,
        import_counts={"rows_read": n, "rows_emitted": n - n_bad, "quarantined": n_bad,
                       "quarantine_file": q_path.name if n_bad else None},
    )
    _fill_header(part, header, room)
    part.replace(out)
    if n_bad:
        q_part.replace(q_path)
    else:
        q_path.unlink(missing_ok=True)  # the last import's quarantine no longer describes this trace
    in_sum = int(stats["in_sum"])
    return ImportResult(out, n, n - n_bad, n_bad, q_path if n_bad else None, in_sum)


def _scan_csv(path: Path, label: Path) -> tuple[pl.LazyFrame, list[str]]:
    """A lazy scan of the whole CSV (for sorting) and its column names; see ``_csv_blocks`` for streaming."""
    cols = _csv_columns(path, label)
    separator = _separator(path)
    try:
        lf = pl.scan_csv(path, infer_schema=False, separator=separator, row_index_name="src_row",
                         quote_char='"')
        with path.open("rb") as fh:  # check the head only: a scan's head(1) reads a large part of the file
            head = fh.read(1 << 16)
        cut = head.rfind(b"\n")
        while cut > 0 and head.count(b'"', 0, cut) % 2:  # not inside a quoted field
            cut = head.rfind(b"\n", 0, cut)
        if cut > 0:
            pl.read_csv(head[:cut + 1], infer_schema=False, separator=separator, quote_char='"')
    except pl.exceptions.PolarsError:
        raise ReplayError(_find_bad_csv_line(path, label, len(cols))) from None
    return lf, cols


def _common_fields(**over: pl.Expr) -> dict[str, pl.Expr]:
    """The fields every importer writes; fields at their schema default (id ``r<src_row>``,
    output_kind ``observed``, status ``ok``, null max_tokens) are left out, as the format allows."""
    base: dict[str, pl.Expr] = {
        "t_us": pl.col("t_us"),
        "src_row": pl.col("src_row"),
        "input_tokens": pl.col("input_tokens"),
        "output_tokens": pl.col("output_tokens"),
    }
    base.update(over)
    return base


def import_azure(path: Path, label: Path) -> _Plan:
    lf, cols = _scan_csv(path, label)
    _require(cols, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], label, "azure")
    fields = _common_fields(src_ts=pl.col("TIMESTAMP"))
    if "NumImages" in cols:
        n_img = _int("NumImages").full
        fields["mm"] = pl.when(n_img > 0).then(
            pl.concat_list([pl.struct(type=pl.lit("image"), count=n_img)])
        ).otherwise(None)
    extra = [c for c in cols if c not in ("TIMESTAMP", "ContextTokens", "GeneratedTokens", "NumImages")]
    tz = "UTC" if "NumImages" in cols or "trace" in cols else "unknown"
    return _Plan(lf, _parse_timestamp_us("TIMESTAMP", _first_value(path, "TIMESTAMP")),
                 {"input_tokens": _int("ContextTokens"), "output_tokens": _int("GeneratedTokens")},
                 fields, extra, {"src_unit": "datetime", "src_origin": "absolute", "tz_assumed": tz,
                                 "clock": "unknown", "quantum_ms": None}, {"block_size": None}, 2)


def import_burstgpt(path: Path, label: Path) -> _Plan:
    lf, cols = _scan_csv(path, label)
    _require(cols, ["Timestamp", "Request tokens", "Response tokens"], label, "burstgpt")
    out_tok = _int("Response tokens")
    fields = _common_fields(
        src_ts=pl.col("Timestamp"),
        output_kind=pl.when(pl.col("output_tokens") == 0).then(pl.lit("failed")).otherwise(pl.lit("observed")),
        status=pl.when(pl.col("output_tokens") == 0).then(pl.lit("error")).otherwise(pl.lit("ok")),
    )
    if "Session ID" in cols:
        fields["session_id"] = pl.col("Session ID").replace("", None)
    if "Elapsed time" in cols:  # v2: end-to-end latency observed at the source, in seconds
        fields["src_latency_us"] = _seconds_us("Elapsed time", _separator(path) == ";")
    mapped = {"Timestamp", "Request tokens", "Response tokens", "Session ID", "Elapsed time"}
    extra = [c for c in cols if c not in mapped]
    return _Plan(lf, _seconds_us("Timestamp", _separator(path) == ";"),
                 {"input_tokens": _int("Request tokens"), "output_tokens": out_tok}, fields, extra,
                 {"src_unit": "s", "src_origin": "source-local-day", "tz_assumed": "source-local",
                  "clock": "unknown", "quantum_ms": 1000}, {"block_size": None}, 2)


def _scan_jsonl(path: Path, label: Path) -> tuple[pl.LazyFrame, list[str]]:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                first = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReplayError(f"{where(label, i)}: not JSON ({e.msg})" + _cut_short(fh, line, label, i)) from None
            break
        else:
            raise ReplayError(f"{label}: no data rows")
    if not isinstance(first, dict):
        raise ReplayError(f"{where(label, 1)}: each line must be a JSON object")
    try:
        lf = pl.scan_ndjson(path, row_index_name="src_row", infer_schema_length=1000)
        lf.collect_schema()
        lf.head(1).collect()
    except pl.exceptions.PolarsError as e:
        bad = _find_bad_json_line(path, label)
        raise ReplayError(bad or f"{label}: cannot be read as JSONL ({str(e).splitlines()[0]})") from None
    return lf, list(first.keys())


def _json_type(v: Any) -> str:
    """What polars tells apart in a JSON field: numbers, strings and booleans share a column (as strings)."""
    return "an object" if isinstance(v, dict) else "a list" if isinstance(v, list) else "a plain value"


def _find_bad_json_line(path: Path, label: Path) -> str | None:
    """The first line that is not JSON, or whose field holds another JSON type than on an earlier line
    (an object where numbers were): one column of a table holds one type."""
    first: dict[str, tuple[str, int]] = {}
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for i, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                return f"{where(label, i)}: not JSON ({e.msg})" + _cut_short(fh, line, label, i)
            for k, v in obj.items() if isinstance(obj, dict) else []:
                if v is None:
                    continue
                kind, (was, at) = _json_type(v), first.setdefault(k, (_json_type(v), i))
                if kind != was:
                    return (f"{where(label, i)}: {k!r} is {kind} here but {was} on line {at}: a field holds one type "
                            "in every line; fix or drop one of the two")
    return None


def _cut_short(fh: Any, line: str, label: Path, no: int) -> str:
    """Advice when the bad line is the file's last and has no line end: the file was cut short."""
    if line.endswith("\n") or fh.read(1):
        return ""
    return (f"; the file ends mid-line, as an interrupted download or copy leaves it: re-fetch it, or import "
            f"all but that line (head -n {no - 1} {label} > complete.jsonl)")


def _jcast(col: str, schema: pl.Schema, dtype: type[pl.DataType]) -> pl.Expr:
    """A JSON column as ``dtype`` where its values are scalars; null where they are objects or lists
    (polars would cast their fields, or refuse): such a row's required value is then unparseable and
    the row is quarantined."""
    if schema[col].is_nested():
        return pl.lit(None, dtype=dtype)
    return pl.col(col).cast(dtype, strict=False)


def _jint(col: str, schema: pl.Schema) -> pl.Expr:
    return _count(_jcast(col, schema, pl.Float64))


def _length_trace(path: Path, label: Path, fmt: str, unit: Literal["ms", "s"], block_size: int) -> _Plan:
    """A JSONL of timestamp, input_length, output_length and hash_ids: Mooncake's (ms, 512-token blocks)
    and vLLM bench's timed_trace (s, 16-token blocks) alike."""
    lf, cols = _scan_jsonl(path, label)
    _require(cols, ["timestamp", "input_length", "output_length"], label, fmt)
    schema = lf.collect_schema()
    fields = _common_fields(src_ts=pl.col("timestamp"))
    if "hash_ids" in cols:
        fields["prefix_blocks"] = pl.col("hash_ids")
    extra = [c for c in cols if c not in ("timestamp", "input_length", "output_length", "hash_ids")]
    abs_us = _us(_jcast("timestamp", schema, pl.Float64) * (1000 if unit == "ms" else 1_000_000))
    return _Plan(lf, abs_us, {"input_tokens": _jint("input_length", schema), "output_tokens": _jint("output_length", schema)},
                 fields, extra, {"src_unit": unit, "src_origin": "relative", "tz_assumed": None,
                                 "clock": "unknown", "quantum_ms": None},
                 {"block_size": block_size, "hash_scope": "global"}, 1)


def import_mooncake(path: Path, label: Path) -> _Plan:
    return _length_trace(path, label, "mooncake", "ms", 512)


def import_vllm_timed_trace(path: Path, label: Path) -> _Plan:
    return _length_trace(path, label, "vllm-timed-trace", "s", 16)


def import_bailian(path: Path, label: Path) -> _Plan:
    lf, cols = (_scan_csv(path, label) if path.suffix == ".csv" else _scan_jsonl(path, label))
    _require(cols, ["timestamp", "input_length", "output_length"], label, "bailian")
    is_csv = path.suffix == ".csv"
    schema = lf.collect_schema()

    def num(col: str) -> _Col:
        return _int(col) if is_csv else _jint(col, schema)
    fields = _common_fields(src_ts=pl.col("timestamp"))
    if "chat_id" in cols:
        fields["id"] = _jcast("chat_id", schema, pl.Utf8)
    if "hash_ids" in cols and not is_csv:
        fields["prefix_blocks"] = pl.col("hash_ids")
    if "parent_chat_id" in cols:
        fields["session_id"] = _jcast("parent_chat_id", schema, pl.Utf8).replace("-1", None)
    mapped = {"timestamp", "input_length", "output_length", "hash_ids", "chat_id"}
    extra = [c for c in cols if c not in mapped]
    abs_us = _us(_jcast("timestamp", schema, pl.Float64) * 1_000_000)
    return _Plan(lf, abs_us, {"input_tokens": num("input_length"), "output_tokens": num("output_length")},
                 fields, extra, {"src_unit": "s", "src_origin": "relative", "tz_assumed": None,
                                 "clock": "unknown", "quantum_ms": None},
                 {"block_size": 16, "hash_scope": "global"}, 1 if not is_csv else 2)


def import_vidur(path: Path, label: Path) -> _Plan:
    lf, cols = _scan_csv(path, label)
    _require(cols, ["num_prefill_tokens", "num_decode_tokens"], label, "vidur")
    has_t = "arrived_at" in cols
    abs_us = _seconds_us("arrived_at", _separator(path) == ";") if has_t else pl.lit(0, dtype=pl.Int64)
    fields = _common_fields(src_ts=pl.col("arrived_at") if has_t else pl.lit(None, dtype=pl.Utf8))
    extra = [c for c in cols if c not in ("arrived_at", "num_prefill_tokens", "num_decode_tokens")]
    return _Plan(lf, abs_us, {"input_tokens": _int("num_prefill_tokens"), "output_tokens": _int("num_decode_tokens")},
                 fields, extra, {"src_unit": "s" if has_t else None,
                                 "src_origin": "relative" if has_t else "none (length-only dataset: all arrive at 0)",
                                 "tz_assumed": None, "clock": "unknown", "quantum_ms": None},
                 {"block_size": None}, 2)


def import_splitwise(path: Path, label: Path) -> _Plan:
    lf, cols = _scan_csv(path, label)
    _require(cols, ["arrival_timestamp", "prompt_size", "token_size"], label, "splitwise")
    fields = _common_fields(src_ts=pl.col("arrival_timestamp"))
    if "request_id" in cols:
        fields["id"] = pl.col("request_id")
    extra = [c for c in cols if c not in ("arrival_timestamp", "prompt_size", "token_size", "request_id")]
    return _Plan(lf, _seconds_us("arrival_timestamp", _separator(path) == ";"),
                 {"input_tokens": _int("prompt_size"), "output_tokens": _int("token_size")}, fields, extra,
                 {"src_unit": "s", "src_origin": "relative", "tz_assumed": None, "clock": "unknown",
                  "quantum_ms": None}, {"block_size": None}, 2)


def import_vllm_bench(path: Path, label: Path) -> _Plan:
    lf, cols = _scan_jsonl(path, label)
    _require(cols, ["prompt"], label, "vllm-bench")
    schema = lf.collect_schema()
    has_t = "timestamp" in cols
    abs_us = _us(_jcast("timestamp", schema, pl.Float64) * 1_000_000) if has_t else pl.lit(0, dtype=pl.Int64)
    out_expr = _jint("output_tokens", schema) if "output_tokens" in cols else pl.lit(None, dtype=pl.Int64)
    fields = _common_fields(
        src_ts=_jcast("timestamp", schema, pl.Utf8) if has_t else pl.lit(None, dtype=pl.Utf8),
        input_tokens=pl.lit(None, dtype=pl.Int64),
        output_tokens=out_expr,
        **({} if "output_tokens" in cols else {"output_kind": pl.lit("unknown")}),
        prompt=pl.col("prompt"),
    )
    extra = [c for c in cols if c not in ("prompt", "output_tokens", "timestamp")]
    return _Plan(lf, abs_us, {"prompt_chars": _jcast("prompt", schema, pl.Utf8).str.len_chars()},
                 fields, extra, {"src_unit": "s" if has_t else None, "src_origin": "relative" if has_t else "none",
                                 "tz_assumed": None, "clock": "unknown", "quantum_ms": None},
                 {"block_size": None}, 1)


def import_sharegpt(path: Path, label: Path) -> _Plan:
    """ShareGPT conversations (a JSON array of ``{"id", "conversations": [{"from", "value"}, ...]}``),
    the dataset ``vllm bench serve --dataset-name sharegpt`` (benchmark_serving.py before it) samples
    from. As vLLM's benchmark reads a conversation, its first turn is the prompt and its second the
    reference completion, whose length it asks for: here, without the tokenizer, the prompt goes in as
    text with its tokens unknown (a replay has the server count them), the output length is unknown,
    and the whole conversation stays in ``extra``. vLLM's benchmark sets the arrival rate itself: every conversation arrives at 0.
    The same conversations as JSON lines (one a line, as fine-tuning tools write them) read alike. A
    conversation with no first turn (or a first turn without text) is quarantined with its line, or in
    an array its element's number (1 for the first). An array is read whole, as columns (ShareGPT
    V3's 94k conversations are 640 MB of JSON); JSON lines stream."""
    with path.open("rb") as fh:
        lines = fh.read(1 << 16).lstrip().startswith(b"{")  # (ShareGPT as JSON lines, one conversation a line)
    if lines:
        lf, cols = _scan_jsonl(path, label)
    else:
        try:
            df = pl.read_json(path, infer_schema_length=None)
        except (pl.exceptions.PolarsError, ValueError) as e:
            raise ReplayError(f"{label}: cannot be read as a JSON array of conversations ({str(e).splitlines()[0][:200]}); "
                              f"expected: {FORMATS['sharegpt']}") from None
        lf, cols = df.lazy().with_row_index("src_row"), df.columns
    _require(cols, ["conversations"], label, "sharegpt")
    turns = lf.collect_schema()["conversations"]
    if not (isinstance(turns, pl.List) and isinstance(turns.inner, pl.Struct)
            and "value" in [f.name for f in turns.inner.fields]):
        raise ReplayError(f"{where(label, 1)}: 'conversations' is not a list of turns with a 'value' ({turns}); "
                          f"expected: {FORMATS['sharegpt']}")
    text = {f.name: f.dtype for f in turns.inner.fields}["value"] == pl.Utf8  # (no text: every row quarantined)
    prompt = (pl.col("conversations").list.get(0, null_on_oob=True).struct.field("value") if text
              else pl.lit(None, dtype=pl.Utf8))
    fields = _common_fields(src_ts=pl.lit(None, dtype=pl.Utf8), input_tokens=pl.lit(None, dtype=pl.Int64),
                            output_tokens=pl.lit(None, dtype=pl.Int64), output_kind=pl.lit("unknown"), prompt=prompt)
    return _Plan(lf, pl.lit(0, dtype=pl.Int64), {"prompt_chars": prompt.str.len_chars()}, fields, cols,
                 {"src_unit": None, "src_origin": "none (a dataset of conversations: all arrive at 0)",
                  "tz_assumed": None, "clock": "unknown", "quantum_ms": None}, {"block_size": None}, 1)


def import_servegen_offline(path: Path, label: Path) -> _Plan:
    """A batch job of Alibaba Model Studio (ServeGen's ``data/offline``): the whole input file is
    submitted at once, so there is no arrival time and every request arrives at 0, in the file's
    order. Stat traces give the output length and the job's latency (``duration``, ms); content-hash
    traces give the prompt's 16-token block hashes and the images' ids instead, and no output length."""
    lf, cols = _scan_jsonl(path, label)
    _require(cols, ["input_length"], label, "servegen-offline")
    schema = lf.collect_schema()
    has_out = "output_length" in cols
    fields = _common_fields(
        src_ts=pl.lit(None, dtype=pl.Utf8),
        output_tokens=_jint("output_length", schema) if has_out else pl.lit(None, dtype=pl.Int64),
        **({} if has_out else {"output_kind": pl.lit("unknown")}),
    )
    if "request_id" in cols:
        fields["id"] = _jcast("request_id", schema, pl.Utf8)
    if "duration" in cols:  # end-to-end time of the request in the batch, ms
        fields["src_latency_us"] = _us(_jcast("duration", schema, pl.Float64) * 1000)
    if "hash_ids" in cols:
        fields["prefix_blocks"] = pl.col("hash_ids")
    if "img_ids" in cols and schema["img_ids"] == pl.List(pl.Utf8):  # the ids stay in extra, for image reuse
        n_img = pl.col("img_ids").list.len()
        fields["mm"] = pl.when(n_img > 0).then(pl.concat_list([pl.struct(type=pl.lit("image"), count=n_img)]))
    mapped = {"request_id", "input_length", "output_length", "duration", "hash_ids"}
    return _Plan(lf, pl.lit(0, dtype=pl.Int64), {"input_tokens": _jint("input_length", schema)}, fields,
                 [c for c in cols if c not in mapped],
                 {"src_unit": None, "src_origin": "none (batch job: every request submitted at once)", "tz_assumed": None,
                  "clock": "unknown", "quantum_ms": None},
                 {"block_size": 16 if "hash_ids" in cols else None, **({"hash_scope": "global"} if "hash_ids" in cols else {})}, 1)


_IMPORTERS: dict[str, Callable[[Path, Path], _Plan]] = {
    "azure": import_azure, "burstgpt": import_burstgpt, "mooncake": import_mooncake,
    "vllm-timed-trace": import_vllm_timed_trace,
    "bailian": import_bailian, "vidur": import_vidur, "splitwise": import_splitwise,
    "vllm-bench": import_vllm_bench, "servegen-offline": import_servegen_offline, "sharegpt": import_sharegpt,
}


_CSV_FORMATS = ("azure", "burstgpt", "vidur", "splitwise")
# the columns (CSV header, or the first JSON line's keys) that name each format, most specific first
_SIGNATURES: list[tuple[str, str, set[str]]] = [
    ("csv", "azure", {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}),
    ("csv", "burstgpt", {"Timestamp", "Request tokens", "Response tokens"}),
    ("csv", "vidur", {"num_prefill_tokens", "num_decode_tokens"}),
    ("csv", "splitwise", {"arrival_timestamp", "prompt_size", "token_size"}),
    ("csv", "bailian", {"timestamp", "input_length", "output_length"}),
    ("json", "vllm-bench", {"prompt"}),
    ("json", "sharegpt", {"conversations"}),
    ("json", "bailian", {"timestamp", "input_length", "output_length", "chat_id"}),
    ("json", "bailian", {"timestamp", "input_length", "output_length", "parent_chat_id"}),
    ("json", "mooncake", {"timestamp", "input_length", "output_length"}),
    ("json", "servegen-offline", {"request_id", "input_length"}),
]


def _seconds_or_ms(fmt: str, first: dict[str, Any]) -> str:
    """Mooncake's columns with a timestamp written as a decimal (``0.0``, ``1.25``) are vLLM bench's
    timed_trace, in seconds; Mooncake's own are whole milliseconds."""
    return "vllm-timed-trace" if fmt == "mooncake" and isinstance(first.get("timestamp"), float) else fmt


def detect_format(path: Path, label: Path) -> str:
    """The format of a trace file from its columns: the CSV header, or the keys of the first JSON line.
    Mooncake and Bailian share their length columns; Bailian's lines name their chat (and give the time
    in seconds, Mooncake's in ms), so a line without ``chat_id`` or ``parent_chat_id`` is read as Mooncake."""
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        head = fh.read(1 << 16)  # (a JSON array may be one line of the whole file: its head tells it)
    if head.lstrip().startswith("["):
        if re.match(r'\[\s*\{\s*(?:"[^"]*"\s*:\s*"[^"]*"\s*,\s*)*"conversations"\s*:\s*\[', head.lstrip()):
            return "sharegpt"
        raise ReplayError(f"{label}: cannot tell the format: a JSON array, not JSON lines or CSV; name it if it is "
                          f"ShareGPT's conversations: replay import sharegpt {label}", 2)
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        first = next((ln for ln in fh if ln.strip()), "")
    if not first:
        raise ReplayError(f"{label}: no data rows")
    if "\ufffd" in first or re.search(r"[\x00-\x08\x0e-\x1f\x7f]", first):
        raise ReplayError(f"{where(label, 1)}: not a text trace (binary content); name its format if it is one: "
                          f"replay import FORMAT {label}")  # (input it cannot read: as a named format's, exit 3)
    if first.lstrip().startswith("{"):
        kind = "json"
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            hint = (": a ServeGen client's distributions, not a trace; draw a workload from it with replay synth --servegen"
                    if re.fullmatch(r"chunk-.+-dataset\.json", label.name) else "")
            raise ReplayError(f"{where(label, 1)}: cannot tell the format: the first line is not a JSON object{hint}")
        if obj.get("kind") == "header" and str(obj.get("schema", "")).startswith("replay-trace/"):
            raise ReplayError(f"{label}: already a {obj['schema']} trace; replay it as it is")
        cols = set(obj)
    else:
        kind = "csv"
        cols = {c.strip() for c in next(csv.reader([first], delimiter=separator_of(first)))}
        if re.fullmatch(r"chunk-.+-trace\.csv", label.name):
            raise ReplayError(f"{label}: a ServeGen client's rate windows, not a trace; draw a workload from it with "
                              "replay synth --servegen")
    for k, fmt, need in _SIGNATURES:
        if k == kind and need <= cols:
            return _seconds_or_ms(fmt, obj) if kind == "json" else fmt
    raise ReplayError(f"{label}: cannot tell the format from its {'columns' if kind == 'csv' else 'keys'} "
                      f"({', '.join(sorted(cols))[:200]}); name it: replay import FORMAT {label}, FORMAT one of "
                      f"{', '.join(_IMPORTERS)}", 2)


def import_trace(fmt: str, src: Path, out: Path, progress: Progress | None = None) -> ImportResult:
    """Import ``src`` (format ``fmt``, or ``auto`` to tell it from the columns) to the trace file
    ``out``; see FORMATS for the choices. ``progress`` is told how far each pass over the file is."""
    if fmt not in _IMPORTERS and fmt != "auto":
        raise ReplayError(f"unknown format {fmt!r}; choose one of: {', '.join(_IMPORTERS)}, or auto", 2)
    with tempfile.TemporaryDirectory() as td:
        real = _materialise(src, Path(td), progress)
        if fmt == "auto":
            fmt = detect_format(real, src)
        if fmt not in _CSV_FORMATS:
            real = _json_lines_without_constants(real, Path(td))
        plan = _IMPORTERS[fmt](real, src)
        if fmt in _CSV_FORMATS or real.suffix == ".csv":
            cols = [c for c in plan.lf.collect_schema().names() if c != "src_row"]
            plan.blocks = _csv_blocks(real, src, cols, _separator(real))
            plan.blocks_are_source = real == src
        res = _run_plan(plan, src, out, fmt, progress)
    res.format = fmt
    return res
