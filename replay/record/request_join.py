"""The request join: one requests.parquet row per request id, from the request facts that the logs'
readers spilled (``fastlog.FastFacts``): its first arrival and the details its lines gave, its earliest
finish, whether it was aborted, and where in which log it was first seen.

A day of a fleet's logs holds tens of millions of request facts; the join holds at most
``fastlog.BUCKET_FACTS`` of them at once. It reads the spilled facts a group of pieces at a time and
makes each group's partial rows (``_partials``: most requests are one arrival and one finish within a
group), finds from their hashes alone the ids that several groups have, yields each group's
requests.parquet rows of the others (``_request_rows``), then splits the rows of those ids by a hash of
the id into buckets and merges each bucket's rows of an id (``_merge``)."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import tempfile
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import polars as pl

from replay.bundle import REQUESTS_SCHEMA
from replay.parallel import ordered_map
from replay.record import fastlog
from replay.record.fastlog import FastFacts, buckets_for

POS_SHIFT = 40  # a request fact's place in the logs: the log's index above its line number
SPLIT_THREADS = 3  # groups split side by side, and ROWS_THREADS groups' rows made side by side while the sink
ROWS_THREADS = 2  # encodes the last (eager polars work is mostly single-threaded, and numpy's indexing holds
# the GIL). A fleet's day: the split kept 1.48-1.53 cores busy in two threads, 1.40-1.67 in three, 1.69-1.73
# in four; the rows 1.58-1.64 in one thread, 1.74-1.83 in two. The three and two together made the record
# 2-15 s sooner in 6 of 7 runs taken in turns, its peak 910-1070 MiB against 847-890 (the groups in flight,
# each thread's freed pages held in an arena of its own), and 731-858 once the recorder's allocator kept an
# arena for each CPU (``malloc.RECORD_ARENAS``)


class LogRequests(Protocol):
    """What the join reads of a log: its name (a row's ``source``), its spilled facts, and how its
    lines' times are placed on the bundle's clock."""

    @property
    def name(self) -> str: ...
    @property
    def ff(self) -> FastFacts: ...
    @property
    def timed(self) -> Callable[[pl.LazyFrame], pl.LazyFrame]: ...


def requests_from_logs(logs: Sequence[LogRequests], t0: int, keep_prompts: bool, spill: Path, remove: Callable[[Path], None],
                       stage: Callable[[str], None] | None = None) -> Generator[pl.DataFrame, None, None]:
    """One row per request id seen in the logs: arrival (received/added), finish, abort, and the
    memory-relevant parameters of its 'Received request' line. The prompt itself is kept only with
    --keep-prompts; otherwise its length and sha256 (of the prompt as logged) stand in for it. A
    request whose arrival is not in the log (it was in flight when the log starts) still has a row,
    with its finish and no arrival. An id in several logs (captures that overlap) is one request, its
    first arrival that of the first log that has one.

    Memory stays bounded however long the log: the request facts are read a group of pieces at a time
    (at most BUCKET_FACTS facts; a streaming query over all of them measured twice the memory), and each
    group's partial rows are written to the group's one file. The ids that several groups have are
    found from the 64-bit hashes of the ids, a range of hashes at a time (``_GroupPartials``). Each
    group's rows of the other ids are then yielded, group by group, each in log order (a fleet's day's
    requests.parquet: 48 MB, against 448 MB in the order of hash buckets); the rows of those ids are
    split into buckets by their hash, and each bucket (at most BUCKET_FACTS rows) is merged on its own
    and yielded after. The spilled request facts are handed to ``remove`` as soon as they are read;
    each group's file once its rows are yielded; the buckets' files once every bucket is merged."""
    every = [f for log in logs for f in log.ff.requests]
    if not every:
        return
    facts = _Facts(logs)
    aborted = _aborted(facts.of([f for log in logs for f in log.ff.slow_requests]))
    sizes = [facts.rows(f) for f in every]
    n_facts = sum(sizes)
    if stage is not None:
        stage(f"joining {n_facts:,} request lines")
    if buckets_for(n_facts) == 1:
        yield _request_bucket(facts.of(every).filter(pl.col("kind") != "request_aborted"), aborted, facts.names, t0,
                              keep_prompts)
        return
    groups = _groups(every, sizes)

    def split(g: int) -> None:
        group = facts.of(groups[g]).filter(pl.col("kind") != "request_aborted").collect()
        for f in groups[g]:
            remove(f)
        # (fast-lane facts have no details: their null columns cost a fifth of the join below)
        group = group.drop([c for c in fastlog.REQUEST_DETAILS if group[c].null_count() == group.height])
        parts.write(g, *_partials(group))

    def rows(g: int) -> pl.DataFrame | None:
        partials = parts.take(g, again)  # (less the rows of ids in other groups too: they go to ``again``)
        return None if partials is None else _request_rows(partials, aborted, facts.names, t0, keep_prompts)

    def merged(b: int) -> pl.DataFrame | None:
        partials = again.bucket(b)
        return None if partials is None else _request_rows(_merge(partials), aborted, facts.names, t0, keep_prompts)

    # the groups made side by side; then their rows, in order, while the sink encodes the last; then the rows
    # of the ids in several groups merged, a bucket at a time
    spill.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=spill, prefix="requests-"))
    parts = _GroupPartials(tmp, remove)
    again = _GroupFiles(tmp, 0)
    try:
        # (each pool closed as its loop is left, by an error or the consumer: the group being split, or the
        # group being read, ends before the files it writes or reads and their descriptors go)
        with contextlib.closing(ordered_map(split, range(len(groups)), workers=SPLIT_THREADS,
                                            ahead=SPLIT_THREADS)) as splits:
            for _ in splits:
                pass
        repeated = parts.find_repeated()
        again = _GroupFiles(tmp, buckets_for(repeated) if repeated else 0)
        steps = len(groups) + again.nb
        # (the buckets' pool starts once the groups' is spent: their rows are written to ``again`` as it runs)
        with contextlib.closing(ordered_map(rows, range(len(groups)), workers=ROWS_THREADS,
                                            ahead=ROWS_THREADS + 1)) as whole, \
                contextlib.closing(ordered_map(merged, range(again.nb), workers=1, ahead=2)) as shared:
            for k, out in enumerate(itertools.chain(whole, shared), start=1):
                if out is not None:
                    yield out
                if stage is not None:
                    stage(f"joining {n_facts:,} request lines: part {k} of {steps} done")
    finally:
        again.close()
        remove(tmp)


class _Facts:
    """The logs' spilled request facts as the join reads them: each placed on the bundle's clock (``t``)
    and in the logs (``line``: the log's index above its line number), the id's hash as ``h``."""

    def __init__(self, logs: Sequence[LogRequests]) -> None:
        self.logs = logs
        self.names = [log.name for log in logs]
        self.owner = {f: i for i, log in enumerate(logs) for f in log.ff.requests}  # (slow_requests are among them)

    def rows(self, f: Path) -> int:
        """Spilled file ``f``'s facts: as its log's reader counted them, else from its footer (a fleet's
        day's 167 footers read took 0.6 s)."""
        n = self.logs[self.owner[f]].ff.request_rows.get(f)
        return int(pl.scan_ipc(f).select(pl.len()).collect().item()) if n is None else n

    def of(self, files: list[Path]) -> pl.LazyFrame:
        if not files:
            return pl.LazyFrame(schema={"request_id": pl.Utf8, "h": pl.UInt64, "kind": fastlog.REQUEST_KINDS,
                                        "t": pl.Int64, **fastlog.REQUEST_DETAILS, "line": pl.Int64})
        return pl.concat([self._of(f, self.owner[f]) for f in files], how="diagonal_relaxed")

    def _of(self, f: Path, i: int) -> pl.LazyFrame:
        log = self.logs[i]
        return log.timed(log.ff.requests_frame([f])).select(
            "request_id", "rh", "kind", "t", *fastlog.REQUEST_DETAILS, line=pl.col("line") + (i << POS_SHIFT)
        ).rename({"rh": "h"})


def _aborted(facts: pl.LazyFrame) -> pl.Series:
    """The hashes of the ids that 'Aborted request(s) a, b, c' facts name (few: only the line-by-line
    parser's facts hold them)."""
    return facts.filter(pl.col("kind") == "request_aborted").select(
        h=pl.col("request_id").str.split(",").list.eval(pl.element().str.strip_chars().hash(seed=fastlog.ID_SEED))
    ).explode("h").unique().collect()["h"]


def _groups(files: list[Path], sizes: list[int]) -> list[list[Path]]:
    """Consecutive fact files in groups of at most BUCKET_FACTS facts (a file of more, alone)."""
    groups: list[list[Path]] = [[]]
    held = 0
    for f, n in zip(files, sizes, strict=True):
        if held + n > fastlog.BUCKET_FACTS and groups[-1]:
            groups.append([])
            held = 0
        groups[-1].append(f)
        held += n
    return groups


class _GroupPartials:
    """Each group's partial rows, whole in the group's one file, with the hashes of their ids sorted
    beside them; once every group is written, the ids some other group has too are found from the
    hashes alone (``find_repeated``), and only their rows are split by bucket to be merged. Most of a
    fleet's day's 27M requests are whole within a group: split by bucket, every group's rows made
    groups × buckets streams (26,219), written and read back in ~12 thread-s."""

    RANGE_HASHES = 4_000_000  # hashes sorted at once to find those of several groups (32 MB)

    def __init__(self, folder: Path, remove: Callable[[Path], None]) -> None:
        self.folder = folder
        self.remove = remove
        self.rows: dict[int, int] = {}  # each group's partial rows
        self.repeated: set[int] = set()  # the groups with rows of ids in other groups too

    def _path(self, kind: str, g: int) -> Path:
        return self.folder / f"{kind}{g:05d}.{'arrow' if kind == 'p' else 'u64'}"

    def write(self, g: int, partials: pl.DataFrame, hashes: npt.NDArray[np.uint64]) -> None:
        """Group ``g``'s partial rows, and their hashes sorted (``_partials`` found them so)."""
        partials.write_ipc(self._path("p", g))  # (an IPC file: a group's rows as one stream took 4 times as long)
        hashes.tofile(self._path("h", g))
        self.rows[g] = partials.height

    def find_repeated(self) -> int:
        """Note, beside each group's file, the hashes of its ids that other groups have too, a range of
        hashes at a time (at most RANGE_HASHES of them, two ranges side by side: a sort leaves the GIL);
        how many rows they are."""
        hashes = {g: np.memmap(self._path("h", g), dtype=np.uint64, mode="r") for g, n in sorted(self.rows.items()) if n}
        n = -(-sum(len(h) for h in hashes.values()) // self.RANGE_HASHES)
        ends = [None, *(np.uint64(((r + 1) << 64) // n) for r in range(n - 1)), None]

        def repeated(r: int) -> dict[int, npt.NDArray[np.uint64]]:
            lo, hi = ends[r], ends[r + 1]
            cut = {g: h[0 if lo is None else np.searchsorted(h, lo):len(h) if hi is None else np.searchsorted(h, hi)]
                   for g, h in hashes.items()}
            every = pl.Series(np.concatenate(list(cut.values()))).sort().to_numpy()
            twice = np.unique(every[1:][every[1:] == every[:-1]])
            if not twice.size:
                return {}
            seen = {g: h[twice[np.searchsorted(twice, h).clip(max=twice.size - 1)] == h] for g, h in cut.items()}
            return {g: h for g, h in seen.items() if h.size}

        found = 0
        with contextlib.closing(ordered_map(repeated, range(n), workers=2, ahead=2)) as ranges:
            for seen in ranges:
                for g, h in seen.items():
                    with self._path("a", g).open("ab") as fh:
                        h.tofile(fh)
                    self.repeated.add(g)
                    found += h.size
        hashes.clear()
        for g in self.rows:
            self.remove(self._path("h", g))
        return found

    def take(self, g: int, again: _GroupFiles) -> pl.DataFrame | None:
        """Group ``g``'s partial rows of ids no other group has (None where it has none); those of the
        others written to ``again``."""
        if not self.rows.get(g):
            return None
        partials = pl.read_ipc(self._path("p", g))
        self.remove(self._path("p", g))
        if g in self.repeated:
            twice = partials["h"].is_in(pl.Series(np.fromfile(self._path("a", g), dtype=np.uint64)).implode())
            self.remove(self._path("a", g))
            again.write(g, partials.filter(twice))
            partials = partials.filter(~twice)
        return _with_details(partials)


class _GroupFiles:
    """Each group's partial rows of the ids several groups have, split by bucket (the id's hash modulo
    ``nb``): one Arrow IPC stream a bucket, one after another in the group's one file, and where each
    bucket's stream lies in which. (A file for each bucket and group made (rows/BUCKET_FACTS)² of them;
    a file a bucket, appended to by each group, cost more in opening and writing.) Written by several
    threads, each to the files of its own groups; read from one thread once every group is written."""

    def __init__(self, folder: Path, nb: int) -> None:
        self.folder = folder
        self.nb = nb
        self.spans: list[list[tuple[int, int, int]]] = [[] for _ in range(nb)]  # (group, start, end)
        self.fds: dict[int, int] = {}  # (each group's file, opened once for every bucket's read of it)

    def path(self, g: int) -> Path:
        return self.folder / f"g{g:05d}.arrows"

    def write(self, g: int, partials: pl.DataFrame) -> None:
        # (each stream made in memory and written whole: polars writing to a Python file object, a bucket's
        # file opened to append to it, cost 2-4 times as much; an IPC stream is a third cheaper to write than
        # an IPC file, and half as costly to read back whole)
        parts = partials.with_columns(bucket=pl.col("h") % self.nb).partition_by("bucket", as_dict=True,
                                                                                  include_key=False)
        with self.path(g).open("wb") as fh:
            for (b,), part in parts.items():
                buf = io.BytesIO()
                part.write_ipc_stream(buf)
                at = fh.tell()
                fh.write(buf.getbuffer())
                self.spans[b].append((g, at, fh.tell()))

    def bucket(self, b: int) -> pl.DataFrame | None:
        """Bucket ``b``'s partial rows of every group, in the groups' order (None where it has none)."""
        if not self.spans[b]:
            return None
        return _with_details(pl.concat([self._stream(g, o, e) for g, o, e in sorted(self.spans[b])],
                                       how="diagonal_relaxed"))

    def _stream(self, g: int, start: int, end: int) -> pl.DataFrame:
        if g not in self.fds:
            self.fds[g] = os.open(self.path(g), os.O_RDONLY)
        return pl.read_ipc_stream(os.pread(self.fds[g], end - start, start))

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _with_details(partials: pl.DataFrame) -> pl.DataFrame:
    """``partials`` with every REQUEST_DETAILS column: nulls where a group had none of it."""
    return partials.with_columns(**{c: pl.lit(None, dtype=t) for c, t in fastlog.REQUEST_DETAILS.items()
                                    if c not in partials.columns})


def _request_bucket(facts: pl.LazyFrame, aborted: pl.Series, names: list[str], t0: int, keep_prompts: bool) -> pl.DataFrame:
    """The requests.parquet rows of one bucket of request facts (all facts of its ids)."""
    return _request_rows(_partials(facts.collect())[0], aborted, names, t0, keep_prompts)


def _partials(facts: pl.DataFrame) -> tuple[pl.DataFrame, npt.NDArray[np.uint64]]:
    """One row per request id (by its hash ``h``) of some of its facts: the first arrival (time, line,
    id and the details its line gave, of those among ``facts``' columns) and the finishes (earliest
    time, first line); and the rows' hashes, sorted (as ``_runs`` found them). A request's facts mostly
    fall in one group of pieces, so a group's rows are half as many as its facts; rows of the same id
    from other groups are joined by ``_merge``."""
    lone, arrivals, finishes, rest, hashes = _runs(facts)
    details = [c for c in fastlog.REQUEST_DETAILS if c in facts.columns]
    arrived = pl.col("kind") != "request_finished"

    def arrival(rows: pl.DataFrame) -> pl.DataFrame:
        return rows.select("h", id="request_id", arrival_t="t", line="line", **{c: c for c in details})
    finish = {"finish_t": pl.col("t"), "fline": pl.col("line")}
    nothing = {c: pl.lit(None, dtype=facts.schema[c]) for c in details}
    one = facts.filter(pl.Series(lone))
    return pl.concat([
        arrival(facts.filter(pl.Series(arrivals))).hstack(facts.select(**finish)[finishes]),
        arrival(one.filter(arrived)).with_columns(finish_t=pl.lit(None, pl.Int64), fline=pl.lit(None, pl.Int64)),
        one.filter(~arrived).select("h", id="request_id", arrival_t=pl.lit(None, pl.Int64), line=pl.lit(None, pl.Int64),
                                    **nothing, **finish),
        _grouped_partials(facts.filter(pl.Series(rest)))]), hashes


def _runs(facts: pl.DataFrame) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.intp],
                                        npt.NDArray[np.bool_], npt.NDArray[np.uint64]]:
    """Which rows of ``facts`` are of an id met once (``lone``); which are the arrivals of ids met as one
    arrival and one finish, and their finishes' rows (in the arrivals' order); which are the rest; and the
    ids' hashes, each once, sorted (the group's partial rows' hashes, which ``find_repeated`` reads). Found
    by sorting the ids' hashes (``_hash_order``): most requests are one of each
    in a group, and their rows are made as they are, in the facts' order (read in hash order, their rows
    cost a cache miss each), where grouping every fact by its hash (two hash tables and a hash join) took
    80-110 ms."""
    h = facts["h"].to_numpy()
    order, hs = _hash_order(h)
    first = np.ones(len(hs), dtype=bool)
    first[1:] = hs[1:] != hs[:-1]
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, len(hs)))
    ended = (facts["kind"] == "request_finished").to_numpy()[order]
    twos = starts[sizes == 2]
    at = twos[ended[twos] != ended[twos + 1]]  # (an arrival and a finish)
    arrives_first = ~ended[at]
    partner = np.full(len(h), -1, dtype=np.intp)  # (an arrival's finish)
    partner[order[np.where(arrives_first, at, at + 1)]] = order[np.where(arrives_first, at + 1, at)]
    arrivals = partner >= 0
    lone = np.zeros(len(h), dtype=bool)
    lone[order[starts[sizes == 1]]] = True
    rest = ~(lone | arrivals)
    rest[partner[arrivals]] = False
    return lone, arrivals, partner[arrivals], rest, hs[starts]


def _hash_order(h: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64]]:
    """The order that sorts ``h`` (equal hashes in any order among themselves), and ``h`` in it. Each
    hash's top bits and its index are sorted as one word by polars (a group of 440k real facts: 9 ms,
    15 CPU-ms, where numpy's argsort took 27 ms); where two hashes that differ share their top bits
    (rarely: at ~440k hashes a group, one group in ~300), by numpy's argsort of the whole hashes."""
    bits = max(1, (len(h) - 1).bit_length())
    low = np.uint64((1 << bits) - 1)
    words = pl.Series(h & ~low | np.arange(len(h), dtype=np.uint64)).sort().to_numpy()
    order = (words & low).astype(np.intp)
    hs = h[order]
    tops = words >> np.uint64(bits)
    if np.any((tops[1:] == tops[:-1]) & (hs[1:] != hs[:-1])):
        order = np.argsort(h)
        hs = h[order]
    return order, hs


def _grouped_partials(facts: pl.DataFrame) -> pl.DataFrame:
    """``_partials`` by grouping every fact by its id's hash (any number of facts an id)."""
    kind = pl.col("kind")  # (in no particular order: ``_request_rows`` sorts; an id's facts share their id)
    details = [c for c in fastlog.REQUEST_DETAILS if c in facts.columns]
    # (a request's details may come on several lines: V1 at DEBUG states its token ids on 'Request … details:'
    # and its SamplingParams on the 'Received request' line after it; each detail is its first stated value)
    placed = ("h", "request_id", "t", "line")
    first = _one_a_hash(facts.filter(kind != "request_finished").select(*placed, *details), lambda many: many.sort(
        "line").group_by("h").agg(pl.col("request_id", "t", "line").first(), *(pl.col(c).drop_nulls().first() for c in details)))
    ends = _one_a_hash(facts.filter(kind == "request_finished").select(placed), lambda many: many.group_by("h").agg(
        pl.col("t").min(), pl.col("request_id").first(), pl.col("line").min()))
    arrivals = first.rename({"request_id": "id", "t": "arrival_t"}).select("h", "id", "arrival_t", "line", *details)
    finished = ends.select("h", finish_t="t", fid="request_id", fline="line")
    return arrivals.join(finished, on="h", how="full", coalesce=True).with_columns(id=pl.coalesce("id", "fid")).drop("fid")


def _one_a_hash(facts: pl.DataFrame, agg: Callable[[pl.DataFrame], pl.DataFrame]) -> pl.DataFrame:
    """``facts`` (request facts, or partial rows) one row per ``h``: those of a hash met once as they are,
    the others as ``agg`` makes them one (its columns put in ``facts``' order). Most requests have one
    arrival and one finish among a group's facts: sorting and grouping only the rest took a fifth off
    ``_partials``."""
    many = facts["h"].is_duplicated()
    if not many.any():
        return facts
    lone = facts.filter(~many)
    return pl.concat([lone, agg(facts.filter(many)).select(lone.columns)])


def _merge(partials: pl.DataFrame) -> pl.DataFrame:
    """Partial rows (``_partials``) of the same id as one: its first arrival, earliest finish, first
    finish line."""
    return _one_a_hash(partials, _merged)


def _merged(many: pl.DataFrame) -> pl.DataFrame:
    """Partial rows of ids each met more than once, one row an id (``_merge``)."""
    arrivals = many.filter(pl.col("line").is_not_null()).sort("line").group_by("h").agg(
        pl.col("id", "arrival_t", "line").first(),
        *(pl.col(c).drop_nulls().first() for c in many.columns if c not in ("h", "id", "arrival_t", "line", "finish_t", "fline")))
    finished = many.filter(pl.col("fline").is_not_null()).group_by("h").agg(
        finish_t=pl.col("finish_t").min(), fid=pl.col("id").first(), fline=pl.col("fline").min())
    return arrivals.join(finished, on="h", how="full", coalesce=True).with_columns(id=pl.coalesce("id", "fid"))


def request_extras(keep_prompts: bool) -> dict[str, pl.DataType]:
    """The columns of ``_request_rows`` beyond the bundle's REQUESTS_SCHEMA, with their types."""
    return {c: t() if isinstance(t, type) else t for c, t in fastlog.REQUEST_DETAILS.items()
            if c not in REQUESTS_SCHEMA and (keep_prompts or c != "prompt")}


def _request_rows(partials: pl.DataFrame, aborted: pl.Series, names: list[str], t0: int, keep_prompts: bool) -> pl.DataFrame:
    """requests.parquet rows, one per partial row of distinct ids: requests in the order of their first
    arrival, then those with only a finish in the order of their first finish; ``names`` are the logs'."""
    pos = pl.coalesce("line", "fline")
    # (by line, then finish line, nulls last: as two stable sorts of one column, the second first; polars'
    # sort by two columns with nulls last took 2.6 s of 4.2M rows, these two 0.5 s)
    out = partials.sort("fline", nulls_last=True).sort("line", nulls_last=True, maintain_order=True).select(
        "id", arrival_us=pl.col("arrival_t") - t0, **{c: c for c in fastlog.REQUEST_DETAILS},
        finish_us=pl.col("finish_t") - t0,
        source=pl.concat_str((pos // (1 << POS_SHIFT)).replace_strict(range(len(names)), names, return_dtype=pl.Utf8),
                             pl.lit(":"), (pos % (1 << POS_SHIFT)).cast(pl.Utf8)),
        status=pl.when(pl.col("finish_t").is_not_null()).then(pl.lit("ok"))
        .when(pl.col("h").is_in(aborted.implode())).then(pl.lit("aborted")).otherwise(pl.lit("unknown")))
    return out if keep_prompts else out.drop("prompt")
