"""Hostile evidence, derived from real captures: values no device can have are quarantined with their
file and line (not a peak of 9.8e+26 GiB), conflicting series at one time are noted, a log that opens
with logrotate's hole of NULs is read from its text, a header-only nvidia-smi CSV is said, and trace
imports quarantine NaN and 1e20 with their lines instead of failing inside polars."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.bundle import SAMPLES_SCHEMA
from replay.errors import ReplayError
from replay.filehash import nul_run, read_past_nul_run, utf8_chunks
from replay.record import common, fastsmi, nvidia_smi, prometheus
from replay.record.recorder import RecordOptions, record
from replay.trace.importers import import_trace
from tests.conftest import DATA

MiB = 1 << 20
MPS = DATA / "scrape_a100_mps_vllm_pod.prom"  # two pods' DCGM series of one A100 (the same value)
VLLM = DATA / "vllm_v0_metrics_excerpt.prom"
H200 = DATA / "h200_query_gpu_load.csv"
AT = "2025-03-01T12:00:00Z"


def _hostile_scrape() -> tuple[str, dict[str, int]]:
    """The real MPS scrape and vLLM excerpt in one file, with every sample value made impossible but one
    DCGM series; returns the text and the line of each damaged sample."""
    dcgm = MPS.read_text().splitlines()
    vllm = VLLM.read_text().splitlines()
    used = [i for i, ln in enumerate(dcgm) if ln.startswith("DCGM_FI_DEV_FB_USED")]
    assert len(used) == 2
    dcgm[used[1]] = dcgm[used[1]].rsplit(" ", 1)[0] + " 1e30"  # (1e30 MiB)
    # a negative reading of the same GPU under a third pod
    dcgm.append(dcgm[used[0]].replace('pod="gpu-burn', 'pod="other').rsplit(" ", 1)[0] + " -1")
    sub = {"vllm:num_requests_running": "-5", "vllm:gpu_cache_usage_perc": "-0.7", "vllm:num_requests_waiting": "1.0"}
    vllm = [ln.rsplit(" ", 1)[0] + " " + sub[ln.split("{")[0]] if not ln.startswith("#") else ln for ln in vllm]
    lines = dcgm + vllm
    at = {"1e30": next(i for i, ln in enumerate(lines, 1) if ln.endswith(" 1e30")),
          "-1": next(i for i, ln in enumerate(lines, 1) if ln.endswith(" -1")),
          "-5": next(i for i, ln in enumerate(lines, 1) if ln.endswith(" -5")),
          "-0.7": next(i for i, ln in enumerate(lines, 1) if ln.endswith(" -0.7"))}
    return "\n".join(lines) + "\n", at


def test_impossible_scrape_values_are_quarantined_with_their_lines(tmp_path: Path) -> None:
    text, at = _hostile_scrape()
    f = tmp_path / "scrape.prom"
    f.write_text(text)
    p = prometheus.parse_exposition(f, text, at=AT)
    why = {line: reason for line, reason, _ in p.quarantine}
    assert sorted(why) == sorted(at.values())
    assert "negative memory" in why[at["-1"]] and "more memory than any device holds" in why[at["1e30"]]
    assert "negative count" in why[at["-5"]] and "KV cache usage outside 0-1" in why[at["-0.7"]]
    raw = {line: text for line, _, text in p.quarantine}
    assert raw[at["1e30"]].endswith(" 1e30") and raw[at["-5"]].startswith("vllm:num_requests_running")
    df = p.frame()
    assert sorted(df["metric"].to_list()) == ["device_used_bytes", "requests_waiting"]
    assert df.filter(pl.col("metric") == "device_used_bytes")["value"].to_list() == [15866 * MiB]
    assert p.parsed == p.lines - len(at)

    reps, _ = record([f], tmp_path / "b", RecordOptions(at=AT))
    from replay.bundle import read_bundle
    b = read_bundle(tmp_path / "b")
    assert b.samples.filter(pl.col("metric") == "device_used_bytes")["value"].max() == 15866 * MiB  # (not 9.8e+26 GiB)
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert sorted((e["file"], e["line"]) for e in q) == sorted((str(f), n) for n in at.values())
    assert reps[0].quarantined == len(at)


def test_memory_beyond_the_gpus_stated_total_is_impossible(tmp_path: Path) -> None:
    """A DCGM series whose own FB_TOTAL says 80 GiB cannot have used 90 GiB; a series of another GPU
    without a total can (it is under 16 TiB)."""
    line = next(ln for ln in MPS.read_text().splitlines() if ln.startswith("DCGM_FI_DEV_FB_USED"))
    labels = line[len("DCGM_FI_DEV_FB_USED"):].rsplit(" ", 1)[0]
    other = labels.replace('gpu="0"', 'gpu="1"')
    text = "\n".join([f"DCGM_FI_DEV_FB_TOTAL{labels} 81920", f"DCGM_FI_DEV_FB_USED{labels} 92160",
                      f"DCGM_FI_DEV_FB_USED{other} 92160"]) + "\n"
    p = prometheus.parse_exposition(tmp_path / "s.prom", text, at=AT)
    assert [(q[0], q[1]) for q in p.quarantine] == [
        (2, "impossible value: more memory than the GPU's stated total of 81920 MiB (device_used_bytes = 92160 MiB)")]
    assert sorted(p.frame().select("gpu", "metric").rows()) == [(0, "device_total_bytes"), (1, "device_used_bytes")]


def test_conflicting_series_of_one_gpu_at_one_time_are_noted() -> None:
    """The real MPS scrape repeats one device value under two pods: one fact, no conflict. Changed so the
    pods disagree, the two values at one time are noted, both kept."""
    text = MPS.read_text()
    p = prometheus.parse_exposition(MPS, text, at=AT)
    assert not [n for n in p.notes if "different values" in n] and p.frame().height == 1
    lines = text.splitlines()
    k = max(i for i, ln in enumerate(lines) if ln.startswith("DCGM_FI_DEV_FB_USED"))
    lines[k] = lines[k].rsplit(" ", 1)[0] + " 20000"
    p = prometheus.parse_exposition(MPS, "\n".join(lines) + "\n", at=AT)
    clash = [n for n in p.notes if "different values" in n]
    assert len(clash) == 1 and "15866 MiB and 20000 MiB" in clash[0] and "GPU 0" in clash[0]
    assert sorted(p.frame()["value"].to_list()) == [15866 * MiB, 20000 * MiB]


def _h200_rows(n: int) -> tuple[str, list[str], str]:
    """The real H200 capture's header and its row polled ``n`` times, a second apart."""
    header, row = H200.read_text().splitlines()[:2]
    rows = [row.replace("22:11:09.763", f"22:{11 + i // 60:02d}:{i % 60:02d}.763", 1) for i in range(n)]
    return header, rows, row


