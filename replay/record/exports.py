"""Log exports: the log lines an export of log entries holds, each with its time and its line.

A vLLM server on GKE, EKS or AKS logs to the cloud's logging service, and the copy of its log an
on-call engineer has is often that service's export:
- Google Cloud Logging's ``gcloud logging read --format=json`` (or the Logs Explorer's JSON
  download): an array of LogEntry objects, newest first unless ``--order=asc``;
- AWS CloudWatch Logs' ``aws logs filter-log-events`` or ``get-log-events``: an object whose
  ``events`` give each line's ``message`` and its time in ms;
- Azure Monitor Logs (AKS's ContainerLogV2 or ContainerLog table), as ``az monitor log-analytics
  query`` prints it (a JSON array of rows) or as the portal exports it to CSV (``TimeGenerated
  [UTC]``, ``LogMessage``);
- Grafana's logs download as JSON (``line``, ``date``), and any CSV export of a log with a time and a
  message column (Splunk's ``_time``, ``_raw``; Kibana's ``@timestamp``, ``message``);
- ``journalctl -o json-pretty`` (objects over many lines: ``MESSAGE``, ``__REALTIME_TIMESTAMP``).
Read as a text log, the export's own lines went to quarantine and every line lost its exact time.

This module streams such a document's entries (an entry at a time, never the whole file) into the
one-record-a-line form the vLLM log parser reads fast (Docker's ``{"log", "time"}``), an entry a line,
oldest first (an export that runs newest first is turned round), and keeps for each of those lines
the line of the export where its entry begins; ``renumber`` then gives every fact and quarantined
line of the parse that line, so that they name the export's own lines. An entry with no text is
passed on as it stands (the parser quarantines it, or finds a fact in it); where the JSON breaks off
(an export cut short), each line from there on is quarantined with its line.
"""

from __future__ import annotations

import csv
import json
import mmap
import re
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from replay.record.fastlog import FastFacts, text_pieces
from replay.record.vllm_log import ISO_TIME, LogParse, realtime_iso

PIECE_BYTES = 1 << 20
# where each service puts an entry's text: GCP's textPayload, or the message of a structured
# (jsonPayload) entry; CloudWatch's message; Azure Monitor's LogMessage (ContainerLogV2) or LogEntry
# (ContainerLog); and its time: GCP's RFC 3339 string, CloudWatch's ms, Azure's TimeGenerated
TEXT_KEYS = ("textPayload", "message", "log", "LogMessage", "LogEntry", "line", "MESSAGE")
PAYLOAD_TEXT_KEYS = ("message", "log", "msg")
TIME_KEYS = ("timestamp", "TimeGenerated", "date")  # (Grafana's 'timestamp' is ns as a string: its 'date' is read)
WHAT = {"gcp": "a Google Cloud Logging export", "aws": "an AWS CloudWatch Logs export",
        "azure": "an Azure Monitor Logs export", "grafana": "a Grafana logs download (JSON)",
        "journald": "journalctl -o json-pretty output",
        "csv": "a CSV export of a log"}
# a CSV export of a log (the Azure portal's, Kibana's Discover, Splunk's, Datadog's, a Loki logs panel's,
# CloudWatch Logs Insights' '@timestamp,@message'):
# its time and message columns, by name, most telling first
TIME_COLUMNS = ("timegenerated [utc]", "timegenerated", "@timestamp", "timestamp", "_time", "date", "time")
MESSAGE_COLUMNS = ("logmessage", "logentry", "message", "@message", "_raw", "line", "log", "content")
# the Azure portal's CSV export writes its UTC times as '2/25/2025, 9:19:25.391 AM'
AZURE_PORTAL_TIME = ("%m/%d/%Y, %I:%M:%S.%f %p", "%m/%d/%Y, %I:%M:%S %p")
_ISO = re.compile(ISO_TIME)
_NAIVE = re.compile(r"(\d{4})-\d\d-\d\d[T ]\d\d:\d\d")  # a date and time without a zone
_AWS_EVENTS = re.compile(r'[{,]\s*"events"\s*:\s*\[')
_SPACE = re.compile(r"[ \t\r\n\ufeff]*")
_BETWEEN = re.compile(r"[ \t\r\n,]*")  # (between entries)


