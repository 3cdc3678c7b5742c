"""The matrix: versions x settings expanded into runs, and the manifest that records them.

A run is named by what it runs (its version and settings), so a rerun of the same matrix into the
same folder finds its completed runs in the manifest and skips them, and retries the ones that failed
or never ended. The manifest (``matrix.json``) holds, per run: its id, version, settings, status,
exit reason, whether it reproduced the incident and its bundle's path (relative to the folder).
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from replay.atomic import written_in_place
from replay.drive.runner import RunOptions
from replay.errors import EXIT_INPUT, EXIT_USAGE, ReplayError

FORMAT = "replay-matrix/1"
MANIFEST = "matrix.json"
RUNS_DIR = "runs"
TRACE_NAME = "trace.jsonl"

Status = Literal["pending", "running", "completed", "failed", "interrupted"]

# the run options a completed run's bundle depends on: a rerun with other values is another matrix
RESULT_OPTIONS = ("speed", "window", "concurrency", "set_args", "model", "vocab", "seed", "interval_s",
                  "kv_cache_gib", "model_config", "constraints", "capacity_bytes", "output_policy",
                  "torch_history", "emulate_capacity")


def _split_values(text: str) -> list[str]:
    """``v1,v2`` -> two values; a JSON list or object (``[1,2]``, ``{"a":1,"b":2}``) is one value."""
    s = text.strip()
    if s[:1] in "[{":
        try:
            json.loads(s)
            return [s]
        except json.JSONDecodeError:
            pass
    return [v.strip() for v in s.split(",")]


def parse_sets(items: list[str] | None) -> dict[str, list[str]]:
    """``--set key=v1,v2`` (repeatable): each key an axis of the matrix, its values in the order given
    (a value is an engine argument as ``replay run --set`` takes it: JSON where it parses, else text)."""
    out: dict[str, list[str]] = {}
    for item in items or []:
        key, eq, vals = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ReplayError(f"--set {item!r}: expected key=v1,v2 (such as max_num_seqs=8,16)", EXIT_USAGE)
        values = _split_values(vals)
        if any(not v for v in values):
            raise ReplayError(f"--set {item!r}: an empty value (expected key=v1,v2)", EXIT_USAGE)
        if key in out:
            raise ReplayError(f"--set {key}: given twice; list its values once, such as {key}=v1,v2", EXIT_USAGE)
        if len(set(values)) != len(values):
            raise ReplayError(f"--set {item!r}: a value listed twice", EXIT_USAGE)
        out[key] = values
    return out


def split_versions(items: list[str] | None) -> list[str]:
    """``--vllm 0.31 --vllm 0.32``, ``--vllm 0.31,0.32`` or ``--vllm 0.31 0.32``: the versions in order, once each."""
    out: list[str] = []
    for item in items or []:
        for v in item.split(","):
            v = v.strip()
            if v and v not in out:
                out.append(v)
    if not out:
        raise ReplayError("--vllm: give at least one version (such as --vllm 0.31 --vllm 0.32)", EXIT_USAGE)
    return out


_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def run_id(version: str, settings: dict[str, str]) -> str:
    """A run's name from what it runs: '0.32.0', '0.32.0+max_num_seqs=8' (a file name: other characters
    become '_'; a long one is cut and ends with a digest of the whole)."""
    text = "+".join([version, *(f"{k}={v}" for k, v in settings.items())])
    name = _UNSAFE.sub("_", text).strip("._") or "run"
    if len(name) > 100 or name != text:
        import hashlib
        name = f"{name[:88]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return name


@dataclass
class MatrixRun:
    """One run of the matrix: a version and its settings, and what became of it."""

    id: str
    version: str  # as asked for (resolved where this host could); the bundle states what ran
    settings: dict[str, str] = field(default_factory=dict)
    status: Status = "pending"
    bundle: str = ""  # relative to the matrix folder
    exit_code: int | None = None
    outcome: str | None = None  # the runner's: completed | engine_died | capacity_guard | interrupted
    reason: str | None = None  # the exit reason in words (the error, where the run failed)
    reproduced: bool | None = None
    verdict: str | None = None  # the verdict (or the run's own outcome) in one line
    attempts: int = 0
    errors: list[str] = field(default_factory=list)  # each failed attempt's error
    node: str | None = None
    wall_s: float | None = None
    vllm_version: str | None = None  # what the bundle says ran
    finished_utc: str | None = None

    @property
    def set_args(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.settings.items()]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MatrixRun:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def expand(versions: list[str], sets: dict[str, list[str]]) -> list[MatrixRun]:
    """The cartesian product of versions and settings, versions outermost, in the order given."""
    keys = list(sets)
    runs: list[MatrixRun] = []
    seen: set[str] = set()
    for v in versions:
        for combo in itertools.product(*(sets[k] for k in keys)):
            settings = dict(zip(keys, combo))
            rid = run_id(v, settings)
            if rid in seen:
                continue
            seen.add(rid)
            runs.append(MatrixRun(rid, v, settings, bundle=f"{RUNS_DIR}/{rid}.bundle"))
    return runs


def resolve_versions(versions: list[str], device: str | None = None) -> list[str]:
    """Each version as the env it runs in ('0.32' -> '0.32.0'), where this host (or ``device``) can
    resolve it; as given where it cannot (a cluster's nodes resolve it themselves)."""
    from replay.engine import envs
    out: list[str] = []
    for v in versions:
        try:
            r = envs.resolve(v, device=device).version
        except ReplayError:
            r = v
        if r not in out:
            out.append(r)
    return out


def tp_pp(settings: dict[str, str], base: RunOptions) -> int:
    """The devices a run needs: tensor_parallel_size x pipeline_parallel_size, from its settings over the
    matrix's engine arguments (--engine-args, --set)."""
    from replay.drive.runner import user_engine_args
    given: dict[str, Any] = {**user_engine_args(base), **settings}

    def size(name: str) -> int:
        v = given.get(name, 1)
        try:
            return max(1, int(str(v).strip()))
        except ValueError:
            raise ReplayError(f"{name}={v}: expected a whole number of devices", EXIT_USAGE) from None
    return size("tensor_parallel_size") * size("pipeline_parallel_size")


def options_for(base: RunOptions, run: MatrixRun, root: Path) -> RunOptions:
    """A run's options: the matrix's, at the run's version, its settings after the fixed ones, into its bundle."""
    return replace(base, vllm=run.version, out=root / run.bundle, set_args=[*base.set_args, *run.set_args])


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, tuple):
        return list(v)
    return v