@pytest.mark.parametrize("lane", ["reference", "vectorised"])
def test_nvidia_smi_rows_with_impossible_values_are_quarantined_by_either_lane(lane: str, tmp_path: Path) -> None:
    header, rows, _ = _h200_rows(400)
    rows[10] = rows[10].replace("32362 MiB", "150000 MiB", 1)  # used past the row's total (143771 MiB)
    rows[20] = rows[20].replace(", 100 %, 7 %,", ", 250 %, 7 %,", 1)  # utilisation of 250 %
    rows[30] = rows[30].replace("143771 MiB", "99999999999 MiB", 1)  # a total past 16 TiB
    text = "\n".join([header, *rows]) + "\n"
    f = tmp_path / "smi.csv"
    if lane == "reference":
        p = nvidia_smi.parse_nvidia_smi_csv(f, text)
    else:
        got = fastsmi._vectorised(f, text, 0, None)
        assert got is not None
        p = got
    why = {line: reason for line, reason, _ in p.quarantine}
    assert sorted(why) == [12, 22, 32]
    assert "stated total of 143771 MiB (device_used_bytes = 150000 MiB)" in why[12]
    assert "percentage outside 0-100 (util_gpu_pct = 250)" in why[22]
    assert "more memory than any device holds" in why[32]
    df = p.frame()
    assert df["t_us"].n_unique() == 397 and df["value"].max() == 143771 * MiB
    if lane == "vectorised":
        ref = nvidia_smi.parse_nvidia_smi_csv(f, text)
        assert p.quarantine == ref.quarantine and df.rows() == ref.frame().rows()


