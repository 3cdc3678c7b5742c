"""The merge of a bundle's sample parts into samples.parquet: time and peak memory, against one sort in memory.

Builds part files of --rows samples (and of a tenth of it) in a fleet's shape: eight nodes' nvidia-smi
series (8 GPUs, 4 metrics a poll, a day of polls) and two vLLM logs' stats (4 metrics each, a GPU or
none), every source spanning the whole day. Two arrangements: "ordered", a part a million rows of one
source's series, as the recorder writes a fleet's files (its times rise); and "mixed", the sources cut
into pieces of 50,000 rows joined round-robin into parts of a million, as it joins a scrape's many
files (times that fall back within a part). Each merge runs in a child process
(``replay.sortmerge.sort_parts``, as ``BundleWriter.close`` calls it: with each part's rows, times
and sample of times as the writer took them when it wrote the part) beside the one-query sort that
close() ran before, ``scan_parquet(parts).sort(..., maintain_order=True).sink_parquet``, on the same
parts. Prints, from one run, each one's time and
peak anonymous RSS, their ratios, whether both wrote the same rows in the same order, and the ratio
of the merge's peaks at --rows and at a tenth of it (memory that does not grow with the input: 1.0).
Usage: python benchmarks/bench_samples_merge.py [--rows 20000000] [--arrangements ordered mixed]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
from _child import run_measured  # noqa: E402

DAY_US = 86_400 * 1_000_000
PART_ROWS = 1_000_000  # (the recorder's SAMPLES_AT_ONCE)
PIECE_ROWS = 50_000  # (a scrape's file, in the mixed arrangement)
SMI_METRICS = ("device_free_bytes", "device_total_bytes", "device_used_bytes", "util_gpu_pct")
LOG_METRICS = ("kv_usage_ratio", "prefix_cache_hit_ratio", "requests_running", "requests_waiting")
BY = ["t_us", "source", "metric"]

# (what the writer knows of each part, from when it wrote it: taken before the merge is timed)
KNOWN = ("import shutil\nfrom pathlib import Path\nimport polars as pl\n"
         "from replay.sortmerge import KeySample, frame_part, sort_parts\n"
         "sample = KeySample()\n"
         "parts = [frame_part(p, pl.read_parquet(p, columns=['t_us']), 't_us', sample)\n"
         "         for p in sorted(Path(sys.argv[1]).glob('samples.part*.parquet'))]")
MERGE = "sort_parts(parts, Path(sys.argv[2]), ['t_us', 'source', 'metric'], Path(sys.argv[3]), shutil.rmtree, sample)"
TODAY = ("pl.scan_parquet(sorted(Path(sys.argv[1]).glob('samples.part*.parquet')))"
         ".sort(['t_us', 'source', 'metric'], maintain_order=True).sink_parquet(sys.argv[2])")


def smi_series(source: str, rows: int, rng: np.random.Generator) -> pl.DataFrame:
    """A node's nvidia-smi polls over the day: each poll 8 GPUs x 4 metrics at one time."""
    polls = max(1, rows // 32)
    t = np.sort(rng.integers(0, DAY_US, polls))
    n = polls * 32
    metric = np.tile(np.repeat(np.arange(4), 8), polls)
    value = np.where(metric == 3, rng.integers(0, 101, n), rng.integers(0, 80 << 30, n)).astype(np.float64)
    return pl.DataFrame({
        "t_us": np.repeat(t, 32), "gpu": np.tile(np.arange(8, dtype=np.int32), 4 * polls),
        "source": pl.Series([source]).gather(np.zeros(n, dtype=np.int64)),
        "metric": pl.Series(SMI_METRICS).gather(metric), "value": value})


def log_series(source: str, rows: int, gpu: int | None, rng: np.random.Generator) -> pl.DataFrame:
    """A vLLM log's stats lines over the day: 4 metrics a line."""
    lines = max(1, rows // 4)
    t = np.repeat(np.sort(rng.integers(0, DAY_US, lines)), 4)
    return pl.DataFrame({
        "t_us": t, "gpu": pl.Series([gpu] * (4 * lines), dtype=pl.Int32),
        "source": pl.Series([source]).gather(np.zeros(4 * lines, dtype=np.int64)),
        "metric": pl.Series(LOG_METRICS).gather(np.tile(np.arange(4), lines)), "value": rng.random(4 * lines)})


def fleet(rows: int, seed: int = 7) -> list[pl.DataFrame]:
    """The sources' series, about ``rows`` in all (98.5% nvidia-smi)."""
    rng = np.random.default_rng(seed)
    smi = [smi_series("nvidia-smi" + (f"[smi-node{i}.csv]" if i else ""), int(rows * 0.985 / 8), rng) for i in range(8)]
    return smi + [log_series("vllm-log" + (f"[vllm-{i}.log]" if i else ""), int(rows * 0.0075), i or None, rng) for i in range(2)]


def write_parts(series: list[pl.DataFrame], arrangement: str, folder: Path) -> int:
    """Write ``series`` as part files (samples.part00000.parquet, ...); returns how many."""
    if arrangement == "ordered":
        frames = [s.slice(o, PART_ROWS) for s in series for o in range(0, s.height, PART_ROWS)]
    else:
        pieces = [[s.slice(o, PIECE_ROWS) for o in range(0, s.height, PIECE_ROWS)] for s in series]
        joined = pl.concat([p[i] for i in range(max(map(len, pieces))) for p in pieces if i < len(p)])
        frames = [joined.slice(o, PART_ROWS) for o in range(0, joined.height, PART_ROWS)]
    for i, f in enumerate(frames):
        f.write_parquet(folder / f"samples.part{i:05d}.parquet")
    return len(frames)


def digest(path: Path) -> int:
    """One number for a Parquet file's rows and their order (read as a stream)."""
    return int(pl.scan_parquet(path).with_row_index("i").select(pl.struct(pl.all()).hash(seed=1).sum()).collect().item())


def measure(arrangement: str, rows: int, tmp: Path) -> int:
    """Merge ``rows`` samples in ``arrangement`` both ways, print both; returns the merge's peak bytes."""
    folder = tmp / f"{arrangement}-{rows}"
    folder.mkdir()
    series = fleet(rows)
    n = sum(s.height for s in series)
    parts = write_parts(series, arrangement, folder)
    del series
    merged, today = tmp / "merged.parquet", tmp / "today.parquet"
    secs, peak = run_measured(KNOWN, MERGE, str(folder), str(merged), str(tmp / "spill"))
    t_secs, t_peak = run_measured("from pathlib import Path\nimport polars as pl", TODAY, str(folder), str(today))
    same = digest(merged) == digest(today)
    print(f"{arrangement:7s} {n:>11,} rows in {parts:3d} parts: merge {secs:6.2f} s, peak {peak / 2**20:6.0f} MiB; "
          f"one sort {t_secs:6.2f} s, peak {t_peak / 2**20:6.0f} MiB; merge / one sort: time {secs / t_secs:.2f}x, "
          f"peak {peak / t_peak:.2f}x; same rows in the same order: {'yes' if same else 'NO'}", flush=True)
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    return peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--arrangements", nargs="+", choices=["ordered", "mixed"], default=["ordered", "mixed"])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as d:
        for arrangement in a.arrangements:
            small = measure(arrangement, a.rows // 10, Path(d))
            large = measure(arrangement, a.rows, Path(d))
            print(f"{arrangement}: the merge's peak at {a.rows:,} rows / at {a.rows // 10:,}: {large / small:.2f}x", flush=True)


if __name__ == "__main__":
    main()
