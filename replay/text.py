"""Text from the evidence made safe to print: control characters shown, never obeyed.

A Prometheus label, a log line or a file name can carry terminal escape sequences (colour, cursor
moves, OSC 8 links, a title change, OSC 52 which writes the clipboard) or bytes that are not UTF-8;
printed raw, a terminal acts on them. ``printable`` shows each as an escape (``\\x1b``), and
``console`` gives a rich Console that applies it to everything it prints.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

# C0 (but tab and newline) and C1 controls, DEL, the bidirectional overrides and isolates (text shown in
# another order than it is stored), the line and paragraph separators, and lone surrogates (the bytes
# of a file name that is not UTF-8, as os.fsdecode keeps them)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _shown(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # (a byte that was not UTF-8, kept by surrogateescape: the byte)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def printable(text: str) -> str:
    """``text`` with every control character (but newline and tab) shown as an escape: 'a\\x1b[31m'
    prints as ``a\\x1b[31m``, not in red."""
    return _UNSAFE.sub(_shown, text) if _UNSAFE.search(text) else text


class SafeConsole(Console):
    """A Console that prints its text through ``printable`` (rich's own control codes pass): a string
    as it is rendered (before rich drops some controls unsaid, and before it is laid out), and every
    segment as it is written (text that came in other renderables)."""

    def render_str(self, text: str, *args: Any, **kw: Any) -> Text:
        return super().render_str(printable(text), *args, **kw)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(printable(seg.text), seg.style, seg.control) for seg in buffer)


def console(stderr: bool = False, **kw: Any) -> Console:
    """The console to print on: control characters in what it prints are shown, not obeyed; where the
    stream is not a terminal (a CI log, a file, a pipe) a line is not wrapped at 80 columns."""
    stream = kw.get("file") or (sys.stderr if stderr else sys.stdout)
    tty = bool(getattr(stream, "isatty", lambda: False)())
    kw.setdefault("soft_wrap", not tty)
    return SafeConsole(stderr=stderr, **kw)
