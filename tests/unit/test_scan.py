"""The log scanner's classes against the line-by-line parser's reading of the same lines.

Every line the scanner gives a class is read by the reference (``vllm_log.split_line`` and
``extract``, then ``LogParser`` over the whole log) as that class says: one stats fact, one request
fact of that kind, or none (an access line, a line that says nothing); and the next line opens a
message of its own. Lines it leaves to the reference are allowed; on the logs of the benchmark's
generator they must be few."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.record import scan
from replay.record.scan import FACT_KIND, INCIDENT_KINDS, REFERENCE
from replay.record.vllm_log import UVICORN, LogParser, extract, physical_lines, split_line

DATA = Path(__file__).resolve().parents[1] / "data"
REAL_LOGS = sorted(DATA.glob("*.log"))


def _kinds(raw: str) -> list[str]:
    """The reference's facts of one line read alone."""
    return [k for part in split_line(1, raw) for k, _ in extract(part.text)]


def check_against_reference(text: str, scanner: Callable[[bytes], scan.LineClasses] = scan.scan) -> scan.LineClasses:
    """Scan ``text`` and hold every class it gives to the reference's reading; returns the classes. The
    template scanner is held to the same reading and gives a line no class ``scan`` does not give it."""
    data = text.encode()
    got = scanner(data)
    if scanner is scan.scan:
        fast = check_against_reference(text, scan.scan_lines)
        assert ((fast.codes == REFERENCE) | (fast.codes == got.codes)).all()
    lines = physical_lines(text) if text else []  # (an empty log has no line)
    assert len(got.codes) == len(lines)
    parser = LogParser(defer_repeats=True)
    for no, raw in enumerate(lines, start=1):
        parser.feed(no, raw)
    facts: dict[int, list[str]] = {}
    for f in parser.finish().facts:
        facts.setdefault(f.line, []).append(f.kind)
    for i, raw in enumerate(lines):
        code = int(got.codes[i])
        if code == REFERENCE:
            continue
        parts = split_line(i + 1, raw)
        want = [FACT_KIND[code]] if code in FACT_KIND else []
        assert len(parts) == 1 and parts[0].prefixed, (scan.CLASS_NAMES[code], raw)
        assert _kinds(raw) == want, (scan.CLASS_NAMES[code], raw)
        assert facts.get(i + 1, []) == want, (scan.CLASS_NAMES[code], raw)
        if code == scan.ACCESS:
            assert UVICORN.match(parts[0].text), raw
        if i + 1 < len(lines):
            nxt = split_line(i + 2, lines[i + 1])
            assert lines[i + 1].strip() and nxt[0].prefixed, (scan.CLASS_NAMES[code], raw, lines[i + 1])
    flagged = set(got.incident.tolist())
    for i, raw in enumerate(lines):  # (a line the reference reads through an envelope or escapes may hide its words)
        if INCIDENT_KINDS & set(_kinds(raw)) and all(p.text in raw for p in split_line(i + 1, raw)):
            assert i in flagged, raw
    return got


@pytest.mark.parametrize("path", REAL_LOGS, ids=[p.name for p in REAL_LOGS])
def test_real_logs_classes_are_the_references(path: Path) -> None:
    check_against_reference(path.read_bytes().decode("utf-8", errors="replace"))


def test_real_logs_give_every_class() -> None:
    """The real logs hold lines of every class they have ('Finished request' lines none) and incident
    lines, and not every line is left to the reference (a scanner that classified nothing would pass
    the test above)."""
    total: dict[str, int] = {}
    incidents = 0
    for path in REAL_LOGS:
        got = scan.scan(path.read_bytes())
        incidents += len(got.incident)
        for name, n in got.counts().items():
            total[name] = total.get(name, 0) + n
    assert all(total[name] > 0 for name in ("inert", "access", "stats", "added", "received")), total
    assert total["inert"] + total["access"] > 200 and incidents >= 30


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_benchmark_log_is_nearly_all_classified() -> None:
    """An engine's lifetime as the benchmark builds it (real startup lines, requests, stats, preemption
    warnings, an OOM with its traceback): the scanner gives a class to all but a handful of lines, and
    every one is the reference's; the OOM is an incident line."""
    from bench_record import lifetime
    text = lifetime(0, requests=4000) + lifetime(1, requests=600, v0=True)
    got = check_against_reference(text)
    counts = got.counts()
    assert counts["reference"] < 0.01 * len(got.codes), counts
    assert counts["added"] == counts["finished"] == 4600 and counts["received"] == 600 and counts["stats"] >= 4
    oom = [i for i, ln in enumerate(physical_lines(text)) if "CUDA out of memory" in ln]
    assert oom and set(oom) <= set(got.incident.tolist())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fast_lanes_messy_log_classes_are_the_references(seed: int, tmp_path: Path) -> None:
    """The fast lane's own differential log (every shape it knows: envelopes, colour codes, glued and
    wrapped lines, CRs, Docker's JSON, repeats, pieces of the real logs), scanned: every class given
    is the reference's, and the scanner still classifies a good share of it."""
    from tests.unit.test_fastlog import _messy_log, _real_logs
    real = [p.read_bytes().decode(errors="replace").split("\n") for p in _real_logs()]
    log = tmp_path / "messy.log"
    _messy_log(log, seed, real)
    counts = check_against_reference(log.read_bytes().decode("utf-8", errors="replace")).counts()
    assert counts["stats"] > 300 and counts["added"] > 100 and counts["received"] > 50 and counts["inert"] > 200


