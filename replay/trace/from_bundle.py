"""A recorded incident's traffic as a replay trace: production bundle -> ``replay-trace/1``.

The bundle's request rows become trace requests with their production ids, arrival times, prompt
lengths and memory-relevant sampling parameters. What the evidence states is *observed*; what had to
be filled in (a prompt length from the request and token counters of a metrics scrape, a time spread
within the whole second a log states) is *inferred* or a *default*, and the header says which, how
many and from where, field by field: the trace never invents silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

import polars as pl

from replay.bundle import Bundle, bundle_sha256, names_where, read_bundle
from replay.errors import EXIT_INPUT, ReplayError
from replay.record.request_ids import unify_request_ids
from replay.trace.format import TraceHeader, write_trace

Origin = Literal["observed", "inferred", "default"]
DEFAULT_INPUT_TOKENS = 256  # (only where neither the log nor a metric states any prompt length; said in the header)
SECOND_US = 1_000_000
CRASH_KINDS = ("oom", "engine_death", "cuda_error", "host_oom_kill", "container_killed")
SAMPLING = ("n", "best_of", "logprobs", "prompt_logprobs")


@dataclass
class FieldOrigin:
    """How one trace field was filled: counts of requests by origin, and where the values came from."""

    observed: int = 0
    inferred: int = 0
    default: int = 0
    sources: list[str] = field(default_factory=list)

    def count(self, origin: Origin, n: int = 1) -> None:
        setattr(self, origin, getattr(self, origin) + n)

    def to_json(self) -> dict[str, Any]:
        return {"observed": self.observed, "inferred": self.inferred, "default": self.default, "from": self.sources}


@dataclass
class BundleTrace:
    header: TraceHeader
    requests: list[dict[str, Any]]
    notes: list[str]
    window_us: tuple[int, int] | None  # production µs from the bundle's t0
    crash_us: int | None


def first_crash_us(b: Bundle) -> int | None:
    """When the engine first crashed (an OOM, its death, a fatal CUDA error, a kill), µs from t0."""
    times = [int(e["t_us"]) for e in b.events if e.get("kind") in CRASH_KINDS and e.get("t_us") is not None]
    return min(times) if times else None


def _whole_seconds(arrivals: pl.Series, t0_us: int) -> bool:
    """Whether every arrival falls on a whole second of the clock (a log's times: 'INFO 12-02 18:40:33')."""
    return arrivals.len() > 0 and bool((((arrivals + t0_us) % SECOND_US) == 0).all())


def _spread(df: pl.DataFrame) -> pl.DataFrame:
    """Requests logged within one second keep their log order and are spread evenly across it."""
    return df.with_columns(
        arrival_us=pl.col("arrival_us") + (pl.int_range(pl.len()).over("arrival_us") * SECOND_US
                                           // pl.len().over("arrival_us")))


def _mean_prompt_tokens(b: Bundle, lo_us: int, hi_us: int, n_requests: int) -> tuple[int, str] | None:
    """The mean prompt length over [lo, hi] from a scrape's counters: prompt tokens counted over requests
    counted (vLLM's own, so it speaks for every request, logged or not); None without both."""
    s = b.samples.filter(names_where(pl.col("source"), lambda s: s.str.starts_with("vllm-metrics")))
    tok = s.filter(pl.col("metric") == "prompt_tokens_total").sort("t_us")
    if tok.height < 2:
        return None
    inside = tok.filter(pl.col("t_us").is_between(lo_us - 30 * SECOND_US, hi_us + 30 * SECOND_US))
    if inside.height < 2:
        return None
    delta = float(inside["value"][-1] - inside["value"][0])
    if delta <= 0 or n_requests <= 0:
        return None
    return max(1, round(delta / n_requests)), (f"vllm-metrics prompt_tokens_total: {delta:.0f} prompt tokens over "
                                                f"{n_requests} requests between scrapes")


def _rows(b: Bundle) -> tuple[pl.DataFrame, list[str]]:
    notes: list[str] = []
    df, folded = unify_request_ids(b.scan_requests().collect())
    if folded:
        notes.append(f"{folded} engine-side ids folded into their front-end requests")
    unplaced = df.filter(pl.col("arrival_us").is_null()).height
    if unplaced:
        notes.append(f"{unplaced} requests have no arrival in the evidence (in flight when it begins, only their end "
                     "logged): not replayed")
    df = df.filter(pl.col("arrival_us").is_not_null())
    df = df.with_columns(_line=pl.col("source").str.extract(r":(\d+)$", 1).cast(pl.Int64).fill_null(0)).sort(
        ["arrival_us", "_line"], maintain_order=True)
    return df, notes


def build_trace(b: Bundle, *, window_us: tuple[int, int] | None = None, before_crash_us: int | None = None,
                sha256: str | None = None) -> BundleTrace:
    """The bundle's requests as a trace; ``window_us`` (µs from the bundle's t0) or ``before_crash_us``
    (that long before the first crash, up to it) cuts it. Raises ReplayError (exit 3) when the bundle
    holds no request to build a trace from."""
    df, notes = _rows(b)
    if df.height == 0:
        raise ReplayError(f"{b.path}: no trace can be built: the evidence holds no request (no request lines in its "
                          "logs: V1 logs them only with --enable-log-requests; no access-log lines)", EXIT_INPUT)
    crash = first_crash_us(b)
    if before_crash_us is not None:
        if crash is None:
            raise ReplayError(f"--before-crash: {b.path} states no crash (no OOM, engine death or kill on its "
                              "timeline); cut it with --window START:END instead", 2)
        window_us = (crash - before_crash_us, crash + 1)
    t0 = b.meta.t0_us or 0
    fields = {k: FieldOrigin() for k in ("t_us", "input_tokens", "max_tokens", "output_tokens", "sampling", "status")}
    whole = _whole_seconds(df["arrival_us"], t0)
    if whole:
        df = _spread(df)
        fields["t_us"].count("inferred", df.height)
        fields["t_us"].sources.append("the log's whole seconds: requests of one second keep their log order and "
                                      "are spread evenly within it")
    else:
        placed = df["arrival_from"].drop_nulls().to_list() if "arrival_from" in df.columns else []
        fields["t_us"].count("observed", df.height - len(placed))
        fields["t_us"].count("inferred", len(placed))
        fields["t_us"].sources += sorted(set(placed))
    served = None
    if window_us is not None:
        a, z = window_us
        served = served_before(df.filter(pl.col("arrival_us") < a))
        df = df.filter(pl.col("arrival_us").is_between(a, z, closed="left"))
        if df.height == 0:
            raise ReplayError(f"{b.path}: no request arrives in the window {a / 1e6:.1f}s..{z / 1e6:.1f}s of its "
                              "timeline", EXIT_INPUT)
    base = window_us[0] if window_us is not None else int(df["arrival_us"][0])
    mean = None
    if df["input_tokens"].null_count():
        arrivals = df["arrival_us"].to_list()
        mean = _mean_prompt_tokens(b, min(arrivals), max(arrivals), df.height)
    finished_any = df["finish_us"].is_not_null().any()
    reqs = [_request(r, base, crash, finished_any, mean, fields, b.meta.keep_prompts) for r in df.iter_rows(named=True)]
    notes.extend(_image_notes(reqs))
    if fields["input_tokens"].default:
        notes.append(f"{fields['input_tokens'].default} requests' prompt lengths are stated nowhere in the evidence "
                     f"(no prompt_token_ids, no prompt-token counter): {DEFAULT_INPUT_TOKENS} tokens each, a default")
    header = _header(b, reqs, fields, notes, base, window_us, crash, sha256, whole, t0)
    if served is not None:
        header.production = {**(header.production or {}), "served_before": served}
    return BundleTrace(header, reqs, notes, window_us, crash)


def _image_notes(reqs: list[dict[str, Any]]) -> list[str]:
    """What a trace's images were made from: the logged prompts' placeholders, their tokens where the logged
    ids show them (V1 logs the processed prompt), else a default size."""
    items = [m for r in reqs for m in r.get("mm") or []]
    if not items:
        return []
    sized = sum(1 for m in items if m.get("tokens"))
    out = [f"{len(items)} requests' images are counted from the placeholders of their logged prompts; their sizes are not "
           "logged (replay run --vllm 0.32+vision sends them)"]
    if sized:
        out.append(f"{sized} of them state the tokens their images took (runs of the image token in the logged prompt ids): "
                   "each is replayed as a square image of that many tokens, a request's tokens shared by its images")
    if sized < len(items):
        out.append(f"{len(items) - sized} of them state no image tokens (ids logged before the images were expanded, cut "
                   "short, or not logged): each image is replayed as 448 x 448")
    return out


class ServedBefore(TypedDict):
    """What production's server had served before a trace's window: the replay's warm-up is sized from it."""

    requests: int
    input_tokens: int | None  # the median prompt of them, tokens (None: no prompt length stated)
    max_tokens: int | None  # the median output cap of them


def served_before(df: pl.DataFrame) -> ServedBefore | None:
    """The requests production served before the window (None where there were none)."""
    if df.height == 0:
        return None

    def median(col: str) -> int | None:
        v = df[col].median() if col in df.columns else None
        return None if v is None else int(round(float(v)))  # type: ignore[arg-type]
    return ServedBefore(requests=df.height, input_tokens=median("input_tokens"), max_tokens=median("max_tokens"))


def _request(r: dict[str, Any], base: int, crash: int | None, finished_any: bool, mean: tuple[int, str] | None,
             fields: dict[str, FieldOrigin], keep_prompts: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": r["id"], "t_us": int(r["arrival_us"]) - base}
    if r.get("input_tokens") is not None:
        out["input_tokens"] = int(r["input_tokens"])
        fields["input_tokens"].count("observed")
    elif mean is not None:
        out["input_tokens"] = mean[0]
        fields["input_tokens"].count("inferred")
        if mean[1] not in fields["input_tokens"].sources:
            fields["input_tokens"].sources.append(mean[1])
    else:
        out["input_tokens"] = DEFAULT_INPUT_TOKENS
        fields["input_tokens"].count("default")
    if keep_prompts and r.get("prompt") is not None:
        out["prompt"] = _unquote(str(r["prompt"]))
    fields["max_tokens"].count("observed" if r.get("max_tokens") is not None else "default")
    out["max_tokens"] = r.get("max_tokens")
    sampling = {k: int(r[k]) for k in SAMPLING if r.get(k) is not None}
    if sampling:
        out["sampling"] = sampling
        fields["sampling"].count("observed")
    if r.get("output_tokens") is not None:
        out["output_tokens"], out["output_kind"] = int(r["output_tokens"]), "observed"
        fields["output_tokens"].count("observed")
    else:
        out["output_tokens"], out["output_kind"] = None, "unknown"
        fields["output_tokens"].count("default")
    if r.get("mm_items"):  # (images its logged prompt's placeholders held; their sizes are not logged, their tokens may be)
        item: dict[str, Any] = {"type": "image", "count": int(r["mm_items"])}
        if r.get("image_tokens"):
            item["tokens"] = int(r["image_tokens"])
        out["mm"] = [item]
    out["status"] = _status(r, crash, finished_any)
    if out["status"] == "aborted":
        out["output_kind"] = "aborted"
    fields["status"].count("observed" if r.get("status") not in (None, "unknown") else "inferred"
                           if out["status"] == "aborted" else "default")
    extra = {k: r[k] for k in ("source", "engine_id", "call", "arrival_from", "prompt_sha256", "error")
             if r.get(k) is not None}
    if extra:
        out["extra"] = extra
    return out


def _status(r: dict[str, Any], crash: int | None, finished_any: bool) -> str:
    """A request the log saw end is 'ok' (or its error); one it aborted, 'aborted'; one that arrived before the
    crash and never ended in a log that states ends, cut off by the crash ('aborted'); else unknown."""
    st = r.get("status") or "unknown"
    if st == "unknown" and r.get("finish_us") is not None:
        return "ok"
    if st != "unknown":
        return "error" if st == "error" else st
    if crash is not None and finished_any and r.get("finish_us") is None and int(r["arrival_us"]) <= crash:
        return "aborted"
    return "unknown"


def _unquote(s: str) -> str:
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        import ast
        try:
            v = ast.literal_eval(s)
            return v if isinstance(v, str) else s
        except (ValueError, SyntaxError):
            return s[1:-1]
    return s


def _production(b: Bundle, sha256: str | None, window_us: tuple[int, int] | None, crash: int | None) -> dict[str, Any]:
    m = b.meta
    gpus = [g for g in m.gpus if isinstance(g, dict)]
    first = gpus[0] if gpus else {}
    prod: dict[str, Any] = {
        "bundle": str(b.path), "bundle_sha256": sha256, "t0_utc": m.t0_utc,
        "vllm_version": m.vllm_version or m.vllm_version_inferred, "engine": m.engine, "model": m.model,
        "served_model_name": m.extra.get("served_model_name"),
        "gpu_name": first.get("name"), "gpu_total_bytes": first.get("total_bytes"), "gpu_count": len(gpus) or None,
        "window_us": list(window_us) if window_us is not None else None, "crash_us": crash,
    }
    return {k: v for k, v in prod.items() if v is not None}


def _header(b: Bundle, reqs: list[dict[str, Any]], fields: dict[str, FieldOrigin], notes: list[str], base: int,
            window_us: tuple[int, int] | None, crash: int | None, sha256: str | None, whole: bool, t0: int) -> TraceHeader:
    observed_tokens = fields["input_tokens"].observed
    return TraceHeader(
        source={"format": "replay-bundle", "path": str(b.path), "sha256": sha256, "bundle_kind": b.meta.kind},
        time={"src_unit": "us", "src_origin": "absolute", "tz_assumed": "UTC", "clock": "production",
              "quantum_ms": 1000 if whole else None, "sorted": True, "backwards_steps": 0, "t0_src_us": t0 + base,
              "bundle_offset_us": base,
              "spread": "within each whole second, in log order" if whole else None},
        tokens={"tokenizer": "production's" if observed_tokens else "unknown"},
        prefix={"block_size": None},
        import_counts={"rows_read": len(reqs), "rows_emitted": len(reqs), "quarantined": 0, "quarantine_file": None},
        engine_args=dict(b.meta.engine_args),
        production=_production(b, sha256, window_us, crash),
        fields={k: v.to_json() for k, v in fields.items()},
        notes=notes,
    )


def trace_of_bundle(path: Path, out: Path | None = None, *, window_us: tuple[int, int] | None = None,
                    before_crash_us: int | None = None) -> BundleTrace:
    """Read a bundle, build its trace, and write it to ``out`` when given (beside, then renamed)."""
    b = read_bundle(path)
    bt = build_trace(b, window_us=window_us, before_crash_us=before_crash_us, sha256=bundle_sha256(path))
    if out is not None:
        write_trace(out, bt.header, bt.requests)
    return bt
