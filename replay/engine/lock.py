"""A vLLM release's dependencies resolved as of its release day, into a lock file.

``pip install vllm==0.6.3`` today picks today's transformers (5.x), which 0.6.3's own tokenizer
code cannot use. The lock resolves the same requirement with uv, counting only the packages
uploaded before the end of the release's day (``--exclude-newer``), for one target (Python
minor version, Linux, machine) that does not depend on the host, so one version gives one lock
everywhere. The target's Python is the host's, where the release's own Requires-Python (as the
version catalogue states it) allows that Python; a release that does not is refused before
anything is downloaded. A package whose old files were removed and re-published later (``pyairports``) has
nothing before the cutoff: it gets a cutoff of its own, the day after its oldest file that fits,
as uv's hint names it, and the lock's header says so. A user's constraints file (production's
``pip freeze``) narrows the resolution further.

Resolving every release of the catalogue this way (``tests/slow/test_locks_every_release.py``)
found three more kinds of trouble, kept below as data: a pin whose version is gone from PyPI (an
override to the next release of that package, :data:`OVERRIDES`), a package republished later
(:data:`PACKAGE_CUTOFFS`), and releases without a wheel for a platform (:data:`NO_WHEEL`).

The lock text is cached under ``<replay home>/locks`` and copied into the environment built from
it (``ENV/replay-lock.txt``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from replay.errors import EXIT_ENGINE, EXIT_USAGE, ReplayError

LOCK_FORMAT = "replay-lock/1"
# Packages an environment needs beyond what vLLM declares: triton (torch's dependency) imports
# setuptools at runtime, and uv's environments carry none (pip's venv seeds it).
EXTRA_REQUIREMENTS = ["setuptools"]
# The glibc baseline of the target: wheels for manylinux_2_28 run on every current GPU host.
MANYLINUX = "manylinux_2_28"
# The release's own package may have files uploaded after its first one: those count too.
DIST_GRACE_DAYS = 30
PYPI = "https://pypi.org/pypi"
# The cutoff of a package the user's constraints pin to one version (any upload of it counts).
PINNED_CUTOFF = "2200-01-01T00:00:00Z"



@dataclass(frozen=True)
class Override:
    """A pinned dependency a release cannot have as released, and what its lock takes instead."""

    package: str
    pinned: str  # the version the release asks for
    version: str  # the version the lock takes
    cutoff: str  # that package counts if uploaded before this (its replacement is newer)
    why: str


_XGRAMMAR = Override("xgrammar", "0.1.16", "0.1.17", "2025-03-26T00:00:00Z",
                     "0.1.16 is no longer on PyPI; 0.1.17 (2025-03-25) is what 0.8.3 pins")
_FLASHINFER = Override("flashinfer-python", "0.7.3", "0.7.4", "2026-11-12T00:00:00Z",
                       "0.7.3 is not on PyPI; 0.7.4 (2026-11-11) is the next, before the release")
# Resolution results of every release of the catalogue (0.6.0-0.34.0, python 3.11, x86_64-manylinux_2_28,
# as of each release day; 2026-12-02): all resolve but those named here, which resolve with these.
OVERRIDES: dict[str, tuple[Override, ...]] = {
    "0.8.0": (_XGRAMMAR,), "0.8.1": (_XGRAMMAR,), "0.8.2": (_XGRAMMAR,), "0.34.0": (_FLASHINFER,)}
# pyairports (via outlines) was republished on 2025-09-25 with no file older: the release's cutoff
# leaves none of it; uv's hint names the day, and these releases are known to need it.
PACKAGE_CUTOFFS: dict[str, dict[str, str]] = {
    v: {"pyairports": "2025-09-26T00:00:00Z"}
    for v in ("0.6.0", "0.6.1", "0.6.1.post1", "0.6.1.post2", "0.6.2", "0.6.3", "0.6.3.post1", "0.6.4",
              "0.6.4.post1")}
# Releases PyPI holds no wheel of for a machine: nothing to resolve there.
NO_WHEEL: dict[str, dict[str, str]] = {
    "x86_64": dict.fromkeys(("0.15.0", "0.15.1"), "PyPI holds only its aarch64 wheels")}

_HINT = re.compile(r"`(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)` was filtered by `exclude-newer`.*?"
                   r"published at (?P<at>\d{4}-\d\d-\d\dT[\d:.]+Z)", re.S)
_NETWORK = re.compile(r"(?i)failed to fetch|dns error|connection (refused|reset)|timed out|"
                      r"network is unreachable|tcp connect error|offline mode")


@lru_cache(maxsize=1)
def uv_bin() -> str:
    """The uv binary: the one the ``uv`` package ships (a dependency of replay), else on PATH.
    (Ask once before threads do: the package's lookup reads ``sysconfig``, which is not safe to
    initialise from several threads at once.)"""
    try:
        from uv import find_uv_bin
        found = str(find_uv_bin())
        if found and Path(found).exists():
            return found
    except (ImportError, FileNotFoundError):
        pass
    which = shutil.which("uv")
    if which:
        return which
    raise ReplayError("uv is needed to build a CUDA vLLM environment: pip install uv", EXIT_ENGINE)


def uv_version() -> str:
    p = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True, check=False)
    return p.stdout.strip().removeprefix("uv ").split(" ")[0]


def target_python(release: str | None = None, host: str | None = None) -> str:
    """The Python minor version of the environments this interpreter creates (``host``: another
    interpreter's version, '3.10.12'). With a vLLM ``release``: refused in one line (exit 2) where
    the release's Requires-Python does not allow it."""
    host = host or host_python()
    if release is not None:
        refuse_python(release, host, "this host's Python")
    return ".".join(host.split(".")[:2])


def host_python() -> str:
    """This interpreter's version, '3.11.7' (the Python of the environments it creates)."""
    return ".".join(str(n) for n in sys.version_info[:3])


def refuse_python(release: str, python: str, whose: str = "the target Python") -> None:
    """Refuse a Python vLLM ``release`` does not allow, by its Requires-Python as the shipped
    catalogue states it (a release the catalogue does not hold, or one that states none, passes)."""
    from replay.engine.catalogue import load
    rel = load().releases.get(release)
    spec = rel.requires_python if rel is not None else None
    if spec is None:
        return
    try:
        allowed = python_allows(spec, python)
    except ValueError as e:
        raise ReplayError(f"vLLM {release}'s Requires-Python {spec!r} in the catalogue: {e}", EXIT_ENGINE) from e
    if not allowed:
        raise ReplayError(f"vLLM {release} requires Python {spec} (its Requires-Python); {whose} is "
                          f"{python}: run replay under a Python that version allows", EXIT_USAGE)


def python_allows(spec: str, python: str) -> bool:
    """Whether a Python version ('3.11', '3.11.7') is within a Requires-Python specifier
    ('>=3.9,<3.13', '~=3.10', '!=3.9.*'), as pip reads it (PEP 440). ValueError for a specifier or
    version that is none."""
    try:
        allowed = SpecifierSet(spec)
    except InvalidSpecifier:
        raise ValueError(f"{spec!r} is not a version specifier") from None
    try:
        return allowed.contains(Version(python))
    except InvalidVersion:
        raise ValueError(f"{python!r} is not a Python version") from None


def target_platform() -> str:
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"{machine}-{MANYLINUX}"


def _day_after(day: str) -> str:
    return (dt.date.fromisoformat(day[:10]) + dt.timedelta(days=1)).isoformat() + "T00:00:00Z"


def cutoff_of(release_day: str) -> str:
    """Packages uploaded before this instant count: the end of the release's day (UTC)."""
    return _day_after(release_day)


# --------------------------------------------------------------------------------------------
# Release dates


def release_date(dist: str, version: str, cache_dir: Path) -> str:
    """The day (UTC, YYYY-MM-DD) the release's first file was uploaded: from the packaged vLLM
    catalogue for ``vllm``, else from PyPI (cached in ``cache_dir/release-dates.json``)."""
    if dist == "vllm":
        try:
            from replay.engine.catalogue import load
            rel = load().releases.get(version)
            if rel is not None and rel.date:
                return rel.date
        except ReplayError:
            pass
    cache = cache_dir / "release-dates.json"
    key = f"{dist}=={version}"
    known: dict[str, str] = {}
    if cache.exists():
        try:
            known = json.loads(cache.read_text())
        except (OSError, json.JSONDecodeError):
            known = {}
    if key in known:
        return known[key]
    url = f"{PYPI}/{dist}/{version}/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(
                url, headers={"User-Agent": "replay"}), timeout=60) as r:
            data = json.loads(r.read())
    except (OSError, urllib.error.URLError, json.JSONDecodeError) as e:
        raise ReplayError(f"could not read the release date of {key} from {url}: {e}", EXIT_ENGINE) from e
    times: list[str] = [str(f.get("upload_time_iso_8601") or f.get("upload_time") or "")
                        for f in data.get("urls", [])]
    times = [t for t in times if t]
    if not times:
        raise ReplayError(f"{url} lists no files for {key}", EXIT_ENGINE)
    day: str = min(times)[:10]
    known[key] = day
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.part")
    tmp.write_text(json.dumps(dict(sorted(known.items())), indent=0))
    tmp.replace(cache)
    return day


