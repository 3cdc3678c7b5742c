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

import polars as pl

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


def mm_cache_hit_ratio(samples: pl.DataFrame) -> pl.DataFrame:
    """(t_us, source, hit_ratio): vLLM's multimodal processor cache, hits over queries since the server
    started, at each scrape that counted a query; without scrapes, the hit rate its log's stats lines
    state. Empty where the evidence says neither."""
    s = samples.filter(pl.col("metric").is_in([CACHE_QUERIES, CACHE_HITS]))
    if s.height == 0:
        return (samples.filter(pl.col("metric") == LOG_HIT_RATIO).sort("t_us")
                .select(pl.col("t_us").cast(pl.Int64), pl.col("source").cast(pl.Utf8), hit_ratio=pl.col("value").cast(pl.Float64)))
    wide = (s.group_by("t_us", "source", "metric").agg(pl.col("value").sum())
            .pivot(on="metric", index=["t_us", "source"], values="value"))
    if CACHE_QUERIES not in wide.columns or CACHE_HITS not in wide.columns:
        return pl.DataFrame(schema={"t_us": pl.Int64, "source": pl.Utf8, "hit_ratio": pl.Float64})
    return (wide.filter(pl.col(CACHE_QUERIES) > 0).sort("t_us")
            .select("t_us", "source", hit_ratio=pl.col(CACHE_HITS) / pl.col(CACHE_QUERIES)))
