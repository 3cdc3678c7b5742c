"""The slow tier: builds real engine environments (gigabytes, minutes). Run it on purpose:
``pytest tests/slow -m slow`` (or ``make slow``), or with REPLAY_SLOW=1; otherwise every test here
is skipped, so a plain ``pytest`` never downloads a CUDA build."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _slow_on_purpose(request: pytest.FixtureRequest) -> None:
    asked = "slow" in (request.config.getoption("markexpr", "") or "") or os.environ.get("REPLAY_SLOW") == "1"
    if not asked:
        pytest.skip("slow tier: run with -m slow (or REPLAY_SLOW=1); it builds a CUDA vLLM env of several GB")