def export_kind(head: str) -> str | None:
    """The kind of export (a key of WHAT) ``head`` (the start of a file) opens, else None. A Cloud
    Logging export of Kubernetes events (their involvedObject inside) is left to the events reader."""
    s = head.lstrip()
    if (s.startswith("[") and re.match(r"\[\s*\{", s) and ('"textPayload"' in head or '"jsonPayload"' in head)
            and ('"logName"' in head or '"insertId"' in head) and '"involvedObject"' not in head):
        return "gcp"
    if (s.startswith("{") and _AWS_EVENTS.search(head) and '"message"' in head
            and any(k in head for k in ('"ingestionTime"', '"logStreamName"', '"eventId"'))):
        return "aws"
    if re.match(r"\[\s*\{", s) and '"TimeGenerated"' in head and ('"LogMessage"' in head or '"LogEntry"' in head):
        return "azure"
    if re.match(r'\[\s*\{\s*"line"\s*:', s) and '"date"' in head:  # (Grafana's logRowsToReadableJson)
        return "grafana"
    if re.match(r"\{\s*\n", s) and '"MESSAGE"' in head and '"__REALTIME_TIMESTAMP"' in head:
        return "journald"  # (json-pretty: an object over many lines, one after another; `-o json`'s
        # object a line is read as a log of shipper records)
    if _csv_columns(s.split("\n", 1)[0]) is not None:
        return "csv"
    return None


def _csv_columns(header: str | list[str]) -> tuple[int, int] | None:
    """The time and message columns of a CSV log export's header (a line, or its fields), or None."""
    if isinstance(header, str):
        if "," not in header:
            return None
        try:
            header = next(csv.reader([header]), [])
        except csv.Error:  # (a CR inside the line, as a progress bar writes: not a CSV export's header)
            return None
    names = [c.strip().lower() for c in header]
    t = next((names.index(c) for c in TIME_COLUMNS if c in names), None)
    m = next((names.index(c) for c in MESSAGE_COLUMNS if c in names), None)
    return None if t is None or m is None else (t, m)


def _iso(t: Any) -> str | None:
    """An entry's time as ISO UTC: GCP's RFC 3339 string as given, CloudWatch's ms since 1970."""
    if isinstance(t, str):
        return t if _ISO.fullmatch(t) else None
    if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 253402300800000:  # (before year 10000)
        return datetime.fromtimestamp(t / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return None


def entry_text(entry: Any) -> str | None:
    """The log line an entry holds, or None."""
    if not isinstance(entry, dict):
        return None
    for k in TEXT_KEYS:
        if isinstance(entry.get(k), str):
            return str(entry[k])
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict):
        for k in PAYLOAD_TEXT_KEYS:
            if isinstance(payload.get(k), str):
                return str(payload[k])
    return None


def _record(entry: Any) -> tuple[str, str | None]:
    """The line to write for an entry, and its time: a shipper record where it has text, else the
    entry itself on one line."""
    text = entry_text(entry)
    t = None
    if isinstance(entry, dict):  # (journald's time first, then the services')
        t = realtime_iso(entry.get("__REALTIME_TIMESTAMP")) or next(
            (iso for k in TIME_KEYS if (iso := _iso(entry.get(k))) is not None), None)
    if text is None:
        return json.dumps(entry, ensure_ascii=False), t
    log = json.dumps(text, ensure_ascii=False)  # (a time that is ISO through and through needs no escaping)
    return ('{"log":' + log + "}" if t is None else '{"log":' + log + ',"time":"' + t + '"}'), t


@dataclass
class Converted:
    """What converting an export found: its entries and their lines, whether they run newest first,
    and a break in its JSON."""

    entries: int = 0
    timed: int = 0  # entries with a time
    lines: array[int] = field(default_factory=lambda: array("q"))  # the export's line of each line written
    total_lines: int = 0
    newest_first: bool = False
    broken_at: int | None = None  # the line where the JSON breaks off
    broken: str | None = None
    tail: list[tuple[int, str]] = field(default_factory=list)  # the lines from there on (not blank)
    untimed: int = 0  # CSV rows whose time is not exact (no zone): their lines' own logged times stand
    year: int | None = None  # the year of the first of those, where it is a date and time (it dates the
    # log's lines, which state no year, though not to the second)
    form: str = "JSON"  # what the export is written in (JSON, or CSV), for what is said of a break in it

    def notes(self, name: str, kind: str) -> list[str]:
        out = [f"{name}: read as {WHAT[kind]}: {self.entries} entries, {self.timed} of them at their own exact time"]
        if self.untimed:
            out.append(f"{name}: {self.untimed} rows have no exact time (no time zone stated): their lines' own "
                       "logged times are used")
        if self.newest_first:
            out.append(f"{name}: its entries run newest first (gcloud's default order): read oldest first")
        if self.broken_at is not None:
            out.append(f"{name}:{self.broken_at}: the {self.form} breaks off ({self.broken})"
                       + (": the lines from there on are quarantined" if self.tail else ""))
        return out


MAX_ENTRY_CHARS = 16 << 20  # an entry still unfinished after this many characters is taken as broken JSON
LINE_KEPT = 1 << 16  # characters of the position's line kept before it (for quoting a broken line whole)


