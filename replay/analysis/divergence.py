"""Divergence detection on the gap series: CUSUM change-point with a hysteresis threshold.

The onset is where the cumulative excess over the warm baseline starts to build (the CUSUM
change-point), confirmed only when the excess crosses a threshold derived from the baseline's own
noise (MAD) for several consecutive samples, and cleared below a lower threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from replay.units import MiB


@dataclass
class Divergence:
    onset_us: int | None
    first_crossing_us: int | None
    baseline_bytes: float | None
    threshold_bytes: float | None
    max_gap_bytes: float | None
    max_gap_us: int | None
    episodes: list[tuple[int, int | None]]


def detect(gap: pl.DataFrame, *, warm_fraction: float = 0.15, min_warm: int = 5, k_mad: float = 6.0,
           abs_floor_bytes: float = 64 * MiB, rel_floor: float = 0.03, confirm: int = 3) -> Divergence:
    g = gap.drop_nulls("gap_bytes").sort("t_us")
    if g.height < min_warm + confirm:
        return Divergence(None, None, None, None, None, None, [])
    t = g["t_us"].to_list()
    x = g["gap_bytes"].to_list()
    n_warm = max(min_warm, int(len(x) * warm_fraction))
    warm = pl.Series(x[:n_warm])
    base = float(warm.median())  # type: ignore[arg-type]
    mad = float((warm - base).abs().median())  # type: ignore[arg-type]
    scale = max(abs(base), float(g["actual_bytes"].median() or 0))  # type: ignore[arg-type]
    thr = max(abs_floor_bytes, k_mad * 1.4826 * mad, rel_floor * scale)
    low = thr / 2
    # hysteresis episodes
    episodes: list[tuple[int, int | None]] = []
    run = 0
    active: int | None = None
    first_cross = None
    for i in range(n_warm, len(x)):
        ex = x[i] - base
        if active is None:
            run = run + 1 if ex > thr else 0
            if run >= confirm:
                active = t[i - confirm + 1]
                first_cross = first_cross or active
        elif ex < low:
            episodes.append((active, t[i]))
            active = None
            run = 0
    if active is not None:
        episodes.append((active, None))
    # CUSUM change-point: the last time the cumulative excess was zero before the first alarm
    k = max(1.5 * 1.4826 * mad, 8 * MiB)  # drift worth accumulating: above the baseline noise
    s = 0.0
    last_zero = t[n_warm - 1]
    onset = None
    for i in range(n_warm, len(x)):
        s = max(0.0, s + (x[i] - base - k))
        if s == 0.0:
            last_zero = t[i]
        if first_cross is not None and t[i] >= first_cross:
            onset = last_zero
            break
    if onset is not None:  # the first sample after the last zero is where growth began
        later = [ti for ti in t if ti > onset]
        onset = later[0] if later else onset
    if onset is not None and first_cross is not None:
        onset = _rise_start(t, x, t.index(onset), t.index(first_cross), k, thr / 2, base + thr / 4)
    imax = int(g["gap_bytes"].arg_max() or 0)  # (the first of the largest; a bundle holds no NaN)
    return Divergence(onset if first_cross else None, first_cross, base, thr, x[imax], t[imax], episodes)


def _rise_start(t: list[int], x: list[float], i_onset: int, i_cross: int, step: float, jump: float,
                near: float) -> int:
    """The onset, moved up to the start of a sudden rise: the run of samples, each above the one before by
    more than ``step``, that ends at the first crossing, where that run rose by more than ``jump`` from a
    level still ``near`` the baseline (at most that). (A creep of a few MiB a request, or a step that then
    stays level, keeps the cumulative excess above zero and would date the onset to it; the divergence
    began where the rise did. A leak rises a little a sample, and a staircase of steps is well above the
    baseline before its last: their onsets stay.)"""
    j = i_cross
    while j - 1 >= max(i_onset, 1) and x[j - 1] - x[j - 2] > step:
        j -= 1
    if j > i_onset and x[i_cross] - x[j - 1] > jump and x[j - 1] <= near:
        return t[j]
    return t[i_onset]
