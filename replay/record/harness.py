"""What the readers of benchmark harnesses' outputs share (vLLM's ``bench serve``, AIPerf, GuideLLM):
JSON records one after another with their lines, their times and durations in µs, and their
per-request records as rows of the bundle's requests."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from replay.bundle import REQUESTS_SCHEMA
from replay.record.common import ParsedRequest

# times a harness states that can be a request's: after 2000-01-01 and before 2200-01-01 (a field of
# another unit, or damage, is none)
_EARLIEST_US = 946_684_800_000_000
_LATEST_US = 7_258_118_400_000_000
_US_PER = {"ns": 1e-3, "us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6, "sec": 1e6, "seconds": 1e6}


@dataclass
class JsonRecord:
    """One JSON value of a file of them (JSONL, or objects printed over many lines one after
    another): the line it starts on, the value (None where it is no JSON: ``error`` says why), its
    text."""

    line: int
    value: Any
    raw: str
    error: str | None = None


_BLANK = re.compile(r"\s*")


def json_records(text: str) -> Iterator[JsonRecord]:
    """The JSON values of ``text`` in order, each with its line. A value that does not parse (a line cut
    short) is one record with its error, up to the end of its line; reading goes on at the next."""
    dec = json.JSONDecoder()
    pos, line, n = 0, 1, len(text)
    while True:
        end = _BLANK.match(text, pos).end()  # type: ignore[union-attr]
        line += text.count("\n", pos, end)
        pos = end
        if pos >= n:
            return
        try:
            value, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            eol = text.find("\n", pos)
            eol = n if eol < 0 else eol
            yield JsonRecord(line, None, text[pos:eol].removesuffix("\r"), f"not JSON ({e.msg}: a line cut short?)")
            pos = eol
            continue
        yield JsonRecord(line, value, text[pos:end])
        line += text.count("\n", pos, end)
        pos = end


def number(x: Any) -> float | None:
    """``x`` where it is a finite number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def count(x: Any) -> int | None:
    """``x`` as a count of tokens: a whole number ≥ 0, else None."""
    v = number(x)
    return int(v) if v is not None and v >= 0 and v == int(v) else None


def epoch_us(x: Any, unit: str) -> int | None:
    """An epoch time in ``unit`` ('ns', 's') as µs, None where it is none or no time a request can have."""
    v = number(x)
    if v is None:
        return None
    t = round(v * _US_PER[unit]) if unit != "ns" or not isinstance(x, int) else x // 1000  # (ns: exact)
    return t if _EARLIEST_US <= t < _LATEST_US else None


def duration_us(x: Any, unit: str) -> int | None:
    """A duration in ``unit`` ('ms', 's', 'ns', …) as µs; None where it is none, negative or the unit unknown."""
    v = number(x)
    scale = _US_PER.get(unit.strip().lower())
    return None if v is None or v < 0 or scale is None else round(v * scale)


def after(t: int | None, d: int | None) -> int | None:
    return None if t is None or d is None else t + d


_ROWS = {**{c: REQUESTS_SCHEMA[c] for c in ("id", "arrival_us", "first_token_us", "finish_us", "input_tokens",
                                           "output_tokens", "max_tokens", "status", "error", "source")},
         "arrival_from": pl.Utf8}


def request_rows(name: str, requests: list[ParsedRequest]) -> pl.DataFrame:
    """A harness's requests as rows of requests.parquet, their times still epoch µs (the recorder moves
    them to the bundle's t0); 'source' is 'file:line' (the file's name alone for a file of arrays), and
    'arrival_from' says how an arrival was placed where the file has no absolute time for it."""
    rows = [{"id": r.id, "arrival_us": r.arrival_t, "first_token_us": r.first_token_t, "finish_us": r.finish_t,
             "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "max_tokens": r.max_tokens,
             "status": r.status, "error": r.error, "source": name if r.line is None else f"{name}:{r.line}",
             "arrival_from": r.arrival_from} for r in requests]
    return pl.DataFrame(rows, schema=_ROWS)


def shown(names: list[str], most: int = 3) -> str:
    """Some of ``names``, for a note: 'a, b, c, …'."""
    return ", ".join(names[:most]) + (", …" if len(names) > most else "")
