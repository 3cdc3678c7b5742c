"""Input files as given: what they are compressed with, what text encoding their byte-order mark
says, and their sha256, which bundles and traces record for provenance.

A large input is hashed while it is read for parsing (``HashingReader``) rather than in a pass of
its own; a small one, or one read through another route, with ``file_sha256``.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import hashlib
import io
import lzma
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from replay.errors import ReplayError

# longest first: a UTF-32 mark begins with the UTF-16 one
_BOMS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xef\xbb\xbf", "utf-8"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


# how compressed files and archives open (bzip2's: 'BZh', the block size, then the first block's mark)
_MAGIC = (("gzip", rb"\x1f\x8b"), ("bzip2", rb"BZh[1-9]1AY&SY"), ("xz", rb"\xfd7zXZ\x00"),
          ("zstd", rb"\x28\xb5\x2f\xfd"), ("zip", rb"PK\x03\x04"))
_UNPACK = {"zip": "unzip"}  # (the command that unpacks an archive)
_SUFFIX = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zip": "zip"}
# what reading a damaged or truncated stream raises (gzip.BadGzipFile and bz2's bad data are OSErrors)
DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


def refuse_stream(path: Path) -> None:
    """Refuse a pipe, socket or device (``/dev/stdin``, a shell's ``<(zcat …)``): what it gives is gone
    once read, and the readers read their input more than once (to recognise it, hash it, parse it),
    so a second read found nothing and the input was taken for empty."""
    if path.exists() and not path.is_dir() and not path.is_file():
        raise ReplayError(f"{path}: a pipe or device, not a file: save what it gives to a file and pass that "
                          "(gzip, bzip2 and xz files are read as they are)")


def damaged(path: Path, kind: str, e: BaseException) -> ReplayError:
    """The one message for a compressed input that cannot be read to its end, whoever reads it."""
    return ReplayError(f"{path}: damaged or truncated {kind} ({e}); re-download or re-export it")


def compression(path: Path) -> str | None:
    """What the file is compressed with (gzip, bzip2, xz, zstd) or archived in (zip), by its first
    bytes or else its name: a compressed log is often saved without its suffix. None: neither."""
    with path.open("rb") as fh:
        head = fh.read(10)
    return next((kind for kind, magic in _MAGIC if re.match(magic, head)), None) or _SUFFIX.get(path.suffix.lower())


# each opens a path (and closes it with the stream) or reads a binary stream given (and leaves it open)
_OPENERS: dict[str, Callable[[Any, str], Any]] = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}


def _unreadable(path: Path, kind: str) -> ReplayError:
    if kind == "zstd":  # (no reader in this Python's standard library, and one dependency less)
        return ReplayError(f"{path}: zstd-compressed; decompress it first: zstd -d {path}")
    return ReplayError(f"{path}: a {kind} archive; unpack it ({_UNPACK.get(kind, kind)} {path}) and pass the files inside it")


def decompressed(source: Any, kind: str | None, path: Path) -> Any:
    """``source`` (``path`` itself, or a binary stream of it, which closing the result leaves open) read
    decompressed by ``kind`` (``compression``'s answer for ``path``)."""
    if kind is None:
        return source.open("rb") if isinstance(source, Path) else source
    if kind not in _OPENERS:
        raise _unreadable(path, kind)
    return _OPENERS[kind](source, "rb")


def open_decompressed(path: Path) -> io.BufferedIOBase:
    """The file opened for reading, decompressed where ``compression`` says it is compressed."""
    opened: io.BufferedIOBase = decompressed(path, compression(path), path)
    return opened


def text_bom(head: bytes) -> tuple[int, str] | None:
    """The byte-order mark a text file starts with, as (its length, the text's encoding); None if none.
    Windows tools write them (Excel's 'CSV UTF-8'; PowerShell's ``>`` writes UTF-16), and every parser
    here reads UTF-8 without one."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return len(bom), encoding
    return None


NUL_RUN_TEXT = 4096  # the bytes after a leading run of NULs that must hold none for the run to be skipped


def nul_run_note(name: str, n: int) -> str:
    """The note for a file whose leading run of ``n`` NUL bytes was skipped."""
    return (f"{name}: begins with {n:,} NUL bytes, skipped (what logrotate's copytruncate leaves when the writer "
            "kept its offset: the log's old length as a hole); read from the text after them")


def _past_nul_run(fh: Any, first: bytes) -> tuple[int, bytes]:
    """Read on past a run of NULs that ``first`` (a stream's first bytes, read already) begins with: (the
    run's length, the bytes after it read so far: NUL_RUN_TEXT or more, unless the stream ends), where
    text follows the run. Else (0, the bytes read): all of them where the run ends within ``first``, else
    ``first`` alone (a hole longer than that with no text after it is binary data; its head tells so)."""
    run, chunk = 0, first
    while chunk and not chunk.lstrip(b"\x00"):  # (all NULs: the hole goes on)
        run += len(chunk)
        chunk = fh.read(1 << 20)
    lead = len(chunk) - len(chunk.lstrip(b"\x00"))
    run, rest = run + lead, chunk[lead:]
    while len(rest) < NUL_RUN_TEXT and (more := fh.read(NUL_RUN_TEXT)):
        rest += more
    if rest and b"\x00" not in rest[:NUL_RUN_TEXT]:
        return run, rest
    return 0, first[:lead] + rest if chunk is first else first


def read_past_nul_run(fh: Any, limit: int = -1) -> tuple[int, bytes]:
    """The bytes of a binary stream (its first ``limit``, or all), past a run of NUL bytes it begins with
    where text follows the run (no NUL in its next NUL_RUN_TEXT bytes): logrotate's ``copytruncate``
    truncates a log its writer keeps open, and a writer that does not append (a shell's ``>``) writes on
    at its old offset, leaving the old length as a hole of NULs before the new lines. Returns (the run's
    length, the bytes): (0, the bytes as they are) where the stream has no such run (a byte-order mark,
    UTF-16 without one, binary data, nothing but NULs)."""
    first = fh.read(1 << 16 if limit < 0 else limit)
    run, rest = (0, first) if not first.startswith(b"\x00") or text_bom(first) else _past_nul_run(fh, first)
    if limit < 0:
        return run, rest + fh.read()
    while len(rest) < limit and (more := fh.read(limit - len(rest))):
        rest += more
    return run, rest[:limit]


def nul_run(path: Path) -> int:
    """The length of the run of NUL bytes the file's text begins with (``read_past_nul_run``'s), read
    decompressed where it is compressed; 0 where none."""
    try:
        with decompressed(path, compression(path), path) as fh:
            return read_past_nul_run(fh, 1)[0]
    except (ReplayError, *DECOMPRESS_ERRORS):
        return 0  # (whoever reads the file says what is wrong with it)


def utf8_chunks(fh: Any, size: int, past_nul_run: bool = False) -> Iterator[bytes]:
    """A binary text stream read in chunks of about ``size`` bytes, as UTF-8: a byte-order mark is
    dropped and UTF-16 or UTF-32 text transcoded (undecodable bytes become U+FFFD, as elsewhere); with
    ``past_nul_run``, a run of NUL bytes before the text (``read_past_nul_run``'s: what logrotate's
    copytruncate leaves at the head of a log) is skipped. Plain UTF-8 passes through uncopied."""
    first = fh.read(max(size, 4))  # enough for any mark
    bom = text_bom(first)
    if past_nul_run and bom is None and first.startswith(b"\x00"):
        first = _past_nul_run(fh, first)[1]
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
