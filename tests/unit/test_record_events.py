"""The bundle's event vocabulary (replay/record/events.py) against what the recorder writes."""

from __future__ import annotations

from pathlib import Path

from replay.bundle import read_bundle
from replay.record.events import EVENT_KINDS, NOT_EVENTS
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA

NOT_EVIDENCE = ("README.md", "sharegpt_v3_layout.json")  # (the data folder's notes, and a trace)


def test_every_event_recorded_from_the_real_evidence_is_of_a_kind_the_vocabulary_names(tmp_path: Path) -> None:
    """GIVEN every real evidence file of the tests' data (logs of vLLM 0.6 to 0.32, scrapes, nvidia-smi,
    gpustat, Kubernetes, the kernel log) WHEN recorded THEN each event's kind is one of EVENT_KINDS, and
    none is a log fact that is no event (stats, request lines, the engine's configuration): a kind a
    parser begins to write fails here until the vocabulary, and docs/bundle-format.md, name it."""
    files = sorted(p for p in DATA.iterdir() if p.is_file() and p.name not in NOT_EVIDENCE
                   and not p.name.startswith("servegen"))
    record(files, tmp_path / "b", RecordOptions(year=2025))
    kinds = {e["kind"] for e in read_bundle(tmp_path / "b").events}
    assert kinds <= EVENT_KINDS, sorted(kinds - EVENT_KINDS)
    assert not kinds & set(NOT_EVENTS)
    # (the evidence holds the kinds the analysis reads: it is no vacuous check)
    assert {"oom", "host_oom_killed", "container_killed", "gpu_xid", "engine_death", "kv_config"} <= kinds, sorted(kinds)
