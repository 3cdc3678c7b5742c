"""The C allocator's hold on freed memory, where it is glibc's (Linux's usual C library).

A recording reads file after file, each in pieces worked on by threads. glibc serves large blocks from
per-thread heaps once frees have raised its threshold for mapping them on their own, and it keeps what
is freed there: reading a day of a fleet's logs, a recorder held about 100 MiB more after each 1.2 GiB
log than before it, its live data unchanged. Blocks of ``LARGE_BYTES`` or more mapped on their own go
back to the system when freed, and a trim after each file gives back what the heaps hold free.

Elsewhere (another C library, another system) both calls do nothing.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

LARGE_BYTES = 4 << 20  # a block this large or larger is mapped on its own (glibc's own default: 128 KiB,
# raised by frees up to 32 MiB). At 256 KiB, reading a log took about a fifth more CPU time (the pages of
# each block faulted in anew); at 4 MiB a fleet's day took the same (271 CPU-s), three of its logs a tenth more
_M_MMAP_THRESHOLD = -3  # (mallopt's parameter, from glibc's malloc.h)


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
    system. Whether the allocator took the setting."""
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BYTES) == 1)


def trim() -> None:
    """Give back to the system what the allocator's heaps hold free (a few milliseconds)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
