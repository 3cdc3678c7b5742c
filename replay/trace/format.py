"""Reading and writing ``replay-trace/1`` files; the schema is documented in docs/trace-format.md.

A trace is the traffic to replay. Its header says where the rows came from and how time was
interpreted; each request carries what changes memory in vLLM (lengths, max_tokens, sampling,
multimodal items, prefix sharing). Unknown source columns are kept in ``extra`` so nothing is lost.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from replay.atomic import written_in_place
from replay.errors import ReplayError, where
from replay.filehash import open_decompressed, refuse_stream
from replay.units import is_uint

SCHEMA = "replay-trace/1"
SCHEMA_NAME, SCHEMA_VERSION = "replay-trace", 1
OUTPUT_KINDS = ("observed", "cap", "unknown", "failed", "aborted")
STATUSES = ("ok", "error", "timeout", "oom", "aborted", "unknown")

REQUEST_FIELDS = (
    "id", "t_us", "src_ts", "src_row", "input_tokens", "output_tokens", "output_kind",
    "max_tokens", "prefix_blocks", "session_id", "sampling", "mm", "status", "src_latency_us", "extra",
)


@dataclass
class TraceHeader:
    source: dict[str, Any]
    time: dict[str, Any]
    tokens: dict[str, Any] = field(default_factory=lambda: {"tokenizer": "unknown"})
    prefix: dict[str, Any] = field(default_factory=lambda: {"block_size": None})
    import_counts: dict[str, Any] = field(default_factory=dict)
    engine_args: dict[str, Any] | None = None
    production: dict[str, Any] | None = None
    fields: dict[str, Any] | None = None  # per field: how many requests observed, inferred, defaulted, and from what
    notes: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "header", "schema": SCHEMA, "source": self.source, "time": self.time,
            "tokens": self.tokens, "prefix": self.prefix, "import": self.import_counts,
        }
        if self.engine_args is not None:
            out["engine_args"] = self.engine_args
        if self.production is not None:
            out["production"] = self.production
        if self.fields is not None:
            out["fields"] = self.fields
        if self.notes:
            out["notes"] = self.notes
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any], path: Path) -> TraceHeader:
        schema = str(obj.get("schema", ""))
        name, _, ver = schema.partition("/")
        if name not in (SCHEMA_NAME, "replay-trace") or not is_uint(ver.lstrip("v")):
            raise ReplayError(f"{where(path, 1)}: not a replay trace header (schema={schema!r})")
        if int(ver.lstrip("v")) > SCHEMA_VERSION:
            raise ReplayError(
                f"{where(path, 1)}: written by a newer replay ({schema}); this replay reads "
                f"{SCHEMA}. Upgrade replay to read it."
            )
        return cls(
            source=obj.get("source", {}), time=obj.get("time", {}),
            tokens=obj.get("tokens", {}), prefix=obj.get("prefix", {}),
            import_counts=obj.get("import", {}), engine_args=obj.get("engine_args"),
            production=obj.get("production"), fields=obj.get("fields"), notes=obj.get("notes"),
        )


def _open_text(path: Path) -> Any:
    if path.is_dir():
        raise ReplayError(f"{path}: is a directory, expected a trace file")
    if not path.exists():
        raise ReplayError(f"{path}: no such file")
    refuse_stream(path)
    return io.TextIOWrapper(open_decompressed(path), encoding="utf-8")


def read_header(path: Path) -> TraceHeader:
    with _open_text(path) as fh:
        first = fh.readline()
    if not first.strip():
        raise ReplayError(f"{where(path, 1)}: empty trace (expected a header line)")
    try:
        obj = json.loads(first)
    except json.JSONDecodeError as e:
        raise ReplayError(f"{where(path, 1)}: header is not JSON ({e.msg})") from None
    if not isinstance(obj, dict) or obj.get("kind") != "header":
        raise ReplayError(f"{where(path, 1)}: first line must be the header object (kind=header)")
    return TraceHeader.from_json(obj, path)


def validate_request(obj: Any, path: Path, line: int) -> dict[str, Any]:
    """Check one request line; raise ReplayError naming file:line on the first problem."""
    loc = where(path, line)
    if not isinstance(obj, dict):
        raise ReplayError(f"{loc}: request must be a JSON object")
    if obj.get("kind", "request") != "request":
        raise ReplayError(f"{loc}: unexpected kind {obj.get('kind')!r}")
    t = obj.get("t_us")
    if not isinstance(t, int) or isinstance(t, bool) or t < 0:
        raise ReplayError(f"{loc}: t_us must be a non-negative integer (µs from t0), got {t!r}")
    n_in = obj.get("input_tokens")
    has_text = obj.get("prompt") is not None or obj.get("prompt_token_ids") is not None
    if not has_text and (not isinstance(n_in, int) or n_in < 0):
        raise ReplayError(f"{loc}: input_tokens must be an integer >= 0, got {n_in!r}")
    n_out = obj.get("output_tokens")
    if n_out is not None and (not isinstance(n_out, int) or n_out < 0):
        raise ReplayError(f"{loc}: output_tokens must be null or an integer >= 0, got {n_out!r}")
    kind = obj.get("output_kind", "observed")
    if kind not in OUTPUT_KINDS:
        raise ReplayError(f"{loc}: output_kind {kind!r} is not one of {', '.join(OUTPUT_KINDS)}")
    _check_mm(obj.get("mm"), loc)
    if "id" not in obj:  # defaults, as in docs/trace-format.md
        src_row = obj.get("src_row")
        obj["id"] = f"r{src_row}" if isinstance(src_row, int) else f"{path.name}#{line}"
    obj.setdefault("output_kind", "observed")
    obj.setdefault("status", "ok")
    obj.setdefault("max_tokens", None)
    return obj


MM_COUNTS = ("count", "width", "height", "tokens")  # (integers an mm item may carry; null where unknown)


def _check_mm(mm: Any, loc: str) -> None:
    """``mm``: null, or a list of items, each an object with a ``type`` (a string) and, where known,
    its ``count`` (at least 1), ``width``, ``height`` and ``tokens`` (integers >= 0)."""
    if mm is None:
        return
    if not isinstance(mm, list):
        raise ReplayError(f"{loc}: mm must be null or a list of items such as "
                          f'{{"type": "image", "count": 1, "width": 1024, "height": 768}}, got {mm!r:.80}')
    for i, item in enumerate(mm):
        if not isinstance(item, dict) or not isinstance(item.get("type", "image"), str):
            raise ReplayError(f"{loc}: mm[{i}] must be an object with a type (such as \"image\"), got {item!r:.80}")
        for k in MM_COUNTS:
            v = item.get(k)
            least = 1 if k == "count" else 0
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
                raise ReplayError(f"{loc}: mm[{i}].{k} must be null or an integer >= {least}, got {v!r:.80}")


def iter_requests(path: Path) -> Iterator[dict[str, Any]]:
    """Yield validated requests in file order (the header is checked first)."""
    read_header(path)
    with _open_text(path) as fh:
        fh.readline()
        for i, raw in enumerate(fh, start=2):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ReplayError(f"{where(path, i)}: not JSON ({e.msg} at column {e.colno})") from None
            yield validate_request(obj, path, i)


def read_trace(path: Path) -> tuple[TraceHeader, list[dict[str, Any]]]:
    header = read_header(path)
    return header, list(iter_requests(path))


def write_trace(path: Path, header: TraceHeader, requests: Iterable[dict[str, Any]],
                progress: Callable[[int], None] | None = None) -> tuple[int, int | None]:
    """Write a trace: its header, then its requests as they come (an iterator is never held whole).
    Written beside ``path`` and renamed into place, so that an interrupted write leaves the last trace
    there as it was. ``progress`` is told how many requests are written, every few thousand. Returns
    how many were written and the last one's ``t_us``."""
    n, last_t = 0, None
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    with written_in_place(path) as part, part.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(header.to_json(), sort_keys=False) + "\n")
        for r in requests:
            fh.write(dumps(r) + "\n")
            n += 1
            if progress is not None and n % 4096 == 0:
                progress(n)
            last_t = r.get("t_us")
    if progress is not None:
        progress(n)
    return n, last_t


def requests_frame(requests: list[dict[str, Any]]) -> pl.DataFrame:
    """Flatten the memory-relevant request attributes for analysis (one row per request)."""
    rows = []
    for r in requests:
        s = r.get("sampling") or {}
        mm = r.get("mm") or []
        rows.append({
            "id": str(r["id"]), "t_us": int(r["t_us"]),
            "input_tokens": r.get("input_tokens"), "output_tokens": r.get("output_tokens"),
            "max_tokens": r.get("max_tokens"),
            "prompt_logprobs": s.get("prompt_logprobs"), "logprobs": s.get("logprobs"),
            "n": s.get("n"), "best_of": s.get("best_of"),
            "mm_items": sum(int(m.get("count", 1)) for m in mm) if mm else 0,
            "prefix_blocks": len(r.get("prefix_blocks") or []),
        })
    return pl.DataFrame(rows, schema={
        "id": pl.Utf8, "t_us": pl.Int64, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
        "max_tokens": pl.Int64, "prompt_logprobs": pl.Int64, "logprobs": pl.Int64,
        "n": pl.Int64, "best_of": pl.Int64, "mm_items": pl.Int64, "prefix_blocks": pl.Int64,
    })