_LEVELS = ["INFO", "DEBUG", "WARNING", "ERROR"]
_PROCS = ["", "(APIServer pid=3646) ", "(EngineCore_DP0 pid=7) ", "(VllmWorker rank=1 pid=9) "]
_MESSAGES = [
    "Added request cmpl-{n}-0.", "Finished request cmpl-{n}-0.", "Added request cmpl {n}.", "Added request x.   ",
    "Aborted request cmpl-{n}.", "Received request cmpl-{n}: prompt: 'hi', params: SamplingParams(n=1, max_tokens=5), "
    "prompt_token_ids: [1, 2, 3], lora_request: None.", "Received request c-{n}: prompt: 'GPU KV cache usage: 5.0%'",
    "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: {n} reqs, "
    "Waiting: 0 reqs, GPU KV cache usage: 1.5%, Prefix cache hit rate: 0.0%",
    "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, "
    "Pending: 0 reqs, GPU KV cache usage: 0.5%, CPU KV cache usage: 0.0%.",
    "Started server process [1]", "Waiting for output from MQLLMEngine.", "Request c-{n} details: prompt: 'x'",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.", "Available KV cache memory: 6.5 GiB",
    "EngineDeadError: EngineCore encountered an issue.", "vLLM API server version 0.8.1", "Shutting down",
    "Added request EngineDeadError.", "note: Added request c-{n}.", "x] Finished request c-{n}", "hipErrorOutOfMemory",
    "Added requests: {n}", "", "Loading model weights took 1.5 GB", "[repeated 3x across cluster]",
    "Engine\x1b[0mDeadError: x", "Added\u00a0request cmpl-{n}.", "Started \x1b[1mserver\x1b[0m",
    "Added request cmpl-{n}ab-0.", "Finished request cmpl-fe{n}-0.", "Added request cmpl-dead{n}.", "Added request cmpl-{n}.py:",
    "Added request chatcmpl-{n}-memory.", "Finished request cmpl-{n}took.", "Added request cmpl-{n}BLOCKS.", "Added request cmpl-{n}\u00e9.",
]
_HEADS = [f"{p}{lv} 05-19 10:13:0{{s}} {site}" for p in _PROCS for lv in _LEVELS
          for site in ("[async_llm.py:587] ", "metrics.py:351] ")]
_OTHER = ['INFO:     127.0.0.1:4{n} - "POST /v1/completions HTTP/1.1" 200 OK',
          '(APIServer pid=1) INFO:     10.0.0.2:5{n} - "GET /metrics HTTP/1.1" 200 OK',
          'INFO:     127.0.0.1:1 - "GET /v1/memory HTTP/1.1" 500 Out of memory',
          "Traceback (most recent call last):", '  File "x.py", line 1, in f', "", "\x1b[32mINFO\x1b[0m 05-19 10:13:00 x",
          "INFO 05-19 10:13:00 [core.py:1] Added request a.INFO 05-19 10:13:01 [core.py:1] Finished request a.",
          "2026-05-19T10:13:00.5Z INFO 05-19 10:13:00 [core.py:1] Finished request z.", "\u00a0INFO 05-19 10:13:00 x",
          "INFO 05-19 10:13:00 [core.py:1] Added request caf\u00e9.", "INFO 05-19 10:13:00 [core.py:1] Added request a\r"]


