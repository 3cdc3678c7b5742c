"""Import speed and memory vs a plain Python loop (csv.DictReader + json.dumps per row).

Prints, from one run: time ratio (loop / replay import) for the Azure conv trace and for synthetic
Azure-format CSVs of N rows, and peak RSS of each import (measured in a child process).
Usage: python benchmarks/bench_import.py [--rows 1000000 10000000] [--conv PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).parent))
from _child import run_measured  # noqa: E402


def plain_loop(src: Path, out: Path) -> float:
    t = time.perf_counter()
    with src.open(newline="") as fh, out.open("w") as fo:
        for row in csv.DictReader(fh):
            fo.write(json.dumps(row) + "\n")
    return time.perf_counter() - t


def replay_import(src: Path, out: Path) -> tuple[float, int]:
    return run_measured("from replay.trace.importers import import_trace",
                        "import_trace('azure', Path(sys.argv[1]), Path(sys.argv[2]))", str(src), str(out))


def make_csv(path: Path, rows: int) -> None:
    base = 1_700_154_946_000_000
    lf = pl.LazyFrame({"i": pl.int_range(0, rows, eager=True)}).select(
        (pl.lit(base) + pl.col("i") * 180_000).cast(pl.Datetime("us")).dt.strftime("%Y-%m-%d %H:%M:%S%.f").alias("TIMESTAMP"),
        (pl.col("i") * 7919 % 8000 + 10).alias("ContextTokens"),
        (pl.col("i") * 104729 % 900 + 1).alias("GeneratedTokens"))
    lf.sink_csv(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    ap.add_argument("--conv", type=Path, default=Path(__file__).resolve().parents[2] / "shared/data/traces/azure/AzureLLMInferenceTrace_conv.csv")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        cases: list[tuple[str, Path, int | None]] = []
        if a.conv.exists():
            cases.append(("azure-conv", a.conv, None))
        cases += [(f"synthetic-{n}", d / f"syn{n}.csv", n) for n in a.rows]
        rss = {}
        for name, src, rows in cases:
            if rows is not None:  # made just before it is measured: the write-back of a large file made
                make_csv(src, rows)  # earlier slowed the cases before it (the conv import 3x)
            for old in (d / "loop.jsonl", d / "imp.jsonl"):  # neither side pays for freeing the last output
                old.unlink(missing_ok=True)
            os.sync()  # nor for writing back the other's output while it runs
            loop_s = plain_loop(src, d / "loop.jsonl")
            os.sync()
            imp_s, peak = replay_import(src, d / "imp.jsonl")
            rss[name] = peak
            print(f"{name}: replay import {imp_s:.2f} s, plain loop {loop_s:.2f} s, speed-up x{loop_s / imp_s:.1f}, "
                  f"peak anon RSS {peak / 2**20:.0f} MiB")
        keys = [k for k in rss if k.startswith("synthetic-")]
        if len(keys) >= 2:
            print(f"peak RSS ratio {keys[-1]} / {keys[0]}: {rss[keys[-1]] / rss[keys[0]]:.2f} (target < 1.5)")


if __name__ == "__main__":
    main()
