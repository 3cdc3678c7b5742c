"""Analyses kept between commands. ``replay analyze``, ``report`` and ``postmortem`` of one bundle each
analysed it anew: a fleet's day, 1.3 s a command, and a replay compared in each of them too.

An analysis is kept in this machine's cache (``REPLAY_HOME``/analyses, or the folder
``REPLAY_ANALYSIS_CACHE`` names; ``off`` keeps none) under a key of the bundle's files as they are
(its path, and each file's size, time of change and inode: a bundle written again is another) and of
the code that made it (this package's files, Python's, polars' and numpy's versions). It is pickled,
which only this machine's own cache is trusted with: a bundle never holds one. At most ``MAX_BYTES``
are kept, the least recently used removed first; a kept analysis that cannot be read is analysed anew.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import pickle
import sys
from pathlib import Path

import numpy as np
import polars as pl

from replay.analysis.pipeline import Analysis, analyze_bundle
from replay.atomic import written_in_place
from replay.bundle import OWN_FILES, Bundle, read_bundle

CACHE_ENV = "REPLAY_ANALYSIS_CACHE"
MAX_BYTES = 1 << 30  # (a fleet's day's analysis is 64 MB)
SUFFIX = ".analysis.pickle"


def cache_folder() -> Path | None:
    """Where analyses are kept (None: nowhere)."""
    named = os.environ.get(CACHE_ENV)
    if named is not None:
        return None if named.strip().lower() in ("", "0", "off", "no") else Path(named)
    from replay.engine.envs import replay_home
    return replay_home() / "analyses"


def analysis_of(path: Path) -> Analysis:
    """The analysis of the bundle at ``path``: kept from an earlier command where its files and this code
    are as they were, else made (``analyze_bundle``) and kept."""
    b = read_bundle(path)
    folder = cache_folder()
    if folder is None or b.complete is False:  # (a bundle still written changes from one command to the next)
        return analyze_bundle(b)
    kept = folder / (_key(path) + SUFFIX)
    a = _load(kept, b)
    if a is None:
        a = analyze_bundle(b)
        _keep(a, kept)
    return a


def _key(path: Path) -> str:
    h = hashlib.sha256(repr((_code(), str(path.resolve()))).encode())
    for name in sorted(OWN_FILES):
        try:
            st = (path / name).stat()
        except OSError:
            continue
        h.update(repr((name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)).encode())
    return h.hexdigest()[:40]


@functools.cache
def _code() -> str:
    """This package's files (each one's place, size and time of change) and the versions it ran with."""
    root = Path(__file__).resolve().parents[1]
    files = sorted((str(p.relative_to(root)), (st := p.stat()).st_size, st.st_mtime_ns)
                   for p in root.rglob("*") if p.suffix in (".py", ".json") and p.is_file())
    return hashlib.sha256(repr((files, sys.version, pl.__version__, np.__version__)).encode()).hexdigest()


def _load(kept: Path, b: Bundle) -> Analysis | None:
    try:
        with kept.open("rb") as fh:
            a = pickle.load(fh)
        os.utime(kept)  # (recently used: the last to go)
    except OSError:
        return None
    except Exception:  # (cut short, or pickled by code since changed: analysed anew and kept again)
        a = None
    if not isinstance(a, Analysis):
        with contextlib.suppress(OSError):
            kept.unlink()
        return None
    a.bundle = b
    return a


def _keep(a: Analysis, kept: Path) -> None:
    """Keep ``a`` (its bundle left out: read again each time), then remove the least recently used kept
    analyses past MAX_BYTES. Where the cache cannot be written, or ``a`` holds what pickle cannot carry,
    nothing is kept: the command goes on."""
    bare = copy.copy(a)
    bare.bundle = None  # type: ignore[assignment]
    try:
        with written_in_place(kept) as part, part.open("wb") as fh:
            pickle.dump(bare, fh, protocol=pickle.HIGHEST_PROTOCOL)
        _trim(kept.parent, kept)
    except (OSError, pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return


def _trim(folder: Path, keep: Path) -> None:
    kept = []
    for p in folder.glob("*" + SUFFIX):
        try:
            st = p.stat()
        except OSError:
            continue
        kept.append((st.st_mtime_ns, st.st_size, p))
    total = sum(size for _, size, _ in kept)
    for _, size, p in sorted(kept, key=lambda x: x[0]):
        if total <= MAX_BYTES:
            return
        if p != keep:
            p.unlink(missing_ok=True)
            total -= size