@st.composite
def _line(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 99))
    if draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from(_OTHER)).format(n=n)
    head = draw(st.sampled_from(_HEADS)).format(s=n % 10)
    msg = draw(st.sampled_from(_MESSAGES)).format(n=n)
    tail = draw(st.sampled_from(["", "", "", " INFO 05-19 10:13:09 [x.py:2] more", " memory", "\t",
                                 "INFO 05-19 10:13:09 [x.py:2] Added request b."]))  # (a second message glued on)
    return head + msg + tail


@settings(max_examples=150, deadline=None)
@given(st.lists(_line(), min_size=1, max_size=25), st.booleans())
def test_generated_lines_classes_are_the_references(lines: list[str], final_lf: bool) -> None:
    """Lines of every shape the classes know, and of the shapes that look like them but are not (an id
    with a space, a message glued on, a word a fact needs, colour codes, an envelope, a traceback
    after a line), in any order: every class given is the reference's."""
    check_against_reference("\n".join(lines) + ("\n" if final_lf else ""))


_STATS_LINE = ("(APIServer pid=3646) INFO 05-19 10:13:01 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
               "Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%, "
               "Prefix cache hit rate: 0.0%")
_TRICKY = [
    _STATS_LINE + "INFO 05-19 10:13:09 [x.py:2] Added request b.",  # (a second message glued on: two facts)
    "INFO 05-19 10:13:00 [core.py:1] Engine\x1b[0mDeadError: x",  # (a colour code inside a word a fact needs)
    "INFO 05-19 10:13:00 [core.py:1] Added\u00a0request cmpl-1.",  # (a no-break space the reference turns back)
    "INFO 05-19 10:13:00 [core.py:1] Received request c-1: prompt: '" + _STATS_LINE + "'",  # (read as stats)
    "INFO 05-19 10:13:00 [core.py:1] Started. Aborted request c-1.", "INFO 05-19 10:13:00 [core.py:1] Aborted request c-1.",
    "INFO 05-19 10:13:00 [core.py:1] x Request c-1 details: prompt: 'x'", "INFO 05-19 10:13:00 [core.py:1] Added request c\u2003d.",
    '(APIServer pid=1) INFO:     10.0.0.2:5 - "GET /EngineDeadError HTTP/1.1" 200 OK',
    "INFO 05-19 10:13:00 [core.py:1] Added request Triedtoallocate2.00GiB.GPU0hasatotalcapacityof23.69GiBofwhich1.0GiBisfree.",
    # (a stats line inside a prompt, its engine named in a letter that is a word character only to Python)
    "INFO 05-19 10:13:00 [core.py:1] Received request c-1: prompt: 'Running: 1 reqs, Waiting: 0 reqs, \u00e9 KV cache usage: 5%'",
    '(APIServer pid=1) INFO:     10.0.0.2:5 - "GET /x HTTP/1.1" 200 OK CUDA graph memory profiling is enabled',
]


@pytest.mark.parametrize("line", _TRICKY)
def test_lines_that_look_like_a_class_but_read_otherwise(line: str) -> None:
    """Each line between plain ones: a class is given only as the reference reads the line."""
    plain = "INFO 05-19 10:13:00 [core.py:1] Started server process [1]"
    check_against_reference("\n".join([plain, line, plain, line]) + "\n")


@settings(max_examples=60, deadline=None)
@given(st.lists(_line(), min_size=1, max_size=40), st.integers(1, 300))
def test_pieces_change_nothing(lines: list[str], piece: int) -> None:
    """A log scanned in pieces (each cut at a line end) gets the classes it gets whole."""
    data = ("\n".join(lines) + "\n").encode()
    whole, cut = scan.scan(data), scan.scan(data, piece_bytes=piece)
    assert whole.codes.tolist() == cut.codes.tolist() and whole.incident.tolist() == cut.incident.tolist()


def test_not_starting_with_leaves_exactly_the_words() -> None:
    import re
    rx = re.compile("^" + scan.not_starting_with(("Added request ", "Aborted request")), re.M)
    for text, free in (("Added request x", False), ("Added requests", True), ("Added", True), ("", True),
                       ("Aborted request", False), ("Aborted requests", False), ("Abc", True), ("Finished", True)):
        assert bool(rx.match(text)) is free, text


