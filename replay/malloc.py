"""The C allocator's hold on freed memory, where it is glibc's (Linux's usual C library).

A recording reads file after file, each in pieces worked on by threads. Left to itself, glibc serves
large blocks from per-thread heaps once frees have raised its threshold for mapping them on their own,
and keeps what is freed there: reading a day of a fleet's logs, a recorder held about 100 MiB more
after each 1.2 GiB log than before it, its live data unchanged. A trim after each file gives back what
the heaps hold free.

Within a file, the pieces of a log (16 MiB each) are taken and freed by the dozen: a block mapped on
its own is zeroed page by page as it is first touched (a page fault every 4 KiB, ~2 s of system time a
log), while a block of a heap is used again as it is. So blocks under ``LARGE_BYTES`` come from the
heaps, and a heap keeps up to ``KEEP_FREE_BYTES`` free at its top between trims.

Elsewhere (another C library, another system) both calls do nothing.

polars allocates through a jemalloc of its own, set by ``replay/__init__`` to give freed pages back
after a second. ``hold_freed_pages`` holds them longer in a process about to record (and the processes
it starts): see there.
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

import replay

LARGE_BYTES = 32 << 20  # a block this large or larger is mapped on its own (glibc's most). At 4 MiB, a
# log's pieces were each mapped anew: a fleet's day took 156 CPU-s (35 s of them the system's), at 32 MiB
# 146 (26 s), its record 5 s sooner, its peak ~80 MiB higher
KEEP_FREE_BYTES = 64 << 20  # free memory a heap keeps at its top (about four pieces of a log)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # (mallopt's parameters, from glibc's malloc.h)


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (glibc's alone: musl's libc has none)
    except (OSError, AttributeError):
        return None
    return libc


def give_back_large_blocks() -> bool:
    """Map blocks of LARGE_BYTES or more on their own from now on, so that freeing one returns it to the
    system, and give back free memory past KEEP_FREE_BYTES at a heap's top. Whether the allocator took
    the settings."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BYTES) == 1
                and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_FREE_BYTES) == 1)


def trim() -> None:
    """Give back to the system what the allocator's heaps hold free (a few milliseconds)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


RECORD_HOLD_MS = 60_000  # how long polars' allocator holds freed pages while a recording runs
RECORD_ARENAS = "percpu_arena:percpu"  # and where: an arena for each CPU, shared by the threads run on it


def hold_freed_pages() -> bool:
    """Have polars' allocator hold the pages it frees for RECORD_HOLD_MS, in arenas of one for each CPU
    (RECORD_ARENAS), in this process and the ones it starts from now on, before polars is first imported
    here; whether it was set (not where polars is imported already, or where the user set the
    allocator's settings).

    A recording frees each piece's frames as the next is made; given back after a second, their pages
    were faulted in again and again (a fleet's day: 3.7M page faults, 25-30 s of system time). Held a
    minute, the pages are used again: 0.8M faults, 17-20 s, the record ~10 % sooner in most runs taken in
    turns, its peak 860-880 MiB against 630-650. A tenth of that evidence peaks as high (freed pages are
    held for a time, not for a length of file), so the peak stays bounded: a longer input holds no more.

    Freed pages are held by the arena that freed them, and jemalloc hands new threads arenas in turn,
    four for each CPU: pages the request join's threads freed were not those the next group's threads
    took, and a fleet's day peaked at 995-1044 MiB (a tenth of it at 850-875: a ratio of
    1.17). An arena for each CPU, whatever thread runs there: 731-858 MiB (median 757), a tenth 657-685
    (680), in the same time (in turns: 63.5 s against 66.9, 62.9 against 62.8)."""
    if "polars" in sys.modules or replay.users_polars_malloc_conf is not None:
        return False
    os.environ["_RJEM_MALLOC_CONF"] = replay.POLARS_MALLOC_CONF.format(RECORD_HOLD_MS) + "," + RECORD_ARENAS
    return True
