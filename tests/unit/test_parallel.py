"""ordered_map: results in order, never more than ``ahead`` items taken and not handed back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from replay.parallel import ordered_map


def test_results_in_order_with_bounded_look_ahead() -> None:
    taken: list[int] = []
    handed: list[int] = []
    lock = threading.Lock()

    def items() -> Iterator[int]:
        for i in range(20):
            with lock:
                taken.append(i)
                assert len(taken) - len(handed) <= 3  # the bound holds while items are taken
            yield i

    def slow_square(i: int) -> int:
        time.sleep(0.001 * (i % 3))  # later items can finish first
        return i * i

    for r in ordered_map(slow_square, items(), workers=2, ahead=3):
        handed.append(r)
        assert len(taken) - len(handed) <= 3
    assert handed == [i * i for i in range(20)]


def test_stopping_early_cancels_what_was_not_started() -> None:
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        time.sleep(0.01)
        return i

    gen = ordered_map(work, range(100), workers=1, ahead=4)
    assert next(gen) == 0
    gen.close()
    assert len(started) <= 5  # at most the look-ahead ran, not all 100
