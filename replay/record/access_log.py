"""Requests from uvicorn's access lines, for a log without vLLM's own request lines.

Many deployments run without request logging (V1 logs request lines only with
``--enable-log-requests``), but uvicorn still writes one line per response:
``INFO:     10.0.0.7:52346 - "POST /v1/completions HTTP/1.1" 200 OK``. Such a line has no id and
no time of its own: it is placed between the nearest lines of the log that have one, by its place
among the lines (unless a container runtime or shipper stamped it), and the time is when the
response began, not when the request arrived. The rows say so (``arrival_from``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import polars as pl

from replay.record.vllm_log import UVICORN, split_line

# the calls that are inference requests (not /metrics, /health, /v1/models)
INFERENCE_PATH = re.compile(r"^/(?:v1/)?(?:completions|chat/completions|embeddings|responses|generate|pooling|score|"
                            r"rerank|classify|audio/transcriptions|audio/translations)(?:[/?]|$)")
_VLLM_TIME = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class AccessLine:
    line: int
    method: str
    path: str
    code: int
    iso: str | None  # an envelope's exact time, where a runtime or shipper put one on the line
    before: tuple[int, str] | None = None  # the nearest timed line before it: (line, 'MM-DD HH:MM:SS')
    after: tuple[int, str] | None = None


def scan(lines: Iterable[str], renumbered: Sequence[int] | None = None) -> list[AccessLine]:
    """The inference calls among a log's access lines, each with the nearest timed lines around it;
    ``renumbered`` gives each line's number in the file it came from (an export's, converted to a log)."""
    found: list[AccessLine] = []
    pending: list[AccessLine] = []
    last: tuple[int, str] | None = None
    for no, raw in enumerate(lines, start=1):
        if "HTTP/" in raw:
            for ln in split_line(no, raw):
                m = UVICORN.match(ln.text)
                if m and INFERENCE_PATH.match(m.group("path")):
                    a = AccessLine(no, m.group("method"), m.group("path"), int(m.group("code")), ln.iso, before=last)
                    found.append(a)
                    pending.append(a)
            continue
        t = _VLLM_TIME.search(raw, 0, 400)
        if t:
            last = (no, t.group(1))
            for a in pending:
                a.after = last
            pending = []
    if renumbered:
        def at(no: int) -> int:
            return renumbered[no - 1] if 1 <= no <= len(renumbered) else no
        for a in found:
            a.line = at(a.line)
            a.before = None if a.before is None else (at(a.before[0]), a.before[1])
            a.after = None if a.after is None else (at(a.after[0]), a.after[1])
    return found


def rows(found: list[AccessLine], name: str, timed: Callable[[pl.LazyFrame], pl.LazyFrame], t0: int) -> pl.DataFrame:
    """requests.parquet rows of the access lines of log ``name``: times by ``timed`` (the log's own rules
    of year, zone and clock offset), placed between the lines around each by line number."""
    if not found:
        return pl.DataFrame()
    exact = pl.col("iso").str.to_datetime(time_unit="us", time_zone="UTC", strict=False).dt.epoch("us")
    frame = pl.DataFrame({
        "line": [a.line for a in found], "iso": [a.iso for a in found],
        "b_line": [a.before[0] if a.before else None for a in found], "b_ts": [a.before[1] if a.before else None for a in found],
        "a_line": [a.after[0] if a.after else None for a in found], "a_ts": [a.after[1] if a.after else None for a in found],
        "code": [a.code for a in found], "call": [f"{a.method} {a.path}" for a in found],
    }, schema_overrides={"iso": pl.Utf8, "b_ts": pl.Utf8, "a_ts": pl.Utf8, "b_line": pl.Int64, "a_line": pl.Int64})

    def at(ts: str) -> pl.Series:
        lf = frame.lazy().select("line", ts=pl.col(ts), t_exact=pl.lit(None, dtype=pl.Int64))
        return timed(lf).collect()["t"]

    frame = frame.with_columns(tb=at("b_ts"), ta=at("a_ts"), te=exact)
    span = (pl.col("a_line") - pl.col("b_line")).cast(pl.Float64)
    between = pl.col("tb") + ((pl.col("ta") - pl.col("tb")) * (pl.col("line") - pl.col("b_line")) / span).round(0).cast(pl.Int64)
    t = pl.coalesce(pl.col("te"), pl.when(pl.col("tb").is_not_null() & pl.col("ta").is_not_null() & (span > 0))
                    .then(between), pl.col("tb"), pl.col("ta"))
    ok = (pl.col("code") >= 200) & (pl.col("code") < 300)
    return frame.select(
        id=pl.lit(f"{name}:") + pl.col("line").cast(pl.Utf8), arrival_us=t - t0,
        status=pl.when(ok).then(pl.lit("ok")).otherwise(pl.lit("error")),
        error=pl.when(ok).then(pl.lit(None, dtype=pl.Utf8)).otherwise(pl.lit("HTTP ") + pl.col("code").cast(pl.Utf8)),
        source=pl.lit(f"{name}:") + pl.col("line").cast(pl.Utf8), call=pl.col("call"),
        arrival_from=pl.when(pl.col("te").is_not_null()).then(pl.lit("access line (its envelope's time)"))
        .otherwise(pl.lit("access line (placed between the nearest timed lines)")))
