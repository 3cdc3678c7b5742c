"""Output files written beside their path and renamed into place when complete.

A trace, report or export interrupted halfway (Ctrl-C, a full disk) would otherwise leave a truncated
file that reads as a shorter one; written this way, the path keeps the last complete file or none.
The file written through is this process's own (``NAME.PID.part``): a file of the user's beside the
output, or another process writing the same output, is never written over nor removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

PART = ".part"  # the suffix of a file being written, until it is renamed onto its path
_PART_NAME = re.compile(r"(?:\.\d+)?\.part$")

# what a write can fail with for want of room or of a writable disk (not a bug: exit 74, naming the path)
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
WRITE_WHY = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "over the disk quota",
             errno.EFBIG: "a file larger than the file system or this process's limit allows",
             errno.EIO: "an input/output error of the disk", errno.EROFS: "on a read-only file system"}
# the same, as a library written in Rust words them ('... (os error 28)')
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def part_of(path: Path) -> Path:
    """The file ``path`` is written through: this process's own, beside it."""
    return path.with_name(f"{path.name}.{os.getpid()}{PART}")


def unpart(name: str) -> str:
    """The output a file being written stands for: 'trace.jsonl.4242.part' -> 'trace.jsonl'."""
    return _PART_NAME.sub("", name)


def write_error(e: BaseException, path: Path | str) -> OSError | None:
    """``e`` as an OSError naming ``path`` where it is a write that failed for want of room or of a
    writable disk and names no file (a full disk shows at a buffer's flush, or inside polars as
    'No space left on device (os error 28)'); None where it is anything else."""
    if isinstance(e, OSError) and e.errno is not None:
        if e.errno in WRITE_ERRNOS and e.filename is None:
            return OSError(e.errno, e.strerror or os.strerror(e.errno), str(path))
        return None
    # (polars says it in words: an OSError without errno, or an error of its own, which is no OSError)
    if isinstance(e, OSError) or type(e).__module__.split(".")[0] == "polars":
        m = _OS_ERROR.search(str(e))
        if m and int(m.group(1)) in WRITE_ERRNOS:
            code = int(m.group(1))
            return OSError(code, os.strerror(code), str(path))
    return None


@contextlib.contextmanager
def written_in_place(path: Path) -> Iterator[Path]:
    """The file to write ``path`` through: renamed onto ``path`` when the block ends, removed when it
    fails (a full disk is then an OSError naming ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = part_of(path)
    try:
        try:
            yield part
            part.replace(path)
        except BaseException as e:
            named = write_error(e, path)
            if named is not None:
                raise named from None
            raise
    finally:
        part.unlink(missing_ok=True)
