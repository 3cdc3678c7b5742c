"""The recorder on DCGM evidence: the exporter's hosts, pods and MIG instances, dcgmi dmon, its fields file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import read_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA, shared


def _dcgm_labels() -> dict[str, str]:
    """The labels of a real DCGM series as Prometheus stores it (GPU Operator: Hostname, instance, job,
    driver version added), from dcgm-exporter issue 277."""
    line = shared("evidence/dcgm/scrape_after_prometheus_labels.txt").read_text().strip()
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def test_a_gpu_two_pods_share_is_one_series_and_a_finding(tmp_path: Path) -> None:
    """GIVEN a real DCGM scrape of one A100 shared through MPS by a vLLM pod and another tenant's, the
    device's framebuffer series repeated under each pod's labels THEN it is one sample (it was two
    device samples, plus a 'pod_used_bytes' series per pod claiming the whole GPU's memory for each),
    the GPU names both pods as sharing it, and the analysis says so."""
    from replay.analysis.pipeline import analyze_bundle
    reps, _ = record([DATA / "scrape_a100_mps_vllm_pod.prom"], tmp_path / "b", RecordOptions(at="2025-08-15T10:00:00Z"))
    b = read_bundle(tmp_path / "b")
    assert b.samples.select("gpu", "source", "metric", "value").rows() == [(0, "dcgm", "device_used_bytes", 15866 * 2**20)]
    pods = ["default/gpu-burn-deployment-1-85dc8ff699-clvh5", "vllm-inference/vllm-medgemma-4b-it-d599b4c99-f95nk"]
    assert [(g["index"], g["pods"], g["shared_by"]) for g in b.meta.gpus] == [(0, pods, pods)]
    assert any("shared by 2 pods at once" in n for n in reps[0].notes)
    assert any("under another pod's labels: 1, kept once" in n for n in reps[0].notes)
    found = {f.id: f for f in analyze_bundle(b).findings}
    assert "gpu-burn-deployment" in found["gpu:shared0"].detail


@pytest.mark.parametrize("points", [4, 300])  # (a series point by point, and read as columns)
def test_pods_that_follow_one_another_on_a_gpu_share_nothing(points: int, tmp_path: Path) -> None:
    """GIVEN a query_range export of one GPU's framebuffer use under the vLLM pod, then under its
    replacement's new name (a restart), and a second GPU that both pods' series cover at the same times
    THEN every sample of the first GPU is kept, it lists both pods and is shared by none; the second is."""
    from replay.analysis.pipeline import analyze_bundle
    a = _dcgm_labels()
    old, new = {**a, "pod": "vllm-7d9f8-abcde", "namespace": "llm"}, {**a, "pod": "vllm-7d9f8-fghij", "namespace": "llm"}
    t0 = 1_700_000_000
    res = [{"metric": {**old, "__name__": "DCGM_FI_DEV_FB_USED"}, "values": [[t0 + 15 * k, str(1000 + k)] for k in range(points)]},
           {"metric": {**new, "__name__": "DCGM_FI_DEV_FB_USED"},
            "values": [[t0 + 15 * (points + k), str(2000 + k)] for k in range(points)]},
           *({"metric": {**pod, "gpu": "5", "__name__": "DCGM_FI_DEV_FB_USED"},
              "values": [[t0 + 15 * k, str(500 + k)] for k in range(points)]} for pod in (old, new))]
    f = tmp_path / "dcgm.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    s = b.samples
    assert s.filter(pl.col("gpu") == int(a["gpu"])).height == 2 * points
    assert s.filter(pl.col("gpu") == 5)["value"].to_list() == [float((500 + k) * 2**20) for k in range(points)]
    gpus = {g["index"]: g for g in b.meta.gpus}
    assert gpus[int(a["gpu"])]["pods"] == ["llm/vllm-7d9f8-abcde", "llm/vllm-7d9f8-fghij"]
    assert "shared_by" not in gpus[int(a["gpu"])] and gpus[5]["shared_by"] == gpus[5]["pods"]
    assert {f.id for f in analyze_bundle(b).findings if f.id.startswith("gpu:shared")} == {"gpu:shared5"}


def test_dcgm_series_of_several_hosts_stay_apart(tmp_path: Path) -> None:
    """GIVEN a cluster-wide query_range export of DCGM framebuffer use: GPU 2 of node-1 and GPU 2 of
    node-2 (the real label set, the second host renamed) WHEN recorded THEN they are two series, not one
    jumping between machines; none is the bundle's device memory until --host names the node vLLM ran
    on, whose series then is, with its GPU's UUID and host in bundle.json."""
    from replay.analysis.memory import actual_frame
    from replay.analysis.pipeline import analyze_bundle
    a = _dcgm_labels()
    b = {**a, "Hostname": "node-2", "UUID": "GPU-00000000-0000-0000-0000-000000000002",
         "instance": "nvidia-dcgm-exporter.gpu-operator:9401"}
    res = [{"metric": {**labels, "__name__": "DCGM_FI_DEV_FB_USED"},
            "values": [[1_700_000_000 + 15 * k, str(used + k)] for k in range(4)]}
           for labels, used in ((a, 1000), (b, 30000))]
    f = tmp_path / "dcgm_cluster.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
    reps, _ = record([f], tmp_path / "all", RecordOptions())
    s = read_bundle(tmp_path / "all").samples
    assert sorted(set(s["source"])) == ["dcgm[Hostname=node-1]", "dcgm[Hostname=node-2]"]
    assert s.filter(pl.col("source") == "dcgm[Hostname=node-2]")["value"].min() == 30000 * 2**20
    assert actual_frame(s)[1] is None  # two machines' memory is not one GPU's
    assert any("2 hosts (node-1, node-2)" in n and "--host" in n for n in reps[0].notes)
    found = {f.id: f for f in analyze_bundle(read_bundle(tmp_path / "all")).findings}
    assert "dcgm[Hostname=node-2]" in found["evidence:machines"].detail and "--host" in found["evidence:machines"].detail
    reps, _ = record([f], tmp_path / "mine", RecordOptions(host="node-2"))
    bb = read_bundle(tmp_path / "mine")
    s = bb.samples
    mine = s.filter(pl.col("source") == "dcgm")
    assert mine["value"].to_list() == [float((30000 + k) * 2**20) for k in range(4)] and set(mine["gpu"]) == {2}
    assert set(s.filter(pl.col("source") != "dcgm")["source"]) == {"dcgm[Hostname=node-1]"}
    assert [(g["index"], g["host"], g["uuid"]) for g in bb.meta.gpus] == [(2, "node-2", b["UUID"])]
    assert actual_frame(s)[0]["actual_bytes"].min() == 30000 * 2**20
    assert "evidence:machines" not in {f.id for f in analyze_bundle(bb).findings}
    # the report draws each host's series (none called actual) while none is chosen, and only vLLM's once one is
    from replay.report.html import timeline_figure
    drawn = [t.name for t in timeline_figure(analyze_bundle(read_bundle(tmp_path / "all"))).data]
    assert "device used, dcgm[Hostname=node-1] GPU 2" in drawn and "device used, dcgm[Hostname=node-2] GPU 2" in drawn
    assert not any(n.startswith("actual") for n in drawn)
    from replay.report.html import write_report
    from replay.report.postmortem import render_postmortem
    write_report(tmp_path / "all", [], tmp_path / "r.html")
    assert "unknown: device memory of several machines (2 series), none chosen; record with --host NODE" in (
        tmp_path / "r.html").read_text()
    assert "peak actual memory was unknown (the evidence holds device memory of several machines, 2 series" in (
        render_postmortem(tmp_path / "all"))
    assert not any(n.startswith("device used, ") for n in (t.name for t in timeline_figure(analyze_bundle(bb)).data))
    # a scrape of one exporter (one host) is unchanged: GPU and host from its labels
    one = tmp_path / "one.prom"
    one.write_text("# scraped_at 2025-05-01T10:00:00Z\n" + "DCGM_FI_DEV_FB_USED{"
                   + ",".join(f'{k}="{v}"' for k, v in a.items()) + "} 1234\n")
    record([one], tmp_path / "one", RecordOptions())
    b1 = read_bundle(tmp_path / "one")
    assert b1.samples.select("source", "gpu", "value").rows() == [("dcgm", 2, 1234 * 2**20)]
    assert b1.meta.gpus[0]["host"] == "node-1" and b1.meta.gpus[0]["name"] == "Quadro RTX 6000"


def test_many_hosts_draw_the_highest_peaks_and_say_how_many(tmp_path: Path) -> None:
    """GIVEN a cluster-wide DCGM export of 12 hosts (the real label set, hosts renamed) and no --host
    WHEN analysed and drawn THEN the timeline draws the 8 series with the highest peaks and says '8 of
    12', and the finding counts all 12."""
    from replay.analysis.memory import MACHINES_DRAWN, machines_frame
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.html import timeline_figure
    a = _dcgm_labels()
    res = [{"metric": {**a, "Hostname": f"node-{h:02d}", "__name__": "DCGM_FI_DEV_FB_USED"},
            "values": [[1_700_000_000 + 15 * k, str(1000 * h + k)] for k in range(3)]} for h in range(12)]
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
    record([f], tmp_path / "b", RecordOptions())
    an = analyze_bundle(read_bundle(tmp_path / "b"))
    assert an.machines_total == 12 and MACHINES_DRAWN == 8
    assert sorted(set(an.machines["series"])) == [f"dcgm[Hostname=node-{h:02d}] GPU 2" for h in range(4, 12)]
    assert "12 series" in {x.id: x for x in an.findings}["evidence:machines"].detail
    fig = timeline_figure(an)
    assert sum((t.name or "").startswith("device used, ") for t in fig.data) == 8
    assert any("8 of 12 machines' series drawn" in (x.text or "") for x in fig.layout.annotations)
    frame, total = machines_frame(read_bundle(tmp_path / "b").samples, limit=3)
    assert total == 12 and frame.height == 9 and frame["value_bytes"].max() == (11_000 + 2) * 2**20


# the shape `dcgmi dmon -e 203,204,155,150,250,251,252` prints (header of field short names, a units
# line, one row per entity per sample; no times), as in a fixture captured on an RTX 2080 Ti with DCGM 3.3.5
DCGMI = """#Entity   GPUTL             MCUTL             POWER             TMPTR        FBTTL        FBFRE        FBUSD
ID                                             W                 C
GPU 0     98                40                350.891           62           81559        1024         80535
GPU 1     97                39                340.100           60           81559        2048         79511
GPU 0     99                41                351.000           63           81559        N/A          81000
GPU 1     97                39                340.200           60           81559        512          81047
GPU-I 3   0                 0                 N/A               N/A          9984         9000         984
"""


def test_dcgmi_dmon_rows_are_placed_from_at_and_interval(tmp_path: Path) -> None:
    """`dcgmi dmon` output is recognised by content; its rows carry no time, so with --at each
    entity's n-th row is n intervals later; N/A is no value; a MIG instance is not a GPU index.
    Without --at, its values are quarantined with a count and a note saying how to place them."""
    src = tmp_path / "dcgmi.txt"
    src.write_text(DCGMI)
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01T12:00:00Z", rows_interval_s=5.0))
    assert reps[0].kind == "dcgmi-dmon" and reps[0].quarantined == 0
    s = read_bundle(tmp_path / "b").samples.filter(pl.col("source") == "dcgm")
    used = s.filter(pl.col("metric") == "device_used_bytes").sort("gpu", "t_us")
    assert used.select("t_us", "gpu").rows() == [(0, 0), (5_000_000, 0), (0, 1), (5_000_000, 1)]
    assert used["value"].to_list() == [v * 2**20 for v in (80535, 81000, 79511, 81047)]
    free = s.filter(pl.col("metric") == "device_free_bytes")
    assert free.height == 3  # (one N/A)
    assert s.filter(pl.col("metric") == "device_used_bytes:GPU-I 3").height == 1
    assert any("every 5 s" in n for n in reps[0].notes)
    reps, _ = record([src], tmp_path / "c", RecordOptions())
    assert read_bundle(tmp_path / "c").samples.height == 0 and reps[0].quarantined == 1
    assert any("give --at" in n and "24 values quarantined" in n for n in reps[0].notes)


def test_dcgmi_dmon_naive_at_follows_tz_and_a_bad_value_quarantines_its_line_once(tmp_path: Path) -> None:
    """A naive --at is local time at --tz, as for every other source placed by --at (dcgmi dmon took it
    for UTC); a row with a value that is no number keeps its other values and is counted once, as
    quarantined (it was counted parsed as well)."""
    src = tmp_path / "dcgmi.txt"
    src.write_text(DCGMI.replace("GPU 1     97                39                340.200           60           81559        512",
                                 "GPU 1     97                39                340.200           60           81559        xx"))
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01 12:00:00", tz_offset_s=7200))
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc.startswith("2024-05-01T10:00:00")
    assert reps[0].quarantined == 1 and reps[0].parsed + reps[0].quarantined == reps[0].lines
    assert b.samples.filter((pl.col("gpu") == 1) & (pl.col("metric") == "device_used_bytes")).height == 2


def test_dcgm_exporter_counters_file_says_which_memory_fields_its_scrapes_hold(tmp_path: Path) -> None:
    """dcgm-exporter's counters file (its -f list) is read as what it is, not samples: every line is
    accounted for, and the note names the memory fields a scrape of it can hold and those it cannot
    (an older default list lacked FB_RESERVED: absent from every scrape, not zero). It was quarantined
    whole as an unknown file."""
    src = shared("evidence/dcgm/dcgm_exporter_default_counters.csv")
    text = src.read_text()
    fields = [ln.split(",")[0] for ln in text.splitlines() if ln.startswith("DCGM_")]
    older = tmp_path / "counters-2022.csv"  # (the same list without FB_RESERVED, and one line of another shape)
    older.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("DCGM_FI_DEV_FB_RESERVED"))
                     + "\nDCGM_FI_DEV_FB_USED gauge Framebuffer memory used\n")
    reports, _ = record([src, older], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    new, old = reports
    assert (new.kind, new.lines, new.parsed, new.quarantined) == ("dcgm-counters", len(text.splitlines()),
                                                                  len(text.splitlines()), 0)
    assert f"{len(fields)} fields it exports" in new.notes[0] and "FB_USED, FB_FREE, FB_RESERVED;" in new.notes[0]
    assert old.kind == "dcgm-counters" and old.quarantined == 1
    assert "not exported, so absent from its scrapes: FB_RESERVED, FB_TOTAL" in old.notes[0]
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["raw"]) for r in q] == [(len(text.splitlines()), "DCGM_FI_DEV_FB_USED gauge Framebuffer memory used")]


