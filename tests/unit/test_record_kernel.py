"""The recorder on kernel logs: the OOM killer and Xid messages."""

from __future__ import annotations

from pathlib import Path

from replay.bundle import read_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA


def test_kernel_log_host_oom_killer_and_gpu_xid(tmp_path: Path) -> None:
    """A kernel log (dmesg -T, journalctl -k short or short-iso, plain dmesg) holds the two ends an engine
    can meet without any CUDA OOM: the host OOM killer (here a memory cgroup's: a container limit) and
    an NVIDIA Xid (79: the GPU fell off the bus). Both are events at their times and findings."""
    from replay.analysis.pipeline import analyze_bundle
    src = DATA / "kernel_memcg_oom_xid79_dmesg_T.txt"
    reps, _ = record([src], tmp_path / "a", RecordOptions(tz_offset_s=3600))
    assert (reps[0].kind, reps[0].lines, reps[0].parsed, reps[0].quarantined) == ("kernel-log", 5, 5, 0)
    b = read_bundle(tmp_path / "a")
    assert b.meta.t0_utc.startswith("2025-05-01T09:04:58")  # 10:04:58 at UTC+1
    oom = [e for e in b.events if e["kind"] == "host_oom_killed"]
    xid = [e for e in b.events if e["kind"] == "gpu_xid"]
    assert len(oom) == 1 and oom[0]["pid"] == 4242 and oom[0]["cgroup"] and oom[0]["anon_rss_bytes"] == 61234567 * 1024
    assert len(xid) == 1 and xid[0]["xid"] == 79 and xid[0]["pci"] == "0000:18:00" and xid[0]["t_us"] == 9_000_000
    titles = [f.title for f in analyze_bundle(b).findings]
    assert any(t.startswith("Host/cgroup OOM") for t in titles) and any("Xid 79" in t for t in titles)
    lines = src.read_text().splitlines()
    iso = tmp_path / "journal-iso.txt"  # journalctl -k -o short-iso
    iso.write_text("".join(f"2025-05-01T10:0{k}:00+0000 gpu-node-1 kernel: {ln.split('] ', 1)[1]}\n" for k, ln in enumerate(lines)))
    short = tmp_path / "journal.txt"  # journalctl -k: no year
    short.write_text("".join(f"May 01 10:0{k}:00 gpu-node-1 kernel: {ln.split('] ', 1)[1]}\n" for k, ln in enumerate(lines)))
    bare = tmp_path / "dmesg.txt"  # plain dmesg: seconds since boot
    bare.write_text("".join(f"[{12345.678901 + k:.6f}] {ln.split('] ', 1)[1]}\n" for k, ln in enumerate(lines)))
    for f, opts, t_known in ((iso, RecordOptions(), True), (short, RecordOptions(year=2025), True), (bare, RecordOptions(), False)):
        reps, _ = record([f], tmp_path / f.stem, opts)
        evs = [e for e in read_bundle(tmp_path / f.stem).events if e["kind"] in ("host_oom_killed", "gpu_xid")]
        assert reps[0].kind == "kernel-log" and [e["kind"] for e in evs] == ["host_oom_killed", "gpu_xid"], f.name
        assert all((e["t_us"] is not None) == t_known for e in evs), f.name
    assert read_bundle(tmp_path / "journal").meta.t0_utc.startswith("2025-05-01T10:02:00")
