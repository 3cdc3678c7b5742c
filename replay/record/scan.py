"""Two compiled scanners of a vLLM log that tell each line's class, for the fast lane.

The fast lane reads stats, request and access lines itself and counts the lines that say nothing;
every other line goes to the line-by-line parser (``vllm_log.LogParser``), which stays the reference
for what a line means. ``scan`` tells those lines apart exactly, one Hyperscan database (all patterns
at once) over the bytes: a pattern per class, each matching a line of that class once, and rare
patterns for whatever would make a line mean more than its class (a colour code, a second message
glued on, a word one of the reference's patterns needs). ``scan_lines`` gives the same classes to the
lines that repeat a shape (templates, asked of ``scan`` one line each and compared in numpy), and
leaves the others to the reference.

A class is given only where it is certain: the line is vLLM's own strictly shaped line (or
uvicorn's access line), holds nothing else the reference would read, and the next line opens a
message of its own, so nothing continues it. Any doubt leaves the line to the reference (REFERENCE),
which is always right. Tests hold every class given to the reference's reading of the line.

Cost (``benchmarks/bench_time_to_answer.py --scanners``, on the benchmark's 1 GiB log, CPU time):
``scan`` 16 s, x45 of ``grep -c``: the binding calls Python once per match (0.2 us: 2 s for the
log's 10.8 M lines before any work) and the anchored prefix patterns run an automaton over every line.
``scan_lines`` 1.6-1.9 s, x4.2-4.9 (best of four, this 2-core machine shared while it was measured):
reading the pieces 0.25 s and finding their LFs 0.3 s (grep's own work), most of the rest comparing
rows of eight-byte words, ~100 ns a line. An allocation of a piece's size costs a page fault a 4 KiB
here (2 s a GiB), so the buffers and line arrays are kept from piece to piece.

The fast lane uses the template scanner a piece at a time (``PieceScanner``, from its worker threads):
the lines it classes are read at their template's offsets there, the rest classified as before.
"""

from __future__ import annotations

import functools
import mmap
import re
import threading
from collections.abc import Callable, Iterator, Sequence
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
        after = [(c, node(prefix + c)) for c in nexts]  # (each once: asking twice a level cost 2^depth calls)
        alts = ["$", other] + [f"{_lit(c)}{rest}" for c, rest in after if rest]
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


_THREAD = threading.local()


def _scratch(db: hyperscan.Database) -> hyperscan.Scratch:
    """This thread's scratch space for ``db`` (a scan needs one of its own: threads share the database)."""
    held = getattr(_THREAD, "scratch", None)
    if held is None or held[0] is not db:
        held = _THREAD.scratch = (db, hyperscan.Scratch(db))
    return held[1]


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


LF_STEP = 1 << 20  # bytes looked at for LFs at a time (a mark a byte for a whole piece was 16 MiB more a worker)


def _line_ends(buf: npt.NDArray[np.uint8], base: int = 0) -> Lines:
    """The offsets of the LFs in ``buf``, plus ``base``."""
    found = [np.flatnonzero(buf[i:i + LF_STEP] == 10) + (base + i) for i in range(0, len(buf), LF_STEP)]
    return np.concatenate(found).astype(np.int64, copy=False) if found else np.zeros(0, np.int64)


def _matches(db: hyperscan.Database, piece: memoryview) -> tuple[npt.NDArray[np.uint8], Lines]:
    """The id and end offset of every match in ``piece`` (a Python call each: the scan's main cost)."""
    ids: list[int] = []
    at: list[int] = []
    put_id, put_at = ids.append, at.append

    def on_match(i: int, _from: int, to: int, _flags: int, _ctx: object) -> None:
        put_id(i)
        put_at(to)
    db.scan(cast(bytes, piece), match_event_handler=on_match, scratch=_scratch(db))
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