def test_an_empty_log_and_a_file(tmp_path: Path) -> None:
    assert len(scan.scan(b"").codes) == 0
    f = tmp_path / "x.log"
    f.write_bytes(b"INFO 05-19 10:13:00 [core.py:1] Added request a.\nINFO 05-19 10:13:00 [core.py:1] hello")
    assert scan.scan_file(f).codes.tolist() == [scan.ADDED, scan.INERT]
    (tmp_path / "e.log").write_bytes(b"")
    assert len(scan.scan_file(tmp_path / "e.log").codes) == 0


def test_the_template_scanner_classifies_the_benchmark_log_as_scan_does() -> None:
    """On an engine's lifetime as the benchmark builds it, the template scanner gives the request and
    access lines (nearly every line) the classes ``scan`` gives them, and finds the same incident lines."""
    from bench_record import lifetime
    text = lifetime(0, requests=3000) + lifetime(1, requests=400)
    exact, fast = scan.scan(text.encode()), check_against_reference(text, scan.scan_lines)
    counts = fast.counts()
    assert counts["added"] == counts["finished"] == 3400 and counts["access"] >= 3400
    assert counts["reference"] < 0.02 * len(fast.codes), counts
    assert fast.incident.tolist() == exact.incident.tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(_line(), min_size=1, max_size=40), st.integers(1, 400))
def test_the_template_scanner_in_pieces_and_from_a_file(lines: list[str], piece: int) -> None:
    """A log scanned in pieces, or read from a file a piece at a time, gets the classes it gets whole."""
    import tempfile
    data = ("\n".join(lines) + "\n").encode()
    whole = scan.scan_lines(data)
    cut = scan.scan_lines(data, piece_bytes=piece)
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "x.log"
        f.write_bytes(data)
        read = scan.scan_lines_file(f, piece_bytes=piece)
    for other in (cut, read):
        assert other.codes.tolist() == whole.codes.tolist() and other.incident.tolist() == whole.incident.tolist()


def test_the_template_scanner_on_an_empty_log_a_long_line_and_no_final_lf(tmp_path: Path) -> None:
    assert len(scan.scan_lines(b"").codes) == 0
    head = b"INFO 05-19 10:13:00 [core.py:1] "
    data = head + b"Added request a.\n" + head + b"x" * 70_000 + b"\n" + head + b"Added request b."
    f = tmp_path / "x.log"
    f.write_bytes(data)
    assert scan.scan_lines_file(f, piece_bytes=4096).codes.tolist() == scan.scan_lines(data).codes.tolist()
    (tmp_path / "e.log").write_bytes(b"")
    assert len(scan.scan_lines_file(tmp_path / "e.log").codes) == 0


def test_a_template_is_refused_where_a_word_could_end_in_its_hex() -> None:
    """'Added request cmpl-dea' could go on 'd' in another line: a word ending in hex after the fixed
    part ('...dea' + 'd') would change the reading, so no template is made of it."""
    assert scan._ends_in_hex(b"INFO 05-19 10:13:00 [core.py:1] Added request blo") is False
    assert scan._ends_in_hex(b"INFO 05-19 10:13:00 [core.py:1] Added request enginedea") is True
    t = scan.template_of(b"INFO 05-19 10:13:00 [core.py:1] Added request cmpl-0f3a-0.")
    assert t is not None and t.code == scan.ADDED and len(t.digits) == 10 and len(t.hex) == len("0f3a0")


def test_the_lane_checks_tell_every_byte_as_a_byte_test_does() -> None:
    """The eight-bytes-at-once digit and hex checks flag exactly the bytes a byte-by-byte test flags."""
    import numpy as np
    every = np.arange(256, dtype=np.uint8)
    not_digit = scan._not_digits(every.view(np.uint64)).view(np.uint8) != 0
    not_hex = scan._not_hex(every.view(np.uint64)).view(np.uint8) != 0
    assert (not_digit == ~np.isin(every, list(b"0123456789"))).all()
    assert (not_hex == ~np.isin(every, list(b"0123456789abcdef"))).all()