def test_the_python_and_polars_bounds_agree() -> None:
    metrics = ["device_used_bytes", "device_total_bytes", "process_used_bytes:42", "kv_usage_ratio", "util_gpu_pct",
               "requests_running", "preemptions_total", "node_filesystem_size_bytes"]
    values = [-1e30, -1.0, -0.0, 0.0, 0.5, 1.0, 1.5, 100.0, 101.0, 80 * 1024 * MiB, 80 * 1024 * MiB + MiB,
              80 * 1024 * MiB + MiB + 1, float(16 << 40), float(16 << 40) + 1, 1e36, float("inf"), float("nan")]
    totals = [None, 80 * 1024 * MiB]
    cases = [(m, v, t) for m in metrics for v in values for t in totals]
    df = pl.DataFrame(cases, schema={"metric": pl.Utf8, "value": pl.Float64, "total": pl.Float64}, orient="row")
    vector = df.select(common.maybe_impossible(pl.col("total")))[:, 0].to_list()
    scalar = [common.impossible(m, v, t) is not None for m, v, t in cases]
    assert vector == scalar
    assert sum(scalar) > 40 and not any(s for (m, _, _), s in zip(cases, scalar, strict=True) if m.startswith("node_"))
    assert common.impossible("process_used_bytes:7", float("nan")) is None  # (nvidia-smi's unknown: no value, not damage)


def test_a_header_only_nvidia_smi_csv_is_said(tmp_path: Path) -> None:
    header = H200.read_text().splitlines()[0]
    p = nvidia_smi.parse_nvidia_smi_csv(tmp_path / "smi.csv", header + "\n")
    assert p.frame().height == 0 and [n for n in p.notes if "header and no rows" in n]
    lane = fastsmi._vectorised(tmp_path / "smi.csv", header + "\n\n", 0, None)
    assert lane is not None and [n for n in lane.notes if "header and no rows" in n]
    apps = nvidia_smi.parse_nvidia_smi_csv(tmp_path / "apps.csv", "pid, process_name, used_gpu_memory [MiB]\n")
    assert [n for n in apps.notes if "no process held GPU memory" in n]
    one = nvidia_smi.parse_nvidia_smi_csv(tmp_path / "smi.csv", "\n".join(H200.read_text().splitlines()[:2]) + "\n")
    assert not [n for n in one.notes if "no rows" in n]


HOLE = 300_000  # NULs: a log of that length truncated under a writer that kept its offset


@pytest.mark.parametrize("packed", [False, True])
def test_a_log_opening_with_a_hole_of_nuls_reads_as_its_text(packed: bool, tmp_path: Path) -> None:
    log = (DATA / "v017_v1_stats_kv_ramp.log").read_bytes()
    holed = b"\x00" * HOLE + log
    f = tmp_path / ("holed.log.gz" if packed else "holed.log")
    f.write_bytes(gzip.compress(holed) if packed else holed)
    assert nul_run(f) == HOLE
    assert read_past_nul_run(io.BytesIO(holed), 1 << 16) == (HOLE, log[:1 << 16])
    assert read_past_nul_run(io.BytesIO(holed)) == (HOLE, log)
    assert b"".join(utf8_chunks(io.BytesIO(holed), 4096, past_nul_run=True)) == log  # (as the log lane reads it)
    assert b"".join(utf8_chunks(io.BytesIO(holed), 4096)) == holed  # (unasked, bytes pass as they are)


