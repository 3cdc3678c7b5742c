"""The incident bundle (``replay-bundle/1``): the one contract between recording, replay and analysis.

A bundle is a directory written by the recorder (production evidence) and by the replayer (a
replay run) alike: ``bundle.json`` (metadata and every input with its hash and counts),
``requests.parquet``, ``samples.parquet`` (long format ``t_us, gpu, source, metric, value``),
``events.jsonl`` and ``quarantine.jsonl``. Samples are flushed to numbered part files while a
recording runs; ``close()`` merges them and marks the bundle complete (``"complete": true`` in
``bundle.json``), and a reader refuses a bundle whose writing did not finish (a live recording's
excepted: what it flushed is read, with a note).

A bundle is written beside its path (``bundle_written``: ``OUT.partial-PID``) and swapped in whole
when it is complete, so an interrupted or failed writer leaves the last complete bundle as it was.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from replay.atomic import WRITE_ERRNOS, WRITE_WHY, write_error
from replay.errors import EXIT_IO, EXIT_USAGE, ReplayError
from replay.sortmerge import KeySample, Part, frame_part, parquet_rows, sink_frames, sort_parts
from replay.units import MAX_GPU_INDEX, is_uint

SCHEMA = "replay-bundle/1"
SCHEMA_VERSION = 1

SAMPLES_SCHEMA = {
    "t_us": pl.Int64, "gpu": pl.Int32, "source": pl.Utf8, "metric": pl.Utf8, "value": pl.Float64,
}
# a bundle read back holds its samples' names (a few dozen sources and metrics over millions of rows)
# as categories: a fleet's day of 22.5M samples takes 0.6 GB so, 1.27 GB as text. They are written so
# too (Parquet's dictionary of strings, which any reader reads as text): of 20M samples, the merge of
# the parts took 2.7 s against 3.3 s, and a query of every sample 0.15 s against 0.62 s (bundles
# written before, as text, are read the same)
SAMPLE_NAMES = ("source", "metric")
SAMPLES_READ_SCHEMA = {c: pl.Categorical() if c in SAMPLE_NAMES else t for c, t in SAMPLES_SCHEMA.items()}
SAMPLES_FILE_SCHEMA = SAMPLES_READ_SCHEMA
# the sources of a GPU's device memory, in the order the analysis prefers them; a machine other than the
# incident's keeps its own series under the same source with a tag ('dcgm[Hostname=node-2]'), and so does
# each MIG instance of a split GPU ('dcgm[GPU_I_ID=3]', ``mig_source``)
DEVICE_SOURCES = ("nvml", "dcgm", "nvidia-smi")
MIG_TAG = "[GPU_I_ID="  # (what names a MIG instance's series)


def mig_source(source: str, instance: str) -> str:
    """The source of a MIG instance's device memory: 'nvidia-smi', '3' -> 'nvidia-smi[GPU_I_ID=3]'."""
    return f"{source}{MIG_TAG}{instance}]"


def names_where(names: pl.Expr, test: Callable[[pl.Expr], pl.Expr]) -> pl.Expr:
    """Whether each row's name (a sample's source or metric) passes ``test``, a test on text that sees
    each distinct name once: as a bundle reads them they are categories (``SAMPLE_NAMES``), which
    text tests do not take, and a few names stand for millions of rows; a frame of text is tested alike."""
    distinct = names.unique(maintain_order=True)
    return names.is_in(distinct.filter(test(distinct.cast(pl.Utf8))).implode())


def _device_shape(tagged_only: bool) -> str:
    return "^(?:" + "|".join(DEVICE_SOURCES) + (r")\[" if tagged_only else r")(?:\[|$)")


def device_source(source: pl.Expr, tagged_only: bool = False) -> pl.Expr:
    """Whether a sample's ``source`` is device memory: one of DEVICE_SOURCES, as it is or with its tags
    ('dcgm[Hostname=node-2]', 'nvidia-smi[GPU_I_ID=3][node-b.txt]'); with ``tagged_only``, tagged ones alone."""
    shape = _device_shape(tagged_only)
    return names_where(source, lambda s: s.str.contains(shape))


def is_device_source(source: str, tagged_only: bool = False) -> bool:
    """``device_source`` of one name."""
    return re.match(_device_shape(tagged_only), source) is not None


Samples = pl.LazyFrame | pl.DataFrame  # a bundle's samples: a query over its file (``Bundle.scan_samples``), or a frame


def sample_names(samples: Samples, column: str = "source") -> list[str]:
    """The distinct names of a samples query's ``column`` (one of SAMPLE_NAMES), as text: one streaming
    pass over that column alone. A test on names is made on these, and the rows asked for by ``is_in``:
    the query reads only the rows it keeps (``names_where`` in a query over a file held every name)."""
    names = samples.lazy().select(pl.col(column).unique().cast(pl.Utf8)).collect(engine="streaming").to_series()
    return sorted(names.drop_nulls().to_list())


def samples_where(samples: Samples, keep: pl.Expr) -> pl.DataFrame:
    """The samples ``keep`` keeps, in their order: from a bundle's file (``Bundle.scan_samples``), only
    they are read."""
    return samples.lazy().filter(keep).collect(engine="streaming")
