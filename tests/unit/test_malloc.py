"""The allocator gives freed large blocks back (``replay.malloc``), measured in a process of its own:
blocks freed under glibc's raised threshold stay held until a trim, and are given back at once with
``give_back_large_blocks``."""

from __future__ import annotations

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