# --------------------------------------------------------------------------------------------
# Resolution


@dataclass
class Lock:
    """A resolved lock: the pins and how they were chosen."""

    requirement: str  # "vllm==0.6.3"
    release_day: str
    cutoff: str
    python: str
    platform: str
    pins: dict[str, str]  # normalised name -> version
    body: str  # uv's requirements output
    package_cutoffs: dict[str, str] = field(default_factory=dict)
    constraints_sha: str = ""
    seconds: float = 0.0  # resolution time (0 when read from the cache)
    overrides: list[Override] = field(default_factory=list)

    def text(self) -> str:
        head = [f"# {LOCK_FORMAT}: {self.requirement} as of its release day {self.release_day}",
                f"# packages uploaded before {self.cutoff}; python {self.python}, {self.platform}"]
        overridden = {normalise(o.package) for o in self.overrides}
        for name, at in sorted(self.package_cutoffs.items()):
            if name not in overridden:
                head.append(f"# {name}: uploaded before {at} (nothing of it is older than the cutoff)")
        for o in self.overrides:
            head.append(f"# {o.package}=={o.version} instead of =={o.pinned}, uploaded before {o.cutoff}: {o.why}")
        if self.constraints_sha:
            head.append(f"# constraints: sha256 {self.constraints_sha}")
        return "\n".join(head) + "\n" + self.body

    @classmethod
    def parse(cls, text: str) -> Lock:
        lines = text.splitlines()
        m = re.match(rf"# {re.escape(LOCK_FORMAT)}: (\S+) as of its release day (\S+)", lines[0] if lines else "")
        m2 = re.match(r"# packages uploaded before (\S+); python (\S+), (\S+)", lines[1] if len(lines) > 1 else "")
        if not m or not m2:
            raise ValueError("not a replay lock")
        cutoffs = {}
        overrides = []
        sha = ""
        body_from = 2
        for i, ln in enumerate(lines[2:], start=2):
            if not ln.startswith("# "):
                body_from = i
                break
            c = re.match(r"# (\S+): uploaded before (\S+) ", ln)
            if c:
                cutoffs[c.group(1)] = c.group(2)
            s = re.match(r"# constraints: sha256 (\S+)", ln)
            if s:
                sha = s.group(1)
            o = re.match(r"# (\S+)==(\S+) instead of ==(\S+), uploaded before (\S+): (.*)", ln)
            if o:
                overrides.append(Override(o.group(1), o.group(3), o.group(2), o.group(4), o.group(5)))
                cutoffs[normalise(o.group(1))] = o.group(4)
        body = "\n".join(lines[body_from:]) + "\n"
        return cls(m.group(1), m.group(2), m2.group(1), m2.group(2), m2.group(3), pins_of(body), body,
                   cutoffs, sha, overrides=overrides)