class _Stream:
    """The document's text, read in pieces, at a position whose line number is kept."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None, hasher: Any = None) -> None:
        self.pieces = text_pieces(path, PIECE_BYTES, hasher)
        self.buf, self.pos, self.line = "", 0, 1
        self.last = b""  # the last piece read
        self.progress = progress

    def more(self) -> bool:
        """Read the next piece (the lines before the position's are let go); False at the end."""
        piece = next(self.pieces, None)
        if piece is None:
            return False
        if self.progress is not None:
            self.progress(len(piece))
        self.last = piece
        # (the position's line whole where it began lately: a compact export is one long line)
        keep = max(self.buf.rfind("\n", 0, self.pos) + 1, self.pos - LINE_KEPT)
        self.buf = self.buf[keep:] + piece.decode("utf-8", errors="replace")
        self.pos -= keep
        return True

    def advance(self, to: int) -> None:
        self.line += self.buf.count("\n", self.pos, to)
        self.pos = to

    def skip(self, chars: re.Pattern[str]) -> str | None:
        """Past what ``chars`` matches: the next character, or None at the end."""
        while True:
            m = chars.match(self.buf, self.pos)
            i = m.end() if m else self.pos
            self.advance(i)
            if i < len(self.buf):
                return self.buf[i]
            if not self.more():
                return None

    def rest(self) -> Iterator[tuple[int, str]]:
        """The lines from the position's on, whole, numbered."""
        self.pos = self.buf.rfind("\n", 0, self.pos) + 1
        while True:
            cut = self.buf.rfind("\n", self.pos) + 1
            if cut:
                for i, text in enumerate(self.buf[self.pos:cut - 1].split("\n")):
                    yield self.line + i, text
                self.advance(cut)
            if not self.more():
                if self.pos < len(self.buf):
                    yield self.line, self.buf[self.pos:]
                return

    def lines(self) -> int:
        """The number of lines in the file (read to its end)."""
        while self.more():
            pass
        return self.line - 1 + self.buf.count("\n", self.pos) + (1 if self.last and not self.last.endswith(b"\n") else 0)


@dataclass
class _Entry:
    line: int
    entry: Any = None
    text: str | None = None  # a line read as text, after the JSON breaks off


def _csv_time(v: str, utc: bool) -> str | None:
    """A CSV export's time as exact ISO: ISO with a zone as given (Splunk's, Datadog's, Kibana's
    @timestamp), the Azure portal's under a '[UTC]' header; None for a time without a zone."""
    v = v.strip()
    if utc:
        for fmt in AZURE_PORTAL_TIME:
            try:
                return datetime.strptime(v, fmt).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            except ValueError:
                continue
    m = _ISO.fullmatch(v)
    return v if m and (m["zone"] or utc) else None


def _csv_entries(s: _Stream, res: Converted) -> Iterator[_Entry]:
    """The rows of a CSV export of a log as entries (a quoted message may span lines: a row is named
    by its first line); if the CSV breaks off, each line from there on."""
    lines = s.rest()
    csv.field_size_limit(max(csv.field_size_limit(), MAX_ENTRY_CHARS))  # (a logged prompt can be long)
    reader = csv.reader(text + "\n" for _, text in lines)
    try:
        header = next(reader, [])
        cols = _csv_columns(header)
        if cols is None:
            res.broken_at, res.broken = 1, f"no time and message columns among {', '.join(header) or 'none'}"
            return
        tcol, mcol = cols
        utc = header[tcol].strip().lower() in ("timegenerated [utc]", "timegenerated")  # (Azure's: UTC)
        before = reader.line_num
        for row in reader:
            at, before = before + 1, reader.line_num
            if not any(row):
                continue
            t = _csv_time(row[tcol], utc) if tcol < len(row) else None
            res.untimed += t is None
            if t is None and res.year is None and tcol < len(row) and (d := _NAIVE.match(row[tcol].strip())):
                res.year = int(d.group(1))  # (CloudWatch Logs Insights' @timestamp: '2025-03-01 10:05:00.000')
            yield _Entry(at, {"LogMessage": row[mcol] if mcol < len(row) else None, "TimeGenerated": t})
    except csv.Error as e:
        res.broken_at, res.broken = reader.line_num, str(e)
        yield from (_Entry(no, text=t) for no, t in lines)


def _entries(s: _Stream, kind: str, res: Converted) -> Iterator[_Entry]:
    """The entries in order; if the JSON breaks off (noted in ``res``), each line from there on."""
    if kind == "csv":
        yield from _csv_entries(s, res)
        return
    dec = json.JSONDecoder()
    stream = kind == "journald"  # (objects one after another, no array around them)
    if kind == "aws":  # the events array inside the top-level object
        while not _AWS_EVENTS.search(s.buf, s.pos) and s.more():
            pass
        m = _AWS_EVENTS.search(s.buf, s.pos)
        if m is None:
            res.broken_at, res.broken = s.line, "no 'events' array"
            return
        s.advance(m.end())
    elif not stream and s.skip(_SPACE) == "[":
        s.advance(s.pos + 1)
    elif not stream:
        res.broken_at, res.broken = s.line, "not a JSON array"
        yield from (_Entry(no, text=t) for no, t in s.rest())
        return
    while True:
        c = s.skip(_BETWEEN)
        if c == "]" and not stream:
            return
        if c is None:
            if not stream:
                res.broken_at, res.broken = s.line, "the array is not closed"
            return
        try:
            entry, end = dec.raw_decode(s.buf, s.pos)
        except json.JSONDecodeError as e:
            unfinished = e.pos >= len(s.buf) - 64 or e.msg.startswith("Unterminated string")
            if unfinished and len(s.buf) - s.pos < MAX_ENTRY_CHARS and s.more():
                continue
            res.broken_at, res.broken = s.line, e.msg
            yield from (_Entry(no, text=t) for no, t in s.rest())
            return
        yield _Entry(s.line, entry)
        s.advance(end)


def convert(path: Path, kind: str, out: Path, progress: Callable[[int], None] | None = None,
            hasher: Any = None) -> Converted:
    """Write the export ``path`` (``kind``: a key of WHAT) as a log of shipper records to ``out``, an
    entry a line, oldest first; ``Converted.lines`` holds each one's line in the export. With
    ``hasher``, every byte of the export goes into it (it is read to its end)."""
    res = Converted(form="CSV" if kind == "csv" else "JSON")
    back = ahead = 0
    last_t: str | None = None  # (to the second: enough to tell the order an export runs in)
    s = _Stream(path, progress, hasher)
    offsets = array("q", [0])
    with out.open("wb") as fo:
        for e in _entries(s, kind, res):
            if e.text is not None:  # (not the last entry's continuation: quarantined as they stand)
                if e.text.strip():
                    res.tail.append((e.line, e.text))
                continue
            res.entries += 1
            text, iso = _record(e.entry)
            t = iso[:19] if iso is not None else None
            res.timed += t is not None
            if t is not None and last_t is not None:
                back, ahead = back + (t < last_t), ahead + (t > last_t)
            last_t = t if t is not None else last_t
            res.lines.append(e.line)
            offsets.append(offsets[-1] + fo.write(text.encode("utf-8", errors="replace") + b"\n"))
    res.total_lines = s.lines()
    res.newest_first = back > ahead
    if res.newest_first and res.entries > 1:  # oldest first, as a log runs
        with out.open("rb") as fi, mmap.mmap(fi.fileno(), 0, access=mmap.ACCESS_READ) as mm, \
                out.with_suffix(".rev").open("wb") as fo:
            for k in range(res.entries - 1, -1, -1):
                fo.write(mm[offsets[k]:offsets[k + 1]])
        out.with_suffix(".rev").replace(out)
        res.lines.reverse()
    return res


_FOLLOWS = re.compile(r"\(follows line (\d+)\)")


def renumber(lp: LogParse, ff: FastFacts, conv: Converted) -> None:
    """Give the facts and quarantined lines of the parse of ``convert``'s output the export's lines,
    and count the export's own lines (its JSON around the entries: read, so parsed)."""
    m = conv.lines
    def at(no: int) -> int:
        return m[no - 1] if 1 <= no <= len(m) else no

    for f in lp.facts:
        f.line = at(f.line)
    lp.quarantine = [(at(no), _FOLLOWS.sub(lambda x: f"(follows line {at(int(x[1]))})", reason), raw)
                     for no, reason, raw in lp.quarantine]
    why = f"after line {conv.broken_at}, where the {conv.form} breaks off ({conv.broken}): not read as an entry"
    lp.quarantine += [(no, why, text) for no, text in conv.tail]
    # the export's lines: those of a quarantined entry (or more, where they share a line) and the rest,
    # parsed (its JSON around the entries among them)
    lp.lines_read = conv.total_lines
    lp.lines_parsed, lp.continuation_lines = conv.total_lines - len({no for no, _, _ in lp.quarantine}), 0
    ff.request_ends = [(at(no), ts) for no, ts in ff.request_ends]
    if m and (ff.stats or ff.requests):
        lines = pl.Series("export_line", m, dtype=pl.Int64)
        for spilled in dict.fromkeys([*ff.stats, *ff.requests]):  # (slow_requests are among the requests)
            df = pl.read_ipc(spilled.read_bytes())  # (read whole before it is written over)
            df.with_columns(line=lines.gather(df["line"] - 1)).write_ipc(spilled)
