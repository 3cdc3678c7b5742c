"""The recorder on nvidia-smi evidence: the query CSV, the default table, -q and -x, dmon and pmon, MIG."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from replay.bundle import Bundle, read_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA


def test_a_unified_memory_gpu_says_it_has_no_memory_of_its_own(tmp_path: Path) -> None:
    """GIVEN DGX Spark's nvidia-smi (GB10, driver 580): its table's Memory-Usage 'Not Supported'
    (snowflakedb/ArcticTraining PR 345), and a --query-gpu CSV whose header opens with memory.total and
    whose memory cells are '[N/A]' (XuehaiPan/nvitop PR 208) THEN the CSV's header is read as one (its two
    lines were quarantined as headerless), no memory sample is made up, and each file notes that nvidia-smi
    states no memory for the GPU, and where its memory is."""
    (tmp_path / "smi.txt").write_text(
        "+-----------------------------------------------------------------------------------------+\n"
        "| NVIDIA-SMI 580.126.09             Driver Version: 580.126.09     CUDA Version: 13.0     |\n"
        "+-----------------------------------------+------------------------+----------------------+\n"
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n"
        "|                                         |                        |               MIG M. |\n"
        "|=========================================+========================+======================|\n"
        "|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |\n"
        "| N/A   36C    P8              3W /  N/A  | Not Supported          |      0%      Default |\n"
        "|                                         |                        |                  N/A |\n"
        "+-----------------------------------------+------------------------+----------------------+\n")
    (tmp_path / "q.csv").write_text("memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
                                    "power.draw [W], temperature.gpu\n[N/A], [N/A], [N/A], 0 %, 11.17 W, 35\n")
    record([tmp_path / "smi.txt", tmp_path / "q.csv"], tmp_path / "b", RecordOptions(at="2026-01-27T10:15:02Z"))
    b = read_bundle(tmp_path / "b")
    assert [(Path(f["path"]).name, f["parsed"], f["quarantined"]) for f in b.meta.inputs] == [("smi.txt", 11, 0),
                                                                                              ("q.csv", 2, 0)]
    assert b.samples.filter(pl.col("metric").cast(pl.Utf8).str.starts_with("device_")).height == 0
    assert b.samples.filter(pl.col("metric") == "util_gpu_pct")["value"].to_list() == [0.0]
    said = [n for n in b.meta.notes if "states no memory for GPU 0" in n]
    assert [n.split(":")[0] for n in said] == ["smi.txt", "q.csv"] and "(NVIDIA GB10)" in said[0]
    assert all("/proc/meminfo" in n for n in said)


def test_nvidia_smi_headerless_needs_columns(tmp_path: Path) -> None:
    f = DATA / "a100_query_gpu_timestamped_noheader.csv"
    out = tmp_path / "b"
    reps, _ = record([f], out, RecordOptions())
    assert reps[0].quarantined == reps[0].lines  # nothing silently parsed with guessed columns
    assert any("--nvsmi-columns" in n and f"{reps[0].lines} rows" in n for n in reps[0].notes)  # and the user is told how
    cols = ("timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, temperature.gpu, "
            "utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], memory.used [MiB]")
    reps, _ = record([f], out, RecordOptions(nvsmi_columns=cols, tz_offset_s=7200))
    b = read_bundle(out)
    used = b.samples.filter(b.samples["metric"] == "device_used_bytes")
    n_rows = sum(1 for x in f.read_text().splitlines() if x.strip())
    assert used.height == n_rows and reps[0].quarantined == 0
    assert sorted({g["index"] for g in b.meta.gpus}) == [0, 1, 2]
    assert b.meta.gpus[0]["total_bytes"] == 40960 * 2**20
    # no index column: GPUs are numbered as nvidia-smi numbers them, in PCI bus order (the poll lists
    # 3B, 8B, 0B first)
    assert [(g["index"], g["pci_bus_id"]) for g in sorted(b.meta.gpus, key=lambda g: g["index"])] == [
        (0, "00000000:0B:00.0"), (1, "00000000:3B:00.0"), (2, "00000000:8B:00.0")]
    first = used.sort("t_us").row(0, named=True)
    assert first["gpu"] == 1 and first["value"] == 4 * 2**20  # line 1: bus 3B, 4 MiB used
    assert b.meta.t0_utc == "2024-06-01T09:27:05.177000Z"  # local +02:00 -> UTC


def test_nvidia_smi_nounits_rows_with_a_typed_column_list_are_mib(tmp_path: Path) -> None:
    """GIVEN the real P100 `--format=csv,nounits` row without its header line, and the column list typed
    for --nvsmi-columns without nvidia-smi's '[MiB]' WHEN recorded THEN the row is taken for nvidia-smi's
    (it has the list's fields; it was 'unknown') and memory is read in MiB as with the header (a bare
    number was read as bytes: 16280 MiB free became 16 KB)."""
    src = DATA / "tesla_p100_query_gpu_nounits.csv"
    header, row = src.read_text().splitlines()[:2]
    bare = tmp_path / "p100_noheader.csv"
    bare.write_text(row + "\n")
    typed = ", ".join(h.split(" [")[0] for h in header.split(", "))
    kw = {"at": "2025-05-01T10:00:00Z"}
    record([src], tmp_path / "a", RecordOptions(**kw))  # type: ignore[arg-type]
    record([bare], tmp_path / "b", RecordOptions(nvsmi_columns=typed, **kw))  # type: ignore[arg-type]
    got = [read_bundle(tmp_path / d).samples.sort("metric").select("metric", "value").rows() for d in ("a", "b")]
    assert got[0] == got[1] and ("device_free_bytes", 16280.0 * 2**20) in got[1]


def test_nvidia_smi_of_another_machine_is_a_series_of_its_own(tmp_path: Path) -> None:
    """GIVEN the real P100 snapshot and the same query from another machine (its GPU 0 has another
    UUID), and a second capture from the first machine WHEN recorded together THEN the other machine's
    samples are a series of their own, its GPU stays out of bundle.json's, and a note says why; the
    same machine's second capture is not set apart (GPU 0 of two machines was one series)."""
    src = DATA / "tesla_p100_query_gpu_nounits.csv"
    text = src.read_text()
    other, again = tmp_path / "node2.csv", tmp_path / "node1_again.csv"
    other.write_text(text.replace("GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6", "GPU-00000000-1111-2222-3333-444444444444"))
    again.write_text(text.replace(", 103, 0, 16280,", ", 103, 5, 16275,"))  # (a later capture: 5 MiB used)
    assert again.read_text() != text
    reps, _ = record([src, other, again], tmp_path / "b", RecordOptions(at="2025-05-01T10:00:00Z"))
    b = read_bundle(tmp_path / "b")
    used = b.samples.filter(pl.col("metric") == "device_used_bytes")
    assert sorted(used["source"].to_list()) == ["nvidia-smi", "nvidia-smi", "nvidia-smi[node2.csv]"]
    assert [g["uuid"] for g in b.meta.gpus] == ["GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"]
    assert any("another machine's GPUs (GPU 0 is GPU-00000000" in n for n in reps[1].notes)
    assert not any("another machine" in n for n in reps[0].notes + reps[2].notes)


