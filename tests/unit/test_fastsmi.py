"""The vectorised lane for nvidia-smi's CSV logs reads exactly what the row-by-row reference reads: on
the real H200 capture, on a day of polling built from its row with damage of every kind, and on
generated logs, whatever the piece size; files of other shapes go to the reference; and the recorder
writes the same bundle by either route."""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.bundle import SAMPLES_SCHEMA, read_bundle
from replay.record import common, fastsmi, nvidia_smi, recorder
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA
from tests.unit.timecol_helpers import relative_h200

H200 = DATA / "h200_query_gpu_load.csv"
MiB = 1 << 20


@contextmanager
def pieces_of(chars: int) -> Iterator[None]:
    """The lane reads pieces of ``chars`` characters (small ones, to cross many piece boundaries)."""
    was = fastsmi.PIECE_CHARS
    fastsmi.PIECE_CHARS = chars
    try:
        yield
    finally:
        fastsmi.PIECE_CHARS = was


def both(text: str, tz_offset_s: int = 0, columns: str | None = None, at: str | None = None) -> common.Parsed | None:
    """The lane's reading of ``text``, checked equal to the reference's in every part; None where the
    lane declined the file."""
    path = Path("smi.csv")
    ref = nvidia_smi.parse_nvidia_smi_csv(path, text, tz_offset_s, columns, at)
    lane = fastsmi._vectorised(path, text, tz_offset_s, columns, at)
    with tempfile.TemporaryDirectory() as spill:
        spilled = fastsmi._vectorised(path, text, tz_offset_s, columns, at, Path(spill) / "smi")
        assert (spilled is None) == (lane is None)
        if lane is None:
            assert not (Path(spill) / "smi").exists() or not any((Path(spill) / "smi").iterdir())  # (what it left, taken back)
            return None
        assert spilled is not None
        on_disk = spilled.on_disk.collect() if spilled.on_disk is not None else pl.DataFrame(schema=SAMPLES_SCHEMA)
        assert pl.concat([on_disk, spilled.frame()]).rows() == lane.frame().rows()
    got, want = lane.frame(), ref.frame()
    assert got.schema == want.schema and got.rows() == want.rows()
    for k in ("kind", "lines", "parsed", "quarantine", "notes", "gpus", "naive_local_times", "events"):
        assert getattr(lane, k) == getattr(ref, k) == getattr(spilled, k), k
    assert (lane.unplaced is None) == (ref.unplaced is None)
    if lane.unplaced is not None and ref.unplaced is not None:
        assert (lane.unplaced.column, lane.unplaced.form) == (ref.unplaced.column, ref.unplaced.form)
        assert lane.unplaced.frame.schema == ref.unplaced.frame.schema
        assert lane.unplaced.frame.rows() == ref.unplaced.frame.rows()
    return lane


def h200() -> tuple[list[str], list[str]]:
    """The real capture's header cells and its row's cells (200 fields: every --query-gpu field)."""
    header, row = list(csv.reader(H200.read_text().splitlines(), skipinitialspace=True))
    assert len(header) == len(row) > 190
    return header, row


def test_the_real_h200_capture_takes_the_lane_and_reads_as_the_reference() -> None:
    """GIVEN the real `nvidia-smi --query-gpu=<every field> --format=csv` capture of an H200 under load
    WHEN read by the lane THEN it is read (not declined) as the reference reads it, and its memory
    figures are the row's own, MiB as bytes."""
    header, row = h200()
    lane = both(H200.read_text(), tz_offset_s=7200)
    assert lane is not None
    cell = dict(zip(header, row))
    got = dict(lane.frame().select("metric", "value").iter_rows())
    assert got["device_used_bytes"] == int(cell["memory.used [MiB]"].split()[0]) * MiB == 32362 * MiB
    assert got["device_total_bytes"] == int(cell["memory.total [MiB]"].split()[0]) * MiB
    assert got["util_gpu_pct"] == float(cell["utilization.gpu [%]"].split()[0])
    assert lane.gpus[0]["name"] == cell["name"] and lane.gpus[0]["pci_bus_id"] == cell["pci.bus_id"]
    assert lane.frame()["t_us"].unique().to_list() == [common.parse_time(cell["timestamp"], 7200)]


