"""The allocator gives freed large blocks back (``replay.malloc``), measured in a process of its own:
blocks freed under glibc's raised threshold stay held until a trim, and are given back at once with
``give_back_large_blocks``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay import malloc

PROBE = """
import ctypes, sys
from replay import malloc
def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) // 1024
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "given":
    assert malloc.give_back_large_blocks()
mib = 1 << 20
first = libc.malloc(8 * mib); ctypes.memset(first, 1, 8 * mib); libc.free(first)  # (raises glibc's threshold)
before = anon_mib()
blocks = [libc.malloc(6 * mib) for _ in range(20)]
for b in blocks:
    ctypes.memset(b, 1, 6 * mib)
for b in blocks[:-1]:  # (the last one kept: the heap cannot shrink past it)
    libc.free(b)
held = anon_mib() - before
malloc.trim()
print(held, anon_mib() - before)
"""


@pytest.mark.skipif(malloc._glibc() is None, reason="glibc's allocator only")
def test_freed_large_blocks_go_back_to_the_system() -> None:
    def run(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parents[2]).stdout.split()
        return int(out[0]), int(out[1])
    held, trimmed = run("kept")
    assert held >= 100 and trimmed <= 20  # 19 blocks of 6 MiB held while freed, given back by the trim
    given, _ = run("given")
    assert given <= 20  # mapped on their own, given back as each was freed


def test_elsewhere_both_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    malloc._glibc.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    try:
        assert malloc.give_back_large_blocks() is False
        malloc.trim()
    finally:
        malloc._glibc.cache_clear()


JEMALLOC_PROBE = """
import os, replay, polars as pl
pl.DataFrame({"a": list(range(1000))}).sort("a")  # (polars' allocator reads its settings at its first use)
print(os.environ["_RJEM_MALLOC_CONF"])
"""


def test_polars_allocator_takes_the_settings_replay_gives_it() -> None:
    """``import replay`` sets polars' jemalloc (freed pages held a second, no per-thread caches: with
    them, a fleet's day's request join grew by ~1.2 MiB a bucket) and jemalloc takes every pair of it
    (a pair it does not know it names on stderr and ignores); a setting of the user's own wins."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    r = subprocess.run([sys.executable, "-c", JEMALLOC_PROBE], capture_output=True, text=True, check=True, env=env,
                       cwd=Path(__file__).parents[2])
    # (polars puts defaults of its own before it: of two settings of one name, jemalloc takes the last)
    assert r.stdout.strip().endswith(",dirty_decay_ms:1000,muzzy_decay_ms:0,tcache:false")
    assert "<jemalloc>" not in r.stderr
    own = subprocess.run([sys.executable, "-c", JEMALLOC_PROBE], capture_output=True, text=True, check=True,
                         env={**env, "_RJEM_MALLOC_CONF": "bogus_pair:1"}, cwd=Path(__file__).parents[2])
    assert own.stdout.strip().endswith("bogus_pair:1") and "tcache" not in own.stdout and "Invalid conf pair: bogus_pair:1" in own.stderr  # (the probe sees it)
