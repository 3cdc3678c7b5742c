"""Input files as given: whether they are gzip, what text encoding their byte-order mark says, and
their sha256, which bundles and traces record for provenance.

A large input is hashed while it is read for parsing (``HashingReader``) rather than in a pass of
its own; a small one, or one read through another route, with ``file_sha256``.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replay.errors import ReplayError

# longest first: a UTF-32 mark begins with the UTF-16 one
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xef\xbb\xbf", "utf-8"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def damaged_gzip(path: Path, e: BaseException) -> ReplayError:
    """The one message for a gzip input that cannot be read to its end, whoever reads it."""
    return ReplayError(f"{path}: damaged or truncated gzip ({e}); re-download or re-export it")


def is_gzip(path: Path) -> bool:
    """By name or by content: a compressed log is often saved without its ``.gz``."""
    with path.open("rb") as fh:
        return path.suffix == ".gz" or fh.read(2) == b"\x1f\x8b"


def text_bom(head: bytes) -> tuple[int, str] | None:
    """The byte-order mark a text file starts with, as (its length, the text's encoding); None if none.
    Windows tools write them (Excel's 'CSV UTF-8'; PowerShell's ``>`` writes UTF-16), and every parser
    here reads UTF-8 without one."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return len(bom), encoding
    return None


def utf8_chunks(fh: Any, size: int) -> Iterator[bytes]:
    """A binary text stream read in chunks of about ``size`` bytes, as UTF-8: a byte-order mark is
    dropped and UTF-16 or UTF-32 text transcoded (undecodable bytes become U+FFFD, as elsewhere).
    Plain UTF-8 passes through uncopied."""
    first = fh.read(max(size, 4))  # enough for any mark
    bom = text_bom(first)
    chunk = first[bom[0]:] if bom else first
    if bom and not chunk:  # the first read held the mark alone
        chunk = fh.read(size)
    if bom is None or bom[1] == "utf-8":
        while chunk:
            yield chunk
            chunk = fh.read(size)
        return
    decoder = codecs.getincrementaldecoder(bom[1])(errors="replace")
    while True:
        text = decoder.decode(chunk, final=not chunk)
        if text:
            yield text.encode("utf-8")
        if not chunk:
            return
        chunk = fh.read(size)


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
