"""One compiled pass over a vLLM log that tells each line's class, for the fast lane.

The fast lane reads stats, request and access lines itself and counts the lines that say nothing;
every other line goes to the line-by-line parser (``vllm_log.LogParser``), which stays the reference
for what a line means. Here one Hyperscan database, all patterns at once, tells those lines apart in
one pass over the bytes: a pattern per class, each matching a line of that class once (so a log costs
about one match a line), and rare patterns for whatever would make a line mean more than its class (a
colour code, a second message glued on, a word one of the reference's patterns needs). numpy turns
match offsets into line numbers.

A class is given only where it is certain: the line is vLLM's own strictly shaped line (or
uvicorn's access line), holds nothing else the reference would read, and the next line opens a
message of its own, so nothing continues it. Any doubt leaves the line to the reference (REFERENCE),
which is always right. Tests hold every class given to the reference's reading of the line.

Cost (``benchmarks/bench_time_to_answer.py --scanners``): on the benchmark's 1 GiB log, 16 s of CPU,
x45 of ``grep -c``, about what ``fastlog`` spends on the whole parse of the same log. Two floors set it:
the anchored prefix patterns run an automaton over every line (0.1-0.2 s of CPU per 100 MiB each), and
the binding calls Python once per match (0.2 us: 2 s for the log's 10.8 M lines before any work). It is
exact, not fast: a scanner near grep cannot hand Python a class per line one match at a time.
"""

from __future__ import annotations

import functools
import mmap
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

import hyperscan
import numpy as np
import numpy.typing as npt

from replay.record.fastlog import INERT_UNLESS
from replay.record.vllm_log import (
    LEVEL_TIME,
    NBSP,
    PROC_BODY,
    R_CUDA_ERROR,
    R_DEATH,
    R_LIB_ALLOC,
    R_NCCL_TIMEOUT,
    R_NO_CACHE,
    R_OOM_ANY,
    R_OOM_BARE,
    R_START,
    R_STATS_V0,
    R_STATS_V1,
    R_STOP,
    RAY_FOLD_MARK,
    split_line,
)

# a line's class (``LineClasses.codes``)
REFERENCE: Final = 0  # the line-by-line parser's: anything not certainly one of the below
INERT: Final = 1  # vLLM's strictly shaped line, at any level, that states no fact (its message holds no
# word of ``fastlog.INERT_UNLESS`` but a request phrase not at its start: no version clue either)
ACCESS: Final = 2  # uvicorn's access line ('INFO:     10.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK')
STATS: Final = 3  # the periodic stats line (V0's or V1's)
ADDED: Final = 4  # 'Added request <id>.'
FINISHED: Final = 5  # 'Finished request <id>.'
RECEIVED: Final = 6  # 'Received request <id>: prompt: …, params: …' (V0's request logging)
CLASS_NAMES: Final = ("reference", "inert", "access", "stats", "added", "finished", "received")
FACT_KIND: Final = {STATS: "stats", ADDED: "request_added", FINISHED: "request_finished",
                    RECEIVED: "request_received"}  # the one fact the reference reads from such a line

# the kinds of fact that mark an incident, whose lines ``LineClasses.incident`` lists
INCIDENT_KINDS: Final = frozenset({"oom", "cuda_error", "engine_death", "collective_timeout", "engine_start",
                                   "engine_stop", "vllm_memory_error", "host_oom_killed"})

PIECE_BYTES = 64 << 20  # scanned at a time (a piece ends at a line end; its match offsets are held as arrays)

