"""Peak-preserving downsampling (min/max per bucket, plus the first and last sample) so that long
incidents render light while peaks and the OOM moment are never averaged away."""

from __future__ import annotations

import polars as pl

MAX_POINTS = 4000  # a series alone in its figure
FIGURE_POINTS = 150_000  # a figure's points in all, shared by its series: a fleet's 64 GPUs, each drawn
# as its actual memory, the gap and vLLM's line, keep the report at ~10 MB (plotly.js is 4.6 MB of it)
MIN_POINTS = 200  # the fewest a series gets (its extremes need only two)


def points_each(n_series: int) -> int:
    """The points each of ``n_series`` series gets from the figure's FIGURE_POINTS."""
    return max(MIN_POINTS, min(MAX_POINTS, FIGURE_POINTS // max(1, n_series)))


def minmax(df: pl.DataFrame, x: str, y: str, max_points: int = MAX_POINTS, keep: list[int] | None = None) -> pl.DataFrame:
    if df.height <= max_points:
        return df
    lo, hi = int(df[x].min()), int(df[x].max())  # type: ignore[arg-type]
    n_buckets = max(1, max_points // 2)
    width = max(1, (hi - lo) // n_buckets + 1)
    d = df.with_row_index("_i").with_columns(((pl.col(x) - lo) // width).alias("_b"))
    idx = d.group_by("_b").agg(pl.col("_i").get(pl.col(y).arg_min()).alias("a"),
                               pl.col("_i").get(pl.col(y).arg_max()).alias("b"))
    keep_idx = set(idx["a"].to_list()) | set(idx["b"].to_list()) | {0, df.height - 1}
    if keep:
        xs = d[x]
        for k in keep:
            keep_idx.add(int((xs - k).abs().arg_min() or 0))
    return d.filter(pl.col("_i").is_in(sorted(keep_idx))).drop("_i", "_b").sort(x)


LANE_MARKS = 1000  # event marks drawn in a lane of many (preemptions, say): one per stretch of time
MIN_LANE_MARKS = 100  # the fewest a lane gets where several share LANE_MARKS (a fleet's replicas)


def lane_marks(lanes: int) -> int:
    """The marks each of ``lanes`` lanes of one kind of event gets: a fleet's replicas, each a lane of a
    day's preemptions, share LANE_MARKS (a lane alone has them all)."""
    return max(MIN_LANE_MARKS, LANE_MARKS // max(1, lanes))


def thin_marks(xs: list[float], most: int = LANE_MARKS) -> list[tuple[int, int]]:
    """Of marks at times ``xs`` (in order), the first of each of ``most`` equal stretches of their span,
    as (index, marks it stands for): a lane of a day's preemptions is drawn as at most ``most`` marks
    that count the rest. Fewer than ``most`` marks are all kept, each for itself."""
    if len(xs) <= most:
        return [(i, 1) for i in range(len(xs))]
    lo, hi = min(xs), max(xs)
    width = (hi - lo) / most or 1.0
    kept: dict[int, list[int]] = {}
    for i, x in enumerate(xs):
        b = min(most - 1, int((x - lo) / width))
        if b in kept:
            kept[b][1] += 1
        else:
            kept[b] = [i, 1]
    return sorted((i, n) for i, n in kept.values())
