"""Import speed and memory vs a plain Python loop (csv.DictReader + json.dumps per row).

Prints, from one run: time ratio (loop / replay import) for the Azure conv trace and for synthetic
Azure-format CSVs of N rows (and, for the first N, rows in the 2024 traces' shape: a trace column and
times with a zone), and peak RSS of each import (measured in a child process); for the conv trace
and the first N, the time of ``polars_floor`` too.
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


def polars_floor(src: Path, out: Path) -> float:
    """The least a polars import does, in a fresh interpreter: read the CSV as text and write its rows
    as JSON lines (no times parsed, nothing checked, no header, no hash). Printed beside the import as
    how far a polars importer could go on this machine."""
    return run_measured("import polars as pl", "pl.read_csv(sys.argv[1], infer_schema=False).write_ndjson(sys.argv[2])",
                        str(src), str(out))[0]


def make_csv(path: Path, rows: int, shape: str = "2023") -> None:
    """Rows in the 2023 traces' shape ('2023-11-16 18:15:46.6805900'), or the 2024 week-long traces'
    (a trace column, and times with a zone: '2024-05-10 00:00:00.009930+00:00')."""
    base = 1_700_154_946_000_000
    ts = (pl.lit(base) + pl.col("i") * 180_000).cast(pl.Datetime("us"))
    ts = ts.dt.strftime("%Y-%m-%d %H:%M:%S%.f") if shape == "2023" else ts.dt.strftime("%Y-%m-%d %H:%M:%S%.6f") + "+00:00"
    lf = pl.LazyFrame({"i": pl.int_range(0, rows, eager=True)}).select(
        *([pl.lit("code_1week").alias("trace")] if shape == "2024" else []), ts.alias("TIMESTAMP"),
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
        cases: list[tuple[str, Path, int | None, str]] = []
        if a.conv.exists():
            cases.append(("azure-conv", a.conv, None, ""))
        cases += [(f"synthetic-{n}", d / f"syn{n}.csv", n, "2023") for n in a.rows]
        cases += [(f"synthetic-{n}-2024-shape", d / f"syn{n}-2024.csv", n, "2024") for n in a.rows[:1]]
        rss = {}
        for name, src, rows, shape in cases:
            if rows is not None:  # made just before it is measured: the write-back of a large file made
                make_csv(src, rows, shape)  # earlier slowed the cases before it (the conv import 3x)
            for old in (d / "loop.jsonl", d / "imp.jsonl"):  # neither side pays for freeing the last output
                old.unlink(missing_ok=True)
            os.sync()  # nor for writing back the other's output while it runs
            loop_s = plain_loop(src, d / "loop.jsonl")
            os.sync()
            imp_s, peak = replay_import(src, d / "imp.jsonl")
            rss[name] = peak
            print(f"{name}: replay import {imp_s:.2f} s, plain loop {loop_s:.2f} s, speed-up x{loop_s / imp_s:.1f}, "
                  f"peak anon RSS {peak / 2**20:.0f} MiB")
            if name == "azure-conv" or name == f"synthetic-{a.rows[0]}":
                floor_s = polars_floor(src, d / "floor.jsonl")
                print(f"  floor: polars read and write alone {floor_s:.3f} s, x{loop_s / floor_s:.1f} of the loop")
        keys = [k for k in rss if k.startswith("synthetic-") and not k.endswith("-shape")]
        if len(keys) >= 2:
            print(f"peak RSS ratio {keys[-1]} / {keys[0]}: {rss[keys[-1]] / rss[keys[0]]:.2f} (target < 1.5)")


if __name__ == "__main__":
    main()