# --- patterns (bytes; ASCII classes, where the reference's Python patterns take any Unicode letter, digit
# or space: a line the ASCII form misses is left to the reference, never misread) -------------------------
def ascii_form(pattern: str) -> str:
    """A Python pattern as Hyperscan takes it, matching a subset of what it matched: ``\\w`` as ASCII word
    characters (in a class too), lazy quantifiers as greedy and named groups as plain ones (whether a line matches is all that counts)."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            pair = pattern[i:i + 2]
            out.append(("A-Za-z0-9_" if in_class else "[A-Za-z0-9_]") if pair == "\\w" else pair)
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class and out[-1] not in ("[", "[^"):
            in_class = False
        elif c == "?" and not in_class and out and out[-1] in ("*", "+", "}"):
            i += 1  # (lazy: dropped)
            continue
        out.append(c)
        i += 1
    return re.sub(r"\(\?P<\w+>", "(?:", "".join(out))


_PROC = ascii_form(PROC_BODY)
_TIME = r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?"
_CALL = r"\[?[A-Za-z0-9_./-]+\.py:\d+\] "  # the call site: '[loggers.py:271] ', or 'metrics.py:351] ' to 0.7
STRICT_INFO = r"^(?:\(" + _PROC + r"\) )?INFO " + _TIME + " " + _CALL
STRICT_ANY = r"^(?:\(" + _PROC + r"\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) " + _TIME + " " + _CALL
ACCESS_HEAD = r"^(?:\(" + _PROC + r"\) *)?(?:INFO|WARNING|ERROR):[ \t]+"
_ID = r"[!-~]+"  # a request id: printable ASCII, no space
_REQUEST_WORDS = ("received request", "added request", "finished request", "aborted request")
# message starts the inert pattern leaves alone: the classes below take the first three (so a line gets one
# match, not two), and the reference a line that opens 'Aborted request' (a fact, but a rare one)
_STARTS = ("Added request ", "Finished request ", "Received request ", "Aborted request")


def _lit(word: str) -> str:
    return re.escape(word).replace("\\ ", " ")


def not_starting_with(words: tuple[str, ...]) -> str:
    """A pattern for the start of a text that does not begin with any of ``words``: it ends where the
    text first leaves every word (or at the line's end, where the text is a beginning of one)."""
    def node(prefix: str) -> str:
        nexts = sorted({w[len(prefix)] for w in words if w.startswith(prefix) and len(w) > len(prefix)})
        if any(w == prefix for w in words):
            return ""  # a whole word: no way on
        other = "[^\n" + "".join(re.escape(c) for c in nexts) + "]"
        alts = ["$", other] + [f"{_lit(c)}{node(prefix + c)}" for c in nexts if node(prefix + c)]
        return "(?:" + "|".join(alts) + ")"
    return node("")


def _caseless_words(words: tuple[str, ...] | list[str]) -> str:
    return "(?i:" + "|".join(_lit(w) for w in words) + ")"


_STATS = "(?:" + ascii_form(R_STATS_V0.pattern) + "|" + ascii_form(R_STATS_V1.pattern) + ")"
_ACCESS_LINE = (ACCESS_HEAD + r'[0-9.:]+ - "[A-Z]+ [!#-~]* HTTP/[0-9.]+" [0-9]+(?: [A-Za-z ]*)?$')
_MSG_WORDS = _caseless_words([w for w in INERT_UNLESS if w not in _REQUEST_WORDS])
_GLUED = LEVEL_TIME.replace(r"\d", "[0-9]")

# (id, pattern): classes, then what keeps a line from its class
_C_INERT, _C_ACCESS, _C_STATS, _C_ADDED, _C_FINISHED, _C_RECEIVED = INERT, ACCESS, STATS, ADDED, FINISHED, RECEIVED
_T_LINE = 10  # a colour code, a CR, a no-break space, Ray's fold: the reference reads the line otherwise
_T_WORD = 11  # a word one of the reference's patterns needs, in a strict line's message
_T_REQUEST = 12  # a request phrase inside a message (not at its start)
_T_GLUED = 13  # a second message glued onto the line
_T_ACCESS = 14  # such a word or a glued message in an access line
_T_KV = 15  # 'KV cache usage' in a message: a stats line, or one the reference may read as one
_T_INCIDENT = 16  # what an incident's facts need (a hint only: these lines are the reference's)


def _incident_pattern() -> str:
    """The reference's incident patterns, widened where Hyperscan lacks a construct (a look-ahead
    becomes plain text, a message anchor is dropped): a line they miss would not be an incident."""
    parts = [R_OOM_ANY.pattern, R_OOM_BARE.pattern, R_LIB_ALLOC.pattern, R_CUDA_ERROR.pattern, R_DEATH.pattern,
             R_START.pattern, R_STOP.pattern, R_NCCL_TIMEOUT.pattern, R_NO_CACHE.pattern,
             "is larger than the available KV cache memory|KV cache is needed|serve at least one request",
             r"on startup is less than|Error in memory profiling|is larger than the maximum number of tokens",
             "memory usage threshold|killed due to memory pressure"]
    out = []
    for p in parts:
        p = ascii_form(p.replace("(?=", "(?:").replace("^", "").replace("$", ""))
        out.append(f"(?:{p})")
    return "(?i:" + "|".join(out) + ")"


# a trigger looks only at a message: after the '] ' that ends a strict line's prefix (a word in the prefix, a
# process or call site such as '(APIServer pid=1)' or '[async_llm_engine.py:208]', is no trigger)
_MSG = r"\] [^\n]*"
PATTERNS: Final[tuple[tuple[int, str], ...]] = (
    (_C_INERT, STRICT_ANY + not_starting_with(_STARTS)),
    (_C_ACCESS, _ACCESS_LINE),
    (_C_STATS, STRICT_INFO + "[^\n]*" + _STATS),
    (_C_ADDED, STRICT_INFO + "Added request " + _ID + "$"),
    (_C_FINISHED, STRICT_INFO + "Finished request " + _ID + "$"),
    (_C_RECEIVED, STRICT_INFO + "Received request [!-9;-~]+:"),
    (_T_LINE, "\x1b|\r|\\^\\[|#033\\[|" + re.escape(NBSP.encode().decode("latin-1")) + "|" + re.escape(RAY_FOLD_MARK)),
    (_T_WORD, _MSG + _MSG_WORDS),
    (_T_REQUEST, r"\] [^\n]+" + _caseless_words(_REQUEST_WORDS)),
    (_T_GLUED, _MSG + _GLUED),
    (_T_ACCESS, '- "[^\n]*(?:' + _caseless_words(list(INERT_UNLESS)) + "|" + _GLUED + ")"),  # (after the client)
    (_T_KV, _MSG + "KV cache usage"),
    (_T_INCIDENT, _incident_pattern()),
)


def _database() -> hyperscan.Database:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    exprs = [p.encode("latin-1") for _, p in PATTERNS]
    db.compile(expressions=exprs, ids=[i for i, _ in PATTERNS], elements=len(exprs),
               flags=[hyperscan.HS_FLAG_MULTILINE] * len(exprs))
    return db


@functools.cache
def database() -> hyperscan.Database:
    """The compiled patterns (compiled once a process)."""
    return _database()


Lines = npt.NDArray[np.int64]


@dataclass(frozen=True)
class LineClasses:
    """Each line's class, in file order (line ``i`` is line number ``i + 1``)."""

    codes: npt.NDArray[np.uint8]  # REFERENCE, INERT, ACCESS, STATS, ADDED, FINISHED or RECEIVED
    incident: Lines  # indices of lines that hold what an incident's facts need (OOM, a CUDA error, an
    # engine's death, start or stop, a memory error): hints for a reader in a hurry; all are REFERENCE lines

    def counts(self) -> dict[str, int]:
        """How many lines of each class."""
        got = np.bincount(self.codes, minlength=len(CLASS_NAMES))
        return {name: int(n) for name, n in zip(CLASS_NAMES, got, strict=True)}

    def lines_of(self, code: int) -> Lines:
        """Line numbers (from 1) of the lines of class ``code``."""
        return (np.flatnonzero(self.codes == code) + 1).astype(np.int64)


def _pieces(data: memoryview, piece_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) of pieces of ``data`` that end at a line end (or at its end)."""
    n, start = len(data), 0
    raw = data.obj if isinstance(data.obj, (bytes, mmap.mmap)) else bytes(data)
    while start < n:
        end = min(n, start + piece_bytes)
        if end < n:
            cut = raw.rfind(b"\n", start, end)
            end = cut + 1 if cut >= start else raw.find(b"\n", end) + 1 or n
        yield start, end
        start = end


def _line_ends(buf: npt.NDArray[np.uint8], base: int) -> Lines:
    return (np.flatnonzero(buf == 10) + base).astype(np.int64)


def _matches(db: hyperscan.Database, piece: memoryview) -> tuple[npt.NDArray[np.uint8], Lines]:
    """The id and end offset of every match in ``piece`` (a Python call each: the scan's main cost)."""
    ids: list[int] = []
    at: list[int] = []
    put_id, put_at = ids.append, at.append

    def on_match(i: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
        put_id(i)
        put_at(to)
    db.scan(cast(bytes, piece), match_event_handler=on_match)
    return np.asarray(ids, dtype=np.uint8), np.asarray(at, dtype=np.int64)


def scan(data: bytes | mmap.mmap, piece_bytes: int = PIECE_BYTES) -> LineClasses:
    """The class of every line of ``data`` (a log's bytes, UTF-8; lines end at LF, as
    ``vllm_log.physical_lines`` cuts them: a final LF ends the last line, it opens none)."""
    view = memoryview(data)
    if not len(view):
        return LineClasses(np.zeros(0, np.uint8), np.zeros(0, np.int64))
    db = database()
    whole = np.frombuffer(view, np.uint8)
    ends_parts: list[Lines] = []
    ids_parts: list[npt.NDArray[np.uint8]] = []
    at_parts: list[Lines] = []
    for start, end in _pieces(view, piece_bytes):
        ids, at = _matches(db, view[start:end])
        ends_parts.append(_line_ends(whole[start:end], start))
        ids_parts.append(ids)
        at_parts.append(at + start)
    line_ends = np.concatenate(ends_parts)
    n_lines = len(line_ends) + (0 if whole[-1] == 10 else 1)
    ids_all, at_all = np.concatenate(ids_parts), np.concatenate(at_parts)
    line = np.searchsorted(line_ends, at_all, side="left")  # a match ends at or before its line's LF
    return _decide(ids_all, line, n_lines, view, line_ends)


def _decide(ids: npt.NDArray[np.uint8], line: Lines, n_lines: int, view: memoryview,
            line_ends: Lines) -> LineClasses:
    """Each line's class from the matches on it (``ids``, on lines ``line``)."""
    def on(i: int) -> npt.NDArray[np.bool_]:
        hit = np.zeros(n_lines, dtype=bool)
        hit[line[ids == i]] = True
        return hit
    codes = np.zeros(n_lines, dtype=np.uint8)
    line_doubt = on(_T_LINE) | on(_T_GLUED)
    word, kv = on(_T_WORD), on(_T_KV)
    codes[on(_C_INERT) & ~word & ~on(_T_REQUEST) & ~kv] = INERT
    codes[on(_C_ACCESS) & ~on(_T_ACCESS)] = ACCESS
    codes[on(_C_ADDED) & ~word] = ADDED
    codes[on(_C_FINISHED) & ~word] = FINISHED
    codes[on(_C_RECEIVED) & ~kv] = RECEIVED
    codes[on(_C_STATS)] = STATS  # (the reference reads a stats line first, whatever else the message holds)
    codes[line_doubt] = REFERENCE
    # a class holds only where the next line opens a message of its own: a line that some class pattern
    # matched does; of the others (few), the reference is asked
    opens = np.zeros(n_lines + 1, dtype=bool)
    opens[n_lines] = True  # (the end of the log ends the last message)
    for i in (_C_INERT, _C_ACCESS, _C_STATS, _C_ADDED, _C_FINISHED, _C_RECEIVED):
        opens[line[ids == i]] = True
    ask = np.flatnonzero((codes[:-1] != REFERENCE) & ~opens[1:n_lines]) + 1
    raw = view.obj if isinstance(view.obj, (bytes, mmap.mmap)) else view.tobytes()
    for k in ask.tolist():
        start = int(line_ends[k - 1]) + 1
        end = int(line_ends[k]) if k < len(line_ends) else len(view)
        text = raw[start:end].decode("utf-8", errors="replace")
        opens[k] = bool(text.strip()) and split_line(0, text)[0].prefixed
    codes[~opens[1:]] = REFERENCE
    incident = np.unique(line[ids == _T_INCIDENT]).astype(np.int64)
    codes[incident] = REFERENCE
    return LineClasses(codes, incident)


def scan_file(path: Path, piece_bytes: int = PIECE_BYTES) -> LineClasses:
    """``scan`` of a plain (uncompressed) log file, mapped rather than read."""
    with path.open("rb") as fh:
        if path.stat().st_size == 0:
            return scan(b"")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return scan(mm, piece_bytes)
