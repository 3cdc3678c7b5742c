"""``replay synth --servegen``: a workload drawn from the characterisation of real clients.

Alibaba's ServeGen publishes, for each client of its production models, not requests but their
shape: per 600-second window the arrival rate and the fitted distribution of the gaps between
arrivals (Gamma or Weibull; ``chunk-N-trace.csv``), and every six hours the distribution of each
request field (``chunk-N-dataset.json``: input and output tokens; text, image, audio and video
tokens and counts for multimodal models; the reasoning share of the output for reasoning models).
A client's rhythm is bursty in a way a Poisson process is not, and its lengths shift over the day:
this module turns that into a ``replay-trace/1`` trace that replays like an imported one.

Each window with traffic gets exactly its rate x 600 s arrivals (times ``rate_scale``, rounded
without bias): gaps drawn from the window's fitted distribution and stretched so that they span it,
which keeps the distribution's burstiness (its coefficient of variation) and the window's count.
Fields are drawn independently from their window's distributions, one draw per image, audio or
video item, as ServeGen itself draws them. The same seed gives the same file.
"""

from __future__ import annotations

import ast
import bisect
import csv
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.errors import ReplayError, where
from replay.filehash import file_sha256
from replay.trace.format import TraceHeader

WINDOW_S = 600  # ServeGen's rate windows
_CHUNK = re.compile(r"^chunk-(?P<n>[^-]+)-(?:trace\.csv|dataset\.json)$")
_DISTS = ("Gamma", "Weibull", "")
_ITEMS = ("image", "audio", "video")


@dataclass(frozen=True)
class Window:
    """One rate window: its start, rate (requests/s) and fitted gap distribution ("" when none)."""

    start_s: int
    rate: float
    dist: str
    shape: float
    scale: float
    line: int  # in the trace CSV


@dataclass
class Pdf:
    """A discrete distribution as its values and cumulative weights."""

    values: list[float]
    cum: list[float]

    def draw(self, rng: random.Random) -> float:
        return self.values[min(bisect.bisect_right(self.cum, rng.random() * self.cum[-1]), len(self.values) - 1)]


@dataclass
class Client:
    """One ServeGen client: its rate windows and its field distributions by six-hour window."""

    name: str
    trace: Path
    dataset: Path
    windows: list[Window]
    pdfs: dict[int, dict[str, Pdf]]  # dataset window start -> field -> distribution (empty fields left out)
    borrowed: int = field(default=0)  # requests drawn from a neighbouring dataset window (their own was empty)
    keys: list[int] = field(init=False)  # the dataset windows' starts, in order

    def __post_init__(self) -> None:
        self.keys = sorted(self.pdfs)

    def fields_at(self, t_s: float) -> dict[str, Pdf]:
        """The distributions in force at ``t_s``: the last dataset window at or before it; if that one
        is empty (the data has windows with no requests), the nearest window that is not."""
        at = self.keys[max(0, bisect.bisect_right(self.keys, t_s) - 1)]
        if self.pdfs[at]:
            return self.pdfs[at]
        self.borrowed += 1
        return self.pdfs[min((k for k in self.keys if self.pdfs[k]), key=lambda k: abs(k - t_s))]


def client_files(paths: list[Path]) -> list[tuple[Path, Path]]:
    """(trace CSV, dataset JSON) of each client named: a chunk's file of either kind, or a folder of
    chunks (every client in it)."""
    pairs: list[tuple[Path, Path]] = []
    for p in paths:
        if p.is_dir():
            traces = sorted(p.glob("chunk-*-trace.csv"), key=lambda q: _natural(q.name))
            if not traces:
                raise ReplayError(f"{p}: no ServeGen client here (expected chunk-N-trace.csv with chunk-N-dataset.json)")
        elif p.is_file():
            m = _CHUNK.match(p.name)
            if not m:
                raise ReplayError(f"{p}: not a ServeGen client file (expected chunk-N-trace.csv or chunk-N-dataset.json)")
            traces = [p.with_name(f"chunk-{m['n']}-trace.csv")]
        else:
            raise ReplayError(f"{p}: no such file or folder")
        for t in traces:
            d = t.with_name(t.name.replace("-trace.csv", "-dataset.json"))
            for f in (t, d):
                if not f.is_file():
                    raise ReplayError(f"{f}: missing: a ServeGen client is a chunk-N-trace.csv and a chunk-N-dataset.json side by side")
            pairs.append((t, d))
    return list(dict.fromkeys(pairs))