def pins_of(text: str) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a requirements text."""
    out = {}
    for m in re.finditer(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;#\\]+)", text):
        out[normalise(m.group(1))] = m.group(2)
    return out


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints_digest(path: Path) -> str:
    """sha256 of a constraints file's meaningful lines (comments, blanks and order do not count)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ReplayError(f"--constraints {path}: {e.strerror or e}", 3) from e
    lines = sorted({ln.split("#", 1)[0].strip() for ln in text.splitlines()} - {""})
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def lock_path(cache_dir: Path, dist: str, version: str, python: str, plat: str,
              constraints_sha: str = "") -> Path:
    tag = f"-c{constraints_sha[:12]}" if constraints_sha else ""
    return cache_dir / "locks" / f"{dist}-{version}-py{python}-{plat}{tag}.txt"


def resolve(dist: str, version: str, cache_dir: Path, *, constraints: Path | None = None,
            python: str | None = None, plat: str | None = None,
            release_day: str | None = None) -> Lock:
    """The lock of ``dist==version`` as of its release day, from the cache or resolved now.

    uv is asked with ``--offline`` first (its cache holds the index pages of an earlier
    resolution; with the cutoff they cannot have changed), then online."""
    if python is None:
        python = target_python(version if dist == "vllm" else None)
    elif dist == "vllm":
        refuse_python(version, python)
    plat = plat or target_platform()
    sha = constraints_digest(constraints) if constraints else ""
    path = lock_path(cache_dir, dist, version, python, plat, sha)
    if path.exists():
        try:
            return Lock.parse(path.read_text())
        except (OSError, ValueError):
            pass
    day = release_day or release_date(dist, version, cache_dir)
    cutoff = cutoff_of(day)
    t0 = time.monotonic()
    lock = compile_lock(dist, version, day, cutoff, python, plat, constraints, sha)
    lock.seconds = time.monotonic() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.part")
    tmp.write_text(lock.text())
    tmp.replace(path)
    return lock


