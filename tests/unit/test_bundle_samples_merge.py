"""The merge of a bundle's sample parts at close (``replay.sortmerge``): sorted bucket by bucket, with
parts read where they lie or spilled, it writes the very rows of one stable sort in memory, in the same
order (ties at one time in several parts, null times and texts, empty buckets, a single part), leaves
nothing of its own behind, and a failure leaves no samples.parquet."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import sortmerge
from replay.bundle import (
    SAMPLES_FILE_SCHEMA,
    SAMPLES_SCHEMA,
    SORT_SPILL,
    BundleMeta,
    BundleWriter,
    own_name,
)
from replay.sortmerge import (
    KeySample,
    Part,
    described,
    frame_part,
    parquet_rows,
    sort_parts,
    sorted_frame,
)

BY = ["t_us", "source", "metric"]


def small_buckets(monkeypatch: pytest.MonkeyPatch, bucket_rows: int = 40, chunk_rows: int = 64) -> None:
    """Buckets of a few rows: the bucketed merge runs on a test's small input."""
    monkeypatch.setattr(sortmerge, "SORT_IN_MEMORY_ROWS", 0)
    monkeypatch.setattr(sortmerge, "BUCKET_ROWS", bucket_rows)
    monkeypatch.setattr(sortmerge, "CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(sortmerge, "SAMPLE_ROWS", 50)  # (every n-th time sampled, n > 1)


def samples(t: list[int | None], sources: list[str | None], metrics: list[str | None], tag: float) -> pl.DataFrame:
    """Samples whose values tell them apart (``tag`` + their row): a tie shows which came first."""
    n = len(t)
    return pl.DataFrame({"t_us": t, "gpu": [i % 3 for i in range(n)], "source": sources, "metric": metrics,
                         "value": [tag + i for i in range(n)]}, schema=SAMPLES_SCHEMA)


def rising(n: int, start: int, step: int, tag: float) -> pl.DataFrame:
    """A source's series: times that rise, several samples at each."""
    t = [start + (i // 4) * step for i in range(n)]
    return samples(t, ["nvidia-smi"] * n, [("used", "free", "total", "util")[i % 4] for i in range(n)], tag)


def jumbled(n: int, seed: int, tag: float, nulls: bool = False) -> pl.DataFrame:
    """Samples of several sources, times in no order, many at one time (ties across parts)."""
    rng = np.random.default_rng(seed)
    t: list[int | None] = [int(x) for x in rng.integers(0, 30, n) * 1000]
    src: list[str | None] = [("dcgm", "vllm-log", "nvidia-smi")[int(x)] for x in rng.integers(0, 3, n)]
    met: list[str | None] = [("used", "kv", "util")[int(x)] for x in rng.integers(0, 3, n)]
    if nulls:
        for i in range(0, n, 7):
            t[i] = None
        src[3], met[5] = None, None
    return samples(t, src, met, tag)


def written_bundle(path: Path, frames: list[pl.DataFrame]) -> tuple[BundleWriter, pl.DataFrame]:
    """A writer with ``frames`` written as parts, and the one stable sort in memory of what they hold."""
    w = BundleWriter(path, BundleMeta(kind="production"))
    for df in frames:
        w.samples_frame(df)
    parts = sorted(path.glob("samples.part*.parquet"))
    return w, pl.read_parquet(parts).sort(BY, maintain_order=True)


def test_close_in_buckets_writes_the_one_stable_sort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts whose times rise (read where they lie) and parts in no order (spilled), ties at one time
    in several parts, null times and texts: samples.parquet is the stable sort in memory, row for row,
    and the parts and the spill are gone."""
    small_buckets(monkeypatch)
    spilled: list[int] = []
    spill = sortmerge._spill
    monkeypatch.setattr(sortmerge, "_spill", lambda runs, *a: (spilled.append(sum(not r.rising for r in runs)), spill(runs, *a)))
    frames = [rising(150, 0, 500, 0), jumbled(90, 1, 1000), rising(130, 2000, 300, 2000), rising(150, 0, 500, 3000),
              jumbled(200, 2, 4000, nulls=True), jumbled(30, 3, 5000), rising(40, 40_000, 10, 6000)]
    w, expected = written_bundle(tmp_path / "b", frames)
    w.sample(5000, 0, "nvidia-smi", "used", 7.0)  # (a row flushed at close, tied with those of the parts)
    w.close()
    got = pl.read_parquet(tmp_path / "b" / "samples.parquet")
    flushed = samples([5000], ["nvidia-smi"], ["used"], 7.0).cast(SAMPLES_FILE_SCHEMA)  # type: ignore[arg-type]
    assert got.equals(pl.concat([expected, flushed]).sort(BY, maintain_order=True))
    assert spilled == [2]  # (two runs of parts in no order; the rising ones were read where they lie)
    assert not list((tmp_path / "b").glob("samples.part*")) and not (tmp_path / "b" / SORT_SPILL).exists()


@pytest.mark.parametrize("bounds", [[-5, 0, 1, 2, 2000, 2001, 10**9], [10**9], [-1], []],
                         ids=["empty buckets", "all in the first", "all in the last", "one bucket"])
def test_empty_buckets_and_a_single_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bounds: list[int]) -> None:
    """Buckets that hold no row (of either kind of part), or all of them, change nothing."""
    small_buckets(monkeypatch)
    monkeypatch.setattr(sortmerge, "_bounds", lambda *a: bounds)
    w, expected = written_bundle(tmp_path / "b", [rising(60, 0, 100, 0), jumbled(80, 4, 1000, nulls=True),
                                                  rising(60, 1000, 1, 2000)])
    w.close()
    assert pl.read_parquet(tmp_path / "b" / "samples.parquet").equals(expected)


@pytest.mark.parametrize("frame", [rising(300, 0, 7, 0), jumbled(300, 5, 0), jumbled(300, 6, 0, nulls=True)],
                         ids=["rising", "in no order", "null times"])
def test_one_part_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frame: pl.DataFrame) -> None:
    small_buckets(monkeypatch)
    w, expected = written_bundle(tmp_path / "b", [frame])
    w.close()
    assert pl.read_parquet(tmp_path / "b" / "samples.parquet").equals(expected)


def test_parts_it_did_not_write_from_memory_are_read_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A part streamed from a query (``samples_lazy``), its times not known until read: read a slice
    at a time, its order is found across slices, and the merge is the stable sort."""
    small_buckets(monkeypatch, chunk_rows=25)
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    w.samples_lazy(rising(100, 0, 10, 0).lazy())
    w.samples_lazy(pl.concat([rising(50, 0, 10, 100), rising(50, 0, 10, 200)]).lazy())  # (falls between slices)
    w.samples_frame(jumbled(60, 7, 300, nulls=True))
    parts = sorted((tmp_path / "b").glob("samples.part*.parquet"))
    assert [described(Part(p, parquet_rows(p)), "t_us").rising for p in parts] == [True, False, False]
    expected = pl.read_parquet(parts).sort(BY, maintain_order=True)
    w.close()
    assert pl.read_parquet(tmp_path / "b" / "samples.parquet").equals(expected)


def test_described_and_frame_part_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sortmerge, "CHUNK_ROWS", 16)
    for df in (rising(70, -500, 3, 0), jumbled(70, 8, 0), jumbled(70, 9, 0, nulls=True), rising(0, 0, 1, 0),
               samples([None, None], ["a", "b"], ["m", "m"], 0)):
        p = tmp_path / "p.parquet"
        df.write_parquet(p)
        assert described(Part(p, df.height), "t_us") == frame_part(p, df, "t_us")


def test_a_failed_merge_leaves_no_samples_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge that fails (a full disk) leaves neither samples.parquet nor its half-written file; the
    spill is removed and the parts are kept."""
    small_buckets(monkeypatch)

    def full(*_a: object) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(sortmerge, "_write", full)
    w, _ = written_bundle(tmp_path / "b", [jumbled(100, 10, 0), rising(100, 0, 5, 100)])
    with pytest.raises(OSError):
        w.close()
    names = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert "samples.parquet" not in names and "samples.parquet.tmp" not in names and SORT_SPILL not in names
    assert len([n for n in names if n.startswith("samples.part")]) == 2


def test_a_spill_left_by_an_interrupted_close_is_the_writers_own(tmp_path: Path) -> None:
    """A folder holding a killed merge's spill is a bundle's folder; the next writer removes the spill."""
    (tmp_path / "b" / SORT_SPILL).mkdir(parents=True)
    (tmp_path / "b" / SORT_SPILL / "000000-000001.arrow").write_bytes(b"x")
    assert own_name(SORT_SPILL)
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    assert not (tmp_path / "b" / SORT_SPILL).exists()
    w.close()


def test_sorted_frame_is_the_stable_sort() -> None:
    """Sorted as one integer (time, then the texts' places), or as columns where the times' range is
    too wide for 64 bits; null times and texts first, as ``sort`` puts them."""
    for df in (jumbled(500, 11, 0, nulls=True), samples([2**62, -(2**62), 0, 2**62], ["b", "a", None, "a"], ["m"] * 4, 0),
               samples([None, None, None], ["b", None, "a"], ["x", "y", None], 0), samples([], [], [], 0),
               samples([3, 1, 2], [None] * 3, ["b", "a", "b"], 0)):
        for texts in (pl.String, pl.Categorical):  # (as a bundle's parts are written, and as text)
            df = df.with_columns(pl.col("source", "metric").cast(texts))
            assert sorted_frame(df, BY).equals(df.sort(BY, maintain_order=True))


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.integers(-3, 12)), st.sampled_from(["a", "b", "ab", "é"]),
                               st.sampled_from(["m", "n"])), max_size=120),
       cuts=st.lists(st.integers(0, 120), max_size=5), bucket_rows=st.integers(1, 50), chunk_rows=st.integers(1, 50),
       sampled=st.booleans())
def test_any_parts_merge_as_the_stable_sort(tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int | None, str, str]],
                                            cuts: list[int], bucket_rows: int, chunk_rows: int, sampled: bool) -> None:
    """Rows cut into parts anywhere, merged with buckets and chunks of any size, cut where a sample
    taken as the parts were written says or where one read from them says: the stable sort."""
    d = tmp_path_factory.mktemp("merge")
    df = samples([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], 0)
    edges = [0, *sorted(c for c in cuts if c <= df.height), df.height]
    parts = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sortmerge, "SORT_IN_MEMORY_ROWS", 0)
        mp.setattr(sortmerge, "BUCKET_ROWS", bucket_rows)
        mp.setattr(sortmerge, "CHUNK_ROWS", chunk_rows)
        mp.setattr(sortmerge, "SAMPLE_ROWS", 7)
        sample = KeySample() if sampled else None
        for i, (a, b) in enumerate(zip(edges, edges[1:])):  # (every other part's times as its writer knew them)
            p = d / f"samples.part{i:05d}.parquet"
            df.slice(a, b - a).write_parquet(p)
            parts.append(frame_part(p, df.slice(a, b - a), "t_us", sample) if i % 2 else Part(p, b - a))
        sort_parts(parts, d / "out.parquet", BY, d / "spill", shutil.rmtree, sample)
    assert pl.read_parquet(d / "out.parquet").equals(df.sort(BY, maintain_order=True))
    assert not (d / "spill").exists()


@pytest.mark.parametrize("times", [[None, 1, 2, 2, 3], [1, None, 2], [3, 1, 2], [], [None, None], [5, 5, 4]])
def test_a_bundle_read_back_is_in_time_order_without_sorting_it_again(tmp_path: Path, times: list[int | None]) -> None:
    """read_bundle checks the written order and sorts only what is out of it, stably, nulls first."""
    from replay.bundle import in_time_order
    df = pl.DataFrame({"t_us": times, "value": [float(i) for i in range(len(times))]},
                      schema={"t_us": pl.Int64, "value": pl.Float64})
    got = in_time_order([df])
    assert got.equals(df.sort("t_us", maintain_order=True))
    if times == sorted(times, key=lambda t: (t is not None, t or 0)):
        assert got is df  # (in order already: the frame as read, no copy)
    assert in_time_order([df, df]).equals(pl.concat([df, df]).sort("t_us", maintain_order=True))


def test_samples_names_are_written_as_categories_and_text_bundles_read_alike(tmp_path: Path) -> None:
    """GIVEN a bundle's samples merged at close WHEN samples.parquet is read THEN its source and metric are
    categories, and a bundle written before, with them as text, gives the same samples through
    read_bundle and scan_samples."""
    from replay.bundle import read_bundle
    frames = [rising(400, 0, 10, 0), jumbled(300, 1, 1000, nulls=True)]
    w, _ = written_bundle(tmp_path / "b", frames)
    w.close()
    new = tmp_path / "b" / "samples.parquet"
    assert {c: pl.read_parquet_schema(new)[c] for c in ("source", "metric")} == {"source": pl.Categorical(),
                                                                                 "metric": pl.Categorical()}
    shutil.copytree(tmp_path / "b", tmp_path / "old")
    pl.read_parquet(new).cast({"source": pl.String, "metric": pl.String}).write_parquet(tmp_path / "old" / "samples.parquet")
    assert pl.read_parquet_schema(tmp_path / "old" / "samples.parquet")["source"] == pl.String
    a, b = read_bundle(tmp_path / "b"), read_bundle(tmp_path / "old")
    as_text = {"source": pl.String, "metric": pl.String}
    assert a.samples.height == 700 and a.samples.cast(as_text).equals(b.samples.cast(as_text))  # type: ignore[arg-type]
    assert a.scan_samples().collect().cast(as_text).equals(b.scan_samples().collect().cast(as_text))  # type: ignore[arg-type]
    assert a.scan_samples().filter(pl.col("source") == "nvidia-smi").collect().height == \
        b.scan_samples().filter(pl.col("source") == "nvidia-smi").collect().height > 400


def test_samples_merged_before_close_are_what_close_keeps(tmp_path: Path) -> None:
    """GIVEN a writer whose samples are merged while its requests are still to come (as a recording merges
    them beside its request join) WHEN requests are written and the bundle closed THEN samples.parquet is the
    one stable sort of the samples, written once (close leaves it as merged), the parts are gone, the bundle
    is complete with its requests; and a sample added after the merge is refused, not lost."""
    w, want = written_bundle(tmp_path / "b", [jumbled(300, 3, 0), rising(200, 0, 5, 1000)])
    w.sample(7, 0, "nvidia-smi", "used", 1.0)
    w.merge_samples()
    merged = tmp_path / "b" / "samples.parquet"
    first = merged.stat().st_mtime_ns, merged.stat().st_ino
    extra = pl.DataFrame({"t_us": [7], "gpu": [0], "source": ["nvidia-smi"], "metric": ["used"], "value": [1.0]},
                         schema=want.schema)
    assert pl.read_parquet(merged).equals(pl.concat([want, extra]).sort(BY, maintain_order=True))
    assert not list((tmp_path / "b").glob("samples.part*"))
    for add in (lambda: w.sample(8, 0, "nvidia-smi", "used", 2.0), lambda: w.samples_frame(rising(4, 0, 1, 0))):
        with pytest.raises(RuntimeError, match="merged"):
            add()
    w.requests_frame(pl.DataFrame({"id": ["a", "b"], "arrival_us": [1, 2]}))
    w.close()
    assert (merged.stat().st_mtime_ns, merged.stat().st_ino) == first
    assert pl.read_parquet(tmp_path / "b" / "requests.parquet")["id"].to_list() == ["a", "b"]
    assert w.complete and w.counts["samples"] == 501
