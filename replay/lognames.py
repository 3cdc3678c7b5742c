"""A log file's name as rotation leaves it: the files one server's log was rotated into share a stem.

logrotate and its kin mark the files they rotate with a number or a date (``vllm.log.1``,
``vllm.1.log``, ``vllm.log-20250519``) and a compression suffix (``.gz``). The recorder keeps such
files' stats in their server's series, and the analysis counts them as one replica.
"""

from __future__ import annotations

import re

ROTATED = re.compile(r"\.\d+(?=\.|$)|[-_.]\d{8}(?:\d{2,6})?(?=\.|$)|\.(?:gz|zst|bz2|xz|lz4)$")  # rotation's marks


def rotation_stem(name: str) -> str:
    """``name`` without the marks rotation puts in it: ``vllm.log.1``, ``vllm.1.log`` and
    ``vllm.log-20250519.gz`` are all ``vllm.log``; ``replica-3.log`` is itself."""
    return ROTATED.sub("", name)
