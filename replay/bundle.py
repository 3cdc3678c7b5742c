"""The incident bundle (``replay-bundle/1``): the one contract between recording, replay and analysis.

A bundle is a directory written by the recorder (production evidence) and by the replayer (a
replay run) alike: ``bundle.json`` (metadata and every input with its hash and counts),
``requests.parquet``, ``samples.parquet`` (long format ``t_us, gpu, source, metric, value``),
``events.jsonl`` and ``quarantine.jsonl``. Samples are flushed to numbered part files while a
recording runs, so a crash or Ctrl-C still leaves a readable bundle; ``close()`` merges them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from replay.errors import ReplayError
from replay.units import is_uint

SCHEMA = "replay-bundle/1"
SCHEMA_VERSION = 1

SAMPLES_SCHEMA = {
    "t_us": pl.Int64, "gpu": pl.Int32, "source": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64,
}
# the sources of a GPU's device memory, in the order the analysis prefers them; a machine other than the
# incident's keeps its own series under the same source with a tag ('dcgm[Hostname=node-2]'), and so does
# each MIG instance of a split GPU ('dcgm[GPU_I_ID=3]', ``mig_source``)
DEVICE_SOURCES = ("nvml", "dcgm", "nvidia-smi")
MIG_TAG = "[GPU_I_ID="  # (what names a MIG instance's series)


def mig_source(source: str, instance: str) -> str:
    """The source of a MIG instance's device memory: 'nvidia-smi', '3' -> 'nvidia-smi[GPU_I_ID=3]'."""
    return f"{source}{MIG_TAG}{instance}]"


def device_source(source: pl.Expr, tagged_only: bool = False) -> pl.Expr:
    """Whether a sample's ``source`` is device memory: one of DEVICE_SOURCES, as it is or with its tags
    ('dcgm[Hostname=node-2]', 'nvidia-smi[GPU_I_ID=3][node-b.txt]'); with ``tagged_only``, tagged ones alone."""
    return source.str.contains("^(?:" + "|".join(DEVICE_SOURCES) + (r")\[" if tagged_only else r")(?:\[|$)"))
REQUESTS_SCHEMA = {
    "id": pl.Utf8, "arrival_us": pl.Int64, "sent_us": pl.Int64, "first_token_us": pl.Int64,
    "finish_us": pl.Int64, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
    "max_tokens": pl.Int64, "prompt_logprobs": pl.Int64, "logprobs": pl.Int64, "n": pl.Int64,
    "best_of": pl.Int64, "mm_items": pl.Int64, "prefix_blocks": pl.Int64, "status": pl.Utf8,
    "error": pl.Utf8, "source": pl.Utf8,
}


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class BundleMeta:
    kind: str  # production | replay
    t0_utc: str | None = None
    vllm_version: str | None = None
    vllm_version_inferred: str | None = None
    engine: str | None = None  # v0 | v1
    engine_args: dict[str, Any] = field(default_factory=dict)  # vLLM's own names -> values, as production ran
    engine_args_sources: dict[str, list[str]] = field(default_factory=dict)  # name -> every 'file:line' stating it
    server_args: dict[str, Any] = field(default_factory=dict)  # the API server's own (host, port, served_model_name, …)
    engine_env: dict[str, dict[str, str]] = field(default_factory=dict)  # VLLM_* and the like: value and source
    model: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)  # index, and where the evidence says: name, uuid,
    # total bytes, host, the pods DCGM attributes it to ('namespace/pod') and those that held it at once
    # ('shared_by': MPS, time-slicing)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keep_prompts: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "kind": self.kind, "t0_utc": self.t0_utc,
            "vllm_version": self.vllm_version, "vllm_version_inferred": self.vllm_version_inferred,
            "engine": self.engine, "engine_args": self.engine_args, "engine_args_sources": self.engine_args_sources,
            "server_args": self.server_args, "engine_env": self.engine_env, "model": self.model,
            "gpus": self.gpus, "inputs": self.inputs, "notes": self.notes,
            "keep_prompts": self.keep_prompts, "extra": self.extra,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> BundleMeta:
        return cls(
            kind=obj["kind"], t0_utc=obj.get("t0_utc"), vllm_version=obj.get("vllm_version"),
            vllm_version_inferred=obj.get("vllm_version_inferred"), engine=obj.get("engine"),
            engine_args=obj.get("engine_args") or {}, engine_args_sources=obj.get("engine_args_sources") or {},
            server_args=obj.get("server_args") or {}, engine_env=obj.get("engine_env") or {}, model=obj.get("model"),
            gpus=obj.get("gpus") or [], inputs=obj.get("inputs") or [], notes=obj.get("notes") or [],
            keep_prompts=bool(obj.get("keep_prompts")), extra=obj.get("extra") or {},
        )