@settings(max_examples=80, deadline=None)
@given(st.lists(_line(), min_size=1, max_size=30), st.integers(0, 2**32))
def test_the_strict_heads_told_at_once_change_no_class(others: list[str], seed: int) -> None:
    """GIVEN a piece of lines that take templates, each followed by lines of any shape (vLLM's strict head at
    DEBUG, a head it lacks, an envelope, a traceback, an empty line, another script's digits in its time)
    WHEN the lines that open with vLLM's strict head are told at once, by polars over the piece's lines
    (``fastlog._strict_heads``), rather than one by one THEN every line's class is the same, and the lines
    told at once are those ``_HEAD_TIME`` matches."""
    import random

    from replay.record import fastlog
    rng = random.Random(seed)
    extra = ["(VllmWorker rank=1 pid=241) DEBUG 05-01 00:00:06 [parallel_state.py:867] world_size=8 rank=1",
             "DEBUG 05-01 00:00:06 client.py:191] Waiting for output from MQLLMEngine.", "",
             "INFO 05-\u0661\u0662 00:00:06 [x.py:1] a time in other digits", "  File \"x.py\", line 1, in <module>"]
    lines: list[str] = []
    for i in range(40):
        lines.append(f"(APIServer pid=3646) INFO 05-01 00:00:{i % 60:02d} [async_llm.py:587] Added request cmpl-{i:04x}-0.")
        lines += rng.sample(others + extra, k=rng.randint(0, 3))
    piece = ("\n".join(lines) + "\n").encode()
    split = fastlog._lf_lines(piece)
    if split is None:  # (a generated line with a CR: the lane cuts such a piece otherwise, with no heads told)
        return
    asked: list[int] = []

    def heads(at: scan.Lines) -> scan.npt.NDArray[scan.np.bool_]:
        asked.extend(at.tolist())
        return fastlog._strict_heads(split, at)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scan, "PIECE_MIN_LINES", 8)
        ends = fastlog._line_ends(split)
        told, alone = (scan.PieceScanner().classify(piece, ends, h) for h in (heads, None))
    assert (told.codes == alone.codes).all() and (told.which == alone.which).all()
    assert (told.codes != REFERENCE).sum() >= 20 and asked
    raw = piece.split(b"\n")
    assert fastlog._strict_heads(split, scan.np.asarray(asked, dtype=scan.np.int64)).tolist() == [
        bool(scan._HEAD_TIME.match(raw[k])) for k in asked]


def test_the_piece_scanner_tries_first_the_templates_that_placed_the_most_lines() -> None:
    """GIVEN a log whose first piece opens with one line of a shape (a request added) followed by many lines of
    another shape of the same length (a request finished), so that the rare shape's template is found first
    WHEN the next piece, of the common shape's lines and a few of the rare one's, is classified THEN its lines
    are compared to the common shape's template first, and the rare one's is given only the lines that are
    left; and every line's class is what trying the templates in the order they were found gives."""
    def added(i: int) -> str:
        return f"INFO 05-01 00:00:{i % 60:02d} [async_llm.py:587] Added request cmpl-{i:07x}-0."

    def finished(i: int) -> str:
        return f"INFO 05-01 00:00:{i % 60:02d} [async_llm.py:587] Finished request cmpl-{i:04x}-0."
    assert len(added(1)) == len(finished(1))
    first = [added(0)] + [finished(i) for i in range(1, 60)]
    second = [finished(i) if i % 20 else added(i) for i in range(100, 200)]
    pieces = [("\n".join(lines) + "\n").encode() for lines in (first, second)]
    calls: list[tuple[bytes, int]] = []
    equal_to = scan._equal_to

    def noted(t: scan.Template, buf: scan.npt.NDArray[scan.np.uint8], starts: scan.Lines) -> scan.npt.NDArray[scan.np.bool_]:
        calls.append((t.text, len(starts)))
        return equal_to(t, buf, starts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scan, "PIECE_MIN_LINES", 8)
        scanner = scan.PieceScanner()
        scanner.classify(pieces[0])
        assert [t.text for t in scanner.known] == [added(0).encode(), finished(1).encode()]
        assert scanner.lines == [1, 58]  # (a piece's last line is left to the reference: see below)
        mp.setattr(scan, "_equal_to", noted)
        got = scanner.classify(pieces[1])
        mp.setattr(scan, "_equal_to", equal_to)
        in_order = scan.PieceScanner()
        in_order.known, in_order.lines = list(scanner.known), [0, 0]  # (no line placed: tried as found)
        want = in_order.classify(pieces[1])
    # (the piece's last line is left out: its last word would be read past the piece's end)
    assert calls == [(finished(1).encode(), 99), (added(0).encode(), 5)]
    assert (got.codes == want.codes).all() and (got.which == want.which).all()
    assert (got.codes != REFERENCE).sum() == 99
    assert scanner.lines == [1 + 5, 58 + 94]