REQUESTS_SCHEMA = {
    "id": pl.Utf8, "arrival_us": pl.Int64, "sent_us": pl.Int64, "first_token_us": pl.Int64,
    "finish_us": pl.Int64, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
    "max_tokens": pl.Int64, "prompt_logprobs": pl.Int64, "logprobs": pl.Int64, "n": pl.Int64,
    "best_of": pl.Int64, "mm_items": pl.Int64, "prefix_blocks": pl.Int64, "status": pl.Utf8,
    "error": pl.Utf8, "source": pl.Utf8,
    "image_tokens": pl.Int64,  # (a request's images' tokens; null where it had none or they are unknown)
}


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


# The names a bundle writer creates in its folder: all that replacing a bundle removes of the old one
# (anything else there is the user's, and is kept), and the names a folder that is not a bundle must
# not hold for a bundle to be written into it.
OWN_FILES = frozenset({"bundle.json", "samples.parquet", "requests.parquet", "events.jsonl", "quarantine.jsonl",
                       "server.log", "events.part.jsonl"})
SORT_SPILL = ".samples.sort"  # the samples' pieces, spilled while close() sorts them
OWN_DIRS = frozenset({".spill", "probe", SORT_SPILL})  # (the recorder's spilled pieces; the replay's in-engine probe; the merge's)
_OWN_PARTS = re.compile(r"(?:bundle\.json|samples(?:\.part\d+)?\.parquet)\.tmp|samples\.part\d+\.parquet|requests\.part\d+\.(?:arrow|parquet)"
                        r"|(?:requests\.parquet|bundle\.json)\.\d+\.part")  # (the last: written in place, replay.atomic)
PARTIAL = ".partial-"  # OUT.partial-PID: the folder a bundle is written in until it is complete


def own_name(name: str) -> bool:
    """Whether ``name`` is one a bundle writer creates in its folder."""
    return name in OWN_FILES or name in OWN_DIRS or _OWN_PARTS.fullmatch(name) is not None


def _bundle_json(path: Path) -> dict[str, Any] | None:
    """A folder's bundle.json, where it is one of a replay bundle (an object with a replay-bundle schema)."""
    try:
        with (path / "bundle.json").open("rb") as fh:
            obj = json.loads(fh.read(64 << 20))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) and str(obj.get("schema", "")).startswith("replay-bundle/") else None


def check_out(path: Path, force: bool = False, flag: str = "-o") -> None:
    """Refuse an output bundle where writing it would cost a file the tool did not write: a file in
    its place; a folder that is not a bundle and holds files (unless ``force``: the bundle is then
    written among them, and they are kept); and, even with ``force``, such a folder holding a file of
    a bundle's own name (the user's events.jsonl or bundle.json), which the bundle would replace. An
    empty folder, or a bundle, may be written (a bundle is replaced whole once the new one is complete)."""
    if path.is_symlink() and not path.exists():
        raise ReplayError(f"{flag} {path}: a link to {os.readlink(path)}, which leads nowhere", EXIT_USAGE)
    if not path.exists():
        return
    if not path.is_dir():
        raise ReplayError(f"{flag} {path}: is a file; a bundle is a folder (name a new one, such as "
                          f"{path.with_suffix('.bundle')})", EXIT_USAGE)
    if _bundle_json(path) is not None:
        return
    names = sorted(os.listdir(path))
    if not names:
        return
    clash = [n for n in names if own_name(n)]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if clash:
        raise ReplayError(f"{flag} {path}: a folder that is not a bundle, holding {', '.join(clash[:5])}, which a "
                          "bundle's own files would replace: name a new folder", EXIT_USAGE)
    if not force:
        raise ReplayError(f"{flag} {path}: a folder that is not a bundle, holding {shown}: name a new folder (or add "
                          "--force to write the bundle among these files, which are kept)", EXIT_USAGE)


def _real(out: Path) -> Path:
    """Where a bundle named ``out`` lies: a link to a bundle stands for the bundle it leads to (replaced
    there; the link is kept)."""
    return out.resolve() if out.is_symlink() and out.exists() else Path(os.path.abspath(out))  # ('.': the folder's name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    return True