def polled_day(polls: int, gpus: int = 4) -> tuple[str, dict[int, str]]:
    """A log of the real H200 row polled ``polls`` times on ``gpus`` GPUs (`-l 1`), with damage of
    every kind at known lines: each damaged line and what was done to it."""
    header, row = h200()
    at = {h: i for i, h in enumerate(header)}
    lines, damaged = [", ".join(header)], {}
    kinds = ["no number", "extra field", "other time shape", "impossible date", "unknown words", "blank",
             "header again", "units in GiB", "bare numbers", "padded"]
    for s in range(polls):
        for g in range(gpus):
            cells = list(row)
            used = 1000 + (s * 37 + g * 911) % 140000
            cells[at["timestamp"]] = f"2026/07/03 {22 + s // 3600 % 2:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{(s * 7) % 1000:03d}"
            cells[at["index"]] = str(g)
            cells[at["memory.used [MiB]"]] = f"{used} MiB"
            cells[at["memory.free [MiB]"]] = f"{143771 - 614 - used} MiB"
            line = ", ".join(cells)
            k = (s * gpus + g) % 29
            if k < len(kinds):
                kind = kinds[k]
                damaged[len(lines) + 1] = kind
                if kind == "no number":
                    line = line.replace(f"{used} MiB", f"{used} MB")
                elif kind == "extra field":
                    line += ", 7"
                elif kind == "other time shape":
                    line = line.replace("2026/07/03 ", "2026-07-03T", 1)
                elif kind == "impossible date":
                    line = line.replace("2026/07/03", "2026/02/30", 1)
                elif kind == "unknown words":
                    line = line.replace(f"{used} MiB", "[Unknown Error]").replace("NVIDIA H200", "[N/A]")
                elif kind == "blank":
                    lines.append("   ")
                elif kind == "header again":
                    lines.append(", ".join(header))
                elif kind == "units in GiB":
                    line = line.replace(f"{used} MiB", f"{used / 1024:.2f} GiB")
                elif kind == "bare numbers":
                    line = line.replace(f"{used} MiB", str(used))
                elif kind == "padded":
                    line = line.replace(", ", " ,\t ")
            lines.append(line)
    return "\n".join(lines) + "\n", damaged


@pytest.mark.parametrize("piece_chars", [1, 1 << 20])
def test_a_day_of_polling_built_from_the_real_row_reads_as_the_reference(piece_chars: int) -> None:
    """GIVEN 4 GPUs polled 60 times, the real H200 row each time, ten lines of every 29 damaged (a cell
    that is no number, a field too many, another shape of time, 30 February, nvidia-smi's words for
    none, a blank line, the header again, GiB, bare numbers, tabs and spaces around cells) WHEN read
    by the lane in pieces of a line and of 1 MiB THEN it reads it as the reference reads it: the
    broken rows quarantined with their lines, the rest parsed."""
    text, damaged = polled_day(60)
    with pieces_of(piece_chars):
        lane = both(text, tz_offset_s=-3600)
    assert lane is not None
    broken = {no for no, kind in damaged.items() if kind in ("no number", "extra field", "impossible date")}
    assert broken and {no for no, _, _ in lane.quarantine} == broken
    assert lane.parsed + len(lane.quarantine) == lane.lines == len(text.splitlines())
    assert sorted(lane.gpus) == [0, 1, 2, 3] and lane.gpus[0]["name"] == "NVIDIA H200"
    used = lane.frame().filter(pl.col("metric") == "device_used_bytes")
    assert used.height == 4 * 60 - len(broken) - sum(k == "unknown words" for k in damaged.values())


_TIMES = st.one_of(
    st.builds(lambda h, m, s, ms: f"2026/07/03 {h:02d}:{m:02d}:{s:02d}.{ms:03d}", st.integers(0, 23), st.integers(0, 59),
              st.integers(0, 59), st.integers(0, 999)),
    st.sampled_from(["2026-07-03T22:11:09Z", "2026/02/30 22:11:09.000", "2026/07/03 22:11:09", "soon", "",
                     '"2026/07/03 22:11:09.763"', "2026/07/03 22:11:60.000", "0000/07/03 22:11:09.000", "1783116669"]))
_CELLS = st.one_of(st.integers(0, 200000).map(str), st.integers(0, 200000).map(lambda v: f"{v} MiB"),
                   st.sampled_from(["1.5 GiB", "512 KiB", "7 %", "250.10 W", "[N/A]", "N/A", "-", "", "[Not Supported]",
                                    "[Unknown Error]", "12 MB", "1e5", ".5", "5.", "1.2.3", "-5", "inf", "nan", "1" * 400,
                                    "40000  MiB", "40000\tMiB", "NVIDIA H200", "00000000:83:00.0", "[N/A", "12 MiB]", "[]"]))
_FIELDS = ["name", "uuid", "pci.bus_id", "memory.total [MiB]", "memory.used [MiB]", "memory.free", "memory.reserved [MiB]",
           "utilization.gpu [%]", "utilization.memory", "hostname", "pstate", "memory.used [MiB]"]


@st.composite
def smi_logs(draw: st.DrawFn) -> tuple[str, str | None, list[str]]:
    """A --query-gpu log of random fields (a timestamp and an index among them), rows of random cells
    (good, nvidia-smi's words for none, damaged), blank lines, the header again, a field too many or
    too few, with or without its header line (then given as --nvsmi-columns), Unix or Windows line ends."""
    fields = draw(st.lists(st.sampled_from(_FIELDS), max_size=6))
    header = draw(st.permutations(["timestamp", "index", *fields]))
    lines = [] if draw(st.booleans()) else [", ".join(header)]
    for _ in range(draw(st.integers(0, 25))):
        shape = draw(st.sampled_from(["row"] * 6 + ["blank", "header", "short", "long"]))
        if shape == "blank":
            lines.append(draw(st.sampled_from(["", " ", "\t"])))
            continue
        if shape == "header":
            lines.append(", ".join(header))
            continue
        cells = [draw(_TIMES) if h == "timestamp" else str(draw(st.integers(0, 3))) if h == "index" else draw(_CELLS)
                 for h in header]
        cells = cells[:-1] if shape == "short" else cells + ["9"] if shape == "long" else cells
        pad = draw(st.sampled_from(["", " ", "  ", "\t"]))
        lines.append(",".join(pad + c for c in cells) if pad != "" else ", ".join(cells))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = end.join(lines) + draw(st.sampled_from(["", end]))
    line = ", ".join(header)
    return text, (line if lines[:1] != [line] else draw(st.sampled_from([None, line]))), header


