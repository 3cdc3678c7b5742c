"""The vectorised lane for nvidia-smi's CSV logs (``nvidia-smi --query-gpu=... --format=csv -l 1``).

Such a log is the usual record of what a GPU held during an incident, and a long one: a day of eight
GPUs polled every second is 700,000 rows. Read a row at a time, with each sample a Python tuple, a
day took 10 s and half a gigabyte before the recorder had written a sample. This module reads the
rows as polars columns: the usual shape (one header, perhaps repeated, naming a timestamp and an
index column; nvidia-smi's time format; numbers with or without units, or nvidia-smi's words for
none) becomes a frame of samples in one pass. A row it cannot vouch for (another shape of time, a
cell that is no number, another count of fields) is read by ``nvidia_smi.parse_nvidia_smi_csv``'s own
row reader, which stays the reference for what a row means, and a file of any other shape (no
header, headers that differ, compute-apps rows, GPUs told apart by bus id, text outside printable
ASCII but for Windows' line ends) goes to it whole. Tests check that both give the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from replay.bundle import SAMPLES_SCHEMA
from replay.record import common, nvidia_smi, timecol
from replay.record.options import RecordOptions

_ODD_TEXT = r"[^\t\x20-\x7e]"  # (Python's line breaks and white space beyond these: the reference's)
_TIME = r"^[1-9]\d{3}/\d\d/\d\d \d\d:\d\d:[0-5]\d\.\d{3}$"  # nvidia-smi's, '2026/07/03 22:11:09.763'
_NUMBER = nvidia_smi.NV_NUMBER.pattern  # (its \s is the same in Rust's regex on this lane's text: a tab or a space)
_INFO = (("name", "name"), ("uuid", "uuid"), ("pci.bus_id", "pci_bus_id"), ("hostname", "host"))
FAST_FROM_CHARS = 1 << 20  # (a smaller file is read sooner row by row than the lane's fixed cost of some 30 ms)
PIECE_CHARS = 8 << 20
SLOW_SHARE = 0.25  # past this share of rows the reference's, the reference reads the whole file
_GPU_MAX = (1 << 31) - 1


def parse_nvidia_smi_csv(path: Path, text: str, tz_offset_s: int = 0, columns: str | None = None,
                         at: str | None = None) -> common.Parsed:
    """``nvidia_smi.parse_nvidia_smi_csv``, vectorised where the file has the usual shape and is big
    enough to gain by it."""
    fast = _vectorised(path, text, tz_offset_s, columns, at) if len(text) >= FAST_FROM_CHARS else None
    return fast if fast is not None else nvidia_smi.parse_nvidia_smi_csv(path, text, tz_offset_s, columns, at)


def _pieces(text: str) -> Iterator[pl.DataFrame]:
    """The text's lines (as ``str.splitlines`` cuts this lane's text) in frames of about PIECE_CHARS,
    with their numbers from 1: the columns of a line take some ten times its size, so the whole file
    is never made columns at once."""
    pos, line = 0, 1
    while pos < len(text):
        end = text.find("\n", pos + PIECE_CHARS)
        end = len(text) if end < 0 else end + 1
        raw = pl.Series("raw", [text[pos:end]]).str.split("\n").explode()
        raw = raw.slice(0, raw.len() - 1) if text[end - 1] == "\n" else raw  # (no line after the last line end)
        yield pl.DataFrame(raw).with_row_index("line", offset=line)
        line, pos = line + raw.len(), end


class _Lane:
    """The state of one file's reading: its header, what its rows said of each GPU so far, the samples."""

    def __init__(self, path: Path, tz_offset_s: int, columns: str | None) -> None:
        self.path, self.tz_offset_s, self.columns = path, tz_offset_s, columns
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

    def piece(self, df: pl.DataFrame) -> bool:
        """Read one piece of lines; False where the file is not this lane's."""
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
        if not rows.height:
            return True
        assert self.header is not None
        return self._rows(rows, self.header)

    def _rows(self, rows: pl.DataFrame, header: list[str]) -> bool:
        at = self.at
        metrics = [(k, m) for k, m in nvidia_smi.NVSMI_GPU_FIELDS.items() if k in at]
        info = [k for k, _ in _INFO if k in at]
        # each cell this lane reads, once, as a column of its own ('c:' and its name), on the rows of the
        # header's count of fields
        rows = rows.with_columns(whole=pl.col("raw").str.count_matches(",", literal=True) == len(header) - 1)
        rows = rows.with_columns(_cells=pl.when("whole").then(pl.col("raw").str.split(",")))
        assert self.clock is not None
        rows = rows.with_columns(**{f"c:{k}": pl.col("_cells").list.get(at[k]).str.strip_chars()
                                    for k in (self.clock, "index", *(k for k, _ in metrics), *info)}).drop("_cells")
        stamp, index = pl.col(f"c:{self.clock}"), pl.col("c:index")
        if self.offsets is not None:
            t_us = timecol.offset_expr(stamp, self.offsets)
            if rows.filter(pl.col("whole") & t_us.is_null()).height:
                return False  # (a time that is no offset: the reference tells the file's form by its first row)
        else:
            t_us = (pl.when(stamp.str.contains(_TIME)).then(stamp).str.to_datetime(
                "%Y/%m/%d %H:%M:%S%.3f", time_unit="us", strict=False).dt.epoch("us") - self.tz_offset_s * 1_000_000)
        exprs = {"t_us": t_us, "gpu": pl.when(index.str.contains(r"^\d{1,10}$")).then(index.cast(pl.Int64, strict=False))}
        for k, _ in metrics:
            c = pl.col(f"c:{k}")
            number = c.str.extract_groups(_NUMBER)
            unit = number.struct.field("2").fill_null(nvidia_smi.nv_default_unit(header[at[k]]))
            scale = unit.replace_strict(list(nvidia_smi.NV_SCALE), list(nvidia_smi.NV_SCALE.values()), default=1, return_dtype=pl.Float64)
            exprs[k] = number.struct.field("1").cast(pl.Float64, strict=False) * scale
            exprs[f"{k}?"] = c.is_in([*nvidia_smi.NV_UNKNOWN, "-", ""]) | (c.str.starts_with("[") & c.str.ends_with("]"))
        exprs |= {k: pl.when(~pl.col(f"c:{k}").is_in(list(nvidia_smi.NV_UNKNOWN))).then(pl.col(f"c:{k}")) for k in info}
        rows = rows.with_columns(**exprs)
        if rows.filter(pl.col("whole") & (pl.col("gpu").is_null() | (pl.col("gpu") > _GPU_MAX))).height:
            return False  # (GPUs told apart by bus id, which the reference numbers in bus order over the whole file)
        ok = pl.col("whole") & pl.col("t_us").is_not_null()
        # (a row with a value no GPU can have, ``common.impossible``'s, is the reference's to quarantine; a row's
        # memory is bounded by its own total)
        total = pl.when(~pl.col("memory.total?")).then(pl.col("memory.total")) if "memory.total" in at else pl.lit(None, pl.Float64)
        for k, m in metrics:
            possible = ~common.maybe_impossible(total, pl.lit(m), pl.col(k))
            ok = ok & (pl.col(f"{k}?") | (pl.col(k).is_finite() & possible).fill_null(False))
        rows = rows.with_columns(fast=ok.fill_null(False))
        slow = rows.filter(~pl.col("fast")).select("line", "raw")
        self.rows, self.slow = self.rows + rows.height, self.slow + slow.height
        if self.slow > SLOW_SHARE * self.rows + 1000:
            return False  # (a file of another shape of row: the reference reads it sooner)
        fast = rows.filter("fast").drop("raw")
        if "memory.used" in at:
            self.unstated |= set(fast.filter(pl.col("memory.used?"))["gpu"].unique().to_list())
        self.p.parsed += fast.height
        self.p.naive_local_times |= fast.height > 0 and self.offsets is None
        frames = [fast.filter(pl.col(k).is_not_null() & ~pl.col(f"{k}?")).select(
            "line", "t_us", "gpu", source=pl.lit("nvidia-smi"), metric=pl.lit(m), value=pl.col(k)) for k, m in metrics]
        for r in fast.group_by("gpu").agg(first=pl.col("line").min(), **{
                k: pl.struct("line", k).filter(pl.col(k).is_not_null() & (pl.col(k) != "")).last() for k in info}
                ).iter_rows(named=True):
            self.firsts.setdefault(r["gpu"], r["first"])
            self._say(r["gpu"], {key: (r[src]["line"], r[src][src]) for src, key in _INFO if r.get(src) is not None})
        if "memory.total" in at:
            for g, line, v in fast.filter(pl.col("memory.total").is_not_null() & ~pl.col("memory.total?")).group_by(
                    "gpu").agg(pl.col("line").last(), pl.col("memory.total").last()).iter_rows():
                self._say(g, {"total_bytes": (line, int(v))})
        if slow.height:
            listed = self._slow(slow, header)
            if listed is None:
                return False
            frames.append(listed)
        if frames:
            self.frames.append(pl.concat([f.cast({"gpu": pl.Int32}) for f in frames], how="vertical_relaxed")
                               .sort("line", maintain_order=True).select(*SAMPLES_SCHEMA).cast(SAMPLES_SCHEMA))  # type: ignore[arg-type]
        return True

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
        p.frames = [pl.concat(self.frames) if self.frames else pl.DataFrame(schema=SAMPLES_SCHEMA)]
        for g in sorted(self.said, key=lambda g: self.firsts.get(g, 0)):
            p.gpus[g] = {"index": g, **{key: self.said[g][key][1] for key in (*(k for _, k in _INFO), "total_bytes")
                                        if key in self.said[g]}}
        if self.unstated:
            used = p.frames[0].filter(pl.col("metric") == "device_used_bytes")["gpu"].unique().to_list()
            nvidia_smi.note_no_memory(p, self.path, set(p.gpus) - set(used))
        if not self.rows and self.columns is None:  # (as the reference says of a header without rows)
            p.notes.append(nvidia_smi.header_only_note(self.path, False))
        if self.offsets is not None and self.rows:
            timecol.hold(p, self.offsets.name, "offset", self.tz_offset_s)
        return p


def _vectorised(path: Path, text: str, tz_offset_s: int, columns: str | None,
                at: str | None = None) -> common.Parsed | None:
    """The file as the reference reads it, or None where its shape is not this lane's."""
    if "\r" in text:  # (Windows' line ends, each CR before an LF, cut the same lines; any other CR is a line end)
        if text.count("\r") != text.count("\r\n"):
            return None
        text = text.replace("\r\n", "\n")
    lane = _Lane(path, tz_offset_s, columns)
    p = lane.parsed() if all(lane.piece(df) for df in _pieces(text)) else None
    if p is None:
        return None
    timecol.settle(p, path, common.parse_time(at, tz_offset_s) if at else None)
    return common.set_aside_impossible_values(p, path)  # (as the reference's result has been)


def _parse(path: Path, text: str, opts: RecordOptions) -> common.Parsed:
    return parse_nvidia_smi_csv(path, text, opts.tz_offset_s, opts.nvsmi_columns, opts.at)


PARSERS: dict[str, common.Parser] = {"nvidia-smi": _parse}  # (nvidia-smi's query CSV, as the registry reads it)
