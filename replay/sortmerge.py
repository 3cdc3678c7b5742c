"""A stable sort of Parquet part files into one Parquet file, in memory that does not grow with them.

A bundle's samples are flushed to part files while it is written and sorted into one file when it is
closed. Sorted in one query, a fleet's 22.5M samples (40 parts) took 7.4 s and 4.35 GB of memory; here,
about 4 s and 0.15 GB. The rows are cut by their first sort key (time) into buckets of about
BUCKET_ROWS, at the quantiles of a sample of the keys (``KeySample``), and the buckets are read, sorted
and handed in order to one Parquet writer, which streams them out: the memory is that of a few
buckets, whatever the input.

A part whose keys rise (never fall, no nulls: a source's series, as recorders write it) is read where
it lies, bucket by bucket: a bucket's rows are a range of it, and its row groups' statistics skip the
rest. The other parts are read once, in chunks of about CHUNK_ROWS, and each chunk's rows are spilled
into one Arrow file a bucket. The sort is stable: rows with equal keys keep the order of their parts
and, within a part, the order they were written in (a bucket is read in that order, then sorted with
``maintain_order``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
from polars.io.plugins import register_io_source

from replay.parallel import ordered_map

SORT_IN_MEMORY_ROWS = 1_000_000  # up to this many rows: one sort in memory (as little memory as the buckets)
BUCKET_ROWS = 250_000  # the rows of a bucket, sorted at once (a fleet's day of samples: 500,000 held ~100 MiB
# more in the same time)
CHUNK_ROWS = 250_000  # the rows of parts whose keys do not rise read at once, to be spilled by bucket
SAMPLE_ROWS = 1 << 18  # the buckets are cut at the quantiles of this many keys or up to twice as many
WORKERS = 2  # buckets read and sorted side by side (each is held until it is written)
_ROW, _BUCKET, _KEY = "__row", "__bucket", "__key"  # (columns of the sort's own, dropped before they are written)


@dataclass(frozen=True)
class Part:
    """A part file, its rows, and what is known of its first sort key: the least and the greatest
    (None where it has none), and whether the keys rise (never fall, and none is null); ``rising``
    None: not known yet (``described`` reads it)."""

    path: Path
    rows: int
    lo: int | None = None
    hi: int | None = None
    rising: bool | None = None


class KeySample:
    """Every n-th key of the rows it is given, n doubling as they grow so that at most 2 x SAMPLE_ROWS
    are held: the buckets are cut at its quantiles. Given the keys of parts as they are written, the
    merge need not read the parts for them (20,000 small parts of a live recording took 5 s)."""

    def __init__(self) -> None:
        self.step = 1
        self._rows = 0
        self._held = 0
        self._keys: list[pl.Series] = []

    def add(self, keys: pl.Series) -> None:
        taken = keys.gather_every(self.step, -self._rows % self.step).drop_nulls()
        self._rows += keys.len()
        self._keys.append(taken)
        self._held += taken.len()
        if self._held > 2 * SAMPLE_ROWS or len(self._keys) > 256:  # (a few series, not one a part)
            held = pl.concat(self._keys, rechunk=True)
            while held.len() > 2 * SAMPLE_ROWS:
                held, self.step = held.gather_every(2), self.step * 2
            self._keys, self._held = [held], held.len()

    def bounds(self, total: int) -> list[int]:
        """The keys that cut ``total`` rows into buckets of about BUCKET_ROWS (``_cut``)."""
        return _cut(pl.concat(self._keys) if self._keys else pl.Series(dtype=pl.Int64), total)


def frame_part(path: Path, df: pl.DataFrame, key: str, sample: KeySample | None = None) -> Part:
    """The Part of ``df``, written to ``path``, its keys added to ``sample`` (its key column, already
    in memory: a few ms a million rows)."""
    s = df[key]
    if sample is not None:
        sample.add(s)
    return Part(path, df.height, _int(s.min()), _int(s.max()), s.null_count() == 0 and s.is_sorted())


def parquet_rows(path: Path) -> int:
    """A Parquet file's rows, from its metadata."""
    return int(pl.scan_parquet(path).select(pl.len()).collect().item())