@settings(max_examples=200, deadline=None)
@given(smi_logs(), st.sampled_from([0, 3600, -19800]), st.sampled_from([1, 7, 64, 1 << 20]))
def test_generated_logs_read_alike_by_both_lanes(log: tuple[str, str | None, list[str]], tz_offset_s: int,
                                                 piece_chars: int) -> None:
    """GIVEN generated --query-gpu logs WHEN read by the lane, in pieces of any size THEN where the lane
    takes a file it reads it exactly as the reference does; and it takes every file whose header is
    known (by a header line nvidia-smi's way, or by --nvsmi-columns) and whose rows hold an index."""
    text, columns, header = log
    with pieces_of(piece_chars):
        lane = both(text, tz_offset_s, columns)
    # (a header line that opens with other fields is a row to the reference, whose index is 'index')
    known = any(h.startswith(nvidia_smi.NVSMI_HEADER_WORDS) for h in header[:2]) or ", ".join(header) not in text.splitlines()
    if known and text.strip():
        assert lane is not None


@pytest.mark.parametrize("text, columns, why", [
    ("2026/07/03 22:11:09.763, 0, 100 MiB\n", None, "rows without a header"),
    ("timestamp, index, memory.used [MiB]\n2026/07/03 22:11:09.763, 0, 100 MiB\ntimestamp, index, memory.free [MiB]\n"
     "2026/07/03 22:11:10.763, 0, 100 MiB\n", None, "headers that differ"),
    ("timestamp, pci.bus_id, memory.used [MiB]\n2026/07/03 22:11:09.763, 00000000:83:00.0, 100 MiB\n", None,
     "GPUs told apart by bus id"),
    ("timestamp, index, memory.used [MiB]\n2026/07/03 22:11:09.763, x, 100 MiB\n", None, "an index that is no number"),
    ("timestamp, gpu_name, gpu_bus_id, pid, used_gpu_memory [MiB]\n2026/07/03 22:11:09.763, H200, 00:83.0, 7, 1 MiB\n",
     None, "compute apps"),
    ("timestamp, index, name\n2026/07/03 22:11:09.763, 0, Wörker\n", None, "text beyond printable ASCII"),
    ("timestamp, index, memory.used [MiB]\r\n2026/07/03 22:11:09.763, 0, 100 MiB\r\n2026/07/03 22:11:10.763, 0, 1\rMiB\r\n",
     None, "a CR that is no Windows line end"),
])
def test_files_of_other_shapes_go_to_the_reference_whole(text: str, columns: str | None, why: str) -> None:
    """GIVEN a file whose rows depend on one another or on Python's own reading WHEN read THEN the lane
    declines it, and the public reader gives the reference's reading of it."""
    assert fastsmi._vectorised(Path("smi.csv"), text, 0, columns) is None, why
    big = text * 30000  # (past FAST_FROM_CHARS: the lane is tried first)
    assert len(big) >= fastsmi.FAST_FROM_CHARS
    got = fastsmi.parse_nvidia_smi_csv(Path("smi.csv"), big)
    want = nvidia_smi.parse_nvidia_smi_csv(Path("smi.csv"), big)
    assert got.frame().rows() == want.frame().rows() and got.quarantine == want.quarantine and got.gpus == want.gpus


def test_a_gpu_without_memory_of_its_own_is_noted_alike_by_both_lanes() -> None:
    """A poll of a unified-memory GPU (DGX Spark's GB10: memory.used '[N/A]' in every row) takes the lane,
    which notes, as the reference does, that nvidia-smi states no memory for it; a GPU beside it that
    states its memory is not noted, nor is one whose memory was garbled rather than stated as none."""
    rows = ["timestamp, index, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%]"]
    for k in range(2000):
        t = f"2026/01/27 10:{k // 60 % 60:02d}:{k % 60:02d}.123"
        rows += [f"{t}, 0, NVIDIA GB10, [N/A], [N/A], {k % 100} %", f"{t}, 1, NVIDIA H200, 143771 MiB, {k} MiB, 5 %"]
    lane = both("\n".join(rows) + "\n")
    assert lane is not None
    assert [n for n in lane.notes if nvidia_smi.NO_MEMORY in n] == [
        f"smi.csv: {nvidia_smi.NO_MEMORY} 0 (NVIDIA GB10): " + lane.notes[0].split("(NVIDIA GB10): ", 1)[1]]
    garbled = "\n".join([rows[0], rows[2], rows[1].replace("[N/A], [N/A]", "12x, 7y")]) + "\n"
    assert not [n for n in nvidia_smi.parse_nvidia_smi_csv(Path("smi.csv"), garbled, 0, None).notes if nvidia_smi.NO_MEMORY in n]


