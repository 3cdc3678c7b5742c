"""The vectorised lane for nvidia-smi's CSV logs (``nvidia-smi --query-gpu=... --format=csv -l 1``).

Such a log is the usual record of what a GPU held during an incident, and a long one: a day of eight
GPUs polled every second is 700,000 rows. Read a row at a time, with each sample a Python tuple, a
day took 10 s and half a gigabyte before the recorder had written a sample. This module reads the
rows as polars columns: the usual shape (one header, perhaps repeated, naming a timestamp and an
index column; nvidia-smi's time format; numbers with or without units, or nvidia-smi's words for
none) becomes a frame of samples in one pass. A line as nvidia-smi writes it, as the file's first
rows show it (', ' between cells, its time, each metric a whole number in its column's unit), is
told by one pattern of the whole line and cut as it is; any other line is told apart (a header, a
blank line, a row) and its cells cut and read as the reference does. A row it cannot vouch for
(another shape of time, a cell that is no number, another count of fields) is read by
``nvidia_smi.parse_nvidia_smi_csv``'s own row reader, which stays the reference for what a row
means, and a file of any other shape (no header, headers that differ, compute-apps rows, GPUs told
apart by bus id, text outside printable ASCII but for Windows' line ends) goes to it whole. Tests
check that both give the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from replay.bundle import SAMPLES_SCHEMA
from replay.filehash import compression
from replay.record import common, nvidia_smi, timecol
from replay.record.fastlog import text_pieces
from replay.record.options import RecordOptions

_ODD_TEXT = r"[^\t\x20-\x7e]"  # (Python's line breaks and white space beyond these: the reference's)
_TIME = r"^[1-9]\d{3}/\d\d/\d\d \d\d:\d\d:[0-5]\d\.\d{3}$"  # nvidia-smi's, '2026/07/03 22:11:09.763'
_NUMBER = nvidia_smi.NV_NUMBER.pattern  # (its \s is the same in Rust's regex on this lane's text: a tab or a space)
_INFO = (("name", "name"), ("uuid", "uuid"), ("pci.bus_id", "pci_bus_id"), ("hostname", "host"))
FAST_FROM_CHARS = 1 << 20  # (a smaller file is read sooner row by row than the lane's fixed cost of some 30 ms)
PIECE_CHARS = 4 << 20  # (a piece's columns, and what the allocator holds of the last second's, take ~16 times
# its size: a day of a node's polling peaked at 256 MiB read in pieces of 8 MiB, 210 of 4, 181 of 2; 4 MiB
# read it 5 % slower than 8, 2 MiB 25 %)
FIRST_PIECE_CHARS = 64 << 10  # (the header and the usual line are told from it, and the rest read by them)
SLOW_SHARE = 0.25  # past this share of rows the reference's, the reference reads the whole file
_GPU_MAX = (1 << 31) - 1


def parse_nvidia_smi_csv(path: Path, text: str, tz_offset_s: int = 0, columns: str | None = None,
                         at: str | None = None, spill: Path | None = None) -> common.Parsed:
    """``nvidia_smi.parse_nvidia_smi_csv``, vectorised where the file has the usual shape and is big
    enough to gain by it; where ``spill`` is a folder, the lane's samples are left there as it reads
    them (``Parsed.on_disk``)."""
    fast = _vectorised(path, text, tz_offset_s, columns, at, spill) if len(text) >= FAST_FROM_CHARS else None
    return fast if fast is not None else nvidia_smi.parse_nvidia_smi_csv(path, text, tz_offset_s, columns, at)


def _pieces(texts: Iterable[str]) -> Iterator[pl.DataFrame | None]:
    """The lines of ``texts`` (the file's text, in parts that each end at a line end but the last), as
    ``str.splitlines`` cuts this lane's text, in frames of about PIECE_CHARS (the first of at most
    FIRST_PIECE_CHARS), with their numbers from 1: the columns of a line take some ten times its size,
    so the whole file is never made columns at once. None where a part holds a CR of its own."""
    line, first = 1, True
    for text in texts:
        if "\r" in text:  # (Windows' line ends, each CR before an LF, cut the same lines; any other CR is a line end)
            if text.count("\r") != text.count("\r\n"):
                yield None
                return
            text = text.replace("\r\n", "\n")
        pos = 0
        while pos < len(text):
            end = text.find("\n", pos + (min(PIECE_CHARS, FIRST_PIECE_CHARS) if first else PIECE_CHARS))
            end, first = len(text) if end < 0 else end + 1, False
            raw = pl.Series("raw", [text[pos:end]]).str.split("\n").explode()
            raw = raw.slice(0, raw.len() - 1) if text[end - 1] == "\n" else raw  # (no line after the last line end)
            yield pl.DataFrame(raw).with_row_index("line", offset=line)
            line, pos = line + raw.len(), end


_PLAIN = re.compile(r"[0-9]{1,15}((?: (?:MiB|GiB|KiB|%|W|MHz|C))?)")  # a plain number (exact as a float), its unit as written
_TIME_FIELD = r"[1-9][0-9]{3}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-5][0-9]\.[0-9]{3}"  # (``_TIME``'s, in ASCII)
_ANY_FIELD = r"[\t\x20-\x2b\x2d-\x7e]*"  # (printable ASCII or a tab, but a comma)
_TIME_FORMAT = "%Y/%m/%d %H:%M:%S%.3f"


def _literal(text: str) -> str:
    """``text`` as a literal of a pattern (Rust's syntax, as polars reads it: its punctuation escaped)."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~" else c for c in text)


def _written_unit(cells: list[str | None]) -> str | None:
    """How a column's numbers are written: the unit after the first plain number of ``cells`` (' MiB',
    ' %'; '' for bare numbers), or None where none of them is one."""
    for c in cells:
        m = _PLAIN.fullmatch(c) if c is not None else None
        if m:
            return m.group(1)
    return None


def _layout(header: list[str], at: dict[str, int], metrics: list[str], first: list[str]) -> tuple[str, dict[str, str | None]]:
    """The usual row of a file of this header, as a pattern of its whole line, and the unit each metric
    is written in there (None: only nvidia-smi's words for none), as the file's ``first`` rows show
    it: a timestamp of nvidia-smi's, an index of digits, each metric a plain number in its unit or
    one of ``NV_UNKNOWN``, each field after a comma and one space, nothing outside printable ASCII.
    Such a line's cells are its fields cut at ', ', as they are, and it is no header and not blank."""
    rows = [cells for cells in (nvidia_smi.csv_cells(ln) for ln in first) if len(cells) == len(header)]
    units = {k: _written_unit([cells[at[k]] for cells in rows]) for k in metrics}
    unknown = "|".join(_literal(w) for w in nvidia_smi.NV_UNKNOWN)
    fields = [_ANY_FIELD] * len(header)
    fields[at["timestamp"]], fields[at["index"]] = _TIME_FIELD, "[0-9]{1,10}"
    for k, unit in units.items():
        fields[at[k]] = f"(?:{unknown})" if unit is None else f"(?:[0-9]{{1,15}}{_literal(unit)}|{unknown})"
    return "^" + ", ".join(fields) + "$", units


def _cut(rows: pl.DataFrame, fields: int, cells: dict[str, int]) -> pl.DataFrame:
    """``rows`` ('line', 'raw') with 'whole', whether a row has ``fields`` fields (the header's count), and
    the cells this lane reads (``cells``: a name -> its field's place), each once and stripped, as
    'c:<name>' (a row of another count of fields: whatever its first fields are, not read)."""
    return (rows.with_columns(_fields=pl.col("raw").str.splitn(",", fields + 1)).unnest("_fields")
            .select("line", "raw", whole=pl.col(f"field_{fields - 1}").is_not_null() & pl.col(f"field_{fields}").is_null(),
                    **{f"c:{k}": pl.col(f"field_{i}").str.strip_chars() for k, i in cells.items()}))


def _read_numbers(rows: pl.DataFrame, columns: dict[str, str]) -> pl.DataFrame:
    """``rows`` with each cell column 'c:<name>' of ``columns`` (name -> its header cell) read: as <name>,
    its value in its base unit (bytes for memory; null where the cell holds no number), and as
    <name>?, whether the cell is nvidia-smi's word for none ('[N/A]', '-', nothing). A plain number in
    the unit its column is written in ('40000 MiB') is cut by its length, all columns at once; the other
    cells (another unit, a fraction, a word, damage) are each read by ``_by_pattern``, as the reference
    reads them."""
    units = {k: _written_unit(rows[f"c:{k}"].head(16).to_list()) for k in columns}
    exprs: dict[str, pl.Expr] = {}
    for k, header_cell in columns.items():
        cell, unit = pl.col(f"c:{k}"), units[k]
        if unit is None:
            exprs |= {k: pl.lit(None, pl.Float64), f"{k}!": pl.lit(False)}
            continue
        plain = cell.str.contains(f"^[0-9]{{1,15}}{_literal(unit)}$").fill_null(False)
        exprs |= {k: pl.when(plain).then(_plain_value(cell, unit, header_cell)), f"{k}!": plain}
    rows = rows.with_columns(**exprs, **{f"{k}?": pl.lit(False) for k in columns})
    for k, header_cell in columns.items():
        odd = (~rows[f"{k}!"]).arg_true()
        if odd.len():
            value, unknown = _by_pattern(pl.col("c"), nvidia_smi.nv_default_unit(header_cell))
            read = pl.DataFrame({"c": rows[f"c:{k}"].gather(odd)}).select(value=value, unknown=unknown)
            rows = rows.with_columns(rows[k].clone().scatter(odd, read["value"]),
                                     rows[f"{k}?"].clone().scatter(odd, read["unknown"]))
    return rows.drop(f"{k}!" for k in columns)


def _plain_value(cell: pl.Expr, unit: str, header_cell: str) -> pl.Expr:
    """A plain number's cell ('40000 MiB': up to 15 digits, then ``unit`` as written) as its value in its
    base unit: exact, as the reference's float of the same digits."""
    digits = cell.str.head(-len(unit)) if unit else cell
    scale = float(nvidia_smi.NV_SCALE.get(unit.strip() or nvidia_smi.nv_default_unit(header_cell), 1))
    return digits.str.to_integer(strict=False).cast(pl.Float64) * scale


def _by_pattern(c: pl.Expr, default_unit: str) -> tuple[pl.Expr, pl.Expr]:
    """A cell's value in its base unit by ``NV_NUMBER`` (a bare number in ``default_unit``), and whether
    it is nvidia-smi's word for none: what ``nvidia_smi._nv_value`` makes of any cell."""
    number = c.str.extract_groups(_NUMBER)
    unit = number.struct.field("2").fill_null(default_unit)
    scale = unit.replace_strict(list(nvidia_smi.NV_SCALE), list(nvidia_smi.NV_SCALE.values()), default=1, return_dtype=pl.Float64)
    unknown = c.is_in([*nvidia_smi.NV_UNKNOWN, "-", ""]) | (c.str.starts_with("[") & c.str.ends_with("]"))
    return number.struct.field("1").cast(pl.Float64, strict=False) * scale, unknown


def _samples(fast: pl.DataFrame, metrics: list[tuple[str, str]]) -> pl.DataFrame:
    """The samples of the rows the lane reads (columns 'line', then SAMPLES_SCHEMA's): each value that is
    one, in its row's line order and within a row in ``metrics``' order, as the reference lists them.
    The rows' values are laid out row after row by numpy (a word for none as NaN, which no value the
    lane reads is), and each sample takes its row's line, time and GPU by its place."""
    n, m = fast.height, len(metrics)
    if not n * m:
        return pl.DataFrame(schema={"line": pl.UInt32, **SAMPLES_SCHEMA})
    values = fast.select(pl.when(~pl.col(f"{k}?")).then(pl.col(k)).fill_null(float("nan")) for k, _ in metrics).to_numpy().ravel()
    row, which = np.repeat(np.arange(n, dtype=np.uint32), m), np.tile(np.arange(m, dtype=np.uint32), n)
    kept = ~np.isnan(values)
    if not kept.all():
        row, which, values = row[kept], which[kept], values[kept]
    return fast.select(pl.col("line").cast(pl.UInt32), "t_us", pl.col("gpu").cast(pl.Int32))[pl.Series(row)].with_columns(
        source=pl.lit("nvidia-smi"), metric=pl.Series([name for _, name in metrics]).gather(pl.Series(which)),
        value=pl.Series(values)).select("line", *SAMPLES_SCHEMA)


class _Lane:
    """The state of one file's reading: its header, what its rows said of each GPU so far, the samples."""

    def __init__(self, path: Path, tz_offset_s: int, columns: str | None, spill: Path | None = None) -> None:
        self.path, self.tz_offset_s, self.columns = path, tz_offset_s, columns
        self.spill = spill  # where each piece's samples are written as it is read (None: held)
        self.spilled: list[Path] = []
        self.header: list[str] | None = None
        self.at: dict[str, int] = {}
        self.p = common.Parsed(kind="nvidia-smi")
        self.frames: list[pl.DataFrame] = []
        self.said: dict[int, dict[str, tuple[int, Any]]] = {}  # GPU -> key -> (line, value): the latest stands
        self.firsts: dict[int, int] = {}  # GPU -> its first row's line (the order of ``gpus``)
        self.rows = self.slow = 0
        self.unstated: set[int] = set()  # GPUs a row of which says no memory ('[N/A]'), as the reference notes them
        self.clock: str | None = None  # the time column's name
        self.offsets: timecol.TimeColumn | None = None  # where it holds offsets from the run's start ('time [s]')
        self.usual: str | None = None  # the pattern of the file's usual line (``_layout``), once its first rows are seen
        self.units: dict[str, str | None] = {}  # the unit each metric is written in on such a line

    def _take(self, header: list[str]) -> bool:
        """Read the rows by ``header``; whether it is this lane's (a timestamp, or a time column of
        offsets from the run's start, and an index; not apps)."""
        self.header = header
        names, units = nvidia_smi.named_columns(header)
        self.at = {n: i for i, n in enumerate(names)}  # (a name given twice: its last cell, as the reference's dict)
        self.clock = nvidia_smi.row_clock(names, units)
        if self.clock is not None and self.clock != "timestamp":
            self.offsets = timecol.time_column(units[self.clock])
        return self.clock is not None and "index" in self.at and "pid" not in self.at

    def _metrics(self) -> list[tuple[str, str]]:
        """The header's memory and utilisation fields, each with the bundle's metric of it."""
        return [(k, m) for k, m in nvidia_smi.NVSMI_GPU_FIELDS.items() if k in self.at]

    def _split_usual(self, df: pl.DataFrame) -> tuple[pl.DataFrame | None, pl.DataFrame]:
        """The lines of ``df`` of the file's usual shape (``_layout``), read (None: none is), and the others.
        Every line is read as one of that shape while the pattern tells which is: both at once, as most
        lines are, and what is read of the others is dropped."""
        if self.usual is None or not df.height:
            return None, df
        read = self._read_usual(df)
        usual = read["usual"]
        if usual.all():
            return read.drop("usual"), df.clear()
        return (read.filter(usual).drop("usual"), df.filter(~usual)) if usual.any() else (None, df)

    def piece(self, df: pl.DataFrame) -> bool:
        """Read one piece of lines; False where the file is not this lane's. Lines of the usual shape
        are rows as they are; the others are told apart (a header, a blank line, a row) as the
        reference tells them."""
        usual, df = self._split_usual(df)
        self.p.lines += usual.height if usual is not None else 0
        if df["raw"].str.contains(_ODD_TEXT).any():
            return False
        first_two = pl.col("raw").str.splitn(",", 3)
        head = pl.any_horizontal(*(first_two.struct.field(f).str.strip_chars().str.starts_with(w).fill_null(False)
                                   for f in ("field_0", "field_1") for w in nvidia_smi.NVSMI_HEADER_WORDS),
                                 first_two.struct.field("field_0").str.strip_chars().str.contains(timecol.NAME_PATTERN),
                                 pl.col("raw").str.contains(r"[.\[]") & pl.col("raw").str.contains(nvidia_smi.NVSMI_FIELDS_LINE.pattern))
        df = df.with_columns(blank=pl.col("raw").str.contains(r"^[\t ]*$"),
                             dated=pl.col("raw").str.contains(r"\d{4}/\d\d/\d\d"))
        heads = df.filter(~pl.col("dated") & ~pl.col("blank")).filter(head)  # (the header test on the few undated)
        rows = df.filter(~pl.col("blank") & ~pl.col("line").is_in(heads["line"].implode())).select("line", "raw")
        self.p.lines += df.height
        self.p.parsed += df.height - rows.height
        if self.header is None:
            if rows.height and (not heads.height or rows["line"][0] < heads["line"][0]):
                if self.columns is None or not self._take(nvidia_smi.csv_cells(self.columns)):
                    return False  # (rows without a header: the reference quarantines them and says how to read them)
            elif heads.height and not self._take(nvidia_smi.csv_cells(heads["raw"][0])):
                return False
        if any(nvidia_smi.csv_cells(h) != self.header for h in heads["raw"].unique()):
            return False  # (headers that differ)
        if not rows.height and usual is None:
            return True
        assert self.header is not None
        if self.usual is None and self.offsets is None:  # (the first rows: the file's usual line from them)
            self.usual, self.units = _layout(self.header, self.at, [k for k, _ in self._metrics()], rows["raw"].head(16).to_list())
            usual, rows = self._split_usual(rows)
        return self._rows(usual, rows, self.header)

    def _rows(self, usual: pl.DataFrame | None, rows: pl.DataFrame, header: list[str]) -> bool:
        """Read the rows of a piece: those of the usual shape, read (``usual``), and any other (``rows``)."""
        read = [usual] if usual is not None else []
        if rows.height:
            other = self._read_any(rows, header)
            if other is None:
                return False
            read.append(other)
        return self._take_rows(read[0] if len(read) == 1 else read[0].merge_sorted(read[1], "line"))

    def _read_usual(self, rows: pl.DataFrame) -> pl.DataFrame:
        """Rows read as of the usual shape: each field a cell as it is, each metric a plain number in its
        column's unit or a word for none (``_columns``' columns), and 'usual', whether a row is of it
        (the others' reading is none)."""
        assert self.header is not None and self.usual is not None
        header, at, unknown = self.header, self.at, list(nvidia_smi.NV_UNKNOWN)
        cell = {k: pl.col(f"field_{i}") for k, i in at.items()}
        info = {k: cell[k].str.strip_chars() for k, _ in _INFO if k in at}
        numbers: dict[str, pl.Expr] = {}
        for k, _ in self._metrics():
            unit = self.units[k]
            value = pl.lit(None, pl.Float64) if unit is None else _plain_value(cell[k], unit, header[at[k]])
            numbers |= {k: pl.when(~cell[k].is_in(unknown)).then(value), f"{k}?": cell[k].is_in(unknown)}
        t_us = cell["timestamp"].str.to_datetime(_TIME_FORMAT, time_unit="us", strict=False).dt.epoch("us")
        return (rows.with_columns(_fields=pl.col("raw").str.split_exact(", ", len(header) - 1),
                                  usual=pl.col("raw").str.contains(self.usual)).unnest("_fields")
                .select(*self._columns(whole=pl.lit(True), t_us=t_us - self.tz_offset_s * 1_000_000,
                                       gpu=cell["index"].cast(pl.Int64, strict=False),
                                       info={k: pl.when(~v.is_in(unknown)).then(v) for k, v in info.items()}, numbers=numbers),
                        "usual"))

    def _read_any(self, rows: pl.DataFrame, header: list[str]) -> pl.DataFrame | None:
        """Rows of any shape read, each cell as the reference cuts it (``_columns``' columns); None where
        one holds a time of another form than the file's first row's."""
        at, metrics = self.at, self._metrics()
        info = [k for k, _ in _INFO if k in at]
        assert self.clock is not None
        rows = _cut(rows, len(header), {k: at[k] for k in (self.clock, "index", *(k for k, _ in metrics), *info)})
        stamp, index = pl.col(f"c:{self.clock}"), pl.col("c:index")
        if self.offsets is not None:
            t_us = timecol.offset_expr(stamp, self.offsets)
            if rows.filter(pl.col("whole") & t_us.is_null()).height:
                return None  # (a time that is no offset: the reference tells the file's form by its first row)
        else:
            t_us = (pl.when(stamp.str.contains(_TIME)).then(stamp).str.to_datetime(
                _TIME_FORMAT, time_unit="us", strict=False).dt.epoch("us") - self.tz_offset_s * 1_000_000)
        rows = _read_numbers(rows.with_columns(t_us=t_us, gpu=pl.when(index.str.contains(r"^\d{1,10}$")).then(
            index.cast(pl.Int64, strict=False))), {k: header[at[k]] for k, _ in metrics})
        return rows.select(*self._columns(whole=pl.col("whole"), t_us=pl.col("t_us"), gpu=pl.col("gpu"), info={
            k: pl.when(~pl.col(f"c:{k}").is_in(list(nvidia_smi.NV_UNKNOWN))).then(pl.col(f"c:{k}")) for k in info},
            numbers={c: pl.col(c) for k, _ in metrics for c in (k, f"{k}?")}))

    @staticmethod
    def _columns(whole: pl.Expr, t_us: pl.Expr, gpu: pl.Expr, info: dict[str, pl.Expr], numbers: dict[str, pl.Expr]) -> list[pl.Expr]:
        """A piece's rows as read, by either reading, in one order of columns: 'line', 'raw', 'whole' (a row
        of the header's count of fields), 't_us', 'gpu', each info field (null: none said), each metric's
        value in its base unit and '<metric>?' (its cell is a word for none)."""
        return [pl.col("line"), pl.col("raw"), whole.alias("whole"), t_us.alias("t_us"), gpu.alias("gpu"),
                *(v.alias(k) for k, v in info.items()), *(v.alias(k) for k, v in numbers.items())]

    def _take_rows(self, rows: pl.DataFrame) -> bool:
        """Take the rows read: the samples of those this lane vouches for, the others read by the
        reference; False where the file is not this lane's after all."""
        assert self.header is not None
        if rows.filter(pl.col("whole") & (pl.col("gpu").is_null() | (pl.col("gpu") > _GPU_MAX))).height:
            return False  # (GPUs told apart by bus id, which the reference numbers in bus order over the whole file)
        rows = rows.with_columns(fast=self._vouched(rows))
        slow = rows.filter(~pl.col("fast")).select("line", "raw")
        self.rows, self.slow = self.rows + rows.height, self.slow + slow.height
        if self.slow > SLOW_SHARE * self.rows + 1000:
            return False  # (a file of another shape of row: the reference reads it sooner)
        fast = rows.filter("fast").drop("raw") if slow.height else rows.drop("raw")
        if "memory.used" in self.at:
            self.unstated |= set(fast.filter(pl.col("memory.used?"))["gpu"].unique().to_list())
        self.p.parsed += fast.height
        self.p.naive_local_times |= fast.height > 0 and self.offsets is None
        self._note_gpus(fast)
        samples = _samples(fast, self._metrics())
        if slow.height:
            listed = self._slow(slow, self.header)
            if listed is None:
                return False
            samples = samples.merge_sorted(listed, "line")  # (each in its lines' order, no line in both)
        self._keep(samples.drop("line"))
        return True

    def _keep(self, samples: pl.DataFrame) -> None:
        """Keep a piece's samples: written to the spill folder where there is one (a day of 8 GPUs is
        2.8M samples, ~100 MiB held), else held."""
        if self.spill is None or self.offsets is not None:  # (offsets: held until placed, ``timecol.hold``)
            self.frames.append(samples)
        elif samples.height:
            self.spill.mkdir(parents=True, exist_ok=True)
            self.spilled.append(self.spill / f"nvidia-smi-{len(self.spilled)}.arrow")
            samples.write_ipc(self.spilled[-1])

    def abandon(self) -> None:
        """Remove what the lane spilled (the file is not the lane's after all: the reference reads it)."""
        for f in self.spilled:
            f.unlink(missing_ok=True)
        self.spilled = []

    def _vouched(self, rows: pl.DataFrame) -> pl.Expr:
        """Whether the lane vouches for a row: it has the header's count of fields, a time the lane reads,
        and each metric a word for none or a value a GPU can have (``common.impossible``'s bounds, a row's
        memory bounded by its own total: tested row by row only where the columns' least and largest
        values do not tell it for all)."""
        ok = pl.col("whole") & pl.col("t_us").is_not_null()
        total = pl.when(~pl.col("memory.total?")).then(pl.col("memory.total")) if "memory.total" in self.at else pl.lit(None, pl.Float64)
        bounded = self._bounded(rows)
        for k, m in self._metrics():
            possible = pl.lit(True) if bounded else ~common.maybe_impossible(total, pl.lit(m), pl.col(k))
            ok = ok & (pl.col(f"{k}?") | (pl.col(k).is_finite() & possible).fill_null(False))
        return ok.fill_null(False)

    def _bounded(self, rows: pl.DataFrame) -> bool:
        """Whether every value of ``rows`` is within ``common.impossible``'s bounds, by each column's
        least and largest value (the least total of any row bounding the memory of all)."""
        metrics = self._metrics()
        least = pl.col("memory.total").filter(~pl.col("memory.total?")).min() if "memory.total" in self.at else pl.lit(None, pl.Float64)
        got = rows.select(least, *(pl.col(k).min().alias(f"lo:{k}") for k, _ in metrics),
                          *(pl.col(k).max().alias(f"hi:{k}") for k, _ in metrics)).row(0)
        return all(common.within_bounds(m, got[1 + i], got[1 + len(metrics) + i], got[0]) for i, (_, m) in enumerate(metrics))

    def _note_gpus(self, fast: pl.DataFrame) -> None:
        """What the rows this lane vouches for say of each GPU: its first row, its name, UUID, bus and
        host, and its memory's total (the latest said stands)."""
        info = [k for k, _ in _INFO if k in self.at]
        for r in fast.group_by("gpu").agg(first=pl.col("line").min(), **{
                k: pl.struct("line", k).filter(pl.col(k).is_not_null() & (pl.col(k) != "")).last() for k in info}
                ).iter_rows(named=True):
            self.firsts.setdefault(r["gpu"], r["first"])
            self._say(r["gpu"], {key: (r[src]["line"], r[src][src]) for src, key in _INFO if r.get(src) is not None})
        if "memory.total" in self.at:
            for g, line, v in fast.select("gpu", "line", "memory.total", "memory.total?").filter(
                    pl.col("memory.total").is_not_null() & ~pl.col("memory.total?")).group_by("gpu").agg(
                    pl.col("line").last(), pl.col("memory.total").last()).iter_rows():
                self._say(g, {"total_bytes": (line, int(v))})

    def _say(self, gpu: int, said: dict[str, tuple[int, Any]]) -> None:
        got = self.said.setdefault(gpu, {})
        for key, (line, v) in said.items():
            if line >= got.get(key, (0, None))[0]:
                got[key] = (line, v)

    def _slow(self, slow: pl.DataFrame, header: list[str]) -> pl.DataFrame | None:
        """The rows this lane does not vouch for, each read by the reference alone, the header given as
        its columns; None where one holds a time of another form than the lane's (an offset in a
        timestamp column, which the reference reads by the file's first row)."""
        listed: list[tuple[int, int | None, int | None, str, str, float]] = []
        for line, ln in slow.iter_rows():
            one = nvidia_smi.nvidia_smi_rows(self.path, ln, self.tz_offset_s, ", ".join(header))
            if one.unplaced is not None:
                return None
            self.p.parsed += one.parsed
            self.p.naive_local_times |= one.naive_local_times
            self.p.quarantine += [(line, reason, text) for _, reason, text in one.quarantine]
            listed += [(line, *s) for s in one.samples]
            if any(n.startswith(f"{self.path.name}: {nvidia_smi.NO_MEMORY}") for n in one.notes):
                self.unstated |= set(one.gpus)
            for g, info in one.gpus.items():
                self.firsts[g] = min(self.firsts.get(g, line), line)
                self._say(g, {key: (line, v) for key, v in info.items() if key != "index"})
        return pl.DataFrame(listed, schema={"line": pl.UInt32, **SAMPLES_SCHEMA}, orient="row")

    def parsed(self) -> common.Parsed | None:
        if self.header is None:
            return None
        p = self.p
        p.frames = [f for f in self.frames if f.height]  # (a piece's each, not copied into one: ``Parsed.frame``)
        p.on_disk = pl.scan_ipc(self.spilled) if self.spilled else None
        for g in sorted(self.said, key=lambda g: self.firsts.get(g, 0)):
            p.gpus[g] = {"index": g, **{key: self.said[g][key][1] for key in (*(k for _, k in _INFO), "total_bytes")
                                        if key in self.said[g]}}
        if self.unstated:
            used = {g for f in p.lazy_frames()
                    for g in f.filter(pl.col("metric") == "device_used_bytes").select(pl.col("gpu").unique()).collect(engine="streaming")["gpu"]}
            nvidia_smi.note_no_memory(p, self.path, set(p.gpus) - used)
        if not self.rows and self.columns is None:  # (as the reference says of a header without rows)
            p.notes.append(nvidia_smi.header_only_note(self.path, False))
        if self.offsets is not None and self.rows:
            timecol.hold(p, self.offsets.name, "offset", self.tz_offset_s)
        return p


def _vectorised(path: Path, text: str | Iterable[str], tz_offset_s: int, columns: str | None,
                at: str | None = None, spill: Path | None = None) -> common.Parsed | None:
    """The file as the reference reads it (its text, or its text in parts each ending at a line end), or
    None where its shape is not this lane's."""
    lane = _Lane(path, tz_offset_s, columns, spill)
    p = lane.parsed() if all(df is not None and lane.piece(df) for df in _pieces([text] if isinstance(text, str) else text)) else None
    if p is None:
        lane.abandon()
        return None
    timecol.settle(p, path, common.parse_time(at, tz_offset_s) if at else None)
    return common.set_aside_impossible_values(p, path)  # (as the reference's result has been)


def _parse(path: Path, text: str, opts: RecordOptions) -> common.Parsed:
    return parse_nvidia_smi_csv(path, text, opts.tz_offset_s, opts.nvsmi_columns, opts.at, opts.spill)


def _ascii_parts(path: Path) -> Iterator[str]:
    """A plain file's text in parts of about PIECE_CHARS, each ending at a line end but the last: as
    ``recorder``'s reading of the whole would give it where it is printable ASCII (any other byte is a
    U+FFFD here, which the lane declines)."""
    for part in text_pieces(path, PIECE_CHARS):
        yield part.decode("ascii", errors="replace")


def _parse_file(path: Path, whole: Callable[[], str], opts: RecordOptions) -> common.Parsed:
    """A plain file of at least FAST_FROM_CHARS read by the lane in parts from the file, its text never
    held whole (a day of a node's polling is 55 MB, as text 55 MiB more at the recording's peak); any
    other, or one the lane declines, read from ``whole`` (the file's text) as ``_parse`` reads it."""
    if compression(path) is None and path.stat().st_size >= FAST_FROM_CHARS:
        fast = _vectorised(path, _ascii_parts(path), opts.tz_offset_s, opts.nvsmi_columns, opts.at, opts.spill)
        return fast if fast is not None else nvidia_smi.parse_nvidia_smi_csv(path, whole(), opts.tz_offset_s, opts.nvsmi_columns, opts.at)
    return _parse(path, whole(), opts)


PARSERS: dict[str, common.Parser] = {"nvidia-smi": _parse}  # (nvidia-smi's query CSV, as the registry reads it)
PIECEWISE: dict[str, common.PieceParser] = {"nvidia-smi": _parse_file}  # (as the recorder reads it, from the file)