def test_nvidia_smi_snapshot_without_times_is_placed_by_at(tmp_path: Path) -> None:
    """A one-off `nvidia-smi --query-gpu ... --format=csv` (no timestamp field) is placed at --at or a
    time in its file name, and says so; without either it says how to place it; a loop without times
    is not placed (one time for many rows would be invented)."""
    src = DATA / "tesla_p100_query_gpu_nounits.csv"
    reps, meta = record([src], tmp_path / "a", RecordOptions())
    assert read_bundle(tmp_path / "a").samples.height == 0 and any("pass --at" in n for n in reps[0].notes)
    reps, meta = record([src], tmp_path / "b", RecordOptions(at="2025-05-01T10:00:00Z"))
    b = read_bundle(tmp_path / "b")
    assert b.samples.height == 5 and b.samples["t_us"].to_list() == [0] * 5
    assert b.meta.t0_utc.startswith("2025-05-01T10:00:00")
    assert any("placed at its time from --at" in n for n in reps[0].notes)
    used = b.samples.filter(b.samples["metric"] == "device_used_bytes")["value"].to_list()
    assert used == [0.0]  # the P100's memory.used of 0 MiB, a real zero, not unknown
    named = tmp_path / "smi_2025-05-01T11:30:00Z.csv"
    named.write_bytes(src.read_bytes())
    record([named], tmp_path / "c", RecordOptions())
    assert read_bundle(tmp_path / "c").meta.t0_utc.startswith("2025-05-01T11:30:00")
    loop = tmp_path / "loop.csv"
    lines = src.read_text().splitlines()
    loop.write_text("\n".join([lines[0], lines[1], lines[1]]) + "\n")
    reps, _ = record([loop], tmp_path / "d", RecordOptions(at="2025-05-01T10:00:00Z"))
    assert read_bundle(tmp_path / "d").samples.height == 0 and any("a loop" in n for n in reps[0].notes)