# --- the template scanner: the same classes at a few numpy passes a piece ---------------------------------
# ``scan`` pays a Python call a match and an automaton a line: x45 of ``grep -c``. Nearly every line of a big
# log repeats one of a handful of lines byte for byte but for its time, its client's address or the hex of its
# request id. ``scan_lines`` asks the exact scanner above about one line of each such shape (a template) and
# gives its class to every line equal to it outside those places, compared eight bytes at a time in numpy; a
# line like no template is left to the reference. What varies cannot change a reading: times and addresses
# are digits where digits stood, an id's tail is hex where hex stood ('cmpl-' and what follows), and no word
# a pattern needs can be spelled in, or end in, hex digits (checked as each template is made).
TEMPLATE_MAX_BYTES = 256  # a longer line is left to the reference (the bulk of a log is shorter)
TEMPLATE_TRIES = 48  # lines asked about a piece (each costs a pass over the lines not yet placed)
STRICT_HEAD_RS = "(?-u)" + STRICT_ANY  # (what ``_HEAD_TIME`` matches, as polars' Rust patterns take it: ASCII classes)
_HEAD_TIME = re.compile((r"^(?:\(" + _PROC + r"\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (" + _TIME + ") "
                         + _CALL).encode())
_ACCESS_CLIENT = re.compile((ACCESS_HEAD + r"([0-9.:]+) - ").encode())
_HEX_TAIL = re.compile(rb"[0-9a-f.-]+$")
_HEX = frozenset(b"0123456789abcdef.-")
_SPELLED = tuple(w.lower().encode() for w in INERT_UNLESS) + (b"kv cache usage", b"#033[", b"^[")


@dataclass(frozen=True, eq=False)
class Template:
    """A line's bytes (``text``) with the places other lines may differ in: ``digits`` (any digit there)
    and ``hex`` (0-9 or a-f there: the hex of a request id's tail, its '-' and '.' kept); the lines equal
    to it elsewhere are of class ``code``."""

    code: int
    text: bytes
    digits: npt.NDArray[np.intp]
    hex: npt.NDArray[np.intp]


def _ends_in_hex(fixed: bytes) -> bool:
    """Whether a word a pattern needs could end in hex digits after ``fixed`` (or be spelled in them)."""
    low = fixed.lower()
    return any(set(w[k:]) <= _HEX and low.endswith(w[:k]) for w in _SPELLED for k in range(len(w)))


def template_of(line: bytes) -> Template | None:
    """The template of one line (without its LF), where the exact scanner gives it a class; else None."""
    if not line or len(line) > TEMPLATE_MAX_BYTES:
        return None
    code = int(scan(line).codes[0])
    digits: list[int] = []
    hexes: list[int] = []
    if code == ACCESS:
        m = _ACCESS_CLIENT.match(line)
        span = m.span(1) if m else (0, 0)
    else:
        m = _HEAD_TIME.match(line)
        span = m.span(1) if m else (0, 0)
        if code in (ADDED, FINISHED):
            tail = _HEX_TAIL.search(line, m.end() if m else 0)
            if tail is not None:
                if _ends_in_hex(line[:tail.start()]):
                    return None
                hexes = [i for i in range(*tail.span()) if line[i] not in b".-"]  # (those stay as they are)
    if code in (REFERENCE, STATS, RECEIVED) or m is None:
        return None  # (a stats or request line's numbers and prompt vary in length: no template holds them)
    digits = [i for i in range(*span) if 48 <= line[i] <= 57]
    return Template(code, line, np.asarray(digits, np.intp), np.asarray(hexes, np.intp))


_ONES = np.uint64(0x0101010101010101)
_TOPS = np.uint64(0x8080808080808080)


def _lanes(positions: npt.NDArray[np.intp], width: int, value: int) -> npt.NDArray[np.uint64]:
    """A word per 8 bytes of a row, ``value`` in the byte lanes at ``positions``, 0 elsewhere."""
    lanes = np.zeros(width, np.uint8)
    lanes[positions] = value
    return lanes.view(np.uint64)