class BundleWriter:
    """Write a bundle incrementally; every ``flush()`` leaves a valid, readable directory."""

    def __init__(self, path: Path, meta: BundleMeta, *, flush_every: int = 5000) -> None:
        self.path = path
        self.meta = meta
        path.mkdir(parents=True, exist_ok=True)
        for stale in ("samples.parquet", "requests.parquet", "events.jsonl", "quarantine.jsonl"):
            (path / stale).unlink(missing_ok=True)
        for part in [*path.glob("samples.part*.parquet"), *path.glob("requests.part*")]:  # an interrupted run's
            part.unlink()
        self._samples: list[tuple[int, int | None, str, str, float]] = []
        self._parts = 0
        self._flush_every = flush_every
        self._requests: list[dict[str, Any]] = []
        self._events = (path / "events.jsonl").open("a", encoding="utf-8")
        self._quarantine = (path / "quarantine.jsonl").open("a", encoding="utf-8")
        self.counts = {"samples": 0, "events": 0, "quarantined": 0, "requests": 0}
        self._not_finite: dict[str, int] = {}  # metric -> values left out as NaN or infinite
        self._req_parts = 0
        self._req_extras: dict[str, pl.DataType] = {}  # (columns beyond REQUESTS_SCHEMA that parts had)
        self.write_meta()

    def write_meta(self) -> None:
        tmp = self.path / "bundle.json.tmp"
        tmp.write_text(json.dumps(self.meta.to_json(), indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path / "bundle.json")

    def sample(self, t_us: int, gpu: int | None, source: str, metric: str, value: float | None) -> None:
        if value is None:
            return  # unknown is not recorded as a number
        if not math.isfinite(value):  # (NaN: a gauge with no value, as Prometheus writes it; ±Inf: none either)
            self._not_finite[metric] = self._not_finite.get(metric, 0) + 1
            return
        self._samples.append((int(t_us), gpu, source, metric, float(value)))
        self.counts["samples"] += 1
        if len(self._samples) >= self._flush_every:
            self.flush()

    def samples_frame(self, df: pl.DataFrame) -> None:
        """Append an already-built samples frame (vectorised parsers)."""
        if df.height == 0:
            return
        df = df.select([pl.col(k).cast(v) for k, v in SAMPLES_SCHEMA.items()]).drop_nulls("value")
        odd = ~df["value"].is_finite()
        if odd.any():
            for metric, n in df.filter(odd).group_by("metric").len().iter_rows():
                self._not_finite[metric] = self._not_finite.get(metric, 0) + n
            df = df.filter(~odd)
        df.write_parquet(self.path / f"samples.part{self._parts:05d}.parquet")
        self._parts += 1
        self.counts["samples"] += df.height

    def samples_lazy(self, lf: pl.LazyFrame) -> None:
        """Append samples from a lazy query, streamed to a part file (never all in memory)."""
        part = self.path / f"samples.part{self._parts:05d}.parquet"
        lf = lf.select([pl.col(k).cast(v) for k, v in SAMPLES_SCHEMA.items()]).drop_nulls("value")
        # (the numbers of log lines: never NaN where the pattern matched, but a sample is a finite number)
        lf.filter(pl.col("value").is_finite()).sink_parquet(part)
        self._parts += 1
        self.counts["samples"] += pl.scan_parquet(part).select(pl.len()).collect().item()

    def events_lazy(self, lf: pl.LazyFrame) -> None:
        """Append events from a lazy query (columns = event keys, sorted by name as ``event`` writes them)."""
        tmp = self.path / "events.part.jsonl"
        lf = lf.select(sorted(lf.collect_schema().names()))
        lf.sink_ndjson(tmp)
        self._events.flush()
        with tmp.open("r", encoding="utf-8") as fh:
            shutil.copyfileobj(fh, self._events, 1 << 20)
        self.counts["events"] += pl.scan_ndjson(tmp).select(pl.len()).collect().item() if tmp.stat().st_size else 0
        tmp.unlink()

    def event(self, ev: dict[str, Any]) -> None:
        self._events.write(json.dumps(ev, sort_keys=True, default=str) + "\n")
        self.counts["events"] += 1

    def quarantine(self, file: str, line: int | None, reason: str, raw: str | None = None) -> None:
        rec = {"file": file, "line": line, "reason": reason,
               "raw": None if raw is None else raw[:500]}
        self._quarantine.write(json.dumps(rec) + "\n")
        self.counts["quarantined"] += 1

    def requests_frame(self, df: pl.DataFrame) -> None:
        """Append requests (REQUESTS_SCHEMA columns plus optional extras such as prompt_chars and
        prompt_sha256) as a part file, merged into requests.parquet at close. Parts are Arrow IPC:
        they are read once more, so compressing them would be wasted work; a column with no value
        in a part is left out of it (six of the recorder's nine detail columns, a quarter of a 1 GiB
        log's part files), and comes back as nulls in the merge."""
        for c, t in df.schema.items():
            if c not in REQUESTS_SCHEMA:
                self._req_extras.setdefault(c, t)
        if df.height:
            df = df.drop([c for c in df.columns if c != "id" and df[c].null_count() == df.height])
        df.write_ipc(self.path / f"requests.part{self._req_parts:05d}.arrow")
        self._req_parts += 1
        self.counts["requests"] += df.height

    def request(self, row: dict[str, Any]) -> None:
        self._requests.append(row)
        self.counts["requests"] += 1

    def flush(self) -> None:
        if self._samples:
            df = pl.DataFrame(self._samples, schema=SAMPLES_SCHEMA, orient="row")
            df.write_parquet(self.path / f"samples.part{self._parts:05d}.parquet")
            self._parts += 1
            self._samples = []
        if self._requests:
            _requests_df(self._requests).write_parquet(self.path / "requests.parquet")
        self._events.flush()
        self._quarantine.flush()
        self.write_meta()

    def close(self, remove: Callable[[Path], None] | None = None) -> None:
        """Write the bundle's final files; ``remove`` (by default, at once) takes the part files away."""
        remove = remove or Path.unlink
        if self._not_finite:
            n = sum(self._not_finite.values())
            self.meta.notes.append(f"{n} value(s) were NaN or infinite, which measure nothing, and are left out of the "
                                   "timeline: " + ", ".join(f"{m} ({k})" for m, k in sorted(self._not_finite.items())))
        self.flush()
        parts = sorted(self.path.glob("samples.part*.parquet"))
        target = self.path / "samples.parquet"
        if parts:  # a stable sort: samples at the same time keep the order they were written in
            pl.scan_parquet(parts).sort(["t_us", "source", "metric"], maintain_order=True).sink_parquet(target)
        else:
            pl.DataFrame(schema=SAMPLES_SCHEMA).write_parquet(target)
        for p in parts:
            remove(p)
        req_parts = sorted(self.path.glob("requests.part*.arrow"))
        if req_parts:
            first = _requests_df(self._requests).with_columns(pl.lit(None, dtype=t).alias(c) for c, t in self._req_extras.items())
            frames = [first.lazy(), *(pl.scan_ipc(p) for p in req_parts)]
            # (zstd level 2: of the 3.58M rows of a 1 GiB log, 39 MB in 1.3-1.6 s, against the default
            # level 3's 44 MB in 1.5-2.1 s)
            pl.concat(frames, how="diagonal_relaxed").sink_parquet(self.path / "requests.parquet", compression_level=2)
            for p in req_parts:
                remove(p)
        else:
            _requests_df(self._requests).write_parquet(self.path / "requests.parquet")
        self._events.close()
        self._quarantine.close()
        self.write_meta()


def _requests_df(rows: list[dict[str, Any]]) -> pl.DataFrame:
    clean = [{k: r.get(k) for k in REQUESTS_SCHEMA} for r in rows]
    return pl.DataFrame(clean, schema=REQUESTS_SCHEMA)


@dataclass
class Bundle:
    """A bundle read back from disk: metadata plus its frames."""

    path: Path
    meta: BundleMeta
    samples: pl.DataFrame
    events: list[dict[str, Any]]
    quarantine_count: int
    _requests: pl.DataFrame | None = field(default=None, repr=False)

    @property
    def requests(self) -> pl.DataFrame:
        """Every request row, read on first use. A day of log holds millions of them (a gigabyte in
        memory): what reports and analysis need of them they ask ``scan_requests`` for."""
        if self._requests is None:
            self._requests = self.scan_requests().collect()
        return self._requests

    def scan_requests(self) -> pl.LazyFrame:
        """The request rows as a query: only the columns and rows it asks for are read."""
        if self._requests is not None:
            return self._requests.lazy()
        p = self.path / "requests.parquet"
        if not p.exists():
            return pl.LazyFrame(schema=REQUESTS_SCHEMA)
        with _parquet_of_bundle(p):  # (its footer: a copy cut short is named here, not deep in a query)
            pl.read_parquet_schema(p)
        return pl.scan_parquet(p)

    def events_of(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") in kinds]


def _iso_time(v: Any) -> datetime | None:
    """An ISO 8601 time ('Z' for UTC), or None where ``v`` is not one."""
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")) if isinstance(v, str) else None
    except ValueError:
        return None


@contextmanager
def _parquet_of_bundle(p: Path) -> Iterator[None]:
    """A bundle's Parquet file that cannot be read (cut short by a copy, overwritten) is named in a clear
    error rather than failing deep inside the analysis."""
    try:
        yield
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ReplayError(f"{p}: cannot be read as Parquet ({str(e).splitlines()[0][:200]}); the bundle is "
                          "damaged or cut short: copy it again, or record it again") from None


def _read_parquet(p: Path) -> pl.DataFrame:
    with _parquet_of_bundle(p):
        return pl.read_parquet(p)


def read_bundle(path: Path) -> Bundle:
    """Read a bundle; refuse one written by a newer schema with a clear message. Its request rows are
    read when they are asked for (``Bundle.requests``, ``Bundle.scan_requests``)."""
    meta_path = path / "bundle.json"
    if not path.is_dir() or not meta_path.exists():
        raise ReplayError(f"{path}: not a replay bundle (no bundle.json)")
    try:
        obj = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReplayError(f"{meta_path}:{e.lineno}: bundle.json is not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ReplayError(f"{meta_path}: not a bundle's metadata (a JSON object is expected)")
    schema = str(obj.get("schema", ""))
    name, _, ver = schema.partition("/")
    if name != "replay-bundle" or not is_uint(ver):
        raise ReplayError(f"{meta_path}: unknown schema {schema!r}; expected {SCHEMA}")
    if int(ver) > SCHEMA_VERSION:
        raise ReplayError(
            f"{meta_path}: written by a newer replay ({schema}); this replay reads {SCHEMA}. "
            "Upgrade replay to read this bundle."
        )
    if obj.get("kind") not in ("production", "replay"):
        raise ReplayError(f"{meta_path}: kind {obj.get('kind')!r}; expected 'production' or 'replay'")
    t0 = obj.get("t0_utc")
    if t0 is not None and _iso_time(t0) is None:
        raise ReplayError(f"{meta_path}: t0_utc {t0!r} is not an ISO 8601 time such as 2025-05-01T10:00:00Z")
    meta = BundleMeta.from_json(obj)
    frames = [_read_parquet(p) for p in [path / "samples.parquet", *sorted(path.glob("samples.part*.parquet"))] if p.exists()]
    samples = pl.concat(frames).sort("t_us", maintain_order=True) if frames else pl.DataFrame(schema=SAMPLES_SCHEMA)
    events: list[dict[str, Any]] = []
    ev_path = path / "events.jsonl"
    if ev_path.exists():
        lines = ev_path.read_text(encoding="utf-8", errors="replace").splitlines()
        bad: list[int] = []
        for no, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    ev = None
                if isinstance(ev, dict):
                    events.append(ev)
                else:
                    bad.append(no)
        if bad == [len(lines)]:  # a recording stopped while it wrote its last event
            meta.notes.append(f"{ev_path.name}: its last line (line {bad[0]}) is cut short, as a recording that "
                              f"stopped while writing leaves it; the {len(events)} events before it are read")
        elif bad:
            shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
            meta.notes.append(f"{ev_path.name}: {len(bad)} line(s) are not events (not a JSON object: line {shown}) "
                              "and are left out; the bundle was changed or damaged after it was written")
    q_path = path / "quarantine.jsonl"
    q = 0
    if q_path.exists():  # (counted line by line: a quarantine can be as large as the evidence)
        with q_path.open(encoding="utf-8", errors="replace") as fh:
            q = sum(1 for ln in fh if ln.strip())
    return Bundle(path, meta, samples, events, q)
