"""ordered_map: results in order, never more than ``ahead`` items taken and not handed back; background
removal: everything handed to it is gone when its block is left; in_order: calls run in the order
given, the first in this thread, the rest in one other, at most ``ahead`` waiting."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from replay.parallel import in_order, ordered_map


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


def test_a_single_item_is_computed_in_this_thread() -> None:
    """One item (a small file's one block) starts no thread; none gives nothing; two or more use the
    workers."""
    def whose(i: int) -> str:
        return threading.current_thread().name

    here = threading.current_thread().name
    assert list(ordered_map(whose, [7], workers=2, ahead=3)) == [here]
    assert list(ordered_map(whose, [], workers=2, ahead=3)) == []
    assert here not in list(ordered_map(whose, [1, 2, 3], workers=2, ahead=3))
    assert list(ordered_map(lambda i: i * i, [1, 2, 3], workers=1, ahead=1)) == [1, 4, 9]  # (one at a time)
    assert list(ordered_map(whose, [5], workers=1, ahead=1)) != [here]


def test_background_removal_is_done_when_its_block_is_left(tmp_path: Path) -> None:
    """Files, folders with files in them, and paths already gone: all are gone once the block is left
    (the recorder returns only then), and the block's own work runs meanwhile."""
    from replay.parallel import background_removal
    folder = tmp_path / "spill" / "requests-x"
    folder.mkdir(parents=True)
    files = [folder / f"b{i}.arrow" for i in range(50)] + [tmp_path / "part.arrow"]
    for f in files:
        f.write_bytes(b"x" * 100_000)
    kept = tmp_path / "bundle.json"
    kept.write_text("{}")
    with background_removal() as remove:
        for f in files[:10]:
            remove(f)
        remove(tmp_path / "never-there")
        remove(tmp_path / "spill")
        remove(files[-1])
    assert not (tmp_path / "spill").exists() and not files[-1].exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.json"]


def test_background_removal_lets_go_of_what_it_has_removed(tmp_path: Path) -> None:
    """Thousands of files handed on (a fleet's request join once handed on 26,000) are not all held until the
    block is left: a removal done is forgotten, and every file is still gone at the end."""
    from replay.parallel import background_removal
    files = [tmp_path / f"b{i}.arrows" for i in range(2_000)]
    for f in files:
        f.touch()
    with background_removal() as remove:
        for f in files:
            remove(f)
        waited = time.monotonic()
        while files[-1].exists() and time.monotonic() - waited < 60:  # (the thread catches up)
            time.sleep(0.05)
        remove(tmp_path / "never-there")
        held = sum(isinstance(o, Future) for o in gc.get_objects())
    assert held < 100 and not any(f.exists() for f in files)


def test_a_lagging_removal_holds_a_job_or_two_not_one_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN removals slower than the files come (unlinks waiting on a journal the bundle's writing
    keeps busy) THEN the files handed on meanwhile join the job that waits, instead of a job each (of
    ~3 KB each: 25,000 of them when a fleet's request join spilled a file a bucket and group), and every
    one is gone when the block is left."""
    from replay import parallel
    plain = parallel._remove
    started = threading.Event()

    def slow(path: Path) -> None:
        started.set()
        time.sleep(0.002)
        plain(path)
    monkeypatch.setattr(parallel, "_remove", slow)
    files = [tmp_path / f"b{i}.arrows" for i in range(1_000)]
    for f in files:
        f.touch()
    with parallel.background_removal() as remove:
        remove(files[0])
        started.wait(10)
        for f in files[1:]:
            remove(f)
        held = sum(isinstance(o, Future) for o in gc.get_objects())
        assert any(f.exists() for f in files)  # (it lags: the check above ran while files were left)
    assert held <= 3 and not any(f.exists() for f in files)


_INTERRUPTED_REMOVAL = """
import signal, sys, threading, time
from pathlib import Path
import replay.parallel as parallel
spill = Path(sys.argv[1])
# (Ctrl-C as an interactive command has it: a process started in the background of a script inherits
# SIGINT ignored, and Python then installs no KeyboardInterrupt for it)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
slow_remove, main = parallel._remove, threading.main_thread().ident

def slow(path):
    time.sleep(0.1)  # (the block is being left: this thread's removal is waited for)
    signal.pthread_kill(main, signal.SIGINT)  # (a real signal, to the waiting thread: it breaks a wait)
    time.sleep(0.4)
    slow_remove(path)

parallel._remove = slow
try:
    with parallel.background_removal() as remove:
        remove(spill)
    print("not interrupted")
except KeyboardInterrupt:
    print("interrupted; spill " + ("left" if spill.exists() else "gone"))
"""


def test_ctrl_c_as_the_removal_block_is_left_waits_for_the_removals(tmp_path: Path) -> None:
    """GIVEN a removal that takes a while (a big spill on a journalling file system) WHEN Ctrl-C (or
    SIGTERM, raised as an interrupt) comes while leaving the block waits for it THEN the interrupt
    reaches the caller only once the removal is done. Before, it came at once, the removal ran on, and
    the caller's cleanup of the folder around it raced with it: a recorder stopped by SIGTERM as it
    wrote its bundle left the partial bundle folder and its spill behind. (In a process of its own:
    Ctrl-C's handler and signal mask as a command has them, whatever an earlier test left.)"""
    import subprocess
    import sys
    spill = tmp_path / ".spill"
    spill.mkdir()
    (spill / "piece.arrow").write_bytes(b"x" * 1000)
    r = subprocess.run([sys.executable, "-c", _INTERRUPTED_REMOVAL, str(spill)], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.strip() == "interrupted; spill gone", r.stdout + r.stderr


def test_in_order_runs_calls_in_order_beside_this_thread() -> None:
    """GIVEN calls of varying length handed on faster than they run THEN they ran one after another in
    the order given, the first in this thread and the rest in one other, never more than ``ahead``
    waiting, and all of them are done when the block is left."""
    ran: list[tuple[int, str]] = []
    waiting = [0]
    most = [0]
    lock = threading.Lock()

    def call(i: int) -> None:
        with lock:
            waiting[0] -= 1
        time.sleep(0.002 * (i % 3))
        ran.append((i, threading.current_thread().name))

    here = threading.current_thread().name
    with in_order(ahead=2) as run:
        for i in range(12):
            with lock:
                waiting[0] += 1
                most[0] = max(most[0], waiting[0])
            run(lambda i=i: call(i))
    assert [i for i, _ in ran] == list(range(12))
    assert ran[0][1] == here and {t for _, t in ran[1:]} - {here} == {t for _, t in ran[1:]} and len({t for _, t in ran[1:]}) == 1
    assert most[0] <= 3  # (the two waiting, and the one just handed on)


def test_in_order_raises_a_calls_error_when_its_block_is_left() -> None:
    """GIVEN a last call that fails THEN leaving the block raises its error (output not written
    is not taken for written), and a single call runs in this thread, starting none."""
    with pytest.raises(ValueError, match="the last"):
        with in_order(ahead=2) as run:
            for i in range(6):
                run(lambda i=i: (_ for _ in ()).throw(ValueError("the last")) if i == 5 else None)
    names: list[str] = []
    with in_order(ahead=2) as run:
        run(lambda: names.append(threading.current_thread().name))
    assert names == [threading.current_thread().name]


def test_an_interrupt_while_a_worker_starts_leaves_no_call_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN Ctrl-C or SIGTERM landing while ordered_map starts a worker thread (starting one waits for it
    to run) THEN once the interrupt reaches the caller, no call runs or is still to run: a call left to a
    thread that was started but not counted wrote a piece of spill after the caller's cleanup had removed
    the folder (the recorder left a partial bundle behind, one SIGTERM in 40)."""
    started: list[int] = []
    done: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        time.sleep(0.05)
        done.append(i)
        return i

    start = threading.Thread.start
    starts: list[threading.Thread] = []

    def interrupted(self: threading.Thread) -> None:
        start(self)
        starts.append(self)
        if len(starts) == 2:  # (the second worker: it runs the second item)
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        list(ordered_map(work, range(10), workers=2, ahead=3))
    ended = list(done)
    time.sleep(0.2)
    assert len(starts) == 2 and started and sorted(started) == sorted(ended) == sorted(done)