def fingerprint(opts: RunOptions, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a completed run's bundle depends on beyond its version and settings (the engine args file
    by its content): compared on a rerun, so that runs of other options are not taken as done."""
    out = {k: _jsonable(getattr(opts, k)) for k in RESULT_OPTIONS}
    if opts.warmup is not None:  # (asked for: a matrix made before the option keeps its fingerprint without it)
        out["warmup"] = opts.warmup
    if opts.engine_args_file is not None:
        try:
            out["engine_args_file"] = json.loads(opts.engine_args_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ReplayError(f"{opts.engine_args_file}: cannot read engine args JSON ({e})", EXIT_USAGE) from None
    out.update(extra or {})
    plain: dict[str, Any] = json.loads(json.dumps(out, default=str))
    return plain


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Manifest:
    """``matrix.json``: the matrix's input, the options its runs share, and every run."""

    root: Path
    input: dict[str, Any]  # path, kind (bundle | trace), sha256
    trace: str  # the trace the runs replay, relative to root where it is inside
    options: dict[str, Any]
    runs: dict[str, MatrixRun] = field(default_factory=dict)
    report: str | None = None
    backend: str | None = None
    created_utc: str = field(default_factory=now_utc)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.root / MANIFEST

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "created_utc": self.created_utc, "updated_utc": now_utc(), "input": self.input,
                "trace": self.trace, "options": self.options, "backend": self.backend, "report": self.report,
                **({"extra": self.extra} if self.extra else {}),
                "runs": [r.to_json() for r in self.runs.values()]}

    def save(self) -> None:
        with written_in_place(self.path) as part:
            part.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, root: Path) -> Manifest | None:
        p = root / MANIFEST
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ReplayError(f"{p}: cannot read the matrix manifest ({e}); remove it to start the matrix afresh",
                              EXIT_INPUT) from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ReplayError(f"{p}: not a matrix manifest of format {FORMAT}", EXIT_INPUT)
        runs = {r["id"]: MatrixRun.from_json(r) for r in d.get("runs") or [] if isinstance(r, dict) and "id" in r}
        return cls(root, d.get("input") or {}, str(d.get("trace") or ""), d.get("options") or {}, runs,
                   d.get("report"), d.get("backend"), str(d.get("created_utc") or now_utc()), d.get("extra") or {})

    @classmethod
    def open(cls, root: Path, input_: dict[str, Any], trace: str, options: dict[str, Any]) -> Manifest:
        """The folder's manifest, to resume: refused where it is of another input or other options (its
        completed runs would be taken for this matrix's); a new one where there is none."""
        old = cls.read(root)
        if old is None:
            return cls(root, input_, trace, options)
        if old.input.get("sha256") != input_.get("sha256"):
            raise ReplayError(f"{root}: holds a matrix of another input ({old.input.get('path')}); write this one to "
                              "another folder (-o), or remove its matrix.json to start afresh", EXIT_USAGE)
        differ = sorted(k for k in set(old.options) | set(options) if old.options.get(k) != options.get(k))
        if differ:
            shown = ", ".join(f"{k} {old.options.get(k)!r} there, {options.get(k)!r} now" for k in differ)
            raise ReplayError(f"{root}: its runs were made with other options ({shown}); write this matrix to "
                              "another folder (-o), or remove its matrix.json to start afresh", EXIT_USAGE)
        old.input, old.trace = input_, trace
        return old

    def add(self, runs: list[MatrixRun]) -> list[MatrixRun]:
        """The planned runs as the manifest holds them (a run it already holds keeps its record)."""
        out = []
        for r in runs:
            have = self.runs.get(r.id)
            if have is None:
                self.runs[r.id] = have = r
            out.append(have)
        return out

    def done(self, run: MatrixRun) -> bool:
        """Completed, and its bundle still there (a run whose bundle was removed runs again)."""
        return run.status == "completed" and (self.root / run.bundle / "bundle.json").is_file()