def _mib(n: int) -> float:
    return float(n * 2**20)


def test_nvidia_smi_default_table_three_driver_generations(tmp_path: Path) -> None:
    """The plain `nvidia-smi` table, the evidence most often pasted after an OOM, from drivers 440, 460
    and 590: per GPU used and total memory, per process its memory, each at the time line above it
    (host local time, --tz applies); a table without one is placed by --at."""
    reps, _ = record([DATA / "h200_default_table_load.txt"], tmp_path / "h200", RecordOptions())
    assert (reps[0].kind, reps[0].lines, reps[0].parsed, reps[0].quarantined) == ("nvidia-smi-table", 22, 22, 0)
    b = read_bundle(tmp_path / "h200")
    assert b.meta.t0_utc.startswith("2026-07-03T22:11:09")
    got = {(r["gpu"], r["metric"]): r["value"] for r in b.samples.iter_rows(named=True)}
    assert got == {(0, "device_used_bytes"): _mib(32362), (0, "device_total_bytes"): _mib(143771),
                   (0, "process_used_bytes:10291"): _mib(2566), (0, "process_used_bytes:10293"): _mib(1542),
                   (0, "process_used_bytes:10309"): _mib(28234)}  # the same as its --query-compute-apps CSV
    assert b.meta.gpus[0]["name"] == "NVIDIA H200" and b.meta.gpus[0]["total_bytes"] == 143771 * 2**20

    record([DATA / "nvidia_smi_table_460_v100.txt"], tmp_path / "v100", RecordOptions(tz_offset_s=3600))
    b = read_bundle(tmp_path / "v100")
    assert b.meta.t0_utc.startswith("2022-01-11T07:58:05")  # 08:58:05 at UTC+1
    assert {r["metric"]: r["value"] for r in b.samples.iter_rows(named=True)} == {
        "device_used_bytes": _mib(2631), "device_total_bytes": _mib(16160), "process_used_bytes:3721": _mib(2629)}

    reps, _ = record([DATA / "nvidia_smi_table_440_2gpu.txt"], tmp_path / "two", RecordOptions(at="2020-06-01T12:00:00Z"))
    b = read_bundle(tmp_path / "two")
    assert reps[0].quarantined == 0 and any("from --at" in n for n in reps[0].notes)
    got = {(r["gpu"], r["metric"]): r["value"] for r in b.samples.iter_rows(named=True)}
    assert got == {(0, "device_used_bytes"): _mib(15431), (0, "device_total_bytes"): _mib(16160),
                   (1, "device_used_bytes"): 0.0, (1, "device_total_bytes"): _mib(16160),
                   (0, "process_used_bytes:152871"): _mib(15419)}