def _natural(name: str) -> list[Any]:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def read_windows(path: Path) -> list[Window]:
    """``window_start_s,rate_rps,cv,dist,shape,scale`` rows (no header), checked line by line."""
    out: list[Window] = []
    with path.open(newline="", encoding="utf-8", errors="replace") as fh:
        for no, row in enumerate(csv.reader(fh), start=1):
            if not row or not "".join(row).strip():
                continue
            if len(row) != 6:
                raise ReplayError(f"{where(path, no)}: expected 6 fields (window_start_s, rate, cv, distribution, "
                                  f"shape, scale), found {len(row)}")
            try:
                start, rate, shape, scale = int(float(row[0])), float(row[1]), float(row[4] or 0), float(row[5] or 0)
            except ValueError:
                raise ReplayError(f"{where(path, no)}: not a number in {','.join(row)!r}") from None
            dist = row[3].strip()
            if dist not in _DISTS:
                raise ReplayError(f"{where(path, no)}: unknown gap distribution {dist!r} (ServeGen fits Gamma or Weibull)")
            if not (math.isfinite(rate) and rate >= 0) or start < 0:
                raise ReplayError(f"{where(path, no)}: a rate and a window start must be 0 or more, found {row[1]!r} at {row[0]!r}")
            if dist and rate > 0 and not (shape > 0 and scale > 0 and math.isfinite(shape * scale)):
                raise ReplayError(f"{where(path, no)}: {dist} needs a positive shape and scale, found {row[4]!r}, {row[5]!r}")
            if out and start <= out[-1].start_s:
                raise ReplayError(f"{where(path, no)}: window {start} s does not follow window {out[-1].start_s} s")
            out.append(Window(start, rate, dist, shape, scale, no))
    if not out:
        raise ReplayError(f"{path}: no windows")
    return out