def compile_lock(dist: str, version: str, day: str, cutoff: str, python: str, plat: str,
                 constraints: Path | None = None, constraints_sha: str = "") -> Lock:
    requirement = f"{dist}=={version}"
    known = dist == "vllm" and constraints is None
    machine = plat.split("-", 1)[0]
    if known and version in NO_WHEEL.get(machine, {}):
        raise ReplayError(f"could not resolve {requirement} for {plat} (no wheel): "
                          f"{NO_WHEEL[machine][version]}", EXIT_ENGINE)
    cutoffs: dict[str, str] = dict(PACKAGE_CUTOFFS.get(version, {})) if known else {}
    overrides = OVERRIDES.get(version, ()) if dist == "vllm" else ()
    for o in overrides:
        cutoffs[normalise(o.package)] = o.cutoff
    grace = (dt.date.fromisoformat(day) + dt.timedelta(days=DIST_GRACE_DAYS)).isoformat() + "T00:00:00Z"
    req_text = "\n".join([requirement, *EXTRA_REQUIREMENTS]) + "\n"
    for _ in range(8):
        cmd = [uv_bin(), "pip", "compile", "--no-config", "-", "--python-version", python,
               "--python-platform", plat, "--exclude-newer", cutoff,
               "--exclude-newer-package", f"{dist}={grace}", "--no-header", "--quiet"]
        for name, at in sorted(cutoffs.items()):
            cmd += ["--exclude-newer-package", f"{name}={at}"]
        if overrides:
            cmd += ["--override", str(_overrides_file(overrides))]
        if constraints is not None:
            cmd += ["--constraints", str(constraints)]
            # production's own pins may be newer than the release day: the pin decides for them
            for name in sorted(pins_of(constraints.read_text())):
                if name not in cutoffs and name != normalise(dist):
                    cmd += ["--exclude-newer-package", f"{name}={PINNED_CUTOFF}"]
        p = _uv(cmd + ["--offline"], req_text)
        if p.returncode != 0 and not _HINT.search(p.stderr):
            p = _uv(cmd, req_text)  # not all in uv's cache yet
        if p.returncode == 0:
            body = re.sub(r"(?m)^(\s*#.*)-c \S+", r"\1-c constraints", p.stdout)  # not this host's path
            body = re.sub(r"(?m)^(\s*#.*)--override \S+", r"\1--override overrides", body)
            return Lock(requirement, day, cutoff, python, plat, pins_of(body), body, cutoffs,
                        constraints_sha, overrides=list(overrides))
        m = _HINT.search(p.stderr)
        if m and normalise(m.group("name")) not in cutoffs:
            cutoffs[normalise(m.group("name"))] = _day_after(m.group("at"))
            continue
        break
    tail = " ".join(ln.strip() for ln in p.stderr.strip().splitlines()[-6:])
    what = "PyPI could not be reached" if _NETWORK.search(p.stderr) else "no resolution"
    raise ReplayError(f"could not resolve {requirement} as of {day} ({what}): {tail}", EXIT_ENGINE)


def _overrides_file(overrides: tuple[Override, ...]) -> Path:
    """The overrides as a requirements file uv reads (named by its content, kept for reuse)."""
    text = "".join(f"{o.package}=={o.version}\n" for o in overrides)
    path = Path(tempfile.gettempdir()) / f"replay-overrides-{hashlib.sha256(text.encode()).hexdigest()[:12]}.txt"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_name(path.name + f".{os.getpid()}.part")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def _uv(cmd: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "UV_NO_PROGRESS": "1"}
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False, env=env)


def is_network_failure(e: ReplayError) -> bool:
    return "PyPI could not be reached" in e.message
