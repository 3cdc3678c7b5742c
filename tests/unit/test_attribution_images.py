"""The attribution's ``multimodal`` feature weighs what images cost the encoder, their tokens, not how
many there were: two traffics of one image a request, one of them large near the onset, are told apart."""

from __future__ import annotations

from typing import Any

import polars as pl

from replay.analysis.attribution import attribute
from replay.drive.images import request_image_tokens

S = 1_000_000
ONSET_US = 60 * S


def _requests(near_size: tuple[int, int]) -> pl.DataFrame:
    """120 s of one request a second, each with one image: 448 x 448 all along, ``near_size`` within the
    three seconds before the onset."""
    rows: list[dict[str, Any]] = []
    for i in range(120):
        t = i * S
        w, h = near_size if ONSET_US - 3 * S <= t <= ONSET_US else (448, 448)
        mm = [{"type": "image", "count": 1, "width": w, "height": h}]
        rows.append({"id": f"r{i}", "arrival_us": t, "sent_us": t, "finish_us": t + S // 2, "input_tokens": 200,
                     "max_tokens": 64, "prompt_logprobs": None, "logprobs": None, "n": None, "best_of": None,
                     "mm_items": 1, "image_tokens": request_image_tokens(mm), "prefix_blocks": 0})
    return pl.DataFrame(rows)


def _multimodal(requests: pl.DataFrame) -> float | None:
    return next((a.score for a in attribute(requests, ONSET_US) if a.feature == "multimodal"), None)


def test_equal_image_counts_of_other_sizes_weigh_differently() -> None:
    # GIVEN two traffics with one image in every request, the same count everywhere
    same, large = _requests((448, 448)), _requests((1792, 1792))
    assert same["mm_items"].to_list() == large["mm_items"].to_list()
    # WHEN each is attributed at the same onset
    # THEN only the one whose images near the onset were large (4,096 tokens against 256) names images
    assert _multimodal(same) is None
    score = _multimodal(large)
    assert score is not None and score > 1.0
    top = attribute(large, ONSET_US)[0]
    assert top.feature == "multimodal" and {"r57", "r58", "r59", "r60"} <= set(top.near_ids)


def test_image_counts_stand_in_where_tokens_are_unknown() -> None:
    # GIVEN requests of a bundle written before image tokens were kept: two images each near the onset, none elsewhere
    r = _requests((448, 448)).drop("image_tokens").with_columns(
        mm_items=pl.when((pl.col("sent_us") >= ONSET_US - 3 * S) & (pl.col("sent_us") <= ONSET_US)).then(2).otherwise(0))
    # THEN the count stands in at 256 tokens an image
    got = next(a for a in attribute(r, ONSET_US) if a.feature == "multimodal")
    assert got.near_mean > 0 and got.rest_mean == 0