def read_pdfs(path: Path) -> dict[int, dict[str, Pdf]]:
    """``{window_start: {field: "{value: probability, ...}"}}``; each distribution checked."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise ReplayError(f"{where(path, e.lineno)}: not JSON ({e.msg})") from None
    if not isinstance(doc, dict) or not doc:
        raise ReplayError(f"{path}: expected an object of dataset windows ({{\"0\": {{\"input_tokens\": \"{{...}}\"}}}})")
    out: dict[int, dict[str, Pdf]] = {}
    for key, fields in doc.items():
        try:
            start = int(key)
        except ValueError:
            raise ReplayError(f"{path}: window {key!r} is not a start in seconds") from None
        if not isinstance(fields, dict):
            raise ReplayError(f"{path}: window {key}: expected an object of field distributions")
        out[start] = {}
        for name, text in fields.items():
            pdf = _pdf(text)
            if pdf is None:
                raise ReplayError(f"{path}: window {key}, field {name!r}: not a distribution "
                                  f"('{{value: probability, ...}}' with probabilities 0 or more): {str(text)[:80]!r}")
            if pdf.values:
                out[start][name] = pdf
    if not any(out.values()):
        raise ReplayError(f"{path}: every distribution is empty")
    return out


def _pdf(text: Any) -> Pdf | None:
    try:
        d = ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    items = sorted(d.items())
    if not all(isinstance(v, int | float) and isinstance(p, int | float) and math.isfinite(v) and math.isfinite(p)
               and p >= 0 and not isinstance(v, bool) for v, p in items):
        return None
    kept = [(float(v), float(p)) for v, p in items if p > 0]
    if d and not kept:
        return None
    return Pdf([v for v, _ in kept], list(itertools.accumulate(p for _, p in kept)))


def load_client(trace: Path, dataset: Path) -> Client:
    parts = trace.parent.parts[-2:]
    name = "/".join([*parts, trace.name.removesuffix("-trace.csv")])
    return Client(name, trace, dataset, read_windows(trace), read_pdfs(dataset))


def _gaps(rng: random.Random, w: Window, n: int, path: Path) -> list[float]:
    """``n + 1`` gaps from the window's distribution (exponential where none was fitted), at unit
    scale: they are stretched to span the window, so only the shape counts."""
    try:
        if w.dist == "Gamma":
            gaps = [rng.gammavariate(w.shape, 1.0) for _ in range(n + 1)]
        elif w.dist == "Weibull":
            gaps = [rng.weibullvariate(1.0, w.shape) for _ in range(n + 1)]
        else:
            gaps = [rng.expovariate(1.0) for _ in range(n + 1)]
        total = math.fsum(gaps)
    except OverflowError:
        total = math.inf
    if not (0 < total < math.inf):
        raise ReplayError(f"{where(path, w.line)}: {w.dist} gaps of shape {w.shape:g} cannot be drawn "
                          "(they overflow or vanish); is the fit damaged?")
    return [g / total for g in gaps]


def _request(c: Client, rng: random.Random, t_s: float) -> dict[str, Any]:
    pdfs = c.fields_at(t_s)
    drawn = {k: pdfs[k].draw(rng) for k in sorted(pdfs) if not k.endswith("_tokens") or k[:-7] not in _ITEMS}
    mm: list[dict[str, Any]] = []
    item_tokens = 0
    for kind in _ITEMS:  # one draw per item, as ServeGen draws them
        n = int(drawn.pop(f"{kind}_count", 0))
        if n > 0 and f"{kind}_tokens" in pdfs:
            tokens = sum(int(pdfs[f"{kind}_tokens"].draw(rng)) for _ in range(n))
            mm.append({"type": kind, "count": n, "tokens": tokens})
            item_tokens += tokens
    extra: dict[str, Any] = {"client": c.name}
    if "input_tokens" in drawn:
        n_in = int(drawn.pop("input_tokens"))
    else:
        text = int(drawn.pop("text_tokens", 0))
        extra["text_tokens"] = text
        n_in = text + item_tokens
    n_out = int(drawn.pop("output_tokens")) if "output_tokens" in drawn else None
    if "reason_ratio" in drawn:
        ratio = drawn.pop("reason_ratio")
        extra["reason_ratio"] = ratio
        if n_out is not None:
            extra["reason_tokens"] = round(n_out * ratio)
    extra.update({k: int(v) if v.is_integer() else v for k, v in drawn.items()})  # fields of newer data, kept
    return {"input_tokens": n_in, "output_tokens": n_out, "output_kind": "observed" if n_out is not None else "unknown",
            "max_tokens": n_out, "prefix_blocks": None, "session_id": None, "sampling": {}, "mm": mm or None,
            "status": "ok", "extra": extra}


@dataclass
class ServeGenSpec:
    clients: list[Path]
    start_s: float | None = None  # None: the first window with traffic
    duration_s: float = 3600.0
    rate_scale: float = 1.0
    max_requests: int | None = None
    seed: int = 0


def synth_servegen(spec: ServeGenSpec) -> tuple[TraceHeader, list[dict[str, Any]]]:
    """The trace of ``spec.clients`` over ``[start, start + duration)`` of their data, rebased to 0."""
    if not (spec.duration_s > 0 and 0 < spec.rate_scale < math.inf):  # (NaN fails both)
        raise ReplayError("--duration and --rate-scale must be positive (and --rate-scale finite)", 2)
    clients = [load_client(t, d) for t, d in client_files(spec.clients)]
    busy = [w.start_s for c in clients for w in c.windows if w.rate > 0]
    if not busy:
        raise ReplayError(f"{', '.join(str(c.trace) for c in clients)}: no window has any traffic")
    start = float(min(busy)) if spec.start_s is None else spec.start_s
    end = start + spec.duration_s
    rng = random.Random(spec.seed)
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for ci, c in enumerate(clients):
        for w in c.windows:
            w_end = w.start_s + WINDOW_S
            if w.rate <= 0 or w_end <= start or w.start_s >= end:
                continue
            want = round(w.rate * spec.rate_scale * WINDOW_S, 6)  # (0.805 * 600 is 482.99999999999994)
            n = int(want) + (1 if rng.random() < want - int(want) else 0)
            if n == 0:
                continue
            t = float(w.start_s)
            for g in _gaps(rng, w, n, c.trace)[:n]:
                t += g * WINDOW_S
                if start <= t < end and t < w_end:
                    rows.append((t, ci, _request(c, rng, t)))
    if not rows:
        raise ReplayError(f"no request falls in {start:g}-{end:g} s of the clients' data: choose --start where a "
                          f"window has traffic (the first is at {min(busy)} s)")
    rows.sort(key=lambda r: (r[0], r[1]))
    if spec.max_requests is not None:
        rows = rows[:spec.max_requests]
    out = []
    for i, (t, _, r) in enumerate(rows):
        out.append({"id": f"sg{i}", "t_us": int(round((t - start) * 1_000_000)), "src_ts": round(t, 6), **r})
    t0 = out[0]["t_us"]
    for r in out:  # the trace starts at its first arrival
        r["t_us"] -= t0
    header = TraceHeader(
        source={"format": "servegen", "generator": "replay synth --servegen", "seed": spec.seed,
                "name": "servegen:" + "+".join(c.name for c in clients),
                "clients": [{"name": c.name, "trace": str(c.trace), "trace_sha256": file_sha256(c.trace),
                             "dataset": str(c.dataset), "dataset_sha256": file_sha256(c.dataset)} for c in clients],
                "start_s": start, "duration_s": spec.duration_s, "rate_scale": spec.rate_scale,
                "max_requests": spec.max_requests,
                "borrowed_dataset_window": sum(c.borrowed for c in clients)},
        time={"src_unit": "s", "src_origin": "synthetic", "tz_assumed": None, "clock": "synthetic",
              "quantum_ms": None, "sorted": True},
        import_counts={"rows_read": len(out), "rows_emitted": len(out), "quarantined": 0},
    )
    return header, out