def _writer_of(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """Who is writing a bundle (pid, host, since), where its bundle.json says it is being written."""
    w = obj.get("writing") if obj is not None and obj.get("complete") is False else None
    return w if isinstance(w, dict) else None


def _still_writing(w: dict[str, Any] | None) -> bool:
    """Whether a bundle's writer is a process running now on this host."""
    if not w:
        return False
    pid = w.get("pid")
    return w.get("host") == socket.gethostname() and isinstance(pid, int) and pid > 0 and _alive(pid)


def _remove_stale_partials(out: Path) -> None:
    """The partial folders of writers of ``out`` that died without cleaning up (SIGKILL, a power cut):
    removed where every file in them is a bundle writer's, its process is gone and it is not a live
    recording (what one flushed is its user's data, read as it is)."""
    for p in out.parent.glob(f"{_glob_escape(out.name)}{PARTIAL}*"):
        m = re.fullmatch(re.escape(out.name + PARTIAL) + r"(\d+)(?:-\d+)?", p.name)
        if m is None or not p.is_dir() or p.is_symlink() or _alive(int(m.group(1))):
            continue
        obj = _bundle_json(p)
        w = _writer_of(obj)
        if (obj is not None and (obj.get("extra") or {}).get("live_url")) or (w and w.get("host") != socket.gethostname()):
            continue
        try:
            if all(own_name(n) for n in os.listdir(p)):
                shutil.rmtree(p)
        except OSError:
            continue


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _aside(out: Path, what: str) -> Path:
    """A name beside ``out`` that nothing has: OUT{what}PID, or OUT{what}PID-2, …"""
    k = 1
    while True:
        p = out.with_name(f"{out.name}{what}{os.getpid()}" + (f"-{k}" if k > 1 else ""))
        if not os.path.lexists(p):
            return p
        k += 1


def _new_partial(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:
        p = _aside(out, PARTIAL)
        try:
            p.mkdir()
            return p
        except FileExistsError:  # (made in between)
            continue


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (a cleanup or a swap half done is worse than
    either), then act."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    prev = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    held = [s for s, h in prev.items() if h is not None]
    for s in held:
        signal.signal(s, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for s in held:
            signal.signal(s, prev[s])
        if got:
            signal.raise_signal(got[0])


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths at once (Linux's renameat2 RENAME_EXCHANGE); False where the system or the file
    system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _remove_own(folder: Path) -> None:
    for n in os.listdir(folder):
        if own_name(n):
            p = folder / n
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)


def _swap_in(part: Path, out: Path) -> None:
    """Put the complete bundle ``part`` at ``out``. Where nothing is there, it is renamed there. Into a
    folder that is not a bundle (empty, or the user's files with --force) its files are moved, its
    bundle.json last, so that the folder is a bundle only once it is all there; the folder stays the
    same one (a shell in it stays in it). A bundle there is replaced at once (the two folders swapped),
    its own files then removed and any other file in it (the user's) moved into the new one; where
    such a file has a name the new bundle has too (one that appeared while the bundle was written),
    the old folder is kept whole beside it as OUT.previous-PID."""
    if not os.path.lexists(out):
        try:
            os.rename(part, out)
            return
        except OSError as e:  # (made in between)
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    if not out.is_dir() or out.is_symlink():
        raise OSError(errno.EEXIST, "a file is in the way", str(out))
    if _bundle_json(out) is None:
        names = sorted(os.listdir(part), key=lambda n: n == "bundle.json")
        there = [n for n in names if os.path.lexists(out / n)]
        if there:
            raise ReplayError(f"{out}: {', '.join(there)} appeared there while the bundle was written, and is "
                              f"kept; the bundle is left in {part}", EXIT_IO)
        for n in names:
            try:
                os.rename(part / n, out / n)
            except OSError as e:  # (OUT is a mount point: its partial folder is on the file system above)
                if e.errno != errno.EXDEV:
                    raise
                shutil.move(part / n, out / n)
        part.rmdir()
        return
    if _exchange(part, out):
        old = part
    else:
        old = _aside(out, ".replaced-")
        os.rename(out, old)
        os.rename(part, out)
    clash = []
    for n in sorted(os.listdir(old)):
        if own_name(n):
            continue
        if os.path.lexists(out / n):
            clash.append(n)
        else:
            os.rename(old / n, out / n)
    if clash:
        os.rename(old, _aside(out, ".previous-"))
        return
    _remove_own(old)
    try:
        old.rmdir()
    except OSError:
        pass


@contextmanager
def bundle_written(out: Path) -> Iterator[Path]:
    """The folder to write the bundle ``out`` in: beside it (``OUT.partial-PID``), swapped in whole
    once the block has ended and the bundle in it is complete (its writer closed). Interrupted or
    failed (Ctrl-C, SIGTERM, a full disk, an error), the folder is removed and ``out`` is as it was; a
    full disk is then an error naming ``out`` (exit 74). ``out`` is checked as ``check_out(force=True)``
    does: the command refuses a folder that is not a bundle beforehand, unless forced."""
    given, out = out, _real(out)
    check_out(out, force=True)
    _remove_stale_partials(out)
    existed = out.exists()
    part = _new_partial(out)
    try:
        yield part
        obj = _bundle_json(part)
        if obj is None or obj.get("complete") is not True:
            raise RuntimeError(f"{part}: the bundle was not closed")
    except BaseException as e:
        with _signals_held():
            shutil.rmtree(part, ignore_errors=True)
        full = write_error(e, out)
        if full is None and isinstance(e, OSError) and e.errno in WRITE_ERRNOS and e.filename is not None \
                and Path(os.fsdecode(e.filename)).is_relative_to(part):
            full = e
        if full is not None:
            why = WRITE_WHY.get(full.errno or 0) or (full.strerror or "cannot be written").lower()
            raise ReplayError(f"{given}: {why} while the bundle was written; "
                              + ("the bundle there is as it was" if existed else "nothing was written"), EXIT_IO) from None
        raise
    with _signals_held():
        for n in (".spill", SORT_SPILL, "bundle.json.tmp", "events.part.jsonl"):  # (what a writer keeps only while it writes)
            p = part / n
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        _swap_in(part, out)


def writes_in_place(out: Path) -> bool:
    """Whether a live recording writes ``out`` where it is (readable while it records): where there is
    nothing yet, or an empty folder; over an earlier bundle it is written beside it and swapped in at
    its end (``bundle_written``), so that an unfinished recording never costs the one before."""
    out = _real(out)
    return not os.path.lexists(out) or (out.is_dir() and not any(out.iterdir()))


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

    @property
    def t0_us(self) -> int | None:
        """``t0_utc`` as epoch µs (None where the bundle has no time)."""
        t0 = _iso_time(self.t0_utc)
        return None if t0 is None else int(t0.timestamp() * 1_000_000)

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
    """Write a bundle incrementally into ``path`` (a new or empty folder, one holding only a bundle's own
    files, or the folder ``bundle_written`` gives); every ``flush()`` leaves a readable directory,
    marked complete only by ``close()``.

    The quarantine keeps, of each line, its file, line number, reason, and the length (``chars``) and
    sha256 of its text; the text itself (``raw``, its first 500 characters) only with
    ``quarantine_text`` (by default, where the recording keeps prompts): a line that could not be read
    may be a request with its prompt."""

    def __init__(self, path: Path, meta: BundleMeta, *, flush_every: int = 5000,
                 quarantine_text: bool | None = None) -> None:
        self.path = path
        self.meta = meta
        path.mkdir(parents=True, exist_ok=True)
        foreign = sorted(n for n in os.listdir(path) if not own_name(n))
        if foreign:  # (nothing of the user's is written over, nor removed below)
            raise ReplayError(f"{path}: a bundle is written into a new or empty folder, and this one holds "
                              f"{', '.join(foreign[:5])}", EXIT_USAGE)
        for stale in ("samples.parquet", "requests.parquet", "events.jsonl", "quarantine.jsonl"):
            (path / stale).unlink(missing_ok=True)
        for part in [*path.glob("samples.part*.parquet"), *_request_parts(path)]:  # an interrupted run's
            part.unlink()
        if (path / SORT_SPILL).is_dir() and not (path / SORT_SPILL).is_symlink():
            shutil.rmtree(path / SORT_SPILL)
        self.quarantine_text = meta.keep_prompts if quarantine_text is None else quarantine_text
        self.complete = False
        self._writing = {"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now_iso()}
        self._samples: list[tuple[int, int | None, str, str, float]] = []
        self._parts = 0
        self._part_meta: dict[str, Part] = {}  # part file name -> its rows and times, as written
        self._times = KeySample()  # (every n-th time of those parts: where close() cuts its buckets)
        self._flush_every = flush_every
        self._requests: list[dict[str, Any]] = []
        self._events = (path / "events.jsonl").open("a", encoding="utf-8")
        self._quarantine = (path / "quarantine.jsonl").open("a", encoding="utf-8")
        self.counts = {"samples": 0, "events": 0, "quarantined": 0, "requests": 0}
        self._not_finite: dict[str, int] = {}  # metric -> values left out as NaN or infinite
        self._req_parts = 0
        self._req_extras: dict[str, pl.DataType] = {}  # (columns beyond REQUESTS_SCHEMA that parts had)
        self._samples_merged = False
        self.write_meta()

    def write_meta(self) -> None:
        """bundle.json, marked complete once the bundle is closed (while it is written, with who writes it)."""
        obj = {**self.meta.to_json(), "complete": self.complete}
        if not self.complete:
            obj["writing"] = self._writing
        tmp = self.path / "bundle.json.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path / "bundle.json")

    def sample(self, t_us: int, gpu: int | None, source: str, metric: str, value: float | None) -> None:
        self._samples_open()
        if value is None:
            return  # unknown is not recorded as a number
        if not math.isfinite(value):  # (NaN: a gauge with no value, as Prometheus writes it; ±Inf: none either)
            self._not_finite[metric] = self._not_finite.get(metric, 0) + 1
            return
        self._samples.append((int(t_us), gpu, source, metric, float(value)))
        self.counts["samples"] += 1
        if len(self._samples) >= self._flush_every:
            self.flush()

    def _samples_open(self) -> None:
        if self._samples_merged:
            raise RuntimeError("the bundle's samples are merged: no sample can be added")

    def samples_frame(self, df: pl.DataFrame) -> None:
        """Append an already-built samples frame (vectorised parsers)."""
        self._samples_open()
        if df.height == 0:
            return
        df = df.select([pl.col(k).cast(v) for k, v in SAMPLES_FILE_SCHEMA.items()]).drop_nulls("value")
        odd = ~df["value"].is_finite()
        if odd.any():
            for metric, n in df.filter(odd).group_by("metric").len().iter_rows():
                self._not_finite[metric] = self._not_finite.get(metric, 0) + n
            df = df.filter(~odd)
        part = self.path / f"samples.part{self._parts:05d}.parquet"
        df.write_parquet(part)
        self._part_meta[part.name] = frame_part(part, df, "t_us", self._times)
        self._parts += 1
        self.counts["samples"] += df.height

    def samples_lazy(self, lf: pl.LazyFrame) -> None:
        """Append samples from a lazy query, streamed to a part file (never all in memory)."""
        self._samples_open()
        part = self.path / f"samples.part{self._parts:05d}.parquet"
        lf = lf.select([pl.col(k).cast(v) for k, v in SAMPLES_FILE_SCHEMA.items()]).drop_nulls("value")
        # (the numbers of log lines: never NaN where the pattern matched, but a sample is a finite number)
        lf.filter(pl.col("value").is_finite()).sink_parquet(part)
        self._parts += 1
        self._part_meta[part.name] = Part(part, parquet_rows(part))  # (its times are read at close, if need be)
        self.counts["samples"] += self._part_meta[part.name].rows

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
        rec: dict[str, Any] = {"file": file, "line": line, "reason": reason}
        if raw is not None:
            rec["chars"] = len(raw)
            rec["sha256"] = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()
            if self.quarantine_text:
                rec["raw"] = raw[:500]
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

    def requests_stream(self, frames: Iterable[pl.DataFrame], extras: dict[str, pl.DataType]) -> None:
        """Append the requests of ``frames`` (REQUESTS_SCHEMA columns, where they have them, and
        ``extras``) as one part, encoded as Parquet while they come: a recording's joined rows are
        not written once more as parts to be read back (a fleet's day: 27M rows, their merge 8.8 s).
        Where it is the only part, close() takes it as it is."""
        for c, t in extras.items():
            self._req_extras.setdefault(c, t)
        schema: dict[str, Any] = {**REQUESTS_SCHEMA, **self._req_extras}  # (polars' DataType classes and instances)

        def conformed(df: pl.DataFrame) -> pl.DataFrame:
            if set(df.columns) - schema.keys():  # (a column no stream declared would be lost)
                raise ValueError(f"request columns not declared to the stream: {sorted(set(df.columns) - schema.keys())}")
            self.counts["requests"] += df.height
            return df.select(pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in schema.items())
        part = self.path / f"requests.part{self._req_parts:05d}.parquet"
        self._req_parts += 1
        sink_frames(map(conformed, frames), schema, part, compression_level=2)

    def request(self, row: dict[str, Any]) -> None:
        self._requests.append(row)
        self.counts["requests"] += 1

    def flush(self) -> None:
        self._flush_samples()
        if self._requests:
            _requests_df(self._requests).write_parquet(self.path / "requests.parquet")
        self._events.flush()
        self._quarantine.flush()
        self.write_meta()

    def _flush_samples(self) -> None:
        if self._samples:  # (whole or not at all: a live recording is read while it is written)
            df = pl.DataFrame(self._samples, schema=SAMPLES_FILE_SCHEMA, orient="row")
            part = self.path / f"samples.part{self._parts:05d}.parquet"
            df.write_parquet(part.with_name(part.name + ".tmp"))
            os.replace(part.with_name(part.name + ".tmp"), part)
            self._part_meta[part.name] = frame_part(part, df, "t_us", self._times)
            self._parts += 1
            self._samples = []

    def merge_samples(self, remove: Callable[[Path], None] | None = None) -> None:
        """samples.parquet, the samples' parts merged in time order; ``close`` merges them where this was not
        called, and no sample may be added after. A recording merges them beside its request join, which
        leaves part of a core idle: every sample is written by then."""
        if self._samples_merged:
            return
        remove = remove or _remove
        self._flush_samples()
        parts = sorted(self.path.glob("samples.part*.parquet"))
        target = self.path / "samples.parquet"
        tmp = target.with_name(target.name + ".tmp")
        try:
            if parts:  # a stable sort: samples at the same time keep the order they were written in
                sort_parts([self._part_meta.get(p.name) or Part(p, parquet_rows(p)) for p in parts], tmp,
                           ["t_us", "source", "metric"], self.path / SORT_SPILL, remove, self._times)
            else:
                pl.DataFrame(schema=SAMPLES_FILE_SCHEMA).write_parquet(tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, target)  # (a reader of a live recording sees the parts or the merge, never half of it)
        for p in parts:
            remove(p)
        self._samples_merged = True

    def close(self, remove: Callable[[Path], None] | None = None) -> None:
        """Write the bundle's final files; ``remove`` (by default, at once) takes the part files and
        the sort's spilled pieces away."""
        remove = remove or _remove
        self.merge_samples(remove)
        if self._not_finite:
            n = sum(self._not_finite.values())
            self.meta.notes.append(f"{n} value(s) were NaN or infinite, which measure nothing, and are left out of the "
                                   "timeline: " + ", ".join(f"{m} ({k})" for m, k in sorted(self._not_finite.items())))
        self.flush()
        req_parts = _request_parts(self.path)
        if req_parts:
            first = _requests_df(self._requests).with_columns(pl.lit(None, dtype=t).alias(c) for c, t in self._req_extras.items())
            if len(req_parts) == 1 and req_parts[0].suffix == ".parquet" and not self._requests \
                    and list(pl.read_parquet_schema(req_parts[0]).items()) == list(first.schema.items()):
                os.replace(req_parts[0], self.path / "requests.parquet")  # (a recording's stream, whole)
            else:
                frames = [first.lazy(), *(pl.scan_parquet(p) if p.suffix == ".parquet" else pl.scan_ipc(p) for p in req_parts)]
                # (zstd level 2: of the 3.58M rows of a 1 GiB log, 39 MB in 1.3-1.6 s, against the default
                # level 3's 44 MB in 1.5-2.1 s)
                pl.concat(frames, how="diagonal_relaxed").sink_parquet(self.path / "requests.parquet", compression_level=2)
                for p in req_parts:
                    remove(p)
        else:
            _requests_df(self._requests).write_parquet(self.path / "requests.parquet")
        self._events.close()
        self._quarantine.close()
        self.complete = True
        self.write_meta()


def _request_parts(path: Path) -> list[Path]:
    """The request parts in ``path``, in the order they were written (IPC frames and Parquet streams)."""
    return sorted([*path.glob("requests.part*.arrow"), *path.glob("requests.part*.parquet")], key=lambda p: p.name)


def _remove(path: Path) -> None:
    """Remove a file, or a folder with what is in it."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def in_time_order(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The samples of ``frames`` in one frame, stably sorted by time. A complete bundle's one file is
    written sorted: it is checked, not sorted again (a fleet's day of samples sorted once more took
    3.5 GB and seconds, for every command that read the bundle)."""
    if not frames:
        return pl.DataFrame(schema=SAMPLES_READ_SCHEMA)
    samples = pl.concat(frames) if len(frames) > 1 else frames[0]
    t = samples["t_us"]
    if t.is_null()[: t.null_count()].all() and t.drop_nulls().is_sorted():  # (nulls first, as the sort puts them)
        return samples
    return samples.sort("t_us", maintain_order=True)


def _requests_df(rows: list[dict[str, Any]]) -> pl.DataFrame:
    clean = [{k: r.get(k) for k in REQUESTS_SCHEMA} for r in rows]
    return pl.DataFrame(clean, schema=REQUESTS_SCHEMA)


@dataclass
class Bundle:
    """A bundle read back from disk: metadata plus its frames."""

    path: Path
    meta: BundleMeta
    events: list[dict[str, Any]]
    quarantine_count: int
    sample_files: list[Path] = field(default_factory=list)  # samples.parquet, or a live recording's parts
    _samples: pl.DataFrame | None = field(default=None, repr=False)
    _requests: pl.DataFrame | None = field(default=None, repr=False)
    complete: bool | None = None  # None: written before bundles were marked complete

    @property
    def samples(self) -> pl.DataFrame:
        """Every sample in time order, its names as categories (``SAMPLE_NAMES``), read on first use. A
        fleet's day is 22.5M samples (0.6 GB in memory): what the analysis and reports need of them they
        ask ``scan_samples`` for."""
        if self._samples is None:
            self._samples = in_time_order([_read_samples(p) for p in self.sample_files])
        return self._samples

    def scan_samples(self) -> pl.LazyFrame:
        """The samples as a query, in time order: of a bundle's one file only the columns and rows it asks
        for are read (its names as the file holds them: categories, or text in a bundle written before;
        a test on names goes through ``==``, ``is_in`` or ``sample_names``). A live recording's parts are
        read whole, to put them in order."""
        files = self.sample_files
        if self._samples is None and len(files) == 1 and files[0].name == "samples.parquet":
            return pl.scan_parquet(files[0]).select(
                pl.col(c) if c in SAMPLE_NAMES else pl.col(c).cast(t) for c, t in SAMPLES_SCHEMA.items())
        return self.samples.lazy()

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


def bundle_sha256(path: Path) -> str:
    """One digest of a bundle's content files, in a fixed order (a replay names the bundle it came from)."""
    h = hashlib.sha256()
    for name in ("bundle.json", "requests.parquet", "samples.parquet", "events.jsonl"):
        p = path / name
        h.update(name.encode() + b"\0")
        if p.exists():
            with p.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()


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


def _samples_schema(p: Path) -> None:
    """Refuse a samples file whose footer cannot be read or that lacks a column of SAMPLES_SCHEMA."""
    with _parquet_of_bundle(p):
        lost = [c for c in SAMPLES_SCHEMA if c not in pl.read_parquet_schema(p)]
    if lost:
        raise ReplayError(f"{p}: no column {', '.join(lost)}: not a bundle's samples (damaged, or another file)")


def _read_samples(p: Path) -> pl.DataFrame:
    """A samples file, in SAMPLES_SCHEMA's types but for its names (``SAMPLE_NAMES``), which are read as
    categories batch by batch (never the whole file as text)."""
    _samples_schema(p)
    with _parquet_of_bundle(p):
        return pl.scan_parquet(p).select(pl.col(c).cast(t) for c, t in SAMPLES_READ_SCHEMA.items()).collect(engine="streaming")


_INT64 = 2**63


def _bad_number(v: Any, where: str) -> str | None:
    """The first number in ``v`` that no reader can use (NaN, infinite: JSON's 1e400; an integer past
    64 bits), named by its place ('gpus[0].total_bytes'); None where there is none."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return None
    if isinstance(v, float):
        return None if math.isfinite(v) else where
    if isinstance(v, int):
        return None if -_INT64 <= v < _INT64 else where
    if isinstance(v, dict):
        for k, x in v.items():
            bad = _bad_number(x, f"{where}.{k}" if where else str(k))
            if bad:
                return bad
    elif isinstance(v, list):
        for i, x in enumerate(v):
            bad = _bad_number(x, f"{where}[{i}]")
            if bad:
                return bad
    return None


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "text", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _numeric_text(v: Any) -> bool:
    try:
        return _number(v) or (isinstance(v, str) and math.isfinite(float(v)))
    except ValueError:
        return False


# bundle.json's fields as readers use them: (field, what it must be, the check); null is always allowed
_META_FIELDS: list[tuple[str, str, Callable[[Any], bool]]] = [
    *((k, "text", lambda v: isinstance(v, str)) for k in ("vllm_version", "vllm_version_inferred", "engine", "model")),
    *((k, "an object", lambda v: isinstance(v, dict))
      for k in ("engine_args", "engine_args_sources", "server_args", "engine_env", "extra")),
    *((k, "a list", lambda v: isinstance(v, list)) for k in ("gpus", "inputs", "notes")),
    ("keep_prompts", "true or false", lambda v: isinstance(v, bool)),
    ("complete", "true or false", lambda v: isinstance(v, bool)),
]
_GPU_FIELDS: list[tuple[str, str, Callable[[Any], bool]]] = [
    ("index", f"a whole number from 0 to {MAX_GPU_INDEX}", lambda v: _int(v) and 0 <= v <= MAX_GPU_INDEX),
    ("total_bytes", "a whole number of bytes, 0 or more", lambda v: _int(v) and v >= 0),
    *((k, "text", lambda v: isinstance(v, str)) for k in ("name", "uuid", "host", "pci_bus_id")),
    *((k, "a list", lambda v: isinstance(v, list)) for k in ("pods", "shared_by")),
]
_NESTED_FIELDS: list[tuple[str, str, str, Callable[[Any], bool]]] = [  # (object, field, what, check)
    ("engine_args", "gpu_memory_utilization", "a number", _numeric_text),
    ("extra", "speed", "a number above 0", lambda v: _number(v) and v > 0),
    *(("extra", k, "a number", _number) for k in ("interval_s", "kv_cache_gib")),
    *(("extra", k, "a number", _number) for k in ("capacity_bytes", "baseline_rss_bytes", "peak_rss_bytes")),
    ("extra", "pid", "a process id", lambda v: _int(v) and v > 0),
    *(("extra", k, "text", lambda v: isinstance(v, str)) for k in ("outcome", "live_url", "device")),
    ("extra", "window_us", "[start, end] in µs", lambda v: isinstance(v, list) and len(v) == 2 and all(map(_int, v))),
    *(("extra", k, "an object", lambda v: isinstance(v, dict)) for k in ("trace", "production", "emulation")),
]


def _check_meta(obj: dict[str, Any], meta_path: Path) -> None:
    """Refuse a bundle.json whose fields are not of the types its readers use, naming the field (each
    was an internal error, or a wrong reading, somewhere in the analysis)."""
    def refuse(name: str, what: str, v: Any) -> None:
        shown = json.dumps(v, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ReplayError(f"{meta_path}: {name} is {_type_name(v)} ({shown}); expected {what}: the bundle was changed "
                          "or damaged after it was written")

    bad = _bad_number(obj, "")
    if bad:
        raise ReplayError(f"{meta_path}: {bad} is a number no reader can use (NaN, infinite or past 64 bits): the "
                          "bundle was changed or damaged after it was written")
    for name, what, ok in _META_FIELDS:
        if obj.get(name) is not None and not ok(obj[name]):
            refuse(name, what, obj[name])
    for i, n in enumerate(obj.get("notes") or []):
        if not isinstance(n, str):
            refuse(f"notes[{i}]", "text", n)
    for key in ("gpus", "inputs"):
        for i, g in enumerate(obj.get(key) or []):
            if not isinstance(g, dict):
                refuse(f"{key}[{i}]", "an object", g)
    for i, g in enumerate(obj.get("gpus") or []):
        for name, what, ok in _GPU_FIELDS:
            if g.get(name) is not None and not ok(g[name]):
                refuse(f"gpus[{i}].{name}", what, g[name])
    for where, name, what, ok in _NESTED_FIELDS:
        v = (obj.get(where) or {}).get(name)
        if v is not None and not ok(v):
            refuse(f"{where}.{name}", what, v)


def _event_fault(ev: Any) -> str | None:
    """Why an events.jsonl line is no event a reader can use; None where it is one."""
    if not isinstance(ev, dict):
        return "not a JSON object"
    if not isinstance(ev.get("kind"), str):
        return "no kind"
    t = ev.get("t_us")
    if t is not None and not (_int(t) or (isinstance(t, float) and t.is_integer())):
        return "a time that is not a whole number of µs"
    if _bad_number(ev, "") is not None:
        return "a number no reader can use"
    return None


def _incomplete(path: Path, obj: dict[str, Any], meta: BundleMeta) -> None:
    """A bundle whose writer has not marked it complete: refused (a recording or replay that did not
    finish), but for a live recording, whose flushed samples are its user's data: read, with a note."""
    w = _writer_of(obj) or {}
    running = _still_writing(w)
    since = f" since {w['since']}" if isinstance(w.get("since"), str) else ""
    if meta.extra.get("live_url"):
        meta.notes.insert(0, f"incomplete: a live recording still being written by process {w.get('pid')}{since}; what it "
                          "has flushed so far is read" if running else
                          "incomplete: a live recording that did not finish (its recorder was killed or its host went "
                          "down before it closed the bundle); what it flushed before it stopped is read")
        return
    what = "a replay" if meta.kind == "replay" else "a recording"
    if running:
        raise ReplayError(f"{path}: incomplete: still being written by process {w.get('pid')}{since}; read it once "
                          "that has finished")
    began = f", begun {w['since']}" if isinstance(w.get("since"), str) else ""
    raise ReplayError(f"{path}: incomplete ({what} that did not finish{began}): "
                      f"{'record' if meta.kind != 'replay' else 'run'} it again")


def read_bundle(path: Path) -> Bundle:
    """Read a bundle; refuse one written by a newer schema, one whose writing did not finish (but a
    live recording's), and one whose bundle.json fields are not of their types or whose files are
    missing, each with a clear message (exit 3). Its request rows are read when they are asked for
    (``Bundle.requests``, ``Bundle.scan_requests``). A bundle written before bundles were marked
    complete (no ``complete`` in its bundle.json) is read as it was then: a file missing is a note."""
    meta_path = path / "bundle.json"
    if not path.is_dir() or not meta_path.exists():
        raise ReplayError(f"{path}: not a replay bundle (no bundle.json)")
    try:
        obj = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ReplayError(f"{meta_path}:{e.lineno}: bundle.json is not valid JSON ({e.msg})") from None
    except (UnicodeDecodeError, RecursionError):
        raise ReplayError(f"{meta_path}: bundle.json is not JSON text (damaged, or another file)") from None
    if not isinstance(obj, dict):
        raise ReplayError(f"{meta_path}: not a bundle's metadata (a JSON object is expected)")
    schema = obj.get("schema", "")
    name, _, ver = (schema if isinstance(schema, str) else "").partition("/")
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
    _check_meta(obj, meta_path)
    meta = BundleMeta.from_json(obj)
    complete: bool | None = obj.get("complete")
    if complete is False:
        _incomplete(path, obj, meta)
    if complete:  # (every file a closed writer leaves; a copy that lost one is said to be one)
        gone = [n for n in ("samples.parquet", "requests.parquet", "events.jsonl", "quarantine.jsonl") if not (path / n).exists()]
        if gone:
            raise ReplayError(f"{path}: {', '.join(gone)} missing from a complete bundle: it was copied in part or "
                              "files were removed; copy it again, or record it again")
    parts = sorted(path.glob("samples.part*.parquet"))
    merged = path / "samples.parquet"
    if complete is None:  # (as bundles were read before they were marked)
        files = [p for p in [merged, *parts] if p.exists()]
        if not files:
            meta.notes.append("samples.parquet is missing: the bundle has no samples (a copy that lost it, or a "
                              "recording that stopped before it wrote any)")
    elif merged.exists():  # (the merge of the parts: any part left beside it is in it)
        files = [merged]
    else:  # (a live recording's flushed parts)
        files = parts
    for p in files:  # (a file cut short or of another kind is named now, not deep in an analysis)
        _samples_schema(p)
    events: list[dict[str, Any]] = []
    ev_path = path / "events.jsonl"
    if ev_path.exists():
        lines = ev_path.read_text(encoding="utf-8", errors="replace").splitlines()
        bad: dict[str, list[int]] = {}  # why -> the lines
        for no, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    ev = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    ev = None
                fault = _event_fault(ev)
                if fault is None:
                    events.append(ev)
                else:
                    bad.setdefault(fault, []).append(no)
        if bad == {"not a JSON object": [len(lines)]}:  # a recording stopped while it wrote its last event
            meta.notes.append(f"{ev_path.name}: its last line (line {len(lines)}) is cut short, as "
                              + ("a copy cut short" if complete else "a recording that stopped while writing")
                              + f" leaves it; the {len(events)} events before it are read")
        elif bad:
            def shown(nos: list[int]) -> str:
                return ", ".join(map(str, nos[:10])) + (", ..." if len(nos) > 10 else "")
            meta.notes.append(f"{ev_path.name}: {sum(map(len, bad.values()))} line(s) are not events ("
                              + "; ".join(f"{why}: line {shown(nos)}" for why, nos in bad.items())
                              + ") and are left out; the bundle was changed or damaged after it was written")
    elif complete is None:
        meta.notes.append("events.jsonl is missing: the bundle has no events (a copy that lost it)")
    q_path = path / "quarantine.jsonl"
    q = 0
    if q_path.exists():  # (counted line by line: a quarantine can be as large as the evidence)
        with q_path.open(encoding="utf-8", errors="replace") as fh:
            q = sum(1 for ln in fh if ln.strip())
    return Bundle(path, meta, events, q, sample_files=files, complete=complete)
