"""Reading one node's nvidia-smi query CSV: the vectorised lane (``fastsmi``) against its row-by-row
reference (``nvidia_smi``), on the same text in the same process.

Writes, under a temporary folder, one node's `nvidia-smi --query-gpu=timestamp,index,name,memory.total,
memory.used,memory.free,utilization.gpu --format=csv -l 1` for --hours (8 H200s polled every second:
``bench_time_to_answer``'s generator, so a fleet's day is 8 such files of 24 h), reads its text once,
then times each reader on it, the lane's best of --repeat (its two parts apart: the rows cut into
samples, then ``common.set_aside_impossible_values``) and the reference once. Prints, from one run,
seconds, rows and samples per second of each, and their ratio; checks that both read the same samples,
quarantine, notes and GPUs. The lane's target for a 24 h file: 1.2 s on the 2-core development machine.

Usage: python benchmarks/bench_nvidia_smi.py [--hours 24] [--repeat 3] [--no-reference]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_time_to_answer import GPUS_PER_NODE, nvidia_smi_node  # noqa: E402

from replay.record import common, fastsmi, nvidia_smi  # noqa: E402


def lane_s(path: Path, text: str) -> tuple[float, float, common.Parsed]:
    """Seconds the lane takes on ``text``, and of them those of ``set_aside_impossible_values``."""
    checking = common.set_aside_impossible_values
    checked_s = [0.0]

    def timed(p: common.Parsed, at: Path) -> common.Parsed:
        t = time.perf_counter()
        try:
            return checking(p, at)
        finally:
            checked_s[0] += time.perf_counter() - t

    common.set_aside_impossible_values = timed  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        got = fastsmi.parse_nvidia_smi_csv(path, text)
        return time.perf_counter() - t, checked_s[0], got
    finally:
        common.set_aside_impossible_values = checking  # type: ignore[assignment]


def same(lane: common.Parsed, ref: common.Parsed) -> None:
    """Stop unless both readings hold the same samples, quarantine, notes and GPUs."""
    if not lane.frame().equals(ref.frame()):
        sys.exit("the lane's samples differ from the reference's")
    for k in ("lines", "parsed", "quarantine", "notes", "gpus"):
        if getattr(lane, k) != getattr(ref, k):
            sys.exit(f"the lane's {k} differ from the reference's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--hours", type=float, default=24.0, help="hours of polling in the file (24: a node's day)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the lane; its best is printed")
    ap.add_argument("--no-reference", action="store_true", help="time the lane alone")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-smi-") as td:
        path = Path(td) / "smi-node0.csv"
        size = nvidia_smi_node(path, 0, a.hours)
        text = path.read_text()
    rows = int(a.hours * 3600) * GPUS_PER_NODE
    runs = [lane_s(path, text) for _ in range(max(1, a.repeat))]
    lane, checked, got = min(runs, key=lambda r: r[0])
    samples = got.frame().height
    print(f"nvidia-smi CSV, {a.hours:g} h of {GPUS_PER_NODE} GPUs every second: {size / 2**20:.1f} MiB, "
          f"{rows:,} rows, {samples:,} samples")
    print(f"  lane (fastsmi):          {lane:7.2f} s  {rows / lane:12,.0f} rows/s  {samples / lane:12,.0f} samples/s  "
          f"(best of {len(runs)}; rows to samples {lane - checked:.2f} s, impossible values and conflicts {checked:.2f} s)")
    if a.hours == 24:
        print(f"  target for a node's day: 1.2 s ({'met' if lane <= 1.2 else 'NOT met'})")
    if a.no_reference:
        return
    t = time.perf_counter()
    ref = nvidia_smi.parse_nvidia_smi_csv(path, text)
    reference = time.perf_counter() - t
    same(got, ref)
    print(f"  reference (nvidia_smi):  {reference:7.2f} s  {rows / reference:12,.0f} rows/s  "
          f"{samples / reference:12,.0f} samples/s")
    print(f"ratio reference / lane: {reference / lane:.1f}x (both read the same samples, quarantine, notes and GPUs)")


if __name__ == "__main__":
    main()
