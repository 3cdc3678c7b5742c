"""A bundle as evidence: a live recording (``replay record --live``) read beside the logs of the same
incident, so that what was sampled while the server ran (its process or GPU memory, its scrapes) and
what its log states land on one timeline."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import polars as pl

from replay.bundle import read_bundle
from replay.errors import ReplayError
from replay.record import common
from replay.record.events import EventKind


def is_bundle(path: Path) -> bool:
    return path.is_dir() and (path / "bundle.json").exists()


def parse_bundle(path: Path) -> common.Parsed:
    """Its samples and events at their UTC times (epoch µs), its GPUs and notes; its request rows are
    the recording's own and are not merged (said in a note)."""
    b = read_bundle(path)
    t0 = b.meta.t0_us
    if t0 is None:
        raise ReplayError(f"{path}: a bundle without t0_utc cannot be placed on the timeline")
    p = common.Parsed(kind="bundle")
    if b.samples.height:
        p.frames.append(b.samples.with_columns(pl.col("t_us") + t0))
    for e in b.events:
        data = {k: v for k, v in e.items() if k not in ("t_us", "kind", "source", "rank")}
        t = e.get("t_us")
        p.events.append({"t": None if t is None else int(t) + t0, "kind": cast("EventKind", e.get("kind")),
                         "data": data, "line": None})  # (a kind of the version that wrote it)
    p.gpus = {int(g["index"]): dict(g) for g in b.meta.gpus if isinstance(g, dict) and g.get("index") is not None}
    p.lines = p.parsed = b.samples.height + len(b.events)
    what = f"a live recording of {b.meta.extra['live_url']}" if b.meta.extra.get("live_url") else f"a {b.meta.kind} bundle"
    p.notes.append(f"{path.name}: {what}, {b.samples.height} samples and {len(b.events)} events on the timeline"
                   + (f" (process {b.meta.extra['pid']}'s memory)" if b.meta.extra.get("pid") else ""))
    n_req = b.scan_requests().select(pl.len()).collect().item()
    if n_req:
        p.notes.append(f"{path.name}: its {n_req} request rows are its own replay's or recording's, not merged")
    p.notes += [f"{path.name}: {n}" for n in b.meta.notes]
    return p