def test_windows_line_ends_read_as_the_reference_reads_them() -> None:
    """GIVEN the day of polling with Windows' line ends (nvidia-smi.exe, or a file passed through a
    Windows tool) WHEN read by the lane THEN it is taken, and read as the reference reads it."""
    text, _ = polled_day(20)
    assert both(text.replace("\n", "\r\n"), tz_offset_s=3600) is not None


def test_the_recorder_writes_the_same_bundle_by_either_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a day of polling built from the real H200 row, with damaged lines WHEN recorded through the
    lane and through the reference THEN the two bundles hold the same samples, quarantine, GPUs and
    file report."""
    text, _ = polled_day(300)
    smi = tmp_path / "smi.csv"
    smi.write_text(text)
    bundles, taken = [], []
    vectorised = fastsmi._vectorised
    monkeypatch.setattr(fastsmi, "_vectorised", lambda *a: taken.append(vectorised(*a)) or taken[-1])
    for name, from_chars in (("lane", 0), ("reference", 1 << 62)):
        monkeypatch.setattr(fastsmi, "FAST_FROM_CHARS", from_chars)
        reports, _ = record([smi], tmp_path / name, RecordOptions(tz_offset_s=3600))
        b = read_bundle(tmp_path / name)
        quarantine = [json.loads(ln) for ln in (tmp_path / name / "quarantine.jsonl").read_text().splitlines()]
        bundles.append((b.samples.rows(), quarantine, b.meta.gpus, b.meta.t0_utc,
                        [(r.kind, r.lines, r.parsed, r.quarantined, r.t_first_us, r.t_last_us) for r in reports]))
    assert len(taken) == 1 and taken[0] is not None  # (the lane read it once, the reference the second time)
    assert bundles[0] == bundles[1]
    samples, quarantine, gpus, _, reps = bundles[0]
    assert len(samples) > 6 * 4 * 200 and len(quarantine) == reps[0][3] > 0 and [g["index"] for g in gpus] == [0, 1, 2, 3]



@pytest.mark.parametrize(("column", "us_per_unit"), [("time [s]", 1_000_000), ("elapsed_ms", 1000), ("t", 1_000_000)])
@pytest.mark.parametrize("at", [None, "2026-07-03T20:11:09Z"])
@pytest.mark.parametrize("piece_chars", [1, 1 << 20])
def test_a_time_column_of_offsets_takes_the_lane_and_reads_as_the_reference(column: str, us_per_unit: int,
                                                                            at: str | None, piece_chars: int) -> None:
    """GIVEN the real H200 row polled 50 times on 4 GPUs with a column of offsets from the run's start in
    place of its timestamp (seconds, or ms where the name says so) WHEN read by the lane, with --at
    and without, in pieces of any size THEN it is taken and read as the reference reads it: without
    --at its 1,200 samples are held at their offsets, unplaced; with it, placed from it, and said so."""
    offsets = [f"{k * 0.5 * 1_000_000 / us_per_unit:g}" for k in range(50)]
    with pieces_of(piece_chars):
        lane = both(relative_h200(offsets, column, gpus=4), at=at)
    assert lane is not None
    if at is None:
        assert lane.unplaced is not None and lane.frame().height == 0
        frame = lane.unplaced.frame
        assert (lane.unplaced.column, lane.unplaced.form) == (column, "offset")
    else:
        assert lane.unplaced is None
        frame = lane.frame().with_columns(pl.col("t_us") - common.parse_time(at))
        assert lane.notes == [f"smi.csv: its '{column}' column holds offsets from the start of the run: 1200 samples, "
                              "its zero placed at 2026-07-03T20:11:09.000Z (from --at)"]
    assert frame.height == 50 * 4 * 6
    assert sorted(frame["t_us"].unique()) == [k * 500_000 for k in range(50)]
    assert not lane.naive_local_times


def test_offsets_in_a_timestamp_column_or_of_mixed_forms_go_to_the_reference_whole() -> None:
    """GIVEN a timestamp column of small numbers (a script's seconds since start) or a 'time [s]' column
    one of whose cells is a date WHEN read THEN the lane declines and the reference reads the
    offsets (the first row's form is the file's; a row of another form is quarantined as such)."""
    small = relative_h200(["0", "1.5", "3"], column="timestamp")
    assert both(small) is None
    ref = nvidia_smi.parse_nvidia_smi_csv(Path("smi.csv"), small)
    assert ref.unplaced is not None and ref.unplaced.frame.height == 18 and ref.quarantine == []
    mixed = relative_h200(["0", "2026/07/03 22:11:09.763", "3"])
    assert both(mixed) is None
    ref = nvidia_smi.parse_nvidia_smi_csv(Path("smi.csv"), mixed)
    assert ref.unplaced is not None and sorted(ref.unplaced.frame["t_us"].unique()) == [0, 3_000_000]
    assert [(no, why) for no, why, _ in ref.quarantine] == [
        (3, "a time of another form than the first row's (offset): '2026/07/03 22:11:09.763'")]


def test_the_recorder_places_offsets_alike_by_either_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN 300 polls of 4 GPUs (the real H200 row) with a 'time [s]' column, beside a vLLM log WHEN
    recorded through the lane and through the reference, without --at THEN both place the 7,200 samples
    at the log's first time and write the same samples, notes and file report."""
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200([f"{k}" for k in range(300)], gpus=4))
    log = DATA / "v010_v1_debug_memory_profiling.log"
    bundles, taken = [], []
    vectorised = fastsmi._vectorised
    monkeypatch.setattr(fastsmi, "_vectorised", lambda *a: taken.append(vectorised(*a)) or taken[-1])
    for name, from_chars in (("lane", 0), ("reference", 1 << 62)):
        monkeypatch.setattr(fastsmi, "FAST_FROM_CHARS", from_chars)
        reports, _ = record([log, smi], tmp_path / name, RecordOptions(year=2025))
        b = read_bundle(tmp_path / name)
        bundles.append((b.samples.sort("t_us", "gpu", "metric").rows(), b.meta.notes, b.meta.t0_utc,
                        [(r.kind, r.lines, r.parsed, r.quarantined, r.t_first_us, r.t_last_us) for r in reports]))
    assert len(taken) == 1 and taken[0] is not None  # (the lane read it once, the reference the second time)
    assert bundles[0] == bundles[1]
    samples, notes, t0, _ = bundles[0]
    assert t0 == "2025-08-06T10:17:28Z" and sum(1 for s in samples if s[2] == "nvidia-smi") == 300 * 4 * 6
    assert any(n.startswith("smi.csv: its 'time [s]' column holds offsets") for n in notes)


