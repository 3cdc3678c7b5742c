"""vLLM's ``bench serve`` results (``--save-result``; the JSON ``benchmark_serving.py`` saved before it,
and each run of ``vllm bench sweep``): with ``--save-detailed``, one request per entry of its arrays
(input and output lengths, TTFT, ITLs, errors, and in later releases start times) as the bundle's
requests; without, its figures as a note.

Its start times are the client's monotonic clock (``time.perf_counter``), not times of day: they are
placed from the result's ``date``, the client's local time when the run ended and was saved (to the
second), less its duration, and said so."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

from replay.record.common import (
    Parsed,
    ParsedRequest,
    Parser,
    as_list,
    as_obj,
    json_value,
    lines_in,
    utc_us,
)
from replay.record.harness import after, count, number
from replay.record.options import RecordOptions


class BenchResult(TypedDict, total=False):
    """What the recorder reads of a result (every release names these alike; ``start_times`` since
    the start times were saved, ``run_number`` in a sweep's runs)."""

    date: str  # 'YYYYMMDD-HHMMSS' (some forks 'YYYY-MM-DD HH:MM:SS'), the client's local time, naive
    model_id: str
    duration: float  # seconds, first request sent to last answered
    completed: int
    failed: int
    input_lens: list[Any]
    output_lens: list[Any]
    ttfts: list[Any]  # seconds
    itls: list[Any]  # per request, seconds between tokens
    latencies: list[Any]  # seconds, sent to answered (in later releases)
    errors: list[Any]  # '' where it succeeded
    start_times: list[Any]  # time.perf_counter() seconds
    run_number: int
    max_num_seqs: int


ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "errors", "start_times")


def _date(s: str) -> datetime | None:
    for fmt in ("%Y%m%d-%H%M%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            continue
    return None


def _run_start_us(path: Path, r: BenchResult, tz_offset_s: int, notes: list[str]) -> int | None:
    """When its first request was sent (epoch µs): its date less its duration; None without a date."""
    end = _date(str(r.get("date", "")))
    if end is None:
        notes.append(f"{path.name}: no date it can read ({r.get('date')!r}): its requests are not placed in time")
        return None
    took = number(r.get("duration")) or 0.0
    notes.append(f"{path.name}: its requests' start times are the client's monotonic clock: placed from its date "
                 f"({r.get('date')}, when the run ended and was saved, to the second) less its duration ({took:.1f} s), "
                 + (f"the date in UTC{tz_offset_s / 3600:+g} h (--tz)" if tz_offset_s else
                    "the date read as UTC (--tz if the client's clock was another zone's)") + ": within a second or two")
    return utc_us(end, tz_offset_s) - round(took * 1e6)


def _request(path: Path, r: BenchResult, i: int, start_us: int | None, first_s: float | None) -> ParsedRequest:
    def at(name: str) -> Any:
        arr = as_list(r.get(name))
        return arr[i] if i < len(arr) else None

    err = at("errors")
    failed = isinstance(err, str) and err.strip() != ""
    s = number(at("start_times"))
    arrival = None if start_us is None or s is None or first_s is None else start_us + round((s - first_s) * 1e6)
    ttft = number(at("ttfts"))
    first = None if failed or ttft is None else after(arrival, round(ttft * 1e6))
    itls = [v for x in as_list(at("itls")) if (v := number(x)) is not None]
    took = number(at("latencies"))
    end = after(arrival, round(took * 1e6)) if took is not None and not failed else \
        after(first, round(sum(itls) * 1e6)) if at("itls") is not None else None  # (older: TTFT and the ITLs)
    return ParsedRequest(
        id=f"{path.stem}#{i}", arrival_t=arrival, first_token_t=first, finish_t=end,
        input_tokens=count(at("input_lens")), output_tokens=None if failed else count(at("output_lens")),
        status="error" if failed else "ok" if err is not None or ttft is not None else "unknown",
        error=str(err).strip() if failed else None,
        arrival_from=None if arrival is None else "the client's monotonic start times, placed from the result's date")


def parse_result(path: Path, text: str, tz_offset_s: int = 0) -> Parsed:
    """A ``bench serve`` result: its per-request arrays as requests (an array shorter than the longest
    leaves its field unknown for the rest, said in a note), its figures as a note."""
    p = Parsed(kind="vllm-bench-result")
    r: BenchResult = as_obj(json_value(path, text))  # type: ignore[assignment]
    p.lines = p.parsed = lines_in(text)
    lens = {k: len(as_list(r.get(k))) for k in ARRAYS if k in r}
    n = max(lens.values(), default=0)
    run = f"run {r['run_number']} of a vllm bench sweep, " if "run_number" in r else ""
    p.notes.append(f"{path.name}: vLLM bench serve result ({run}model {r.get('model_id')}): {r.get('completed')} "
                   f"requests completed, {r.get('failed')} failed" + (
                       f"; {n} per-request records" if n else "; no per-request records (saved without --save-detailed)"))
    short = sorted(k for k, m in lens.items() if m < n)
    if short:
        p.notes.append(f"{path.name}: {', '.join(f'{k} ({lens[k]})' for k in short)} shorter than its {n} requests: "
                       "unknown for the rest")
    if not n:
        return p
    starts = [v for x in as_list(r.get("start_times")) if (v := number(x)) is not None]
    start_us = _run_start_us(path, r, tz_offset_s, p.notes) if starts else None
    if not starts:
        p.notes.append(f"{path.name}: no start_times (an older vLLM saved none): its requests have no arrival "
                       "and cannot be replayed as a trace")
    first_s = min(starts) if starts else None
    p.requests = [_request(path, r, i, start_us, first_s) for i in range(n)]
    if (completed := count(r.get("completed"))) is not None and completed > n:
        p.notes.append(f"{path.name}: {completed} requests completed but only {n} are listed (a cut copy?)")
    return p


# --- as the registry reads it --------------------------------------------------------------------------
_DATE = re.compile(r'"date"\s*:\s*"(?:\d{8}-\d{6}|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"')


def sniff(head: str) -> str | None:
    """A result: an object with its date, and its counts of prompts and completed requests."""
    s = head.lstrip()
    return "vllm-bench-result" if s.startswith("{") and _DATE.search(s[:4000]) and '"num_prompts"' in s and (
        '"completed"' in s or '"request_throughput"' in s) else None


def _result(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_result(path, text, opts.tz_offset_s)


PARSERS: dict[str, Parser] = {"vllm-bench-result": _result}