def _not_digits(w: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Per byte lane, nonzero unless the byte is an ASCII digit (high nibble 3, low nibble at most 9)."""
    return ((w & np.uint64(0xF0F0F0F0F0F0F0F0)) ^ np.uint64(0x3030303030303030)) | (
        ((w & np.uint64(0x0F0F0F0F0F0F0F0F)) + np.uint64(0x0606060606060606)) & np.uint64(0x1010101010101010))


def _within(low7: npt.NDArray[np.uint64], lo: int, hi: int) -> npt.NDArray[np.uint64]:
    """Per lane of 7-bit bytes, the top bit set where the byte is in [lo, hi] (no carry crosses a lane)."""
    return ((low7 + _ONES * np.uint64(0x80 - lo)) & ~(low7 + _ONES * np.uint64(0x7F - hi))) & _TOPS


def _not_hex(w: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Per byte lane, the top bit set unless the byte is one of 0-9, a-f."""
    low7 = w & np.uint64(0x7F7F7F7F7F7F7F7F)
    return (~(_within(low7, 0x30, 0x39) | _within(low7, 0x61, 0x66)) | w) & _TOPS


BATCH_LINES = 8192  # lines compared at a time: their rows stay in cache through the dozen passes over them


_Check = Callable[[npt.NDArray[np.uint64]], npt.NDArray[np.uint64]]


@dataclass(frozen=True)
class _Compare:
    """A template as words: for each word of a row that holds bytes to compare, its index, what it must
    hold there (``want``, under ``mask``), and the checks of its digit and hex lanes."""

    width: int
    words: tuple[tuple[int, np.uint64, np.uint64, tuple[tuple[_Check, np.uint64], ...]], ...]

    @staticmethod
    def of(t: Template) -> _Compare:
        n = len(t.text)
        width = -(-n // 8) * 8
        text = np.zeros(width, np.uint8)
        text[:n] = np.frombuffer(t.text, np.uint8)
        mask = _lanes(np.arange(n), width, 0xFF) & ~_lanes(t.digits, width, 0xFF) & ~_lanes(t.hex, width, 0xFF)
        digits, hexes = _lanes(t.digits, width, 0xFF), _lanes(t.hex, width, 0xFF)
        want = text.view(np.uint64) & mask
        words = []
        for j in range(width // 8):
            checks = tuple((bad, lanes[j]) for bad, lanes in ((_not_digits, digits), (_not_hex, hexes)) if lanes[j])
            if mask[j] or checks:
                words.append((j, want[j], mask[j], checks))
        return _Compare(width, tuple(words))


@functools.lru_cache(maxsize=4096)
def _compare(t: Template) -> _Compare:
    return _Compare.of(t)


def _equal_to(t: Template, buf: npt.NDArray[np.uint8], starts: Lines) -> npt.NDArray[np.bool_]:
    """Which lines (their starts; each of the template's length) equal ``t`` outside its varying places,
    with digits and hex there: a batch of rows at a time, each word of them (a column) XORed with the
    template's and masked, its digit and hex lanes checked, all OR-ed into one word a row (zero: equal).
    (Column by column ran in 9 ms a 220 k rows where 2-D operations over whole rows took 12-28 ms.)"""
    c = _compare(t)
    view = np.ndarray((len(buf) - c.width + 1,), dtype=f"V{c.width}", buffer=buf, strides=(1,))
    out = np.empty(len(starts), dtype=bool)
    ones = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(0, len(starts), BATCH_LINES):
        rows = view[starts[i:i + BATCH_LINES]].view(np.uint64).reshape(-1, c.width // 8)
        off = np.zeros(len(rows), np.uint64)
        for j, want, mask, checks in c.words:
            col = rows[:, j]
            if mask == ones:
                off |= col ^ want
            elif mask:
                off |= (col & mask) ^ want
            for bad, lanes in checks:
                off |= bad(col) & lanes
        np.equal(off, 0, out=out[i:i + BATCH_LINES])
    return out


class _ByLength:
    """A piece's lines grouped by length (a radix sort of lengths that fit 16 bits, lines in file order
    within a length), the lines of a length not yet placed, and how many are left of each length."""

    def __init__(self, lens: Lines) -> None:
        short = np.where((lens > 0) & (lens <= TEMPLATE_MAX_BYTES), lens, 0).astype(np.uint16)
        self.order = np.argsort(short, kind="stable")
        self.count = np.bincount(short, minlength=TEMPLATE_MAX_BYTES + 1)
        self.bounds = np.concatenate(([0], np.cumsum(self.count)))
        self.count[0] = 0  # (empty and long lines: never a template's)
        self.taken = np.zeros(len(lens), dtype=bool)

    def left(self, length: int) -> Lines:
        same = self.order[self.bounds[length]:self.bounds[length + 1]]
        return same[~self.taken[same]]

    def drop(self, length: int, gone: Lines) -> None:
        self.taken[gone] = True
        self.count[length] -= len(gone)


def _place(buf: npt.NDArray[np.uint8], starts: Lines, lens: Lines, codes: npt.NDArray[np.uint8],
           known: list[Template], which: npt.NDArray[np.int32] | None = None, min_lines: int = 1,
           order: Sequence[int] | None = None) -> None:
    """Give each line of a piece the class of the template it equals (``codes``, REFERENCE elsewhere):
    first the templates of pieces before (a log's shapes repeat; in the order ``order`` gives their indices,
    else as known), then ones taken from lines of the commonest length left (added to ``known``); a length
    whose lines gave no template three times is given up (its lines are left to the reference); no template
    is looked for among fewer than ``min_lines`` lines of a length. With ``which``, each placed line's
    template (its index in ``known``)."""
    by = _ByLength(lens)

    def take(t: Template, same: Lines, k: int) -> Lines:
        hit = same[_equal_to(t, buf, starts[same])] if len(same) else same
        codes[hit] = t.code
        if which is not None:
            which[hit] = k
        return hit
    for k in range(len(known)) if order is None else order:
        was = known[k]
        n = len(was.text)
        if by.count[n]:
            by.drop(n, take(was, by.left(n), k))
    failed: dict[int, int] = {}
    for _ in range(TEMPLATE_TRIES):
        length = int(by.count.argmax())
        if by.count[length] < max(1, min_lines):
            return
        same = by.left(length)
        first = int(same[0])
        t = template_of(buf[starts[first]:starts[first] + length].tobytes())
        if t is None:
            failed[length] = failed.get(length, 0) + 1
            by.drop(length, same if failed[length] >= 3 else same[:1])
        else:
            known.append(t)
            hit = take(t, same, len(known) - 1)
            by.drop(length, hit if first in hit[:1] else np.append(hit, first))


def scan_lines(data: bytes | mmap.mmap, piece_bytes: int = PIECE_BYTES) -> LineClasses:
    """``scan``'s classes by templates (a class given only where ``scan`` gives the same line that class;
    more lines may be left to the reference): each piece copied once into a padded buffer, its line ends
    found, each template compared to the lines of its length; then the next-line rule and the incident
    lines as ``scan`` finds them, among the lines left to the reference (a line of a class holds none)."""
    view = memoryview(data)
    if not len(view):
        return LineClasses(np.zeros(0, np.uint8), np.zeros(0, np.int64))
    pieces = _Pieces(min(len(view), piece_bytes))
    for start, end in _pieces(view, piece_bytes):
        n = end - start
        pieces.room(n)[:n] = np.frombuffer(view[start:end], np.uint8)
        pieces.add(n)
    raw = view.obj if isinstance(view.obj, (bytes, mmap.mmap)) else view.tobytes()
    return pieces.done(raw)


class _Pieces:
    """The classes and line ends of a log's pieces, each classified in one reused buffer (allocating a
    buffer a piece cost as much as classifying it: the kernel zeroes every page on first touch)."""

    def __init__(self, piece_bytes: int) -> None:
        self.pad = TEMPLATE_MAX_BYTES + 8
        self.buf = np.zeros(piece_bytes + self.pad + min(piece_bytes, 1 << 20), np.uint8)  # (and a part line)
        self.lf = np.zeros(len(self.buf), dtype=bool)
        self.starts = np.zeros(0, np.int64)  # (kept from piece to piece, as the buffer is)
        self.codes: list[npt.NDArray[np.uint8]] = []
        self.ends: list[Lines] = []  # each piece's line ends (its LFs, and its end where no LF ends it)
        self.at = [0]  # each piece's offset, and the end of the last
        self.known: list[Template] = []

    def room(self, n: int) -> npt.NDArray[np.uint8]:
        """The buffer, with room for a piece of ``n`` bytes and its padding."""
        if n + self.pad > len(self.buf):  # (a line longer than a piece; or a piece and the part line before it)
            self.buf = np.concatenate((self.buf, np.zeros(n + self.pad + (n >> 1) - len(self.buf), np.uint8)))
            self.lf = np.zeros(len(self.buf), dtype=bool)
        return self.buf

    def add(self, n: int) -> None:
        """Classify the piece of ``n`` bytes at the buffer's start (it ends at a line end or the log's)."""
        self.buf[n:n + self.pad] = 0
        ends = np.flatnonzero(np.equal(self.buf[:n], 10, out=self.lf[:n]))
        if not len(ends) or ends[-1] != n - 1:
            ends = np.append(ends, n)
        if len(self.starts) < 2 * len(ends):
            self.starts = np.zeros(2 * len(ends) + 1024, np.int64)
        starts, lens = self.starts[:len(ends)], self.starts[len(ends):2 * len(ends)]
        starts[0] = 0
        np.add(ends[:-1], 1, out=starts[1:])
        np.subtract(ends, starts, out=lens)
        codes = np.zeros(len(ends), np.uint8)
        _place(self.buf, starts, lens, codes, self.known)
        self.codes.append(codes)
        self.ends.append(ends)
        self.at.append(self.at[-1] + n)

    def done(self, raw: bytes | mmap.mmap) -> LineClasses:
        """Every line's class, the next-line rule applied and the incident lines found (in ``raw``, the
        log's bytes, a line or a run of lines at a time)."""
        first = np.cumsum([0] + [len(e) for e in self.ends])

        def bounds(k: int) -> tuple[int, int]:
            p = int(np.searchsorted(first, k, side="right")) - 1
            ends, i = self.ends[p], k - int(first[p])
            return self.at[p] + (int(ends[i - 1]) + 1 if i else 0), self.at[p] + int(ends[i])
        return _next_opens(np.concatenate(self.codes), raw, bounds)


def _after_last_lf(data: npt.NDArray[np.uint8]) -> int:
    """The offset after the last LF in ``data`` (0: none), looked for from the end."""
    back = 1 << 16
    while True:
        lfs = np.flatnonzero(data[max(0, len(data) - back):] == 10)
        if len(lfs):
            return max(0, len(data) - back) + int(lfs[-1]) + 1
        if back >= len(data):
            return 0
        back *= 4


FILE_PIECE_BYTES = 32 << 20  # a file's piece, held with its LF marks (32 MiB: as fast as 16 or 64 MiB)


def scan_lines_file(path: Path, piece_bytes: int = FILE_PIECE_BYTES) -> LineClasses:
    """``scan_lines`` of a plain log file, read a piece at a time into the buffer it is classified in (as
    ``grep`` reads: no page of a mapping faulted in), mapped only to read the lines the reference is asked
    about."""
    size = path.stat().st_size
    if size == 0:
        return scan_lines(b"")
    pieces = _Pieces(min(size, piece_bytes))
    carry = np.zeros(0, np.uint8)
    with path.open("rb", buffering=0) as fh:
        while True:
            buf = pieces.room(len(carry) + piece_bytes)
            buf[:len(carry)] = carry
            got = fh.readinto(memoryview(buf)[len(carry):len(carry) + piece_bytes])  # type: ignore[arg-type]
            n = len(carry) + (got or 0)
            if not n:
                break
            cut = _after_last_lf(buf[:n]) if got else n
            if cut == 0:  # (no line ends in it: a line longer than a piece, read on)
                carry = buf[:n].copy()
                continue
            carry = buf[cut:n].copy()
            pieces.add(cut)
            if not got:
                break
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return pieces.done(mm)


def _next_opens(codes: npt.NDArray[np.uint8], raw: bytes | mmap.mmap,
                bounds: Callable[[int], tuple[int, int]]) -> LineClasses:
    """A class holds where the next line opens a message of its own (a line of a class does; the
    reference is asked of the rest); the incident lines, among those left to the reference (``bounds``:
    a line's first and end offsets in ``raw``)."""
    _next_line_rule(codes, raw, bounds)
    left = np.flatnonzero(codes == REFERENCE)
    incident = np.zeros(0, np.int64)
    if len(left):  # (a run of them read as one slice: a line at a time cost 0.2 s a GiB)
        runs = np.split(left, np.flatnonzero(np.diff(left) != 1) + 1)
        found = scan(b"\n".join(raw[bounds(int(r[0]))[0]:bounds(int(r[-1]))[1]] for r in runs)).incident
        incident = left[found].astype(np.int64)
    return LineClasses(codes, incident)


Heads = Callable[[Lines], npt.NDArray[np.bool_]]  # which of a piece's lines (by index) open with ``_HEAD_TIME``


def _next_line_rule(codes: npt.NDArray[np.uint8], raw: bytes | mmap.mmap,
                    bounds: Callable[[int], tuple[int, int]], heads: Heads | None = None) -> None:
    """Leave to the reference (in ``codes``) each line of a class whose next line does not open a message.
    With ``heads``, the lines it finds opening with vLLM's strict head are known to open one at once (a log
    at DEBUG put a million lines a GiB to the test below, one by one: 2.6 s of its 14 CPU-s)."""
    n_lines = len(codes)
    opens = np.append(codes != REFERENCE, True)
    asked = np.flatnonzero((codes[:-1] != REFERENCE) & ~opens[1:n_lines]) + 1
    opens[asked] = True
    if heads is not None and len(asked):
        asked = asked[~heads(asked)]
    for k in asked.tolist():
        line = raw[slice(*bounds(k))]
        if _HEAD_TIME.match(line):  # (vLLM's strict head opens a message, as ``scan``'s inert pattern says)
            continue
        text = line.decode("utf-8", errors="replace")  # (else the reference is asked)
        opens[k] = bool(text.strip()) and split_line(0, text)[0].prefixed
    codes[~opens[1:]] = REFERENCE


# --- the template scanner a piece at a time, for the fast lane ---------------------------------------------
KNOWN_MAX = 256  # templates kept from piece to piece (each costs a comparison of its length's lines a piece)
PIECE_MIN_LINES = 1024  # the fewest lines of a length a template is looked for among: asking ``scan`` about one
# line costs ~1 ms, what ~1,000 lines cost the fast lane's classification


@dataclass(frozen=True)
class PieceClasses:
    """Each line's class in one piece of a log, and the template each classed line equals (its index in
    ``templates``; -1 for a line left to the reference). The piece's last line is the reference's: the
    next piece may continue it."""

    codes: npt.NDArray[np.uint8]
    which: npt.NDArray[np.int32]
    templates: tuple[Template, ...]


class PieceScanner:
    """``scan_lines`` over a log's pieces as they come (from worker threads, in any order): the templates
    found are kept for the pieces after, and no incident lines are looked for. A piece is compared where
    it lies (a copy with room past its end cost a page fault every 4 KiB, or a buffer kept a worker:
    20 MiB each); a line whose last word would be read past the piece's end is left to the reference."""

    def __init__(self) -> None:
        self.known: list[Template] = []
        self.lines: list[int] = []  # how many lines each of ``known`` has placed
        self._lock = threading.Lock()

    def classify(self, piece: bytes, line_ends: Lines | None = None, heads: Heads | None = None) -> PieceClasses:
        """The classes of ``piece``'s lines (cut at LF, as ``vllm_log.physical_lines`` cuts them); ``line_ends``,
        where the caller knows them: each line's LF, or the piece's end for a last line without one; ``heads``,
        where the caller can tell at once which lines open with vLLM's strict head (``_next_line_rule``)."""
        n = len(piece)
        buf = np.frombuffer(piece, np.uint8)
        ends = _line_ends(buf) if line_ends is None else line_ends
        if not len(ends) or ends[-1] not in (n - 1, n):
            ends = np.append(ends, n)
        starts = np.zeros(len(ends), np.int64)
        starts[1:] = ends[:-1] + 1
        lens = (ends - starts).astype(np.int64)
        lens[starts + (lens + 7) // 8 * 8 > n] = 0  # (its words would run past the piece: never a template's)
        codes = np.zeros(len(ends), np.uint8)
        which = np.full(len(ends), -1, np.int32)
        with self._lock:
            known, lines = list(self.known), list(self.lines)
        had = len(known)
        _place(buf, starts, lens, codes, known, which, PIECE_MIN_LINES,
               sorted(range(had), key=lambda k: -lines[k]))
        self._placed(known, had, np.bincount(which[which >= 0], minlength=len(known)))
        codes[-1] = REFERENCE
        _next_line_rule(codes, piece, lambda k: (int(starts[k]), int(ends[k])), heads)
        which[codes == REFERENCE] = -1
        return PieceClasses(codes, which, tuple(known))

    def _placed(self, known: list[Template], had: int, lines: npt.NDArray[np.intp]) -> None:
        """Keep the templates a piece found beyond the ``had`` it was given, and count the lines each placed:
        the pieces after try the templates that placed the most first. (A length's lines are compared to
        each of its templates in turn, all that are left at each: a generated day's log has two templates
        of each of two lengths, one of which placed 3 of 55k lines a piece, and tried first it cost two
        comparisons of every line in five. Its first 30 pieces, classified in 0.66-0.69 CPU-s, took
        0.50-0.52 tried by lines placed; a log of several versions' lines, 0.72-0.80 against 0.78-0.82.)"""
        with self._lock:
            self.known.extend(known[had:][:max(0, KNOWN_MAX - len(self.known))])
            self.lines += [0] * (len(self.known) - len(self.lines))
            at = {id(t): i for i, t in enumerate(self.known)}  # (other pieces may have added theirs first)
            for k in np.flatnonzero(lines):
                i = at.get(id(known[k]))
                if i is not None:
                    self.lines[i] += int(lines[k])
