"""GuideLLM's ``benchmarks.json``: each benchmark's requests (successful, errored and incomplete) as
the bundle's requests. Two layouts: the report of 0.4 on (``metadata.version`` 1: per-request
``info.timings`` in epoch seconds), and the older one of 0.2-0.3 (``start_time``, ``first_token_time``,
``end_time`` on each request); times are epoch seconds in both."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypedDict

from replay.record.common import (
    Parsed,
    ParsedRequest,
    Parser,
    RequestStatus,
    as_list,
    as_obj,
    json_value,
    lines_in,
)
from replay.record.harness import count, epoch_us
from replay.record.options import RecordOptions

LISTS: dict[str, RequestStatus] = {"successful": "ok", "errored": "error", "incomplete": "aborted"}


class Timings(TypedDict, total=False):
    """A request's ``info.timings`` (0.4 on), epoch seconds."""

    request_start: float
    first_token_iteration: float
    last_token_iteration: float
    request_end: float


class RequestStats(TypedDict, total=False):
    """One request of a benchmark, either layout."""

    request_id: str
    info: dict[str, Any]  # 0.4 on: timings, error
    request_args: str  # 0.4 on: the request as JSON text (its body's max_tokens)
    prompt_tokens: int
    output_tokens: int
    start_time: float  # 0.2-0.3
    first_token_time: float
    end_time: float
    error: str | None


def _max_tokens(args: Any) -> int | None:
    """The max_tokens the request asked for, from its request_args (JSON text)."""
    try:
        body = as_obj(as_obj(json.loads(args)).get("body")) if isinstance(args, str) else {}
    except ValueError:
        return None
    return count(body.get("max_tokens") if body.get("max_tokens") is not None else body.get("max_completion_tokens"))


def _request(r: RequestStats, status: RequestStatus, line: int | None, bench: int) -> ParsedRequest:
    info = as_obj(r.get("info"))
    tm: Timings = as_obj(info.get("timings"))  # type: ignore[assignment]
    start = epoch_us(tm.get("request_start", r.get("start_time")), "s")
    first = epoch_us(tm.get("first_token_iteration", r.get("first_token_time")), "s")
    end = epoch_us(tm.get("request_end", r.get("end_time")), "s")
    err = info.get("error") or r.get("error")
    rid = r.get("request_id") or info.get("request_id")
    return ParsedRequest(
        id=str(rid) if rid else f"benchmark {bench} request at line {line}", line=line, arrival_t=start,
        first_token_t=first, finish_t=end, input_tokens=count(r.get("prompt_tokens")),
        output_tokens=count(r.get("output_tokens")), max_tokens=_max_tokens(r.get("request_args")), status=status,
        error=str(err) if err else "incomplete when the benchmark ended" if status == "aborted" else None)


def _lines_of_ids(text: str) -> dict[str, int]:
    """The line of each request id in the report (where the request is stated)."""
    out: dict[str, int] = {}
    line, pos = 1, 0
    for m in re.finditer(r'"request_id"\s*:\s*"([^"]+)"', text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        out.setdefault(m.group(1), line)
    return out


def parse_report(path: Path, text: str) -> Parsed:
    """A report: every request of every benchmark, in the order of its lists; a request without a start
    time is kept with none (said in a note), as is one a benchmark counts but did not keep (noted)."""
    p = Parsed(kind="guidellm-report")
    report = as_obj(json_value(path, text))
    p.lines = p.parsed = lines_in(text)
    lines = _lines_of_ids(text)
    listed, counted = 0, 0
    for b, bench in enumerate(as_list(report.get("benchmarks"))):
        reqs = as_obj(as_obj(bench).get("requests"))
        for name, status in LISTS.items():
            for r in as_list(reqs.get(name)):
                r = as_obj(r)
                p.requests.append(_request(r, status, lines.get(str(r.get("request_id"))), b))  # type: ignore[arg-type]
                listed += 1
        totals = as_obj(as_obj(bench).get("request_totals")) or as_obj(as_obj(as_obj(bench).get("metrics")).get("request_totals"))
        counted += count(totals.get("total")) or 0
    version = as_obj(report.get("metadata")).get("guidellm_version")
    by = {s: sum(1 for q in p.requests if q.status == s) for s in LISTS.values()}
    p.notes.append(f"{path.name}: GuideLLM report{f' ({version})' if version else ''}: "
                   f"{len(as_list(report.get('benchmarks')))} benchmark(s), {listed} requests "
                   f"({by['ok']} successful, {by['error']} errored, {by['aborted']} incomplete)")
    if counted > listed:
        p.notes.append(f"{path.name}: its benchmarks count {counted} requests but keep {listed} (GuideLLM keeps a "
                       "sample of them): the others are not in the evidence")
    untimed = sum(1 for q in p.requests if q.arrival_t is None)
    if untimed:
        p.notes.append(f"{path.name}: {untimed} requests without a start time: kept, not placed in time")
    return p


# --- as the registry reads it --------------------------------------------------------------------------
_BENCH = re.compile(r'"benchmarks"\s*:\s*\[')
_GENERATIVE = re.compile(r'"type_"\s*:\s*"generative_(?:benchmark|request_stats|text_response)"')


def sniff(head: str) -> str | None:
    """A report: an object whose 'benchmarks' are GuideLLM's generative benchmarks (their keys in any order)."""
    return "guidellm-report" if head.lstrip().startswith("{") and _BENCH.search(head) and _GENERATIVE.search(head) else None


def _report(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_report(path, text)


PARSERS: dict[str, Parser] = {"guidellm-report": _report}