@dataclass
class MatrixInput:
    """What the matrix replays: the trace file, and the production bundle it came from (if any)."""

    path: Path
    kind: Literal["bundle", "trace"]
    sha256: str
    trace: Path
    production: Path | None

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path.resolve()), "kind": self.kind, "sha256": self.sha256,
                **({"production": str(self.production)} if self.production else {})}


def is_bundle(path: Path) -> bool:
    return path.is_dir() and (path / "bundle.json").is_file()


def identify_input(given: Path) -> MatrixInput:
    """What the matrix replays, and its digest (a rerun into the folder must be of the same input); the
    trace a bundle's requests make is not written yet (``write_trace``: once the folder is known to be
    this matrix's). A production bundle is the reference the runs' verdicts are judged against."""
    if is_bundle(given):
        from replay.bundle import bundle_sha256, read_bundle
        prod = given if read_bundle(given).meta.kind == "production" else None
        return MatrixInput(given, "bundle", bundle_sha256(given), Path(TRACE_NAME), prod)
    if not given.is_file():
        raise ReplayError(f"{given}: no such trace file or bundle folder", EXIT_INPUT)
    from replay.filehash import file_sha256
    return MatrixInput(given, "trace", file_sha256(given), given, None)


def write_trace(inp: MatrixInput, root: Path, *, window_us: tuple[int, int] | None = None,
                before_crash_us: int | None = None, shared: bool = False) -> Path:
    """The trace every run replays: a bundle's requests made into ``ROOT/trace.jsonl`` (cut to ``window_us``
    of the bundle's timeline, or ``before_crash_us`` before its first crash); a trace file as it is, or
    copied there where the runs read it on other hosts (``shared``: the folder is the path they share)."""
    root.mkdir(parents=True, exist_ok=True)
    if inp.kind == "bundle":
        from replay.trace.from_bundle import trace_of_bundle
        trace_of_bundle(inp.path, root / TRACE_NAME, window_us=window_us, before_crash_us=before_crash_us)
        inp.trace = root / TRACE_NAME
    elif before_crash_us is not None:
        raise ReplayError("--before-crash: only for a bundle (a trace has no crash on it); use --window", EXIT_USAGE)
    elif shared and inp.path.resolve() != (root / TRACE_NAME).resolve():
        import shutil
        with written_in_place(root / TRACE_NAME) as part:
            shutil.copyfile(inp.path, part)
        inp.trace = root / TRACE_NAME
    return inp.trace
