"""Byte and time units: GiB is 2**30 bytes everywhere, durations are integer microseconds."""

from __future__ import annotations

import re
from typing import Any

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

_SIZE_RE = re.compile(r"^\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*([KMGT]i?B|bytes?|B)?\s*$", re.I)
_SIZE_MULT = {
    "b": 1, "byte": 1, "bytes": 1,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1 << 40,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
}


MAX_GPU_INDEX = 2**31 - 1  # the most a GPU index can be in a bundle (its samples' GPU column is 32-bit)


def gpu_index(text: str) -> int | None:
    """A GPU's index as evidence writes it ('0', '12'); None where it is none, or more than any machine
    has (a damaged or made-up line)."""
    text = text.strip()
    return int(text) if is_uint(text) and int(text) <= MAX_GPU_INDEX else None


def is_uint(text: str) -> bool:
    """Whether ``text`` is a plain non-negative integer ('0'-'9' only): ``str.isdigit`` also takes
    '²' and other digits ``int`` refuses."""
    return text.isascii() and text.isdigit()


def parse_size_bytes(text: str) -> int | None:
    """'1.63 GiB' -> bytes; torch's format_size uses binary units. None when unparseable."""
    m = _SIZE_RE.match(text)
    if not m:
        return None
    num = float(m.group(1).replace(",", ""))
    unit = (m.group(2) or "B").lower()
    return int(round(num * _SIZE_MULT.get(unit, 1)))


def fraction(v: Any) -> float | None:
    """A share in (0, 1] such as gpu_memory_utilization, from a number or its text ('0.92', as a
    scrape's label gives it); None for anything else."""
    try:
        u = float(v)
    except (TypeError, ValueError):
        return None
    return u if 0 < u <= 1 else None


def gib(n_bytes: float | None) -> float | None:
    return None if n_bytes is None else n_bytes / GiB


_DUR_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(us|ms|s|m|h)?\s*$")
_DUR_MULT = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}


def parse_duration_us(text: str) -> int | None:
    """'1s', '250ms', '10m', '2.5' (seconds) -> integer microseconds; None when unparseable."""
    m = _DUR_RE.match(text)
    if not m:
        return None
    return int(round(float(m.group(1)) * _DUR_MULT[m.group(2) or "s"]))


def say_duration(seconds: float) -> str:
    """A duration as people read it: '8.0 s' under two minutes, then '12 min 5 s', '3 h 12 min', '148 d 3 h'."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    n = int(round(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if n >= size:
            big, rest = divmod(n, size)
            return f"{big} {unit}" + (f" {rest // sub_size} {sub}" if rest // sub_size else "")
    return f"{n} s"  # (not reached: n >= 120)