_USUAL_HEADER = "timestamp, index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]"


def usual_poll(s: int, g: int) -> list[str]:
    """GPU ``g``'s row of poll ``s`` in nvidia-smi's usual shape (`bench_time_to_answer`'s node): its cells."""
    used = 20000 + (s * 13 + g * 977) % 100000
    return [f"2026/05/01 {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{s * 7919 % 1000:03d}", str(g), "NVIDIA H200",
            "143771 MiB", f"{used} MiB", f"{143771 - used} MiB", f"{(s + g) % 101} %"]


# each a row in another shape than the usual one, or in the usual one with a value to set aside: what it
# does to the usual row's cells (timestamp, index, name, total, used, free, utilisation)
_OTHER_ROWS: dict[str, Callable[[list[str]], list[str]]] = {
    "used [N/A]": lambda c: [*c[:4], "[N/A]", *c[5:]],
    "utilisation N/A": lambda c: [*c[:6], "N/A"],
    "utilisation [Not Supported]": lambda c: [*c[:6], "[Not Supported]"],
    "used [Unknown Error]": lambda c: [*c[:4], "[Unknown Error]", *c[5:]],
    "free '-'": lambda c: [*c[:5], "-"],
    "free empty": lambda c: [*c[:5], ""],
    "leading zeros": lambda c: [*c[:4], "0" + c[4], *c[5:]],
    "16 digits": lambda c: [*c[:4], "1234567890123456 MiB", *c[5:]],
    "in GiB": lambda c: [*c[:4], "19.5 GiB", *c[5:]],
    "bare number": lambda c: [*c[:4], c[4].split()[0], *c[5:]],
    "two spaces": lambda c: [*c[:4], c[4].replace(" ", "  "), *c[5:]],
    "negative": lambda c: [*c[:4], "-5 MiB", *c[5:]],
    "fraction": lambda c: [*c[:6], "7.5 %"],
    "30 February": lambda c: [c[0].replace("2026/05/01", "2026/02/30"), *c[1:]],
    "second 60": lambda c: [c[0][:17] + "60" + c[0][19:], *c[1:]],
    "ISO time": lambda c: [c[0].replace("/", "-").replace(" ", "T"), *c[1:]],
    "used past total": lambda c: [*c[:4], "150000 MiB", *c[5:]],
    "utilisation 250 %": lambda c: [*c[:6], "250 %"],
    "total past 16 TiB": lambda c: [*c[:3], "99999999999 MiB", *c[4:]],
    "no total, used past another row's": lambda c: [*c[:3], "[N/A]", "150000 MiB", *c[5:]],
    "name padded": lambda c: [*c[:2], "\t NVIDIA H200  ", *c[3:]],
    "name [N/A]": lambda c: [*c[:2], "[N/A]", *c[3:]],
    "name empty": lambda c: [*c[:2], "", *c[3:]],
    "a field too many": lambda c: [*c, "7"],
    "a field too few": lambda c: c[:-1],
}
_OTHER_LINES: dict[str, Callable[[str], str]] = {  # (what it does to the usual row's line)
    "tab after a comma": lambda ln: ln.replace(", ", ",\t", 1),
    "no space after a comma": lambda ln: ln.replace(", ", ",", 2),
    "space before a comma": lambda ln: ln.replace(", ", " , "),
    "trailing spaces": lambda ln: ln + "  ",
    "leading space": lambda ln: " " + ln,
    "blank": lambda ln: "  ",
    "header again": lambda ln: _USUAL_HEADER,
    "the poll again, the same": lambda ln: ln + "\n" + ln,
    "the poll again, another value": lambda ln: ln + "\n" + ln.rsplit(", ", 1)[0] + (", 51 %" if ln.endswith(", 50 %") else ", 50 %"),
}


