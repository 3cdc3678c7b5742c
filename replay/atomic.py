"""Output files written beside their path and renamed into place when complete.

A trace or export interrupted halfway (Ctrl-C, a full disk) would otherwise leave a truncated file
that reads as a shorter one; written this way, the path keeps the last complete file or none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

PART = ".part"  # the suffix of a file being written, until it is renamed onto its path


def part_of(path: Path) -> Path:
    """The file ``path`` is written through."""
    return path.with_name(path.name + PART)


@contextlib.contextmanager
def written_in_place(path: Path) -> Iterator[Path]:
    """The file to write ``path`` through: renamed onto ``path`` when the block ends, removed when it
    fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = part_of(path)
    try:
        yield part
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)
