"""Evidence whose times are relative to its run's start (an experiment's nvidia-smi CSV with a
'time [s]' column; a script's CSV of times of day): placed from --at FILE=START, else at the earliest
absolute time of the other evidence, always said; quarantined with its count where nothing places it."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from replay.bundle import read_bundle
from replay.record import timecol
from replay.record.common import parse_time
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA
from tests.unit.timecol_helpers import relative_h200

MiB = 1 << 20
LOG = DATA / "v010_v1_debug_memory_profiling.log"  # (its lines at 08-06 10:17:28-29, no year: 2026 assumed)
# a used memory that grows from the real 32,362 MiB: a gap that builds, for the analysis to find
USED_MIB = [32362] * 8 + [32362 + 2048 * k for k in range(1, 5)]


@pytest.mark.parametrize(("header", "us_per_unit"), [("time [s]", 1_000_000), ("time [ms]", 1000), ("elapsed_ms", 1000),
                                                     ("elapsed", 1_000_000), ("t", 1_000_000), ("Time_S", 1_000_000),
                                                     ("timestamp", 1_000_000), ("time (us)", 1)])
def test_time_columns_are_known_by_name_with_their_unit(header: str, us_per_unit: int) -> None:
    col = timecol.time_column(header)
    assert col is not None and col.us_per_unit == us_per_unit


def test_offsets_are_small_plain_numbers_and_times_of_day_read_to_the_microsecond() -> None:
    """An epoch time or a date in a time column is no offset; nor is a negative number."""
    s = timecol.TimeColumn("t", 1_000_000)
    assert [timecol.offset_us(c, s) for c in ("0", "12.25", ".5", "1700000000", "-1", "2026-01-01", "1e3")] == [
        0, 12_250_000, 500_000, None, None, None, None]
    assert timecol.time_of_day_us("09:59:00.25") == (9 * 3600 + 59 * 60) * 1_000_000 + 250_000
    assert timecol.time_of_day_us("24:00:00") is None and timecol.time_of_day_us("9:59") is None


def test_times_of_day_roll_past_midnight_and_are_dated_nearest_their_anchor() -> None:
    """GIVEN times of day 23:59:30, 00:00:00, 00:00:30 (a run past midnight) WHEN read in order and
    dated by an anchor a few minutes before the first, or hours after it THEN they keep their order
    across midnight, on the day that puts the first row nearest the anchor (--tz: local times)."""
    clock = timecol.RowClock("t", timecol.TimeColumn("t", 1_000_000), lambda c: None)
    got = [clock.read(c)[0] for c in ("23:59:30", "00:00:00", "00:00:30")]
    assert clock.form == "time of day"
    frame = pl.DataFrame({"t_us": got, "gpu": [None] * 3, "source": ["s"] * 3, "metric": ["m"] * 3, "value": [1.0] * 3})
    u = timecol.Unplaced("t", "time of day", frame)
    day = parse_time("2026-10-06T00:00:00Z")
    assert day is not None
    before = u.placed(day - 600_000_000)["t_us"].to_list()  # (10 minutes before midnight)
    assert before == [day - 30_000_000, day, day + 30_000_000]
    assert u.placed(day + 5 * 3600_000_000)["t_us"].to_list() == before  # (5 h after: still the nearest day)
    local = timecol.Unplaced("t", "time of day", frame, tz_offset_s=7200)  # (times at UTC+2: 23:59:30 is 21:59:30Z)
    assert local.placed(day - 600_000_000)["t_us"].to_list()[0] == day - 2 * 3600_000_000 - 30_000_000


def test_without_at_the_offsets_are_placed_at_the_logs_first_time_and_said(tmp_path: Path) -> None:
    """GIVEN a vLLM log (10:17:28-29) and an nvidia-smi CSV of 12 polls 0.5 s apart with a 'time [s]'
    column WHEN recorded without --at THEN its 72 samples are placed from the log's first time (the
    earliest of the other evidence), 0.5 s apart, and a note says so."""
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200([f"{k * 0.5:.1f}" for k in range(12)], used_mib=USED_MIB))
    reports, _ = record([LOG, smi], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2026-08-06T10:17:28Z"
    smi_samples = b.samples.filter(pl.col("source") == "nvidia-smi")
    assert smi_samples.height == 72
    assert sorted(smi_samples["t_us"].unique()) == [k * 500_000 for k in range(12)]
    used = smi_samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us")["value"].to_list()
    assert used == [u * MiB for u in USED_MIB]
    assert ("smi.csv: its 'time [s]' column holds offsets from the start of the run: 72 samples, its zero placed at "
            "2026-08-06T10:17:28.000Z (the earliest time of the other evidence, v010_v1_debug_memory_profiling.log's)"
            ) in b.meta.notes
    rep = reports[1]
    assert (rep.kind, rep.quarantined, rep.t_first_us, rep.t_last_us) == (
        "nvidia-smi", 0, parse_time("2026-08-06T10:17:28Z"), parse_time("2026-08-06T10:17:33.5Z"))


def test_at_file_start_places_the_offsets_and_the_other_files_are_untouched(tmp_path: Path) -> None:
    """GIVEN the same two files and --at for the CSV alone (FILE=START) WHEN recorded THEN its samples
    start at that time, the note says from --at, and the log keeps its own times."""
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200(["0", "0.5", "1"]))
    record([LOG, smi], tmp_path / "b", RecordOptions(at_files={"smi.csv": "2026-08-06T10:17:20Z"}))
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2026-08-06T10:17:20Z"
    assert sorted(b.samples.filter(pl.col("source") == "nvidia-smi")["t_us"].unique()) == [0, 500_000, 1_000_000]
    assert ("smi.csv: its 'time [s]' column holds offsets from the start of the run: 18 samples, its zero placed at "
            "2026-08-06T10:17:20.000Z (from --at)") in b.meta.notes
    events = [json.loads(ln) for ln in (tmp_path / "b" / "events.jsonl").read_text().splitlines()]
    assert min(e["t_us"] for e in events if e["t_us"] is not None) == 8_000_000  # (the log's 10:17:28)


def test_offsets_nothing_places_are_quarantined_with_their_count(tmp_path: Path) -> None:
    """GIVEN the CSV of offsets alone (nothing states an absolute time) WHEN recorded THEN no sample is
    put on the timeline at a guess: its 18 samples are one quarantine entry with their count, and a
    note says how to place them."""
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200(["0", "0.5", "1"]))
    reports, summary = record([smi], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert b.samples.height == 0 and summary["t0_utc"] is None and reports[0].quarantined == 1
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(e["file"], e["reason"]) for e in q] == [
        (str(smi), "18 samples at times relative to the run's start ('time [s]'), which nothing placed")]
    assert ("smi.csv: its 'time [s]' column holds offsets from the start of the run, and nothing in the recording "
            "states an absolute time to place them by: 18 samples quarantined; pass --at smi.csv=START with when "
            "the run began") in b.meta.notes


@pytest.mark.parametrize("at", [["--at", "smi.csv=2026-08-06T10:17:27Z"], []])
def test_cli_record_then_analyze_finds_the_peak_and_the_gap(tmp_path: Path, at: list[str]) -> None:
    """GIVEN a vLLM log with its memory profile (what vLLM accounted for) and an nvidia-smi CSV of
    offsets WHEN `replay record log csv [--at csv=START]` then `replay analyze` THEN the peak actual
    memory and the max gap are stated, not unknown (they were: the CSV's rows were left untimed)."""
    from typer.testing import CliRunner

    from replay.cli import app
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200([f"{k * 0.5:.1f}" for k in range(12)], used_mib=USED_MIB))
    env = {"COLUMNS": "400"}
    rec = CliRunner().invoke(app, ["record", str(LOG), str(smi), *at, "-o", str(tmp_path / "b")], env=env)
    assert rec.exit_code == 0, rec.output
    assert ("(from --at)" if at else "(the earliest time of the other evidence") in rec.output
    out = CliRunner().invoke(app, ["analyze", str(tmp_path / "b")], env=env)
    assert out.exit_code == 0, out.output
    peak_gib = USED_MIB[-1] / 1024
    assert f"peak actual {peak_gib:.3f} GiB" in out.output
    assert "max gap unknown" not in out.output and "max gap " in out.output