def usual_log(polls: int, gpus: int = 8, every: int = 7, kinds: tuple[str, ...] = (*_OTHER_ROWS, *_OTHER_LINES)) -> str:
    """``polls`` polls of ``gpus`` GPUs in the usual shape, every ``every``-th row turned into one of ``kinds``
    in turn (none: ``kinds`` empty)."""
    lines, k = [_USUAL_HEADER], 0
    for s in range(polls):
        for g in range(gpus):
            cells = usual_poll(s, g)
            kind = kinds[k % len(kinds)] if kinds and (s * gpus + g) % every == every - 1 else None
            k += kind is not None
            cells = _OTHER_ROWS[kind](cells) if kind in _OTHER_ROWS else cells
            line = ", ".join(cells)
            lines.append(_OTHER_LINES[kind](line) if kind in _OTHER_LINES else line)
    return "\n".join(lines) + "\n"


@contextmanager
def read_by_shape() -> Iterator[dict[str, int]]:
    """How many rows the lane reads as lines of the usual shape ('usual') and as rows of any ('any'), where it
    holds its samples (``both`` reads the file a second time, leaving them on disk)."""
    counts = {"usual": 0, "any": 0}
    usual, any_shape = fastsmi._Lane._read_usual, fastsmi._Lane._read_any

    def read_usual(lane: fastsmi._Lane, rows: pl.DataFrame) -> pl.DataFrame:
        read = usual(lane, rows)
        counts["usual"] += read["usual"].sum() if lane.spill is None else 0
        return read

    def read_any(lane: fastsmi._Lane, rows: pl.DataFrame, header: list[str]) -> pl.DataFrame | None:
        counts["any"] += rows.height if lane.spill is None else 0
        return any_shape(lane, rows, header)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fastsmi._Lane, "_read_usual", read_usual)
        mp.setattr(fastsmi._Lane, "_read_any", read_any)
        yield counts


@pytest.mark.parametrize("piece_chars", [1, 64, 4096, 1 << 20])
def test_usual_lines_and_lines_of_every_other_shape_read_as_the_reference_reads_them(piece_chars: int) -> None:
    """GIVEN 8 GPUs polled 60 times in nvidia-smi's usual shape (', ' between cells, MiB, %), every 7th
    row of another shape in turn (nvidia-smi's words for none, leading zeros, 16 digits, GiB, a bare
    number, two spaces, a negative, a fraction, 30 February, second 60, an ISO time, a tab or no space
    after a comma, spaces around the line, a padded or missing name, a field too many or too few, a blank
    line, the header again, the poll repeated alike or not) or with a value no GPU can have (used past
    its total, 250 %, a total past 16 TiB, a used past another row's total where its own is [N/A]) WHEN read
    by the lane in pieces of any size THEN it reads the file as the reference does, the lines of the usual
    shape read as such and the others as any row is."""
    text = usual_log(60)
    with pieces_of(piece_chars), read_by_shape() as counts:
        lane = both(text, tz_offset_s=7200)
    assert lane is not None
    rows = sum(1 for ln in text.splitlines()[1:] if ln.strip() and ln != _USUAL_HEADER)
    assert counts["usual"] + counts["any"] == rows and counts["any"] > 60 // 7 and counts["usual"] > 0.8 * rows
    reasons = {why.split(":")[0] for _, why, _ in lane.quarantine}
    assert {"impossible value", "expected 7 fields, found 8", "memory.used"} <= reasons
    assert any(why.startswith("impossible value: more memory than the GPU's stated total") and line is None
               for line, why, _ in lane.quarantine)  # (set aside after reading: its row stated no total)
    assert any("different values" in n for n in lane.notes)


def test_a_file_wholly_of_the_usual_shape_reads_as_the_reference_reads_it() -> None:
    """GIVEN a node's polling in the usual shape throughout, past the first piece WHEN read by the lane
    THEN every row after the first piece is read as a line of the usual shape, as the reference reads it."""
    text = usual_log(400, kinds=())
    with pieces_of(16 << 10), read_by_shape() as counts:
        lane = both(text)
    assert lane is not None and lane.quarantine == [] and lane.frame().height == 400 * 8 * 4
    assert counts["usual"] == 400 * 8 and counts["any"] == 0


@pytest.mark.parametrize("shape", ["no units", "no memory at first", "no memory at all", "utilisation in W", "names at last N/A"])
def test_columns_written_without_units_or_as_none_read_as_the_reference_reads_them(shape: str) -> None:
    """GIVEN the usual polling written with ``--format=csv,nounits`` (bare numbers under '[MiB]'), or whose
    memory is '[N/A]' in its first rows and numbers later, or in every row (a unified-memory GPU), or a
    metric written with a unit not its own, or whose GPUs' names are '[N/A]' or nothing in their last
    rows (one GPU's in all) WHEN read by the lane THEN it reads it as the reference does."""
    rows = [usual_poll(s, g) for s in range(100) for g in range(4)]
    if shape == "no units":
        rows = [[c.removesuffix(" MiB").removesuffix(" %") for c in r] for r in rows]
    elif shape == "no memory at first":
        rows = [[*r[:3], "[N/A]", "[N/A]", "[N/A]", r[6]] if k < 40 else r for k, r in enumerate(rows)]
    elif shape == "no memory at all":
        rows = [[*r[:3], "[Not Supported]", "[N/A]", "N/A", r[6]] for r in rows]
    elif shape == "utilisation in W":
        rows = [[*r[:6], r[6].replace("%", "W")] for r in rows]
    else:
        rows = [[*r[:2], "[N/A]" if k >= 380 or r[1] == "3" else "" if k >= 370 else r[2], *r[3:]] for k, r in enumerate(rows)]
    text = "\n".join([_USUAL_HEADER, *(", ".join(r) for r in rows)]) + "\n"
    with pieces_of(256):
        lane = both(text)
    assert lane is not None
    if shape == "names at last N/A":
        assert [g.get("name") for g in lane.gpus.values()] == ["NVIDIA H200"] * 3 + [None]