_MIG_VALUES = st.sampled_from(["0", "1", "3", "", " 4 ", "N/A", "x", "12345678901234567890", "1:3"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_MIG_VALUES, _MIG_VALUES, st.sampled_from(["n1", "n2", None]), st.integers(0, 10**6)),
                min_size=1, max_size=8), st.sampled_from([None, "3", "0:3", "1:x", ""]))
@example(rows=[("12345678901234567890", "0", "n1", 0)], chosen=None)
@example(rows=[("0", "3", None, 1), ("0", "4", None, 2), ("0", "3", None, 3)], chosen=None)
def test_fuzz_dcgm_mig_labels_never_a_traceback(tmp_path_factory: pytest.TempPathFactory,
                                                rows: list[tuple[str, str, str | None, int]], chosen: str | None) -> None:
    """DCGM series with any mix of gpu, GPU_I_ID and host labels (empty, not numbers, too long for an
    index, repeated), with or without --gpu-instance: recorded without an internal error (a gpu label of
    20 digits was one), a sample for every series but those of a GPU index no machine has (quarantined),
    and no GPU's memory is the bundle's device memory ('dcgm') from two instances at one time."""
    d = tmp_path_factory.mktemp("mig")
    lines = [f'DCGM_FI_DEV_FB_USED{{gpu="{g}",GPU_I_ID="{gi}"' + (f',Hostname="{h}"' if h else "") + f"}} {v}"
             for g, gi, h, v in rows]
    (d / "s.prom").write_text("\n".join(lines) + "\n")
    record([d / "s.prom"], d / "b", RecordOptions(at="2025-08-01T10:00:00Z", gpu_instance=chosen))
    b = read_bundle(d / "b")
    series = {(g, gi, h) for g, gi, h, _ in rows}  # (a series repeated keeps its first)
    impossible = {k for k in series if k[0].strip().isdigit() and int(k[0]) >= 2**31}  # (a GPU index no machine has)
    assert b.samples.height == len(series - impossible)
    assert b.quarantine_count >= bool(impossible)
    mine = b.samples.filter(pl.col("source") == "dcgm")
    split = {}
    for g, gi, h, _ in rows:
        if g.strip().isdigit() and gi.strip():
            split.setdefault((h or "", int(g)), set()).add(gi.strip())
    several = {k for k, v in split.items() if len(v) > 1}
    if chosen is None and len({h for _, _, h, _ in rows}) == 1:
        assert not set(mine["gpu"].to_list()) & {g for _, g in several}
