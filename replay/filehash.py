"""Input files as given: whether they are gzip, and their sha256, which bundles and traces record
for provenance.

A large input is hashed while it is read for parsing (``HashingReader``) rather than in a pass of
its own; a small one, or one read through another route, with ``file_sha256``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def is_gzip(path: Path) -> bool:
    """By name or by content: a compressed log is often saved without its ``.gz``."""
    with path.open("rb") as fh:
        return path.suffix == ".gz" or fh.read(2) == b"\x1f\x8b"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class HashingReader:
    """A binary file whose every byte read also goes into ``hasher`` (none: a plain reader)."""

    def __init__(self, path: Path, hasher: Any = None) -> None:
        self.raw = path.open("rb")
        self.hasher = hasher

    def _seen(self, b: bytes) -> bytes:
        if self.hasher is not None:
            self.hasher.update(b)
        return b

    def read(self, size: int = -1, /) -> bytes:
        return self._seen(self.raw.read(size))

    def readline(self) -> bytes:
        return self._seen(self.raw.readline())

    def rest(self) -> None:
        """Read (and hash) whatever is left, such as bytes after a gzip stream."""
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> HashingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