def test_nuls_that_are_no_hole_before_text_stay_as_they_are() -> None:
    utf16be = "INFO 05-14 vLLM\n".encode("utf-16-be")
    for data in (utf16be, b"\x00" * 10_000, b"\x00" * 100 + b"\x7fELF\x00\x01\x02" + bytes(range(256)) * 4):
        assert read_past_nul_run(io.BytesIO(data), 1 << 16) == (0, data)
        assert b"".join(utf8_chunks(io.BytesIO(data), 1 << 16, past_nul_run=True)) == data
    assert read_past_nul_run(io.BytesIO(b"plain text\n")) == (0, b"plain text\n")
    marked = b"\x00\x00\xfe\xff" + "x\n".encode("utf-32-be")  # (UTF-32's mark opens with NULs)
    assert read_past_nul_run(io.BytesIO(marked), 100) == (0, marked)


def test_import_auto_on_binary_data_exits_3_as_a_named_format_does(tmp_path: Path) -> None:
    data = tmp_path / "trace.bin"
    data.write_bytes(bytes(range(256)) * 64)
    for fmt in ("auto", "mooncake", "azure"):
        with pytest.raises(ReplayError) as e:
            import_trace(fmt, data, tmp_path / "out.jsonl")
        assert e.value.exit_code == 3, (fmt, e.value.message)


def test_mooncake_rows_with_nan_or_1e20_are_quarantined_with_their_lines(tmp_path: Path) -> None:
    """Rows of the real Mooncake layout, one each with a NaN (what Python's json writes for a float that is
    no number: polars' reader refused the whole file) and a 1e20 (past any time in µs, past a count)."""
    good = [{"timestamp": t, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]} for t in (0, 27, 51, 80)]
    rows = [json.dumps(r) for r in good]
    rows.insert(1, '{"timestamp": NaN, "input_length": 6955, "output_length": 52, "hash_ids": [1]}')
    rows.insert(3, '{"timestamp": 1e20, "input_length": 6955, "output_length": 52, "hash_ids": [2]}')
    rows.insert(5, '{"timestamp": 60, "input_length": 1e20, "output_length": Infinity, "hash_ids": [3]}')
    src = tmp_path / "mooncake.jsonl"
    src.write_text("\n".join(rows) + "\n")
    for fmt in ("mooncake", "auto"):
        res = import_trace(fmt, src, tmp_path / f"out-{fmt}.jsonl")
        assert (res.format, res.rows_read, res.rows_emitted, res.quarantined) == ("mooncake", 7, 4, 3)
        assert res.quarantine_path is not None
        q = [json.loads(ln) for ln in res.quarantine_path.read_text().splitlines()]
        assert [(e["line"], e["reason"].split(";")[0]) for e in q] == [
            (2, "arrival time unparseable"), (4, "arrival time unparseable"),
            (6, "input_tokens unparseable as a count (an integer >= 0)")]
        body = [json.loads(ln) for ln in (tmp_path / f"out-{fmt}.jsonl").read_text().splitlines()[1:]]
        assert [r["t_us"] for r in body] == [0, 27_000, 51_000, 80_000]


@pytest.mark.parametrize("packed", [False, True])
def test_record_reads_a_log_after_its_hole_of_nuls(packed: bool, tmp_path: Path) -> None:
    lines = (DATA / "v017_v1_stats_kv_ramp.log").read_bytes().split(b"\n", 1)[1]  # (from its first stats line)
    (tmp_path / "plain.log").write_bytes(lines)
    holed = tmp_path / ("holed.log.gz" if packed else "holed.log")
    holed.write_bytes(gzip.compress(b"\x00" * HOLE + lines) if packed else b"\x00" * HOLE + lines)
    from replay.bundle import read_bundle
    a_rep, _ = record([tmp_path / "plain.log"], tmp_path / "a", RecordOptions(year=2025))
    b_rep, _ = record([holed], tmp_path / "b", RecordOptions(year=2025))
    a, b = read_bundle(tmp_path / "a"), read_bundle(tmp_path / "b")
    assert b.samples.height == a.samples.height > 0 and b.samples.equals(a.samples)
    assert (b_rep[0].parsed, b_rep[0].quarantined) == (a_rep[0].parsed, a_rep[0].quarantined) == (5, 0)
    assert any(f"{HOLE:,} NUL bytes, skipped" in n for n in b_rep[0].notes)


