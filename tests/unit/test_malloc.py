"""The allocator gives freed large blocks back and uses a log's pieces again (``replay.malloc``),
measured in a process of its own: blocks freed under glibc's raised threshold stay held until a trim;
with ``give_back_large_blocks``, a block of LARGE_BYTES or more goes back at once, and a piece-sized
block freed and taken again is not faulted in anew."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replay import malloc

PROBE = """
import ctypes, resource, sys
from replay import malloc
def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) // 1024
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
mib = 1 << 20
if sys.argv[1] == "given":
    assert malloc.give_back_large_blocks()
elif sys.argv[1] == "mapped":  # (every block of 4 MiB or more mapped on its own)
    assert libc.mallopt(-3, 4 * mib) == 1
if sys.argv[2] == "held":
    first = libc.malloc(8 * mib); ctypes.memset(first, 1, 8 * mib); libc.free(first)  # (raises glibc's threshold)
    size = malloc.LARGE_BYTES if sys.argv[1] == "given" else 6 * mib
    before = anon_mib()
    blocks = [libc.malloc(size) for _ in range(120 * mib // size + 1)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks[:-1]:  # (the last one kept: the heap cannot shrink past it)
        libc.free(b)
    held = anon_mib() - before - size // mib  # (less the block still in use)
    malloc.trim()
    print(held, anon_mib() - before - size // mib)
else:  # a log's pieces: 16 MiB taken, written, freed, 20 times
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        b = libc.malloc(16 * mib); ctypes.memset(b, 1, 16 * mib); libc.free(b)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


def _probe(mode: str, what: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, what], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2]).stdout.split()
    return [int(x) for x in out]


@pytest.mark.skipif(malloc._glibc() is None, reason="glibc's allocator only")
def test_freed_large_blocks_go_back_to_the_system() -> None:
    held, trimmed = _probe("kept", "held")
    assert held >= 100 and trimmed <= 20  # 19 blocks of 6 MiB held while freed, given back by the trim
    given, _ = _probe("given", "held")
    assert given <= 20  # blocks of LARGE_BYTES mapped on their own, given back as each was freed


@pytest.mark.skipif(malloc._glibc() is None, reason="glibc's allocator only")
def test_a_piece_freed_and_taken_again_is_not_faulted_in_anew() -> None:
    pages = (16 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert _probe("mapped", "pieces")[0] >= 15 * pages  # (each one mapped anew: zeroed page by page)
    assert _probe("given", "pieces")[0] <= 2 * pages  # (the first one faulted in, the others used again)


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


HOLD_PROBE = """
import os, sys, replay
from replay import malloc
if sys.argv[1] == "polars first":
    import polars
held = malloc.hold_freed_pages()
import polars as pl
pl.DataFrame({"a": list(range(1000))}).sort("a")
print(held, os.environ["_RJEM_MALLOC_CONF"])
"""

RECORD_PROBE = """
import os, sys
from replay.cli import app
app(["record", sys.argv[1], "-o", sys.argv[2], "--year", "2026"], standalone_mode=False)
print(os.environ["_RJEM_MALLOC_CONF"])
"""


def _run(probe: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True, env=env,
                          cwd=Path(__file__).parents[2])


def test_a_recording_has_polars_allocator_hold_freed_pages_where_nothing_else_decided() -> None:
    """``hold_freed_pages`` sets polars' jemalloc to hold freed pages RECORD_HOLD_MS, in an arena for each
    CPU (jemalloc takes the pairs: it names a pair or a value it does not know on stderr), unless polars
    is imported already or the user set the allocator; ``replay record`` calls it before polars is
    imported."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    held = _run(HOLD_PROBE, "first", env=env)
    assert held.stdout.startswith("True ") and "<jemalloc>" not in held.stderr
    assert held.stdout.strip().endswith(f",dirty_decay_ms:{malloc.RECORD_HOLD_MS},muzzy_decay_ms:0,tcache:false,"
                                        "percpu_arena:percpu")
    late = _run(HOLD_PROBE, "polars first", env=env)
    assert late.stdout.startswith("False ") and late.stdout.strip().endswith(",dirty_decay_ms:1000,muzzy_decay_ms:0,tcache:false")
    own = _run(HOLD_PROBE, "first", env={**env, "_RJEM_MALLOC_CONF": "dirty_decay_ms:5"})
    assert own.stdout.startswith("False ") and own.stdout.strip().endswith("dirty_decay_ms:5")


def test_replay_record_holds_freed_pages(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"INFO 05-01 10:00:0{i} [async_llm.py:587] Added request cmpl-{i}-0.\n" for i in range(3)))
    r = _run(RECORD_PROBE, str(log), str(tmp_path / "b"), env=env)
    assert r.stdout.strip().splitlines()[-1].endswith(f"dirty_decay_ms:{malloc.RECORD_HOLD_MS},muzzy_decay_ms:0,"
                                                      "tcache:false,percpu_arena:percpu")
    assert (tmp_path / "b" / "requests.parquet").exists()
