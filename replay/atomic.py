"""Output files written beside their path and renamed into place when complete.

A trace or export interrupted halfway (Ctrl-C, a full disk) would otherwise leave a truncated file
that reads as a shorter one; written this way, the path keeps the last complete file or none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def written_in_place(path: Path) -> Iterator[Path]:
    """The file to write ``path`` through: renamed onto ``path`` when the block ends, removed when it
    fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    try:
        yield part
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)