def described(part: Part, key: str, sample: KeySample | None = None) -> Part:
    """``part`` with its keys' range and order, read from its key column CHUNK_ROWS at a time (and
    added to ``sample``)."""
    los: list[int] = []
    his: list[int] = []
    rising = True
    for off in range(0, part.rows, CHUNK_ROWS):
        s = pl.scan_parquet(part.path).select(key).slice(off, CHUNK_ROWS).collect().to_series()
        if sample is not None:
            sample.add(s)
        # (while the keys rise, the greatest of the slices before is the last of them)
        rising = rising and s.null_count() == 0 and s.is_sorted() and (not his or s.is_empty() or s[0] >= his[-1])
        if s.null_count() < s.len():
            los.append(int(s.min()))  # type: ignore[arg-type]
            his.append(int(s.max()))  # type: ignore[arg-type]
    return Part(part.path, part.rows, min(los, default=None), max(his, default=None), rising)


def sort_parts(parts: Sequence[Part], out: Path, by: Sequence[str], spill: Path,
               remove: Callable[[Path], None], sample: KeySample | None = None) -> None:
    """Write the rows of ``parts``, in their order, to the Parquet file ``out``, sorted stably by
    ``by`` (nulls first); ``by[0]`` is an integer column. Rows that do not fit one sort in memory
    are sorted bucket by bucket; those of parts whose keys do not rise are spilled into the folder
    ``spill`` (made here, and handed to ``remove`` once ``out`` is written or has failed).
    ``sample``: the keys of every part whose order is known (``frame_part``); the others' are read
    into it. Without it, a sample is read from every part."""
    total = sum(p.rows for p in parts)
    if total <= SORT_IN_MEMORY_ROWS:
        pl.scan_parquet([p.path for p in parts]).sort(by, maintain_order=True).sink_parquet(out)
        return
    key = by[0]
    runs = _runs([p if p.rising is not None else described(p, key, sample) for p in parts])
    bounds = sample.bounds(total) if sample is not None else _bounds([p.path for p in parts if p.rows], key, total)
    spilling = any(not r.rising for r in runs)
    if spilling:
        spill.mkdir()
    try:
        _spill(runs, bounds, key, spill)
        _write(runs, bounds, by, out, pl.read_parquet_schema(parts[0].path))
    finally:
        if spilling:
            remove(spill)


@dataclass
class _Run:
    """Consecutive parts read alike: where they lie (their keys rise), or once and spilled by bucket
    (``pieces``: a bucket's spilled files, in the order of the rows in them)."""

    parts: list[Part]
    rising: bool
    pieces: dict[int, list[Path]] = field(default_factory=dict)

    def bucket(self, k: int, lo: int | None, hi: int | None, key: str) -> pl.LazyFrame | None:
        """The rows of this run in bucket ``k`` (keys from ``lo`` up to ``hi``; None: no end), in order."""
        if not self.rising:
            return pl.scan_ipc(self.pieces[k]) if k in self.pieces else None
        paths = [p.path for p in self.parts if p.rows and p.lo is not None and p.hi is not None
                 and (lo is None or p.hi >= lo) and (hi is None or p.lo < hi)]
        if not paths:
            return None
        within = [c for c in ((pl.col(key) >= lo) if lo is not None else None,
                              (pl.col(key) < hi) if hi is not None else None) if c is not None]
        return pl.scan_parquet(paths).filter(*within) if within else pl.scan_parquet(paths)


def _runs(parts: list[Part]) -> list[_Run]:
    """``parts`` in runs of consecutive ones read alike. Rising parts of fewer rows in all than a
    chunk are spilled with the parts around them: read where they lie, each run would cost every
    bucket a query (10M samples in 20,000 small parts, every other one rising, took four minutes)."""
    runs: list[_Run] = []
    for p in parts:
        _extend(runs, [p], bool(p.rising))
    merged: list[_Run] = []
    for r in runs:
        _extend(merged, r.parts, r.rising and sum(p.rows for p in r.parts) >= CHUNK_ROWS)
    return merged


