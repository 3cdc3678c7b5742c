"""Images on the timeline: the image tokens of the requests in flight, and vLLM's multimodal cache.

vLLM budgets its KV pool, not what images cost beside it: the vision encoder's activations, the
encoder cache and the processor's tensors grow with the image tokens being prefilled, which
``kv_cache_usage_perc`` does not show. The image tokens in flight (each request's, from its send to
its finish) are drawn beside actual memory so that a high-resolution stretch is seen where it ran;
vLLM's processor-cache counters (``vllm:mm_cache_queries`` / ``vllm:mm_cache_hits``, V1 0.11+) say
how often an image was processed again rather than reused; where only a log is evidence, its stats
lines' "MM cache hit rate" (over vLLM's recent requests) says it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from replay.bundle import Samples, samples_where

CACHE_QUERIES = "mm_cache_queries_total"
CACHE_HITS = "mm_cache_hits_total"
LOG_HIT_RATIO = "mm_cache_hit_ratio"  # (a stats line's, ``recorder.STATS_SAMPLES``)


def image_tokens_in_flight(requests: pl.LazyFrame) -> pl.DataFrame:
    """(t_us, image_tokens): the image tokens of the requests in flight, as a step at each send and
    finish. A request with no end known counts until the last time the evidence knows of. Empty where
    no request has image tokens (a text trace, or a bundle written before they were recorded)."""
    empty = pl.DataFrame(schema={"t_us": pl.Int64, "image_tokens": pl.Int64})
    if "image_tokens" not in requests.collect_schema().names():
        return empty
    all_ = requests.select(start=pl.coalesce("sent_us", "arrival_us"), end=pl.col("finish_us"), tok=pl.col("image_tokens"))
    r, last = pl.collect_all([all_.filter((pl.col("tok").fill_null(0) > 0) & pl.col("start").is_not_null()),
                              all_.select(pl.max_horizontal(pl.col("start").max(), pl.col("end").max()))])
    if r.height == 0:
        return empty
    steps = pl.concat([r.select(t_us="start", d="tok"),
                       r.select(t_us=pl.col("end").fill_null(last.item()), d=-pl.col("tok"))])
    return (steps.group_by("t_us").agg(pl.col("d").sum()).sort("t_us")
            .select("t_us", image_tokens=pl.col("d").cum_sum()))


def mm_cache_hit_ratio(samples: Samples) -> pl.DataFrame:
    """(t_us, source, hit_ratio): vLLM's multimodal processor cache, hits over queries since the server
    started, at each scrape that counted a query; without scrapes, the hit rate its log's stats lines
    state. Empty where the evidence says neither."""
    cache = samples_where(samples, pl.col("metric").is_in([CACHE_QUERIES, CACHE_HITS, LOG_HIT_RATIO]))
    s = cache.filter(pl.col("metric").is_in([CACHE_QUERIES, CACHE_HITS]))
    if s.height == 0:
        return (cache.filter(pl.col("metric") == LOG_HIT_RATIO).sort("t_us")
                .select(pl.col("t_us").cast(pl.Int64), pl.col("source").cast(pl.Utf8), hit_ratio=pl.col("value").cast(pl.Float64)))
    wide = (s.group_by("t_us", "source", "metric").agg(pl.col("value").sum())
            .pivot(on="metric", index=["t_us", "source"], values="value"))
    if CACHE_QUERIES not in wide.columns or CACHE_HITS not in wide.columns:
        return pl.DataFrame(schema={"t_us": pl.Int64, "source": pl.Utf8, "hit_ratio": pl.Float64})
    return (wide.filter(pl.col(CACHE_QUERIES) > 0).sort("t_us")
            .select("t_us", "source", hit_ratio=pl.col(CACHE_HITS) / pl.col(CACHE_QUERIES)))


STEP_US = 10_000_000  # the steps the growth is compared in
MIN_IMAGES = 20  # images sent before growth is put down to them
MIN_STEPS = 6


@dataclass(frozen=True)
class ImageGrowth:
    """Actual memory that grows with the images sent, image by image, and stays: as vLLM's multimodal
    processor cache does, which keeps each distinct image's processed tensors (up to
    ``mm_processor_cache_gb``, 4 GiB by default) outside the KV budget. Not a near-the-onset effect,
    so the attribution's comparison of the requests around the onset misses it."""

    images: int  # images sent from the first image on
    grew_bytes: float  # actual memory's rise over that stretch
    bytes_per_image: float  # the slope of actual memory on the images sent so far
    r2: float  # of that fit
    step_r: float  # correlation of each step's rise with the images sent in it
    step_r_text: float  # ... with the requests without an image sent in it (nan: constant)

    @property
    def follows_images(self) -> bool:
        """The rise is the images': it fits the images sent so far (R² >= 0.8), each step rose with the images
        sent in it (r >= 0.5) more than with the text-only requests (a steady creep fits the first alone)."""
        text = -1.0 if math.isnan(self.step_r_text) else self.step_r_text
        return self.bytes_per_image > 0 and self.r2 >= 0.8 and self.step_r >= 0.5 and self.step_r > text


def image_growth(requests: pl.LazyFrame | pl.DataFrame, actual: pl.DataFrame) -> ImageGrowth | None:
    """How actual memory (``actual``: t_us, actual_bytes) followed the images sent, in 10 s steps from
    the first image request's send; None with fewer than MIN_IMAGES images or MIN_STEPS steps."""
    lf = requests.lazy()
    if "mm_items" not in lf.collect_schema().names() or actual.height == 0:
        return None
    if int(lf.select(pl.col("mm_items").fill_null(0).sum()).collect().item() or 0) < MIN_IMAGES:
        return None  # (a text fleet's millions of requests are not gathered)
    sent = lf.select(t_us=pl.coalesce("sent_us", "arrival_us"), img=pl.col("mm_items").fill_null(0)).drop_nulls("t_us").collect()
    first = sent.filter(pl.col("img") > 0)["t_us"].min()
    if first is None or int(sent["img"].sum()) < MIN_IMAGES:
        return None
    a = actual.select(pl.col("t_us").cast(pl.Int64), y=pl.col("actual_bytes").cast(pl.Float64)).drop_nulls().sort("t_us")
    a = a.filter(pl.col("t_us") >= first)
    step = ((pl.col("t_us") - first) // STEP_US).alias("k")
    y = a.group_by(step).agg(pl.col("y").last()).sort("k")
    s = sent.filter(pl.col("t_us") >= first).group_by(step).agg(
        img=pl.col("img").sum(), text=(pl.col("img") == 0).sum())
    f = y.join(s, on="k", how="left").fill_null(0).sort("k").with_columns(cum=pl.col("img").cum_sum(), dy=pl.col("y").diff())
    if f.height < MIN_STEPS:
        return None
    fit = f.select(b=pl.cov("cum", "y") / pl.col("cum").var(), r=pl.corr("cum", "y"),
                   r_img=pl.corr("dy", "img"), r_text=pl.corr("dy", "text"))
    b, r, r_img, r_text = (fit[c][0] for c in ("b", "r", "r_img", "r_text"))
    if b is None or r is None or r_img is None:
        return None
    return ImageGrowth(int(f["img"].sum()), float(f["y"][-1] - f["y"][0]), float(b), float(r) ** 2, float(r_img),
                       float("nan") if r_text is None else float(r_text))
