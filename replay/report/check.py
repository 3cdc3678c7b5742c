"""``replay check``: the CI gate. Thresholds on the gap between actual and accounted memory."""

from __future__ import annotations

import math
from pathlib import Path

from replay.analysis.cache import analysis_of
from replay.errors import ReplayError
from replay.units import GiB


def run_check(bundle: Path, max_discrepancy_pct: float, max_gap_bytes: int | None, no_oom: bool) -> tuple[int, list[str]]:
    if not 0 <= max_discrepancy_pct < math.inf:  # (a gate whose limit is no number fails or passes for no reason)
        raise ReplayError(f"--max-discrepancy {max_discrepancy_pct}: expected a percentage of 0 or more", 2)
    if max_gap_bytes is not None and max_gap_bytes < 0:
        raise ReplayError(f"--max-gap-bytes {max_gap_bytes}: expected 0 bytes or more", 2)
    a = analysis_of(bundle)
    lines: list[str] = []
    failures = 0
    acc = a.acc.accounted_bytes
    if acc is None or a.gap.height == 0:
        return 1, [f"FAIL {bundle}: cannot check: " + ("no accounted memory in the evidence" if acc is None else "no actual memory samples")]
    worst = a.gap.sort("gap_bytes", descending=True).row(0, named=True)
    pct = 100.0 * worst["gap_bytes"] / acc
    ok = pct <= max_discrepancy_pct
    failures += not ok
    lines.append(f"{'PASS' if ok else 'FAIL'} discrepancy: max {pct:.1f}% of accounted ({worst['gap_bytes'] / GiB:.2f} GiB over "
                 f"{acc / GiB:.2f} GiB) at t={worst['t_us'] / 1e6:.2f} s; limit {max_discrepancy_pct}%")
    if max_gap_bytes is not None:
        ok = worst["gap_bytes"] <= max_gap_bytes
        failures += not ok
        lines.append(f"{'PASS' if ok else 'FAIL'} gap: max {int(worst['gap_bytes'])} bytes at t={worst['t_us'] / 1e6:.2f} s; limit {max_gap_bytes}")
    if no_oom:
        ok = not a.ooms
        failures += not ok
        where = ", ".join(f"{e['kind']} at {e.get('source')}" for e in a.ooms[:3])
        lines.append(f"{'PASS' if ok else 'FAIL'} no OOM" + ("" if ok else f": {where}"))
    return failures, lines
