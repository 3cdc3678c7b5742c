"""The capacity-emulation ballast: its helper runs in the engine environment (real torch), holds the
memory until released, and leaves nothing behind. On this CPU machine it holds host memory; on a GPU
host the same helper holds device memory (``cuda:0``)."""

from __future__ import annotations

import psutil
import pytest

from replay.engine.ballast import Ballast, scaled_utilization
from replay.engine.envs import resolve
from replay.errors import ReplayError


def test_scaled_utilization_keeps_the_production_budget_in_bytes() -> None:
    h100, h200 = 85_520_809_984, 150_754_820_096
    u = scaled_utilization(0.9, h100, h200)
    assert abs(u * h200 - 0.9 * h100) < 1e-4 * h200 and u < 0.9


def _engine_python():  # type: ignore[no-untyped-def]
    spec = resolve("0.32", "cpu")
    if not spec.python.exists():
        pytest.skip("engine env not installed (make engine)")
    return spec.python


@pytest.mark.parametrize("free_before", [None, 64 * 2**30])
def test_ballast_holds_and_releases_memory(free_before: int | None) -> None:
    """The whole size is held; on CPU no CUDA context is counted in it, told the free memory or not."""
    size = 512 * 2**20
    b = Ballast(_engine_python(), size, device="cpu", free_before_bytes=free_before)
    b.start()
    pid = b.pid
    assert pid is not None
    rss = psutil.Process(pid).memory_info().rss
    assert rss >= size  # really held, pages touched
    assert b.context_bytes == (None if free_before is None else 0)
    b.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_ballast_that_cannot_be_held_is_a_clear_error() -> None:
    with pytest.raises(ReplayError, match="could not hold a .* ballast on nowhere:0"):
        Ballast(_engine_python(), 2**20, device="nowhere:0").start()