@pytest.mark.parametrize(("args", "why"), [
    (["--at", "other.csv=2026-08-06T10:17:27Z"], "other.csv is not among the evidence files"),
    (["--at", "smi.csv=soon"], "expected a time such as"),
    (["--at", "2026-08-06T10:17:27Z", "--at", "2026-08-06T10:17:28Z"], "a second time for every file")])
def test_cli_refuses_an_at_it_cannot_use_by_name(tmp_path: Path, args: list[str], why: str) -> None:
    """A FILE=TIME for no file given, a time it cannot read, or two times for every file: refused, nothing written."""
    from typer.testing import CliRunner

    from replay.cli import app
    from replay.errors import ReplayError
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200(["0"]))
    res = CliRunner().invoke(app, ["record", str(smi), *args, "-o", str(tmp_path / "b")], env={"COLUMNS": "400"})
    assert isinstance(res.exception, ReplayError) and res.exception.exit_code == 2
    assert str(res.exception).startswith("--at ") and why in str(res.exception) and not (tmp_path / "b").exists()


def test_without_at_a_bench_results_date_places_the_offsets(tmp_path: Path) -> None:
    """GIVEN a real `vllm bench serve --save-detailed` result (its requests placed by its date less its
    duration) and an nvidia-smi CSV of offsets WHEN recorded without --at THEN the CSV's zero is the
    result's first request, the earliest time of the other evidence, and the note names the result."""
    bench = DATA / "harness" / "vllm_bench_serve_0.19.1_save_detailed.first5.json"
    smi = tmp_path / "smi.csv"
    smi.write_text(relative_h200(["0", "0.5", "1"]))
    reports, _ = record([bench, smi], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    first = reports[0].t_first_us
    assert first is not None and reports[1].t_first_us == first and reports[1].t_last_us == first + 1_000_000
    zero = timecol.utc_text(first)
    assert (f"smi.csv: its 'time [s]' column holds offsets from the start of the run: 18 samples, its zero placed at "
            f"{zero} (the earliest time of the other evidence, {bench.name}'s)") in b.meta.notes