@pytest.mark.parametrize("odd", ["Wörker", "a\x0bb", "a\x85b", "a\x1cb", "a\x00b", "a\x7fb"])
def test_text_beyond_printable_ascii_after_the_first_rows_sends_the_file_to_the_reference(odd: str) -> None:
    """GIVEN the usual polling, a name past its first rows holding text beyond printable ASCII (one of
    Python's line breaks, a NUL, DEL) WHEN read THEN the lane declines the file, however it is cut into
    pieces, as it declines one whose first rows hold it."""
    rows = [usual_poll(s, g) for s in range(50) for g in range(4)]
    rows[170][2] = f"NVIDIA {odd}"
    text = "\n".join([_USUAL_HEADER, *(", ".join(r) for r in rows)]) + "\n"
    for chars in (64, 1 << 20):
        with pieces_of(chars):
            assert fastsmi._vectorised(Path("smi.csv"), text, 0, None) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from([*_OTHER_ROWS, *_OTHER_LINES])), min_size=1, max_size=120),
       st.booleans(), st.sampled_from([1, 64, 512, 1 << 20]))
def test_usual_logs_with_other_lines_anywhere_read_alike_by_both_lanes(kinds: list[str | None], units: bool,
                                                                       piece_chars: int) -> None:
    """GIVEN polls of 4 GPUs in the usual shape, with or without units, each row of it or of another shape
    (``_OTHER_ROWS``, ``_OTHER_LINES``) at random, the first rows among them WHEN read by the lane in
    pieces of any size THEN where it takes the file it reads it as the reference does."""
    lines = [_USUAL_HEADER]
    for k, kind in enumerate(kinds):
        cells = usual_poll(k // 4, k % 4)
        cells = cells if units else [c.removesuffix(" MiB").removesuffix(" %") for c in cells]
        cells = _OTHER_ROWS[kind](cells) if kind in _OTHER_ROWS else cells
        line = ", ".join(cells)
        lines.append(_OTHER_LINES[kind](line) if kind in _OTHER_LINES else line)
    with pieces_of(piece_chars):
        both("\n".join(lines) + "\n", tz_offset_s=-3600)


def test_a_day_read_with_a_spill_folder_leaves_each_pieces_samples_there(tmp_path: Path) -> None:
    """GIVEN the usual polling of 8 GPUs with a row whose used memory passes the GPU's total stated
    elsewhere (its own total [N/A]: the row passes the lane, the file's check sets it aside) and a poll
    twice with another value WHEN read in small pieces with a spill folder THEN each piece's samples
    are written there as it is read, none held, and what is read from there is the reference's
    reading: the row set aside, the conflict noted."""
    text = usual_log(60, kinds=("no total, used past another row's", "the poll again, another value"), every=97)
    spill = tmp_path / "spill"
    with pieces_of(4096):
        p = fastsmi._vectorised(Path("smi.csv"), text, 0, None, spill=spill)
    ref = nvidia_smi.parse_nvidia_smi_csv(Path("smi.csv"), text)
    assert p is not None and p.frames == [] and p.on_disk is not None
    assert len(list(spill.glob("nvidia-smi-*.arrow"))) > len(text) // 4096 // 2
    assert p.on_disk.collect().rows() == ref.frame().rows()
    assert p.quarantine == ref.quarantine and p.quarantine and all("more memory than the GPU's stated total" in why
                                                                   for _, why, _ in p.quarantine)
    assert p.notes == ref.notes and any("different values" in n for n in p.notes)


def test_a_file_the_lane_declines_after_spilling_leaves_nothing_in_the_spill_folder(tmp_path: Path) -> None:
    """GIVEN the usual polling with text beyond ASCII late in the file WHEN read in small pieces with a
    spill folder THEN the lane, having written the first pieces' samples there, declines the file and
    takes them back: the folder is empty."""
    rows = [usual_poll(s, g) for s in range(50) for g in range(4)]
    rows[170][2] = "NVIDIA Wörker"
    text = "\n".join([_USUAL_HEADER, *(", ".join(r) for r in rows)]) + "\n"
    spill = tmp_path / "spill"
    with pieces_of(256):
        assert fastsmi._vectorised(Path("smi.csv"), text, 0, None, spill=spill) is None
    assert spill.is_dir() and not any(spill.iterdir())


def test_the_recorder_sets_aside_impossible_times_of_samples_left_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the usual polling with a row dated 2999 WHEN recorded through the lane (its samples left on
    disk) and through the reference THEN both bundles hold the same samples and quarantine the row's
    samples at an impossible time."""
    rows = [usual_poll(s, g) for s in range(300) for g in range(4)]
    rows[500][0] = rows[500][0].replace("2026", "2999")
    smi = tmp_path / "smi.csv"
    smi.write_text("\n".join([_USUAL_HEADER, *(", ".join(r) for r in rows)]) + "\n")
    got = []
    for name, from_chars in (("lane", 0), ("reference", 1 << 62)):
        monkeypatch.setattr(fastsmi, "FAST_FROM_CHARS", from_chars)
        with pieces_of(8192):
            record([smi], tmp_path / name, RecordOptions())
        quarantine = [json.loads(ln)["reason"] for ln in (tmp_path / name / "quarantine.jsonl").read_text().splitlines()]
        got.append((read_bundle(tmp_path / name).samples.rows(), quarantine))
    assert got[0] == got[1]
    assert sum("impossible time" in r for r in got[0][1]) == 4 and len(got[0][0]) == 4 * (1200 - 1)
    assert not (tmp_path / "lane" / ".spill").exists()


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_a_file_read_in_parts_from_disk_reads_as_its_whole_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                line_end: str) -> None:
    """GIVEN the usual polling with lines of every other shape, its lines ended by LF or by CR LF WHEN
    the recorder's route reads it in small parts from the file THEN it reads it as the reference reads
    its whole text, the text never asked for."""
    text = usual_log(40).replace("\n", line_end)
    smi = tmp_path / "smi.csv"
    smi.write_bytes(text.encode())
    monkeypatch.setattr(fastsmi, "FAST_FROM_CHARS", 0)
    asked: list[int] = []
    with pieces_of(1024):
        got = fastsmi._parse_file(smi, lambda: asked.append(1) or text, RecordOptions(spill=tmp_path / "spill"))
    ref = nvidia_smi.parse_nvidia_smi_csv(smi, text)
    assert not asked and got.on_disk is not None and len(list((tmp_path / "spill").iterdir())) > 10
    assert got.on_disk.collect().rows() == ref.frame().rows() and len(ref.frame()) > 1000
    for k in ("lines", "parsed", "quarantine", "notes", "gpus", "naive_local_times"):
        assert getattr(got, k) == getattr(ref, k), k


@pytest.mark.parametrize("odd", [b"NVIDIA W\xc3\xb6rker", b"NVIDIA \xff", b"a\rb", b"a\x00b"])
def test_a_file_read_in_parts_that_the_lane_declines_is_read_whole_by_the_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: bytes) -> None:
    """GIVEN the usual polling with, past its first parts, a name holding UTF-8 beyond ASCII, a byte that
    is no UTF-8, a CR of its own or a NUL WHEN the recorder's route reads it in parts THEN the lane
    declines it, leaves nothing spilled, and the file's whole text is read once, by the reference."""
    rows = [usual_poll(s, g) for s in range(50) for g in range(4)]
    data = "\n".join([_USUAL_HEADER, *(", ".join(r) for r in rows)]).encode() + b"\n"
    at = data.index(b"NVIDIA H200", len(data) * 3 // 4)
    data = data[:at] + odd + data[at + len(b"NVIDIA H200"):]
    smi = tmp_path / "smi.csv"
    smi.write_bytes(data)
    text = data.decode("utf-8", errors="replace")
    monkeypatch.setattr(fastsmi, "FAST_FROM_CHARS", 0)
    asked: list[int] = []
    with pieces_of(512):
        got = fastsmi._parse_file(smi, lambda: asked.append(1) or text, RecordOptions(spill=tmp_path / "spill"))
    ref = nvidia_smi.parse_nvidia_smi_csv(smi, text)
    assert asked == [1] and got.on_disk is None and (tmp_path / "spill").is_dir() and not any((tmp_path / "spill").glob("*"))
    assert got.frame().rows() == ref.frame().rows() and (got.quarantine, got.notes) == (ref.quarantine, ref.notes)


def test_samples_left_out_of_those_on_disk_are_written_anew_before_they_are_read_in_slices(tmp_path: Path) -> None:
    """GIVEN a day whose samples the lane left on disk, a row of which the file's check then set aside
    WHEN the recorder takes them THEN what is kept is written anew (a slice of a filtered scan reads the
    whole of it), and read in slices it is what was kept, in order."""
    text = usual_log(60, kinds=("no total, used past another row's",), every=97)
    spill = tmp_path / "spill"
    with pieces_of(4096):
        p = fastsmi._vectorised(Path("smi.csv"), text, 0, None, spill=spill)
    assert p is not None and p.on_disk is not None and p.on_disk_filtered and p.quarantine
    kept = p.on_disk.collect()
    got = recorder._spill_samples(p, spill)
    assert got is not None and (spill / "kept.arrow").is_file() and not p.on_disk_filtered
    assert pl.concat(recorder._slices(got, 100)).rows() == kept.rows() == nvidia_smi.parse_nvidia_smi_csv(
        Path("smi.csv"), text).frame().rows()
