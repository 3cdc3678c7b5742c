"""vLLM version strings ordered as numbers ('0.10.2' after '0.9.2'), shared by the log parser, the
version environments and the memory model, which all compare versions."""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=1024)
def version_key(v: str | None) -> tuple[int, ...]:
    """'0.6.4.post1' -> (0, 6, 4, 1); None or '' -> (0,)."""
    return tuple(int(x) for x in re.findall(r"\d+", v or "0")) or (0,)
