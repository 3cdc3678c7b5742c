"""vLLM version strings ordered as numbers ('0.10.2' after '0.9.2'), shared by the log parser, the
version environments and the memory model, which all compare versions."""

from __future__ import annotations

import re
from functools import lru_cache

PRE_RELEASE = re.compile(r"\.?(?:rc|dev)\d*")  # ('0.8.5.dev169', '0.11.1rc2.dev206': a nightly or candidate)
AFTER_EVERY_POST = 2**31  # (what a pre-release of X.Y.Z sorts as, after X.Y.(Z-1)'s post releases)


@lru_cache(maxsize=1024)
def version_key(v: str | None) -> tuple[int, ...]:
    """'0.6.4.post1' -> (0, 6, 4, 1); None or '' -> (0,). A local part ('+gce17db808', '+cpu') is not
    read. A nightly or release candidate of a version holds the code of the releases before it and not
    yet all of its own, so it sorts after every release before it and before the version itself:
    '0.8.5.dev169+gce17db808' -> (0, 8, 4, 2**31), '0.9.0rc1' -> (0, 8, 2**31)."""
    s = (v or "0").split("+", 1)[0]
    pre = PRE_RELEASE.search(s)
    nums = [int(x) for x in re.findall(r"\d+", s[:pre.start()] if pre else s)] or [0]
    if pre is not None:
        last = max((i for i, n in enumerate(nums) if n > 0), default=None)
        if last is not None:
            nums = [*nums[:last], nums[last] - 1, AFTER_EVERY_POST]
    return tuple(nums)