def _extend(runs: list[_Run], parts: list[Part], rising: bool) -> None:
    if runs and runs[-1].rising == rising:
        runs[-1].parts.extend(parts)
    else:
        runs.append(_Run(list(parts), rising))


def _bounds(paths: list[Path], key: str, total: int) -> list[int]:
    """``_cut`` of every n-th key of the files ``paths``, about SAMPLE_ROWS of them."""
    step = max(1, total // SAMPLE_ROWS)
    return _cut(pl.scan_parquet(paths, row_index_name=_ROW).filter(pl.col(_ROW) % step == 0)
                .select(pl.col(key).drop_nulls()).collect().to_series(), total)


def _cut(keys: pl.Series, total: int) -> list[int]:
    """The keys that cut ``total`` rows into buckets of about BUCKET_ROWS, from a sample of their keys
    (bucket k holds the keys from bound k-1 up to bound k; the first, those below bound 0 and the
    nulls). Rows of one key are never cut apart: a bucket of a key held by more rows than BUCKET_ROWS
    is as large as that."""
    k = math.ceil(total / BUCKET_ROWS)
    if keys.is_empty() or k < 2:
        return []
    keys = keys.sort()
    return keys.gather([keys.len() * i // k for i in range(1, k)]).unique(maintain_order=True).to_list()


def _chunks(parts: list[Part]) -> Iterator[pl.LazyFrame]:
    """The rows of ``parts``, in order, in queries of about CHUNK_ROWS: small parts together, a
    large one in slices."""
    group: list[Path] = []
    rows = 0
    for p in parts:
        if group and (rows + p.rows > CHUNK_ROWS or p.rows > CHUNK_ROWS):
            yield pl.scan_parquet(group)
            group, rows = [], 0
        if p.rows > CHUNK_ROWS:
            yield from (pl.scan_parquet(p.path).slice(off, CHUNK_ROWS) for off in range(0, p.rows, CHUNK_ROWS))
        elif p.rows:
            group.append(p.path)
            rows += p.rows
    if group:
        yield pl.scan_parquet(group)


def _spill(runs: list[_Run], bounds: list[int], key: str, spill: Path) -> None:
    """Read the runs whose keys do not rise a chunk at a time, WORKERS chunks side by side, and write
    each chunk's rows of each bucket to a file of its own (Arrow, uncompressed: written once and read
    once, soon after)."""
    cut = pl.lit(pl.Series(bounds, dtype=pl.Int64))
    bucket = pl.when(pl.col(key).is_null()).then(0).otherwise(cut.search_sorted(pl.col(key), side="right")).alias(_BUCKET)
    chunks = enumerate((r, lf) for r in runs if not r.rising for lf in _chunks(r.parts))

    def spilled(item: tuple[int, tuple[_Run, pl.LazyFrame]]) -> tuple[_Run, list[tuple[int, Path]]]:
        c, (run, lf) = item
        written = []
        for (k,), piece in lf.with_columns(bucket).collect().partition_by(_BUCKET, as_dict=True, include_key=False).items():
            path = spill / f"{c:06d}-{k:06d}.arrow"
            piece.write_ipc(path)
            written.append((int(k), path))
        return run, written

    # (closed as the loop is left, an error's way too: no chunk is spilled after the caller's cleanup)
    with contextlib.closing(ordered_map(spilled, chunks, workers=WORKERS, ahead=WORKERS)) as done:
        for run, written in done:
            for k, path in written:
                run.pieces.setdefault(k, []).append(path)


def _write(runs: list[_Run], bounds: list[int], by: Sequence[str], out: Path, schema: dict[str, pl.DataType]) -> None:
    """Read and sort the buckets in WORKERS threads, each while the one before it is written, and
    stream them in order into ``out`` (a Python source of polars' sunk to Parquet: no sorted copy on
    disk)."""
    key = by[0]

    def sorted_bucket(k: int) -> pl.DataFrame:
        lo, hi = (bounds[k - 1] if k else None), (bounds[k] if k < len(bounds) else None)
        frames = [f for r in runs if (f := r.bucket(k, lo, hi, key)) is not None]
        return sorted_frame(pl.concat(frames).collect(), by) if frames else pl.DataFrame(schema=schema)

    with contextlib.closing(ordered_map(sorted_bucket, range(len(bounds) + 1), workers=WORKERS, ahead=WORKERS)) as buckets:
        sink_frames(buckets, schema, out)  # (the buckets' reading ends with the sink, however it ends)


def sink_frames(frames: Iterable[pl.DataFrame], schema: Mapping[str, Any], out: Path, **parquet: Any) -> None:
    """Write ``frames`` (each of ``schema``) to the Parquet file ``out`` as they come: a Python source of
    polars' sunk, no frame held once it is written. ``frames`` is read once; ``parquet``: the sink's options."""
    taken: list[bool] = []

    def source(with_columns: list[str] | None, predicate: pl.Expr | None, n_rows: int | None,
               batch_size: int | None) -> Iterator[pl.DataFrame]:
        if taken:  # (a second reading would find it spent)
            raise RuntimeError(f"{out.name}: the frames to write were asked for twice")
        taken.append(True)
        # (a sink takes every row and column; a projection or a filter is applied where asked)
        for df in frames:
            df = df if predicate is None else df.filter(predicate)
            yield df if with_columns is None else df.select(with_columns)

    register_io_source(source, schema=dict(schema)).sink_parquet(out, **parquet)


def sorted_frame(df: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    """``df`` sorted stably by ``by`` (nulls first), as ``df.sort(by, maintain_order=True)``. Where
    ``by`` is an integer column then text or category columns, as a bundle's samples are (t_us, source,
    metric), they are sorted as one integer: time, then each text's place among the texts in ``df``.
    A bucket of a fleet's day's samples (250k rows, categories; a capture's GPUs and metrics share each
    second, so polars' sort of the three columns compares the categories' texts at every tie) took 24-30
    CPU-ms that way, 12-13 as one integer (each category's place found among the codes present); a
    million texts in no order, 0.3 s against 0.7. (Where the times seldom tie, polars' own sort is as
    fast or faster: 250k rows in 8 sorted runs of distinct times, 7 CPU-ms against 20.)"""
    key, texts = by[0], list(by[1:])
    if not df.schema[key].is_integer() or any(not isinstance(df.schema[c], pl.String | pl.Categorical) for c in texts):
        return df.sort(by, maintain_order=True)
    lo, hi = _int(df[key].min()), _int(df[key].max())
    places = [_places(df[c]) for c in texts]
    span = 0 if lo is None or hi is None else hi - lo + 2  # (a null time: one below the least)
    for _, n in places:
        span *= n + 1
    if lo is None or hi is None or not 0 < span < 1 << 63:  # (no time but nulls, or too wide a range for 64 bits)
        return df.sort(by, maintain_order=True)
    whole = df.select((pl.col(key) - lo + 1).fill_null(0).cast(pl.Int64)).to_series().to_numpy()
    for place, n in places:  # (a text's place: 1 + its rank among the texts, sorted; null: 0)
        whole = whole * (n + 1) + place
    return df[np.argsort(whole, kind="stable")]


def _places(s: pl.Series) -> tuple[npt.NDArray[np.int64], int]:
    """Each row's place among the distinct texts of ``s`` sorted (1 for the least; 0 for null), and how
    many texts there are. A category's place is found by its code among the codes present (sorted and
    searched: a process's categories share their codes, which may be of any size)."""
    u = s.unique().drop_nulls()
    if not u.len():
        return np.zeros(s.len(), np.int64), 0
    if s.dtype == pl.String:
        return (s.cast(pl.Enum(u.sort())).to_physical().cast(pl.Int64) + 1).fill_null(0).to_numpy(), u.len()
    codes = u.to_physical().cast(pl.Int64).to_numpy()  # (a process's categories share their codes: few here, any values)
    by_code = np.argsort(codes)
    place = np.empty(len(codes), np.int64)
    place[np.argsort(u.cast(pl.String).to_numpy(), kind="stable")] = np.arange(1, len(codes) + 1)
    phys = s.to_physical().cast(pl.Int64)
    found = place[by_code[np.searchsorted(codes[by_code], phys.fill_null(codes[0]).to_numpy())]]
    return np.where(phys.is_null().to_numpy(), 0, found), len(codes)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)
