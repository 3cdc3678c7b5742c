"""Relative-time nvidia-smi CSVs built from the real H200 capture: no real one was found (experiment
scripts that write 'time [s]' or 'elapsed' columns are public; their outputs are not), so its
timestamp column is turned into one of offsets from the run's start, each row the real row."""

from __future__ import annotations

import csv

from tests.conftest import DATA

H200 = DATA / "h200_query_gpu_load.csv"


def relative_h200(offsets: list[str], column: str = "time [s]", gpus: int = 1, used_mib: list[int] | None = None) -> str:
    """The real H200 capture with ``column`` in place of its timestamp: a poll at each of ``offsets``
    (the cells as written) of ``gpus`` GPUs, each the real row; its used memory (and free, to match)
    ``used_mib[k]`` at the k-th poll where given."""
    header, row = list(csv.reader(H200.read_text().splitlines(), skipinitialspace=True))
    at = {h: i for i, h in enumerate(header)}
    lines = [", ".join(column if h == "timestamp" else h for h in header)]
    for k, t in enumerate(offsets):
        for g in range(gpus):
            cells = list(row)
            cells[at["timestamp"]], cells[at["index"]] = t, str(g)
            if used_mib is not None:
                cells[at["memory.used [MiB]"]] = f"{used_mib[k]} MiB"
                cells[at["memory.free [MiB]"]] = f"{143771 - 614 - used_mib[k]} MiB"
            lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"
