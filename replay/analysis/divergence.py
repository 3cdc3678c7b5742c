"""Divergence detection on the gap series: CUSUM change-point with a hysteresis threshold.

The onset is where the cumulative excess over the warm baseline starts to build (the CUSUM
change-point), confirmed only when the excess crosses a threshold derived from the baseline's own
noise (MAD) for several consecutive samples, and cleared below a lower threshold.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
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
    episodes = _episodes(t, np.asarray(x[n_warm:]) - base, n_warm, thr, low, confirm)
    first_cross = None
    for begun, _ in episodes:  # (the first episode's start; a start at 0 µs is taken as none, as ever)
        first_cross = first_cross or begun
    # CUSUM change-point: the last time the cumulative excess was zero before the first alarm
    k = max(1.5 * 1.4826 * mad, 8 * MiB)  # drift worth accumulating: above the baseline noise
    s = 0.0
    last_zero = t[n_warm - 1]
    onset = None
    if first_cross is not None:  # (no alarm: no onset to look for)
        for i in range(n_warm, len(x)):
            s = max(0.0, s + (x[i] - base - k))
            if s == 0.0:
                last_zero = t[i]
            if t[i] >= first_cross:
                onset = last_zero
                break
    if onset is not None:  # the first sample after the last zero is where growth began
        later = bisect_right(t, onset)
        onset = t[later] if later < len(t) else onset
    if onset is not None and first_cross is not None:
        # (the rise looked for is the one to the first sample over the threshold: a surge over it that dips
        # under it before it holds there, as an image's encoder frees its activations, crosses later. The GPUs
        # of a node share their times: the crossing is one of the samples at its time, and the onset, a time
        # after the last zero, may be one after it)
        i_onset = bisect_left(t, onset)
        lo = min(i_onset, bisect_left(t, first_cross))
        i_over = lo + int(np.flatnonzero(np.asarray(x[lo:bisect_right(t, first_cross)]) - base > thr)[0])
        onset = _rise_start(t, x, i_onset, i_over, k, thr / 2, base + thr / 4)
    imax = int(g["gap_bytes"].arg_max() or 0)  # (the first of the largest; a bundle holds no NaN)
    return Divergence(onset if first_cross else None, first_cross, base, thr, x[imax], t[imax], episodes)


def _episodes(t: list[int], excess: npt.NDArray[np.float64], first: int, thr: float, low: float,
              confirm: int) -> list[tuple[int, int | None]]:
    """The hysteresis episodes of ``excess`` (the gap over the baseline, from sample ``first`` of ``t`` on):
    each begins at the first of ``confirm`` samples in a row over ``thr`` and ends at the next sample under
    ``low`` (None: still on at the end; ``low`` < ``thr``, so a sample that ends one is no sample over
    ``thr``). Found by numpy over the run lengths, not sample by sample."""
    at = np.arange(len(excess))
    over = excess > thr
    runs = at - np.maximum.accumulate(np.where(over, -1, at))  # (samples over thr in a row, up to each)
    starts, ends = np.flatnonzero(runs >= confirm), np.flatnonzero(excess < low)
    out: list[tuple[int, int | None]] = []
    i = 0
    while (k := int(np.searchsorted(starts, i))) < len(starts):
        begun = t[first + int(starts[k]) - confirm + 1]
        m = int(np.searchsorted(ends, starts[k] + 1))
        if m == len(ends):
            out.append((begun, None))
            break
        out.append((begun, t[first + int(ends[m])]))
        i = int(ends[m]) + 1
    return out


def _rise_start(t: list[int], x: list[float], i_onset: int, i_over: int, step: float, jump: float,
                near: float) -> int:
    """The onset, moved up to the start of a sudden rise: the run of samples, each above the one before by
    more than ``step``, that ends at the first sample over the threshold (``i_over``), where that run rose
    by more than ``jump`` from a level still ``near`` the baseline (at most that). (A creep of a few MiB a
    request, or a step that then stays level, keeps the cumulative excess above zero and would date the
    onset to it; the divergence began where the rise did. A leak rises a little a sample, and a staircase
    of steps is well above the baseline before its last: their onsets stay.)"""
    j = i_over
    while j - 1 >= max(i_onset, 1) and x[j - 1] - x[j - 2] > step:
        j -= 1
    if j > i_onset and x[i_over] - x[j - 1] > jump and x[j - 1] <= near:
        return t[j]
    return t[i_onset]