_BOUNDED = ["device_used_bytes", "device_total_bytes", "device_free_bytes", "device_reserved_bytes", "process_used_bytes:42",
            "anon_rss_bytes", "kv_usage_ratio", "util_gpu_pct", "requests_running", "node_filesystem_size_bytes"]
_EDGES = [-1.0, -0.0, 0.0, 0.5, 1.0, 1.5, 100.0, 101.0, 80 * 1024 * MiB, 80 * 1024 * MiB + MiB, 80 * 1024 * MiB + MiB + 1,
          float(16 << 40), float(16 << 40) + 1, 1e36]
_VALUES = st.one_of(st.sampled_from(_EDGES), st.floats(-1e3, 2e13), st.floats())


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([*_BOUNDED, None]), _VALUES, _VALUES, st.one_of(st.none(), st.sampled_from(_EDGES[2:]), st.floats(0, 2e13)))
def test_bounds_told_by_a_metrics_least_and_largest_value_vouch_for_no_impossible_value(
        metric: str | None, lo: float, hi: float, least_total: float | None) -> None:
    """GIVEN a metric's least and largest value and the least total stated of any GPU WHEN ``within_bounds``
    vouches for them THEN ``impossible`` refuses no value between them, on a GPU of any total not below
    the least (or of none)."""
    lo, hi = min(lo, hi), max(lo, hi)
    if not common.within_bounds(metric, lo, hi, least_total):
        return
    totals = [None] if least_total is None else [None, least_total, least_total + MiB, 2 * least_total, float(16 << 40)]
    for v in (lo, hi, (lo + hi) / 2):
        for total in totals:
            assert metric is None or common.impossible(metric, v, total) is None, (v, total)


_SAMPLES = st.lists(st.tuples(st.sampled_from([None, 1_000_000, 2_000_000]), st.sampled_from([None, 0, 1, 2]),
                              st.sampled_from(["nvidia-smi", "dcgm", "dcgm[GPU_I_ID=3]", "dcgm[Hostname=b]", "vllm"]),
                              st.sampled_from(_BOUNDED), _VALUES), max_size=30)


@settings(max_examples=300, deadline=None)
@given(_SAMPLES, _SAMPLES, st.dictionaries(st.sampled_from([0, 1, 2]), st.sampled_from([80 * 1024 * MiB, 1.0, "?"]), max_size=3))
def test_the_cheap_checks_of_values_and_keys_change_nothing(frame: list[tuple], listed: list[tuple],
                                                            totals: dict[int, float | str]) -> None:
    """GIVEN samples as a frame and as a list (impossible values, NaN and infinities, GPUs with and
    without stated totals, MIG instances and other machines, one key twice with one value or two) WHEN
    their values are checked with the cheap checks (each metric's least and largest value; each key's
    hash once) and with each row tested THEN both set aside, keep and note the same."""
    def checked(cheap: bool) -> common.Parsed:
        p = common.Parsed(kind="test", samples=list(listed), gpus={g: {"index": g, "total_bytes": t} for g, t in totals.items()},
                          frames=[pl.DataFrame(frame, schema=SAMPLES_SCHEMA, orient="row")] if frame else [],
                          dcgm_labels=[(i, {"pod": str(i)}) for i in range(len(listed))])
        with pytest.MonkeyPatch.context() as mp:
            if not cheap:
                mp.setattr(common, "_all_within_bounds", lambda *a: False)
                mp.setattr(common, "_keys_once", lambda *a: False)
            return common.set_aside_impossible_values(p, Path("evidence.prom"))
    cheap, each = checked(True), checked(False)
    assert (cheap.quarantine, cheap.notes, cheap.dcgm_labels) == (each.quarantine, each.notes, each.dcgm_labels)
    assert cheap.frame().equals(each.frame())
