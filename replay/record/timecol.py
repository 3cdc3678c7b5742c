"""The time column of CSV evidence that experiment scripts write: absolute (ISO, epoch), an offset from
the start of the run ('time [s]', 'elapsed', 't', 'time_ms', a 'timestamp' of small numbers), or a
time of day without a date ('09:59:00'). Samples at offsets or times of day are held apart
(``Unplaced``) until something places them: ``--at FILE=START``, or else the earliest absolute time of
the other evidence of the same recording; each placement is noted, and samples nothing places are
quarantined with their count, never put on the timeline at a guess."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import polars as pl

from replay.bundle import SAMPLES_SCHEMA

if TYPE_CHECKING:
    from replay.record.common import Parsed

Form = Literal["offset", "time of day"]
DAY_US = 86_400_000_000
OFFSET_BELOW_S = 1e8  # an offset this many seconds or more (three years) is no run's: an epoch time, a date
NAME_PATTERN = (r"(?i)^(?P<base>time|elapsed|elapsed_time|t|time_s|time_ms|t_s|t_ms|elapsed_s|elapsed_ms|"
                r"seconds|secs|timestamp|relative_time|rel_time|time_since_start)"
                r"(?:\s*[\[(](?P<unit>s|sec|secs|seconds|ms|us|µs)[\])])?$")  # (Python's and polars' alike)
_NAME = re.compile(NAME_PATTERN)
_US_PER = {"s": 1_000_000, "sec": 1_000_000, "secs": 1_000_000, "seconds": 1_000_000, "ms": 1000, "us": 1, "µs": 1}
_DECIMAL = re.compile(r"^\d+(?:\.\d*)?$|^\.\d+$")
_DECIMAL_PATTERN = _DECIMAL.pattern
_TIME_OF_DAY = re.compile(r"^(\d{1,2}):([0-5]\d):([0-5]\d)(\.\d{1,6})?$")


@dataclass(frozen=True)
class TimeColumn:
    """A CSV column that may hold times relative to a start: its header cell, and µs per unit of an offset."""

    name: str
    us_per_unit: int


def time_column(header: str) -> TimeColumn | None:
    """The column ``header`` as a time column that may hold offsets ('time [s]', 'elapsed_ms', 't',
    'timestamp'), else None. Seconds unless the name says ms or µs."""
    m = _NAME.match(header.strip())
    if m is None:
        return None
    unit = (m["unit"] or "").lower() or ("ms" if m["base"].lower().endswith("_ms") else "s")
    return TimeColumn(header.strip(), _US_PER[unit])


def offset_us(cell: str, col: TimeColumn) -> int | None:
    """A cell of ``col`` as an offset from the run's start (µs), where it is a plain non-negative number
    short of OFFSET_BELOW_S; None otherwise (an epoch time, a date, damage)."""
    c = cell.strip()
    if not _DECIMAL.match(c):
        return None
    v = float(c) * col.us_per_unit
    return round(v) if v < OFFSET_BELOW_S * 1_000_000 else None


def offset_expr(cell: pl.Expr, col: TimeColumn) -> pl.Expr:
    """``offset_us`` as one vectorised expression of a column of stripped cells (null where it is None)."""
    v = pl.when(cell.str.contains(_DECIMAL_PATTERN)).then(cell).cast(pl.Float64, strict=False) * col.us_per_unit
    return pl.when(v < OFFSET_BELOW_S * 1_000_000).then(v.round(0).cast(pl.Int64))


def time_of_day_us(cell: str) -> int | None:
    """'HH:MM:SS[.ffffff]' as µs since midnight; None for anything else."""
    m = _TIME_OF_DAY.match(cell.strip())
    if m is None or int(m[1]) > 23:
        return None
    return (int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])) * 1_000_000 + round(float(m[4] or 0) * 1_000_000)


@dataclass
class Unplaced:
    """A file's samples at offsets from its start or at times of day, not yet on the timeline.
    ``frame`` is of SAMPLES_SCHEMA with ``t_us`` µs from the column's zero (offsets) or since the
    midnight before the first row (times of day, a day added each time the clock passes midnight)."""

    column: str
    form: Form
    frame: pl.DataFrame
    tz_offset_s: int = 0  # (times of day: the zone they are in)

    def placed(self, anchor_us: int) -> pl.DataFrame:
        """The samples on the timeline: offsets from ``anchor_us``; times of day on the day that puts the
        first row nearest ``anchor_us``."""
        return self.frame.with_columns(pl.col("t_us") + self._zero_us(anchor_us))

    def _zero_us(self, anchor_us: int) -> int:
        if self.form == "offset":
            return anchor_us
        first = int(self.frame["t_us"].min() or 0)  # type: ignore[arg-type]
        tz_us = self.tz_offset_s * 1_000_000
        return round((anchor_us - first + tz_us) / DAY_US) * DAY_US - tz_us

    def first_us(self, anchor_us: int) -> int | None:
        lo = self.frame["t_us"].min()
        return None if lo is None else int(lo) + self._zero_us(anchor_us)  # type: ignore[arg-type]


Reading = Literal["absolute", "offset", "time of day"]


@dataclass
class RowClock:
    """Reads one file's time cells in file order. The first row's form (absolute, offset, time of day)
    is the file's; a row of another form is damage. A column named 'timestamp' is read as an absolute
    time first (an offset where it is a small number); any other time column as an offset first."""

    name: str  # the column's name, as reasons give it
    col: TimeColumn | None  # None: absolute times only
    absolute: Callable[[str], int | None]
    form: Reading | None = None
    _day_us: int = 0
    _last: tuple[str, int | None] = ("", None)
    _order: tuple[Reading, ...] = field(init=False)

    def __post_init__(self) -> None:
        self._order = (("absolute",) if self.col is None else ("absolute", "offset", "time of day") if self.name == "timestamp"
                       else ("offset", "time of day", "absolute"))

    def _as(self, form: Reading, cell: str) -> int | None:
        if form == "absolute":
            return self.absolute(cell)
        if form == "offset":
            assert self.col is not None
            return offset_us(cell, self.col)
        return time_of_day_us(cell)

    def read(self, cell: str) -> tuple[int | None, str | None]:
        """The cell's time (epoch µs; an offset or time of day as ``Unplaced`` holds them), or None and
        the reason it has none."""
        if cell == self._last[0] and self._last[1] is not None:  # (a poll's rows share their time)
            return self._last[1], None
        forms = self._order if self.form is None else (self.form,)
        form, t = next(((f, t) for f in forms if (t := self._as(f, cell)) is not None), (None, None))
        if form is None or t is None:
            if self.form is not None and any(self._as(f, cell) is not None for f in self._order):
                return None, f"a time of another form than the first row's ({self.form}): {cell!r}"
            return None, f"unparseable {self.name} {cell!r}"
        self.form = form
        if form == "time of day":
            if self._last[1] is not None and t + self._day_us < self._last[1] - DAY_US // 2:
                self._day_us += DAY_US  # (earlier than the row before: the run went past midnight)
            t += self._day_us
        self._last = (cell, t)
        return t, None


def unplaced_frame(samples: list[tuple[int | None, int | None, str, str, float]]) -> pl.DataFrame:
    """Listed samples (their times: offsets) as a frame of SAMPLES_SCHEMA."""
    return pl.DataFrame(samples, schema=SAMPLES_SCHEMA, orient="row", strict=False)


def utc_text(t_us: int) -> str:
    """Epoch µs as ISO UTC to the millisecond, as the notes give times."""
    return datetime.fromtimestamp(t_us / 1e6, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _what(u: Unplaced) -> str:
    held = "offsets from the start of the run" if u.form == "offset" else "times of day without a date"
    return f"its '{u.column}' column holds {held}"


def placed_note(path: Path, u: Unplaced, anchor_us: int, how: str) -> str:
    """The note of a file whose samples were placed by ``anchor_us`` (``how``: where that time came from)."""
    first = u.first_us(anchor_us)
    where = (f"its zero placed at {utc_text(anchor_us)}" if u.form == "offset"
             else f"dated by {utc_text(anchor_us)}, its first row at {utc_text(first or anchor_us)}")
    return f"{path.name}: {_what(u)}: {u.frame.height} samples, {where} ({how})"


def unplaced_note(path: Path, u: Unplaced) -> str:
    """The note of a file whose samples nothing placed."""
    return (f"{path.name}: {_what(u)}, and nothing in the recording states an absolute time to place them by: "
            f"{u.frame.height} samples quarantined; pass --at {path.name}=START with when the run began")


def unplaced_reason(u: Unplaced) -> str:
    """The quarantine entry's reason for the samples of ``u`` nothing placed."""
    return f"{u.frame.height} samples at times relative to the run's start ('{u.column}'), which nothing placed"


def hold(p: Parsed, column: str, form: Form, tz_offset_s: int = 0) -> None:
    """Move every sample of ``p`` (their times: offsets or times of day, as ``Unplaced`` holds them)
    into ``p.unplaced`` (nothing where it has none)."""
    frames = [f for f in (*p.frames, unplaced_frame(p.samples)) if f.height]
    if not frames:
        return
    frame = pl.concat(frames, how="vertical_relaxed").cast(SAMPLES_SCHEMA)  # type: ignore[arg-type]
    p.samples, p.frames = [], []
    p.unplaced = Unplaced(column, form, frame, tz_offset_s)


def settle(p: Parsed, path: Path, at_us: int | None) -> Parsed:
    """Place ``p``'s unplaced samples at ``at_us`` (``--at``, when the run began), and say so; without it
    they wait for the recorder, which places them by the other evidence."""
    u = p.unplaced
    if u is None or at_us is None:
        return p
    p.frames = [*p.frames, u.placed(at_us)] if p.frames or p.samples else [u.placed(at_us)]
    p.unplaced = None
    p.notes.append(placed_note(path, u, at_us, "from --at"))
    return p