def test_nvidia_smi_tables_repeated_by_a_loop_are_a_series(tmp_path: Path) -> None:
    """`nvidia-smi -l 1 > smi.txt` or `watch`: each table at its own time."""
    one = (DATA / "nvidia_smi_table_460_v100.txt").read_text()
    later = one.replace("Tue Jan 11 08:58:05 2022", "Tue Jan 11 08:58:06 2022").replace("2631MiB", "9000MiB")
    log = tmp_path / "smi-loop.txt"
    log.write_text(one + later)
    record([log], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us")
    assert s["t_us"].to_list() == [0, 1_000_000] and s["value"].to_list() == [_mib(2631), _mib(9000)]


def test_nvidia_smi_q_memory_block(tmp_path: Path) -> None:
    """`nvidia-smi -q -d MEMORY`: Total, Reserved, Used, Free of the framebuffer (Used excludes the
    driver's Reserved: the three add up to Total, to rounding)."""
    reps, _ = record([DATA / "h200_q_memory_block_load.txt"], tmp_path / "b", RecordOptions(at="2026-07-03T22:11:09Z"))
    assert (reps[0].kind, reps[0].quarantined) == ("nvidia-smi-q", 0)
    got = {r["metric"]: r["value"] for r in read_bundle(tmp_path / "b").samples.iter_rows(named=True)}
    assert got == {"device_total_bytes": _mib(143771), "device_reserved_bytes": _mib(614),
                   "device_used_bytes": _mib(32362), "device_free_bytes": _mib(110796)}
    assert abs(got["device_reserved_bytes"] + got["device_used_bytes"] + got["device_free_bytes"]
               - got["device_total_bytes"]) <= _mib(1)


def test_nvidia_smi_q_whole_report_two_gpus(tmp_path: Path) -> None:
    """A whole `nvidia-smi -q` report (its layout around the real H200 memory block): the Timestamp
    line places it, GPU sections are numbered in order, and each process's used memory is kept."""
    block = (DATA / "h200_q_memory_block_load.txt").read_text()
    gpu = ("GPU 00000000:{bus}:00.0\n    Product Name                          : NVIDIA H200\n" + block +
           "    Processes\n        GPU instance ID                   : N/A\n        Compute instance ID               : N/A\n"
           "        Process ID                        : {pid}\n            Type                          : C\n"
           "            Name                          : python3\n            Used GPU Memory               : 2566 MiB\n")
    report = ("\n==============NVSMI LOG==============\n\nTimestamp                                 : Fri Jul  3 22:11:09 2026\n"
              "Driver Version                            : 590.48.01\n\nAttached GPUs                             : 2\n"
              + gpu.format(bus="83", pid=10291) + gpu.format(bus="84", pid=10292))
    src = tmp_path / "smi-q.txt"
    src.write_text(report)
    reps, _ = record([src], tmp_path / "b", RecordOptions())
    assert (reps[0].kind, reps[0].quarantined) == ("nvidia-smi-q", 0)
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc.startswith("2026-07-03T22:11:09") and [g["pci_bus_id"] for g in b.meta.gpus] == [
        "00000000:83:00.0", "00000000:84:00.0"]
    got = {(r["gpu"], r["metric"]): r["value"] for r in b.samples.iter_rows(named=True)}
    assert got[(1, "device_reserved_bytes")] == _mib(614) and got[(0, "process_used_bytes:10291")] == _mib(2566)
    assert got[(1, "process_used_bytes:10292")] == _mib(2566) and len(got) == 10


def test_nvidia_smi_q_x_xml_every_interval(tmp_path: Path) -> None:
    """GIVEN `nvidia-smi -q -x -l 5` (an XML document per interval; the real H200 block's figures) cut
    short in its third document WHEN recorded THEN each document's GPUs give their framebuffer figures
    and each process its memory at the document's timestamp, the GPUs keep their name, UUID and bus,
    and every line of the cut document is quarantined with its number."""
    def doc(stamp: str, used: int) -> str:
        return (f'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<nvidia_smi_log>\n'
                f"\t<timestamp>{stamp}</timestamp>\n\t<driver_version>590.48.01</driver_version>\n"
                '\t<gpu id="00000000:83:00.0">\n\t\t<product_name>NVIDIA H200</product_name>\n'
                "\t\t<uuid>GPU-5a7c2f7e-0d1b-4a5e-9f3c-2b8d6e4f1a09</uuid>\n\t\t<fb_memory_usage>\n"
                f"\t\t\t<total>143771 MiB</total>\n\t\t\t<reserved>614 MiB</reserved>\n\t\t\t<used>{used} MiB</used>\n"
                f"\t\t\t<free>{143771 - 614 - used} MiB</free>\n\t\t</fb_memory_usage>\n\t\t<processes>\n"
                "\t\t\t<process_info>\n\t\t\t\t<pid>10291</pid>\n\t\t\t\t<type>C</type>\n"
                f"\t\t\t\t<used_memory>{used - 2} MiB</used_memory>\n\t\t\t</process_info>\n\t\t</processes>\n"
                "\t</gpu>\n</nvidia_smi_log>\n")
    third = doc("Fri Jul  3 22:11:19 2026", 33000)
    text = doc("Fri Jul  3 22:11:09 2026", 32362) + doc("Fri Jul  3 22:11:14 2026", 32900) + third[:third.index("<free>")]
    src = tmp_path / "smi.xml"
    src.write_text(text)
    reps, _ = record([src], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    cut_at = text.count("\n", 0, text.index("<nvidia_smi_log>", len(text) - len(third))) + 1
    assert reps[0].kind == "nvidia-smi-q" and reps[0].quarantined == len(text.split("\n")) - cut_at + 1 == 11
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert q[0]["line"] == cut_at and [x["line"] for x in q] == list(range(cut_at, cut_at + len(q)))
    assert b.meta.t0_utc.startswith("2026-07-03T22:11:09") and b.meta.gpus[0]["uuid"].startswith("GPU-5a7c")
    assert b.meta.gpus[0]["name"] == "NVIDIA H200" and b.meta.gpus[0]["total_bytes"] == _mib(143771)
    used = b.samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us")
    assert used["t_us"].to_list() == [0, 5_000_000] and used["value"].to_list() == [_mib(32362), _mib(32900)]
    assert b.samples.filter(pl.col("metric") == "process_used_bytes:10291")["value"].to_list() == [_mib(32360), _mib(32898)]


def test_dmon_row_under_another_listings_header_is_quarantined(tmp_path: Path) -> None:
    """A dmon file where a listing without -o DT follows one with it (its rows under the first
    header) quarantines the rows that do not fit, with their lines (a date in the GPU column raised
    ValueError)."""
    src = tmp_path / "dmon.txt"
    src.write_text("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk     fb   bar1\n"
                   "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz     MB     MB\n"
                   "    0    120     45     40     90     60      0      0      0      0   2619   1980  80000      5\n"
                   "2024/06/01 10:00:00   0   120     45     40     90     60      0      0      0      0   2619  80000\n")
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-06-01T10:00:00Z"))
    assert reps[0].kind == "nvidia-smi-dmon" and reps[0].quarantined >= 1


def test_pmon_rows_are_processes_not_gpus(tmp_path: Path) -> None:
    """`nvidia-smi pmon`: a row is a process, so its fb column is that process's memory, never the GPU's
    used memory (three processes on GPU 0 used to overwrite device_used_bytes in turn); a pmon
    without fb (the real H200 capture) says it holds no memory figures."""
    reps, _ = record([DATA / "h200_pmon_load.txt"], tmp_path / "a", RecordOptions())
    assert reps[0].kind == "nvidia-smi-pmon" and reps[0].quarantined == 0 and any("no memory figures" in n for n in reps[0].notes)
    assert read_bundle(tmp_path / "a").samples.height == 0
    log = tmp_path / "pmon.txt"  # `nvidia-smi pmon -s um -o DT` layout (driver 5xx): date, time, then the columns
    log.write_text(
        "#Date       Time        gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   ccpm    command \n"
        "#YYYYMMDD   HH:MM:SS    Idx           #    C/G      %      %      %      %      %      %     MB     MB    name \n"
        " 20260703   22:11:09      0      10291     C      -      -      -      -      -      -   2566      0    memhog  \n"
        " 20260703   22:11:09      0      10309     C     99      7      -      -      -      -  28234      0    gpu_burn \n"
        " 20260703   22:11:09      1          -     -      -      -      -      -      -      -      -      -    -        \n"
        " 20260703   22:11:10      0      10291     C      -      -      -      -      -      -   2600      0    memhog  \n")
    reps, _ = record([log], tmp_path / "b", RecordOptions(tz_offset_s=7200))
    b = read_bundle(tmp_path / "b")
    assert reps[0].quarantined == 0 and b.meta.t0_utc.startswith("2026-07-03T20:11:09")  # 22:11:09 at UTC+2
    rows = sorted((r["t_us"], r["gpu"], r["metric"], r["value"]) for r in b.samples.iter_rows(named=True))
    assert rows == [(0, 0, "process_used_bytes:10291", _mib(2566)), (0, 0, "process_used_bytes:10309", _mib(28234)),
                    (1_000_000, 0, "process_used_bytes:10291", _mib(2600))]


def test_dmon_with_date_and_time_is_recognised_and_placed(tmp_path: Path) -> None:
    """`nvidia-smi dmon -s m -o DT` begins '#Date Time gpu': it used to be 'unknown' and quarantined whole."""
    log = tmp_path / "dmon.txt"
    log.write_text("#Date       Time        gpu     fb   bar1   ccpm \n#YYYYMMDD   HH:MM:SS    Idx     MB     MB     MB \n"
                   " 20260703   22:11:09      0  32362      2      0 \n 20260703   22:11:10      0  33000      2      0 \n")
    reps, _ = record([log], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples.sort("t_us")
    assert reps[0].kind == "nvidia-smi-dmon" and s["value"].to_list() == [_mib(32362), _mib(33000)]
    assert s["t_us"].to_list() == [0, 1_000_000] and set(s["metric"]) == {"device_used_bytes"}


@pytest.mark.parametrize("cell", [". MiB", "1.2.3 MiB", "12x MiB", "9" * 400 + " MiB"])
def test_nvidia_smi_memory_value_that_is_no_number_is_quarantined_with_its_line(cell: str, tmp_path: Path) -> None:
    """A memory cell damaged on its way here ('.', '1.2.3'): its row goes to the quarantine with the
    field named, the rows around it are read as before, and nvidia-smi's own bracketed markers still
    only leave a value out. The number pattern took '.' for a number and ended the record with an
    internal error."""
    head = "timestamp, index, memory.used [MiB], memory.total [MiB], memory.reserved [MiB]\n"
    rows = ["2025/05/01 10:00:00.000, 0, 1200 MiB, 81559 MiB, [N/A]", f"2025/05/01 10:00:01.000, 0, {cell}, 81559 MiB, [N/A]",
            "2025/05/01 10:00:02.000, 0, [Unknown Error], 81559 MiB, 0 MiB", "2025/05/01 10:00:03.000, 0, 1300 MiB, 81559 MiB, 0 MiB",
            "2025/05/01 10:00:04.000, 0, N/A, 81559 MiB, -"]  # (N/A unbracketed, as some drivers write it)
    src = tmp_path / "smi.csv"
    src.write_text(head + "\n".join(rows) + "\n")
    reports, _ = record([src], tmp_path / "b", RecordOptions())
    assert (reports[0].kind, reports[0].parsed, reports[0].quarantined) == ("nvidia-smi", 5, 1)
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in q] == [(3, f"memory.used: {cell!r} is not a number")]
    used = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    assert used["value"].to_list() == [1200 * 2**20, 1300 * 2**20]


def test_nvidia_smi_total_of_hundreds_of_digits_is_quarantined_not_an_internal_error(tmp_path: Path) -> None:
    """A memory.total cell of 400 digits is no memory (float() makes it infinite): its row goes to the
    quarantine, where taking it as the GPU's total ended the record with an OverflowError."""
    src = tmp_path / "smi.csv"
    src.write_text("timestamp, name, memory.total [MiB], memory.used [MiB]\n"
                   f"2025/05/01 10:00:00.000, NVIDIA H100, {'9' * 400} MiB, 100 MiB\n"
                   "2025/05/01 10:00:01.000, NVIDIA H100, 81559 MiB, 200 MiB\n")
    reports, _ = record([src], tmp_path / "b", RecordOptions())
    assert (reports[0].parsed, reports[0].quarantined) == (2, 1)  # (the header line and the good row; the bad one)
    q = json.loads((tmp_path / "b" / "quarantine.jsonl").read_text())
    assert (q["line"], q["reason"]) == (2, f"memory.total: {'9' * 400 + ' MiB'!r} is not a number")
    assert read_bundle(tmp_path / "b").meta.gpus[0]["total_bytes"] == 81559 * 2**20


def test_mig_instances_of_one_gpu_are_series_of_their_own(tmp_path: Path) -> None:
    """GIVEN a real DCGM scrape of A30s split into MIG instances (a framebuffer series per GPU_I_ID)
    WHEN recorded THEN each instance of a split GPU is a series of its own, none the bundle's device
    memory until --gpu-instance names the one vLLM ran in (as an instance of any GPU, or GPU:ID), and
    the GPUs keep their names and UUIDs; a bundle of instances alone says to choose one."""
    from replay.analysis.pipeline import analyze_bundle
    src = DATA / "dcgm_a30_mig_instances.prom"
    at = "2025-08-01T10:00:00Z"

    def sources(**kw: object) -> tuple[dict[tuple[int, str], int], list[str], Bundle]:
        out = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        reps, _ = record([src], out, RecordOptions(at=at, **kw))  # type: ignore[arg-type]
        b = read_bundle(out)
        got = b.samples.group_by("gpu", "source").len().rows()
        return {(g, s): n for g, s, n in got}, reps[0].notes, b

    split = {(g, f"dcgm[GPU_I_ID={i}]"): 1 for g, ids in ((0, "3456"), (1, "34")) for i in ids}
    got, notes, b = sources()
    assert got == split
    assert [(g["index"], g["uuid"], g["name"]) for g in b.meta.gpus] == [
        (0, "GPU-265c9814-6156-355b-e589-ff2064894f16", "NVIDIA A30"), (1, "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49", "NVIDIA A30")]
    assert any("GPU 0 is split into MIG instances (GPU_I_ID 3, 4, 5, 6)" in n and "--gpu-instance" in n for n in notes)
    found = {f.id: f for f in analyze_bundle(b).findings}
    assert "--gpu-instance" in found["evidence:mig"].detail and "evidence:machines" not in found
    from replay.report.html import render
    from replay.report.postmortem import render_postmortem
    summary = render_postmortem(b.path).split("## Impact")[0]
    assert "several MIG instances, 6 series" in summary and "--gpu-instance ID" in summary and "--host" not in summary
    assert "device memory of several MIG instances (6 series), none chosen; record with --gpu-instance ID" in render([analyze_bundle(b)])
    got, notes, _ = sources(gpu_instance="4")  # instance 4 of each split GPU
    assert got == {**{k: n for k, n in split.items() if "=4]" not in k[1]}, (0, "dcgm"): 1, (1, "dcgm"): 1}
    assert any("instance 4's is the bundle's device memory" in n for n in notes)
    got, _, b = sources(gpu_instance="1:3")  # GPU 1's instance 3 only
    assert got == {**{k: n for k, n in split.items() if k != (1, "dcgm[GPU_I_ID=3]")}, (1, "dcgm"): 1}
    assert "evidence:mig" not in {f.id for f in analyze_bundle(b).findings}
    got, notes, _ = sources(gpu_instance="9")
    assert got == split and any("none is --gpu-instance 9" in n for n in notes)


def test_nvidia_smi_table_mig_devices_are_series_of_their_own(tmp_path: Path) -> None:
    """GIVEN the default nvidia-smi table of a GPU split by MIG, with its 'MIG devices:' part (real
    rows) WHEN recorded THEN each instance's Memory-Usage is a series of its own (used and total), its
    BAR1-Usage row is no memory, and the GPU's own row stays the device memory."""
    reps, _ = record([DATA / "nvidia_smi_table_a100_mig_devices.txt"], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples
    mig = s.filter(pl.col("source").cast(pl.Utf8).str.starts_with("nvidia-smi[")).sort("source", "metric")
    assert mig.select("gpu", "source", "metric", "value").rows() == [
        (1, f"nvidia-smi[GPU_I_ID={gi}]", m, v * 2**20) for gi, used in (("3", 14366), ("5", 9826), ("6", 13))
        for m, v in (("device_total_bytes", 19968), ("device_used_bytes", used))]
    whole = s.filter((pl.col("source") == "nvidia-smi") & (pl.col("metric") == "device_used_bytes")).sort("gpu")
    assert whole.select("gpu", "value").rows() == [(0, 0.0), (1, 24205 * 2**20)]
    assert reps[0].quarantined == 0 and any("GPU 1 is split into MIG instances (GPU_I_ID 3, 5, 6)" in n for n in reps[0].notes)


def test_another_machines_mig_instances_are_its_own_series(tmp_path: Path) -> None:
    """GIVEN the MIG table fixture and the same table of another machine (its GPUs on other PCI buses,
    its instance 3 at other figures) WHEN recorded together THEN the other machine's instances are
    series of their own, tagged with its file as its whole GPUs' are: under the same name the two
    machines' instance 3 was one series, with two values at one time."""
    table = (DATA / "nvidia_smi_table_a100_mig_devices.txt").read_text()
    other = tmp_path / "smi-b.txt"
    other.write_text(table.replace("00000000:5A:00.0", "00000000:1B:00.0").replace("00000000:54:00.0", "00000000:1A:00.0")
                     .replace("14366MiB / 19968MiB", "17000MiB / 19968MiB"))
    reps, _ = record([DATA / "nvidia_smi_table_a100_mig_devices.txt", other], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    three = s.filter(pl.col("source").cast(pl.Utf8).str.contains("GPU_I_ID=3", literal=True)).sort("source")
    assert three.select("source", "value").rows() == [("nvidia-smi[GPU_I_ID=3]", 14366 * 2**20),
                                                      ("nvidia-smi[GPU_I_ID=3][smi-b.txt]", 17000 * 2**20)]
    assert set(s["source"]) == {"nvidia-smi", "nvidia-smi[smi-b.txt]", *(f"nvidia-smi[GPU_I_ID={g}]{f}" for g in "356"
                                                                          for f in ("", "[smi-b.txt]"))}
    assert any("another machine's GPUs" in n for n in reps[1].notes)


def test_nvidia_smi_q_and_xml_mig_devices_are_series_of_their_own(tmp_path: Path) -> None:
    """GIVEN nvidia-smi -q, as text and as -x XML, of a GPU split into two MIG instances (written here in
    -q's layout and -x's element names, 'MIG Devices' / mig_devices/mig_device, with the figures of the
    MIG table fixture) WHEN recorded THEN each instance's FB memory is a series of its own and the GPU's
    own FB block stays the device memory (the instances' blocks were read as the GPU's: three used
    values for one GPU at one time)."""
    inst = [("3", 19968, 14366), ("5", 19968, 9826)]
    q = ["Timestamp                                 : Tue Apr 26 15:29:49 2022", "GPU 00000000:5A:00.0",
         "    Product Name                          : NVIDIA A100-SXM4-80GB", "    MIG Devices"]
    for k, (gi, total, used) in enumerate(inst):
        q += ["        MIG Device", f"            Index                         : {k}",
              f"            GPU Instance ID               : {gi}", "            Compute Instance ID           : 0",
              "            FB Memory Usage", f"                Total                     : {total} MiB",
              "                Reserved                  : 0 MiB", f"                Used                      : {used} MiB",
              f"                Free                      : {total - used} MiB", "            BAR1 Memory Usage",
              "                Total                     : 32767 MiB", "                Used                      : 4 MiB"]
    q += ["    FB Memory Usage", "        Total                             : 81920 MiB",
          "        Reserved                          : 0 MiB", "        Used                              : 24205 MiB",
          "        Free                              : 57715 MiB"]
    migs = "".join(f"<mig_device><index>{k}</index><gpu_instance_id>{gi}</gpu_instance_id><compute_instance_id>0"
                   f"</compute_instance_id><fb_memory_usage><total>{total} MiB</total><reserved>0 MiB</reserved><used>"
                   f"{used} MiB</used><free>{total - used} MiB</free></fb_memory_usage><bar1_memory_usage><total>32767 MiB"
                   "</total><used>4 MiB</used></bar1_memory_usage></mig_device>" for k, (gi, total, used) in enumerate(inst))
    xml = ('<?xml version="1.0" ?><nvidia_smi_log><timestamp>Tue Apr 26 15:29:49 2022</timestamp><gpu id="00000000:5A:00.0">'
           f"<product_name>NVIDIA A100-SXM4-80GB</product_name><mig_devices>{migs}</mig_devices><fb_memory_usage><total>81920 MiB"
           "</total><reserved>0 MiB</reserved><used>24205 MiB</used><free>57715 MiB</free></fb_memory_usage></gpu></nvidia_smi_log>")
    for name, text in (("q.txt", "\n".join(q) + "\n"), ("q.xml", xml)):
        (tmp_path / name).write_text(text)
        reps, _ = record([tmp_path / name], tmp_path / name.replace(".", "_"), RecordOptions())
        s = read_bundle(tmp_path / name.replace(".", "_")).samples.filter(pl.col("metric") == "device_used_bytes")
        assert sorted(s.select("gpu", "source", "value").rows()) == [
            (0, "nvidia-smi", 24205 * 2**20), (0, "nvidia-smi[GPU_I_ID=3]", 14366 * 2**20),
            (0, "nvidia-smi[GPU_I_ID=5]", 9826 * 2**20)], name
        assert any("GPU 0 is split into MIG instances (GPU_I_ID 3, 5)" in n for n in reps[0].notes), name
