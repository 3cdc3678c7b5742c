"""One request, one row, whatever ids its log lines use.

vLLM's V1 front end logs a request under its own id ('Received request cmpl-r0005-0: …') and hands
the engine that id with a random suffix ('Added request cmpl-r0005-0-a120baa9', 0.11 on): read
line by line they are two requests, one with the parameters and the other with the engine's
progress. A row whose id is another row's id plus such a suffix is that request's engine side and is
folded into it; an id that only looks suffixed, with no front-end row to match, stays as it is.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from replay.atomic import written_in_place

ENGINE_SUFFIX = r"-[0-9a-f]{8}$"  # (vLLM's: f"{request_id}-{random_uuid():.8}")
_BASE = pl.col("id").str.replace(ENGINE_SUFFIX, "")  # (an id less its engine suffix)
_FIRST = ("arrival_us", "sent_us", "first_token_us")  # (the earlier of the two sides' times)
_LAST = ("finish_us",)


def has_engine_ids(df: pl.DataFrame) -> bool:
    """Whether some row of ``df`` has an id with an engine's suffix (a row ``unify_request_ids`` may fold)."""
    return "id" in df.columns and bool(df["id"].str.contains(ENGINE_SUFFIX).any())


def unify_request_ids(df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Fold each engine-side row into its front-end row; returns the rows and how many were folded.
    The front end's row keeps its id, source and details (the engine side's fill what it lacks); the
    engine's id is kept in ``engine_id``; times take the earlier arrival and the later finish; the
    status is the engine side's where the front end's is unknown."""
    if df.height == 0 or "id" not in df.columns:
        return df, 0
    cand = df.filter(pl.col("id").str.contains(ENGINE_SUFFIX)).with_columns(_base=_BASE)
    known = set(df["id"].to_list())
    cand = cand.filter(pl.col("_base").is_in(list(known)) & (pl.col("_base") != pl.col("id")))
    if cand.height == 0:
        return df, 0
    engine_ids = set(cand["id"].to_list())
    front = df.filter(~pl.col("id").is_in(list(engine_ids)))
    eng = cand.drop("id").rename({c: f"{c}__e" for c in cand.columns if c not in ("_base", "id")})
    joined = front.join(eng, left_on="id", right_on="_base", how="left")
    fill = []
    for c in df.columns:
        e = f"{c}__e"
        if c == "id" or e not in joined.columns:
            continue
        if c in _FIRST:
            fill.append(pl.min_horizontal(c, e).alias(c))
        elif c in _LAST:
            fill.append(pl.max_horizontal(c, e).alias(c))
        elif c == "status":
            fill.append(pl.when(pl.col(c).is_null() | (pl.col(c) == "unknown")).then(pl.coalesce(e, c))
                        .otherwise(pl.col(c)).alias(c))
        else:
            fill.append(pl.coalesce(c, e).alias(c))
    out = joined.with_columns(fill)
    ids = cand.select(pl.col("_base").alias("id"), engine_id=pl.col("id"))
    out = out.drop([c for c in out.columns if c.endswith("__e")]).join(ids, on="id", how="left")
    if "engine_id" in df.columns:  # (already unified once: keep the earlier one)
        out = out.with_columns(engine_id=pl.coalesce("engine_id", "engine_id_right")).drop("engine_id_right")
    return out, len(engine_ids)


def unify_bundle_requests(requests: Path) -> int:
    """Fold the engine-side rows of a written ``requests.parquet`` into their front-end rows, rewriting
    it whole (beside, then renamed) only where there is one to fold; returns how many were folded. Only
    the ids are read to find out (a day's log holds millions of rows)."""
    if not requests.exists() or not _has_front_end_rows(requests):
        return 0
    df, folded = unify_request_ids(pl.read_parquet(requests))
    with written_in_place(requests) as part:
        df.write_parquet(part, compression_level=2)
    return folded


def _has_front_end_rows(requests: Path) -> bool:
    """Whether some suffixed id of the written rows has its front end's row too. The ids are streamed,
    never held: the suffixed ones are counted first (most logs have none, or no front-end rows), and
    only their bases' 64-bit hashes are held to probe every id against; a hash that matches is then
    checked on the text."""
    ids = pl.scan_parquet(requests).select("id")
    suffixed = ids.filter(pl.col("id").str.contains(ENGINE_SUFFIX))
    if not suffixed.select(pl.len()).collect(engine="streaming").item():
        return False
    bases = suffixed.select(h=_BASE.hash()).unique().collect(engine="streaming")
    maybe = ids.filter(pl.col("id").hash().is_in(bases["h"].implode())).collect(engine="streaming")["id"]
    if maybe.len() == 0:
        return False
    return bool(suffixed.select(base=_BASE).filter(
        pl.col("base").is_in(maybe.implode())).select(pl.len()).collect(engine="streaming").item())
